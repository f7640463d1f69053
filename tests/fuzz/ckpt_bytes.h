/* A checkpoint file as bytes, for tests that edit one (tests/checkpoint.c,
 * the fuzz corpus generator): the fields' offsets, an independent CRC-32,
 * resealing after an edit, rewriting as an older format. Mirrors the layout
 * described in src/core/checkpoint.c. */
#ifndef MTOPT_CKPT_BYTES_H
#define MTOPT_CKPT_BYTES_H

#include <stddef.h>
#include <stdint.h>

/* Offsets of the header's fields (formats 1 to 4), of the ext words after it
 * (formats 2-4), of the groups' multipliers after those (format 4: lr_mult,
 * wd_mult per group), and the sizes of ext, the groups and a tensor record. */
enum {
  CB_FORMAT = 8, CB_KIND = 12, CB_NT = 16, CB_NS = 24, CB_RES = 28, CB_LR = 32,
  CB_BETA1 = 36, CB_BETA2 = 40, CB_EPS = 44, CB_WD = 48, CB_MOM = 52, CB_DAMP = 56,
  CB_MGN = 60, CB_STEP = 64, CB_SKIP = 72, CB_LS = 80, CB_GT = 84, CB_HDR = 88,
  CB_FEATURES = CB_HDR + 12, CB_EXT = 24, CB_GROUPS = CB_HDR + CB_EXT,
  CB_GROUPS_LEN = 64 * 8, CB_REC = 16, CB_RECS = CB_GROUPS + CB_GROUPS_LEN
};

/* Bitwise CRC-32 (IEEE): independent of the library's table. */
uint32_t cb_crc32(const unsigned char *p, size_t n);
/* Recomputes the trailer: the file passes its checksum again. */
void cb_reseal(unsigned char *b, size_t n);
uint32_t cb_format(const unsigned char *b);
/* Rewrites a file of this library's writer as format 3 (no groups), 2 (the
 * ext's features word reserved, 0 as well) or 1 (no ext, records of numel
 * only), resealed, in place; returns the new length. A file already at or
 * below the format is left. */
size_t cb_downgrade(unsigned char *b, size_t n, uint32_t format);

#endif

#include "ckpt_bytes.h"

#include <string.h>

uint32_t cb_crc32(const unsigned char *p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  while (n--) {
    c ^= *p++;
    for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
  }
  return ~c;
}

void cb_reseal(unsigned char *b, size_t n) {
  const uint32_t c = cb_crc32(b, n - 4);
  memcpy(b + n - 4, &c, 4);
}

uint32_t cb_format(const unsigned char *b) {
  uint32_t f;
  memcpy(&f, b + CB_FORMAT, 4);
  return f;
}

/* Cuts len bytes at off out of the n-byte file; returns the new length. */
static size_t cut(unsigned char *b, size_t n, size_t off, size_t len) {
  memmove(b + off, b + off + len, n - off - len);
  return n - len;
}

size_t cb_downgrade(unsigned char *b, size_t n, uint32_t format) {
  const uint32_t from = cb_format(b);
  if (from <= format) return n;
  memcpy(b + CB_FORMAT, &format, 4);
  if (from >= 4) n = cut(b, n, CB_GROUPS, CB_GROUPS_LEN);
  if (format <= 2) memset(b + CB_FEATURES, 0, 4);
  if (format == 1) {
    int64_t nt;
    memcpy(&nt, b + CB_NT, 8);
    for (int64_t i = 0; i < nt; i++)
      memmove(b + CB_HDR + 8 * i, b + CB_HDR + CB_EXT + CB_REC * i, 8);
    const size_t old_prefix = CB_HDR + CB_EXT + CB_REC * (size_t)nt;
    const size_t new_prefix = CB_HDR + 8 * (size_t)nt;
    n = cut(b, n, new_prefix, old_prefix - new_prefix);
  }
  cb_reseal(b, n);
  return n;
}

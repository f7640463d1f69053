/* Checkpoints: the parameters, master weights, the optimizer state and the
 * step scalars in one versioned, checksummed file, written atomically (a
 * temporary file in the same directory, fsync, rename, fsync of the
 * directory), so a crash mid-save never leaves a torn checkpoint under the
 * final name.
 *
 * Layout (little-endian), format 4:
 *   header_t
 *   ext_t                          (formats 2-4; format 1 files are all-fp32)
 *   groups_t                       (format 4: the groups' multipliers)
 *   per tensor: tensor_t           (format 1: only its int64 numel)
 *   per tensor: param[numel] in its dtype, then its master (fp32 or 16-bit
 *     remainders) if it has one, then its state buffers in the state dtype
 *   uint32 crc32 of everything before it
 * Format 3 is format 2 with the optimizer's features (FEAT_*) in the ext
 * word that format 2 reserved (and wrote as 0). Format 4 adds the groups'
 * multipliers, settable since 0.3 (mtopt_optimizer_set_group); files of
 * earlier formats leave the optimizer's as they are.
 *
 * Load checks the file's integrity (its length against the smallest file,
 * its checksum over every byte) before it reads any field, so a corrupt file
 * is IO_ERROR whatever its damage; only then are the fields judged
 * (NOT_SUPPORTED, INVALID_ARGUMENT). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core.h"

#define CKPT_MAGIC "MTOPTCKP"
#define CKPT_FORMAT 4u

typedef struct {
  char magic[8];
  uint32_t format;
  uint32_t kind;
  int64_t num_tensors;
  int32_t num_state; /* state buffers per tensor */
  int32_t reserved;
  /* hyperparameters and step state, as mtopt__hyper_t holds them */
  float lr, beta1, beta2, eps, weight_decay, momentum, dampening, max_grad_norm;
  int64_t step, skipped_steps;
  float loss_scale;
  int32_t growth_tracker;
} header_t;

/* Formats 2, 3: the dtype layout, the features and the generator. */
typedef struct {
  uint32_t state_dtype;    /* mtopt_dtype_t */
  uint32_t master_weights; /* mtopt_master_t */
  uint32_t rounding;       /* mtopt_rounding_t */
  uint32_t features;       /* format 3: FEAT_*; format 2: reserved, 0 */
  uint64_t seed;
} ext_t;

/* Format 4: lr and weight-decay multipliers of every group, as
 * mtopt__group_rec_t holds them. */
typedef struct {
  mtopt__group_rec_t g[MTOPT_MAX_GROUPS];
} groups_t;
_Static_assert(sizeof(groups_t) == MTOPT_MAX_GROUPS * 2 * sizeof(float),
               "groups_t is two floats per group, no padding");

typedef struct {
  int64_t numel;
  uint32_t param_dtype; /* mtopt_dtype_t */
  uint32_t master;      /* MTOPT__MASTER_* */
} tensor_t;

/* The features fixed at create that decide what a step does with the saved
 * scalars: a checkpoint loads only into an optimizer with the same set. */
enum {
  FEAT_STATIC_SCALE = 1u << 0,  /* a constant loss scale != 1 */
  FEAT_DYNAMIC_SCALE = 1u << 1, /* dynamic loss scaling */
  FEAT_CLIP = 1u << 2,          /* max_grad_norm > 0 at create */
  FEAT_SKIP = 1u << 3,          /* skip_nonfinite */
};

static uint32_t features_of(const mtopt_optimizer_config_t *c) {
  uint32_t f = c->dynamic_loss_scale ? FEAT_DYNAMIC_SCALE
               : c->loss_scale != 1.0f ? FEAT_STATIC_SCALE : 0u;
  if (c->max_grad_norm > 0.0f) f |= FEAT_CLIP;
  if (c->skip_nonfinite) f |= FEAT_SKIP;
  return f;
}

static void features_text(uint32_t f, char *out, size_t n) {
  snprintf(out, n, "loss scale %s, clipping %s, skip_nonfinite %s%s",
           f & FEAT_DYNAMIC_SCALE ? "dynamic" : f & FEAT_STATIC_SCALE ? "static" : "none",
           f & FEAT_CLIP ? "on" : "off", f & FEAT_SKIP ? "on" : "off",
           f & ~(uint32_t)(FEAT_STATIC_SCALE | FEAT_DYNAMIC_SCALE | FEAT_CLIP | FEAT_SKIP)
               ? ", unknown features"
               : "");
}

/* CRC-32 (IEEE, as zlib): the table of the reflected polynomial 0xEDB88320,
 * written out so that it is constant (no lazy filling, no race between
 * threads saving on different contexts). tests/checkpoint.c checks files
 * against a bitwise CRC. */
static const uint32_t crc_table[256] = {
    0x00000000u, 0x77073096u, 0xee0e612cu, 0x990951bau, 0x076dc419u, 0x706af48fu,
    0xe963a535u, 0x9e6495a3u, 0x0edb8832u, 0x79dcb8a4u, 0xe0d5e91eu, 0x97d2d988u,
    0x09b64c2bu, 0x7eb17cbdu, 0xe7b82d07u, 0x90bf1d91u, 0x1db71064u, 0x6ab020f2u,
    0xf3b97148u, 0x84be41deu, 0x1adad47du, 0x6ddde4ebu, 0xf4d4b551u, 0x83d385c7u,
    0x136c9856u, 0x646ba8c0u, 0xfd62f97au, 0x8a65c9ecu, 0x14015c4fu, 0x63066cd9u,
    0xfa0f3d63u, 0x8d080df5u, 0x3b6e20c8u, 0x4c69105eu, 0xd56041e4u, 0xa2677172u,
    0x3c03e4d1u, 0x4b04d447u, 0xd20d85fdu, 0xa50ab56bu, 0x35b5a8fau, 0x42b2986cu,
    0xdbbbc9d6u, 0xacbcf940u, 0x32d86ce3u, 0x45df5c75u, 0xdcd60dcfu, 0xabd13d59u,
    0x26d930acu, 0x51de003au, 0xc8d75180u, 0xbfd06116u, 0x21b4f4b5u, 0x56b3c423u,
    0xcfba9599u, 0xb8bda50fu, 0x2802b89eu, 0x5f058808u, 0xc60cd9b2u, 0xb10be924u,
    0x2f6f7c87u, 0x58684c11u, 0xc1611dabu, 0xb6662d3du, 0x76dc4190u, 0x01db7106u,
    0x98d220bcu, 0xefd5102au, 0x71b18589u, 0x06b6b51fu, 0x9fbfe4a5u, 0xe8b8d433u,
    0x7807c9a2u, 0x0f00f934u, 0x9609a88eu, 0xe10e9818u, 0x7f6a0dbbu, 0x086d3d2du,
    0x91646c97u, 0xe6635c01u, 0x6b6b51f4u, 0x1c6c6162u, 0x856530d8u, 0xf262004eu,
    0x6c0695edu, 0x1b01a57bu, 0x8208f4c1u, 0xf50fc457u, 0x65b0d9c6u, 0x12b7e950u,
    0x8bbeb8eau, 0xfcb9887cu, 0x62dd1ddfu, 0x15da2d49u, 0x8cd37cf3u, 0xfbd44c65u,
    0x4db26158u, 0x3ab551ceu, 0xa3bc0074u, 0xd4bb30e2u, 0x4adfa541u, 0x3dd895d7u,
    0xa4d1c46du, 0xd3d6f4fbu, 0x4369e96au, 0x346ed9fcu, 0xad678846u, 0xda60b8d0u,
    0x44042d73u, 0x33031de5u, 0xaa0a4c5fu, 0xdd0d7cc9u, 0x5005713cu, 0x270241aau,
    0xbe0b1010u, 0xc90c2086u, 0x5768b525u, 0x206f85b3u, 0xb966d409u, 0xce61e49fu,
    0x5edef90eu, 0x29d9c998u, 0xb0d09822u, 0xc7d7a8b4u, 0x59b33d17u, 0x2eb40d81u,
    0xb7bd5c3bu, 0xc0ba6cadu, 0xedb88320u, 0x9abfb3b6u, 0x03b6e20cu, 0x74b1d29au,
    0xead54739u, 0x9dd277afu, 0x04db2615u, 0x73dc1683u, 0xe3630b12u, 0x94643b84u,
    0x0d6d6a3eu, 0x7a6a5aa8u, 0xe40ecf0bu, 0x9309ff9du, 0x0a00ae27u, 0x7d079eb1u,
    0xf00f9344u, 0x8708a3d2u, 0x1e01f268u, 0x6906c2feu, 0xf762575du, 0x806567cbu,
    0x196c3671u, 0x6e6b06e7u, 0xfed41b76u, 0x89d32be0u, 0x10da7a5au, 0x67dd4accu,
    0xf9b9df6fu, 0x8ebeeff9u, 0x17b7be43u, 0x60b08ed5u, 0xd6d6a3e8u, 0xa1d1937eu,
    0x38d8c2c4u, 0x4fdff252u, 0xd1bb67f1u, 0xa6bc5767u, 0x3fb506ddu, 0x48b2364bu,
    0xd80d2bdau, 0xaf0a1b4cu, 0x36034af6u, 0x41047a60u, 0xdf60efc3u, 0xa867df55u,
    0x316e8eefu, 0x4669be79u, 0xcb61b38cu, 0xbc66831au, 0x256fd2a0u, 0x5268e236u,
    0xcc0c7795u, 0xbb0b4703u, 0x220216b9u, 0x5505262fu, 0xc5ba3bbeu, 0xb2bd0b28u,
    0x2bb45a92u, 0x5cb36a04u, 0xc2d7ffa7u, 0xb5d0cf31u, 0x2cd99e8bu, 0x5bdeae1du,
    0x9b64c2b0u, 0xec63f226u, 0x756aa39cu, 0x026d930au, 0x9c0906a9u, 0xeb0e363fu,
    0x72076785u, 0x05005713u, 0x95bf4a82u, 0xe2b87a14u, 0x7bb12baeu, 0x0cb61b38u,
    0x92d28e9bu, 0xe5d5be0du, 0x7cdcefb7u, 0x0bdbdf21u, 0x86d3d2d4u, 0xf1d4e242u,
    0x68ddb3f8u, 0x1fda836eu, 0x81be16cdu, 0xf6b9265bu, 0x6fb077e1u, 0x18b74777u,
    0x88085ae6u, 0xff0f6a70u, 0x66063bcau, 0x11010b5cu, 0x8f659effu, 0xf862ae69u,
    0x616bffd3u, 0x166ccf45u, 0xa00ae278u, 0xd70dd2eeu, 0x4e048354u, 0x3903b3c2u,
    0xa7672661u, 0xd06016f7u, 0x4969474du, 0x3e6e77dbu, 0xaed16a4au, 0xd9d65adcu,
    0x40df0b66u, 0x37d83bf0u, 0xa9bcae53u, 0xdebb9ec5u, 0x47b2cf7fu, 0x30b5ffe9u,
    0xbdbdf21cu, 0xcabac28au, 0x53b39330u, 0x24b4a3a6u, 0xbad03605u, 0xcdd70693u,
    0x54de5729u, 0x23d967bfu, 0xb3667a2eu, 0xc4614ab8u, 0x5d681b02u, 0x2a6f2b94u,
    0xb40bbe37u, 0xc30c8ea1u, 0x5a05df1bu, 0x2d02ef8du,
};

/* CRC-32 continued from crc. */
static uint32_t crc32_update(uint32_t crc, const void *data, size_t n) {
  const unsigned char *p = data;
  crc = ~crc;
  while (n--) crc = crc_table[(crc ^ *p++) & 0xFFu] ^ (crc >> 8);
  return ~crc;
}

typedef struct {
  FILE *f;
  uint32_t crc;
} stream_t;

static int put(stream_t *s, const void *p, size_t n) {
  s->crc = crc32_update(s->crc, p, n);
  return fwrite(p, 1, n, s->f) == n;
}

/* The buffers saved for a tensor, in file order, with their sizes in bytes;
 * returns how many. */
typedef struct {
  void *ptr;
  size_t bytes;
} span_t;

static int tensor_buffers(const mtopt_optimizer_t *opt, const mtopt__tensor_rec_t *t,
                          span_t out[4]) {
  const size_t n = (size_t)t->numel, se = (size_t)mtopt__dt_size(t->sdt);
  int k = 0;
  out[k++] = (span_t){t->w, n * (size_t)mtopt__dt_size(t->wdt)};
  if (t->mmode != MTOPT__MASTER_NONE)
    out[k++] = (span_t){t->mw, n * (t->mmode == MTOPT__MASTER_F32 ? 4u : 2u)};
  if (opt->num_state > 0) out[k++] = (span_t){t->s0, n * se};
  if (opt->num_state > 1) out[k++] = (span_t){t->s1, n * se};
  return k;
}

/* The payload's size, and its largest buffer (a staging buffer's size). */
static int64_t payload_bytes(const mtopt_optimizer_t *opt, size_t *largest) {
  int64_t total = 0;
  *largest = 16;
  for (int64_t i = 0; i < opt->plan.num_tensors; i++) {
    span_t b[4];
    const int k = tensor_buffers(opt, &opt->tensors_host[i], b);
    for (int j = 0; j < k; j++) {
      total += (int64_t)b[j].bytes;
      if (b[j].bytes > *largest) *largest = b[j].bytes;
    }
  }
  return total;
}

static ext_t ext_of(const mtopt_optimizer_t *opt, uint64_t seed) {
  ext_t e;
  memset(&e, 0, sizeof e);
  e.state_dtype = (uint32_t)opt->config.state_dtype;
  e.master_weights = (uint32_t)opt->config.master_weights;
  e.rounding = (uint32_t)opt->config.rounding;
  e.features = features_of(&opt->config);
  e.seed = seed;
  return e;
}

/* ------------------------------------------------------------------ save -- */

/* The header and the records of this optimizer, through the stream. */
static int put_header(stream_t *s, const mtopt_optimizer_t *opt, const mtopt__hyper_t *h) {
  header_t hd;
  memset(&hd, 0, sizeof hd);
  memcpy(hd.magic, CKPT_MAGIC, 8);
  hd.format = CKPT_FORMAT;
  hd.kind = (uint32_t)opt->config.kind;
  hd.num_tensors = opt->plan.num_tensors;
  hd.num_state = opt->num_state;
  hd.lr = h->lr, hd.beta1 = h->beta1, hd.beta2 = h->beta2, hd.eps = h->eps;
  hd.weight_decay = h->weight_decay, hd.momentum = h->momentum, hd.dampening = h->dampening;
  hd.max_grad_norm = h->max_grad_norm;
  hd.step = h->step, hd.skipped_steps = h->skipped_steps;
  hd.loss_scale = h->loss_scale, hd.growth_tracker = h->growth_tracker;
  const ext_t ext = ext_of(opt, h->seed);
  groups_t groups;
  memcpy(groups.g, opt->groups_host, sizeof groups.g);
  int ok = put(s, &hd, sizeof hd) && put(s, &ext, sizeof ext) && put(s, &groups, sizeof groups);
  for (int64_t i = 0; ok && i < hd.num_tensors; i++) {
    const mtopt__tensor_rec_t *t = &opt->tensors_host[i];
    const tensor_t rec = {t->numel, t->wdt, t->mmode};
    ok = put(s, &rec, sizeof rec);
  }
  return ok;
}

mtopt_status_t mtopt_optimizer_save(mtopt_optimizer_t *opt, const char *path) {
  static const char fn[] = "mtopt_optimizer_save";
  if (!opt || !path)
    return mtopt__error(opt ? opt->ctx : NULL, MTOPT_STATUS_INVALID_ARGUMENT, "%s: %s is NULL",
                        fn, opt ? "path" : "opt");
  mtopt_context_t *ctx = opt->ctx;
  mtopt__hyper_t h;
  CHECK(ctx->ops->download(ctx, &h, opt->plan.hyper, sizeof h));
  int dfd = -1;
  const char *base;
  CHECK(mtopt__ckpt_open_target(ctx, fn, path, &dfd, &base));
  char tag[MTOPT__CKPT_TMP_LEN - 6 + 1], tmp[MTOPT__CKPT_TMP_LEN + 1] = "";
  snprintf(tag, sizeof tag, MTOPT__CKPT_TMP_PREFIX "%08x-", (unsigned)crc32_update(0, base, strlen(base)));

  size_t largest;
  (void)payload_bytes(opt, &largest);
  void *buf = malloc(largest);
  mtopt_status_t st = MTOPT_STATUS_SUCCESS;
  stream_t s = {NULL, 0};
  int fd = -1;
  if (!buf) {
    st = mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: host allocation failed", fn);
    goto done;
  }
  fd = mtopt__ckpt_create_temp(dfd, tag, tmp);
  if (fd < 0) {
    st = mtopt__error(ctx, MTOPT_STATUS_IO_ERROR,
                      "%s: cannot create a temporary file beside '%s': %s", fn, path,
                      strerror(errno));
    goto done;
  }
  s.f = fdopen(fd, "wb");
  if (!s.f) {
    st = mtopt__error(ctx, MTOPT_STATUS_IO_ERROR, "%s: cannot open a stream on '%s': %s", fn,
                      tmp, strerror(errno));
    goto done;
  }
  fd = -1; /* the stream owns it */

  int ok = put_header(&s, opt, &h);
  for (int64_t i = 0; ok && i < opt->plan.num_tensors; i++) {
    const mtopt__tensor_rec_t *t = &opt->tensors_host[i];
    if (t->numel == 0) continue;
    span_t bufs[4];
    const int k = tensor_buffers(opt, t, bufs);
    for (int b = 0; ok && b < k; b++) {
      st = ctx->ops->download(ctx, buf, bufs[b].ptr, bufs[b].bytes);
      if (st != MTOPT_STATUS_SUCCESS) goto done;
      ok = put(&s, buf, bufs[b].bytes);
    }
  }
  const uint32_t crc = s.crc;
  ok = ok && fwrite(&crc, sizeof crc, 1, s.f) == 1;
  ok = ok && fflush(s.f) == 0 && fsync(fileno(s.f)) == 0;
  if (!ok) {
    st = mtopt__error(ctx, MTOPT_STATUS_IO_ERROR, "%s: writing '%s' failed: %s", fn, tmp,
                      strerror(errno));
    goto done;
  }
  /* Renamed while still open: the lock holds until the name is gone. */
  if (renameat(dfd, tmp, dfd, base) != 0) {
    st = mtopt__error(ctx, MTOPT_STATUS_IO_ERROR, "%s: renaming '%s' to '%s' failed: %s", fn,
                      tmp, path, strerror(errno));
    goto done;
  }
  tmp[0] = '\0';
  fclose(s.f); /* flushed and synced above: closing cannot lose data */
  s.f = NULL;
  mtopt__ckpt_remove_stale(dfd, tag);
  /* The rename is durable once the directory is; file systems that cannot
   * sync a directory (EINVAL) order it anyway. */
  if (fsync(dfd) != 0 && errno != EINVAL && errno != ENOTSUP)
    st = mtopt__error(ctx, MTOPT_STATUS_IO_ERROR,
                      "%s: '%s' is complete, but syncing its directory failed: %s", fn, path,
                      strerror(errno));

done:
  if (s.f) fclose(s.f);
  if (fd >= 0) close(fd);
  if (tmp[0]) unlinkat(dfd, tmp, 0);
  close(dfd);
  free(buf);
  return st;
}

/* ------------------------------------------------------------------ load -- */

/* The CRC of a stream but its last 4 bytes (the trailer): those are held back
 * until more bytes arrive. */
typedef struct {
  uint32_t crc;
  unsigned char tail[4];
  size_t ntail;
  uint64_t total;
} crc_lag_t;

static void lag_feed(crc_lag_t *l, const unsigned char *p, size_t n) {
  l->total += n;
  if (n >= 4) {
    l->crc = crc32_update(l->crc, l->tail, l->ntail);
    l->crc = crc32_update(l->crc, p, n - 4);
    memcpy(l->tail, p + n - 4, 4);
    l->ntail = 4;
    return;
  }
  const size_t out = l->ntail + n > 4 ? l->ntail + n - 4 : 0;
  l->crc = crc32_update(l->crc, l->tail, out);
  memmove(l->tail, l->tail + out, l->ntail - out);
  memcpy(l->tail + l->ntail - out, p, n);
  l->ntail += n - out;
}

/* Reads the whole file: its first cap bytes into data, every byte through the
 * CRC. Returns 0 on a read error. */
static int read_all(FILE *f, unsigned char *data, size_t cap, crc_lag_t *l) {
  unsigned char spill[1 << 14];
  for (;;) {
    const size_t kept = l->total < cap ? (size_t)l->total : cap;
    unsigned char *dst = kept < cap ? data + kept : spill;
    const size_t want = kept < cap ? cap - kept : sizeof spill;
    const size_t got = fread(dst, 1, want, f);
    lag_feed(l, dst, got);
    if (got < want) return !ferror(f);
  }
}

/* The bytes before the tensor records, and before the payload, in a file of
 * this format. */
static size_t records_offset(uint32_t format) {
  return sizeof(header_t) + (format >= 2u ? sizeof(ext_t) : 0) +
         (format >= 4u ? sizeof(groups_t) : 0);
}

static size_t prefix_bytes(uint32_t format, int64_t num_tensors) {
  return records_offset(format) +
         (size_t)num_tensors * (format >= 2u ? sizeof(tensor_t) : sizeof(int64_t));
}

/* Names for the layout's numbers in messages; a file may hold any value. */
static const char *name_of(uint32_t v, const char *const *names, uint32_t n) {
  return v < n ? names[v] : "unknown";
}
static const char *dtype_name(uint32_t v) {
  static const char *const n[] = {"F32", "F16", "BF16", "U16"};
  return name_of(v, n, 4);
}
static const char *master_name(uint32_t v) {
  static const char *const n[] = {"none", "F32", "remainder"};
  return name_of(v, n, 3);
}
static const char *rounding_name(uint32_t v) {
  static const char *const n[] = {"nearest", "stochastic"};
  return name_of(v, n, 2);
}
static const char *kind_name(uint32_t v) {
  static const char *const n[] = {"AdamW", "Adam", "SGD", "LAMB"};
  return name_of(v, n, 4);
}

/* The file's fields against this optimizer, the file verified: format, shape,
 * dtypes, features, length. Fills ext (format 1: the fp32 defaults). */
static mtopt_status_t check_layout(mtopt_optimizer_t *opt, const char *fn, const char *path,
                                   const unsigned char *data, uint64_t total,
                                   const header_t *hd, ext_t *ext) {
  mtopt_context_t *ctx = opt->ctx;
  const int64_t n = opt->plan.num_tensors;
  const int ns = opt->num_state;
  if (hd->format < 1u || hd->format > CKPT_FORMAT)
    return mtopt__error(ctx, MTOPT_STATUS_NOT_SUPPORTED,
                        "%s: '%s' has checkpoint format %u; this library reads formats 1 to %u",
                        fn, path, hd->format, CKPT_FORMAT);
  const ext_t mine = ext_of(opt, 0u);
  /* Format 1 was written by the fp32-only library: its layout is ext_of a
   * default config, its features unrecorded (load judges its scalars). */
  *ext = (ext_t){MTOPT_DTYPE_F32, MTOPT_MASTER_NONE, MTOPT_ROUNDING_NEAREST, mine.features, 0u};
  if (total < prefix_bytes(hd->format, 0) + sizeof(uint32_t))
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: '%s' is shorter than its header says", fn, path);
  if (hd->format >= 2u) memcpy(ext, data + sizeof *hd, sizeof *ext);
  if (hd->reserved != 0 || (hd->format == 2u && ext->features != 0u))
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: '%s' has a reserved field set (%d, %u): not a file this library "
                        "wrote",
                        fn, path, (int)hd->reserved, hd->format == 2u ? ext->features : 0u);
  if (hd->format == 2u) ext->features = mine.features;
  if (ext->state_dtype != mine.state_dtype || ext->master_weights != mine.master_weights ||
      ext->rounding != mine.rounding)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: '%s' was saved with state_dtype %s, master_weights %s, rounding "
                        "%s; this optimizer has %s, %s, %s",
                        fn, path, dtype_name(ext->state_dtype), master_name(ext->master_weights),
                        rounding_name(ext->rounding), dtype_name(mine.state_dtype),
                        master_name(mine.master_weights), rounding_name(mine.rounding));
  if (hd->kind != (uint32_t)opt->config.kind || hd->num_tensors != n || hd->num_state != ns)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: '%s' was saved by another optimizer (%s, %lld tensors, %d "
                        "state buffers; this one: %s, %lld tensors, %d)",
                        fn, path, kind_name(hd->kind), (long long)hd->num_tensors, hd->num_state,
                        kind_name((uint32_t)opt->config.kind), (long long)n, ns);
  if (ext->features != mine.features) {
    char theirs[96], ours[96];
    features_text(ext->features, theirs, sizeof theirs);
    features_text(mine.features, ours, sizeof ours);
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: '%s' was saved by an optimizer with %s; this one has %s", fn, path,
                        theirs, ours);
  }
  const size_t prefix = prefix_bytes(hd->format, n);
  size_t largest;
  const uint64_t want = prefix + (uint64_t)payload_bytes(opt, &largest) + sizeof(uint32_t);
  if (total < prefix + sizeof(uint32_t))
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: '%s' is shorter than its header says", fn, path);
  const unsigned char *p = data + records_offset(hd->format);
  for (int64_t i = 0; i < n; i++) {
    const mtopt__tensor_rec_t *t = &opt->tensors_host[i];
    tensor_t rec = {0, MTOPT_DTYPE_F32, MTOPT__MASTER_NONE};
    const size_t rs = hd->format >= 2u ? sizeof rec : sizeof rec.numel;
    memcpy(&rec, p, rs);
    p += rs;
    if (rec.numel != t->numel || rec.param_dtype != t->wdt || rec.master != t->mmode)
      return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                          "%s: '%s': tensor %lld has %lld elements of dtype %s with master "
                          "%s; the optimizer's has %lld of dtype %s with master %s",
                          fn, path, (long long)i, (long long)rec.numel,
                          dtype_name(rec.param_dtype), master_name(rec.master),
                          (long long)t->numel, dtype_name(t->wdt), master_name(t->mmode));
  }
  if (total != want)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: '%s' has %llu bytes; its header says %llu", fn, path,
                        (unsigned long long)total, (unsigned long long)want);
  return MTOPT_STATUS_SUCCESS;
}

/* Load reads and verifies the whole file into host memory before it writes
 * anything, so a bad file changes nothing. */
/* What load verified, to apply once it is agreed. */
typedef struct {
  mtopt__hyper_t hh;
  groups_t groups;
  const unsigned char *src; /* the tensors' bytes */
} verified_t;

/* Reads and verifies the file into data (at most cap bytes): integrity,
 * then the layout, the scalars and the groups; nothing is written. */
static mtopt_status_t verify(mtopt_optimizer_t *opt, const char *fn, const char *path, FILE *f,
                             unsigned char *data, size_t cap, verified_t *v) {
  mtopt_context_t *ctx = opt->ctx;
  crc_lag_t lag = {0, {0}, 0, 0};
  /* Integrity first: the magic (before reading what may be a large file of
   * something else), the length, the checksum. */
  const size_t got = fread(data, 1, 8, f);
  lag_feed(&lag, data, got);
  if (got != 8 || memcmp(data, CKPT_MAGIC, 8) != 0)
    return mtopt__error(ctx, MTOPT_STATUS_IO_ERROR, "%s: '%s' is not an mtopt checkpoint", fn,
                        path);
  if (!read_all(f, data, cap, &lag))
    return mtopt__error(ctx, MTOPT_STATUS_IO_ERROR, "%s: reading '%s' failed: %s", fn, path,
                        strerror(errno));
  uint32_t crc_file;
  memcpy(&crc_file, lag.tail, sizeof crc_file);
  if (lag.total < sizeof(header_t) + sizeof crc_file)
    return mtopt__error(ctx, MTOPT_STATUS_IO_ERROR, "%s: '%s' is truncated", fn, path);
  if (crc_file != lag.crc)
    return mtopt__error(ctx, MTOPT_STATUS_IO_ERROR,
                        "%s: '%s' fails its checksum (corrupt or truncated)", fn, path);
  header_t hd;
  ext_t ext = {0, 0, 0, 0, 0u};
  memcpy(&hd, data, sizeof hd);
  CHECK(check_layout(opt, fn, path, data, lag.total, &hd, &ext));
  mtopt__hyper_t hh = opt->hyper_host;
  hh.lr = hd.lr, hh.beta1 = hd.beta1, hh.beta2 = hd.beta2, hh.eps = hd.eps;
  hh.weight_decay = hd.weight_decay, hh.momentum = hd.momentum, hh.dampening = hd.dampening;
  hh.max_grad_norm = hd.max_grad_norm;
  hh.step = hd.step, hh.skipped_steps = hd.skipped_steps;
  hh.loss_scale = hd.loss_scale, hh.growth_tracker = hd.growth_tracker;
  hh.last_grad_norm = NAN, hh.last_skipped = 0;
  hh.seed = ext.seed;
  CHECK(mtopt__check_loaded_hyper(ctx, fn, &opt->config, &hh));
  memcpy(v->groups.g, opt->groups_host, sizeof v->groups.g);
  if (hd.format >= 4u) memcpy(&v->groups, data + sizeof hd + sizeof ext, sizeof v->groups);
  for (int32_t g = 0; g < MTOPT_MAX_GROUPS; g++)
    CHECK(mtopt__check_group(ctx, fn, g, v->groups.g[g].lr_mult, v->groups.g[g].wd_mult));
  v->hh = hh;
  v->src = data + prefix_bytes(hd.format, opt->plan.num_tensors);
  return MTOPT_STATUS_SUCCESS;
}

/* Writes what verify read: parameters, state and scalars, after any step
 * still in flight. */
static mtopt_status_t apply(mtopt_optimizer_t *opt, const verified_t *v) {
  mtopt_context_t *ctx = opt->ctx;
  CHECK(ctx->ops->synchronize(ctx));
  const unsigned char *src = v->src;
  for (int64_t i = 0; i < opt->plan.num_tensors; i++) {
    const mtopt__tensor_rec_t *t = &opt->tensors_host[i];
    if (t->numel == 0) continue;
    span_t bufs[4];
    const int k = tensor_buffers(opt, t, bufs);
    for (int b = 0; b < k; b++) {
      CHECK(ctx->ops->upload(ctx, bufs[b].ptr, src, bufs[b].bytes));
      src += bufs[b].bytes;
    }
  }
  CHECK(ctx->ops->upload(ctx, opt->plan.hyper, &v->hh, sizeof v->hh));
  opt->hyper_host = v->hh;
  CHECK(ctx->ops->upload(ctx, (void *)opt->plan.groups, v->groups.g, sizeof v->groups.g));
  memcpy(opt->groups_host, v->groups.g, sizeof v->groups.g);
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt__optimizer_load_agreed(mtopt_optimizer_t *opt, const char *fn,
                                            const char *path, mtopt__agree_fn agree, void *arg) {
  mtopt_context_t *ctx = opt->ctx;
  mtopt_status_t st = MTOPT_STATUS_SUCCESS;
  /* The largest file this optimizer could load: bytes past it are read
   * through the checksum only. */
  size_t largest;
  const size_t cap = prefix_bytes(CKPT_FORMAT, opt->plan.num_tensors) +
                     (size_t)payload_bytes(opt, &largest) + sizeof(uint32_t);
  unsigned char *data = NULL;
  FILE *f = fopen(path, "rb");
  if (!f)
    st = mtopt__error(ctx, MTOPT_STATUS_IO_ERROR, "%s: cannot open '%s': %s", fn, path,
                      strerror(errno));
  if (st == MTOPT_STATUS_SUCCESS && !(data = malloc(cap)))
    st = mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: host allocation failed", fn);
  verified_t v;
  memset(&v, 0, sizeof v);
  if (st == MTOPT_STATUS_SUCCESS) st = verify(opt, fn, path, f, data, cap, &v);
  if (agree) st = agree(arg, st, st == MTOPT_STATUS_SUCCESS ? v.hh.step : -1);
  if (st == MTOPT_STATUS_SUCCESS) st = apply(opt, &v);
  if (f) fclose(f);
  free(data);
  return st;
}

mtopt_status_t mtopt_optimizer_load(mtopt_optimizer_t *opt, const char *path) {
  static const char fn[] = "mtopt_optimizer_load";
  if (!opt || !path)
    return mtopt__error(opt ? opt->ctx : NULL, MTOPT_STATUS_INVALID_ARGUMENT, "%s: %s is NULL",
                        fn, opt ? "path" : "opt");
  return mtopt__optimizer_load_agreed(opt, fn, path, NULL, NULL);
}

/* Checkpoints: the parameters, master weights, the optimizer state and the
 * step scalars in one versioned, checksummed file, written atomically (a
 * temporary file in the same directory, fsync, rename), so a crash mid-save
 * never leaves a torn checkpoint under the final name.
 *
 * Layout (little-endian), format 2:
 *   header_t
 *   ext_t                          (format 2; format 1 files are all-fp32)
 *   per tensor: tensor_t           (format 1: only its int64 numel)
 *   per tensor: param[numel] in its dtype, then its master (fp32 or 16-bit
 *     remainders) if it has one, then its state buffers in the state dtype
 *   uint32 crc32 of everything before it
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core.h"

#define CKPT_MAGIC "MTOPTCKP"
#define CKPT_FORMAT 2u

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

/* Format 2: the dtype layout and the generator. */
typedef struct {
  uint32_t state_dtype;    /* mtopt_dtype_t */
  uint32_t master_weights; /* mtopt_master_t */
  uint32_t rounding;       /* mtopt_rounding_t */
  uint32_t reserved;
  uint64_t seed;
} ext_t;

typedef struct {
  int64_t numel;
  uint32_t param_dtype; /* mtopt_dtype_t */
  uint32_t master;      /* MTOPT__MASTER_* */
} tensor_t;

static uint32_t crc_table[256];

static void crc_init(void) {
  for (uint32_t i = 0; i < 256; i++) {
    uint32_t c = i;
    for (int k = 0; k < 8; k++) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    crc_table[i] = c;
  }
}

/* CRC-32 (IEEE, as zlib), continued from crc. */
static uint32_t crc32_update(uint32_t crc, const void *data, size_t n) {
  if (!crc_table[1]) crc_init();
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

static int get(stream_t *s, void *p, size_t n) {
  if (fread(p, 1, n, s->f) != n) return 0;
  s->crc = crc32_update(s->crc, p, n);
  return 1;
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
  e.seed = seed;
  return e;
}

mtopt_status_t mtopt_optimizer_save(mtopt_optimizer_t *opt, const char *path) {
  static const char fn[] = "mtopt_optimizer_save";
  if (!opt || !path)
    return mtopt__error(opt ? opt->ctx : NULL, MTOPT_STATUS_INVALID_ARGUMENT, "%s: %s is NULL",
                        fn, opt ? "path" : "opt");
  mtopt_context_t *ctx = opt->ctx;
  mtopt__hyper_t h;
  CHECK(ctx->ops->download(ctx, &h, opt->plan.hyper, sizeof h));

  const size_t plen = strlen(path);
  char *tmp = malloc(plen + 16);
  size_t largest;
  (void)payload_bytes(opt, &largest);
  void *buf = malloc(largest);
  if (!tmp || !buf) {
    free(tmp);
    free(buf);
    return mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: host allocation failed", fn);
  }
  snprintf(tmp, plen + 16, "%s.tmpXXXXXX", path);
  mtopt_status_t st = MTOPT_STATUS_SUCCESS;
  const int fd = mkstemp(tmp);
  stream_t s = {fd >= 0 ? fdopen(fd, "wb") : NULL, 0};
  if (!s.f) {
    st = mtopt__error(ctx, MTOPT_STATUS_IO_ERROR, "%s: cannot create '%s': %s", fn, tmp,
                      strerror(errno));
    if (fd >= 0) close(fd);
    free(tmp);
    free(buf);
    return st;
  }

  header_t hd;
  memset(&hd, 0, sizeof hd);
  memcpy(hd.magic, CKPT_MAGIC, 8);
  hd.format = CKPT_FORMAT;
  hd.kind = (uint32_t)opt->config.kind;
  hd.num_tensors = opt->plan.num_tensors;
  hd.num_state = opt->num_state;
  hd.lr = h.lr, hd.beta1 = h.beta1, hd.beta2 = h.beta2, hd.eps = h.eps;
  hd.weight_decay = h.weight_decay, hd.momentum = h.momentum, hd.dampening = h.dampening;
  hd.max_grad_norm = h.max_grad_norm;
  hd.step = h.step, hd.skipped_steps = h.skipped_steps;
  hd.loss_scale = h.loss_scale, hd.growth_tracker = h.growth_tracker;

  const ext_t ext = ext_of(opt, h.seed);
  int ok = put(&s, &hd, sizeof hd) && put(&s, &ext, sizeof ext);
  for (int64_t i = 0; ok && i < hd.num_tensors; i++) {
    const mtopt__tensor_rec_t *t = &opt->tensors_host[i];
    const tensor_t rec = {t->numel, t->wdt, t->mmode};
    ok = put(&s, &rec, sizeof rec);
  }
  for (int64_t i = 0; ok && i < hd.num_tensors; i++) {
    const mtopt__tensor_rec_t *t = &opt->tensors_host[i];
    if (t->numel == 0) continue;
    span_t bufs[4];
    const int k = tensor_buffers(opt, t, bufs);
    for (int b = 0; ok && b < k; b++) {
      st = ctx->ops->download(ctx, buf, bufs[b].ptr, bufs[b].bytes);
      if (st != MTOPT_STATUS_SUCCESS) goto fail;
      ok = put(&s, buf, bufs[b].bytes);
    }
  }
  const uint32_t crc = s.crc;
  ok = ok && fwrite(&crc, sizeof crc, 1, s.f) == 1;
  ok = ok && fflush(s.f) == 0 && fsync(fileno(s.f)) == 0;
  if (!ok) {
    st = mtopt__error(ctx, MTOPT_STATUS_IO_ERROR, "%s: writing '%s' failed: %s", fn, tmp,
                      strerror(errno));
    goto fail;
  }
  if (fclose(s.f) != 0) {
    s.f = NULL;
    st = mtopt__error(ctx, MTOPT_STATUS_IO_ERROR, "%s: closing '%s' failed: %s", fn, tmp,
                      strerror(errno));
    goto fail;
  }
  s.f = NULL;
  if (rename(tmp, path) != 0) {
    st = mtopt__error(ctx, MTOPT_STATUS_IO_ERROR, "%s: renaming '%s' to '%s' failed: %s", fn,
                      tmp, path, strerror(errno));
    goto fail;
  }
  free(tmp);
  free(buf);
  return MTOPT_STATUS_SUCCESS;

fail:
  if (s.f) fclose(s.f);
  remove(tmp);
  free(tmp);
  free(buf);
  return st;
}

/* Load reads and verifies the whole file into host memory before it writes
 * anything, so a bad file changes nothing. */
mtopt_status_t mtopt_optimizer_load(mtopt_optimizer_t *opt, const char *path) {
  static const char fn[] = "mtopt_optimizer_load";
  if (!opt || !path)
    return mtopt__error(opt ? opt->ctx : NULL, MTOPT_STATUS_INVALID_ARGUMENT, "%s: %s is NULL",
                        fn, opt ? "path" : "opt");
  mtopt_context_t *ctx = opt->ctx;
  stream_t s = {fopen(path, "rb"), 0};
  if (!s.f)
    return mtopt__error(ctx, MTOPT_STATUS_IO_ERROR, "%s: cannot open '%s': %s", fn, path,
                        strerror(errno));
  mtopt_status_t st = MTOPT_STATUS_SUCCESS;
  unsigned char *data = NULL;
  header_t hd;
  const int64_t n = opt->plan.num_tensors;
  const int ns = opt->num_state;
  if (!get(&s, &hd, sizeof hd) || memcmp(hd.magic, CKPT_MAGIC, 8) != 0) {
    st = mtopt__error(ctx, MTOPT_STATUS_IO_ERROR, "%s: '%s' is not an mtopt checkpoint", fn,
                      path);
    goto done;
  }
  if (hd.format != 1u && hd.format != CKPT_FORMAT) {
    st = mtopt__error(ctx, MTOPT_STATUS_NOT_SUPPORTED,
                      "%s: '%s' has checkpoint format %u; this library reads formats 1 and %u",
                      fn, path, hd.format, CKPT_FORMAT);
    goto done;
  }
  /* Format 1 was written by the fp32-only library: its layout is ext_of a
   * default config. */
  ext_t ext = {MTOPT_DTYPE_F32, MTOPT_MASTER_NONE, MTOPT_ROUNDING_NEAREST, 0u, 0u};
  if (hd.format >= 2u && !get(&s, &ext, sizeof ext)) {
    st = mtopt__error(ctx, MTOPT_STATUS_IO_ERROR, "%s: '%s' is truncated", fn, path);
    goto done;
  }
  const ext_t mine = ext_of(opt, 0u);
  if (ext.state_dtype != mine.state_dtype || ext.master_weights != mine.master_weights ||
      ext.rounding != mine.rounding) {
    st = mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                      "%s: '%s' was saved with state_dtype %u, master_weights %u, rounding %u; "
                      "this optimizer has %u, %u, %u",
                      fn, path, ext.state_dtype, ext.master_weights, ext.rounding,
                      mine.state_dtype, mine.master_weights, mine.rounding);
    goto done;
  }
  if (hd.kind != (uint32_t)opt->config.kind || hd.num_tensors != n || hd.num_state != ns) {
    st = mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                      "%s: '%s' was saved by another optimizer (kind %u, %lld tensors, %d "
                      "state buffers; this one: kind %d, %lld tensors, %d)",
                      fn, path, hd.kind, (long long)hd.num_tensors, hd.num_state,
                      (int)opt->config.kind, (long long)n, ns);
    goto done;
  }
  for (int64_t i = 0; i < n; i++) {
    const mtopt__tensor_rec_t *t = &opt->tensors_host[i];
    tensor_t rec = {0, MTOPT_DTYPE_F32, MTOPT__MASTER_NONE};
    if (!get(&s, &rec, hd.format >= 2u ? sizeof rec : sizeof rec.numel)) {
      st = mtopt__error(ctx, MTOPT_STATUS_IO_ERROR, "%s: '%s' is truncated", fn, path);
      goto done;
    }
    if (rec.numel != t->numel || rec.param_dtype != t->wdt || rec.master != t->mmode) {
      st = mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: '%s': tensor %lld has %lld elements of dtype %u with master %u; "
                        "the optimizer's has %lld of dtype %u with master %u",
                        fn, path, (long long)i, (long long)rec.numel, rec.param_dtype,
                        rec.master, (long long)t->numel, (unsigned)t->wdt, (unsigned)t->mmode);
      goto done;
    }
  }
  size_t largest;
  const int64_t bytes = payload_bytes(opt, &largest);
  data = malloc((size_t)(bytes > 0 ? bytes : 1));
  if (!data) {
    st = mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: host allocation failed", fn);
    goto done;
  }
  uint32_t crc_file;
  const uint32_t crc_want = (get(&s, data, (size_t)bytes), s.crc);
  if (fread(&crc_file, sizeof crc_file, 1, s.f) != 1 || fgetc(s.f) != EOF) {
    st = mtopt__error(ctx, MTOPT_STATUS_IO_ERROR, "%s: '%s' is truncated or has trailing data",
                      fn, path);
    goto done;
  }
  if (crc_file != crc_want) {
    st = mtopt__error(ctx, MTOPT_STATUS_IO_ERROR, "%s: '%s' fails its checksum (corrupt)", fn,
                      path);
    goto done;
  }
  /* Verified: now write parameters, state and scalars, after any step still
   * in flight. */
  CHECK_GOTO(ctx->ops->synchronize(ctx), st, done);
  const unsigned char *src = data;
  for (int64_t i = 0; i < n; i++) {
    const mtopt__tensor_rec_t *t = &opt->tensors_host[i];
    if (t->numel == 0) continue;
    span_t bufs[4];
    const int k = tensor_buffers(opt, t, bufs);
    for (int b = 0; b < k; b++) {
      CHECK_GOTO(ctx->ops->upload(ctx, bufs[b].ptr, src, bufs[b].bytes), st, done);
      src += bufs[b].bytes;
    }
  }
  mtopt__hyper_t *hh = &opt->hyper_host;
  hh->lr = hd.lr, hh->beta1 = hd.beta1, hh->beta2 = hd.beta2, hh->eps = hd.eps;
  hh->weight_decay = hd.weight_decay, hh->momentum = hd.momentum, hh->dampening = hd.dampening;
  hh->max_grad_norm = hd.max_grad_norm;
  hh->step = hd.step, hh->skipped_steps = hd.skipped_steps;
  hh->loss_scale = hd.loss_scale, hh->growth_tracker = hd.growth_tracker;
  hh->last_grad_norm = NAN, hh->last_skipped = 0;
  hh->seed = ext.seed;
  st = ctx->ops->upload(ctx, opt->plan.hyper, hh, sizeof *hh);

done:
  fclose(s.f);
  free(data);
  return st;
}

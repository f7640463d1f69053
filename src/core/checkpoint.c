/* Checkpoints: the parameters, the optimizer state and the step scalars in one
 * versioned, checksummed file, written atomically (a temporary file in the
 * same directory, fsync, rename), so a crash mid-save never leaves a torn
 * checkpoint under the final name.
 *
 * Layout (little-endian):
 *   header_t
 *   int64 numel[num_tensors]
 *   per tensor: float param[numel], then its state buffers (float[numel] each)
 *   uint32 crc32 of everything before it
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core.h"

#define CKPT_MAGIC "MTOPTCKP"
#define CKPT_FORMAT 1u

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

static int64_t max_numel(const mtopt_optimizer_t *opt) {
  int64_t m = 1;
  for (int64_t i = 0; i < opt->plan.num_tensors; i++)
    if (opt->tensors_host[i].numel > m) m = opt->tensors_host[i].numel;
  return m;
}

/* The buffers saved for tensor i, in file order. */
static void tensor_buffers(const mtopt__tensor_rec_t *t, float *bufs[3]) {
  bufs[0] = t->w;
  bufs[1] = t->s0;
  bufs[2] = t->s1;
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
  float *buf = malloc((size_t)max_numel(opt) * sizeof(float));
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

  int ok = put(&s, &hd, sizeof hd);
  for (int64_t i = 0; ok && i < hd.num_tensors; i++)
    ok = put(&s, &opt->tensors_host[i].numel, sizeof(int64_t));
  for (int64_t i = 0; ok && i < hd.num_tensors; i++) {
    const mtopt__tensor_rec_t *t = &opt->tensors_host[i];
    if (t->numel == 0) continue;
    float *bufs[3];
    tensor_buffers(t, bufs);
    for (int b = 0; ok && b < 1 + hd.num_state; b++) {
      const size_t bytes = (size_t)t->numel * sizeof(float);
      st = ctx->ops->download(ctx, buf, bufs[b], bytes);
      if (st != MTOPT_STATUS_SUCCESS) goto fail;
      ok = put(&s, buf, bytes);
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
  float *data = NULL;
  header_t hd;
  const int64_t n = opt->plan.num_tensors;
  const int ns = opt->num_state;
  if (!get(&s, &hd, sizeof hd) || memcmp(hd.magic, CKPT_MAGIC, 8) != 0) {
    st = mtopt__error(ctx, MTOPT_STATUS_IO_ERROR, "%s: '%s' is not an mtopt checkpoint", fn,
                      path);
    goto done;
  }
  if (hd.format != CKPT_FORMAT) {
    st = mtopt__error(ctx, MTOPT_STATUS_NOT_SUPPORTED,
                      "%s: '%s' has checkpoint format %u; this library reads format %u", fn,
                      path, hd.format, CKPT_FORMAT);
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
    int64_t numel;
    if (!get(&s, &numel, sizeof numel)) {
      st = mtopt__error(ctx, MTOPT_STATUS_IO_ERROR, "%s: '%s' is truncated", fn, path);
      goto done;
    }
    if (numel != opt->tensors_host[i].numel) {
      st = mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: '%s': tensor %lld has %lld elements, the optimizer's has %lld",
                        fn, path, (long long)i, (long long)numel,
                        (long long)opt->tensors_host[i].numel);
      goto done;
    }
  }
  const int64_t floats = opt->total_numel * (1 + ns);
  data = malloc((size_t)(floats > 0 ? floats : 1) * sizeof(float));
  if (!data) {
    st = mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: host allocation failed", fn);
    goto done;
  }
  uint32_t crc_file;
  const uint32_t crc_want = (get(&s, data, (size_t)floats * sizeof(float)), s.crc);
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
  const float *src = data;
  for (int64_t i = 0; i < n; i++) {
    const mtopt__tensor_rec_t *t = &opt->tensors_host[i];
    if (t->numel == 0) continue;
    float *bufs[3];
    tensor_buffers(t, bufs);
    for (int b = 0; b < 1 + ns; b++) {
      CHECK_GOTO(ctx->ops->upload(ctx, bufs[b], src, (size_t)t->numel * sizeof(float)), st,
                 done);
      src += t->numel;
    }
  }
  mtopt__hyper_t *hh = &opt->hyper_host;
  hh->lr = hd.lr, hh->beta1 = hd.beta1, hh->beta2 = hd.beta2, hh->eps = hd.eps;
  hh->weight_decay = hd.weight_decay, hh->momentum = hd.momentum, hh->dampening = hd.dampening;
  hh->max_grad_norm = hd.max_grad_norm;
  hh->step = hd.step, hh->skipped_steps = hd.skipped_steps;
  hh->loss_scale = hd.loss_scale, hh->growth_tracker = hd.growth_tracker;
  hh->last_grad_norm = NAN, hh->last_skipped = 0;
  st = ctx->ops->upload(ctx, opt->plan.hyper, hh, sizeof *hh);

done:
  fclose(s.f);
  free(data);
  return st;
}

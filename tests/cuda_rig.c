/* The CUDA backend suite's rig (cuda_rig.h): the model, the sides, the
 * comparisons and the case configs. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_rig.h"

void *xmalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  ck_assert_msg(p != NULL, "malloc(%zu) failed", bytes);
  return p;
}

void model_make(model_t *m, tu_rng_t *r, int64_t n, int64_t chunk, int64_t max_numel) {
  memset(m, 0, sizeof *m);
  m->n = n;
  m->numel = xmalloc((size_t)n * sizeof(int64_t));
  m->w_off = xmalloc((size_t)n * sizeof(int64_t));
  m->g_off = xmalloc((size_t)n * sizeof(int64_t));
  m->p_off = xmalloc((size_t)n * sizeof(int64_t));
  m->group = xmalloc((size_t)n * sizeof(int32_t));
  m->flags = xmalloc((size_t)n * sizeof(uint32_t));
  const int64_t special[] = {0, 1, 3, chunk - 1, chunk, chunk + 1, 2, 5, 2 * chunk + 3, 0, 7};
  const int64_t nspecial = (int64_t)(sizeof special / sizeof *special);
  int64_t wc = 0, gc = 0, pc = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t k = i < nspecial ? special[i] : tu_int(r, 1, max_numel);
    if (k < 0) k = 0;
    m->numel[i] = k;
    wc += tu_int(r, 0, 3); /* 0-3 floats off a 16-byte boundary */
    m->w_off[i] = wc;
    wc += k;
    if (tu_int(r, 0, 2) == 0) {
      m->g_off[i] = -1; /* library-owned */
    } else {
      /* Half the user gradients share the weights' residue (vector path), the
       * rest get a random one (scalar path when it differs). */
      const int64_t want = tu_int(r, 0, 1) ? (m->w_off[i] & 3) : tu_int(r, 0, 3);
      gc += (want - gc) & 3;
      m->g_off[i] = gc;
      gc += k;
    }
    m->p_off[i] = pc;
    pc += k;
    m->group[i] = (int32_t)tu_int(r, 0, 2);
    m->flags[i] = tu_int(r, 0, 4) == 0 ? MTOPT_TENSOR_NO_WEIGHT_DECAY : 0u;
  }
  m->w_total = wc + 5;
  m->g_total = gc + 5;
  m->packed = pc;
  m->w0 = xmalloc((size_t)m->w_total * sizeof(float));
  tu_fill(r, m->w0, m->w_total, -1.0f, 1.0f);
}

void model_free(model_t *m) {
  free(m->numel);
  free(m->w_off);
  free(m->g_off);
  free(m->p_off);
  free(m->group);
  free(m->flags);
  free(m->w0);
  memset(m, 0, sizeof *m);
}

/* Host <-> side copies, ordered with the side's stream (tu_to_backend's
 * cudaMemcpy is not, when the side runs on a non-blocking stream). */
static void side_copy(side_t *s, void *dst, const void *src, size_t bytes,
                      enum cudaMemcpyKind kind) {
  if (!bytes) return;
  if (!s->cuda) {
    memcpy(dst, src, bytes);
    return;
  }
  TU_CUDA(cudaMemcpyAsync(dst, src, bytes, kind, s->stream));
  TU_CUDA(cudaStreamSynchronize(s->stream));
}

static void side_put(side_t *s, void *dst, const void *src, size_t bytes) {
  side_copy(s, dst, src, bytes, cudaMemcpyHostToDevice);
}

static void side_get(side_t *s, void *dst, const void *src, size_t bytes) {
  side_copy(s, dst, src, bytes, cudaMemcpyDeviceToHost);
}

static const float group_lr[3] = {1.0f, 0.5f, 1.5f};
static const float group_wd[3] = {1.0f, 2.0f, 0.0f};

mtopt_context_t *cuda_context(void) {
  mtopt_context_config_t cc = MTOPT_CONTEXT_CONFIG_INIT;
  cc.backend = MTOPT_BACKEND_CUDA;
  cc.device = 0;
  mtopt_context_t *ctx = NULL;
  TU_OK(mtopt_context_create(&cc, &ctx));
  return ctx;
}

void side_open(side_t *s, const model_t *m, int cuda, const mtopt_optimizer_config_t *cfg,
               cudaStream_t stream) {
  memset(s, 0, sizeof *s);
  s->cuda = cuda;
  s->m = m;
  s->ctx = cuda ? cuda_context() : tu_cpu_context();
  if (cuda && stream) TU_OK(mtopt_cuda_context_set_stream(s->ctx, stream));
  s->stream = stream;
  const mtopt_backend_t b = cuda ? MTOPT_BACKEND_CUDA : MTOPT_BACKEND_CPU;
  s->w = tu_alloc(b, (size_t)m->w_total * sizeof(float));
  s->g = tu_alloc(b, (size_t)m->g_total * sizeof(float));
  side_put(s, s->w, m->w0, (size_t)m->w_total * sizeof(float));
  TU_OK(mtopt_tensor_list_create(s->ctx, &s->list));
  for (int gi = 0; gi < 3; gi++)
    TU_OK(mtopt_tensor_list_set_group(s->list, gi, group_lr[gi], group_wd[gi]));
  for (int64_t i = 0; i < m->n; i++) {
    mtopt_tensor_desc_t d = MTOPT_TENSOR_DESC_INIT;
    d.param = s->w + m->w_off[i];
    d.grad = m->g_off[i] >= 0 ? s->g + m->g_off[i] : NULL;
    d.numel = m->numel[i];
    d.group = m->group[i];
    d.flags = m->flags[i];
    TU_OK(mtopt_tensor_list_add(s->list, &d, NULL));
  }
  TU_OK(mtopt_optimizer_create(s->ctx, s->list, cfg, &s->opt));
}

void side_close(side_t *s) {
  TU_OK(mtopt_optimizer_destroy(s->opt));
  TU_OK(mtopt_tensor_list_destroy(s->list));
  TU_OK(mtopt_context_destroy(s->ctx));
  tu_free(s->cuda ? MTOPT_BACKEND_CUDA : MTOPT_BACKEND_CPU, s->w);
  tu_free(s->cuda ? MTOPT_BACKEND_CUDA : MTOPT_BACKEND_CPU, s->g);
  memset(s, 0, sizeof *s);
}

/* One copy per allocation. */
void side_set_grads(side_t *s, const float *packed) {
  const model_t *m = s->m;
  if (!s->cuda) {
    for (int64_t i = 0; i < m->n; i++) {
      void *dst = NULL;
      TU_OK(mtopt_optimizer_get_grad(s->opt, i, &dst));
      if (m->numel[i]) memcpy(dst, packed + m->p_off[i], (size_t)m->numel[i] * sizeof(float));
    }
    return;
  }
  void *buf = NULL;
  int64_t buf_n = 0;
  TU_OK(mtopt_optimizer_get_grad_buffer(s->opt, &buf, &buf_n));
  float *img_user = xmalloc((size_t)(m->g_total > 0 ? m->g_total : 1) * sizeof(float));
  float *img_buf = xmalloc((size_t)(buf_n > 0 ? buf_n : 1) * sizeof(float));
  memset(img_user, 0, (size_t)m->g_total * sizeof(float));
  memset(img_buf, 0, (size_t)buf_n * sizeof(float));
  for (int64_t i = 0; i < m->n; i++) {
    if (!m->numel[i]) continue;
    float *dst;
    if (m->g_off[i] >= 0) {
      dst = img_user + m->g_off[i];
    } else {
      void *view = NULL;
      TU_OK(mtopt_optimizer_get_grad(s->opt, i, &view));
      const int64_t off = (float *)view - (float *)buf;
      ck_assert(off >= 0 && off + m->numel[i] <= buf_n);
      dst = img_buf + off;
    }
    memcpy(dst, packed + m->p_off[i], (size_t)m->numel[i] * sizeof(float));
  }
  side_put(s, s->g, img_user, (size_t)m->g_total * sizeof(float));
  if (buf_n) side_put(s, buf, img_buf, (size_t)buf_n * sizeof(float));
  free(img_user);
  free(img_buf);
}

void side_read_w(side_t *s, float *out) {
  tu_poison(out, s->m->w_total);
  side_get(s, out, s->w, (size_t)s->m->w_total * sizeof(float));
}

/* CUDA: the state sits in one slab, so one download of the span covers
 * every tensor. */
void side_read_state(side_t *s, mtopt_state_t which, float *out) {
  const model_t *m = s->m;
  tu_poison(out, m->packed);
  float **ptr = xmalloc((size_t)m->n * sizeof(float *));
  uintptr_t lo = UINTPTR_MAX, hi = 0;
  for (int64_t i = 0; i < m->n; i++) {
    ptr[i] = NULL;
    if (!m->numel[i]) continue;
    void *p = NULL;
    TU_OK(mtopt_optimizer_get_state(s->opt, i, which, &p));
    ptr[i] = p;
    const uintptr_t a = (uintptr_t)p, b = a + (uintptr_t)m->numel[i] * sizeof(float);
    if (a < lo) lo = a;
    if (b > hi) hi = b;
  }
  if (hi > lo) {
    unsigned char *span = xmalloc(hi - lo);
    side_get(s, span, (void *)lo, hi - lo);
    for (int64_t i = 0; i < m->n; i++)
      if (ptr[i])
        memcpy(out + m->p_off[i], span + ((uintptr_t)ptr[i] - lo),
               (size_t)m->numel[i] * sizeof(float));
    free(span);
  }
  free(ptr);
}

int n_state(const mtopt_optimizer_config_t *c) {
  if (c->kind == MTOPT_OPTIMIZER_SGD) return c->momentum > 0.0f ? 1 : 0;
  return 2;
}

mtopt_state_t state_id(const mtopt_optimizer_config_t *c, int k) {
  if (c->kind == MTOPT_OPTIMIZER_SGD) return MTOPT_STATE_MOMENTUM;
  return k == 0 ? MTOPT_STATE_EXP_AVG : MTOPT_STATE_EXP_AVG_SQ;
}

const char *state_name(mtopt_state_t w) {
  return w == MTOPT_STATE_EXP_AVG ? "exp_avg" : w == MTOPT_STATE_EXP_AVG_SQ ? "exp_avg_sq"
                                                                           : "momentum";
}

static double max_abs(const float *x, int64_t n) {
  double m = 0.0;
  for (int64_t i = 0; i < n; i++)
    if (fabs((double)x[i]) > m) m = fabs((double)x[i]);
  return m;
}

/* got vs ref: bit for bit when tol < 0, else |d| <= tol * (max|ref| + |ref|). */
static void expect_equal(const float *got, const float *ref, int64_t n, double tol,
                         const char *what, int step) {
  if (tol < 0.0) {
    const int64_t i = tu_first_bit_diff(got, ref, n);
    ck_assert_msg(i < 0, "%s, step %d: first bit difference at %lld: cuda %.9g, cpu %.9g",
                  what, step, (long long)i, i >= 0 ? got[i] : 0.0, i >= 0 ? ref[i] : 0.0);
    return;
  }
  const double scale = max_abs(ref, n);
  const tu_err_t e = tu_compare_f(got, ref, n, tol * scale, tol);
  char label[160];
  snprintf(label, sizeof label, "%s, step %d (tol %.1e, max|ref| %.3g)", what, step, tol, scale);
  TU_ASSERT_CLOSE(e, label);
}

void compare_sides(side_t *gpu, side_t *cpu, const mtopt_optimizer_config_t *c,
                   const tols_t *t, int step) {
  const model_t *m = gpu->m;
  float *a = xmalloc((size_t)m->w_total * sizeof(float));
  float *b = xmalloc((size_t)m->w_total * sizeof(float));
  side_read_w(gpu, a);
  side_read_w(cpu, b);
  expect_equal(a, b, m->w_total, t->w, "weights", step);
  free(a);
  free(b);
  a = xmalloc((size_t)(m->packed > 0 ? m->packed : 1) * sizeof(float));
  b = xmalloc((size_t)(m->packed > 0 ? m->packed : 1) * sizeof(float));
  for (int k = 0; k < n_state(c); k++) {
    const mtopt_state_t which = state_id(c, k);
    side_read_state(gpu, which, a);
    side_read_state(cpu, which, b);
    expect_equal(a, b, m->packed, k == 0 ? t->state0 : t->state1, state_name(which), step);
  }
  free(a);
  free(b);
}

void expect_all_updated(side_t *s) {
  const model_t *m = s->m;
  float *w = xmalloc((size_t)m->w_total * sizeof(float));
  side_read_w(s, w);
  for (int64_t i = 0; i < m->n; i++) {
    if (!m->numel[i]) continue;
    const int64_t o = m->w_off[i];
    ck_assert_msg(tu_first_bit_diff(w + o, m->w0 + o, m->numel[i]) >= 0,
                  "tensor %lld (%lld elements) was not updated", (long long)i,
                  (long long)m->numel[i]);
  }
  free(w);
}

void expect_same_info(side_t *a, side_t *b, int bitwise_norm) {
  mtopt_step_info_t x = MTOPT_STEP_INFO_INIT, y = MTOPT_STEP_INFO_INIT;
  TU_OK(mtopt_optimizer_get_step_info(a->opt, &x));
  TU_OK(mtopt_optimizer_get_step_info(b->opt, &y));
  ck_assert_int_eq(x.step, y.step);
  ck_assert_int_eq(x.skipped_steps, y.skipped_steps);
  ck_assert_int_eq(x.last_skipped, y.last_skipped);
  ck_assert_int_eq(x.growth_tracker, y.growth_tracker);
  ck_assert_msg(memcmp(&x.loss_scale, &y.loss_scale, sizeof(float)) == 0,
                "loss scale %g vs %g", (double)x.loss_scale, (double)y.loss_scale);
  if (bitwise_norm)
    ck_assert_msg(memcmp(&x.last_grad_norm, &y.last_grad_norm, sizeof(float)) == 0,
                  "grad norm %.9g vs %.9g", (double)x.last_grad_norm, (double)y.last_grad_norm);
  else if (!isfinite(y.last_grad_norm)) /* NaN payloads differ between CPU and GPU */
    ck_assert_msg(isnan(x.last_grad_norm) == isnan(y.last_grad_norm) &&
                      (isnan(y.last_grad_norm) || x.last_grad_norm == y.last_grad_norm),
                  "grad norm %.9g (cuda) vs %.9g (cpu)", (double)x.last_grad_norm,
                  (double)y.last_grad_norm);
  else
    ck_assert_msg(fabs((double)x.last_grad_norm - y.last_grad_norm) <=
                      1e-4 * fabs((double)y.last_grad_norm),
                  "grad norm %.9g (cuda) vs %.9g (cpu)", (double)x.last_grad_norm,
                  (double)y.last_grad_norm);
}

uint64_t name_hash(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

mtopt_optimizer_config_t config_of(const cfg_t *t) {
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  c.kind = t->kind;
  c.chunk_size = t->chunk;
  c.lr = t->lr;
  c.weight_decay = t->wd;
  c.momentum = t->momentum;
  c.dampening = t->dampening;
  c.nesterov = t->nesterov;
  c.max_grad_norm = t->clip;
  c.loss_scale = t->loss_scale;
  c.dynamic_loss_scale = t->dynamic;
  c.growth_interval = 2;
  c.skip_nonfinite = t->skip_nonfinite;
  c.bias_correction = t->bias_correction;
  c.lamb_always_adapt = t->always_adapt;
  return c;
}

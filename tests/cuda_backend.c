/* The CUDA backend against the CPU backend (the executable specification).
 *
 * Every test builds a random "model": tensors of odd sizes (0, 1, 3,
 * chunk_size-1, chunk_size, chunk_size+1, ...) placed at offsets of 0-3 floats
 * from a 16-byte boundary inside one weight allocation, and gradients that are
 * either the user's (in one allocation, at a residue equal to or different from
 * the weights', so both the vector and the scalar path run) or library-owned.
 * The same model and the same gradients go to a CPU optimizer and a CUDA
 * optimizer; results are downloaded into NaN-poisoned host buffers and
 * compared. The whole weight allocation is compared, padding included, so an
 * out-of-bounds write shows.
 *
 * Exactness. Elementwise updates use the same functions (step_math.h), the
 * same operation order and explicit fmaf only, so AdamW, Adam and SGD agree
 * bit for bit whenever the factor applied to g does not depend on a norm: no
 * clipping. Loss scaling and the non-finite check keep bit equality (the
 * factor is 1/loss_scale on both sides, the skip decision is per element).
 *
 * Tolerances (clipping, LAMB). Norms are sums in a different order: the CPU
 * sums each chunk in float over SIMD lanes (at chunk_size 1024, at most 256
 * serial adds per lane: relative error <= 256 * 2^-24 = 1.5e-5 in the worst
 * case, ~1e-6 in practice), the GPU with a tree. So the clip coefficient and
 * LAMB's trust ratio differ by a relative delta <= ~1.5e-5. What they scale
 * (g in m and v, the LAMB update) differs by delta relative to the terms
 * that form it; m and the SGD buffer are sums of random-sign terms, so their
 * error is bounded by delta times the array's magnitude, not the element's.
 * Hence: state |d| <= 1e-4 * max|ref| + 1e-4 * |ref| (>= 6x the worst case).
 * Weights move by lr-sized steps (lr <= 1e-2) whose relative error is ~delta,
 * for a few steps: |d| <= ~1e-8 expected; we allow 1e-5 * max|w| + 1e-5|w|,
 * while a real bug (a wrong clip factor, a chunk using another tensor's
 * norms) moves w by ~lr * O(1) = 1e-3. LAMB without clipping: m and v do not
 * depend on any norm and must match bit for bit. Norms: rtol 1e-4.
 *
 * Run with CK_NOFORK (CUDA must not be touched before a fork); exits 77 where
 * no CUDA device is present. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "mtopt/mtopt_cuda.h"
#include "test_util.h"

#define CU(call)                                                               \
  do {                                                                         \
    cudaError_t cu_e_ = (call);                                                \
    ck_assert_msg(cu_e_ == cudaSuccess, "%s: %s", #call, cudaGetErrorString(cu_e_)); \
  } while (0)

/* ------------------------------------------------------------ the model -- */

typedef struct {
  int64_t n;
  int64_t *numel;
  int64_t *w_off; /* floats from the weight allocation's (256-aligned) base */
  int64_t *g_off; /* in the user-gradient allocation; -1: library-owned */
  int64_t *p_off; /* in the packed layout (tensors back to back) */
  int32_t *group;
  uint32_t *flags;
  int64_t w_total, g_total, packed;
  float *w0; /* initial weight allocation, padding included (random) */
} model_t;

static void *xmalloc(size_t bytes) {
  void *p = malloc(bytes ? bytes : 1);
  ck_assert_msg(p != NULL, "malloc(%zu) failed", bytes);
  return p;
}

/* Sizes: the chunk-boundary cases first, then random up to max_numel. */
static void model_make(model_t *m, tu_rng_t *r, int64_t n, int64_t chunk, int64_t max_numel) {
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

static void model_free(model_t *m) {
  free(m->numel);
  free(m->w_off);
  free(m->g_off);
  free(m->p_off);
  free(m->group);
  free(m->flags);
  free(m->w0);
  memset(m, 0, sizeof *m);
}

/* -------------------------------------------------- one optimizer: a side -- */

typedef struct {
  int cuda;
  const model_t *m;
  mtopt_context_t *ctx;
  mtopt_tensor_list_t *list;
  mtopt_optimizer_t *opt;
  cudaStream_t stream; /* CUDA: the context's stream */
  float *w, *g;        /* weight and user-gradient allocations */
} side_t;

/* Host <-> side copies, ordered with the side's stream (tu_to_backend's
 * cudaMemcpy is not, when the side runs on a non-blocking stream). */
static void side_put(side_t *s, void *dst, const void *src, size_t bytes) {
  if (!bytes) return;
  if (!s->cuda) {
    memcpy(dst, src, bytes);
    return;
  }
  CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s->stream));
  CU(cudaStreamSynchronize(s->stream));
}

static void side_get(side_t *s, void *dst, const void *src, size_t bytes) {
  if (!bytes) return;
  if (!s->cuda) {
    memcpy(dst, src, bytes);
    return;
  }
  CU(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s->stream));
  CU(cudaStreamSynchronize(s->stream));
}

static const float group_lr[3] = {1.0f, 0.5f, 1.5f};
static const float group_wd[3] = {1.0f, 2.0f, 0.0f};

static mtopt_context_t *cuda_context(void) {
  mtopt_context_config_t cc = MTOPT_CONTEXT_CONFIG_INIT;
  cc.backend = MTOPT_BACKEND_CUDA;
  cc.device = 0;
  mtopt_context_t *ctx = NULL;
  TU_OK(mtopt_context_create(&cc, &ctx));
  return ctx;
}

static void side_open(side_t *s, const model_t *m, int cuda,
                      const mtopt_optimizer_config_t *cfg, cudaStream_t stream) {
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

static void side_close(side_t *s) {
  TU_OK(mtopt_optimizer_destroy(s->opt));
  TU_OK(mtopt_tensor_list_destroy(s->list));
  TU_OK(mtopt_context_destroy(s->ctx));
  tu_free(s->cuda ? MTOPT_BACKEND_CUDA : MTOPT_BACKEND_CPU, s->w);
  tu_free(s->cuda ? MTOPT_BACKEND_CUDA : MTOPT_BACKEND_CPU, s->g);
  memset(s, 0, sizeof *s);
}

/* Gradients from the packed layout into wherever each tensor's step reads
 * them (user allocation or library buffer); one copy per allocation. */
static void side_set_grads(side_t *s, const float *packed) {
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

/* The whole weight allocation, into a poisoned buffer. */
static void side_read_w(side_t *s, float *out) {
  tu_poison(out, s->m->w_total);
  side_get(s, out, s->w, (size_t)s->m->w_total * sizeof(float));
}

/* A state buffer of every tensor, packed. CUDA: the state sits in one slab,
 * so one download of the span covers every tensor. */
static void side_read_state(side_t *s, mtopt_state_t which, float *out) {
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

static int n_state(const mtopt_optimizer_config_t *c) {
  if (c->kind == MTOPT_OPTIMIZER_SGD) return c->momentum > 0.0f ? 1 : 0;
  return 2;
}

static mtopt_state_t state_id(const mtopt_optimizer_config_t *c, int k) {
  if (c->kind == MTOPT_OPTIMIZER_SGD) return MTOPT_STATE_MOMENTUM;
  return k == 0 ? MTOPT_STATE_EXP_AVG : MTOPT_STATE_EXP_AVG_SQ;
}

static const char *state_name(mtopt_state_t w) {
  return w == MTOPT_STATE_EXP_AVG ? "exp_avg" : w == MTOPT_STATE_EXP_AVG_SQ ? "exp_avg_sq"
                                                                           : "momentum";
}

/* ------------------------------------------------------------ comparing -- */

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

typedef struct {
  double w, state0, state1; /* < 0: bit for bit */
} tols_t;

static void compare_sides(side_t *gpu, side_t *cpu, const mtopt_optimizer_config_t *c,
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

/* Every non-empty tensor's weights moved. */
static void expect_all_updated(side_t *s) {
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

static void expect_same_info(side_t *a, side_t *b, int bitwise_norm) {
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

/* ------------------------------------------------------------- configs -- */

/* Each case draws its own model from the run's seed and its name. */
static uint64_t name_hash(const char *s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

typedef struct {
  const char *name;
  mtopt_optimizer_kind_t kind;
  int64_t chunk;
  int64_t ntensors, max_numel;
  float lr, wd, momentum, dampening;
  int nesterov;
  float clip, loss_scale;
  int dynamic, skip_nonfinite;
  int bias_correction, always_adapt;
} cfg_t;

static mtopt_optimizer_config_t config_of(const cfg_t *t) {
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

/* Runs `steps` steps of the same model and gradients on a CUDA and a CPU
 * optimizer (lr changed between steps), comparing after every step. */
static void run_pair(const cfg_t *t, int steps, const tols_t *tol) {
  tu_rng_t r;
  tu_rng_init(&r, tu_seed() ^ name_hash(t->name));
  model_t m;
  model_make(&m, &r, t->ntensors, t->chunk, t->max_numel);
  const mtopt_optimizer_config_t c = config_of(t);
  side_t gpu, cpu;
  side_open(&gpu, &m, 1, &c, 0);
  side_open(&cpu, &m, 0, &c, 0);
  float *grads = xmalloc((size_t)(m.packed > 0 ? m.packed : 1) * sizeof(float));
  const float gmul = t->loss_scale; /* gradients as a scaled loss makes them */
  for (int s = 0; s < steps; s++) {
    tu_fill(&r, grads, m.packed, -gmul, gmul);
    side_set_grads(&gpu, grads);
    side_set_grads(&cpu, grads);
    if (s > 0) {
      const float lr = t->lr * (float)(1.0 + 0.25 * s);
      TU_OK(mtopt_optimizer_set_lr(gpu.opt, lr));
      TU_OK(mtopt_optimizer_set_lr(cpu.opt, lr));
    }
    TU_OK(mtopt_optimizer_step(gpu.opt));
    TU_OK(mtopt_optimizer_step(cpu.opt));
    compare_sides(&gpu, &cpu, &c, tol, s);
    expect_same_info(&gpu, &cpu, 0);
  }
  mtopt_step_info_t info = MTOPT_STEP_INFO_INIT;
  TU_OK(mtopt_optimizer_get_step_info(gpu.opt, &info));
  ck_assert_int_eq(info.step, steps);
  ck_assert_int_eq(info.skipped_steps, 0);
  expect_all_updated(&gpu);
  free(grads);
  side_close(&gpu);
  side_close(&cpu);
  model_free(&m);
}

/* Without clipping: bit for bit. */
static const cfg_t exact_cfgs[] = {
    /* name        kind chunk ntens maxn lr wd mom damp nest clip ls dyn skip bc adapt */
    {"adamw", MTOPT_OPTIMIZER_ADAMW, 1024, 40, 3000, 1e-2f, 0.1f, 0, 0, 0, 0, 1, 0, 0, 1, 0},
    {"adamw_64k", MTOPT_OPTIMIZER_ADAMW, 65536, 16, 150000, 1e-3f, 0.01f, 0, 0, 0, 0, 1, 0, 0, 1, 0},
    {"adam_l2", MTOPT_OPTIMIZER_ADAM, 1024, 40, 3000, 1e-2f, 0.05f, 0, 0, 0, 0, 1, 0, 0, 1, 0},
    {"sgd_momentum_damp_wd", MTOPT_OPTIMIZER_SGD, 1028, 40, 3000, 1e-2f, 1e-3f, 0.9f, 0.1f, 0, 0, 1, 0, 0, 1, 0},
    {"sgd_nesterov_wd", MTOPT_OPTIMIZER_SGD, 4096, 30, 9000, 1e-2f, 1e-2f, 0.9f, 0.0f, 1, 0, 1, 0, 0, 1, 0},
    {"sgd_plain_wd", MTOPT_OPTIMIZER_SGD, 1024, 40, 3000, 5e-2f, 1e-2f, 0, 0, 0, 0, 1, 0, 0, 1, 0},
    {"adamw_tiny_chunk", MTOPT_OPTIMIZER_ADAMW, 4, 30, 40, 1e-2f, 0.1f, 0, 0, 0, 0, 1, 0, 0, 1, 0},
    {"sgd_momentum_tiny_chunk", MTOPT_OPTIMIZER_SGD, 4, 30, 40, 1e-2f, 1e-2f, 0.8f, 0.0f, 0, 0, 1, 0, 0, 1, 0},
    /* a statistics pass without clipping: still exact */
    {"adamw_skip_nonfinite", MTOPT_OPTIMIZER_ADAMW, 1024, 40, 3000, 1e-2f, 0.1f, 0, 0, 0, 0, 1, 0, 1, 1, 0},
    {"adamw_static_loss_scale", MTOPT_OPTIMIZER_ADAMW, 2048, 40, 5000, 1e-2f, 0.1f, 0, 0, 0, 0, 1024.0f, 0, 0, 1, 0},
    {"sgd_dynamic_loss_scale", MTOPT_OPTIMIZER_SGD, 1024, 40, 3000, 1e-2f, 1e-2f, 0.9f, 0.0f, 0, 0, 65536.0f, 1, 0, 1, 0},
};
#define N_EXACT ((int)(sizeof exact_cfgs / sizeof *exact_cfgs))

START_TEST(test_exact_vs_cpu) {
  const tols_t exact = {-1, -1, -1};
  run_pair(&exact_cfgs[_i], 6, &exact);
}
END_TEST

/* With clipping or LAMB: within the tolerances argued at the top. */
typedef struct {
  cfg_t c;
  tols_t tol;
} tol_case_t;

static const tol_case_t tol_cfgs[] = {
    {{"adamw_clip", MTOPT_OPTIMIZER_ADAMW, 1024, 40, 3000, 1e-2f, 0.1f, 0, 0, 0, 1.0f, 1, 0, 0, 1, 0},
     {1e-5, 1e-4, 1e-4}},
    {{"adamw_clip_dyn_scale", MTOPT_OPTIMIZER_ADAMW, 1024, 40, 3000, 1e-2f, 0.1f, 0, 0, 0, 1.0f, 1024.0f, 1, 0, 1, 0},
     {1e-5, 1e-4, 1e-4}},
    {{"sgd_momentum_clip", MTOPT_OPTIMIZER_SGD, 1024, 40, 3000, 1e-2f, 1e-2f, 0.9f, 0.1f, 0, 0.5f, 1, 0, 0, 1, 0},
     {1e-5, 1e-4, 1e-4}},
    /* no norm reaches m and v: exact */
    {{"lamb", MTOPT_OPTIMIZER_LAMB, 1024, 40, 3000, 1e-2f, 0.01f, 0, 0, 0, 0, 1, 0, 0, 1, 0},
     {1e-5, -1, -1}},
    {{"lamb_nobc_adapt_nowd", MTOPT_OPTIMIZER_LAMB, 1024, 40, 3000, 1e-2f, 0.0f, 0, 0, 0, 0, 1, 0, 0, 0, 1},
     {1e-5, -1, -1}},
    {{"lamb_clip_dyn_scale", MTOPT_OPTIMIZER_LAMB, 1024, 40, 3000, 1e-2f, 0.01f, 0, 0, 0, 2.0f, 4096.0f, 1, 0, 1, 0},
     {1e-5, 1e-4, 1e-4}},
};
#define N_TOL ((int)(sizeof tol_cfgs / sizeof *tol_cfgs))

START_TEST(test_tolerance_vs_cpu) { run_pair(&tol_cfgs[_i].c, 6, &tol_cfgs[_i].tol); }
END_TEST

/* A step with an inf or NaN in one gradient is skipped on both backends
 * (checked against the CPU each step), leaves the GPU's weights and state bit
 * for bit unchanged, and backs the loss scale off. */
START_TEST(test_skip_nonfinite) {
  static const cfg_t cases[] = {
      {"adamw_dyn", MTOPT_OPTIMIZER_ADAMW, 1024, 30, 3000, 1e-2f, 0.1f, 0, 0, 0, 0, 65536.0f, 1, 0, 1, 0},
      {"lamb_dyn", MTOPT_OPTIMIZER_LAMB, 1024, 30, 3000, 1e-2f, 0.01f, 0, 0, 0, 0, 65536.0f, 1, 0, 1, 0},
      {"sgd_skip", MTOPT_OPTIMIZER_SGD, 1024, 30, 3000, 1e-2f, 0.01f, 0.9f, 0, 0, 0, 1, 0, 1, 1, 0},
  };
  const cfg_t *t = &cases[_i];
  tu_rng_t r;
  tu_rng_init(&r, tu_seed() ^ name_hash(t->name));
  model_t m;
  model_make(&m, &r, t->ntensors, t->chunk, t->max_numel);
  const mtopt_optimizer_config_t c = config_of(t);
  side_t gpu, cpu;
  side_open(&gpu, &m, 1, &c, 0);
  side_open(&cpu, &m, 0, &c, 0);
  const tols_t tol = {t->kind == MTOPT_OPTIMIZER_LAMB ? 1e-5 : -1, -1, -1};
  float *grads = xmalloc((size_t)m.packed * sizeof(float));
  float *w_before = xmalloc((size_t)m.w_total * sizeof(float));
  float *w_after = xmalloc((size_t)m.w_total * sizeof(float));
  float *s_before[2], *s_after = xmalloc((size_t)m.packed * sizeof(float));
  s_before[0] = xmalloc((size_t)m.packed * sizeof(float));
  s_before[1] = xmalloc((size_t)m.packed * sizeof(float));
  for (int s = 0; s < 5; s++) {
    const int bad = s == 2 || s == 3; /* two skipped steps in a row: inf, then NaN */
    tu_fill(&r, grads, m.packed, -t->loss_scale, t->loss_scale);
    if (bad) grads[tu_int(&r, 0, m.packed - 1)] = s == 2 ? INFINITY : NAN;
    side_set_grads(&gpu, grads);
    side_set_grads(&cpu, grads);
    mtopt_step_info_t before = MTOPT_STEP_INFO_INIT, after = MTOPT_STEP_INFO_INIT;
    TU_OK(mtopt_optimizer_get_step_info(gpu.opt, &before));
    side_read_w(&gpu, w_before);
    for (int k = 0; k < n_state(&c); k++) side_read_state(&gpu, state_id(&c, k), s_before[k]);
    TU_OK(mtopt_optimizer_step(gpu.opt));
    TU_OK(mtopt_optimizer_step(cpu.opt));
    TU_OK(mtopt_optimizer_get_step_info(gpu.opt, &after));
    side_read_w(&gpu, w_after);
    ck_assert_int_eq(after.last_skipped, bad);
    ck_assert_int_eq(after.step, before.step + !bad);
    ck_assert_int_eq(after.skipped_steps, before.skipped_steps + bad);
    if (bad) {
      const int64_t i = tu_first_bit_diff(w_after, w_before, m.w_total);
      ck_assert_msg(i < 0, "step %d was skipped but weight %lld changed", s, (long long)i);
      for (int k = 0; k < n_state(&c); k++) {
        side_read_state(&gpu, state_id(&c, k), s_after);
        const int64_t j = tu_first_bit_diff(s_after, s_before[k], m.packed);
        ck_assert_msg(j < 0, "step %d was skipped but %s[%lld] changed", s,
                      state_name(state_id(&c, k)), (long long)j);
      }
      if (t->dynamic)
        ck_assert_msg(after.loss_scale == before.loss_scale * 0.5f, "loss scale %g -> %g",
                      (double)before.loss_scale, (double)after.loss_scale);
    } else {
      ck_assert_int_ge(tu_first_bit_diff(w_after, w_before, m.w_total), 0);
    }
    compare_sides(&gpu, &cpu, &c, &tol, s);
    expect_same_info(&gpu, &cpu, 0);
  }
  free(grads);
  free(w_before);
  free(w_after);
  free(s_before[0]);
  free(s_before[1]);
  free(s_after);
  side_close(&gpu);
  side_close(&cpu);
  model_free(&m);
}
END_TEST

/* 100,000 tensors in one step: every one updated, bit for bit equal to the
 * CPU. */
START_TEST(test_many_tensors) {
  const cfg_t t = {"adamw_100k", MTOPT_OPTIMIZER_ADAMW, 65536, 100000, 40, 1e-2f, 0.1f, 0, 0, 0, 0, 1, 0, 0, 1, 0};
  const tols_t exact = {-1, -1, -1};
  run_pair(&t, 2, &exact);
}
END_TEST

/* ------------------------------------------------------- graph capture -- */

/* A step captured once on a user stream and replayed N times, with the lr and
 * the gradients changed between replays, equals N plain steps (both on the
 * GPU: bit for bit, norms included). */
static void graph_case(const cfg_t *t, int inf_at) {
  tu_rng_t r;
  tu_rng_init(&r, tu_seed() ^ name_hash(t->name));
  model_t m;
  model_make(&m, &r, t->ntensors, t->chunk, t->max_numel);
  const mtopt_optimizer_config_t c = config_of(t);
  cudaStream_t stream;
  CU(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  side_t plain, graphed;
  side_open(&plain, &m, 1, &c, 0);
  side_open(&graphed, &m, 1, &c, stream);
  cudaStream_t got = 0;
  TU_OK(mtopt_cuda_context_get_stream(graphed.ctx, &got));
  ck_assert(got == stream);

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  CU(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
  TU_OK(mtopt_optimizer_step(graphed.opt));
  CU(cudaStreamEndCapture(stream, &graph));
  CU(cudaGraphInstantiate(&exec, graph, 0));
  mtopt_step_info_t info = MTOPT_STEP_INFO_INIT;
  TU_OK(mtopt_optimizer_get_step_info(graphed.opt, &info));
  ck_assert_int_eq(info.step, 0); /* capturing ran nothing */

  float *grads = xmalloc((size_t)m.packed * sizeof(float));
  const int N = 8;
  for (int s = 0; s < N; s++) {
    tu_fill(&r, grads, m.packed, -t->loss_scale, t->loss_scale);
    if (s == inf_at) grads[tu_int(&r, 0, m.packed - 1)] = INFINITY;
    side_set_grads(&plain, grads);
    side_set_grads(&graphed, grads); /* ordered on the user stream */
    const float lr = t->lr * (float)(1.0 + 0.3 * s);
    TU_OK(mtopt_optimizer_set_lr(plain.opt, lr));
    TU_OK(mtopt_optimizer_set_lr(graphed.opt, lr)); /* between replays */
    TU_OK(mtopt_optimizer_step(plain.opt));
    CU(cudaGraphLaunch(exec, stream));
  }
  TU_OK(mtopt_context_synchronize(graphed.ctx));
  const tols_t exact = {-1, -1, -1};
  compare_sides(&graphed, &plain, &c, &exact, N);
  expect_same_info(&graphed, &plain, 1);
  TU_OK(mtopt_optimizer_get_step_info(graphed.opt, &info));
  ck_assert_int_eq(info.step, N - (inf_at >= 0));
  ck_assert_int_eq(info.skipped_steps, inf_at >= 0);
  expect_all_updated(&graphed);

  /* The device-side results, read in stream order without a host sync. */
  const float *d_norm = NULL, *d_scale = NULL;
  const int32_t *d_skipped = NULL;
  TU_OK(mtopt_cuda_optimizer_get_device_results(graphed.opt, &d_norm, &d_skipped, &d_scale));
  float norm = NAN, scale = NAN;
  int32_t skipped = -1;
  CU(cudaMemcpyAsync(&norm, d_norm, sizeof norm, cudaMemcpyDeviceToHost, stream));
  CU(cudaMemcpyAsync(&scale, d_scale, sizeof scale, cudaMemcpyDeviceToHost, stream));
  CU(cudaMemcpyAsync(&skipped, d_skipped, sizeof skipped, cudaMemcpyDeviceToHost, stream));
  CU(cudaStreamSynchronize(stream));
  ck_assert(memcmp(&norm, &info.last_grad_norm, sizeof norm) == 0);
  ck_assert(memcmp(&scale, &info.loss_scale, sizeof scale) == 0);
  ck_assert_int_eq(skipped, info.last_skipped);

  free(grads);
  CU(cudaGraphExecDestroy(exec));
  CU(cudaGraphDestroy(graph));
  side_close(&plain);
  side_close(&graphed); /* before the stream it uses */
  CU(cudaStreamDestroy(stream));
  model_free(&m);
}

START_TEST(test_graph_step) {
  const cfg_t t = {"adamw_graph", MTOPT_OPTIMIZER_ADAMW, 1024, 40, 3000, 1e-2f, 0.1f, 0, 0, 0, 0, 1, 0, 0, 1, 0};
  graph_case(&t, -1);
}
END_TEST

START_TEST(test_graph_clip_loss_scale_step) {
  /* growth_interval 2 (config_of): the scale grows during the replays, and an
   * inf at replay 5 backs it off inside the graph. */
  const cfg_t t = {"adamw_graph_clip", MTOPT_OPTIMIZER_ADAMW, 1024, 40, 3000, 1e-2f, 0.1f, 0, 0, 0, 1.0f, 1024.0f, 1, 0, 1, 0};
  graph_case(&t, 5);
}
END_TEST

START_TEST(test_graph_lamb_step) {
  const cfg_t t = {"lamb_graph_clip", MTOPT_OPTIMIZER_LAMB, 2048, 30, 5000, 1e-2f, 0.01f, 0, 0, 0, 1.0f, 256.0f, 1, 0, 1, 0};
  graph_case(&t, 3);
}
END_TEST

/* --------------------------------------------------------- determinism -- */

/* Two GPU runs of the same inputs: identical bits, norms included. */
START_TEST(test_determinism) {
  static const cfg_t cases[] = {
      {"lamb_clip_scale", MTOPT_OPTIMIZER_LAMB, 1024, 40, 5000, 1e-2f, 0.01f, 0, 0, 0, 1.0f, 512.0f, 1, 0, 1, 0},
      {"adamw_clip_64k", MTOPT_OPTIMIZER_ADAMW, 65536, 12, 200000, 1e-3f, 0.01f, 0, 0, 0, 1.0f, 1, 0, 0, 1, 0},
  };
  const cfg_t *t = &cases[_i];
  tu_rng_t r;
  tu_rng_init(&r, tu_seed() ^ 0xD5u);
  model_t m;
  model_make(&m, &r, t->ntensors, t->chunk, t->max_numel);
  const mtopt_optimizer_config_t c = config_of(t);
  side_t a, b;
  side_open(&a, &m, 1, &c, 0);
  side_open(&b, &m, 1, &c, 0);
  float *grads = xmalloc((size_t)m.packed * sizeof(float));
  const tols_t exact = {-1, -1, -1};
  for (int s = 0; s < 4; s++) {
    tu_fill(&r, grads, m.packed, -t->loss_scale, t->loss_scale);
    side_set_grads(&a, grads);
    side_set_grads(&b, grads);
    TU_OK(mtopt_optimizer_step(a.opt));
    TU_OK(mtopt_optimizer_step(b.opt));
    compare_sides(&a, &b, &c, &exact, s);
    expect_same_info(&a, &b, 1);
  }
  mtopt_step_info_t info = MTOPT_STEP_INFO_INIT;
  TU_OK(mtopt_optimizer_get_step_info(a.opt, &info));
  ck_assert(isfinite(info.last_grad_norm) && info.last_grad_norm > 0.0f);
  free(grads);
  side_close(&a);
  side_close(&b);
  model_free(&m);
}
END_TEST

/* ------------------------------------------------------ int64 indexing -- */

/* One tensor of 2^31 + 4099 elements (SGD without momentum, with a
 * statistics pass): chunks past element 2^31 must address the right memory.
 * Weights and gradients are memset to constant patterns, so every element must
 * end up with the bits the CPU backend computes for one element. Needs
 * ~17.2 GB of device memory; skipped (with a note) where there is less. */
START_TEST(test_huge_tensor) {
  const int64_t n = (INT64_C(1) << 31) + 4099;
  const size_t bytes = (size_t)n * sizeof(float);
  size_t free_b = 0, total_b = 0;
  CU(cudaSetDevice(0));
  CU(cudaMemGetInfo(&free_b, &total_b));
  if (free_b < 2 * bytes + (size_t)(2u << 30)) {
    fprintf(stderr, "test_huge_tensor: %zu MB free, needs %zu: not run\n", free_b >> 20,
            (2 * bytes) >> 20);
    return;
  }
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  c.kind = MTOPT_OPTIMIZER_SGD;
  c.lr = 0.5f;
  c.weight_decay = 0.01f;
  c.skip_nonfinite = 1;

  /* The CPU's answer for one element. */
  float wc[8], gc[8];
  memset(wc, 0x3E, sizeof wc);
  memset(gc, 0x3F, sizeof gc);
  mtopt_context_t *cctx = tu_cpu_context();
  mtopt_tensor_list_t *cl = NULL;
  mtopt_optimizer_t *co = NULL;
  TU_OK(mtopt_tensor_list_create(cctx, &cl));
  TU_OK(mtopt_tensor_list_add_f32(cl, wc, gc, 8, 0, NULL));
  TU_OK(mtopt_optimizer_create(cctx, cl, &c, &co));
  TU_OK(mtopt_optimizer_step(co));
  const float expect = wc[0];
  ck_assert(expect != 0.0f && isfinite(expect));
  TU_OK(mtopt_optimizer_destroy(co));
  TU_OK(mtopt_tensor_list_destroy(cl));
  TU_OK(mtopt_context_destroy(cctx));

  mtopt_context_t *ctx = cuda_context();
  float *w = NULL, *g = NULL;
  CU(cudaMalloc((void **)&w, bytes));
  CU(cudaMalloc((void **)&g, bytes));
  CU(cudaMemset(w, 0x3E, bytes));
  CU(cudaMemset(g, 0x3F, bytes));
  CU(cudaDeviceSynchronize());
  mtopt_tensor_list_t *l = NULL;
  mtopt_optimizer_t *o = NULL;
  TU_OK(mtopt_tensor_list_create(ctx, &l));
  TU_OK(mtopt_tensor_list_add_f32(l, w, g, n, 0, NULL));
  TU_OK(mtopt_optimizer_create(ctx, l, &c, &o));
  mtopt_optimizer_info_t oi = MTOPT_OPTIMIZER_INFO_INIT;
  TU_OK(mtopt_optimizer_get_info(o, &oi));
  ck_assert_int_eq(oi.num_chunks, (n + c.chunk_size - 1) / c.chunk_size);
  ck_assert_int_eq(oi.launches_per_step, 2);
  TU_OK(mtopt_optimizer_step(o));
  TU_OK(mtopt_context_synchronize(ctx));
  const int64_t at[] = {0, (INT64_C(1) << 30) - 16, (INT64_C(1) << 31) - 64,
                        (INT64_C(1) << 31) - 16, (INT64_C(1) << 31), n - 4100, n - 64};
  for (size_t k = 0; k < sizeof at / sizeof *at; k++) {
    float win[64];
    tu_poison(win, 64);
    CU(cudaMemcpy(win, w + at[k], sizeof win, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 64; i++)
      ck_assert_msg(memcmp(&win[i], &expect, sizeof expect) == 0,
                    "element %lld: %.9g, expected %.9g", (long long)(at[k] + i),
                    (double)win[i], (double)expect);
  }
  /* The statistics pass saw every element once. */
  mtopt_step_info_t info = MTOPT_STEP_INFO_INIT;
  TU_OK(mtopt_optimizer_get_step_info(o, &info));
  float g1;
  memset(&g1, 0x3F, sizeof g1);
  const double want = sqrt((double)n) * g1;
  ck_assert_msg(fabs(info.last_grad_norm - want) <= 1e-4 * want, "norm %.9g, expected %.9g",
                (double)info.last_grad_norm, want);
  ck_assert_int_eq(info.step, 1);
  TU_OK(mtopt_optimizer_destroy(o));
  TU_OK(mtopt_tensor_list_destroy(l));
  TU_OK(mtopt_context_destroy(ctx));
  CU(cudaFree(w));
  CU(cudaFree(g));
}
END_TEST

/* ------------------------------------------------------------ bad input -- */

static mtopt_status_t try_create(mtopt_context_t *ctx, float *w0, float *g0, float *w1,
                                 float *g1, int64_t n) {
  mtopt_tensor_list_t *l = NULL;
  mtopt_optimizer_t *o = NULL;
  TU_OK(mtopt_tensor_list_create(ctx, &l));
  TU_OK(mtopt_tensor_list_add_f32(l, w0, g0, n, 0, NULL));
  TU_OK(mtopt_tensor_list_add_f32(l, w1, g1, n, 0, NULL));
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  const mtopt_status_t st = mtopt_optimizer_create(ctx, l, &c, &o);
  if (st == MTOPT_STATUS_SUCCESS) {
    TU_OK(mtopt_optimizer_step(o));
    TU_OK(mtopt_context_synchronize(ctx));
    TU_OK(mtopt_optimizer_destroy(o));
  }
  TU_OK(mtopt_tensor_list_destroy(l));
  return st;
}

START_TEST(test_bad_pointers) {
  const int64_t n = 1000;
  mtopt_context_t *ctx = cuda_context();
  float *d = NULL, *host = xmalloc(4 * (size_t)n * sizeof(float)), *pinned = NULL, *managed = NULL;
  CU(cudaMalloc((void **)&d, 4 * (size_t)n * sizeof(float)));
  CU(cudaMallocHost((void **)&pinned, (size_t)n * sizeof(float)));
  CU(cudaMallocManaged((void **)&managed, 2 * (size_t)n * sizeof(float), cudaMemAttachGlobal));
  tu_fill(&(tu_rng_t){tu_seed()}, host, 4 * n, -1.0f, 1.0f);
  CU(cudaMemcpy(d, host, 4 * (size_t)n * sizeof(float), cudaMemcpyHostToDevice));
  memcpy(managed, host, 2 * (size_t)n * sizeof(float));

  /* Host parameter. */
  TU_FAILS(try_create(ctx, host, d, d + n, d + 2 * n, n), MTOPT_STATUS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(mtopt_last_error(), "tensor 0") && strstr(mtopt_last_error(), "param"),
                "%s", mtopt_last_error());
  /* Host gradient of tensor 1. */
  TU_FAILS(try_create(ctx, d, d + n, d + 2 * n, host, n), MTOPT_STATUS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(mtopt_last_error(), "tensor 1") && strstr(mtopt_last_error(), "grad"),
                "%s", mtopt_last_error());
  /* Pinned host memory is not device memory either. */
  TU_FAILS(try_create(ctx, d, d + n, pinned, d + 2 * n, n), MTOPT_STATUS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(mtopt_last_error(), "tensor 1"), "%s", mtopt_last_error());
  /* Managed memory is accepted (and stepped). */
  TU_OK(try_create(ctx, d, d + n, managed, managed + n, n));
  /* The context is still usable after the refusals. */
  TU_OK(try_create(ctx, d, d + n, d + 2 * n, d + 3 * n, n));

  TU_OK(mtopt_context_destroy(ctx));
  CU(cudaFree(d));
  CU(cudaFreeHost(pinned));
  CU(cudaFree(managed));
  free(host);
}
END_TEST

/* --------------------------------------------------------- small calls -- */

START_TEST(test_stream_calls) {
  mtopt_context_t *cpu = tu_cpu_context();
  cudaStream_t s = (cudaStream_t)0;
  TU_FAILS(mtopt_cuda_context_set_stream(cpu, s), MTOPT_STATUS_INVALID_ARGUMENT);
  TU_FAILS(mtopt_cuda_context_get_stream(cpu, &s), MTOPT_STATUS_INVALID_ARGUMENT);
  TU_FAILS(mtopt_cuda_context_set_stream(NULL, s), MTOPT_STATUS_INVALID_ARGUMENT);

  mtopt_context_t *ctx = cuda_context();
  cudaStream_t got = (cudaStream_t)1;
  TU_OK(mtopt_cuda_context_get_stream(ctx, &got));
  ck_assert(got == (cudaStream_t)0); /* the legacy default stream */
  TU_FAILS(mtopt_cuda_context_get_stream(ctx, NULL), MTOPT_STATUS_INVALID_ARGUMENT);
  CU(cudaStreamCreate(&s));
  TU_OK(mtopt_cuda_context_set_stream(ctx, s));
  TU_OK(mtopt_cuda_context_get_stream(ctx, &got));
  ck_assert(got == s);

  /* launches_per_step and the device results of CPU/CUDA optimizers. */
  float *d = NULL, w[4] = {1, 2, 3, 4}, gh[4] = {1, 1, 1, 1};
  CU(cudaMalloc((void **)&d, 8 * sizeof(float)));
  static const struct {
    mtopt_optimizer_kind_t kind;
    float clip;
    int launches;
  } lp[] = {{MTOPT_OPTIMIZER_ADAMW, 0, 1}, {MTOPT_OPTIMIZER_ADAMW, 1, 2},
            {MTOPT_OPTIMIZER_LAMB, 0, 2},  {MTOPT_OPTIMIZER_LAMB, 1, 3}};
  for (size_t k = 0; k < sizeof lp / sizeof *lp; k++) {
    mtopt_tensor_list_t *l = NULL;
    mtopt_optimizer_t *o = NULL;
    TU_OK(mtopt_tensor_list_create(ctx, &l));
    TU_OK(mtopt_tensor_list_add_f32(l, d, d + 4, 4, 0, NULL));
    mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
    c.kind = lp[k].kind;
    c.max_grad_norm = lp[k].clip;
    TU_OK(mtopt_optimizer_create(ctx, l, &c, &o));
    mtopt_optimizer_info_t oi = MTOPT_OPTIMIZER_INFO_INIT;
    TU_OK(mtopt_optimizer_get_info(o, &oi));
    ck_assert_int_eq(oi.launches_per_step, lp[k].launches);
    const float *dn = NULL;
    TU_OK(mtopt_cuda_optimizer_get_device_results(o, &dn, NULL, NULL));
    ck_assert(dn != NULL);
    TU_OK(mtopt_optimizer_destroy(o));
    TU_OK(mtopt_tensor_list_destroy(l));
  }
  {
    mtopt_tensor_list_t *l = NULL;
    mtopt_optimizer_t *o = NULL;
    TU_OK(mtopt_tensor_list_create(cpu, &l));
    TU_OK(mtopt_tensor_list_add_f32(l, w, gh, 4, 0, NULL));
    mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
    TU_OK(mtopt_optimizer_create(cpu, l, &c, &o));
    const float *dn = NULL;
    TU_FAILS(mtopt_cuda_optimizer_get_device_results(o, &dn, NULL, NULL),
             MTOPT_STATUS_INVALID_ARGUMENT);
    TU_FAILS(mtopt_cuda_optimizer_get_device_results(NULL, &dn, NULL, NULL),
             MTOPT_STATUS_INVALID_ARGUMENT);
    TU_OK(mtopt_optimizer_destroy(o));
    TU_OK(mtopt_tensor_list_destroy(l));
  }
  /* A context with a device that does not exist. */
  int count = 0;
  CU(cudaGetDeviceCount(&count));
  mtopt_context_config_t cc = MTOPT_CONTEXT_CONFIG_INIT;
  cc.backend = MTOPT_BACKEND_CUDA;
  cc.device = count;
  mtopt_context_t *none = NULL;
  TU_FAILS(mtopt_context_create(&cc, &none), MTOPT_STATUS_CUDA_ERROR);

  TU_OK(mtopt_context_destroy(ctx));
  TU_OK(mtopt_context_destroy(cpu));
  CU(cudaStreamDestroy(s));
  CU(cudaFree(d));
}
END_TEST

Suite *cuda_backend_suite(void) {
  Suite *s = suite_create("cuda_backend");
  TCase *tc = tcase_create("vs_cpu");
  tcase_set_timeout(tc, 300);
  tcase_add_loop_test(tc, test_exact_vs_cpu, 0, N_EXACT);
  tcase_add_loop_test(tc, test_tolerance_vs_cpu, 0, N_TOL);
  tcase_add_loop_test(tc, test_skip_nonfinite, 0, 3);
  tcase_add_test(tc, test_many_tensors);
  suite_add_tcase(s, tc);

  tc = tcase_create("graphs");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_graph_step);
  tcase_add_test(tc, test_graph_clip_loss_scale_step);
  tcase_add_test(tc, test_graph_lamb_step);
  tcase_add_loop_test(tc, test_determinism, 0, 2);
  suite_add_tcase(s, tc);

  tc = tcase_create("edges");
  tcase_set_timeout(tc, 300);
  tcase_add_test(tc, test_huge_tensor);
  tcase_add_test(tc, test_bad_pointers);
  tcase_add_test(tc, test_stream_calls);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) {
  if (!mtopt_backend_available(MTOPT_BACKEND_CUDA)) {
    fprintf(stderr, "cuda_backend: no usable CUDA device (%s): skipped\n", mtopt_last_error());
    return 77;
  }
  return tu_run(cuda_backend_suite(), 1);
}

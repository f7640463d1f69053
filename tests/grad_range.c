/* Sums of squares over the whole float range (issue 12 item 9), on the CPU
 * backend (MTOPT_TEST_BACKEND=cuda runs it on CUDA): a gradient with one
 * finite element of 1e20 or 3e38 overflowed the float sum of squares, so
 * skip_nonfinite skipped a step of finite gradients and the norm read inf;
 * LAMB's sums of w^2 and u^2 overflowed the same way for weights beyond
 * 1.8e19. The sums are doubles now (plan.h, mtopt__sum_t). Checked against
 * the double reference (reference.c): the step is applied, the norm is finite
 * and right, clipping applies; F32 gradients (the fp32 paths) and BF16 ones
 * (the mixed-precision paths). On the CPU also: the same bits at 1 and 3
 * threads. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "reference.h"
#include "test_util.h"

enum { NT = 3, CHUNK = 256 };
static const int64_t kNumel[NT] = {1000, 77, 5000};
/* The large element: tensor 2 (several chunks), in its fourth chunk. */
enum { BIG_T = 2, BIG_I = 1234 };

typedef struct {
  mtopt_backend_t be;
  mtopt_context_t *ctx;
  mtopt_tensor_list_t *list;
  mtopt_optimizer_t *opt;
  int gdt;                         /* MTOPT_DTYPE_F32 or _BF16 */
  void *w[NT], *g[NT];             /* backend memory */
  float *w0[NT], *gv[NT];          /* host: initial weights, the gradient as held */
  ref_opt_t ref;
} fix_t;

/* Random weights in [-1, 1) and gradients in [-1, 1), big values placed at
 * (BIG_T, BIG_I): wbig in the weights (0: none), gbig in the gradient. The
 * gradient held is read back, so the reference steps the bf16-rounded values. */
static void fix_build(fix_t *f, int threads, int gdt, const mtopt_optimizer_config_t *cfg,
                      float wbig, float gbig, uint64_t seed) {
  memset(f, 0, sizeof *f);
  f->be = tu_backend();
  f->gdt = gdt;
  if (f->be == MTOPT_BACKEND_CPU) {
    mtopt_context_config_t cc = MTOPT_CONTEXT_CONFIG_INIT;
    cc.num_threads = threads;
    TU_OK(mtopt_context_create(&cc, &f->ctx));
  } else {
    f->ctx = tu_context(f->be);
  }
  TU_OK(mtopt_tensor_list_create(f->ctx, &f->list));
  tu_rng_t rng;
  tu_rng_init(&rng, seed);
  const size_t gsz = gdt == MTOPT_DTYPE_BF16 ? 2 : 4;
  for (int i = 0; i < NT; i++) {
    const int64_t n = kNumel[i];
    f->w0[i] = malloc((size_t)n * 4);
    f->gv[i] = malloc((size_t)n * 4);
    tu_fill(&rng, f->w0[i], n, -1.0f, 1.0f);
    tu_fill(&rng, f->gv[i], n, -1.0f, 1.0f);
    if (i == BIG_T) {
      if (wbig != 0.0f) f->w0[i][BIG_I] = wbig;
      f->gv[i][BIG_I] = gbig;
    }
    f->w[i] = tu_alloc(f->be, (size_t)n * 4);
    f->g[i] = tu_alloc(f->be, (size_t)n * gsz);
    tu_to_backend(f->be, f->w[i], f->w0[i], (size_t)n * 4);
    if (gdt == MTOPT_DTYPE_BF16) {
      uint16_t *h = malloc((size_t)n * 2);
      for (int64_t j = 0; j < n; j++) {
        h[j] = mtopt__f32_to_bf16(f->gv[i][j]);
        f->gv[i][j] = mtopt__ld(h, MTOPT__DT_BF16, j);
        ck_assert(isfinite(f->gv[i][j]));
      }
      tu_to_backend(f->be, f->g[i], h, (size_t)n * 2);
      free(h);
    } else {
      tu_to_backend(f->be, f->g[i], f->gv[i], (size_t)n * 4);
    }
    mtopt_tensor_desc_t d = MTOPT_TENSOR_DESC_INIT;
    d.param = f->w[i];
    d.grad = f->g[i];
    d.numel = n;
    d.grad_dtype = (mtopt_dtype_t)gdt;
    TU_OK(mtopt_tensor_list_add(f->list, &d, NULL));
  }
  mtopt_optimizer_config_t c = *cfg;
  c.chunk_size = CHUNK;
  TU_OK(mtopt_optimizer_create(f->ctx, f->list, &c, &f->opt));
  int64_t numel[NT];
  const float *w0[NT];
  for (int i = 0; i < NT; i++) numel[i] = kNumel[i], w0[i] = f->w0[i];
  ref_init(&f->ref, &c, NT, numel, NULL, NULL, w0);
}

static void fix_destroy(fix_t *f) {
  TU_OK(mtopt_optimizer_destroy(f->opt));
  TU_OK(mtopt_tensor_list_destroy(f->list));
  TU_OK(mtopt_context_destroy(f->ctx));
  for (int i = 0; i < NT; i++) {
    tu_free(f->be, f->w[i]);
    tu_free(f->be, f->g[i]);
    free(f->w0[i]);
    free(f->gv[i]);
  }
  ref_free(&f->ref);
}

/* One step of both; the step must be applied with a finite norm equal to the
 * reference's. Returns the norm. */
static float fix_step(fix_t *f) {
  TU_OK(mtopt_optimizer_step(f->opt));
  const float *g[NT];
  for (int i = 0; i < NT; i++) g[i] = f->gv[i];
  ref_step(&f->ref, g);
  mtopt_step_info_t info = MTOPT_STEP_INFO_INIT;
  TU_OK(mtopt_optimizer_get_step_info(f->opt, &info));
  ck_assert_msg(info.last_skipped == 0 && info.skipped_steps == 0 && info.step == 1,
                "a step of finite gradients was skipped (norm %g)", (double)info.last_grad_norm);
  if (f->ref.take_stats) {
    const double want = f->ref.last_grad_norm;
    ck_assert_msg(isfinite(info.last_grad_norm), "norm %g, want %g",
                  (double)info.last_grad_norm, want);
    ck_assert_msg(fabs(info.last_grad_norm - want) <= 1e-6 * want, "norm %.9g, want %.9g",
                  (double)info.last_grad_norm, want);
  }
  return info.last_grad_norm;
}

/* Weights against the reference (every one finite). */
static void fix_check_w(fix_t *f, double atol, double rtol) {
  for (int i = 0; i < NT; i++) {
    const int64_t n = kNumel[i];
    float *w = malloc((size_t)n * 4);
    tu_to_host(f->be, w, f->w[i], (size_t)n * 4);
    for (int64_t j = 0; j < n; j++)
      ck_assert_msg(isfinite(w[j]), "tensor %d element %lld: %g", i, (long long)j, (double)w[j]);
    char what[64];
    snprintf(what, sizeof what, "weights of tensor %d", i);
    const tu_err_t e = tu_compare(w, f->ref.t[i].w, n, atol, rtol);
    TU_ASSERT_CLOSE(e, what);
    free(w);
  }
}

static const float kBig[] = {1e20f, 3e38f, -3e38f};
static const int kGdt[] = {MTOPT_DTYPE_F32, MTOPT_DTYPE_BF16};

/* _i: the big value and the gradient dtype. */
#define LOOP_CASE(i, big, gdt)                                                 \
  const float big = kBig[(i) % 3];                                             \
  const int gdt = kGdt[(i) / 3]

/* SGD with clipping: the update is lr * g * max_norm / (norm + 1e-6). */
START_TEST(test_clip_large_gradient) {
  LOOP_CASE(_i, big, gdt);
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  c.kind = MTOPT_OPTIMIZER_SGD;
  c.lr = 0.1f;
  c.weight_decay = 0.0f;
  c.max_grad_norm = 1.0f;
  c.skip_nonfinite = 1;
  fix_t f;
  fix_build(&f, 0, gdt, &c, 0.0f, big, 11u + (uint64_t)_i);
  fix_step(&f);
  fix_check_w(&f, 1e-6, 1e-5);
  /* The large element moved by lr * max_norm (nearly all of the norm). */
  float w;
  tu_to_host(f.be, &w, (float *)f.w[BIG_T] + BIG_I, 4);
  const double moved = (double)f.w0[BIG_T][BIG_I] - w;
  ck_assert_msg(fabs(fabs(moved) - 0.1) < 1e-5, "the large element moved by %g", moved);
  fix_destroy(&f);
}
END_TEST

/* skip_nonfinite alone (no clipping): AdamW's step is taken. */
START_TEST(test_skip_only_large_gradient) {
  LOOP_CASE(_i, big, gdt);
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  c.skip_nonfinite = 1;
  fix_t f;
  fix_build(&f, 0, gdt, &c, 0.0f, big, 21u + (uint64_t)_i);
  fix_step(&f);
  fix_destroy(&f);
}
END_TEST

/* LAMB with one large weight (gradients in [-1, 1), no statistics pass): w^2
 * and u = ... + wd*w squared overflowed float sums, the trust ratio became
 * inf or NaN and so did the tensor. Now every weight stays finite and follows
 * the reference. */
START_TEST(test_lamb_large_weight) {
  LOOP_CASE(_i, big, gdt);
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  c.kind = MTOPT_OPTIMIZER_LAMB;
  c.lr = 1e-3f;
  c.weight_decay = 0.01f;
  fix_t f;
  fix_build(&f, 0, gdt, &c, big, 0.5f, 31u + (uint64_t)_i);
  fix_step(&f);
  fix_check_w(&f, 1e-5, 1e-4);
  fix_destroy(&f);
}
END_TEST

/* CPU: the same norm and weights, bit for bit, at 1 and 3 threads (LAMB with
 * clipping: both kinds of sums). */
START_TEST(test_threads_same_bits) {
  if (tu_backend() != MTOPT_BACKEND_CPU) return;
  LOOP_CASE(_i, big, gdt);
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  c.kind = MTOPT_OPTIMIZER_LAMB;
  c.max_grad_norm = 1.0f;
  fix_t a, b;
  fix_build(&a, 1, gdt, &c, big, big, 41u);
  fix_build(&b, 3, gdt, &c, big, big, 41u);
  const float na = fix_step(&a), nb = fix_step(&b);
  ck_assert(memcmp(&na, &nb, sizeof na) == 0);
  for (int i = 0; i < NT; i++)
    ck_assert_int_eq(tu_first_bit_diff(a.w[i], b.w[i], kNumel[i]), -1);
  fix_destroy(&a);
  fix_destroy(&b);
}
END_TEST

static Suite *grad_range_suite(void) {
  Suite *s = suite_create("grad_range");
  TCase *tc = tcase_create("large finite values");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_clip_large_gradient, 0, 6);
  tcase_add_loop_test(tc, test_skip_only_large_gradient, 0, 6);
  tcase_add_loop_test(tc, test_lamb_large_weight, 0, 6);
  tcase_add_loop_test(tc, test_threads_same_bits, 0, 6);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_main(grad_range_suite()); }

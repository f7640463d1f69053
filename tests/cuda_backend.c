/* The CUDA backend against the CPU backend (the executable specification).
 *
 * Every test builds a random model (cuda_rig.h) and gives the same model and
 * the same gradients to a CPU optimizer and a CUDA optimizer, or to two CUDA
 * optimizers. This file: the steps against the CPU (test case vs_cpu) and the
 * suite; cuda_backend_graphs.c: graph capture on a user stream and
 * determinism (graphs); cuda_backend_edges.c: int64 indexing, bad pointers and
 * the small stream and device-result calls (edges).
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

#include "cuda_rig.h"

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
  cuda_backend_add_graph_tests(tc);
  suite_add_tcase(s, tc);

  tc = tcase_create("edges");
  tcase_set_timeout(tc, 300);
  cuda_backend_add_edge_tests(tc);
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

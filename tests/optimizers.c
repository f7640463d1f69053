/* Every optimizer against the double reference (reference.h) over many steps,
 * on random tensor lists with odd sizes, several parameter groups, no-decay
 * tensors, user and library-owned gradients, and hyperparameters changed
 * mid-run; plus determinism (threads, repeated runs).
 *
 * Tolerances. mtopt computes in fp32, the reference in double. One Adam step
 * rounds a handful of times (m, v, sqrt, divide, fma): a few ulp (~2e-7
 * relative) per step on the update, which is lr-sized, plus one rounding of w
 * (6e-8 relative). Over 30 steps the errors add up to a few 1e-6 relative in
 * the worst case, so rtol 1e-5 has margin and still catches any formula slip
 * (a wrong bias correction or eps placement is off by >1e-3). Values that
 * cross zero (w, m: sums of random-sign terms) are judged with an atol:
 * 1e-6 for data of order 1 (about 16 ulp of 1). v is a sum of squares
 * (positive, no cancellation): rtol 1e-5 with a tiny atol. SGD's momentum
 * buffer grows to ~1/(1-momentum) = 10: atol 1e-5. LAMB's trust ratio comes
 * from fp32 norms summed per chunk (relative error ~1e-6 for our sizes); it
 * scales an lr-sized update, so the same tolerances apply. One case is
 * ill-conditioned in any precision: where Adam's denominator sqrt(v_hat)+eps
 * is tiny (Adam's g + wd*w cancelling on the first steps), fp32 rounding of g
 * is amplified by lr/denominator; the reference tracks that bound per element
 * (ref_tensor_t.werr) and the weight tolerance adds it. It is ~1e-9 for
 * ordinary elements, so it loosens nothing else. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "rig.h"

static const rig_tol_t tol_adam = {1e-6, 1e-5, 1e-6, 1e-5, 1e-10, 1e-5};
static const rig_tol_t tol_sgd = {1e-6, 1e-5, 1e-5, 1e-5, 0, 0};

typedef struct {
  const char *name;
  int kind;
  float lr, wd, momentum, dampening;
  int nesterov, bias_correction, always_adapt;
} variant_t;

static const variant_t variants[] = {
    {"adamw", MTOPT_OPTIMIZER_ADAMW, 1e-2f, 0.1f, 0, 0, 0, 1, 0},
    {"adamw_nowd", MTOPT_OPTIMIZER_ADAMW, 3e-3f, 0.0f, 0, 0, 0, 1, 0},
    {"adam_l2", MTOPT_OPTIMIZER_ADAM, 1e-2f, 0.05f, 0, 0, 0, 1, 0},
    {"adam", MTOPT_OPTIMIZER_ADAM, 2e-3f, 0.0f, 0, 0, 0, 1, 0},
    {"sgd_plain", MTOPT_OPTIMIZER_SGD, 5e-2f, 0.0f, 0.0f, 0.0f, 0, 1, 0},
    {"sgd_wd", MTOPT_OPTIMIZER_SGD, 5e-2f, 0.02f, 0.0f, 0.0f, 0, 1, 0},
    {"sgd_momentum", MTOPT_OPTIMIZER_SGD, 1e-2f, 0.0f, 0.9f, 0.0f, 0, 1, 0},
    {"sgd_dampening_wd", MTOPT_OPTIMIZER_SGD, 1e-2f, 0.01f, 0.9f, 0.3f, 0, 1, 0},
    {"sgd_nesterov_wd", MTOPT_OPTIMIZER_SGD, 1e-2f, 0.02f, 0.8f, 0.0f, 1, 1, 0},
    {"lamb", MTOPT_OPTIMIZER_LAMB, 1e-2f, 0.01f, 0, 0, 0, 1, 0},
    {"lamb_nobc_adapt_nowd", MTOPT_OPTIMIZER_LAMB, 1e-2f, 0.0f, 0, 0, 0, 0, 1},
    {"lamb_bc_adapt", MTOPT_OPTIMIZER_LAMB, 5e-3f, 0.05f, 0, 0, 0, 1, 1},
    {"lamb_nobc_noadapt", MTOPT_OPTIMIZER_LAMB, 1e-2f, 0.1f, 0, 0, 0, 0, 0},
    {"lamb_noadapt_nowd", MTOPT_OPTIMIZER_LAMB, 1e-2f, 0.0f, 0, 0, 0, 1, 0},
};
#define NVARIANTS ((int)(sizeof variants / sizeof *variants))

static mtopt_optimizer_config_t config_of(const variant_t *v, int64_t chunk_size) {
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  c.kind = v->kind;
  c.lr = v->lr;
  c.weight_decay = v->wd;
  c.momentum = v->momentum;
  c.dampening = v->dampening;
  c.nesterov = v->nesterov;
  c.bias_correction = v->bias_correction;
  c.lamb_always_adapt = v->always_adapt;
  c.chunk_size = chunk_size;
  return c;
}

static int64_t random_chunk(tu_rng_t *rng) {
  return tu_int(rng, 0, 3) == 0 ? 65536 : 4 * tu_int(rng, 1, 512);
}

static const rig_tol_t *tol_of(int kind) {
  return kind == MTOPT_OPTIMIZER_SGD ? &tol_sgd : &tol_adam;
}

/* 30 steps against the reference; lr changes at step 10 (set_lr), and another
 * scalar the optimizer uses at step 20 (set_hyperparam). */
START_TEST(test_against_reference) {
  const variant_t *v = &variants[_i];
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 1000u * (uint64_t)_i);
  const mtopt_optimizer_config_t c = config_of(v, random_chunk(&rng));
  rig_opts_t o = RIG_OPTS_INIT;
  o.n_tensors = tu_int(&rng, 1, 24);
  o.n_groups = (int)tu_int(&rng, 1, 4);
  rig_t r;
  rig_build(&r, &rng, &c, &o);
  for (int step = 1; step <= 30; step++) {
    if (step == 11) {
      TU_OK(mtopt_optimizer_set_lr(r.opt, v->lr * 0.37f));
      r.ref.lr = v->lr * 0.37f;
    }
    if (step == 21) {
      switch (v->kind) {
      case MTOPT_OPTIMIZER_SGD:
        if (v->momentum > 0.0f && !v->nesterov)
          rig_set(&r, MTOPT_HP_DAMPENING, 0.5);
        else if (v->momentum > 0.0f)
          rig_set(&r, MTOPT_HP_MOMENTUM, 0.6);
        else
          rig_set(&r, MTOPT_HP_WEIGHT_DECAY, 0.03);
        break;
      default:
        rig_set(&r, MTOPT_HP_BETA1, 0.8);
        rig_set(&r, MTOPT_HP_WEIGHT_DECAY, v->wd * 2.0);
        break;
      }
    }
    rig_fill_grads(&r, &rng, 1.0f);
    rig_step(&r);
    rig_check(&r, tol_of(v->kind), step);
  }
  mtopt_step_info_t info = MTOPT_STEP_INFO_INIT;
  TU_OK(mtopt_optimizer_get_step_info(r.opt, &info));
  ck_assert_int_eq(info.step, 30);
  ck_assert_int_eq(info.skipped_steps, 0);
  ck_assert(isnan(info.last_grad_norm)); /* no statistics pass */
  rig_destroy(&r);
}
END_TEST

/* A few large tensors spanning many chunks, against the reference. */
START_TEST(test_many_chunks) {
  const variant_t *v = &variants[_i];
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 7u + 1000u * (uint64_t)_i);
  const mtopt_optimizer_config_t c = config_of(v, 4 * tu_int(&rng, 1, 64));
  rig_opts_t o = RIG_OPTS_INIT;
  o.n_tensors = 5;
  o.max_numel = 20000;
  rig_t r;
  rig_build(&r, &rng, &c, &o);
  for (int step = 1; step <= 8; step++) {
    rig_fill_grads(&r, &rng, 1.0f);
    rig_step(&r);
    rig_check(&r, tol_of(v->kind), step);
  }
  rig_destroy(&r);
}
END_TEST

/* Runs a rig with a given thread count from a fixed seed and returns the
 * snapshot of all weights and state after 6 steps. Clipping is on so that the
 * statistics pass (a reduction) is part of what must agree. */
static float *run_snapshot(int kind_index, uint64_t seed, int threads, int clip,
                           int64_t *len) {
  const variant_t *v = &variants[kind_index];
  tu_rng_t rng;
  tu_rng_init(&rng, seed);
  mtopt_optimizer_config_t c = config_of(v, 4 * tu_int(&rng, 1, 200));
  if (clip) c.max_grad_norm = 1.0f;
  rig_opts_t o = RIG_OPTS_INIT;
  o.n_tensors = 20;
  o.max_numel = 6000;
  o.num_threads = threads;
  rig_t r;
  rig_build(&r, &rng, &c, &o);
  for (int step = 0; step < 6; step++) {
    rig_fill_grads(&r, &rng, 1.0f);
    TU_OK(mtopt_optimizer_step(r.opt));
  }
  *len = rig_snapshot_len(&r) + 1;
  float *snap = malloc((size_t)*len * sizeof(float));
  rig_snapshot(&r, snap);
  mtopt_step_info_t info = MTOPT_STEP_INFO_INIT;
  TU_OK(mtopt_optimizer_get_step_info(r.opt, &info));
  snap[*len - 1] = info.last_grad_norm;
  rig_destroy(&r);
  return snap;
}

static const int det_variants[] = {0, 2, 8, 9, 11};

START_TEST(test_threads_bit_identical) {
  const int vi = det_variants[_i / 2];
  const int clip = _i % 2;
  const uint64_t seed = tu_seed() + 31u * (uint64_t)_i;
  int64_t n1, n2;
  float *a = run_snapshot(vi, seed, 1, clip, &n1);
  float *b = run_snapshot(vi, seed, 2, clip, &n2);
  ck_assert_int_eq(n1, n2);
  const int64_t d = tu_first_bit_diff(a, b, n1);
  ck_assert_msg(d < 0, "%s clip=%d: 1 vs 2 threads differ at %lld (%.9g vs %.9g)",
                variants[vi].name, clip, (long long)d, d >= 0 ? a[d] : 0.0,
                d >= 0 ? b[d] : 0.0);
  free(a);
  free(b);
}
END_TEST

START_TEST(test_repeat_bit_identical) {
  const int vi = det_variants[_i / 2];
  const int clip = _i % 2;
  const uint64_t seed = tu_seed() + 77u * (uint64_t)_i;
  int64_t n1, n2;
  float *a = run_snapshot(vi, seed, 0, clip, &n1);
  /* Something in between, so the second run's buffers land elsewhere. */
  void *junk = malloc(12345);
  float *b = run_snapshot(vi, seed, 0, clip, &n2);
  free(junk);
  ck_assert_int_eq(n1, n2);
  const int64_t d = tu_first_bit_diff(a, b, n1);
  ck_assert_msg(d < 0, "%s clip=%d: two runs differ at %lld", variants[vi].name, clip,
                (long long)d);
  free(a);
  free(b);
}
END_TEST

/* The library's gradient buffer: views are disjoint, inside the buffer, share
 * the weights' residue mod 16 bytes, start zeroed, and zero_grad clears them
 * (and only them: user gradients are untouched). */
START_TEST(test_grad_buffer) {
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 5);
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  rig_opts_t o = RIG_OPTS_INIT;
  o.n_tensors = 40;
  o.max_numel = 500;
  rig_t r;
  rig_build(&r, &rng, &c, &o);
  void *buf = NULL;
  int64_t len = 0;
  TU_OK(mtopt_optimizer_get_grad_buffer(r.opt, &buf, &len));
  float *b = buf;
  int64_t used = 0, any_lib = 0;
  for (int64_t i = 0; i < r.n; i++) {
    const int lib = r.g_mem[i] == NULL;
    if (!lib || r.numel[i] == 0) continue;
    any_lib = 1;
    ck_assert(r.g[i] >= b && r.g[i] + r.numel[i] <= b + len);
    ck_assert_int_eq(((uintptr_t)r.g[i] - (uintptr_t)r.w[i]) % 16, 0);
    used += r.numel[i];
    for (int64_t j = i + 1; j < r.n; j++)
      if (r.g_mem[j] == NULL && r.numel[j] > 0)
        ck_assert(r.g[i] + r.numel[i] <= r.g[j] || r.g[j] + r.numel[j] <= r.g[i]);
  }
  if (any_lib) {
    ck_assert_ptr_nonnull(buf);
    ck_assert_int_ge(len, used);
    ck_assert_int_le(len, used + 3 * r.n);
  }
  rig_fill_grads(&r, &rng, 1.0f);
  /* zero_grad zeroes every gradient the step reads: the library's views and
   * the user's own buffers alike (as torch's zero_grad). */
  for (int64_t i = 0; i < r.n; i++)
    for (int64_t k = 0; k < r.numel[i]; k++) ck_assert(r.g[i][k] != 0.0f);
  TU_OK(mtopt_optimizer_zero_grad(r.opt));
  for (int64_t i = 0; i < r.n; i++)
    for (int64_t k = 0; k < r.numel[i]; k++) ck_assert(r.g[i][k] == 0.0f);
  rig_destroy(&r);
}
END_TEST

/* The state slab is zeroed and each tensor's state shares its weights'
 * residue mod 16 bytes. */
START_TEST(test_state_layout) {
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 6);
  const int kinds[] = {MTOPT_OPTIMIZER_ADAMW, MTOPT_OPTIMIZER_SGD};
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  c.kind = kinds[_i];
  c.momentum = 0.9f;
  rig_opts_t o = RIG_OPTS_INIT;
  o.n_tensors = 30;
  o.max_numel = 300;
  rig_t r;
  rig_build(&r, &rng, &c, &o);
  const mtopt_state_t which[] = {MTOPT_STATE_EXP_AVG, MTOPT_STATE_EXP_AVG_SQ};
  const int ns = c.kind == MTOPT_OPTIMIZER_SGD ? 1 : 2;
  for (int s = 0; s < ns; s++)
    for (int64_t i = 0; i < r.n; i++) {
      void *p = NULL;
      TU_OK(mtopt_optimizer_get_state(r.opt, i,
                                      ns == 1 ? MTOPT_STATE_MOMENTUM : which[s], &p));
      if (r.numel[i] == 0) continue;
      ck_assert_int_eq(((uintptr_t)p - (uintptr_t)r.w[i]) % 16, 0);
      for (int64_t k = 0; k < r.numel[i]; k++) ck_assert(((float *)p)[k] == 0.0f);
    }
  mtopt_optimizer_info_t info = MTOPT_OPTIMIZER_INFO_INIT;
  TU_OK(mtopt_optimizer_get_info(r.opt, &info));
  ck_assert_int_eq(info.total_numel, rig_total(&r));
  ck_assert_int_ge(info.state_bytes, (int64_t)(ns * rig_total(&r) * 4));
  /* At most 3 floats of padding a tensor (its residue), plus the gaps
   * between weights that malloc placed under MTOPT__SEGMENT_GAP_MAX floats
   * apart: such tensors may share a run, whose state mirrors those gaps
   * (core/layout.c). */
  int64_t gaps = 0;
  for (int64_t i = 0, prev = -1; i < r.n; i++) {
    if (r.numel[i] == 0) continue; /* in no run */
    if (prev >= 0) {
      const intptr_t d = (intptr_t)r.w[i] - (intptr_t)(r.w[prev] + r.numel[prev]);
      if (d >= 0 && d / 4 < MTOPT__SEGMENT_GAP_MAX) gaps += d / 4;
    }
    prev = i;
  }
  ck_assert_int_le(info.state_bytes, (int64_t)(ns * (rig_total(&r) + 3 * r.n + gaps) * 4));
  ck_assert_int_eq(info.launches_per_step, 1);
  ck_assert_int_eq(info.bytes_per_param, ns == 2 ? 28 : 20);
  rig_destroy(&r);
}
END_TEST

/* Empty tensors only: the step still counts (as torch's), nothing is touched. */
START_TEST(test_empty_list) {
  mtopt_context_t *ctx = tu_cpu_context();
  mtopt_tensor_list_t *list = NULL;
  TU_OK(mtopt_tensor_list_create(ctx, &list));
  float dummy = 1.5f;
  TU_OK(mtopt_tensor_list_add_f32(list, &dummy, NULL, 0, 0, NULL));
  TU_OK(mtopt_tensor_list_add_f32(list, NULL, NULL, 0, 0, NULL));
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  c.kind = (mtopt_optimizer_kind_t)_i;
  mtopt_optimizer_t *opt = NULL;
  TU_OK(mtopt_optimizer_create(ctx, list, &c, &opt));
  TU_OK(mtopt_optimizer_step(opt));
  TU_OK(mtopt_optimizer_step(opt));
  mtopt_step_info_t info = MTOPT_STEP_INFO_INIT;
  TU_OK(mtopt_optimizer_get_step_info(opt, &info));
  ck_assert_int_eq(info.step, 2);
  ck_assert(dummy == 1.5f);
  void *p = (void *)1;
  TU_OK(mtopt_optimizer_get_grad(opt, 1, &p));
  mtopt_optimizer_info_t oi = MTOPT_OPTIMIZER_INFO_INIT;
  TU_OK(mtopt_optimizer_get_info(opt, &oi));
  ck_assert_int_eq(oi.num_chunks, 0);
  ck_assert_int_eq(oi.num_tensors, 2);
  TU_OK(mtopt_optimizer_destroy(opt));
  TU_OK(mtopt_tensor_list_destroy(list));
  TU_OK(mtopt_context_destroy(ctx));
}
END_TEST

/* One optimizer's steps leave another optimizer on the same context alone, and
 * destroying an optimizer unfreezes its list for a new one. */
START_TEST(test_two_optimizers) {
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 9);
  mtopt_context_t *ctx = tu_cpu_context();
  enum { N = 777 };
  float *w1 = malloc(N * sizeof(float)), *g1 = malloc(N * sizeof(float));
  float *w2 = malloc(N * sizeof(float)), *g2 = malloc(N * sizeof(float));
  tu_fill(&rng, w1, N, -1, 1);
  tu_fill(&rng, g1, N, -1, 1);
  tu_fill(&rng, w2, N, -1, 1);
  tu_fill(&rng, g2, N, -1, 1);
  float *w2c = malloc(N * sizeof(float));
  memcpy(w2c, w2, N * sizeof(float));
  mtopt_tensor_list_t *l1, *l2;
  TU_OK(mtopt_tensor_list_create(ctx, &l1));
  TU_OK(mtopt_tensor_list_create(ctx, &l2));
  TU_OK(mtopt_tensor_list_add_f32(l1, w1, g1, N, 0, NULL));
  TU_OK(mtopt_tensor_list_add_f32(l2, w2, g2, N, 0, NULL));
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  mtopt_optimizer_t *o1, *o2;
  TU_OK(mtopt_optimizer_create(ctx, l1, &c, &o1));
  c.kind = MTOPT_OPTIMIZER_SGD;
  c.momentum = 0.9f;
  TU_OK(mtopt_optimizer_create(ctx, l2, &c, &o2));
  TU_OK(mtopt_optimizer_step(o1));
  ck_assert_int_lt(tu_first_bit_diff(w2, w2c, N), 0);
  TU_OK(mtopt_optimizer_destroy(o1));
  TU_OK(mtopt_tensor_list_add_f32(l1, w2c, NULL, N, 0, NULL)); /* unfrozen */
  TU_OK(mtopt_optimizer_destroy(o2));
  TU_OK(mtopt_tensor_list_destroy(l1));
  TU_OK(mtopt_tensor_list_destroy(l2));
  TU_OK(mtopt_context_destroy(ctx));
  free(w1), free(g1), free(w2), free(g2), free(w2c);
}
END_TEST

Suite *optimizers_suite(void) {
  Suite *s = suite_create("optimizers");
  TCase *tc = tcase_create("reference");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_against_reference, 0, NVARIANTS);
  tcase_add_loop_test(tc, test_many_chunks, 0, NVARIANTS);
  suite_add_tcase(s, tc);
  TCase *det = tcase_create("determinism");
  tcase_set_timeout(det, 60);
  const int nd = (int)(sizeof det_variants / sizeof *det_variants);
  tcase_add_loop_test(det, test_threads_bit_identical, 0, 2 * nd);
  tcase_add_loop_test(det, test_repeat_bit_identical, 0, 2 * nd);
  suite_add_tcase(s, det);
  TCase *mem = tcase_create("memory");
  tcase_set_timeout(mem, 30);
  tcase_add_test(mem, test_grad_buffer);
  tcase_add_loop_test(mem, test_state_layout, 0, 2);
  tcase_add_loop_test(mem, test_empty_list, 0, 4);
  tcase_add_test(mem, test_two_optimizers);
  suite_add_tcase(s, mem);
  return s;
}

int main(void) { return tu_run(optimizers_suite(), 0); }

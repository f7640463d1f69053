/* The fused mixed-precision step: loss scaling (static and dynamic, with
 * GradScaler's update rule), skipping steps with non-finite gradients (weights
 * and state bit-for-bit unchanged, step count not advanced), and global-norm
 * clipping (torch clip_grad_norm_'s coefficient), each against the double
 * reference (reference.h). Tolerances as in optimizers.c (same reasoning: the
 * unscale and clip factors add one fp32 rounding of g per step). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rig.h"

static const rig_tol_t tol_adam = {1e-6, 1e-5, 1e-6, 1e-5, 1e-10, 1e-5};
static const rig_tol_t tol_sgd = {1e-6, 1e-5, 1e-5, 1e-5, 0, 0};

/* One config per optimizer kind (SGD with momentum so it keeps state). */
static mtopt_optimizer_config_t kind_config(int k) {
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  c.lr = 1e-2f;
  switch (k) {
  case 0: c.kind = MTOPT_OPTIMIZER_ADAMW; c.weight_decay = 0.05f; break;
  case 1: c.kind = MTOPT_OPTIMIZER_ADAM; c.weight_decay = 0.01f; break;
  case 2: c.kind = MTOPT_OPTIMIZER_SGD; c.momentum = 0.9f; c.weight_decay = 0.01f; break;
  case 3: c.kind = MTOPT_OPTIMIZER_SGD; c.momentum = 0.8f; c.nesterov = 1; break;
  default: c.kind = MTOPT_OPTIMIZER_LAMB; c.weight_decay = 0.01f; break;
  }
  return c;
}
#define NKINDS 5

static const rig_tol_t *tol_of(const mtopt_optimizer_config_t *c) {
  return c->kind == MTOPT_OPTIMIZER_SGD ? &tol_sgd : &tol_adam;
}

static void info_of(rig_t *r, mtopt_step_info_t *info) {
  *info = (mtopt_step_info_t)MTOPT_STEP_INFO_INIT;
  TU_OK(mtopt_optimizer_get_step_info(r->opt, info));
}

/* Relative agreement of the reported norm with the double norm: the library
 * sums fp32 squares per chunk, then the chunks in double (~1e-6 relative). */
static void check_norm(rig_t *r, int step) {
  mtopt_step_info_t info;
  info_of(r, &info);
  const double ref = r->ref.last_grad_norm;
  ck_assert_msg(fabs(info.last_grad_norm - ref) <= 1e-5 * ref + 1e-12,
                "step %d: last_grad_norm %.9g, reference %.9g", step,
                (double)info.last_grad_norm, ref);
}

/* Plants a non-finite value in one random element of one random non-empty
 * tensor; returns 0 if every tensor is empty. */
static int plant_bad(rig_t *r, tu_rng_t *rng) {
  static const float bad[3] = {INFINITY, -INFINITY, NAN};
  for (int tries = 0; tries < 1000; tries++) {
    const int64_t i = tu_int(rng, 0, r->n - 1);
    if (r->numel[i] == 0) continue;
    r->g[i][tu_int(rng, 0, r->numel[i] - 1)] = bad[tu_int(rng, 0, 2)];
    return 1;
  }
  return 0;
}

static void build(rig_t *r, tu_rng_t *rng, const mtopt_optimizer_config_t *c) {
  rig_opts_t o = RIG_OPTS_INIT;
  o.n_tensors = tu_int(rng, 2, 16);
  o.allow_empty = 0;
  rig_build(r, rng, c, &o);
}

/* A static loss scale: gradients arrive multiplied by it, the update sees
 * them unscaled. */
START_TEST(test_static_loss_scale) {
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 100u * (uint64_t)_i);
  mtopt_optimizer_config_t c = kind_config(_i);
  c.loss_scale = 1024.0f;
  c.chunk_size = 4 * tu_int(&rng, 1, 300);
  rig_t r;
  build(&r, &rng, &c);
  double ls = 0;
  TU_OK(mtopt_optimizer_get_hyperparam(r.opt, MTOPT_HP_LOSS_SCALE, &ls));
  ck_assert(ls == 1024.0);
  for (int step = 1; step <= 20; step++) {
    if (step == 11) rig_set(&r, MTOPT_HP_LOSS_SCALE, 96.0);
    rig_fill_grads(&r, &rng, r.ref.loss_scale);
    rig_step(&r);
    rig_check(&r, tol_of(&c), step);
    check_norm(&r, step);
  }
  mtopt_step_info_t info;
  info_of(&r, &info);
  ck_assert_int_eq(info.step, 20);
  ck_assert(info.loss_scale == 96.0f);
  rig_destroy(&r);
}
END_TEST

/* A random sequence of good and bad steps with the dynamic scale: the scale
 * and growth tracker follow GradScaler's rule, bad steps change nothing and are
 * not counted, good steps match the reference. */
START_TEST(test_dynamic_loss_scale) {
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 200u * (uint64_t)_i);
  mtopt_optimizer_config_t c = kind_config(_i % NKINDS);
  c.loss_scale = 65536.0f;
  c.dynamic_loss_scale = 1;
  c.growth_interval = 3;
  c.growth_factor = 2.0f;
  c.backoff_factor = 0.5f;
  if (_i >= NKINDS) c.max_grad_norm = 2.0f; /* and clipping, which bites */
  c.chunk_size = 4 * tu_int(&rng, 1, 300);
  rig_t r;
  build(&r, &rng, &c);
  const int64_t len = rig_snapshot_len(&r);
  float *before = malloc((size_t)len * sizeof(float));
  float *after = malloc((size_t)len * sizeof(float));
  int64_t good = 0, bad = 0;
  for (int step = 1; step <= 40; step++) {
    mtopt_step_info_t info;
    info_of(&r, &info);
    ck_assert_msg(info.loss_scale == r.ref.loss_scale, "step %d: scale %g, GradScaler %g",
                  step, (double)info.loss_scale, (double)r.ref.loss_scale);
    ck_assert_int_eq(info.growth_tracker, r.ref.growth_tracker);
    double hp = 0;
    TU_OK(mtopt_optimizer_get_hyperparam(r.opt, MTOPT_HP_LOSS_SCALE, &hp));
    ck_assert(hp == (double)r.ref.loss_scale);
    rig_fill_grads(&r, &rng, info.loss_scale);
    /* First step bad sometimes, so that SGD's first-step buffer set-up must
     * wait for the first applied step. */
    const int is_bad = (step == 1 && _i % 2) || tu_int(&rng, 0, 3) == 0;
    if (is_bad) ck_assert(plant_bad(&r, &rng));
    rig_snapshot(&r, before);
    rig_step(&r);
    info_of(&r, &info);
    ck_assert_int_eq(info.last_skipped, is_bad);
    ck_assert_int_eq(r.ref.last_skipped, is_bad);
    if (is_bad) {
      bad++;
      rig_snapshot(&r, after);
      const int64_t d = tu_first_bit_diff(before, after, len);
      ck_assert_msg(d < 0, "step %d: skipped step changed element %lld of the snapshot",
                    step, (long long)d);
    } else {
      good++;
      check_norm(&r, step);
    }
    ck_assert_int_eq(info.step, good);
    ck_assert_int_eq(info.skipped_steps, bad);
    rig_check(&r, tol_of(&c), step);
  }
  ck_assert_int_gt(bad, 0);
  free(before);
  free(after);
  rig_destroy(&r);
}
END_TEST

/* The scale never grows to infinity: at the top of the fp32 range growth is
 * refused (GradScaler keeps the old scale), and the tracker resets. */
START_TEST(test_scale_growth_capped) {
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 300);
  mtopt_optimizer_config_t c = kind_config(0);
  c.loss_scale = 0x1p126f;
  c.dynamic_loss_scale = 1;
  c.growth_interval = 1;
  c.growth_factor = 4.0f;
  rig_t r;
  build(&r, &rng, &c);
  for (int step = 1; step <= 3; step++) {
    /* Tiny gradients times the scale stay finite. */
    rig_fill_grads(&r, &rng, 1.0f);
    rig_step(&r);
    mtopt_step_info_t info;
    info_of(&r, &info);
    ck_assert(info.loss_scale == r.ref.loss_scale);
    ck_assert(isfinite(info.loss_scale));
    ck_assert_int_eq(info.last_skipped, 0);
  }
  ck_assert(r.ref.loss_scale == 0x1p126f);
  rig_destroy(&r);
}
END_TEST

/* skip_nonfinite without loss scaling: every optimizer kind leaves weights and
 * state bit-for-bit unchanged on a bad step, including on the first step. */
START_TEST(test_skip_nonfinite) {
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 400u * (uint64_t)_i);
  mtopt_optimizer_config_t c = kind_config(_i);
  c.skip_nonfinite = 1;
  c.chunk_size = 4 * tu_int(&rng, 1, 100);
  rig_t r;
  build(&r, &rng, &c);
  const int64_t len = rig_snapshot_len(&r);
  float *before = malloc((size_t)len * sizeof(float));
  float *after = malloc((size_t)len * sizeof(float));
  for (int step = 1; step <= 12; step++) {
    rig_fill_grads(&r, &rng, 1.0f);
    const int is_bad = step == 1 || step % 3 == 0;
    if (is_bad) ck_assert(plant_bad(&r, &rng));
    rig_snapshot(&r, before);
    rig_step(&r);
    mtopt_step_info_t info;
    info_of(&r, &info);
    ck_assert_int_eq(info.last_skipped, is_bad);
    if (is_bad) {
      rig_snapshot(&r, after);
      ck_assert_int_lt(tu_first_bit_diff(before, after, len), 0);
      ck_assert(!isfinite(info.last_grad_norm));
    } else {
      check_norm(&r, step);
    }
    ck_assert_int_eq(info.step, r.ref.step);
    ck_assert_int_eq(info.skipped_steps, r.ref.skipped_steps);
    ck_assert(info.loss_scale == 1.0f);
    rig_check(&r, tol_of(&c), step);
  }
  free(before);
  free(after);
  rig_destroy(&r);
}
END_TEST

/* Clipping that bites, against the reference; max_grad_norm changed mid-run. */
START_TEST(test_clip) {
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 500u * (uint64_t)_i);
  mtopt_optimizer_config_t c = kind_config(_i);
  c.max_grad_norm = 0.5f;
  c.chunk_size = 4 * tu_int(&rng, 1, 300);
  rig_t r;
  build(&r, &rng, &c);
  /* Gradients scaled to a norm of ~10 (uniform data: |g| ~ s*sqrt(n/3)), so
   * the clip bites, except every fourth step at ~0.1, where it must not. */
  const float big = (float)(10.0 / sqrt(rig_total(&r) / 3.0));
  int bit = 0, spared = 0;
  for (int step = 1; step <= 20; step++) {
    if (step == 8) rig_set(&r, MTOPT_HP_MAX_GRAD_NORM, 3.0);
    rig_fill_grads(&r, &rng, step % 4 == 0 ? big * 0.01f : big);
    rig_step(&r);
    check_norm(&r, step);
    if (r.ref.last_grad_norm > r.ref.max_grad_norm)
      bit++;
    else
      spared++;
    rig_check(&r, tol_of(&c), step);
  }
  ck_assert(bit > 0 && spared > 0);
  rig_destroy(&r);
}
END_TEST

/* Clipping and a static loss scale together: the norm is of the unscaled g. */
START_TEST(test_clip_and_scale) {
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 600u * (uint64_t)_i);
  mtopt_optimizer_config_t c = kind_config(_i);
  c.max_grad_norm = 1.0f;
  c.loss_scale = 4096.0f;
  rig_t r;
  build(&r, &rng, &c);
  for (int step = 1; step <= 15; step++) {
    rig_fill_grads(&r, &rng, c.loss_scale);
    rig_step(&r);
    check_norm(&r, step);
    rig_check(&r, tol_of(&c), step);
  }
  rig_destroy(&r);
}
END_TEST

/* A max_grad_norm far above the norm clips nothing: the same bits as steps
 * without clipping. */
START_TEST(test_clip_noop) {
  const uint64_t seed = tu_seed() + 700u * (uint64_t)_i;
  rig_t a, b;
  tu_rng_t ra, rb;
  tu_rng_init(&ra, seed);
  tu_rng_init(&rb, seed);
  mtopt_optimizer_config_t c = kind_config(_i);
  build(&a, &ra, &c);
  c.max_grad_norm = 1e6f;
  build(&b, &rb, &c);
  for (int step = 1; step <= 10; step++) {
    rig_fill_grads(&a, &ra, 1.0f);
    rig_fill_grads(&b, &rb, 1.0f);
    TU_OK(mtopt_optimizer_step(a.opt));
    TU_OK(mtopt_optimizer_step(b.opt));
  }
  const int64_t len = rig_snapshot_len(&a);
  ck_assert_int_eq(len, rig_snapshot_len(&b));
  float *sa = malloc((size_t)len * sizeof(float)), *sb = malloc((size_t)len * sizeof(float));
  rig_snapshot(&a, sa);
  rig_snapshot(&b, sb);
  const int64_t d = tu_first_bit_diff(sa, sb, len);
  ck_assert_msg(d < 0, "no-op clip changed element %lld", (long long)d);
  mtopt_step_info_t ia, ib;
  info_of(&a, &ia);
  info_of(&b, &ib);
  ck_assert(isnan(ia.last_grad_norm));
  ck_assert(isfinite(ib.last_grad_norm) && ib.last_grad_norm > 0.0f);
  free(sa);
  free(sb);
  rig_destroy(&a);
  rig_destroy(&b);
}
END_TEST

/* The bookkeeping pieces of the reference itself, on hand-checked values, so a
 * wrong reference cannot make a wrong library pass. */
START_TEST(test_reference_bookkeeping) {
  ck_assert(ref_clip_coef(10.0, 1.0) == 1.0 / (10.0 + 1e-6));
  ck_assert(ref_clip_coef(0.5, 1.0) == 1.0);
  float s = 8.0f;
  int t = 0;
  ref_scaler_update(&s, &t, 0, 2.0f, 0.5f, 2);
  ck_assert(s == 8.0f && t == 1);
  ref_scaler_update(&s, &t, 0, 2.0f, 0.5f, 2);
  ck_assert(s == 16.0f && t == 0);
  ref_scaler_update(&s, &t, 0, 2.0f, 0.5f, 2);
  ref_scaler_update(&s, &t, 1, 2.0f, 0.5f, 2);
  ck_assert(s == 8.0f && t == 0);
}
END_TEST

Suite *mixed_precision_suite(void) {
  Suite *s = suite_create("mixed_precision");
  TCase *tc = tcase_create("scale");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_static_loss_scale, 0, NKINDS);
  tcase_add_loop_test(tc, test_dynamic_loss_scale, 0, 2 * NKINDS);
  tcase_add_test(tc, test_scale_growth_capped);
  tcase_add_loop_test(tc, test_skip_nonfinite, 0, NKINDS);
  tcase_add_test(tc, test_reference_bookkeeping);
  suite_add_tcase(s, tc);
  TCase *clip = tcase_create("clip");
  tcase_set_timeout(clip, 60);
  tcase_add_loop_test(clip, test_clip, 0, NKINDS);
  tcase_add_loop_test(clip, test_clip_and_scale, 0, NKINDS);
  tcase_add_loop_test(clip, test_clip_noop, 0, NKINDS);
  suite_add_tcase(s, clip);
  return s;
}

int main(void) { return tu_run(mixed_precision_suite(), 0); }

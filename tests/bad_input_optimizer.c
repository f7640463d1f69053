/* Bad input to the optimizer: create's arguments, overlaps, contexts, NULLs,
 * the setters and the accessors (part of the bad_input suite). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bad_input.h"

/* ---------------------------------------------------- optimizer_create -- */

/* The config fails with the message naming `needle`; nothing is built. */
static void config_fails(mtopt_tensor_list_t *l, const mtopt_optimizer_config_t *c,
                         const char *needle, int line) {
  mtopt_optimizer_t *const sentinel = (mtopt_optimizer_t *)(uintptr_t)0x77;
  mtopt_optimizer_t *out = sentinel;
  const int64_t live = ctx->live_objects;
  const char *marker = reset_error("mtopt_optimizer_create");
  check_fails(mtopt_optimizer_create(ctx, l, c, &out), BAD, needle, ctx,
              "mtopt_optimizer_create", line, marker);
  ck_assert_ptr_eq(out, sentinel);
  ck_assert_int_eq(l->users, 0); /* not frozen */
  ck_assert_int_eq(ctx->live_objects, live);
}
#define CONFIG_FAILS(field, value, needle)                                     \
  do {                                                                         \
    mtopt_optimizer_config_t c_ = base;                                        \
    c_.field = value;                                                          \
    config_fails(l, &c_, needle, __LINE__);                                    \
  } while (0)

START_TEST(test_optimizer_create_args) {
  mtopt_tensor_list_t *l = good_list();
  const mtopt_optimizer_config_t base = MTOPT_OPTIMIZER_CONFIG_INIT;
  mtopt_optimizer_t *out = NULL;
  FAILS(BAD, "ctx", NULL, mtopt_optimizer_create(NULL, l, &base, &out));
  FAILS(BAD, "list", ctx, mtopt_optimizer_create(ctx, NULL, &base, &out));
  FAILS(BAD, "config", ctx, mtopt_optimizer_create(ctx, l, NULL, &out));
  FAILS(BAD, "out", ctx, mtopt_optimizer_create(ctx, l, &base, NULL));
  ck_assert_ptr_null(out);

  {
    mtopt_optimizer_config_t newer = base;
    newer.api_version = (MTOPT_VERSION_MAJOR + 1) * 10000u + 3u;
    FAILS(MTOPT_STATUS_NOT_SUPPORTED, "api_version", ctx,
          mtopt_optimizer_create(ctx, l, &newer, &out));
    ck_assert_ptr_null(out);
    ck_assert_int_eq(l->users, 0);
  }
  CONFIG_FAILS(struct_size, 0, "struct_size");
  CONFIG_FAILS(struct_size, 16, "struct_size");
  CONFIG_FAILS(struct_size, 1u << 20, "struct_size");
  CONFIG_FAILS(kind, (mtopt_optimizer_kind_t)4, "kind");
  CONFIG_FAILS(kind, (mtopt_optimizer_kind_t)-1, "kind");
  const float nonfinite[] = {NAN, INFINITY, -INFINITY};
  for (int i = 0; i < 3; i++) {
    const float x = nonfinite[i];
    CONFIG_FAILS(lr, x, "lr");
    CONFIG_FAILS(beta1, x, "beta1");
    CONFIG_FAILS(beta2, x, "beta2");
    CONFIG_FAILS(eps, x, "eps");
    CONFIG_FAILS(weight_decay, x, "weight_decay");
    CONFIG_FAILS(momentum, x, "momentum");
    CONFIG_FAILS(dampening, x, "dampening");
    CONFIG_FAILS(max_grad_norm, x, "max_grad_norm");
    CONFIG_FAILS(loss_scale, x, "loss_scale");
  }
  CONFIG_FAILS(lr, -1e-3f, "lr");
  CONFIG_FAILS(beta1, 1.0f, "beta1");
  CONFIG_FAILS(beta1, -0.1f, "beta1");
  CONFIG_FAILS(beta2, 1.0f, "beta2");
  CONFIG_FAILS(eps, 0.0f, "eps");
  CONFIG_FAILS(eps, -1e-8f, "eps");
  CONFIG_FAILS(weight_decay, -0.01f, "weight_decay");
  CONFIG_FAILS(momentum, -0.9f, "momentum");
  CONFIG_FAILS(dampening, 1.5f, "dampening");
  CONFIG_FAILS(dampening, -0.5f, "dampening");
  CONFIG_FAILS(max_grad_norm, -1.0f, "max_grad_norm");
  CONFIG_FAILS(loss_scale, 0.0f, "loss_scale");
  CONFIG_FAILS(loss_scale, -128.0f, "loss_scale");
  CONFIG_FAILS(chunk_size, 6, "chunk_size");
  CONFIG_FAILS(chunk_size, 2, "chunk_size");
  CONFIG_FAILS(chunk_size, -4, "chunk_size");
  CONFIG_FAILS(chunk_size, (INT64_C(1) << 30) + 4, "chunk_size");
  CONFIG_FAILS(chunk_size, INT64_C(1) << 31, "chunk_size");
  CONFIG_FAILS(chunk_size, 65537, "chunk_size");

  /* Nesterov needs momentum > 0 and no dampening (torch's rule). */
  mtopt_optimizer_config_t c = base;
  c.kind = MTOPT_OPTIMIZER_SGD;
  c.nesterov = 1;
  c.momentum = 0.9f;
  c.dampening = 0.1f;
  config_fails(l, &c, "Nesterov", __LINE__);
  c.momentum = 0.0f;
  c.dampening = 0.0f;
  config_fails(l, &c, "Nesterov", __LINE__);

  /* Dynamic loss scale parameters. */
  c = base;
  c.dynamic_loss_scale = 1;
  const float bad_growth[] = {1.0f, 0.5f, 0.0f, -2.0f, NAN, INFINITY};
  for (int i = 0; i < 6; i++) {
    mtopt_optimizer_config_t d = c;
    d.growth_factor = bad_growth[i];
    config_fails(l, &d, "growth_factor", __LINE__);
  }
  const float bad_backoff[] = {1.0f, 0.0f, -0.5f, 1.5f, NAN};
  for (int i = 0; i < 5; i++) {
    mtopt_optimizer_config_t d = c;
    d.backoff_factor = bad_backoff[i];
    config_fails(l, &d, "backoff_factor", __LINE__);
  }
  mtopt_optimizer_config_t d = c;
  d.growth_interval = 0;
  config_fails(l, &d, "growth_interval", __LINE__);
  d.growth_interval = -5;
  config_fails(l, &d, "growth_interval", __LINE__);

  /* After all that, the list still builds an optimizer. */
  TU_OK(mtopt_optimizer_create(ctx, l, &base, &out));
  TU_OK(mtopt_optimizer_destroy(out));
  TU_OK(mtopt_tensor_list_destroy(l));
}
END_TEST

/* Duplicate and overlapping tensors are rejected when the optimizer is built. */
START_TEST(test_optimizer_overlaps) {
  const mtopt_optimizer_config_t base = MTOPT_OPTIMIZER_CONFIG_INIT;
  float *big = malloc(200 * sizeof(float));
  float *gb = malloc(200 * sizeof(float));
  struct {
    float *p1, *g1, *p2, *g2;
    int64_t n1, n2;
    const char *why;
  } cases[] = {
      {big, gb, big, gb + 100, 50, 50, "param"},          /* same param twice */
      {big, NULL, big, NULL, 50, 50, "param"},            /* same, library grads */
      {big, NULL, big + 49, NULL, 50, 50, "param"},       /* params overlap by 1 */
      {big + 10, NULL, big, NULL, 50, 11, "param"},       /* other order */
      {big, gb, big + 100, big + 20, 50, 50, "grad"},     /* grad over a param */
      {big, big + 30, big + 100, NULL, 50, 50, "grad"},   /* grad over own param */
      {big, gb, big + 100, gb + 49, 50, 50, "grad"},      /* grads overlap */
  };
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
    mtopt_tensor_list_t *l = NULL;
    TU_OK(mtopt_tensor_list_create(ctx, &l));
    mtopt_tensor_desc_t d = MTOPT_TENSOR_DESC_INIT;
    d.param = cases[k].p1;
    d.grad = cases[k].g1;
    d.numel = cases[k].n1;
    d.name = "first";
    TU_OK(mtopt_tensor_list_add(l, &d, NULL));
    d.param = cases[k].p2;
    d.grad = cases[k].g2;
    d.numel = cases[k].n2;
    d.name = "second";
    TU_OK(mtopt_tensor_list_add(l, &d, NULL));
    config_fails(l, &base, "overlaps", (int)(1000 + k));
    ck_assert_msg(strstr(mtopt_last_error(), cases[k].why) != NULL, "case %zu: %s", k,
                  mtopt_last_error());
    ck_assert(strstr(mtopt_last_error(), "first") || strstr(mtopt_last_error(), "second"));
    TU_OK(mtopt_tensor_list_destroy(l));
  }
  /* Adjacent (touching, not overlapping) tensors are fine, and so are empty
   * tensors at the same address. */
  mtopt_tensor_list_t *l = NULL;
  TU_OK(mtopt_tensor_list_create(ctx, &l));
  TU_OK(mtopt_tensor_list_add_f32(l, big, gb, 50, 0, NULL));
  TU_OK(mtopt_tensor_list_add_f32(l, big + 50, gb + 50, 50, 0, NULL));
  TU_OK(mtopt_tensor_list_add_f32(l, big + 50, gb + 50, 0, 0, NULL));
  mtopt_optimizer_t *opt = NULL;
  TU_OK(mtopt_optimizer_create(ctx, l, &base, &opt));
  TU_OK(mtopt_optimizer_destroy(opt));
  TU_OK(mtopt_tensor_list_destroy(l));
  free(big);
  free(gb);
}
END_TEST

START_TEST(test_optimizer_other_context) {
  mtopt_context_t *other = tu_cpu_context();
  mtopt_tensor_list_t *l = NULL;
  TU_OK(mtopt_tensor_list_create(other, &l));
  TU_OK(mtopt_tensor_list_add_f32(l, w[0], g[0], NE, 0, NULL));
  const mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  mtopt_optimizer_t *out = NULL;
  FAILS(BAD, "another context", ctx, mtopt_optimizer_create(ctx, l, &c, &out));
  ck_assert_ptr_null(out);
  ck_assert_int_eq(l->users, 0);
  TU_OK(mtopt_tensor_list_destroy(l));
  TU_OK(mtopt_context_destroy(other));
}
END_TEST

/* ------------------------------------------------- optimizer calls -------- */

START_TEST(test_optimizer_null) {
  void *p = NULL;
  double v = 0;
  float f = 0;
  int64_t n = 0;
  mtopt_step_info_t si = MTOPT_STEP_INFO_INIT;
  mtopt_optimizer_info_t oi = MTOPT_OPTIMIZER_INFO_INIT;
  ck_assert_int_eq(mtopt_optimizer_destroy(NULL), MTOPT_STATUS_SUCCESS);
  FAILS(BAD, "opt", NULL, mtopt_optimizer_step(NULL));
  FAILS(BAD, "opt", NULL, mtopt_optimizer_set_hyperparam(NULL, MTOPT_HP_LR, 1e-3));
  FAILS(BAD, "opt", NULL, mtopt_optimizer_get_hyperparam(NULL, MTOPT_HP_LR, &v));
  FAILS(BAD, "opt", NULL, mtopt_optimizer_set_lr(NULL, 1e-3f));
  FAILS(BAD, "opt", NULL, mtopt_optimizer_get_step_info(NULL, &si));
  FAILS(BAD, "opt", NULL, mtopt_optimizer_get_state(NULL, 0, MTOPT_STATE_EXP_AVG, &p));
  FAILS(BAD, "opt", NULL, mtopt_optimizer_read_state(NULL, 0, MTOPT_STATE_EXP_AVG, &f));
  FAILS(BAD, "opt", NULL, mtopt_optimizer_get_grad(NULL, 0, &p));
  FAILS(BAD, "opt", NULL, mtopt_optimizer_get_grad_buffer(NULL, &p, &n));
  FAILS(BAD, "opt", NULL, mtopt_optimizer_zero_grad(NULL));
  FAILS(BAD, "opt", NULL, mtopt_optimizer_get_info(NULL, &oi));
}
END_TEST

/* An AdamW optimizer and its untouched twin (same data, no failed calls):
 * after the failures below, a step of each must give the same bits. */
typedef struct {
  mtopt_tensor_list_t *l;
  mtopt_optimizer_t *opt;
  float *w[NT], *g[NT];
} twin_t;

static void twin_make(twin_t *t, const mtopt_optimizer_config_t *c) {
  TU_OK(mtopt_tensor_list_create(ctx, &t->l));
  for (int i = 0; i < NT; i++) {
    t->w[i] = malloc(NE * sizeof(float));
    t->g[i] = malloc(NE * sizeof(float));
    memcpy(t->w[i], w[i], NE * sizeof(float));
    memcpy(t->g[i], g[i], NE * sizeof(float));
    TU_OK(mtopt_tensor_list_add_f32(t->l, t->w[i], t->g[i], NE, 0, NULL));
  }
  TU_OK(mtopt_optimizer_create(ctx, t->l, c, &t->opt));
}

static void twin_free(twin_t *t) {
  TU_OK(mtopt_optimizer_destroy(t->opt));
  TU_OK(mtopt_tensor_list_destroy(t->l));
  for (int i = 0; i < NT; i++) {
    free(t->w[i]);
    free(t->g[i]);
  }
}

static void twins_agree(twin_t *a, twin_t *b) {
  TU_OK(mtopt_optimizer_step(a->opt));
  TU_OK(mtopt_optimizer_step(b->opt));
  for (int i = 0; i < NT; i++) {
    ck_assert_int_lt(tu_first_bit_diff(a->w[i], b->w[i], NE), 0);
    ck_assert_int_ge(tu_first_bit_diff(a->w[i], w[i], NE), 0); /* it did step */
  }
}

START_TEST(test_set_hyperparam_bad) {
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT; /* AdamW */
  twin_t a, b;
  twin_make(&a, &c);
  twin_make(&b, &c);
  mtopt_optimizer_t *opt = a.opt;
  const double nonfinite[] = {NAN, INFINITY, -INFINITY};
  for (int i = 0; i < 3; i++) {
    FAILS(BAD, "lr", ctx, mtopt_optimizer_set_hyperparam(opt, MTOPT_HP_LR, nonfinite[i]));
    FAILS(BAD, "beta1", ctx, mtopt_optimizer_set_hyperparam(opt, MTOPT_HP_BETA1, nonfinite[i]));
    FAILS(BAD, "eps", ctx, mtopt_optimizer_set_hyperparam(opt, MTOPT_HP_EPS, nonfinite[i]));
    FAILS(BAD, "weight_decay", ctx,
          mtopt_optimizer_set_hyperparam(opt, MTOPT_HP_WEIGHT_DECAY, nonfinite[i]));
  }
  FAILS(BAD, "lr", ctx, mtopt_optimizer_set_hyperparam(opt, MTOPT_HP_LR, -1e-3));
  FAILS(BAD, "lr", ctx, mtopt_optimizer_set_lr(opt, -1.0f));
  FAILS(BAD, "lr", ctx, mtopt_optimizer_set_lr(opt, NAN));
  FAILS(BAD, "lr", ctx, mtopt_optimizer_set_hyperparam(opt, MTOPT_HP_LR, 1e300));
  FAILS(BAD, "beta1", ctx, mtopt_optimizer_set_hyperparam(opt, MTOPT_HP_BETA1, 1.0));
  FAILS(BAD, "beta2", ctx, mtopt_optimizer_set_hyperparam(opt, MTOPT_HP_BETA2, 1.0));
  FAILS(BAD, "beta2", ctx, mtopt_optimizer_set_hyperparam(opt, MTOPT_HP_BETA2, -0.5));
  FAILS(BAD, "eps", ctx, mtopt_optimizer_set_hyperparam(opt, MTOPT_HP_EPS, 0.0));
  FAILS(BAD, "weight_decay", ctx,
        mtopt_optimizer_set_hyperparam(opt, MTOPT_HP_WEIGHT_DECAY, -0.1));
  FAILS(BAD, "unknown hyperparameter", ctx,
        mtopt_optimizer_set_hyperparam(opt, MTOPT_HP_COUNT_, 1.0));
  FAILS(BAD, "unknown hyperparameter", ctx,
        mtopt_optimizer_set_hyperparam(opt, (mtopt_hyperparam_t)-1, 1.0));
  double v = 123.0;
  FAILS(BAD, "unknown hyperparameter", ctx,
        mtopt_optimizer_get_hyperparam(opt, (mtopt_hyperparam_t)77, &v));
  FAILS(BAD, "value", ctx, mtopt_optimizer_get_hyperparam(opt, MTOPT_HP_LR, NULL));
  ck_assert(v == 123.0);
  /* Scalars AdamW does not use, or that need a feature it was not built with. */
  FAILS(BAD, "momentum", ctx, mtopt_optimizer_set_hyperparam(opt, MTOPT_HP_MOMENTUM, 0.9));
  FAILS(BAD, "dampening", ctx, mtopt_optimizer_set_hyperparam(opt, MTOPT_HP_DAMPENING, 0.1));
  FAILS(BAD, "max_grad_norm", ctx,
        mtopt_optimizer_set_hyperparam(opt, MTOPT_HP_MAX_GRAD_NORM, 1.0));
  FAILS(BAD, "loss_scale", ctx, mtopt_optimizer_set_hyperparam(opt, MTOPT_HP_LOSS_SCALE, 128.0));

  /* Old values kept, and the next step is the untouched twin's. */
  TU_OK(mtopt_optimizer_get_hyperparam(opt, MTOPT_HP_LR, &v));
  ck_assert(v == (double)c.lr);
  TU_OK(mtopt_optimizer_get_hyperparam(opt, MTOPT_HP_BETA1, &v));
  ck_assert(v == (double)c.beta1);
  TU_OK(mtopt_optimizer_get_hyperparam(opt, MTOPT_HP_EPS, &v));
  ck_assert(v == (double)c.eps);
  TU_OK(mtopt_optimizer_get_hyperparam(opt, MTOPT_HP_LOSS_SCALE, &v));
  ck_assert(v == 1.0);
  twins_agree(&a, &b);
  twin_free(&a);
  twin_free(&b);
}
END_TEST

START_TEST(test_set_hyperparam_sgd) {
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  c.kind = MTOPT_OPTIMIZER_SGD;
  c.lr = 0.1f;
  twin_t a, b;
  /* Plain SGD: no momentum buffer, no betas. */
  twin_make(&a, &c);
  twin_make(&b, &c);
  FAILS(BAD, "momentum", ctx, mtopt_optimizer_set_hyperparam(a.opt, MTOPT_HP_MOMENTUM, 0.9));
  FAILS(BAD, "beta1", ctx, mtopt_optimizer_set_hyperparam(a.opt, MTOPT_HP_BETA1, 0.9));
  FAILS(BAD, "beta2", ctx, mtopt_optimizer_set_hyperparam(a.opt, MTOPT_HP_BETA2, 0.9));
  FAILS(BAD, "eps", ctx, mtopt_optimizer_set_hyperparam(a.opt, MTOPT_HP_EPS, 1e-6));
  FAILS(BAD, "dampening", ctx, mtopt_optimizer_set_hyperparam(a.opt, MTOPT_HP_DAMPENING, 2.0));
  twins_agree(&a, &b);
  twin_free(&a);
  twin_free(&b);
  /* Nesterov: momentum stays > 0, dampening stays 0. */
  c.momentum = 0.9f;
  c.nesterov = 1;
  twin_make(&a, &c);
  twin_make(&b, &c);
  FAILS(BAD, "momentum", ctx, mtopt_optimizer_set_hyperparam(a.opt, MTOPT_HP_MOMENTUM, 0.0));
  FAILS(BAD, "momentum", ctx, mtopt_optimizer_set_hyperparam(a.opt, MTOPT_HP_MOMENTUM, -0.5));
  FAILS(BAD, "dampening", ctx, mtopt_optimizer_set_hyperparam(a.opt, MTOPT_HP_DAMPENING, 0.1));
  double v = 0;
  TU_OK(mtopt_optimizer_get_hyperparam(a.opt, MTOPT_HP_MOMENTUM, &v));
  ck_assert(v == (double)0.9f);
  twins_agree(&a, &b);
  twins_agree(&a, &b);
  twin_free(&a);
  twin_free(&b);
}
END_TEST

/* Clipping and loss scaling: their scalars can be set, out-of-range values
 * cannot. */
START_TEST(test_set_hyperparam_mixed) {
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  c.max_grad_norm = 1.0f;
  c.loss_scale = 256.0f;
  twin_t a, b;
  twin_make(&a, &c);
  twin_make(&b, &c);
  FAILS(BAD, "max_grad_norm", ctx,
        mtopt_optimizer_set_hyperparam(a.opt, MTOPT_HP_MAX_GRAD_NORM, -1.0));
  FAILS(BAD, "max_grad_norm", ctx,
        mtopt_optimizer_set_hyperparam(a.opt, MTOPT_HP_MAX_GRAD_NORM, NAN));
  FAILS(BAD, "loss_scale", ctx, mtopt_optimizer_set_hyperparam(a.opt, MTOPT_HP_LOSS_SCALE, 0.0));
  FAILS(BAD, "loss_scale", ctx,
        mtopt_optimizer_set_hyperparam(a.opt, MTOPT_HP_LOSS_SCALE, INFINITY));
  FAILS(BAD, "loss_scale", ctx, mtopt_optimizer_set_hyperparam(a.opt, MTOPT_HP_LOSS_SCALE, 1e39));
  double v = 0;
  TU_OK(mtopt_optimizer_get_hyperparam(a.opt, MTOPT_HP_LOSS_SCALE, &v));
  ck_assert(v == 256.0);
  twins_agree(&a, &b);
  twin_free(&a);
  twin_free(&b);
}
END_TEST

START_TEST(test_state_and_grad_access) {
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  twin_t a;
  twin_make(&a, &c);
  mtopt_optimizer_t *opt = a.opt;
  float dst[NE];
  for (int i = 0; i < NE; i++) dst[i] = 7.0f;
  void *const sentinel = (void *)(uintptr_t)0x55;
  void *p = sentinel;
  const int64_t bad_idx[] = {-1, NT, INT64_MAX, INT64_MIN};
  for (int k = 0; k < 4; k++) {
    FAILS(BAD, "out of range", ctx,
          mtopt_optimizer_get_state(opt, bad_idx[k], MTOPT_STATE_EXP_AVG, &p));
    FAILS(BAD, "out of range", ctx,
          mtopt_optimizer_read_state(opt, bad_idx[k], MTOPT_STATE_EXP_AVG, dst));
    FAILS(BAD, "out of range", ctx, mtopt_optimizer_get_grad(opt, bad_idx[k], &p));
  }
  FAILS(BAD, "state buffer", ctx, mtopt_optimizer_get_state(opt, 0, MTOPT_STATE_MOMENTUM, &p));
  FAILS(BAD, "state buffer", ctx, mtopt_optimizer_read_state(opt, 0, MTOPT_STATE_MOMENTUM, dst));
  FAILS(BAD, "state buffer", ctx,
        mtopt_optimizer_get_state(opt, 0, (mtopt_state_t)9, &p));
  FAILS(BAD, "ptr", ctx, mtopt_optimizer_get_state(opt, 0, MTOPT_STATE_EXP_AVG, NULL));
  FAILS(BAD, "host_dst", ctx, mtopt_optimizer_read_state(opt, 0, MTOPT_STATE_EXP_AVG, NULL));
  FAILS(BAD, "ptr", ctx, mtopt_optimizer_get_grad(opt, 0, NULL));
  int64_t n = -3;
  FAILS(BAD, "ptr", ctx, mtopt_optimizer_get_grad_buffer(opt, NULL, &n));
  FAILS(BAD, "numel", ctx, mtopt_optimizer_get_grad_buffer(opt, &p, NULL));
  ck_assert_ptr_eq(p, sentinel);
  ck_assert_int_eq(n, -3);
  for (int i = 0; i < NE; i++) ck_assert(dst[i] == 7.0f);

  mtopt_step_info_t si = MTOPT_STEP_INFO_INIT;
  si.struct_size = 4;
  si.step = 99;
  FAILS(BAD, "struct_size", ctx, mtopt_optimizer_get_step_info(opt, &si));
  FAILS(BAD, "info", ctx, mtopt_optimizer_get_step_info(opt, NULL));
  ck_assert_int_eq(si.step, 99);
  mtopt_optimizer_info_t oi = MTOPT_OPTIMIZER_INFO_INIT;
  oi.struct_size = 0;
  oi.num_chunks = 99;
  FAILS(BAD, "struct_size", ctx, mtopt_optimizer_get_info(opt, &oi));
  FAILS(BAD, "info", ctx, mtopt_optimizer_get_info(opt, NULL));
  ck_assert_int_eq(oi.num_chunks, 99);
  /* A library with no gradient buffer says so. */
  TU_OK(mtopt_optimizer_get_grad_buffer(opt, &p, &n));
  ck_assert_ptr_null(p);
  ck_assert_int_eq(n, 0);
  TU_OK(mtopt_optimizer_zero_grad(opt)); /* the user's gradients are zeroed */
  for (int i = 0; i < NT; i++) ck_assert(a.g[i][0] == 0.0f);
  twin_free(&a);

  /* SGD: no Adam moments; without momentum no buffer at all. */
  c.kind = MTOPT_OPTIMIZER_SGD;
  twin_make(&a, &c);
  FAILS(BAD, "state buffer", ctx, mtopt_optimizer_get_state(a.opt, 0, MTOPT_STATE_MOMENTUM, &p));
  FAILS(BAD, "state buffer", ctx, mtopt_optimizer_get_state(a.opt, 0, MTOPT_STATE_EXP_AVG, &p));
  twin_free(&a);
  c.momentum = 0.5f;
  twin_make(&a, &c);
  FAILS(BAD, "state buffer", ctx,
        mtopt_optimizer_read_state(a.opt, 1, MTOPT_STATE_EXP_AVG_SQ, dst));
  TU_OK(mtopt_optimizer_get_state(a.opt, 1, MTOPT_STATE_MOMENTUM, &p));
  ck_assert_ptr_nonnull(p);
  twin_free(&a);
  /* LAMB keeps no momentum buffer. */
  c.kind = MTOPT_OPTIMIZER_LAMB;
  c.momentum = 0.0f;
  twin_make(&a, &c);
  FAILS(BAD, "state buffer", ctx, mtopt_optimizer_get_state(a.opt, 2, MTOPT_STATE_MOMENTUM, &p));
  twin_free(&a);
}
END_TEST

void bad_input_add_optimizer_tests(TCase *tc) {
  tcase_add_test(tc, test_optimizer_create_args);
  tcase_add_test(tc, test_optimizer_overlaps);
  tcase_add_test(tc, test_optimizer_other_context);
  tcase_add_test(tc, test_optimizer_null);
  tcase_add_test(tc, test_set_hyperparam_bad);
  tcase_add_test(tc, test_set_hyperparam_sgd);
  tcase_add_test(tc, test_set_hyperparam_mixed);
  tcase_add_test(tc, test_state_and_grad_access);
}

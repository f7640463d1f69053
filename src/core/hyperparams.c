/* Hyperparameters: the range of each scalar (one place for create, the
 * setters and load), the block's initial values, the setters and getters, and
 * the step results. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core.h"

/* No plausible run takes 2^62 steps; counts stay far from overflow. */
#define MAX_STEPS (INT64_C(1) << 62)
#define STEP_INFO_MIN_SIZE (offsetof(mtopt_step_info_t, growth_tracker) + sizeof(int32_t))

static const char *const hp_names[MTOPT_HP_COUNT_] = {
    "lr", "beta1", "beta2", "eps", "weight_decay", "momentum", "dampening",
    "max_grad_norm", "loss_scale"};

int mtopt__is_adam_family(int kind) {
  return kind == MTOPT_OPTIMIZER_ADAMW || kind == MTOPT_OPTIMIZER_ADAM ||
         kind == MTOPT_OPTIMIZER_LAMB;
}

int mtopt__uses_loss_scale(const mtopt_optimizer_config_t *c) {
  return c->loss_scale != 1.0f || c->dynamic_loss_scale;
}

/* The range of each scalar, as the float the block will hold: a double that
 * rounds out of range (beta1 = 0.99999999 -> 1.0f, eps = 1e-46 -> 0) is
 * refused. One place for create, the setters and load. */
typedef struct {
  float lo, hi;
  int lo_open, hi_open; /* the bound itself is excluded */
} hp_range_t;

static const hp_range_t hp_ranges[MTOPT_HP_COUNT_] = {
    [MTOPT_HP_LR] = {0.0f, 1e30f, 0, 0},
    [MTOPT_HP_BETA1] = {0.0f, 1.0f, 0, 1},
    [MTOPT_HP_BETA2] = {0.0f, 1.0f, 0, 1},
    [MTOPT_HP_EPS] = {0.0f, 1e30f, 1, 0},
    [MTOPT_HP_WEIGHT_DECAY] = {0.0f, 1e30f, 0, 0},
    [MTOPT_HP_MOMENTUM] = {0.0f, 1e30f, 0, 0},
    [MTOPT_HP_DAMPENING] = {0.0f, 1.0f, 0, 0},
    [MTOPT_HP_MAX_GRAD_NORM] = {0.0f, 1e30f, 0, 0},
    [MTOPT_HP_LOSS_SCALE] = {0.0f, 3.0e38f, 1, 0},
};

mtopt_status_t mtopt__check_hyperparam(mtopt_context_t *ctx, const char *fn,
                                       mtopt_hyperparam_t which, double x) {
  if ((unsigned)which >= MTOPT_HP_COUNT_)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: unknown hyperparameter %d",
                        fn, (int)which);
  const hp_range_t r = hp_ranges[which];
  /* A double beyond float's range has no float (the conversion would be
   * undefined); NaN fails both comparisons. */
  const int fits = x >= -FLT_MAX && x <= FLT_MAX;
  const float f = fits ? (float)x : 0.0f;
  /* A non-zero value that underflows to 0 would turn the scalar's effect off
   * (max_grad_norm: clipping) or make it invalid (eps, loss_scale). */
  const int ok = fits && (f != 0.0f || x == 0.0) && (r.lo_open ? f > r.lo : f >= r.lo) &&
                 (r.hi_open ? f < r.hi : f <= r.hi);
  if (ok) return MTOPT_STATUS_SUCCESS;
  char stored[48] = "";
  if (fits && (double)f != x) snprintf(stored, sizeof stored, " (as a float: %.9g)", (double)f);
  return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                      "%s: %s = %.9g%s is out of range %c%g, %g%c", fn, hp_names[which], x,
                      stored, r.lo_open ? '(' : '[', (double)r.lo, (double)r.hi,
                      r.hi_open ? ')' : ']');
}

/* Why this optimizer cannot hold value for a scalar it uses, or NULL: a
 * feature fixed at create (a momentum buffer, clipping, loss scaling) can be
 * tuned but not turned on, and Nesterov needs momentum > 0, dampening 0. The
 * setters and load share it. */
static const char *hp_refusal(const mtopt_optimizer_config_t *c, mtopt_hyperparam_t which,
                              double value) {
  if (which == MTOPT_HP_MOMENTUM && c->momentum <= 0.0f && value != 0.0)
    return "needs a momentum buffer: create the optimizer with momentum > 0";
  if (which == MTOPT_HP_MOMENTUM && c->nesterov && value <= 0.0)
    return "must stay > 0 with Nesterov momentum";
  if (which == MTOPT_HP_DAMPENING && c->nesterov && value != 0.0)
    return "must stay 0 with Nesterov momentum";
  if (which == MTOPT_HP_MAX_GRAD_NORM && c->max_grad_norm <= 0.0f && value != 0.0)
    return "needs an optimizer created with max_grad_norm > 0";
  if (which == MTOPT_HP_LOSS_SCALE && !mtopt__uses_loss_scale(c) && value != 1.0)
    return "needs an optimizer created with loss scaling";
  return NULL;
}

/* Why this optimizer's kind does not read the scalar, or NULL. */
static const char *hp_unused(const mtopt_optimizer_config_t *c, mtopt_hyperparam_t which) {
  const int adam = mtopt__is_adam_family(c->kind);
  if ((which == MTOPT_HP_BETA1 || which == MTOPT_HP_BETA2 || which == MTOPT_HP_EPS) && !adam)
    return "is not used by SGD";
  if ((which == MTOPT_HP_MOMENTUM || which == MTOPT_HP_DAMPENING) &&
      c->kind != MTOPT_OPTIMIZER_SGD)
    return "is used by SGD only";
  return NULL;
}

mtopt_status_t mtopt__check_config(mtopt_context_t *ctx, const char *fn,
                                   const mtopt_optimizer_config_t *c) {
  if ((unsigned)c->kind > MTOPT_OPTIMIZER_LAMB)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: unknown optimizer kind %d",
                        fn, (int)c->kind);
  CHECK(mtopt__check_hyperparam(ctx, fn, MTOPT_HP_LR, c->lr));
  CHECK(mtopt__check_hyperparam(ctx, fn, MTOPT_HP_BETA1, c->beta1));
  CHECK(mtopt__check_hyperparam(ctx, fn, MTOPT_HP_BETA2, c->beta2));
  CHECK(mtopt__check_hyperparam(ctx, fn, MTOPT_HP_EPS, c->eps));
  CHECK(mtopt__check_hyperparam(ctx, fn, MTOPT_HP_WEIGHT_DECAY, c->weight_decay));
  CHECK(mtopt__check_hyperparam(ctx, fn, MTOPT_HP_MOMENTUM, c->momentum));
  CHECK(mtopt__check_hyperparam(ctx, fn, MTOPT_HP_DAMPENING, c->dampening));
  CHECK(mtopt__check_hyperparam(ctx, fn, MTOPT_HP_MAX_GRAD_NORM, c->max_grad_norm));
  CHECK(mtopt__check_hyperparam(ctx, fn, MTOPT_HP_LOSS_SCALE, c->loss_scale));
  if (c->nesterov && (c->momentum <= 0.0f || c->dampening != 0.0f))
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: Nesterov momentum needs momentum > 0 and dampening == 0 "
                        "(momentum %g, dampening %g)",
                        fn, (double)c->momentum, (double)c->dampening);
  if (c->dynamic_loss_scale &&
      (!(c->growth_factor > 1.0f && c->growth_factor <= 1e6f) ||
       !(c->backoff_factor > 0.0f && c->backoff_factor < 1.0f) || c->growth_interval < 1))
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: dynamic loss scale needs growth_factor > 1, backoff_factor "
                        "in (0, 1), growth_interval >= 1 (got %g, %g, %d)",
                        fn, (double)c->growth_factor, (double)c->backoff_factor,
                        c->growth_interval);
  if ((unsigned)c->master_weights > MTOPT_MASTER_REMAINDER)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: unknown master_weights %d (NONE, F32, REMAINDER)", fn,
                        (int)c->master_weights);
  if (c->state_dtype != MTOPT_DTYPE_F32 && c->state_dtype != MTOPT_DTYPE_BF16)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: state_dtype %d: optimizer state is MTOPT_DTYPE_F32 or "
                        "MTOPT_DTYPE_BF16",
                        fn, (int)c->state_dtype);
  if ((unsigned)c->rounding > MTOPT_ROUNDING_STOCHASTIC)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: unknown rounding %d (NEAREST, STOCHASTIC)", fn, (int)c->rounding);
  if (c->chunk_size != 0 &&
      (c->chunk_size < 4 || c->chunk_size > (INT64_C(1) << 30) || c->chunk_size % 4 != 0))
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: chunk_size %lld must be 0 (the library's choice) or a multiple "
                        "of 4 in [4, 2^30]",
                        fn,
                        (long long)c->chunk_size);
  return MTOPT_STATUS_SUCCESS;
}

/* The block at create: the config's values, no step taken. */
void mtopt__init_hyper(mtopt__hyper_t *h, const mtopt_optimizer_config_t *c) {
  memset(h, 0, sizeof *h);
  h->lr = c->lr;
  h->beta1 = c->beta1;
  h->beta2 = c->beta2;
  h->eps = c->eps;
  h->weight_decay = c->weight_decay;
  h->momentum = c->momentum;
  h->dampening = c->dampening;
  h->max_grad_norm = c->max_grad_norm;
  h->growth_factor = c->growth_factor;
  h->backoff_factor = c->backoff_factor;
  h->growth_interval = c->growth_interval;
  h->seed = c->seed;
  h->nesterov = c->nesterov != 0;
  h->bias_correction = c->kind == MTOPT_OPTIMIZER_LAMB ? c->bias_correction != 0 : 1;
  h->lamb_always_adapt = c->lamb_always_adapt != 0;
  h->dynamic_loss_scale = c->dynamic_loss_scale != 0;
  h->loss_scale = c->loss_scale;
  h->last_grad_norm = NAN;
  h->grad_scale = 1.0f;
}

/* Where a scalar sits in the block. */
static float *hp_field(mtopt__hyper_t *h, mtopt_hyperparam_t which) {
  switch (which) {
  case MTOPT_HP_LR: return &h->lr;
  case MTOPT_HP_BETA1: return &h->beta1;
  case MTOPT_HP_BETA2: return &h->beta2;
  case MTOPT_HP_EPS: return &h->eps;
  case MTOPT_HP_WEIGHT_DECAY: return &h->weight_decay;
  case MTOPT_HP_MOMENTUM: return &h->momentum;
  case MTOPT_HP_DAMPENING: return &h->dampening;
  case MTOPT_HP_MAX_GRAD_NORM: return &h->max_grad_norm;
  case MTOPT_HP_LOSS_SCALE: return &h->loss_scale;
  default: return NULL;
  }
}

/* Load's checks of a block read from a file, before it replaces the live one:
 * every scalar within its range; for the scalars this kind reads, the
 * setters' feature rules too (the others are never read: their range only);
 * step counts far from overflow (2^62 steps: no plausible run); a growth
 * tracker only with a dynamic loss scale, below INT32_MAX (it is incremented). */
mtopt_status_t mtopt__check_loaded_hyper(mtopt_context_t *ctx, const char *fn,
                                         const mtopt_optimizer_config_t *c,
                                         const mtopt__hyper_t *h) {
  mtopt__hyper_t copy = *h;
  for (int i = 0; i < MTOPT_HP_COUNT_; i++) {
    const mtopt_hyperparam_t which = (mtopt_hyperparam_t)i;
    const double v = *hp_field(&copy, which);
    CHECK(mtopt__check_hyperparam(ctx, fn, which, v));
    const char *why = hp_unused(c, which) ? NULL : hp_refusal(c, which, v);
    if (why)
      return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: %s = %g: %s", fn,
                          hp_names[which], v, why);
  }
  if (h->step < 0 || h->step > MAX_STEPS || h->skipped_steps < 0 ||
      h->skipped_steps > MAX_STEPS)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: step %lld, skipped_steps %lld: each must be in [0, 2^62]", fn,
                        (long long)h->step, (long long)h->skipped_steps);
  if (h->growth_tracker < 0 || h->growth_tracker == INT32_MAX ||
      (!c->dynamic_loss_scale && h->growth_tracker != 0))
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: growth_tracker %d: must be 0 without a dynamic loss scale, "
                        "else in [0, 2^31-1)",
                        fn, (int)h->growth_tracker);
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_optimizer_set_hyperparam(mtopt_optimizer_t *opt,
                                              mtopt_hyperparam_t which, double value) {
  static const char fn[] = "mtopt_optimizer_set_hyperparam";
  CHECK(mtopt__check_opt(opt, fn));
  mtopt_context_t *ctx = opt->ctx;
  CHECK(mtopt__check_hyperparam(ctx, fn, which, value));
  const char *why = hp_unused(&opt->config, which);
  if (!why) why = hp_refusal(&opt->config, which, value);
  if (why)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: %s %s", fn, hp_names[which],
                        why);
  float *host = hp_field(&opt->hyper_host, which);
  const float v = (float)value;
  CHECK(ctx->ops->write_ordered(ctx, hp_field(opt->plan.hyper, which), &v, sizeof v));
  *host = v;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_optimizer_set_lr(mtopt_optimizer_t *opt, float lr) {
  return mtopt_optimizer_set_hyperparam(opt, MTOPT_HP_LR, lr);
}

mtopt_status_t mtopt_optimizer_set_group(mtopt_optimizer_t *opt, int32_t group, float lr_mult,
                                         float weight_decay_mult) {
  static const char fn[] = "mtopt_optimizer_set_group";
  CHECK(mtopt__check_opt(opt, fn));
  mtopt_context_t *ctx = opt->ctx;
  CHECK(mtopt__check_group(ctx, fn, group, lr_mult, weight_decay_mult));
  const mtopt__group_rec_t g = {lr_mult, weight_decay_mult};
  CHECK(ctx->ops->write_ordered(ctx, (void *)&opt->plan.groups[group], &g, sizeof g));
  opt->groups_host[group] = g;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_optimizer_get_group(const mtopt_optimizer_t *opt, int32_t group,
                                         float *lr_mult, float *weight_decay_mult) {
  static const char fn[] = "mtopt_optimizer_get_group";
  CHECK(mtopt__check_opt(opt, fn));
  if (!lr_mult || !weight_decay_mult)
    return mtopt__error(opt->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                        lr_mult ? "weight_decay_mult" : "lr_mult");
  CHECK(mtopt__check_group(opt->ctx, fn, group, 0.0f, 0.0f));
  *lr_mult = opt->groups_host[group].lr_mult;
  *weight_decay_mult = opt->groups_host[group].wd_mult;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_optimizer_set_step_count(mtopt_optimizer_t *opt, int64_t step) {
  static const char fn[] = "mtopt_optimizer_set_step_count";
  CHECK(mtopt__check_opt(opt, fn));
  if (step < 0 || step > MAX_STEPS)
    return mtopt__error(opt->ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: step %lld must be in [0, 2^62]", fn, (long long)step);
  return opt->ctx->ops->write_ordered(opt->ctx, &opt->plan.hyper->step, &step, sizeof step);
}

mtopt_status_t mtopt_optimizer_get_hyperparam(const mtopt_optimizer_t *opt,
                                              mtopt_hyperparam_t which, double *value) {
  static const char fn[] = "mtopt_optimizer_get_hyperparam";
  CHECK(mtopt__check_opt(opt, fn));
  if (!value)
    return mtopt__error(opt->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: value is NULL", fn);
  if (which == MTOPT_HP_LOSS_SCALE) {
    /* The step moves it on the device: read the live value. */
    mtopt_step_info_t info = MTOPT_STEP_INFO_INIT;
    CHECK(mtopt_optimizer_get_step_info((mtopt_optimizer_t *)opt, &info));
    *value = info.loss_scale;
    return MTOPT_STATUS_SUCCESS;
  }
  mtopt__hyper_t copy = opt->hyper_host;
  const float *f = hp_field(&copy, which);
  if (!f)
    return mtopt__error(opt->ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: unknown hyperparameter %d", fn, (int)which);
  *value = *f;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_optimizer_get_step_info(mtopt_optimizer_t *opt, mtopt_step_info_t *info) {
  static const char fn[] = "mtopt_optimizer_get_step_info";
  CHECK(mtopt__check_opt(opt, fn));
  if (!info || info->struct_size < STEP_INFO_MIN_SIZE || info->struct_size > 4096)
    return mtopt__error(opt->ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: info is NULL or info.struct_size is not a known size "
                        "(initialise with MTOPT_STEP_INFO_INIT)",
                        fn);
  mtopt__hyper_t h;
  CHECK(opt->ctx->ops->download(opt->ctx, &h, opt->plan.hyper, sizeof h));
  info->step = h.step;
  info->skipped_steps = h.skipped_steps;
  info->last_skipped = h.last_skipped;
  info->last_grad_norm = h.last_grad_norm;
  info->loss_scale = h.loss_scale;
  info->growth_tracker = h.growth_tracker;
  return MTOPT_STATUS_SUCCESS;
}


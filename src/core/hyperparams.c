/* Hyperparameters: the range of each scalar (one place for create, the
 * setters and load), the block's initial values, the setters and getters, and
 * the step results. */
#include <math.h>
#include <string.h>

#include "core.h"

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

/* The range of each scalar; one place for create and the setters. */
mtopt_status_t mtopt__check_hyperparam(mtopt_context_t *ctx, const char *fn,
                                       mtopt_hyperparam_t which, double x) {
  int ok;
  switch (which) {
  case MTOPT_HP_LR:
  case MTOPT_HP_WEIGHT_DECAY:
  case MTOPT_HP_MOMENTUM:
  case MTOPT_HP_MAX_GRAD_NORM:
    ok = x >= 0.0 && x <= 1e30;
    break;
  case MTOPT_HP_BETA1:
  case MTOPT_HP_BETA2:
    ok = x >= 0.0 && x < 1.0;
    break;
  case MTOPT_HP_EPS:
    ok = x > 0.0 && x <= 1e30;
    break;
  case MTOPT_HP_DAMPENING:
    ok = x >= 0.0 && x <= 1.0;
    break;
  case MTOPT_HP_LOSS_SCALE:
    ok = x > 0.0 && x <= 3.0e38;
    break;
  default:
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: unknown hyperparameter %d",
                        fn, (int)which);
  }
  if (!ok)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: %s = %g is out of range",
                        fn, hp_names[which], x);
  return MTOPT_STATUS_SUCCESS;
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
  if (c->chunk_size < 4 || c->chunk_size > (INT64_C(1) << 30) || c->chunk_size % 4 != 0)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: chunk_size %lld must be a multiple of 4 in [4, 2^30]", fn,
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

mtopt_status_t mtopt_optimizer_set_hyperparam(mtopt_optimizer_t *opt,
                                              mtopt_hyperparam_t which, double value) {
  static const char fn[] = "mtopt_optimizer_set_hyperparam";
  CHECK(mtopt__check_opt(opt, fn));
  mtopt_context_t *ctx = opt->ctx;
  CHECK(mtopt__check_hyperparam(ctx, fn, which, value));
  const mtopt_optimizer_config_t *c = &opt->config;
  const int adam = mtopt__is_adam_family(c->kind);
  const char *why = NULL;
  if ((which == MTOPT_HP_BETA1 || which == MTOPT_HP_BETA2 || which == MTOPT_HP_EPS) && !adam)
    why = "is not used by SGD";
  else if ((which == MTOPT_HP_MOMENTUM || which == MTOPT_HP_DAMPENING) &&
           c->kind != MTOPT_OPTIMIZER_SGD)
    why = "is used by SGD only";
  else if (which == MTOPT_HP_MOMENTUM && c->momentum <= 0.0f)
    why = "needs a momentum buffer: create the optimizer with momentum > 0";
  else if (which == MTOPT_HP_MOMENTUM && c->nesterov && value <= 0.0)
    why = "must stay > 0 with Nesterov momentum";
  else if (which == MTOPT_HP_DAMPENING && c->nesterov && value != 0.0)
    why = "must stay 0 with Nesterov momentum";
  else if (which == MTOPT_HP_MAX_GRAD_NORM && c->max_grad_norm <= 0.0f)
    why = "needs an optimizer created with max_grad_norm > 0";
  else if (which == MTOPT_HP_LOSS_SCALE && !mtopt__uses_loss_scale(c))
    why = "needs an optimizer created with loss scaling";
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


/* Optimizers: validation, the one-time build of the chunk table, state slab
 * and gradient buffer, the step call and the accessors. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define CONFIG_MIN_SIZE (offsetof(mtopt_optimizer_config_t, chunk_size) + sizeof(int64_t))
#define STEP_INFO_MIN_SIZE (offsetof(mtopt_step_info_t, growth_tracker) + sizeof(int32_t))
#define INFO_MIN_SIZE (offsetof(mtopt_optimizer_info_t, bytes_per_param) + sizeof(int))
#define ALIGN_UP(x, a) (((x) + (a) - 1) / (a) * (a))

static const char *const hp_names[MTOPT_HP_COUNT_] = {
    "lr", "beta1", "beta2", "eps", "weight_decay", "momentum", "dampening",
    "max_grad_norm", "loss_scale"};

static int is_adam_family(int kind) {
  return kind == MTOPT_OPTIMIZER_ADAMW || kind == MTOPT_OPTIMIZER_ADAM ||
         kind == MTOPT_OPTIMIZER_LAMB;
}

static int uses_loss_scale(const mtopt_optimizer_config_t *c) {
  return c->loss_scale != 1.0f || c->dynamic_loss_scale;
}

/* The range of each scalar; one place for create and the setters. */
static mtopt_status_t check_hp(mtopt_context_t *ctx, const char *fn,
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

static mtopt_status_t check_config(mtopt_context_t *ctx, const mtopt_optimizer_config_t *c) {
  static const char fn[] = "mtopt_optimizer_create";
  if (c->struct_size < CONFIG_MIN_SIZE || c->struct_size > 4096)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: config.struct_size %zu is not a known size (initialise "
                        "with MTOPT_OPTIMIZER_CONFIG_INIT)",
                        fn, c->struct_size);
  if ((unsigned)c->kind > MTOPT_OPTIMIZER_LAMB)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: unknown optimizer kind %d",
                        fn, (int)c->kind);
  CHECK(check_hp(ctx, fn, MTOPT_HP_LR, c->lr));
  CHECK(check_hp(ctx, fn, MTOPT_HP_BETA1, c->beta1));
  CHECK(check_hp(ctx, fn, MTOPT_HP_BETA2, c->beta2));
  CHECK(check_hp(ctx, fn, MTOPT_HP_EPS, c->eps));
  CHECK(check_hp(ctx, fn, MTOPT_HP_WEIGHT_DECAY, c->weight_decay));
  CHECK(check_hp(ctx, fn, MTOPT_HP_MOMENTUM, c->momentum));
  CHECK(check_hp(ctx, fn, MTOPT_HP_DAMPENING, c->dampening));
  CHECK(check_hp(ctx, fn, MTOPT_HP_MAX_GRAD_NORM, c->max_grad_norm));
  CHECK(check_hp(ctx, fn, MTOPT_HP_LOSS_SCALE, c->loss_scale));
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
  if (c->chunk_size < 4 || c->chunk_size > (INT64_C(1) << 30) || c->chunk_size % 4 != 0)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: chunk_size %lld must be a multiple of 4 in [4, 2^30]", fn,
                        (long long)c->chunk_size);
  return MTOPT_STATUS_SUCCESS;
}

/* Overlap check: every parameter and user gradient range, sorted by start. */
typedef struct {
  uintptr_t lo, hi;
  int64_t tensor;
  int is_grad;
} range_t;

static int range_cmp(const void *a, const void *b) {
  const range_t *x = a, *y = b;
  return (x->lo > y->lo) - (x->lo < y->lo);
}

static mtopt_status_t check_overlaps(mtopt_context_t *ctx, const mtopt_tensor_list_t *list) {
  range_t *r = malloc((size_t)(2 * list->count + 1) * sizeof *r);
  if (!r)
    return mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "mtopt_optimizer_create: malloc failed");
  int64_t n = 0;
  for (int64_t i = 0; i < list->count; i++) {
    const mtopt_tensor_desc_t *d = &list->items[i].desc;
    if (d->numel == 0) continue;
    const uintptr_t bytes = (uintptr_t)d->numel * sizeof(float);
    r[n++] = (range_t){(uintptr_t)d->param, (uintptr_t)d->param + bytes, i, 0};
    if (d->grad) r[n++] = (range_t){(uintptr_t)d->grad, (uintptr_t)d->grad + bytes, i, 1};
  }
  qsort(r, (size_t)n, sizeof *r, range_cmp);
  mtopt_status_t st = MTOPT_STATUS_SUCCESS;
  for (int64_t k = 1; k < n; k++) {
    if (r[k].lo < r[k - 1].hi) {
      const range_t *a = &r[k - 1], *b = &r[k];
      const char *na = list->items[a->tensor].name, *nb = list->items[b->tensor].name;
      st = mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "mtopt_optimizer_create: the %s of tensor %lld '%s' overlaps the "
                        "%s of tensor %lld '%s'",
                        a->is_grad ? "grad" : "param", (long long)a->tensor, na ? na : "",
                        b->is_grad ? "grad" : "param", (long long)b->tensor, nb ? nb : "");
      break;
    }
  }
  free(r);
  return st;
}

static int state_buffers(const mtopt_optimizer_config_t *c) {
  if (is_adam_family(c->kind)) return 2;
  return c->momentum > 0.0f ? 1 : 0;
}

/* Bytes per parameter one step moves through memory (fp32), as docs/
 * counts them: reads of w, g, state and writes of w, state, plus one more read
 * of g for the statistics pass and LAMB's second pass over w, m, v. */
static int bytes_per_param(const mtopt__plan_t *p, int nstate) {
  const int f = (int)sizeof(float);
  int b = f * (2 + nstate) + f * (1 + nstate); /* read w g state, write w state */
  if (p->kind == MTOPT__KIND_LAMB) /* pass 1 writes no w; pass 2 reads w m v, writes w */
    b += -f + f * (1 + nstate) + f;
  if (p->use_stats) b += f;
  return b;
}

/* The tables block: tensors | chunks | groups | hyper | slots, each 256-byte
 * aligned, in one allocation. */
typedef struct {
  size_t tensors, chunks, groups, hyper, gsq, nonfinite, wsq, usq, total;
} table_layout_t;

static table_layout_t layout_tables(int64_t ntensors, int64_t nchunks, int lamb) {
  table_layout_t L;
  size_t off = 0;
#define PLACE(field, bytes)                                                    \
  L.field = off;                                                               \
  off = ALIGN_UP(off + (size_t)(bytes), 256)
  PLACE(tensors, ntensors * sizeof(mtopt__tensor_rec_t));
  PLACE(chunks, nchunks * sizeof(mtopt__chunk_rec_t));
  PLACE(groups, MTOPT_MAX_GROUPS * sizeof(mtopt__group_rec_t));
  PLACE(hyper, sizeof(mtopt__hyper_t));
  PLACE(gsq, nchunks * sizeof(float));
  PLACE(nonfinite, nchunks * sizeof(uint32_t));
  PLACE(wsq, lamb ? nchunks * sizeof(float) : 0);
  PLACE(usq, lamb ? nchunks * sizeof(float) : 0);
#undef PLACE
  L.total = off;
  return L;
}

static void init_hyper(mtopt__hyper_t *h, const mtopt_optimizer_config_t *c) {
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
  h->kind = (int32_t)c->kind;
  h->nesterov = c->nesterov != 0;
  h->bias_correction = c->kind == MTOPT_OPTIMIZER_LAMB ? c->bias_correction != 0 : 1;
  h->lamb_always_adapt = c->lamb_always_adapt != 0;
  h->use_stats = c->max_grad_norm > 0.0f || uses_loss_scale(c) || c->skip_nonfinite;
  h->dynamic_loss_scale = c->dynamic_loss_scale != 0;
  h->loss_scale = c->loss_scale;
  h->last_grad_norm = NAN;
  h->grad_scale = 1.0f;
}

static void release_all(mtopt_optimizer_t *opt) {
  mtopt_context_t *ctx = opt->ctx;
  if (opt->dev_tables) ctx->ops->release(ctx, opt->dev_tables);
  if (opt->dev_state) ctx->ops->release(ctx, opt->dev_state);
  if (opt->dev_grads) ctx->ops->release(ctx, opt->dev_grads);
  free(opt->tensors_host);
  free(opt);
}

mtopt_status_t mtopt_optimizer_create(mtopt_context_t *ctx, mtopt_tensor_list_t *list,
                                      const mtopt_optimizer_config_t *config,
                                      mtopt_optimizer_t **out) {
  static const char fn[] = "mtopt_optimizer_create";
  if (!ctx || !list || !config || !out)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                        !ctx ? "ctx" : !list ? "list" : !config ? "config" : "out");
  if (list->ctx != ctx)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: the tensor list belongs to another context", fn);
  CHECK(check_config(ctx, config));
  CHECK(check_overlaps(ctx, list));
  for (int64_t i = 0; i < list->count; i++) {
    const mtopt_tensor_desc_t *d = &list->items[i].desc;
    if (d->numel == 0) continue;
    const size_t bytes = (size_t)d->numel * sizeof(float);
    CHECK(ctx->ops->check_pointer(ctx, d->param, bytes, "param", i));
    if (d->grad) CHECK(ctx->ops->check_pointer(ctx, d->grad, bytes, "grad", i));
  }

  mtopt_status_t st = MTOPT_STATUS_SUCCESS;
  const int64_t n = list->count;
  int64_t *numel = NULL, *first = NULL, *nch = NULL;
  mtopt__chunk_rec_t *chunks = NULL;
  mtopt_optimizer_t *opt = calloc(1, sizeof *opt);
  const size_t nalloc = (size_t)(n > 0 ? n : 1);
  numel = malloc(nalloc * sizeof *numel);
  first = malloc(nalloc * sizeof *first);
  nch = malloc(nalloc * sizeof *nch);
  if (opt) opt->tensors_host = calloc(nalloc, sizeof *opt->tensors_host);
  if (!opt || !numel || !first || !nch || !opt->tensors_host) {
    st = mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: host allocation failed", fn);
    goto fail;
  }
  opt->ctx = ctx;
  memset(&opt->config, 0, sizeof opt->config);
  memcpy(&opt->config, config,
         config->struct_size < sizeof opt->config ? config->struct_size : sizeof opt->config);
  opt->config.struct_size = sizeof opt->config;
  const mtopt_optimizer_config_t *c = &opt->config;

  for (int64_t i = 0; i < n; i++) numel[i] = list->items[i].desc.numel;
  const int64_t nchunks = mtopt__plan_chunks(numel, n, c->chunk_size, first, nch, NULL);
  if (nchunks < 0 || nchunks > INT32_MAX) {
    st = mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                      "%s: the tensors need more than 2^31 chunks of %lld elements; "
                      "raise chunk_size",
                      fn, (long long)c->chunk_size);
    goto fail;
  }
  chunks = malloc((size_t)(nchunks > 0 ? nchunks : 1) * sizeof *chunks);
  if (!chunks) {
    st = mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: host allocation failed", fn);
    goto fail;
  }
  mtopt__plan_chunks(numel, n, c->chunk_size, first, nch, chunks);

  /* State slab and gradient buffer offsets, in floats, aligned to each
   * tensor's weights. */
  const int nstate = state_buffers(c);
  int64_t state_off = 0, grad_off = 0, total = 0;
  for (int64_t i = 0; i < n; i++) {
    const mtopt_tensor_desc_t *d = &list->items[i].desc;
    total += d->numel;
    if (d->numel == 0) continue;
    for (int s = 0; s < nstate; s++) {
      state_off = mtopt__aligned_offset(state_off, d->param);
      state_off += d->numel;
    }
    if (!d->grad) grad_off = mtopt__aligned_offset(grad_off, d->param) + d->numel;
  }
  opt->total_numel = total;
  opt->state_bytes = state_off * (int64_t)sizeof(float);
  opt->grad_buffer_numel = grad_off;

  const int lamb = c->kind == MTOPT_OPTIMIZER_LAMB;
  const table_layout_t L = layout_tables(n, nchunks, lamb);
  CHECK_GOTO(ctx->ops->alloc(ctx, L.total, &opt->dev_tables), st, fail);
  if (state_off > 0)
    CHECK_GOTO(ctx->ops->alloc(ctx, (size_t)state_off * sizeof(float), &opt->dev_state), st, fail);
  if (grad_off > 0)
    CHECK_GOTO(ctx->ops->alloc(ctx, (size_t)grad_off * sizeof(float), &opt->dev_grads), st, fail);

  /* Tensor records with backend addresses. */
  float *slab = opt->dev_state, *gbuf = opt->dev_grads;
  state_off = grad_off = 0;
  for (int64_t i = 0; i < n; i++) {
    const mtopt_tensor_desc_t *d = &list->items[i].desc;
    mtopt__tensor_rec_t *t = &opt->tensors_host[i];
    t->w = d->param;
    t->g = d->grad;
    t->numel = d->numel;
    t->first_chunk = first[i];
    t->num_chunks = nch[i];
    t->group = d->group;
    t->flags = d->flags;
    if (d->numel == 0) continue;
    float **state[2] = {&t->s0, &t->s1};
    for (int s = 0; s < nstate; s++) {
      state_off = mtopt__aligned_offset(state_off, d->param);
      *state[s] = slab + state_off;
      state_off += d->numel;
    }
    if (!d->grad) {
      grad_off = mtopt__aligned_offset(grad_off, d->param);
      t->g = gbuf + grad_off;
      grad_off += d->numel;
    }
  }
  init_hyper(&opt->hyper_host, c);

  char *base = opt->dev_tables;
  CHECK_GOTO(ctx->ops->upload(ctx, base + L.tensors, opt->tensors_host,
                              (size_t)n * sizeof(mtopt__tensor_rec_t)), st, fail);
  CHECK_GOTO(ctx->ops->upload(ctx, base + L.chunks, chunks,
                              (size_t)nchunks * sizeof(mtopt__chunk_rec_t)), st, fail);
  CHECK_GOTO(ctx->ops->upload(ctx, base + L.groups, list->groups, sizeof list->groups), st, fail);
  CHECK_GOTO(ctx->ops->upload(ctx, base + L.hyper, &opt->hyper_host, sizeof opt->hyper_host),
             st, fail);

  mtopt__plan_t *p = &opt->plan;
  p->tensors = (const mtopt__tensor_rec_t *)(base + L.tensors);
  p->chunks = (const mtopt__chunk_rec_t *)(base + L.chunks);
  p->groups = (const mtopt__group_rec_t *)(base + L.groups);
  p->hyper = (mtopt__hyper_t *)(base + L.hyper);
  p->slot_gsq = (float *)(base + L.gsq);
  p->slot_nonfinite = (uint32_t *)(base + L.nonfinite);
  p->slot_wsq = lamb ? (float *)(base + L.wsq) : NULL;
  p->slot_usq = lamb ? (float *)(base + L.usq) : NULL;
  p->num_tensors = n;
  p->num_chunks = nchunks;
  p->num_elements = total;
  p->chunk_size = c->chunk_size;
  p->kind = (int32_t)c->kind;
  p->use_stats = opt->hyper_host.use_stats;

  free(numel);
  free(first);
  free(nch);
  free(chunks);
  opt->list = list;
  list->users++;
  ctx->live_objects++;
  *out = opt;
  return MTOPT_STATUS_SUCCESS;

fail:
  free(numel);
  free(first);
  free(nch);
  free(chunks);
  if (opt) release_all(opt);
  return st;
}

mtopt_status_t mtopt_optimizer_destroy(mtopt_optimizer_t *opt) {
  if (!opt) return MTOPT_STATUS_SUCCESS;
  mtopt_context_t *ctx = opt->ctx;
  /* Steps may still be in flight on CUDA: wait before freeing their memory. */
  mtopt_status_t st = ctx->ops->synchronize(ctx);
  opt->list->users--;
  ctx->live_objects--;
  release_all(opt);
  return st;
}

static mtopt_status_t check_opt(const mtopt_optimizer_t *opt, const char *fn) {
  if (!opt) return mtopt__error(NULL, MTOPT_STATUS_INVALID_ARGUMENT, "%s: opt is NULL", fn);
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_optimizer_step(mtopt_optimizer_t *opt) {
  CHECK(check_opt(opt, "mtopt_optimizer_step"));
  /* A plan with no chunks still runs its passes: the step counts, as in torch. */
  return mtopt__run_step(opt->ctx, &opt->plan);
}

/* The passes of one step, in order; returns how many. */
static int step_passes(const mtopt__plan_t *plan, mtopt__pass_t passes[3]) {
  int n = 0;
  if (plan->use_stats) passes[n++] = MTOPT__PASS_STATS;
  passes[n++] = MTOPT__PASS_UPDATE;
  if (plan->kind == MTOPT__KIND_LAMB) passes[n++] = MTOPT__PASS_LAMB_APPLY;
  return n;
}

mtopt_status_t mtopt__run_step(mtopt_context_t *ctx, const mtopt__plan_t *plan) {
  mtopt__pass_t passes[3];
  const int n = step_passes(plan, passes);
  for (int i = 0; i < n; i++)
    CHECK(ctx->ops->run_pass(ctx, plan, passes[i], 0, plan->num_chunks, NULL));
  return MTOPT_STATUS_SUCCESS;
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
  CHECK(check_opt(opt, fn));
  mtopt_context_t *ctx = opt->ctx;
  CHECK(check_hp(ctx, fn, which, value));
  const mtopt_optimizer_config_t *c = &opt->config;
  const int adam = is_adam_family(c->kind);
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
  else if (which == MTOPT_HP_LOSS_SCALE && !uses_loss_scale(c))
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
  CHECK(check_opt(opt, fn));
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
  CHECK(check_opt(opt, fn));
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

static mtopt_status_t tensor_index(const mtopt_optimizer_t *opt, const char *fn, int64_t t) {
  if (t < 0 || t >= opt->plan.num_tensors)
    return mtopt__error(opt->ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: tensor %lld out of range [0, %lld)", fn, (long long)t,
                        (long long)opt->plan.num_tensors);
  return MTOPT_STATUS_SUCCESS;
}

static mtopt_status_t state_ptr(const mtopt_optimizer_t *opt, const char *fn, int64_t t,
                                mtopt_state_t which, float **out) {
  CHECK(tensor_index(opt, fn, t));
  const mtopt__tensor_rec_t *r = &opt->tensors_host[t];
  const int adam = is_adam_family(opt->config.kind);
  float *p = NULL;
  if (which == MTOPT_STATE_EXP_AVG && adam) p = r->s0;
  else if (which == MTOPT_STATE_EXP_AVG_SQ && adam) p = r->s1;
  else if (which == MTOPT_STATE_MOMENTUM && !adam && opt->config.momentum > 0.0f) p = r->s0;
  else
    return mtopt__error(opt->ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: this optimizer keeps no state buffer %d (EXP_AVG/EXP_AVG_SQ "
                        "are Adam's and LAMB's, MOMENTUM is SGD's with momentum > 0)",
                        fn, (int)which);
  *out = p;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_optimizer_get_state(mtopt_optimizer_t *opt, int64_t tensor,
                                         mtopt_state_t which, void **ptr) {
  static const char fn[] = "mtopt_optimizer_get_state";
  CHECK(check_opt(opt, fn));
  if (!ptr) return mtopt__error(opt->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: ptr is NULL", fn);
  float *p = NULL;
  CHECK(state_ptr(opt, fn, tensor, which, &p));
  *ptr = p;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_optimizer_read_state(mtopt_optimizer_t *opt, int64_t tensor,
                                          mtopt_state_t which, float *host_dst) {
  static const char fn[] = "mtopt_optimizer_read_state";
  CHECK(check_opt(opt, fn));
  if (!host_dst)
    return mtopt__error(opt->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: host_dst is NULL", fn);
  float *p = NULL;
  CHECK(state_ptr(opt, fn, tensor, which, &p));
  const int64_t n = opt->tensors_host[tensor].numel;
  if (n == 0) return MTOPT_STATUS_SUCCESS;
  return opt->ctx->ops->download(opt->ctx, host_dst, p, (size_t)n * sizeof(float));
}

mtopt_status_t mtopt_optimizer_get_grad(mtopt_optimizer_t *opt, int64_t tensor, void **ptr) {
  static const char fn[] = "mtopt_optimizer_get_grad";
  CHECK(check_opt(opt, fn));
  if (!ptr) return mtopt__error(opt->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: ptr is NULL", fn);
  CHECK(tensor_index(opt, fn, tensor));
  *ptr = opt->tensors_host[tensor].g;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_optimizer_get_grad_buffer(mtopt_optimizer_t *opt, void **ptr,
                                               int64_t *numel) {
  static const char fn[] = "mtopt_optimizer_get_grad_buffer";
  CHECK(check_opt(opt, fn));
  if (!ptr || !numel)
    return mtopt__error(opt->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                        ptr ? "numel" : "ptr");
  *ptr = opt->dev_grads;
  *numel = opt->grad_buffer_numel;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_optimizer_zero_grad(mtopt_optimizer_t *opt) {
  CHECK(check_opt(opt, "mtopt_optimizer_zero_grad"));
  if (!opt->dev_grads) return MTOPT_STATUS_SUCCESS;
  return opt->ctx->ops->zero_ordered(opt->ctx, opt->dev_grads,
                                     (size_t)opt->grad_buffer_numel * sizeof(float));
}

mtopt_status_t mtopt_optimizer_get_info(const mtopt_optimizer_t *opt,
                                        mtopt_optimizer_info_t *info) {
  static const char fn[] = "mtopt_optimizer_get_info";
  CHECK(check_opt(opt, fn));
  if (!info || info->struct_size < INFO_MIN_SIZE || info->struct_size > 4096)
    return mtopt__error(opt->ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: info is NULL or info.struct_size is not a known size "
                        "(initialise with MTOPT_OPTIMIZER_INFO_INIT)",
                        fn);
  info->num_tensors = opt->plan.num_tensors;
  info->num_chunks = opt->plan.num_chunks;
  info->chunk_size = opt->plan.chunk_size;
  info->total_numel = opt->total_numel;
  info->state_bytes = opt->state_bytes;
  /* One launch per pass (on the CPU, one parallel loop per pass). */
  mtopt__pass_t passes[3];
  info->launches_per_step = step_passes(&opt->plan, passes);
  info->bytes_per_param = bytes_per_param(&opt->plan, state_buffers(&opt->config));
  return MTOPT_STATUS_SUCCESS;
}

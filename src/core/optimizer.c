/* Optimizers: the one-time build of the plan (chunk table, state slab,
 * gradient buffer, hyperparameter block), the step, destroy, and the
 * optimizer part of the core's internal interface. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

#define CONFIG_MIN_SIZE (offsetof(mtopt_optimizer_config_t, chunk_size) + sizeof(int64_t))

/* The numeric copies in common/plan.h that device code reads. */
_Static_assert(MTOPT__KIND_ADAMW == MTOPT_OPTIMIZER_ADAMW, "kind");
_Static_assert(MTOPT__KIND_ADAM == MTOPT_OPTIMIZER_ADAM, "kind");
_Static_assert(MTOPT__KIND_SGD == MTOPT_OPTIMIZER_SGD, "kind");
_Static_assert(MTOPT__KIND_LAMB == MTOPT_OPTIMIZER_LAMB, "kind");
_Static_assert(MTOPT__FLAG_NO_WEIGHT_DECAY == MTOPT_TENSOR_NO_WEIGHT_DECAY, "flag");

mtopt_status_t mtopt__optimizer_config_read(mtopt_context_t *ctx, const char *fn,
                                            const mtopt_optimizer_config_t *in,
                                            mtopt_optimizer_config_t *out) {
  /* Config structs grow at the end: a caller built against an older header
   * passes a smaller struct_size, never one below the first release's. */
  if (in->struct_size < CONFIG_MIN_SIZE || in->struct_size > 4096)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: config.struct_size %zu is not a known size (initialise "
                        "with MTOPT_OPTIMIZER_CONFIG_INIT)",
                        fn, in->struct_size);
  CHECK(mtopt__check_api_version(ctx, fn, in->api_version));
  memset(out, 0, sizeof *out);
  memcpy(out, in, in->struct_size < sizeof *out ? in->struct_size : sizeof *out);
  out->struct_size = sizeof *out;
  return mtopt__check_config(ctx, fn, out);
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
    const uintptr_t pb = (uintptr_t)d->numel * (uintptr_t)mtopt__dt_size(d->param_dtype);
    const uintptr_t gb = (uintptr_t)d->numel * (uintptr_t)mtopt__dt_size(d->grad_dtype);
    r[n++] = (range_t){(uintptr_t)d->param, (uintptr_t)d->param + pb, i, 0};
    if (d->grad) r[n++] = (range_t){(uintptr_t)d->grad, (uintptr_t)d->grad + gb, i, 1};
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
  if (mtopt__is_adam_family(c->kind)) return 2;
  return c->momentum > 0.0f ? 1 : 0;
}

/* The tables block: tensors | chunks | groups | hyper | slots, each 256-byte
 * aligned, in one allocation. */
typedef struct {
  size_t tensors, chunks, groups, hyper, gsq, nonfinite, wsq, usq, stats_sum, total;
} table_layout_t;

static table_layout_t layout_tables(int64_t ntensors, int64_t nchunks, int lamb, int defer) {
  table_layout_t L;
  size_t off = 0;
#define PLACE(field, bytes)                                                    \
  L.field = off;                                                               \
  off = MTOPT__ALIGN_UP(off + (size_t)(bytes), 256)
  PLACE(tensors, ntensors * sizeof(mtopt__tensor_rec_t));
  PLACE(chunks, nchunks * sizeof(mtopt__chunk_rec_t));
  PLACE(groups, MTOPT_MAX_GROUPS * sizeof(mtopt__group_rec_t));
  PLACE(hyper, sizeof(mtopt__hyper_t));
  PLACE(gsq, nchunks * sizeof(mtopt__sum_t));
  PLACE(nonfinite, nchunks * sizeof(uint32_t));
  PLACE(wsq, lamb ? nchunks * sizeof(mtopt__sum_t) : 0);
  PLACE(usq, lamb ? nchunks * sizeof(mtopt__sum_t) : 0);
  PLACE(stats_sum, defer ? 2 * sizeof(double) : 0);
#undef PLACE
  L.total = off;
  return L;
}

/* Each tensor against the config and the backend: master weights that fit
 * its dtype, pointers the backend can use, no overlaps. */
static mtopt_status_t check_tensors(mtopt_context_t *ctx, const char *fn,
                                    const mtopt_tensor_list_t *list,
                                    const mtopt_optimizer_config_t *c) {
  for (int64_t i = 0; i < list->count; i++) {
    const mtopt_tensor_desc_t *d = &list->items[i].desc;
    if (c->master_weights == MTOPT_MASTER_REMAINDER && d->param_dtype == MTOPT_DTYPE_F16)
      return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                          "%s: tensor %lld '%s': MTOPT_MASTER_REMAINDER needs BF16 (or F32) "
                          "parameters; this one is F16 (use MTOPT_MASTER_F32)",
                          fn, (long long)i, d->name ? d->name : "");
  }
  CHECK(check_overlaps(ctx, list));
  for (int64_t i = 0; i < list->count; i++) {
    const mtopt_tensor_desc_t *d = &list->items[i].desc;
    if (d->numel == 0) continue;
    const size_t pb = (size_t)d->numel * (size_t)mtopt__dt_size(d->param_dtype);
    const size_t gb = (size_t)d->numel * (size_t)mtopt__dt_size(d->grad_dtype);
    CHECK(ctx->ops->check_pointer(ctx, d->param, pb, "param", i));
    if (d->grad) CHECK(ctx->ops->check_pointer(ctx, d->grad, gb, "grad", i));
  }
  return MTOPT_STATUS_SUCCESS;
}

/* MTOPT_MASTER_F32: the masters start as the parameters, exactly (every
 * F16/BF16 value is an fp32 value). Remainders start at zero (the slab is
 * zeroed), which makes the master equal the parameter. Through the host, in
 * pieces, once. */
static mtopt_status_t init_masters(mtopt_optimizer_t *opt) {
  mtopt_context_t *ctx = opt->ctx;
  enum { PIECE = 1 << 18 };
  uint16_t *h = NULL;
  float *f = NULL;
  mtopt_status_t st = MTOPT_STATUS_SUCCESS;
  for (int64_t i = 0; i < opt->list->count && st == MTOPT_STATUS_SUCCESS; i++) {
    const mtopt__tensor_rec_t *t = &opt->tensors_host[i];
    if (t->mmode != MTOPT__MASTER_F32 || t->numel == 0) continue;
    if (!h) {
      h = malloc(PIECE * sizeof *h);
      f = malloc(PIECE * sizeof *f);
      if (!h || !f) {
        st = mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY,
                          "mtopt_optimizer_create: host allocation failed");
        break;
      }
    }
    for (int64_t a = 0; a < t->numel && st == MTOPT_STATUS_SUCCESS; a += PIECE) {
      const int64_t len = t->numel - a < PIECE ? t->numel - a : PIECE;
      st = ctx->ops->download(ctx, h, (const uint16_t *)t->w + a, (size_t)len * sizeof *h);
      for (int64_t k = 0; k < len && st == MTOPT_STATUS_SUCCESS; k++) f[k] = mtopt__ld(h, t->wdt, k);
      if (st == MTOPT_STATUS_SUCCESS)
        st = ctx->ops->upload(ctx, (float *)t->mw + a, f, (size_t)len * sizeof *f);
    }
  }
  free(h);
  free(f);
  return st;
}

static void release_all(mtopt_optimizer_t *opt) {
  mtopt_context_t *ctx = opt->ctx;
  if (opt->dev_tables) ctx->ops->release(ctx, opt->dev_tables);
  if (opt->dev_state) ctx->ops->release(ctx, opt->dev_state);
  if (opt->dev_segments) ctx->ops->release(ctx, opt->dev_segments);
  for (int k = 0; k < MTOPT__NUM_DTYPES; k++)
    if (opt->dev_grads[k]) ctx->ops->release(ctx, opt->dev_grads[k]);
  free(opt->tensors_host);
  free(opt);
}

mtopt_status_t mtopt_optimizer_create(mtopt_context_t *ctx, mtopt_tensor_list_t *list,
                                      const mtopt_optimizer_config_t *config,
                                      mtopt_optimizer_t **out) {
  const mtopt__optimizer_options_t none = {0};
  return mtopt__optimizer_create(ctx, list, config, &none, out);
}

mtopt_status_t mtopt__optimizer_create(mtopt_context_t *ctx, mtopt_tensor_list_t *list,
                                       const mtopt_optimizer_config_t *config,
                                       const mtopt__optimizer_options_t *options,
                                       mtopt_optimizer_t **out) {
  static const char fn[] = "mtopt_optimizer_create";
  if (!ctx || !list || !config || !out)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                        !ctx ? "ctx" : !list ? "list" : !config ? "config" : "out");
  if (list->ctx != ctx)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: the tensor list belongs to another context", fn);
  /* Two optimizers over the same weights would step them twice. */
  if (list->users > 0)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_USAGE,
                        "%s: the tensor list is already used by an optimizer (its weights "
                        "would be stepped twice); make a new list",
                        fn);
  mtopt_optimizer_config_t cfg;
  CHECK(mtopt__optimizer_config_read(ctx, fn, config, &cfg));
  CHECK(check_tensors(ctx, fn, list, &cfg));

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
  opt->list = list;
  opt->config = cfg;
  const mtopt_optimizer_config_t *c = &opt->config;

  for (int64_t i = 0; i < n; i++) numel[i] = list->items[i].desc.numel;
  if (opt->config.chunk_size == 0) opt->config.chunk_size = mtopt__auto_chunk_size(numel, n);
  const int64_t nchunks = mtopt__chunk_table(numel, n, options->order, c->chunk_size, first, nch, NULL);
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
  mtopt__chunk_table(numel, n, options->order, c->chunk_size, first, nch, chunks);

  /* The records: chunk facts first, then (mtopt__layout) the library's
   * arrays, counted, allocated, placed. */
  const int nstate = state_buffers(c);
  opt->num_state = nstate;
  int64_t total = 0;
  int all_f32 = c->state_dtype == MTOPT_DTYPE_F32;
  int narrow_weights = c->master_weights == MTOPT_MASTER_NONE;
  for (int64_t i = 0; i < n; i++) {
    const mtopt_tensor_desc_t *d = &list->items[i].desc;
    total += d->numel;
    all_f32 = all_f32 && d->param_dtype == MTOPT_DTYPE_F32 && d->grad_dtype == MTOPT_DTYPE_F32;
    narrow_weights = narrow_weights && d->param_dtype != MTOPT_DTYPE_F32;
    opt->tensors_host[i].first_chunk = first[i];
    opt->tensors_host[i].num_chunks = nch[i];
  }
  opt->total_numel = total;
  opt->all_f32 = all_f32;
  if (!all_f32 && !ctx->ops->mixed_precision) {
    st = mtopt__error(ctx, MTOPT_STATUS_NOT_SUPPORTED,
                      "%s: the %s backend steps F32 tensors with F32 state only (this table "
                      "has F16/BF16 parameters, gradients or state)",
                      fn, ctx->ops->name);
    goto fail;
  }
  /* Segments (core/segments.c) for AdamW, Adam and SGD over all-F32 tables,
   * unless the caller keeps the tensors (the distributed layer). */
  const int runs = !(all_f32 && c->kind != MTOPT_OPTIMIZER_LAMB && !options->keep_tensors)
                       ? MTOPT__RUNS_NONE
                   : mtopt__small_tensors(numel, n)         ? MTOPT__RUNS_GAPS
                                                            : MTOPT__RUNS_BACK_TO_BACK;
  mtopt__layout_t size;
  mtopt__layout(list, c, nstate, options->order, runs, NULL, NULL, NULL, &size);
  opt->state_bytes = size.slab;

  const int lamb = c->kind == MTOPT_OPTIMIZER_LAMB;
  const int use_stats = c->max_grad_norm > 0.0f || mtopt__uses_loss_scale(c) || c->skip_nonfinite;
  const int defer = options->defer_stats && use_stats;
  const table_layout_t L = layout_tables(n, nchunks, lamb, defer);
  CHECK_GOTO(ctx->ops->alloc(ctx, L.total, &opt->dev_tables), st, fail);
  if (size.slab > 0) CHECK_GOTO(ctx->ops->alloc(ctx, (size_t)size.slab, &opt->dev_state), st, fail);
  for (int k = 0; k < MTOPT__NUM_DTYPES; k++) {
    opt->grad_bytes[k] = size.grads[k];
    if (size.grads[k] > 0)
      CHECK_GOTO(ctx->ops->alloc(ctx, (size_t)size.grads[k], &opt->dev_grads[k]), st, fail);
  }
  char *gbufs[MTOPT__NUM_DTYPES];
  for (int k = 0; k < MTOPT__NUM_DTYPES; k++) gbufs[k] = opt->dev_grads[k];
  mtopt__layout(list, c, nstate, options->order, runs, opt->dev_state, gbufs, opt->tensors_host,
                &size);
  if (options->sr_tensor)
    for (int64_t i = 0; i < n; i++) {
      opt->tensors_host[i].sr_tensor = options->sr_tensor[i];
      opt->tensors_host[i].sr_elem0 = options->sr_elem0[i];
    }
  CHECK_GOTO(init_masters(opt), st, fail);
  mtopt__init_hyper(&opt->hyper_host, c);

  char *base = opt->dev_tables;
  CHECK_GOTO(ctx->ops->upload(ctx, base + L.tensors, opt->tensors_host,
                              (size_t)n * sizeof(mtopt__tensor_rec_t)), st, fail);
  CHECK_GOTO(ctx->ops->upload(ctx, base + L.chunks, chunks,
                              (size_t)nchunks * sizeof(mtopt__chunk_rec_t)), st, fail);
  memcpy(opt->groups_host, list->groups, sizeof opt->groups_host);
  CHECK_GOTO(ctx->ops->upload(ctx, base + L.groups, opt->groups_host, sizeof opt->groups_host),
             st, fail);
  CHECK_GOTO(ctx->ops->upload(ctx, base + L.hyper, &opt->hyper_host, sizeof opt->hyper_host),
             st, fail);

  mtopt__plan_t *p = &opt->plan;
  p->tensors = (const mtopt__tensor_rec_t *)(base + L.tensors);
  p->chunks = (const mtopt__chunk_rec_t *)(base + L.chunks);
  p->groups = (const mtopt__group_rec_t *)(base + L.groups);
  p->hyper = (mtopt__hyper_t *)(base + L.hyper);
  p->slot_gsq = (mtopt__sum_t *)(base + L.gsq);
  p->slot_nonfinite = (uint32_t *)(base + L.nonfinite);
  p->slot_wsq = lamb ? (mtopt__sum_t *)(base + L.wsq) : NULL;
  p->slot_usq = lamb ? (mtopt__sum_t *)(base + L.usq) : NULL;
  p->stats_sum = defer ? (double *)(base + L.stats_sum) : NULL;
  p->num_tensors = n;
  p->num_chunks = nchunks;
  p->num_elements = total;
  p->chunk_size = c->chunk_size;
  p->mean_chunk_len = nchunks ? total / nchunks : 0;
  p->kind = (int32_t)c->kind;
  p->use_stats = use_stats;
  p->defer_stats = defer;
  p->all_f32 = all_f32;
  p->stochastic = c->rounding == MTOPT_ROUNDING_STOCHASTIC;
  p->bf16_state = c->state_dtype == MTOPT_DTYPE_BF16;
  p->narrow_weights = narrow_weights;
  opt->step_plan = p;
  if (runs)
    CHECK_GOTO(mtopt__build_step_plan(opt, cfg.chunk_size, runs == MTOPT__RUNS_GAPS), st, fail);

  free(numel);
  free(first);
  free(nch);
  free(chunks);
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

/* Destroy always frees the optimizer; a non-SUCCESS status reports a failure
 * of earlier asynchronous work (steps in flight on CUDA), which is waited for
 * first. */
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

mtopt_status_t mtopt__check_opt(const mtopt_optimizer_t *opt, const char *fn) {
  if (!opt) return mtopt__error(NULL, MTOPT_STATUS_INVALID_ARGUMENT, "%s: opt is NULL", fn);
  return MTOPT_STATUS_SUCCESS;
}

/* Every pass of the step over all chunks of opt->step_plan (the segments'
 * where tensors merge). A plan with no chunks still runs its passes: the step
 * counts, as in torch. A plan that defers its statistics (built for the
 * distributed layer) finishes them locally here. */
mtopt_status_t mtopt_optimizer_step(mtopt_optimizer_t *opt) {
  CHECK(mtopt__check_opt(opt, "mtopt_optimizer_step"));
  mtopt__pass_t passes[MTOPT__MAX_PASSES];
  const int n = mtopt__step_passes(&opt->plan, passes);
  for (int i = 0; i < n; i++) {
    CHECK(mtopt__optimizer_run_pass(opt, passes[i], 0, opt->step_plan->num_chunks, NULL));
    if (passes[i] == MTOPT__PASS_STATS && opt->plan.defer_stats)
      CHECK(mtopt__optimizer_finish_stats(opt));
  }
  return MTOPT_STATUS_SUCCESS;
}

/* ---- internal_api.h ---- */

mtopt_context_t *mtopt__optimizer_context(const mtopt_optimizer_t *opt) { return opt->ctx; }

const mtopt__plan_t *mtopt__optimizer_plan(const mtopt_optimizer_t *opt) { return &opt->plan; }

const mtopt__tensor_rec_t *mtopt__optimizer_tensor(const mtopt_optimizer_t *opt, int64_t i) {
  return &opt->tensors_host[i];
}

mtopt_status_t mtopt__optimizer_run_pass(mtopt_optimizer_t *opt, mtopt__pass_t pass,
                                         int64_t c0, int64_t c1, void *const *stream) {
  return opt->ctx->ops->run_pass(opt->ctx, opt->step_plan, pass, c0, c1, stream);
}

mtopt_status_t mtopt__optimizer_finish_stats(mtopt_optimizer_t *opt) {
  if (!opt->plan.stats_sum)
    return mtopt__error(opt->ctx, MTOPT_STATUS_INTERNAL,
                        "finish_stats: the plan does not defer its statistics");
  return opt->ctx->ops->finish_stats(opt->ctx, &opt->plan);
}

mtopt_status_t mtopt__optimizer_reset_pass(mtopt_optimizer_t *opt) {
  const uint32_t zero = 0;
  return opt->ctx->ops->write_ordered(opt->ctx, &opt->plan.hyper->chunks_done, &zero,
                                      sizeof zero);
}

void mtopt__optimizer_detach_grads(mtopt_optimizer_t *opt) {
  for (int k = 0; k < MTOPT__NUM_DTYPES; k++) opt->dev_grads[k] = NULL;
}

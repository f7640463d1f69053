/* The distributed optimizer (mtopt_dist.h): create, destroy and accessors.
 * Create lays the buckets out (bucket_layout.h), builds the inner optimizer
 * over every tensor (zero_stage 0) or over this rank's pieces (ZeRO-1), and
 * checks that every rank built the same layout (rank_check.c); the step is
 * epilogue.c's. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "dist_internal.h"

int64_t mtopt__dist_min_segment_chunks = 256;

static void dist_free(mtopt_dist_optimizer_t *d) {
  mtopt_context_t *ctx = d->ctx;
  if (d->opt) mtopt_optimizer_destroy(d->opt);
  if (d->inner_list) mtopt_tensor_list_destroy(d->inner_list);
  for (int dt = 0; dt < MTOPT__NUM_DTYPES; dt++) {
    if (d->lay.own) mtopt__context_free(ctx, d->gbuf[dt]);
    mtopt__context_free(ctx, d->gf32[dt]);
  }
  mtopt__context_free(ctx, d->shard);
  mtopt__context_free(ctx, d->wide);
  if (d->slots) d->ops->slots_destroy(d->slots);
  mtopt__bucket_layout_free(&d->lay);
  free(d->param);
  free(d->marked);
  free(d);
}

/* The chunks of inner tensors [0, n), as the layout takes them. */
static mtopt_status_t chunk_facts(mtopt_dist_optimizer_t *d, const char *fn, int64_t n,
                                  int64_t **first, int64_t **count) {
  *first = malloc((size_t)(n > 0 ? n : 1) * sizeof **first);
  *count = malloc((size_t)(n > 0 ? n : 1) * sizeof **count);
  if (!*first || !*count)
    return mtopt__error(d->ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: malloc failed", fn);
  for (int64_t i = 0; i < n; i++) {
    const mtopt__tensor_rec_t *r = mtopt__optimizer_tensor(d->opt, i);
    (*first)[i] = r->first_chunk;
    (*count)[i] = r->num_chunks;
  }
  return MTOPT_STATUS_SUCCESS;
}

/* Backend memory of `bytes` (none for 0). */
static mtopt_status_t alloc_bytes(mtopt_context_t *ctx, int64_t bytes, char **out) {
  return bytes > 0 ? mtopt__context_alloc(ctx, (size_t)bytes, (void **)out) : MTOPT_STATUS_SUCCESS;
}

/* Where the layer owns the gradient buffers (lay.own): the buffers of the
 * layout (the gradients, their fp32 copies, ZeRO-1's shard and staging), and
 * the inner optimizer over copies of the list's tensors. ZeRO-1: this rank's
 * pieces, their gradients in the shard buffer, rounding stochastically as
 * the tensors they are part of. zero_stage 0: every tensor, in the layout's
 * chunk order, reading its gradient where its reduction leaves it. Either
 * way a tensor of a bucket reduced in fp32 has an F32 gradient. */
static mtopt_status_t build_own(mtopt_dist_optimizer_t *d, const char *fn) {
  mtopt_context_t *ctx = d->ctx;
  const mtopt__bucket_layout_t *L = &d->lay;
  for (int dt = 0; dt < MTOPT__NUM_DTYPES; dt++) {
    CHECK(alloc_bytes(ctx, L->gbuf_numel[dt] * mtopt__dt_size(dt), &d->gbuf[dt]));
    if (L->f32_copy[dt]) CHECK(alloc_bytes(ctx, L->gbuf_numel[dt] * 4, &d->gf32[dt]));
  }
  CHECK(alloc_bytes(ctx, L->shard_bytes, &d->shard));
  CHECK(alloc_bytes(ctx, L->wide_bytes, &d->wide));
  CHECK(mtopt_tensor_list_create(ctx, &d->inner_list));
  mtopt__tensor_list_copy_groups(d->inner_list, d->list);
  const int64_t n = d->zero ? L->npieces : L->nt;
  const size_t n1 = (size_t)(n > 0 ? n : 1);
  int32_t *sr_tensor = malloc(n1 * sizeof *sr_tensor);
  int64_t *sr_elem0 = malloc(n1 * sizeof *sr_elem0);
  mtopt_status_t st = MTOPT_STATUS_SUCCESS;
  if (!sr_tensor || !sr_elem0)
    st = mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: malloc failed", fn);
  for (int64_t p = 0; p < n && st == MTOPT_STATUS_SUCCESS; p++) {
    const mtopt__piece_t q = d->zero ? L->pieces[p] : (mtopt__piece_t){p, 0, L->numel[p], 0};
    const int k = L->tbucket[q.tensor];
    mtopt_tensor_desc_t desc = *mtopt__tensor_list_desc(d->list, q.tensor);
    desc.struct_size = sizeof desc;
    desc.grad_dtype = (mtopt_dtype_t)L->b[k].rdt;
    if (d->zero) {
      desc.param = d->param[q.tensor] + q.start * mtopt__dt_size(desc.param_dtype);
      desc.grad = d->shard + q.shard_pos;
    } else if (q.len) {
      desc.grad = mtopt__dist_reduced_at(d, k, L->goff[q.tensor]);
    }
    desc.numel = q.len;
    sr_tensor[p] = (int32_t)q.tensor;
    sr_elem0[p] = q.start;
    st = mtopt_tensor_list_add(d->inner_list, &desc, NULL);
  }
  /* ZeRO-1: each rank holds a shard, so the global norm needs every rank's
   * sums; its pieces are in bucket order already. zero_stage 0: the keys are
   * the default ones, (index, 0). */
  const mtopt__optimizer_options_t opts = {.defer_stats = d->zero,
                                           .order = d->zero ? NULL : L->order,
                                           .sr_tensor = sr_tensor,
                                           .sr_elem0 = sr_elem0,
                                           .keep_tensors = 1};
  if (st == MTOPT_STATUS_SUCCESS)
    st = mtopt__optimizer_create(ctx, d->inner_list, &d->config, &opts, &d->opt);
  free(sr_tensor);
  free(sr_elem0);
  return st;
}

/* zero_stage 0 without fp32 reductions: the inner optimizer owns the
 * buffers (one per gradient dtype, in the layout's chunk order, with
 * alignment padding); the layout takes its offsets. */
static mtopt_status_t build_zero0(mtopt_dist_optimizer_t *d, const char *fn) {
  const mtopt__optimizer_options_t local = {.order = d->lay.order, .keep_tensors = 1};
  CHECK(mtopt__optimizer_create(d->ctx, d->list, &d->config, &local, &d->opt));
  int64_t numel[MTOPT__NUM_DTYPES];
  for (int dt = 0; dt < MTOPT__NUM_DTYPES; dt++) {
    void *p = NULL;
    (void)mtopt_optimizer_get_grad_buffer_dtype(d->opt, (mtopt_dtype_t)dt, &p, &numel[dt]);
    d->gbuf[dt] = p;
  }
  const int64_t nt = d->lay.nt;
  int64_t *off = malloc((size_t)(nt > 0 ? nt : 1) * sizeof *off);
  if (!off) return mtopt__error(d->ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: malloc failed", fn);
  for (int64_t i = 0; i < nt; i++) {
    const int dt = d->lay.gdt[i];
    off[i] = d->lay.numel[i] > 0
                 ? ((char *)mtopt__optimizer_tensor(d->opt, i)->g - d->gbuf[dt]) / mtopt__dt_size(dt)
                 : 0;
  }
  mtopt__bucket_layout_set_grads(&d->lay, off, numel);
  free(off);
  return MTOPT_STATUS_SUCCESS;
}

/* The layout, the inner optimizer and its buffers, the segments. */
static mtopt_status_t build(mtopt_dist_optimizer_t *d, const char *fn) {
  mtopt_comm_t *comm = d->comm;
  const int64_t nt = mtopt__tensor_list_size(d->list);
  d->param = calloc((size_t)(nt > 0 ? nt : 1), sizeof *d->param);
  int64_t *numel = calloc((size_t)(nt > 0 ? nt : 1), sizeof *numel);
  int *dts = calloc((size_t)(nt > 0 ? nt : 1) * 2, sizeof *dts);
  if (!d->param || !numel || !dts) {
    free(numel);
    free(dts);
    return mtopt__error(d->ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: calloc failed", fn);
  }
  int *gdt = dts, *pdt = dts + (nt > 0 ? nt : 1);
  for (int64_t i = 0; i < nt; i++) {
    const mtopt_tensor_desc_t *t = mtopt__tensor_list_desc(d->list, i);
    numel[i] = t->numel;
    d->param[i] = t->param;
    gdt[i] = (int)t->grad_dtype;
    pdt[i] = (int)t->param_dtype;
  }
  const mtopt__bucket_layout_args_t a = {
      .num_tensors = nt,
      .numel = numel,
      .param = (const void *const *)d->param,
      .gdt = gdt,
      .pdt = pdt,
      .first_bucket_bytes = comm->cfg.first_bucket_bytes,
      .bucket_bytes = comm->cfg.bucket_bytes,
      .zero_stage = d->zero,
      .reduce_f32 = comm->cfg.reduce_f32,
      .world = comm->world,
      .rank = comm->rank,
  };
  const mtopt_status_t st = mtopt__bucket_layout_create(d->ctx, fn, &a, &d->lay);
  free(numel);
  free(dts);
  CHECK(st);
  d->marked = calloc((size_t)(d->lay.nb > 0 ? d->lay.nb : 1), 1);
  if (!d->marked) return mtopt__error(d->ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: calloc failed", fn);
  CHECK(d->lay.own ? build_own(d, fn) : build_zero0(d, fn));
  d->plan = mtopt__optimizer_plan(d->opt);
  /* Inner tensors: the list's (zero_stage 0) or the pieces (1). */
  int64_t *first = NULL, *count = NULL;
  mtopt_status_t sst = chunk_facts(d, fn, d->zero ? d->lay.npieces : nt, &first, &count);
  if (sst == MTOPT_STATUS_SUCCESS)
    sst = mtopt__bucket_layout_segments(d->ctx, fn, &d->lay, first, count, d->plan->num_chunks,
                                        d->plan->chunk_size, mtopt__dist_min_segment_chunks);
  free(first);
  free(count);
  return sst;
}

mtopt_status_t mtopt_dist_optimizer_create(mtopt_comm_t *comm, mtopt_tensor_list_t *list,
                                           const mtopt_optimizer_config_t *config,
                                           mtopt_dist_optimizer_t **out) {
  static const char fn[] = "mtopt_dist_optimizer_create";
  if (!comm || !list || !config || !out)
    return mtopt__error(comm ? comm->ctx : NULL, MTOPT_STATUS_INVALID_ARGUMENT, "%s: %s is NULL",
                        fn, !comm ? "comm" : !list ? "list" : !config ? "config" : "out");
  mtopt_context_t *ctx = comm->ctx;
  if (mtopt__tensor_list_context(list) != ctx)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: the tensor list belongs to another context than the "
                        "communicator",
                        fn);
  mtopt_optimizer_config_t cfg;
  CHECK(mtopt__optimizer_config_read(ctx, fn, config, &cfg));
  for (int64_t i = 0; i < mtopt__tensor_list_size(list); i++) {
    const mtopt_tensor_desc_t *t = mtopt__tensor_list_desc(list, i);
    if (t->grad)
      return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                          "%s: tensor %lld '%s' was added with its own gradient; the "
                          "distributed optimizer needs grad == NULL (its buckets are "
                          "ranges of the library's contiguous gradient buffer)",
                          fn, (long long)i, t->name ? t->name : "");
  }
  if (mtopt__tensor_list_in_use(list))
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_USAGE,
                        "%s: the tensor list is already used by an optimizer", fn);
  if (comm->cfg.zero_stage == 1 && cfg.kind == MTOPT_OPTIMIZER_LAMB)
    return mtopt__error(ctx, MTOPT_STATUS_NOT_SUPPORTED,
                        "%s: LAMB with zero_stage 1 is not supported: its trust ratio needs "
                        "each tensor's norms, and with ZeRO-1 a tensor's elements are "
                        "spread over ranks (use zero_stage 0)",
                        fn);

  mtopt_status_t st = MTOPT_STATUS_SUCCESS;
  mtopt_dist_optimizer_t *d = calloc(1, sizeof *d);
  if (!d) return mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: calloc failed", fn);
  d->comm = comm;
  d->ctx = ctx;
  d->ops = comm->ops;
  d->tr = comm->tr;
  d->list = list;
  d->zero = comm->cfg.zero_stage;
  d->config = cfg;
  CHECK_GOTO(build(d, fn), st, fail);
  for (int s = 0; s < d->lay.ns; s++) {
    const int k = d->lay.seg[s].bucket;
    const int64_t cnt = d->zero ? d->lay.b[k].slice : d->lay.seg[s].numel;
    if (cnt > INT_MAX) {
      st = mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: bucket %d needs a collective of %lld elements, over the "
                        "2^31 - 1 that MPI counts hold (use a smaller bucket_bytes%s)",
                        fn, k, (long long)cnt, d->zero ? ", or zero_stage 0" : "");
      goto fail;
    }
  }
  CHECK_GOTO(d->ops->slots_create(d->tr, d->lay.ns, d->lay.nb, &d->slots), st, fail);
  /* Every rank reaches this point with the same arguments (or fails above on
   * every rank alike), so the check's collectives always match. */
  CHECK_GOTO(mtopt__dist_rank_agreement(d, fn), st, fail);
  if (d->inner_list) mtopt__tensor_list_freeze(list); /* else the inner optimizer did */
  comm->users++;
  *out = d;
  return MTOPT_STATUS_SUCCESS;
fail:
  dist_free(d);
  return st;
}

/* Collectives in flight point into our buffers: the transport waits for them
 * (bounded) before the buffers go. Ones that never finish leave the memory
 * leaked, not freed under the transport's feet. */
mtopt_status_t mtopt_dist_optimizer_destroy(mtopt_dist_optimizer_t *d) {
  if (!d) return MTOPT_STATUS_SUCCESS;
  mtopt_status_t st = MTOPT_STATUS_SUCCESS;
  int pending = 0;
  const mtopt_status_t dst = d->ops->drain(d->slots, &pending);
  /* A failure that an earlier call already reported is not reported again. */
  if (dst != MTOPT_STATUS_SUCCESS && !d->broken) st = dst;
  d->comm->users--;
  if (d->inner_list) mtopt__tensor_list_unfreeze(d->list);
  if (pending) {
    /* The objects go; the buffers a collective may still write stay
     * allocated. */
    mtopt_context_t *ctx = d->ctx;
    if (d->lay.own)
      memset(d->gbuf, 0, sizeof d->gbuf);
    else
      mtopt__optimizer_detach_grads(d->opt);
    memset(d->gf32, 0, sizeof d->gf32);
    d->shard = d->wide = NULL;
    dist_free(d);
    return mtopt__error(ctx, MTOPT_STATUS_COMM_ERROR,
                        "mtopt_dist_optimizer_destroy: %d collective%s never finished; their "
                        "buffers are leaked rather than freed",
                        pending, pending == 1 ? "" : "s");
  }
  dist_free(d);
  return st;
}

mtopt_status_t mtopt__dist_check(const mtopt_dist_optimizer_t *d, const char *fn) {
  if (!d) return mtopt__error(NULL, MTOPT_STATUS_INVALID_ARGUMENT, "%s: dopt is NULL", fn);
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt__dist_check_bucket(const mtopt_dist_optimizer_t *d, const char *fn, int b) {
  if (b < 0 || b >= d->lay.nb)
    return mtopt__error(d->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: bucket %d out of range [0, %d)",
                        fn, b, d->lay.nb);
  return MTOPT_STATUS_SUCCESS;
}

static mtopt_status_t check_tensor(const mtopt_dist_optimizer_t *d, const char *fn, int64_t t) {
  if (t < 0 || t >= d->lay.nt)
    return mtopt__error(d->ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: tensor %lld out of range [0, %lld)", fn, (long long)t,
                        (long long)d->lay.nt);
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_dist_optimizer_get_optimizer(mtopt_dist_optimizer_t *d,
                                                  mtopt_optimizer_t **opt) {
  static const char fn[] = "mtopt_dist_optimizer_get_optimizer";
  CHECK(mtopt__dist_check(d, fn));
  if (!opt) return mtopt__error(d->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: opt is NULL", fn);
  *opt = d->opt;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_dist_optimizer_get_grad(mtopt_dist_optimizer_t *d, int64_t tensor,
                                             void **ptr) {
  static const char fn[] = "mtopt_dist_optimizer_get_grad";
  CHECK(mtopt__dist_check(d, fn));
  if (!ptr) return mtopt__error(d->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: ptr is NULL", fn);
  CHECK(check_tensor(d, fn, tensor));
  const int dt = d->lay.gdt[tensor];
  *ptr = d->lay.numel[tensor] ? mtopt__dist_grad_at(d, dt, d->lay.goff[tensor]) : NULL;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_dist_optimizer_get_grad_buffer_dtype(mtopt_dist_optimizer_t *d,
                                                          mtopt_dtype_t dtype, void **ptr,
                                                          int64_t *numel) {
  static const char fn[] = "mtopt_dist_optimizer_get_grad_buffer_dtype";
  CHECK(mtopt__dist_check(d, fn));
  if (!ptr || !numel)
    return mtopt__error(d->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                        ptr ? "numel" : "ptr");
  if ((unsigned)dtype >= MTOPT__NUM_DTYPES)
    return mtopt__error(d->ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: %d is not a gradient dtype (F32, F16, BF16)", fn, (int)dtype);
  *ptr = d->gbuf[dtype];
  *numel = d->lay.gbuf_numel[dtype];
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_dist_optimizer_get_grad_buffer(mtopt_dist_optimizer_t *d, void **ptr,
                                                    int64_t *numel) {
  static const char fn[] = "mtopt_dist_optimizer_get_grad_buffer";
  CHECK(mtopt__dist_check(d, fn));
  if (!ptr || !numel)
    return mtopt__error(d->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                        ptr ? "numel" : "ptr");
  int found = MTOPT__DT_F32;
  for (int dt = 0, n = 0; dt < MTOPT__NUM_DTYPES; dt++) {
    if (!d->gbuf[dt]) continue;
    if (n++)
      return mtopt__error(d->ctx, MTOPT_STATUS_INVALID_USAGE,
                          "%s: the gradients have several dtypes, one buffer each: use "
                          "mtopt_dist_optimizer_get_grad_buffer_dtype",
                          fn);
    found = dt;
  }
  return mtopt_dist_optimizer_get_grad_buffer_dtype(d, (mtopt_dtype_t)found, ptr, numel);
}

mtopt_status_t mtopt_dist_optimizer_zero_grad(mtopt_dist_optimizer_t *d) {
  CHECK(mtopt__dist_check(d, "mtopt_dist_optimizer_zero_grad"));
  for (int dt = 0; dt < MTOPT__NUM_DTYPES; dt++)
    if (d->gbuf[dt])
      CHECK(mtopt__context_zero(d->ctx, d->gbuf[dt],
                                (size_t)d->lay.gbuf_numel[dt] * mtopt__dt_size(dt)));
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_dist_get_bucket_count(const mtopt_dist_optimizer_t *d, int *count) {
  CHECK(mtopt__dist_check(d, "mtopt_dist_get_bucket_count"));
  if (!count)
    return mtopt__error(d->ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "mtopt_dist_get_bucket_count: count is NULL");
  *count = d->lay.nb;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_dist_get_bucket(const mtopt_dist_optimizer_t *d, int bucket,
                                     int64_t *first_tensor, int64_t *num_tensors,
                                     int64_t *offset, int64_t *numel) {
  static const char fn[] = "mtopt_dist_get_bucket";
  CHECK(mtopt__dist_check(d, fn));
  CHECK(mtopt__dist_check_bucket(d, fn, bucket));
  const mtopt__bucket_t *b = &d->lay.b[bucket];
  if (first_tensor) *first_tensor = b->first_tensor;
  if (num_tensors) *num_tensors = b->num_tensors;
  if (offset) *offset = b->offset;
  if (numel) *numel = b->numel;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_dist_get_bucket_dtype(const mtopt_dist_optimizer_t *d, int bucket,
                                           mtopt_dtype_t *grad_dtype,
                                           mtopt_dtype_t *param_dtype) {
  static const char fn[] = "mtopt_dist_get_bucket_dtype";
  CHECK(mtopt__dist_check(d, fn));
  CHECK(mtopt__dist_check_bucket(d, fn, bucket));
  if (grad_dtype) *grad_dtype = (mtopt_dtype_t)d->lay.b[bucket].gdt;
  if (param_dtype) *param_dtype = (mtopt_dtype_t)d->lay.b[bucket].pdt;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_dist_get_tensor_bucket(const mtopt_dist_optimizer_t *d, int64_t tensor,
                                            int *bucket) {
  static const char fn[] = "mtopt_dist_get_tensor_bucket";
  CHECK(mtopt__dist_check(d, fn));
  if (!bucket) return mtopt__error(d->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: bucket is NULL", fn);
  CHECK(check_tensor(d, fn, tensor));
  *bucket = d->lay.tbucket[tensor];
  return MTOPT_STATUS_SUCCESS;
}

int mtopt__dist_segment_count(const mtopt_dist_optimizer_t *d) { return d->lay.ns; }

void mtopt__dist_segment(const mtopt_dist_optimizer_t *d, int s, int *bucket, int64_t *offset,
                         int64_t *numel, int64_t *c0, int64_t *c1) {
  const mtopt__segment_t *g = &d->lay.seg[s];
  *bucket = g->bucket;
  *offset = g->offset;
  *numel = g->numel;
  *c0 = g->c0;
  *c1 = g->c1;
}

mtopt_status_t mtopt_dist_optimizer_get_memory(const mtopt_dist_optimizer_t *d,
                                               mtopt_dist_memory_t *mem) {
  static const char fn[] = "mtopt_dist_optimizer_get_memory";
  CHECK(mtopt__dist_check(d, fn));
  if (!mem || mem->struct_size < sizeof *mem)
    return mtopt__error(d->ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: mem is NULL or its struct_size is too small (use "
                        "MTOPT_DIST_MEMORY_INIT)",
                        fn);
  mtopt_optimizer_info_t info = MTOPT_OPTIMIZER_INFO_INIT;
  CHECK(mtopt_optimizer_get_info(d->opt, &info));
  const mtopt__bucket_layout_t *L = &d->lay;
  int64_t params = 0, grads = 0;
  for (int64_t i = 0; i < L->nt; i++) params += L->numel[i];
  for (int dt = 0; dt < MTOPT__NUM_DTYPES; dt++)
    grads += L->gbuf_numel[dt] * (mtopt__dt_size(dt) + (L->f32_copy[dt] ? 4 : 0));
  mem->params = params;
  mem->state_bytes = info.state_bytes;
  mem->grad_bytes = grads;
  mem->shard_bytes = d->zero ? L->shard_bytes + L->wide_bytes : 0;
  return MTOPT_STATUS_SUCCESS;
}

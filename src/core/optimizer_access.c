/* Optimizer accessors: state buffers and master weights, gradients, planning
 * facts. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core.h"

#define INFO_MIN_SIZE (offsetof(mtopt_optimizer_info_t, bytes_per_param) + sizeof(int))

static mtopt_status_t tensor_index(const mtopt_optimizer_t *opt, const char *fn, int64_t t) {
  if (t < 0 || t >= opt->plan.num_tensors)
    return mtopt__error(opt->ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: tensor %lld out of range [0, %lld)", fn, (long long)t,
                        (long long)opt->plan.num_tensors);
  return MTOPT_STATUS_SUCCESS;
}

/* A tensor's buffer `which` and its storage: dtype (MTOPT__DT_*) or, for
 * remainders, -1. */
typedef struct {
  void *ptr;
  int dt;
} buffer_t;

static mtopt_status_t state_buffer(const mtopt_optimizer_t *opt, const char *fn, int64_t t,
                                   mtopt_state_t which, buffer_t *out) {
  CHECK(tensor_index(opt, fn, t));
  const mtopt__tensor_rec_t *r = &opt->tensors_host[t];
  const int adam = mtopt__is_adam_family(opt->config.kind);
  const int sdt = (int)opt->config.state_dtype;
  if (which == MTOPT_STATE_EXP_AVG && adam) {
    *out = (buffer_t){r->s0, sdt};
  } else if (which == MTOPT_STATE_EXP_AVG_SQ && adam) {
    *out = (buffer_t){r->s1, sdt};
  } else if (which == MTOPT_STATE_MOMENTUM && !adam && opt->config.momentum > 0.0f) {
    *out = (buffer_t){r->s0, sdt};
  } else if (which == MTOPT_STATE_MASTER &&
             mtopt__master_mode(&opt->config, (mtopt_dtype_t)r->wdt) != MTOPT__MASTER_NONE) {
    *out = (buffer_t){r->mw, r->mmode == MTOPT__MASTER_F32 ? MTOPT__DT_F32 : -1};
  } else {
    return mtopt__error(opt->ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: tensor %lld has no state buffer %d (EXP_AVG/EXP_AVG_SQ are "
                        "Adam's and LAMB's, MOMENTUM is SGD's with momentum > 0, MASTER an "
                        "F16/BF16 parameter's under master_weights F32 or REMAINDER)",
                        fn, (long long)t, (int)which);
  }
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_optimizer_get_state(mtopt_optimizer_t *opt, int64_t tensor,
                                         mtopt_state_t which, void **ptr) {
  static const char fn[] = "mtopt_optimizer_get_state";
  CHECK(mtopt__check_opt(opt, fn));
  if (!ptr) return mtopt__error(opt->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: ptr is NULL", fn);
  buffer_t b = {NULL, 0};
  CHECK(state_buffer(opt, fn, tensor, which, &b));
  *ptr = b.ptr;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_optimizer_get_state_dtype(const mtopt_optimizer_t *opt, int64_t tensor,
                                               mtopt_state_t which, mtopt_dtype_t *dtype) {
  static const char fn[] = "mtopt_optimizer_get_state_dtype";
  CHECK(mtopt__check_opt(opt, fn));
  if (!dtype)
    return mtopt__error(opt->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: dtype is NULL", fn);
  buffer_t b = {NULL, 0};
  CHECK(state_buffer(opt, fn, tensor, which, &b));
  *dtype = b.dt < 0 ? MTOPT_DTYPE_U16 : (mtopt_dtype_t)b.dt;
  return MTOPT_STATUS_SUCCESS;
}

/* Copies n 16-bit words (or floats) of backend memory to the host as fp32. */
static mtopt_status_t download_f32(mtopt_context_t *ctx, float *dst, const void *src, int dt,
                                   int64_t n) {
  if (dt == MTOPT__DT_F32) return ctx->ops->download(ctx, dst, src, (size_t)n * sizeof(float));
  uint16_t *h = malloc((size_t)n * sizeof *h);
  if (!h) return mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "read_state: malloc failed");
  const mtopt_status_t st = ctx->ops->download(ctx, h, src, (size_t)n * sizeof *h);
  for (int64_t i = 0; st == MTOPT_STATUS_SUCCESS && i < n; i++) dst[i] = mtopt__ld(h, dt, i);
  free(h);
  return st;
}

mtopt_status_t mtopt_optimizer_read_state(mtopt_optimizer_t *opt, int64_t tensor,
                                          mtopt_state_t which, float *host_dst) {
  static const char fn[] = "mtopt_optimizer_read_state";
  CHECK(mtopt__check_opt(opt, fn));
  if (!host_dst)
    return mtopt__error(opt->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: host_dst is NULL", fn);
  buffer_t b = {NULL, 0};
  CHECK(state_buffer(opt, fn, tensor, which, &b));
  const mtopt__tensor_rec_t *r = &opt->tensors_host[tensor];
  const int64_t n = r->numel;
  if (n == 0) return MTOPT_STATUS_SUCCESS;
  if (b.dt >= 0) return download_f32(opt->ctx, host_dst, b.ptr, b.dt, n);
  /* Remainders: the master is the parameter and its remainder together. */
  uint16_t *h = malloc((size_t)n * 2 * sizeof *h);
  if (!h) return mtopt__error(opt->ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: malloc failed", fn);
  mtopt_status_t st = opt->ctx->ops->download(opt->ctx, h, r->w, (size_t)n * sizeof *h);
  if (st == MTOPT_STATUS_SUCCESS)
    st = opt->ctx->ops->download(opt->ctx, h + n, r->mw, (size_t)n * sizeof *h);
  for (int64_t i = 0; st == MTOPT_STATUS_SUCCESS && i < n; i++)
    host_dst[i] = mtopt__join_master(h[i], h[n + i]);
  free(h);
  return st;
}

/* Why host value x cannot be written as a value of buffer `which` whose
 * rounding to nearest into dtype dt must stay finite, or NULL. */
static const char *unstorable(mtopt_state_t which, int dt, float x) {
  if (!isfinite(x)) return "is not finite";
  if (which == MTOPT_STATE_EXP_AVG_SQ && x < 0.0f) return "is negative (a second moment)";
  float h = 0.0f; /* room for one element of any dtype */
  mtopt__st(&h, dt, 0, x, 0, 0u);
  if (!isfinite(mtopt__ld(&h, dt, 0))) return "overflows the dtype it is stored in";
  return NULL;
}

mtopt_status_t mtopt_optimizer_write_state(mtopt_optimizer_t *opt, int64_t tensor,
                                           mtopt_state_t which, const float *host_src) {
  static const char fn[] = "mtopt_optimizer_write_state";
  CHECK(mtopt__check_opt(opt, fn));
  if (!host_src)
    return mtopt__error(opt->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: host_src is NULL", fn);
  buffer_t b = {NULL, 0};
  CHECK(state_buffer(opt, fn, tensor, which, &b));
  mtopt_context_t *ctx = opt->ctx;
  const mtopt__tensor_rec_t *r = &opt->tensors_host[tensor];
  const int64_t n = r->numel;
  const int master = which == MTOPT_STATE_MASTER;
  for (int64_t i = 0; i < n; i++) {
    /* a master's parameter is rounded from it */
    const char *why = unstorable(which, master ? r->wdt : b.dt, host_src[i]);
    if (why)
      return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                          "%s: tensor %lld element %lld: %g %s; nothing written", fn,
                          (long long)tensor, (long long)i, (double)host_src[i], why);
  }
  if (n == 0) return MTOPT_STATUS_SUCCESS;
  /* Converted on the host, written where the step would write: for a master,
   * mtopt__st_weight over host copies of the parameter and the master. */
  const size_t es = b.dt == MTOPT__DT_F32 ? sizeof(float) : sizeof(uint16_t);
  const size_t wes = (size_t)mtopt__dt_size(r->wdt);
  char *h = malloc((size_t)n * (es + (master ? wes : 0)));
  if (!h) return mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: malloc failed", fn);
  mtopt__tensor_rec_t hr = *r;
  hr.mw = h;
  hr.w = (float *)(h + (size_t)n * es);
  for (int64_t i = 0; i < n; i++) {
    if (master)
      mtopt__st_weight(&hr, i, host_src[i], 0, 0u);
    else
      mtopt__st(h, b.dt, i, host_src[i], 0, 0u);
  }
  mtopt_status_t st = ctx->ops->synchronize(ctx);
  if (st == MTOPT_STATUS_SUCCESS) st = ctx->ops->upload(ctx, b.ptr, h, (size_t)n * es);
  if (st == MTOPT_STATUS_SUCCESS && master)
    st = ctx->ops->upload(ctx, r->w, hr.w, (size_t)n * wes);
  free(h);
  return st;
}

mtopt_status_t mtopt_optimizer_get_grad(mtopt_optimizer_t *opt, int64_t tensor, void **ptr) {
  static const char fn[] = "mtopt_optimizer_get_grad";
  CHECK(mtopt__check_opt(opt, fn));
  if (!ptr) return mtopt__error(opt->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: ptr is NULL", fn);
  CHECK(tensor_index(opt, fn, tensor));
  *ptr = opt->tensors_host[tensor].g;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_optimizer_get_grad_buffer_dtype(mtopt_optimizer_t *opt,
                                                     mtopt_dtype_t dtype, void **ptr,
                                                     int64_t *numel) {
  static const char fn[] = "mtopt_optimizer_get_grad_buffer_dtype";
  CHECK(mtopt__check_opt(opt, fn));
  if (!ptr || !numel)
    return mtopt__error(opt->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                        ptr ? "numel" : "ptr");
  if ((unsigned)dtype >= MTOPT__NUM_DTYPES)
    return mtopt__error(opt->ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: %d is not a gradient dtype (F32, F16, BF16)", fn, (int)dtype);
  *ptr = opt->dev_grads[dtype];
  *numel = opt->grad_bytes[dtype] / mtopt__dt_size(dtype);
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_optimizer_get_grad_buffer(mtopt_optimizer_t *opt, void **ptr,
                                               int64_t *numel) {
  static const char fn[] = "mtopt_optimizer_get_grad_buffer";
  CHECK(mtopt__check_opt(opt, fn));
  if (!ptr || !numel)
    return mtopt__error(opt->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                        ptr ? "numel" : "ptr");
  int found = -1;
  for (int k = 0; k < MTOPT__NUM_DTYPES; k++) {
    if (!opt->dev_grads[k]) continue;
    if (found >= 0)
      return mtopt__error(opt->ctx, MTOPT_STATUS_INVALID_USAGE,
                          "%s: the library's gradients have several dtypes, one buffer each: "
                          "use mtopt_optimizer_get_grad_buffer_dtype",
                          fn);
    found = k;
  }
  if (found < 0) {
    *ptr = NULL;
    *numel = 0;
    return MTOPT_STATUS_SUCCESS;
  }
  return mtopt_optimizer_get_grad_buffer_dtype(opt, (mtopt_dtype_t)found, ptr, numel);
}

/* Every gradient the step reads: the contiguous buffers in one call each, and
 * each gradient the user registered, tensor by tensor (as torch's zero_grad). */
mtopt_status_t mtopt_optimizer_zero_grad(mtopt_optimizer_t *opt) {
  CHECK(mtopt__check_opt(opt, "mtopt_optimizer_zero_grad"));
  mtopt_context_t *ctx = opt->ctx;
  for (int k = 0; k < MTOPT__NUM_DTYPES; k++)
    if (opt->dev_grads[k])
      CHECK(ctx->ops->zero_ordered(ctx, opt->dev_grads[k], (size_t)opt->grad_bytes[k]));
  for (int64_t i = 0; i < opt->plan.num_tensors; i++) {
    const mtopt_tensor_desc_t *d = &opt->list->items[i].desc;
    if (d->grad && d->numel > 0)
      CHECK(ctx->ops->zero_ordered(ctx, d->grad,
                                   (size_t)d->numel * (size_t)mtopt__dt_size(d->grad_dtype)));
  }
  return MTOPT_STATUS_SUCCESS;
}

/* Bytes one step moves through memory for one element of a tensor: reads of
 * the weight (the master where there is one, or parameter and remainder), g
 * and state, writes of the weight (master and parameter) and state; one more
 * read of g for the statistics pass; LAMB's second pass reads the weight and
 * both moments again and writes the weight. The one place this is counted:
 * the benchmark reports get_info's figure, and tests/plan.c checks the table
 * in docs/optimizers.md against it. */
static int64_t tensor_bytes(const mtopt__plan_t *p, const mtopt__tensor_rec_t *t, int nstate) {
  const int64_t pe = mtopt__dt_size(t->wdt), g = mtopt__dt_size(t->gdt);
  const int64_t s = mtopt__dt_size(t->sdt) * nstate;
  int64_t wr = pe, ww = pe; /* the weight, read and written */
  if (t->mmode == MTOPT__MASTER_F32) {
    wr = 4;
    ww = 4 + pe;
  } else if (t->mmode == MTOPT__MASTER_REMAINDER) {
    wr = ww = pe + 2;
  }
  int64_t b = wr + g + s + ww + s;
  if (p->kind == MTOPT__KIND_LAMB) /* pass 1 writes no weight; pass 2: r w m v, w w */
    b += -ww + wr + s + ww;
  if (p->use_stats) b += g;
  return b;
}

mtopt_status_t mtopt_optimizer_get_info(const mtopt_optimizer_t *opt,
                                        mtopt_optimizer_info_t *info) {
  static const char fn[] = "mtopt_optimizer_get_info";
  CHECK(mtopt__check_opt(opt, fn));
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
  mtopt__pass_t passes[MTOPT__MAX_PASSES];
  info->launches_per_step = mtopt__step_passes(&opt->plan, passes);
  /* Over all elements, rounded to the nearest byte; exact for a table of one
   * dtype configuration. An empty table counts as one F32 element would. */
  int64_t bytes = 0;
  for (int64_t i = 0; i < opt->plan.num_tensors; i++)
    bytes += opt->tensors_host[i].numel * tensor_bytes(&opt->plan, &opt->tensors_host[i],
                                                       opt->num_state);
  /* A caller built against an older header passes a smaller struct. */
  if (info->struct_size >= offsetof(mtopt_optimizer_info_t, update_tensors) + sizeof(int64_t))
    info->update_tensors = opt->step_plan->num_tensors;
  if (opt->total_numel > 0) {
    info->bytes_per_param = (int)((bytes + opt->total_numel / 2) / opt->total_numel);
  } else {
    mtopt__tensor_rec_t f32;
    memset(&f32, 0, sizeof f32);
    info->bytes_per_param = (int)tensor_bytes(&opt->plan, &f32, opt->num_state);
  }
  return MTOPT_STATUS_SUCCESS;
}

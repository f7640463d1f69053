/* Optimizer accessors: state buffers, gradients, planning facts. */
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

static mtopt_status_t state_ptr(const mtopt_optimizer_t *opt, const char *fn, int64_t t,
                                mtopt_state_t which, float **out) {
  CHECK(tensor_index(opt, fn, t));
  const mtopt__tensor_rec_t *r = &opt->tensors_host[t];
  const int adam = mtopt__is_adam_family(opt->config.kind);
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
  CHECK(mtopt__check_opt(opt, fn));
  if (!ptr) return mtopt__error(opt->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: ptr is NULL", fn);
  float *p = NULL;
  CHECK(state_ptr(opt, fn, tensor, which, &p));
  *ptr = p;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_optimizer_read_state(mtopt_optimizer_t *opt, int64_t tensor,
                                          mtopt_state_t which, float *host_dst) {
  static const char fn[] = "mtopt_optimizer_read_state";
  CHECK(mtopt__check_opt(opt, fn));
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
  CHECK(mtopt__check_opt(opt, fn));
  if (!ptr) return mtopt__error(opt->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: ptr is NULL", fn);
  CHECK(tensor_index(opt, fn, tensor));
  *ptr = opt->tensors_host[tensor].g;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_optimizer_get_grad_buffer(mtopt_optimizer_t *opt, void **ptr,
                                               int64_t *numel) {
  static const char fn[] = "mtopt_optimizer_get_grad_buffer";
  CHECK(mtopt__check_opt(opt, fn));
  if (!ptr || !numel)
    return mtopt__error(opt->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                        ptr ? "numel" : "ptr");
  *ptr = opt->dev_grads;
  *numel = opt->grad_buffer_numel;
  return MTOPT_STATUS_SUCCESS;
}

/* Every gradient the step reads: the contiguous buffer in one call, and each
 * gradient the user registered, tensor by tensor (as torch's zero_grad). */
mtopt_status_t mtopt_optimizer_zero_grad(mtopt_optimizer_t *opt) {
  CHECK(mtopt__check_opt(opt, "mtopt_optimizer_zero_grad"));
  mtopt_context_t *ctx = opt->ctx;
  if (opt->dev_grads)
    CHECK(ctx->ops->zero_ordered(ctx, opt->dev_grads,
                                 (size_t)opt->grad_buffer_numel * sizeof(float)));
  for (int64_t i = 0; i < opt->plan.num_tensors; i++) {
    const mtopt_tensor_desc_t *d = &opt->list->items[i].desc;
    if (d->grad && d->numel > 0)
      CHECK(ctx->ops->zero_ordered(ctx, d->grad, (size_t)d->numel * sizeof(float)));
  }
  return MTOPT_STATUS_SUCCESS;
}

/* Bytes per parameter one step moves through memory (fp32): reads of w, g,
 * state and writes of w, state, plus one more read of g for the statistics
 * pass and LAMB's second pass over w, m, v. The one place this is counted:
 * the benchmark reports get_info's figure, and tests/plan.c checks the table
 * in docs/optimizers.md against it. */
static int bytes_per_param(const mtopt__plan_t *p, int nstate) {
  const int f = (int)sizeof(float);
  int b = f * (2 + nstate) + f * (1 + nstate); /* read w g state, write w state */
  if (p->kind == MTOPT__KIND_LAMB) /* pass 1 writes no w; pass 2 reads w m v, writes w */
    b += -f + f * (1 + nstate) + f;
  if (p->use_stats) b += f;
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
  info->bytes_per_param = bytes_per_param(&opt->plan, opt->num_state);
  return MTOPT_STATUS_SUCCESS;
}

/* The comparison printed once per epoch: one fused step over all six
 * tensors against one optimizer (one step call) per tensor, as a
 * per-parameter loop does it, both on copies of the current weights and
 * gradients, with the training run's configuration (dtypes included). Timed,
 * never trained with. The two are alternated step by step so that both see
 * the same cache and clock state. */
#include "mnist.h"

#define COMPARE_WARMUP 3

static size_t param_bytes(const mlp_t *m, int t) {
  return (size_t)m->numel[t] * mlp_dtype_size(m->dtype);
}

void compare_create(compare_t *c, mlp_t *m, mtopt_context_t *ctx, const options_t *o) {
  for (int t = 0; t < MLP_TENSORS; t++) {
    c->fused_param[t] = m->ops->alloc(m, param_bytes(m, t));
    c->loop_param[t] = m->ops->alloc(m, param_bytes(m, t));
  }
  c->fused_list = make_list(ctx, c->fused_param, m->numel, m->dtype, 0, MLP_TENSORS);
  c->fused = make_optimizer(ctx, o, c->fused_list);
  for (int t = 0; t < MLP_TENSORS; t++) {
    c->loop_list[t] = make_list(ctx, c->loop_param, m->numel, m->dtype, t, 1);
    c->loop[t] = make_optimizer(ctx, o, c->loop_list[t]);
  }
}

void compare_time(compare_t *c, mlp_t *m, double *fused_ms, double *loop_ms) {
  for (int t = 0; t < MLP_TENSORS; t++) {
    void *g_fused = NULL, *g_loop = NULL;
    MTOPT_CHECK(mtopt_optimizer_get_grad(c->fused, t, &g_fused));
    MTOPT_CHECK(mtopt_optimizer_get_grad(c->loop[t], 0, &g_loop));
    m->ops->copy(m, c->fused_param[t], m->param[t], param_bytes(m, t));
    m->ops->copy(m, c->loop_param[t], m->param[t], param_bytes(m, t));
    m->ops->copy(m, g_fused, m->grad[t], param_bytes(m, t));
    m->ops->copy(m, g_loop, m->grad[t], param_bytes(m, t));
  }
  double fused = 0.0, loop = 0.0;
  for (int s = 0; s < COMPARE_WARMUP + COMPARE_STEPS; s++) {
    m->ops->synchronize(m);
    const double t0 = now_s();
    MTOPT_CHECK(mtopt_optimizer_step(c->fused));
    m->ops->synchronize(m);
    const double t1 = now_s();
    for (int t = 0; t < MLP_TENSORS; t++) MTOPT_CHECK(mtopt_optimizer_step(c->loop[t]));
    m->ops->synchronize(m);
    const double t2 = now_s();
    if (s >= COMPARE_WARMUP) {
      fused += t1 - t0;
      loop += t2 - t1;
    }
  }
  *fused_ms = 1e3 * fused / COMPARE_STEPS;
  *loop_ms = 1e3 * loop / COMPARE_STEPS;
}

void compare_destroy(compare_t *c, mlp_t *m) {
  MTOPT_CHECK(mtopt_optimizer_destroy(c->fused));
  MTOPT_CHECK(mtopt_tensor_list_destroy(c->fused_list));
  for (int t = 0; t < MLP_TENSORS; t++) {
    MTOPT_CHECK(mtopt_optimizer_destroy(c->loop[t]));
    MTOPT_CHECK(mtopt_tensor_list_destroy(c->loop_list[t]));
    m->ops->release(m, c->fused_param[t]);
    m->ops->release(m, c->loop_param[t]);
  }
}

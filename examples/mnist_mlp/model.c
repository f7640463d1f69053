/* mnist_mlp's parameters and their optimizer: He initialisation in the
 * chosen dtype, the mtopt tensor list, the optimizer's configuration. */
#include <stdlib.h>
#include <string.h>

#include "mnist.h"

void model_init(mlp_t *m, uint64_t *rng) {
  const size_t es = mlp_dtype_size(m->dtype);
  for (int l = 0; l < MLP_LAYERS; l++) {
    const int fan_in = mlp_dims[l], out = mlp_dims[l + 1];
    m->numel[2 * l] = (int64_t)out * fan_in;
    m->numel[2 * l + 1] = out;
    /* Every rank draws the same numbers from --seed, so the ranks start from
     * the same weights; 16-bit weights are those draws rounded to nearest
     * (and so are the fp32 masters mtopt initialises from them). */
    void *w = malloc((size_t)m->numel[2 * l] * es);
    void *b = calloc((size_t)out, es); /* 0 in every dtype */
    if (!w || !b) MLP_DIE("out of host memory");
    const double sd = sqrt(2.0 / fan_in);
    for (int64_t i = 0; i < m->numel[2 * l]; i++)
      mlp_store(w, m->dtype, i, (float)(sd * rng_normal(rng)));
    m->param[2 * l] = m->ops->alloc(m, (size_t)m->numel[2 * l] * es);
    m->param[2 * l + 1] = m->ops->alloc(m, (size_t)out * es);
    m->ops->upload(m, m->param[2 * l], w, (size_t)m->numel[2 * l] * es);
    m->ops->upload(m, m->param[2 * l + 1], b, (size_t)out * es);
    free(w);
    free(b);
  }
}

mtopt_optimizer_config_t optimizer_config(const options_t *o) {
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  c.kind = o->kind;
  c.lr = o->lr;
  c.weight_decay = o->wd;
  if (o->kind == MTOPT_OPTIMIZER_SGD) c.momentum = 0.9f;
  c.max_grad_norm = o->clip;
  c.loss_scale = o->loss_scale;
  c.dynamic_loss_scale = o->dynamic_loss_scale;
  c.master_weights = o->master;
  c.state_dtype = o->state_dtype;
  c.rounding = o->rounding;
  /* Stochastic rounding's bits follow --seed (the generator has no state:
   * they are a function of seed, step, tensor and element). */
  if (o->rounding == MTOPT_ROUNDING_STOCHASTIC) c.seed = o->seed;
  return c;
}

/* Gradients in the library's contiguous buffer (grad = NULL): the
 * distributed optimizer needs it, its buckets are ranges of it. */
mtopt_tensor_list_t *make_list(mtopt_context_t *ctx, void *const *param, const int64_t *numel,
                               mtopt_dtype_t dt, int first, int count) {
  static const char *names[MLP_TENSORS] = {"W1", "b1", "W2", "b2", "W3", "b3"};
  mtopt_tensor_list_t *list = NULL;
  MTOPT_CHECK(mtopt_tensor_list_create(ctx, &list));
  for (int t = first; t < first + count; t++) {
    mtopt_tensor_desc_t d = MTOPT_TENSOR_DESC_INIT;
    d.param = param[t];
    d.grad = NULL;
    d.numel = numel[t];
    d.param_dtype = dt;
    d.grad_dtype = dt;
    d.flags = (t % 2 == 1) ? MTOPT_TENSOR_NO_WEIGHT_DECAY : 0u; /* b1, b2, b3 */
    d.name = names[t];
    MTOPT_CHECK(mtopt_tensor_list_add(list, &d, NULL));
  }
  return list;
}

mtopt_optimizer_t *make_optimizer(mtopt_context_t *ctx, const options_t *o,
                                  mtopt_tensor_list_t *list) {
  const mtopt_optimizer_config_t cfg = optimizer_config(o);
  mtopt_optimizer_t *opt = NULL;
  const mtopt_status_t st = mtopt_optimizer_create(ctx, list, &cfg, &opt);
  if (st != MTOPT_STATUS_SUCCESS) {
    char flags[160];
    precision_flags(o, flags, sizeof flags);
    /* The library's message starts with the status name. */
    MLP_DIE("mtopt_optimizer_create refused %s: %s", flags, mtopt_last_error());
  }
  return opt;
}

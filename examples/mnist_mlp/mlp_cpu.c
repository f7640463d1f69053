/* The CPU backend: matrix products through OpenBLAS (cblas_sgemm), the rest
 * plain loops. Also the readable reference of what mlp_cuda.cu does.
 *
 * With 16-bit parameters (m->dtype BF16 or F16) portable C does what the GPU
 * does with 16-bit cuBLAS products: the weights are widened to fp32 copies
 * before each forward, every product input (layer inputs, upstream
 * gradients) is rounded to the dtype in place, so that the fp32 buffer holds
 * exactly the 16-bit value, the products accumulate in fp32 (sgemm), and the
 * gradients are rounded into the optimizer's 16-bit buffer. */
#include <cblas.h>
#include <string.h>

#include "mlp.h"

/* OpenBLAS's own call (not in the CBLAS standard). */
void openblas_set_num_threads(int num_threads);

typedef struct {
  const idx_set_t *train, *test;
  const int32_t *perm; /* borrowed from main for the epoch */
  float *x;            /* [max_batch][784] normalised input */
  int32_t *y;          /* [max_batch] labels */
  float *h[MLP_LAYERS];  /* outputs of each layer: [n][512], [n][256], [n][10] */
  float *dh[MLP_LAYERS]; /* their gradients */
  /* fp32 views of the parameters: the parameters themselves when they are
   * F32, else widened copies (refreshed before each forward), and fp32
   * scratch for a layer's dW and db before they are rounded into the
   * optimizer's 16-bit gradients (NULL for F32: written in place). */
  float *wf[MLP_TENSORS];
  float *gw, *gb;
  float *loss;
  int32_t *correct;
} cpu_state_t;

static void *cpu_calloc(int64_t n, size_t size) {
  void *p = calloc((size_t)n, size);
  if (!p) MLP_DIE("out of host memory (%lld x %zu bytes)", (long long)n, size);
  return p;
}

static void cpu_init(mlp_t *m) {
  cpu_state_t *s = cpu_calloc(1, sizeof *s);
  s->x = cpu_calloc((int64_t)m->max_batch * MLP_INPUT, sizeof(float));
  s->y = cpu_calloc(m->max_batch, sizeof(int32_t));
  for (int l = 0; l < MLP_LAYERS; l++) {
    s->h[l] = cpu_calloc((int64_t)m->max_batch * mlp_dims[l + 1], sizeof(float));
    s->dh[l] = cpu_calloc((int64_t)m->max_batch * mlp_dims[l + 1], sizeof(float));
  }
  s->loss = cpu_calloc(m->max_slots, sizeof(float));
  s->correct = cpu_calloc(m->max_slots, sizeof(int32_t));
  if (m->dtype != MTOPT_DTYPE_F32) {
    for (int l = 0; l < MLP_LAYERS; l++) {
      s->wf[2 * l] = cpu_calloc((int64_t)mlp_dims[l] * mlp_dims[l + 1], sizeof(float));
      s->wf[2 * l + 1] = cpu_calloc(mlp_dims[l + 1], sizeof(float));
    }
    s->gw = cpu_calloc((int64_t)mlp_dims[0] * mlp_dims[1], sizeof(float)); /* the largest */
    s->gb = cpu_calloc(mlp_dims[1], sizeof(float));
  }
  if (m->threads > 0) openblas_set_num_threads(m->threads);
  m->impl = s;
}

static void cpu_destroy(mlp_t *m) {
  cpu_state_t *s = m->impl;
  if (!s) return;
  free(s->x);
  free(s->y);
  for (int l = 0; l < MLP_LAYERS; l++) {
    free(s->h[l]);
    free(s->dh[l]);
  }
  free(s->loss);
  free(s->correct);
  if (m->dtype != MTOPT_DTYPE_F32)
    for (int t = 0; t < MLP_TENSORS; t++) free(s->wf[t]);
  free(s->gw);
  free(s->gb);
  free(s);
  m->impl = NULL;
}

static void cpu_bind(mlp_t *m, mtopt_context_t *ctx) { (void)m, (void)ctx; }

/* Reading the scale on the host is a memcpy here: let main.c pass it. */
static int cpu_use_dynamic_scale(mlp_t *m, mtopt_optimizer_t *opt) { return 0; }

static void *cpu_alloc(mlp_t *m, size_t bytes) { return cpu_calloc((int64_t)bytes, 1); }
static void cpu_release(mlp_t *m, void *p) { free(p); }
static void cpu_copy(mlp_t *m, void *dst, const void *src, size_t bytes) {
  memcpy(dst, src, bytes);
}

/* The fp32 views of the parameters, after a step changed them: F32 ones are
 * used as they are, 16-bit ones are widened (exactly). */
static void widen_params(mlp_t *m, cpu_state_t *s) {
  for (int t = 0; t < MLP_TENSORS; t++) {
    if (m->dtype == MTOPT_DTYPE_F32) {
      s->wf[t] = m->param[t];
      continue;
    }
    for (int64_t i = 0; i < m->numel[t]; i++) s->wf[t][i] = mlp_load(m->param[t], m->dtype, i);
  }
}

/* x[0 .. n) rounded to dt in place: each holds the value a 16-bit product
 * input would (nothing to do for F32). */
static void round_in_place(float *x, int64_t n, mtopt_dtype_t dt) {
  if (dt == MTOPT_DTYPE_F32) return;
  for (int64_t i = 0; i < n; i++) x[i] = mlp_round(dt, x[i]);
}

/* dst[0 .. n) of dt = src rounded (the optimizer's 16-bit gradients). */
static void store_all(void *dst, mtopt_dtype_t dt, const float *src, int64_t n) {
  for (int64_t i = 0; i < n; i++) mlp_store(dst, dt, i, src[i]);
}

static void cpu_set_data(mlp_t *m, const idx_set_t *train, const idx_set_t *test) {
  cpu_state_t *s = m->impl;
  s->train = train;
  s->test = test;
}

static void cpu_set_order(mlp_t *m, const int32_t *perm, int64_t n) {
  ((cpu_state_t *)m->impl)->perm = perm;
}

/* Copies images idx[0..n) (or first..first+n when idx is NULL) into x,
 * normalised, and their labels into y. */
static void gather(const mlp_t *m, const idx_set_t *set, const int32_t *idx, int64_t first,
                   int n, float *x, int32_t *y) {
  const float scale = 1.0f / (255.0f * m->std), shift = m->mean / m->std;
  for (int i = 0; i < n; i++) {
    const int64_t item = idx ? idx[first + i] : first + i;
    const uint8_t *p = set->pixels + item * MLP_INPUT;
    for (int k = 0; k < MLP_INPUT; k++)
      x[(int64_t)i * MLP_INPUT + k] = mlp_round(m->dtype, p[k] * scale - shift);
    y[i] = set->labels[item];
  }
}

/* h = act(x W^T + b) for every layer; the last layer has no ReLU. Hidden
 * outputs are the next product's input: rounded to the dtype; the logits
 * stay fp32 (the softmax reads them). Needs widen_params first. */
static void forward(mlp_t *m, cpu_state_t *s, int n) {
  const float *in = s->x;
  for (int l = 0; l < MLP_LAYERS; l++) {
    const int fan_in = mlp_dims[l], out = mlp_dims[l + 1];
    const float *W = s->wf[2 * l], *b = s->wf[2 * l + 1];
    float *h = s->h[l];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, fan_in, 1.0f, in, fan_in,
                W, fan_in, 0.0f, h, out);
    const int relu = l < MLP_LAYERS - 1;
    const mtopt_dtype_t dt = relu ? m->dtype : MTOPT_DTYPE_F32;
    for (int i = 0; i < n; i++) {
      float *row = h + (int64_t)i * out;
      for (int j = 0; j < out; j++) row[j] = mlp_round(dt, mlp_bias_act(row[j], b[j], relu));
    }
    in = h;
  }
}

/* Mean loss over the batch; writes dlogits, the gradient of loss_scale *
 * (sum of the rows' losses) / mean_rows, when asked. */
static float loss_and_grad(cpu_state_t *s, int n, float mean_rows, float loss_scale,
                           int want_grad, int32_t *correct_out) {
  const float *z = s->h[MLP_LAYERS - 1];
  float *dz = s->dh[MLP_LAYERS - 1];
  double sum = 0.0;
  int32_t correct = 0;
  for (int i = 0; i < n; i++) {
    int ok = 0;
    sum += mlp_xent_row(z + i * MLP_CLASSES, s->y[i], loss_scale / mean_rows,
                        want_grad ? dz + i * MLP_CLASSES : NULL, &ok);
    correct += ok;
  }
  *correct_out = correct;
  return (float)(sum / n);
}

/* Back from dlogits (already rounded to the dtype) to every gradient,
 * written into m->grad: in place for F32, else computed in fp32 and rounded
 * into it. */
static void backward(mlp_t *m, cpu_state_t *s, int n) {
  const mtopt_dtype_t dt = m->dtype;
  for (int l = MLP_LAYERS - 1; l >= 0; l--) {
    const int fan_in = mlp_dims[l], out = mlp_dims[l + 1];
    const float *in = l > 0 ? s->h[l - 1] : s->x;
    const float *dh = s->dh[l];
    float *dW = dt == MTOPT_DTYPE_F32 ? (float *)m->grad[2 * l] : s->gw;
    float *db = dt == MTOPT_DTYPE_F32 ? (float *)m->grad[2 * l + 1] : s->gb;
    /* dW[out][in] = dh^T x */
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, fan_in, n, 1.0f, dh, out, in,
                fan_in, 0.0f, dW, fan_in);
    /* db = column sums of dh */
    for (int j = 0; j < out; j++) db[j] = 0.0f;
    for (int i = 0; i < n; i++)
      for (int j = 0; j < out; j++) db[j] += dh[(int64_t)i * out + j];
    if (dt != MTOPT_DTYPE_F32) {
      store_all(m->grad[2 * l], dt, dW, (int64_t)out * fan_in);
      store_all(m->grad[2 * l + 1], dt, db, out);
    }
    if (l > 0) { /* nobody needs the gradient of the input */
      /* d(in) = dh W, then through the ReLU that produced `in`, rounded: it
       * is the next products' input */
      float *din = s->dh[l - 1];
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, fan_in, out, 1.0f, dh, out,
                  s->wf[2 * l], fan_in, 0.0f, din, fan_in);
      for (int64_t k = 0; k < (int64_t)n * fan_in; k++)
        din[k] = mlp_round(dt, mlp_relu_grad(din[k], in[k]));
    }
    /* Only now: W of this layer was read just above, and whoever is told may
     * update it. */
    if (m->grads_done) m->grads_done(m->grads_done_arg, l);
  }
}

static void cpu_train_batch(mlp_t *m, int64_t first, int n, float mean_rows, float loss_scale,
                            int64_t slot) {
  cpu_state_t *s = m->impl;
  widen_params(m, s);
  gather(m, s->train, s->perm, first, n, s->x, s->y);
  forward(m, s, n);
  s->loss[slot] = loss_and_grad(s, n, mean_rows, loss_scale, 1, &s->correct[slot]);
  round_in_place(s->dh[MLP_LAYERS - 1], (int64_t)n * MLP_CLASSES, m->dtype);
  backward(m, s, n);
}

static void cpu_read_slots(mlp_t *m, int64_t n, float *loss, int32_t *correct) {
  cpu_state_t *s = m->impl;
  memcpy(loss, s->loss, (size_t)n * sizeof(float));
  memcpy(correct, s->correct, (size_t)n * sizeof(int32_t));
}

static int64_t cpu_evaluate(mlp_t *m, int64_t begin, int64_t count) {
  cpu_state_t *s = m->impl;
  int64_t total = 0;
  widen_params(m, s);
  for (int64_t first = begin; first < begin + count; first += m->max_batch) {
    const int64_t left = begin + count - first;
    const int n = left < m->max_batch ? (int)left : m->max_batch;
    int32_t correct = 0;
    gather(m, s->test, NULL, first, n, s->x, s->y);
    forward(m, s, n);
    loss_and_grad(s, n, (float)n, 1.0f, 0, &correct);
    total += correct;
  }
  return total;
}

static void cpu_synchronize(mlp_t *m) {}

static void cpu_optimizer_step(mlp_t *m, mtopt_optimizer_t *opt) {
  MTOPT_CHECK(mtopt_optimizer_step(opt));
}

const mlp_ops_t mlp_cpu_ops = {
    .name = "cpu",
    .mtopt_backend = MTOPT_BACKEND_CPU,
    .init = cpu_init,
    .destroy = cpu_destroy,
    .bind = cpu_bind,
    .use_dynamic_scale = cpu_use_dynamic_scale,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_copy,
    .copy = cpu_copy,
    .set_data = cpu_set_data,
    .set_order = cpu_set_order,
    .train_batch = cpu_train_batch,
    .read_slots = cpu_read_slots,
    .evaluate = cpu_evaluate,
    .synchronize = cpu_synchronize,
    .optimizer_step = cpu_optimizer_step,
};

/* The model, 784-512-256-10 with ReLU and softmax cross-entropy, and the small
 * interface its two backends (mlp_cpu.c: OpenBLAS, mlp_cuda.cu: cuBLAS) share.
 *
 * Layout: row-major everywhere. A batch is x[n][784]; layer l has weights
 * W[out][in] (torch's nn.Linear layout) and bias b[out]; h = x W^T + b.
 * The six parameter tensors, in registration order, are W1 b1 W2 b2 W3 b3.
 *
 * The backends never own parameters or gradients: model.c allocates the
 * weights through ops->alloc and main.c hands the backend the gradient views
 * of the optimizer's contiguous buffer, so backward writes straight into what
 * mtopt_optimizer_step (or mtopt_dist_step) reads.
 *
 * Precision (m->dtype, --precision): parameters, gradients and every matrix
 * product's inputs (the layer inputs, the weights, the upstream gradients)
 * are stored in F32, BF16 or F16; every product accumulates in fp32, and the
 * rest (bias, ReLU, softmax, bias gradients) is fp32 math on those stored
 * values, rounded to nearest where the result is stored in 16 bits. Both
 * backends round at the same places with the same functions (half.h), so
 * they differ only in the products' summation order. */
#ifndef MNIST_MLP_H
#define MNIST_MLP_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "half.h"
#include "idx.h"
#include "mtopt/mtopt.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MLP_LAYERS 3
#define MLP_TENSORS (2 * MLP_LAYERS)
#define MLP_CLASSES 10
#define MLP_INPUT 784
#define MLP_EVAL_BATCH 1000

/* Layer widths: input, hidden, hidden, classes. */
static const int mlp_dims[MLP_LAYERS + 1] = {MLP_INPUT, 512, 256, MLP_CLASSES};

typedef struct mlp mlp_t;

/* Every function prints a message and exits on failure (this is a program). */
typedef struct {
  const char *name;
  mtopt_backend_t mtopt_backend; /* the mtopt context to make for it */
  /* Workspaces for batches of up to m->max_batch, and m->max_slots per-batch
   * loss / accuracy slots (one per training batch of an epoch). */
  void (*init)(mlp_t *m);
  void (*destroy)(mlp_t *m);
  /* Makes the mtopt context enqueue on the backend's stream (CUDA). */
  void (*bind)(mlp_t *m, mtopt_context_t *ctx);
  /* Dynamic loss scaling: returns 1 if train_batch will read the live scale
   * from the optimizer's device memory itself (then its loss_scale argument
   * is ignored), 0 if the caller must pass it. */
  int (*use_dynamic_scale)(mlp_t *m, mtopt_optimizer_t *opt);
  /* Zeroed memory of the backend, in bytes; host-to-backend and
   * backend-to-backend copies, in bytes. */
  void *(*alloc)(mlp_t *m, size_t bytes);
  void (*release)(mlp_t *m, void *p);
  void (*upload)(mlp_t *m, void *dst, const void *src, size_t bytes);
  void (*copy)(mlp_t *m, void *dst, const void *src, size_t bytes);
  /* Keeps (CPU) or uploads (CUDA) both splits; pixels are normalised on the
   * fly as (p / 255 - m->mean) / m->std. */
  void (*set_data)(mlp_t *m, const idx_set_t *train, const idx_set_t *test);
  /* This epoch's order of the training images (n indices). */
  void (*set_order)(mlp_t *m, const int32_t *perm, int64_t n);
  /* Forward and backward on training images perm[first .. first+n), n >= 1:
   * writes every gradient (no accumulation, so no zeroing is needed), the
   * mean loss of the n images into loss slot `slot` and the number of correct
   * predictions into its correct slot. The gradient is of
   *   loss_scale * (sum of the n images' losses) / mean_rows:
   * mean_rows = n gives the batch mean; data parallel passes
   * global batch / world, so that the ranks' averaged gradient is the mean
   * over the global batch. After each layer's gradients are written (and its
   * weights no longer read), calls m->grads_done if set. */
  void (*train_batch)(mlp_t *m, int64_t first, int n, float mean_rows, float loss_scale,
                      int64_t slot);
  /* Copies slots [0, n) to the host (waits for the work). */
  void (*read_slots)(mlp_t *m, int64_t n, float *loss, int32_t *correct);
  /* Correct predictions on test images [first, first + n) (waits for the
   * work). */
  int64_t (*evaluate)(mlp_t *m, int64_t first, int64_t n);
  void (*synchronize)(mlp_t *m);
  /* mtopt_optimizer_step(opt), or on CUDA with m->use_graph, a replay of a
   * CUDA graph of it (captured on the first call). */
  void (*optimizer_step)(mlp_t *m, mtopt_optimizer_t *opt);
} mlp_ops_t;

struct mlp {
  const mlp_ops_t *ops;
  int max_batch;
  int64_t max_slots;
  int threads;   /* CPU: BLAS threads, 0 = the library's default */
  int use_graph; /* CUDA: replay the optimizer step from a graph */
  int device;    /* CUDA: the device ordinal */
  mtopt_dtype_t dtype; /* parameters, gradients, products' inputs (see above) */
  /* Called by backward once layer `layer`'s gradients (tensors 2 layer and
   * 2 layer + 1) are written and its weights are no longer read: data
   * parallel starts reducing finished buckets there. NULL: not called. */
  void (*grads_done)(void *arg, int layer);
  void *grads_done_arg;
  float mean, std;
  void *param[MLP_TENSORS]; /* W1 b1 W2 b2 W3 b3 (dtype), in the backend's memory */
  void *grad[MLP_TENSORS];  /* views into the optimizer's gradient buffer (dtype) */
  int64_t numel[MLP_TENSORS];
  const idx_set_t *train, *test; /* host copies, for sizes */
  void *impl;                    /* the backend's own state */
};

extern const mlp_ops_t mlp_cpu_ops;
#ifdef MNIST_WITH_CUDA
extern const mlp_ops_t mlp_cuda_ops;
/* Whether a CUDA device can be used (the driver answers, a device exists). */
int mlp_cuda_device_count(void);
#endif

/* ---- shared by both backends: the element-wise formulas ---- */

/* One output of a layer: h + b, through the ReLU when relu. */
MLP_HD float mlp_bias_act(float h, float b, int relu) {
  const float v = h + b;
  return relu && v < 0.0f ? 0.0f : v;
}

/* The gradient d of a ReLU's output h, taken back through it. */
MLP_HD float mlp_relu_grad(float d, float h) { return h <= 0.0f ? 0.0f : d; }

/* Loss -log softmax(z)[label] of one row of MLP_CLASSES logits, computed with
 * the max subtracted so exp never overflows. If dz is not NULL, writes the
 * gradient of grad_scale * loss: grad_scale * (softmax(z) - onehot(label)).
 * *correct is 1 when the arg-max (first one on ties) is the label. */
MLP_HD float mlp_xent_row(const float *z, int label, float grad_scale, float *dz,
                          int *correct) {
  int arg = 0;
  for (int k = 1; k < MLP_CLASSES; k++)
    if (z[k] > z[arg]) arg = k;
  const float zmax = z[arg];
  float sum = 0.0f;
  for (int k = 0; k < MLP_CLASSES; k++) sum += expf(z[k] - zmax);
  if (dz) {
    const float inv = grad_scale / sum;
    for (int k = 0; k < MLP_CLASSES; k++)
      dz[k] = expf(z[k] - zmax) * inv - (k == label ? grad_scale : 0.0f);
  }
  *correct = arg == label;
  return logf(sum) - (z[label] - zmax);
}

/* ---- error handling for a program: say what failed, then exit ---- */

#define MLP_DIE(...)                                                           \
  do {                                                                         \
    fprintf(stderr, "error: " __VA_ARGS__);                                    \
    fputc('\n', stderr);                                                       \
    exit(1);                                                                   \
  } while (0)

/* Every mtopt call returns a status; on failure the library's last error
 * says which argument or which CUDA call went wrong. */
#define MTOPT_CHECK(call)                                                      \
  do {                                                                         \
    mtopt_status_t st_ = (call);                                               \
    if (st_ != MTOPT_STATUS_SUCCESS)                                           \
      MLP_DIE("%s:%d: %s failed: %s: %s", __FILE__, __LINE__, #call,           \
              mtopt_status_name(st_), mtopt_last_error());                     \
  } while (0)

#ifdef __cplusplus
}
#endif

#endif /* MNIST_MLP_H */

/* The CUDA backend: matrix products through cuBLAS, the rest a few small
 * kernels. Everything runs on one stream, which the mtopt context also uses
 * (mtopt_cuda_context_set_stream), so backward -> optimizer step -> next
 * forward is ordered without host synchronisation. Same math as mlp_cpu.c.
 *
 * cuBLAS is column-major and our matrices are row-major: a row-major [r][c]
 * matrix is a column-major c x r one, so every product below is written for
 * the transposes (each call says which row-major product it computes). */
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "mlp.h"
#include "mtopt/mtopt_cuda.h"

#define CUDA_CHECK(call)                                                       \
  do {                                                                         \
    cudaError_t e_ = (call);                                                   \
    if (e_ != cudaSuccess)                                                     \
      MLP_DIE("%s:%d: %s failed: %s", __FILE__, __LINE__, #call,               \
              cudaGetErrorString(e_));                                         \
  } while (0)

#define CUBLAS_CHECK(call)                                                     \
  do {                                                                         \
    cublasStatus_t s_ = (call);                                                \
    if (s_ != CUBLAS_STATUS_SUCCESS)                                           \
      MLP_DIE("%s:%d: %s failed: %s", __FILE__, __LINE__, #call,               \
              cublasGetStatusString(s_));                                      \
  } while (0)

/* Launch errors show at the next CUDA call; checking here names the kernel. */
#define KERNEL_CHECK() CUDA_CHECK(cudaGetLastError())

#define THREADS 256
#define XENT_THREADS 256

typedef struct {
  cudaStream_t stream;
  cublasHandle_t blas;
  uint8_t *train_px, *train_lb, *test_px, *test_lb;
  int64_t train_n, test_n;
  int32_t *perm;                 /* this epoch's order, on the device */
  float *x;                      /* [max_batch][784] */
  int32_t *y;                    /* [max_batch] */
  float *h[MLP_LAYERS], *dh[MLP_LAYERS];
  float *loss, *eval_loss;       /* per-batch slots */
  int32_t *correct, *eval_correct;
  int64_t eval_slots;
  const float *dynamic_scale;    /* the optimizer's live loss scale, or NULL */
  cudaGraphExec_t graph_exec;    /* --graph: the captured optimizer step */
  mtopt_optimizer_t *graph_opt;  /* which optimizer it was captured from */
} cuda_state_t;

static unsigned blocks_for(int64_t count, int threads) {
  return (unsigned)((count + threads - 1) / threads);
}

/* ------------------------------------------------------------- kernels -- */

/* x[i][k] = pixel / (255 std) - mean / std of image perm[first+i] (or
 * first+i when perm is NULL), y[i] its label. One thread per pixel. */
__global__ void gather_kernel(const uint8_t *pixels, const uint8_t *labels,
                              const int32_t *perm, int64_t first, int n, float scale,
                              float shift, float *x, int32_t *y) {
  const int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (idx >= (int64_t)n * MLP_INPUT) return;
  const int i = (int)(idx / MLP_INPUT), k = (int)(idx % MLP_INPUT);
  const int64_t item = perm ? perm[first + i] : first + i;
  x[idx] = pixels[item * MLP_INPUT + k] * scale - shift;
  if (k == 0) y[i] = labels[item];
}

/* h[i][j] = act(h[i][j] + b[j]); ReLU or identity. */
__global__ void bias_act_kernel(float *h, const float *b, int n, int cols, int relu) {
  const int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (idx >= (int64_t)n * cols) return;
  const float v = h[idx] + b[idx % cols];
  h[idx] = relu && v < 0.0f ? 0.0f : v;
}

/* d = 0 where the ReLU output h was 0. */
__global__ void relu_backward_kernel(float *d, const float *h, int64_t count) {
  const int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (idx < count && h[idx] <= 0.0f) d[idx] = 0.0f;
}

/* db[j] = sum_i dh[i][j]: one thread per column, reading rows in order
 * (neighbouring threads read neighbouring columns, so loads coalesce). */
__global__ void bias_grad_kernel(const float *dh, int n, int cols, float *db) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  float s = 0.0f;
  for (int i = 0; i < n; i++) s += dh[(int64_t)i * cols + j];
  db[j] = s;
}

/* Softmax cross-entropy of a batch in one block: each thread takes rows
 * tid, tid + XENT_THREADS, ..., then a fixed-order tree sums the losses and
 * the correct counts (deterministic). Writes the mean loss to *loss_out and
 * the count to *correct_out; with dz, the gradient of
 * scale * (sum of the losses) / mean_rows, the scale read from *device_scale
 * when that is given (dynamic loss scaling: the optimizer's own value, no
 * host round trip). */
__global__ void xent_kernel(const float *z, const int32_t *y, int n, float mean_rows,
                            float scale, const float *device_scale, float *dz,
                            float *loss_out, int32_t *correct_out) {
  __shared__ float loss_sh[XENT_THREADS];
  __shared__ int correct_sh[XENT_THREADS];
  const int tid = threadIdx.x;
  const float grad_scale = (device_scale ? *device_scale : scale) / mean_rows;
  float loss = 0.0f;
  int correct = 0;
  for (int i = tid; i < n; i += XENT_THREADS) {
    int ok = 0;
    loss += mlp_xent_row(z + (int64_t)i * MLP_CLASSES, y[i], grad_scale,
                         dz ? dz + (int64_t)i * MLP_CLASSES : NULL, &ok);
    correct += ok;
  }
  loss_sh[tid] = loss;
  correct_sh[tid] = correct;
  __syncthreads();
  for (int stride = XENT_THREADS / 2; stride > 0; stride /= 2) {
    if (tid < stride) {
      loss_sh[tid] += loss_sh[tid + stride];
      correct_sh[tid] += correct_sh[tid + stride];
    }
    __syncthreads();
  }
  if (tid == 0) {
    *loss_out = loss_sh[0] / (float)n;
    *correct_out = correct_sh[0];
  }
}

/* ------------------------------------------------------------- backend -- */

static cuda_state_t *state(mlp_t *m) { return (cuda_state_t *)m->impl; }

/* Zeroed device memory. The zeroing goes on our stream: a plain cudaMemset
 * runs on the legacy default stream, which a non-blocking stream does not
 * wait for, so it could land after our first upload. */
template <typename T>
static T *device_alloc(cuda_state_t *s, int64_t count) {
  void *p = NULL;
  CUDA_CHECK(cudaMalloc(&p, (size_t)count * sizeof(T)));
  CUDA_CHECK(cudaMemsetAsync(p, 0, (size_t)count * sizeof(T), s->stream));
  return (T *)p;
}

static void cuda_init(mlp_t *m) {
  cuda_state_t *s = (cuda_state_t *)calloc(1, sizeof *s);
  if (!s) MLP_DIE("out of host memory");
  CUDA_CHECK(cudaSetDevice(m->device));
  CUDA_CHECK(cudaStreamCreateWithFlags(&s->stream, cudaStreamNonBlocking));
  CUBLAS_CHECK(cublasCreate(&s->blas));
  CUBLAS_CHECK(cublasSetStream(s->blas, s->stream));
  s->x = device_alloc<float>(s, (int64_t)m->max_batch * MLP_INPUT);
  s->y = device_alloc<int32_t>(s, m->max_batch);
  for (int l = 0; l < MLP_LAYERS; l++) {
    s->h[l] = device_alloc<float>(s, (int64_t)m->max_batch * mlp_dims[l + 1]);
    s->dh[l] = device_alloc<float>(s, (int64_t)m->max_batch * mlp_dims[l + 1]);
  }
  s->loss = device_alloc<float>(s, m->max_slots);
  s->correct = device_alloc<int32_t>(s, m->max_slots);
  m->impl = s;
}

static void cuda_destroy(mlp_t *m) {
  cuda_state_t *s = state(m);
  if (!s) return;
  CUDA_CHECK(cudaStreamSynchronize(s->stream));
  if (s->graph_exec) CUDA_CHECK(cudaGraphExecDestroy(s->graph_exec));
  void *bufs[] = {s->train_px, s->train_lb, s->test_px, s->test_lb, s->perm, s->x, s->y,
                  s->loss, s->eval_loss, s->correct, s->eval_correct};
  for (void *p : bufs) CUDA_CHECK(cudaFree(p));
  for (int l = 0; l < MLP_LAYERS; l++) {
    CUDA_CHECK(cudaFree(s->h[l]));
    CUDA_CHECK(cudaFree(s->dh[l]));
  }
  CUBLAS_CHECK(cublasDestroy(s->blas));
  CUDA_CHECK(cudaStreamDestroy(s->stream));
  free(s);
  m->impl = NULL;
}

static void cuda_bind(mlp_t *m, mtopt_context_t *ctx) {
  MTOPT_CHECK(mtopt_cuda_context_set_stream(ctx, state(m)->stream));
}

static int cuda_use_dynamic_scale(mlp_t *m, mtopt_optimizer_t *opt) {
  const float *scale = NULL;
  MTOPT_CHECK(mtopt_cuda_optimizer_get_device_results(opt, NULL, NULL, &scale));
  state(m)->dynamic_scale = scale;
  return 1;
}

static float *cuda_alloc(mlp_t *m, int64_t n) { return device_alloc<float>(state(m), n); }
static void cuda_release(mlp_t *m, float *p) { CUDA_CHECK(cudaFree(p)); }

/* Uploads are rare (set-up, once per epoch): synchronous, on our stream.
 * Device-to-device copies stay in stream order. */
static void cuda_upload(mlp_t *m, float *dst, const float *src, int64_t n) {
  cuda_state_t *s = state(m);
  CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyHostToDevice,
                             s->stream));
  CUDA_CHECK(cudaStreamSynchronize(s->stream));
}
static void cuda_copy(mlp_t *m, float *dst, const float *src, int64_t n) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, (size_t)n * sizeof(float), cudaMemcpyDeviceToDevice,
                             state(m)->stream));
}

static uint8_t *upload_bytes(cuda_state_t *s, const uint8_t *src, int64_t n) {
  uint8_t *d = device_alloc<uint8_t>(s, n);
  CUDA_CHECK(cudaMemcpyAsync(d, src, (size_t)n, cudaMemcpyHostToDevice, s->stream));
  CUDA_CHECK(cudaStreamSynchronize(s->stream));
  return d;
}

/* The whole data set lives on the device as bytes (47 MB for 60k images);
 * batches are gathered and normalised there. */
static void cuda_set_data(mlp_t *m, const idx_set_t *train, const idx_set_t *test) {
  cuda_state_t *s = state(m);
  s->train_n = train->count;
  s->test_n = test->count;
  s->train_px = upload_bytes(s, train->pixels, train->count * MLP_INPUT);
  s->train_lb = upload_bytes(s, train->labels, train->count);
  s->test_px = upload_bytes(s, test->pixels, test->count * MLP_INPUT);
  s->test_lb = upload_bytes(s, test->labels, test->count);
  s->perm = device_alloc<int32_t>(s, train->count);
  s->eval_slots = (test->count + m->max_batch - 1) / m->max_batch;
  s->eval_loss = device_alloc<float>(s, s->eval_slots);
  s->eval_correct = device_alloc<int32_t>(s, s->eval_slots);
}

static void cuda_set_order(mlp_t *m, const int32_t *perm, int64_t n) {
  cuda_state_t *s = state(m);
  CUDA_CHECK(cudaMemcpyAsync(s->perm, perm, (size_t)n * sizeof(int32_t),
                             cudaMemcpyHostToDevice, s->stream));
  CUDA_CHECK(cudaStreamSynchronize(s->stream)); /* the host may reuse perm */
}

static void gather(mlp_t *m, const uint8_t *px, const uint8_t *lb, const int32_t *perm,
                   int64_t first, int n) {
  cuda_state_t *s = state(m);
  const float scale = 1.0f / (255.0f * m->std), shift = m->mean / m->std;
  gather_kernel<<<blocks_for((int64_t)n * MLP_INPUT, THREADS), THREADS, 0, s->stream>>>(
      px, lb, perm, first, n, scale, shift, s->x, s->y);
  KERNEL_CHECK();
}

static void forward(mlp_t *m, int n) {
  cuda_state_t *s = state(m);
  const float one = 1.0f, zero = 0.0f;
  const float *in = s->x;
  for (int l = 0; l < MLP_LAYERS; l++) {
    const int fan_in = mlp_dims[l], out = mlp_dims[l + 1];
    /* row-major h[n][out] = in[n][fan_in] W^T */
    CUBLAS_CHECK(cublasSgemm(s->blas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, fan_in, &one,
                             m->param[2 * l], fan_in, in, fan_in, &zero, s->h[l], out));
    bias_act_kernel<<<blocks_for((int64_t)n * out, THREADS), THREADS, 0, s->stream>>>(
        s->h[l], m->param[2 * l + 1], n, out, l < MLP_LAYERS - 1);
    KERNEL_CHECK();
    in = s->h[l];
  }
}

static void backward(mlp_t *m, int n) {
  cuda_state_t *s = state(m);
  const float one = 1.0f, zero = 0.0f;
  for (int l = MLP_LAYERS - 1; l >= 0; l--) {
    const int fan_in = mlp_dims[l], out = mlp_dims[l + 1];
    const float *in = l > 0 ? s->h[l - 1] : s->x;
    /* row-major dW[out][fan_in] = dh^T in */
    CUBLAS_CHECK(cublasSgemm(s->blas, CUBLAS_OP_N, CUBLAS_OP_T, fan_in, out, n, &one, in,
                             fan_in, s->dh[l], out, &zero, m->grad[2 * l], fan_in));
    bias_grad_kernel<<<blocks_for(out, THREADS), THREADS, 0, s->stream>>>(
        s->dh[l], n, out, m->grad[2 * l + 1]);
    KERNEL_CHECK();
    if (l > 0) { /* nobody needs the gradient of the input */
      /* row-major d(in)[n][fan_in] = dh W, then through the ReLU */
      CUBLAS_CHECK(cublasSgemm(s->blas, CUBLAS_OP_N, CUBLAS_OP_N, fan_in, n, out, &one,
                               m->param[2 * l], fan_in, s->dh[l], out, &zero, s->dh[l - 1],
                               fan_in));
      const int64_t count = (int64_t)n * fan_in;
      relu_backward_kernel<<<blocks_for(count, THREADS), THREADS, 0, s->stream>>>(
          s->dh[l - 1], in, count);
      KERNEL_CHECK();
    }
    /* The layer's work is enqueued; whatever grads_done enqueues on our
     * stream (a bucket's all-reduce, its step) runs after it. */
    if (m->grads_done) m->grads_done(m->grads_done_arg, l);
  }
}

static void cuda_train_batch(mlp_t *m, int64_t first, int n, float mean_rows,
                             float loss_scale, int64_t slot) {
  cuda_state_t *s = state(m);
  gather(m, s->train_px, s->train_lb, s->perm, first, n);
  forward(m, n);
  xent_kernel<<<1, XENT_THREADS, 0, s->stream>>>(s->h[MLP_LAYERS - 1], s->y, n, mean_rows,
                                                 loss_scale, s->dynamic_scale,
                                                 s->dh[MLP_LAYERS - 1], s->loss + slot,
                                                 s->correct + slot);
  KERNEL_CHECK();
  backward(m, n);
}

static void cuda_read_slots(mlp_t *m, int64_t n, float *loss, int32_t *correct) {
  cuda_state_t *s = state(m);
  CUDA_CHECK(cudaMemcpyAsync(loss, s->loss, (size_t)n * sizeof(float),
                             cudaMemcpyDeviceToHost, s->stream));
  CUDA_CHECK(cudaMemcpyAsync(correct, s->correct, (size_t)n * sizeof(int32_t),
                             cudaMemcpyDeviceToHost, s->stream));
  CUDA_CHECK(cudaStreamSynchronize(s->stream));
}

static int64_t cuda_evaluate(mlp_t *m, int64_t begin, int64_t count) {
  cuda_state_t *s = state(m);
  /* count <= test_n, so eval_slots (made for the whole split) is enough. */
  const int64_t batches = (count + m->max_batch - 1) / m->max_batch;
  for (int64_t b = 0; b < batches; b++) {
    const int64_t first = begin + b * m->max_batch, left = begin + count - first;
    const int n = left < m->max_batch ? (int)left : m->max_batch;
    gather(m, s->test_px, s->test_lb, NULL, first, n);
    forward(m, n);
    xent_kernel<<<1, XENT_THREADS, 0, s->stream>>>(s->h[MLP_LAYERS - 1], s->y, n, (float)n,
                                                   1.0f, NULL, NULL, s->eval_loss + b,
                                                   s->eval_correct + b);
    KERNEL_CHECK();
  }
  int32_t *correct = (int32_t *)malloc((size_t)(batches > 0 ? batches : 1) * sizeof(int32_t));
  if (!correct) MLP_DIE("out of host memory");
  CUDA_CHECK(cudaMemcpyAsync(correct, s->eval_correct, (size_t)batches * sizeof(int32_t),
                             cudaMemcpyDeviceToHost, s->stream));
  CUDA_CHECK(cudaStreamSynchronize(s->stream));
  int64_t total = 0;
  for (int64_t b = 0; b < batches; b++) total += correct[b];
  free(correct);
  return total;
}

static void cuda_synchronize(mlp_t *m) { CUDA_CHECK(cudaStreamSynchronize(state(m)->stream)); }

/* With --graph, the step is captured once (the capture records the launches
 * without running them) and replayed from then on: one cudaGraphLaunch
 * instead of the step's launches. The step reads lr, the step count and the
 * loss scale from the optimizer's device block, so set_lr between replays
 * takes effect. */
static void cuda_optimizer_step(mlp_t *m, mtopt_optimizer_t *opt) {
  cuda_state_t *s = state(m);
  if (!m->use_graph) {
    MTOPT_CHECK(mtopt_optimizer_step(opt));
    return;
  }
  if (s->graph_opt != opt) {
    if (s->graph_exec) CUDA_CHECK(cudaGraphExecDestroy(s->graph_exec));
    cudaGraph_t graph = NULL;
    CUDA_CHECK(cudaStreamBeginCapture(s->stream, cudaStreamCaptureModeThreadLocal));
    const mtopt_status_t st = mtopt_optimizer_step(opt);
    const cudaError_t end = cudaStreamEndCapture(s->stream, &graph);
    if (st != MTOPT_STATUS_SUCCESS)
      MLP_DIE("capturing mtopt_optimizer_step: %s: %s", mtopt_status_name(st),
              mtopt_last_error());
    CUDA_CHECK(end);
    CUDA_CHECK(cudaGraphInstantiate(&s->graph_exec, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));
    s->graph_opt = opt;
  }
  CUDA_CHECK(cudaGraphLaunch(s->graph_exec, s->stream));
}

int mlp_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError(); /* clear it: no driver is not an error here */
    return 0;
  }
  return n;
}

/* In field order (C++ has no designated initialisers before C++20). */
const mlp_ops_t mlp_cuda_ops = {
    "cuda",                  /* name */
    MTOPT_BACKEND_CUDA,      /* mtopt_backend */
    cuda_init,               /* init */
    cuda_destroy,            /* destroy */
    cuda_bind,               /* bind */
    cuda_use_dynamic_scale,  /* use_dynamic_scale */
    cuda_alloc,              /* alloc */
    cuda_release,            /* release */
    cuda_upload,             /* upload */
    cuda_copy,               /* copy */
    cuda_set_data,           /* set_data */
    cuda_set_order,          /* set_order */
    cuda_train_batch,        /* train_batch */
    cuda_read_slots,         /* read_slots */
    cuda_evaluate,           /* evaluate */
    cuda_synchronize,        /* synchronize */
    cuda_optimizer_step,     /* optimizer_step */
};

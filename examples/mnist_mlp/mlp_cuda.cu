/* The CUDA backend: matrix products through cuBLAS, the rest a few small
 * kernels. Everything runs on one stream, which the mtopt context also uses
 * (mtopt_cuda_context_set_stream), so backward -> optimizer step -> next
 * forward is ordered without host synchronisation. Same math as mlp_cpu.c.
 *
 * Precision (m->dtype): with BF16 or F16 the products are cublasGemmEx with
 * 16-bit inputs, fp32 outputs and CUBLAS_COMPUTE_32F (fp32 accumulation,
 * tensor cores). Every product output is kept in fp32 (bias, ReLU and
 * softmax work on it); what a later product reads is also stored in the
 * dtype: the input batch, the hidden activations and the upstream
 * gradients, in x16 / h16 / dh16 (for F32 these are the fp32 buffers
 * themselves). dW goes to fp32 scratch and is rounded into the optimizer's
 * 16-bit gradient by our own kernel, so its rounding (and an fp16 overflow
 * to inf, which the dynamic loss scale must see) is the CPU backend's.
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
  void *x;                       /* [max_batch][784], in the model's dtype */
  int32_t *y;                    /* [max_batch] */
  float *h[MLP_LAYERS], *dh[MLP_LAYERS]; /* fp32 outputs of the products */
  /* What the products read, in the model's dtype: the hidden activations and
   * the upstream gradients (for F32, h and dh themselves), and dW's fp32
   * scratch (16-bit only: NULL for F32, dW is written in place). */
  void *h16[MLP_LAYERS], *dh16[MLP_LAYERS];
  float *dw32;
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
 * first+i when perm is NULL), stored as dt; y[i] its label. One thread per
 * pixel. */
__global__ void gather_kernel(const uint8_t *pixels, const uint8_t *labels,
                              const int32_t *perm, int64_t first, int n, float scale,
                              float shift, void *x, mtopt_dtype_t dt, int32_t *y) {
  const int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (idx >= (int64_t)n * MLP_INPUT) return;
  const int i = (int)(idx / MLP_INPUT), k = (int)(idx % MLP_INPUT);
  const int64_t item = perm ? perm[first + i] : first + i;
  mlp_store(x, dt, idx, pixels[item * MLP_INPUT + k] * scale - shift);
  if (k == 0) y[i] = labels[item];
}

/* h[i][j] = act(h[i][j] + b[j]), ReLU or identity, b stored as dt. When out
 * is not NULL (16-bit hidden layers) the result is also the next product's
 * input, stored as dt there. */
__global__ void bias_act_kernel(float *h, const void *b, mtopt_dtype_t dt, int n, int cols,
                                int relu, void *out) {
  const int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (idx >= (int64_t)n * cols) return;
  const float v = mlp_bias_act(h[idx], mlp_load(b, dt, idx % cols), relu);
  h[idx] = v;
  if (out) mlp_store(out, dt, idx, v);
}

/* The gradient d of a ReLU's output h (stored as dt) taken back through it,
 * stored as dt in out (for F32, d itself). */
__global__ void relu_backward_kernel(const float *d, const void *h, mtopt_dtype_t dt,
                                     int64_t count, void *out) {
  const int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (idx < count) mlp_store(out, dt, idx, mlp_relu_grad(d[idx], mlp_load(h, dt, idx)));
}

/* dst[i] = src[i] stored as dt (rounded to nearest even). */
__global__ void store_kernel(const float *src, void *dst, mtopt_dtype_t dt, int64_t count) {
  const int64_t idx = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
  if (idx < count) mlp_store(dst, dt, idx, src[idx]);
}

/* db[j] = sum_i dh[i][j], dh and db stored as dt: one thread per column,
 * reading rows in order (neighbouring threads read neighbouring columns, so
 * loads coalesce). */
__global__ void bias_grad_kernel(const void *dh, mtopt_dtype_t dt, int n, int cols, void *db) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= cols) return;
  float s = 0.0f;
  for (int i = 0; i < n; i++) s += mlp_load(dh, dt, (int64_t)i * cols + j);
  mlp_store(db, dt, j, s);
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
  const int wide = m->dtype == MTOPT_DTYPE_F32;
  const size_t es = mlp_dtype_size(m->dtype);
  s->x = device_alloc<uint8_t>(s, (int64_t)m->max_batch * MLP_INPUT * (int64_t)es);
  s->y = device_alloc<int32_t>(s, m->max_batch);
  for (int l = 0; l < MLP_LAYERS; l++) {
    const int64_t count = (int64_t)m->max_batch * mlp_dims[l + 1];
    s->h[l] = device_alloc<float>(s, count);
    s->dh[l] = device_alloc<float>(s, count);
    s->h16[l] = wide ? (void *)s->h[l] : device_alloc<uint8_t>(s, count * (int64_t)es);
    s->dh16[l] = wide ? (void *)s->dh[l] : device_alloc<uint8_t>(s, count * (int64_t)es);
  }
  if (!wide) s->dw32 = device_alloc<float>(s, (int64_t)mlp_dims[0] * mlp_dims[1]);
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
    if (s->h16[l] != s->h[l]) CUDA_CHECK(cudaFree(s->h16[l]));
    if (s->dh16[l] != s->dh[l]) CUDA_CHECK(cudaFree(s->dh16[l]));
    CUDA_CHECK(cudaFree(s->h[l]));
    CUDA_CHECK(cudaFree(s->dh[l]));
  }
  CUDA_CHECK(cudaFree(s->dw32));
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

static void *cuda_alloc(mlp_t *m, size_t bytes) {
  return device_alloc<uint8_t>(state(m), (int64_t)bytes);
}
static void cuda_release(mlp_t *m, void *p) { CUDA_CHECK(cudaFree(p)); }

/* Uploads are rare (set-up, once per epoch): synchronous, on our stream.
 * Device-to-device copies stay in stream order. */
static void cuda_upload(mlp_t *m, void *dst, const void *src, size_t bytes) {
  cuda_state_t *s = state(m);
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s->stream));
  CUDA_CHECK(cudaStreamSynchronize(s->stream));
}
static void cuda_copy(mlp_t *m, void *dst, const void *src, size_t bytes) {
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, state(m)->stream));
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
      px, lb, perm, first, n, scale, shift, s->x, m->dtype, s->y);
  KERNEL_CHECK();
}

/* Column-major C[m][n] (fp32) = op(A) op(B), A and B stored as dt, summed in
 * fp32: cublasSgemm for F32 (as it always was), else cublasGemmEx with 16-bit
 * inputs and CUBLAS_COMPUTE_32F. */
static void gemm(cuda_state_t *s, mtopt_dtype_t dt, cublasOperation_t ta, cublasOperation_t tb,
                 int m, int n, int k, const void *A, int lda, const void *B, int ldb, float *C,
                 int ldc) {
  const float one = 1.0f, zero = 0.0f;
  if (dt == MTOPT_DTYPE_F32) {
    CUBLAS_CHECK(cublasSgemm(s->blas, ta, tb, m, n, k, &one, (const float *)A, lda,
                             (const float *)B, ldb, &zero, C, ldc));
    return;
  }
  const cudaDataType_t t = dt == MTOPT_DTYPE_BF16 ? CUDA_R_16BF : CUDA_R_16F;
  CUBLAS_CHECK(cublasGemmEx(s->blas, ta, tb, m, n, k, &one, A, t, lda, B, t, ldb, &zero, C,
                            CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

static void forward(mlp_t *m, int n) {
  cuda_state_t *s = state(m);
  const void *in = s->x;
  for (int l = 0; l < MLP_LAYERS; l++) {
    const int fan_in = mlp_dims[l], out = mlp_dims[l + 1];
    const int hidden = l < MLP_LAYERS - 1; /* ReLU, and the next layer's input */
    /* row-major h[n][out] = in[n][fan_in] W^T */
    gemm(s, m->dtype, CUBLAS_OP_T, CUBLAS_OP_N, out, n, fan_in, m->param[2 * l], fan_in, in,
         fan_in, s->h[l], out);
    bias_act_kernel<<<blocks_for((int64_t)n * out, THREADS), THREADS, 0, s->stream>>>(
        s->h[l], m->param[2 * l + 1], m->dtype, n, out, hidden,
        hidden && s->h16[l] != s->h[l] ? s->h16[l] : NULL);
    KERNEL_CHECK();
    in = s->h16[l]; /* for F32, h[l] itself */
  }
}

/* From dlogits in dh[last] (fp32) to every gradient, stored as the model's
 * dtype in m->grad. */
static void backward(mlp_t *m, int n) {
  cuda_state_t *s = state(m);
  const mtopt_dtype_t dt = m->dtype;
  const int wide = dt == MTOPT_DTYPE_F32;
  if (!wide) {
    const int64_t count = (int64_t)n * MLP_CLASSES;
    store_kernel<<<blocks_for(count, THREADS), THREADS, 0, s->stream>>>(
        s->dh[MLP_LAYERS - 1], s->dh16[MLP_LAYERS - 1], dt, count);
    KERNEL_CHECK();
  }
  for (int l = MLP_LAYERS - 1; l >= 0; l--) {
    const int fan_in = mlp_dims[l], out = mlp_dims[l + 1];
    const void *in = l > 0 ? s->h16[l - 1] : s->x;
    /* row-major dW[out][fan_in] = dh^T in; 16-bit: in fp32, then rounded */
    float *dW = wide ? (float *)m->grad[2 * l] : s->dw32;
    gemm(s, dt, CUBLAS_OP_N, CUBLAS_OP_T, fan_in, out, n, in, fan_in, s->dh16[l], out, dW,
         fan_in);
    if (!wide) {
      const int64_t count = (int64_t)out * fan_in;
      store_kernel<<<blocks_for(count, THREADS), THREADS, 0, s->stream>>>(
          dW, m->grad[2 * l], dt, count);
      KERNEL_CHECK();
    }
    bias_grad_kernel<<<blocks_for(out, THREADS), THREADS, 0, s->stream>>>(
        s->dh16[l], dt, n, out, m->grad[2 * l + 1]);
    KERNEL_CHECK();
    if (l > 0) { /* nobody needs the gradient of the input */
      /* row-major d(in)[n][fan_in] = dh W, then through the ReLU */
      gemm(s, dt, CUBLAS_OP_N, CUBLAS_OP_N, fan_in, n, out, m->param[2 * l], fan_in,
           s->dh16[l], out, s->dh[l - 1], fan_in);
      const int64_t count = (int64_t)n * fan_in;
      relu_backward_kernel<<<blocks_for(count, THREADS), THREADS, 0, s->stream>>>(
          s->dh[l - 1], s->h16[l - 1], dt, count, s->dh16[l - 1]);
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

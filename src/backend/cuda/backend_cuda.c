/* The CUDA backend glue: memory, copies, pointer checks and the launch of each
 * pass on the context's stream, and the public calls of mtopt_cuda.h. The
 * kernels live in step_kernels.cuh (built in pass_*.cu). (Host files that
 * include CUDA headers: this one and, in the distributed layer,
 * transport_nccl.c and sm_partition.c.)
 *
 * Every CUDA failure becomes mtopt__error(ctx, MTOPT_STATUS_CUDA_ERROR, "<what>:
 * <cudaGetErrorString>") (OUT_OF_MEMORY for a failed allocation), never an
 * exit. run_pass only launches kernels (no synchronisation, allocation or
 * pageable copy), so a step can be captured into a CUDA graph. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "../backend.h"
#include "cuda_glue.h"
#include "mtopt/mtopt_cuda.h"
#include "../../core/internal_api.h"
#include "launch.h"

/* ctx->backend_state of a CUDA context. */
typedef struct {
  cudaStream_t stream; /* 0: the legacy default stream */
  int sm_count;        /* multiprocessors of the device, read at init */
  /* cuPointerGetAttribute (mtopt__driver_fn), or NULL */
  __typeof__(&cuPointerGetAttribute) pointer_attr;
} cuda_state_t;

static cuda_state_t *state_of(const mtopt_context_t *ctx) {
  return (cuda_state_t *)mtopt__context_backend_state(ctx);
}

mtopt_status_t mtopt__cuda_fail(mtopt_context_t *ctx, cudaError_t e, const char *what) {
  (void)cudaGetLastError(); /* non-sticky errors: not reported twice */
  const mtopt_status_t st =
      e == cudaErrorMemoryAllocation ? MTOPT_STATUS_OUT_OF_MEMORY : MTOPT_STATUS_CUDA_ERROR;
  return mtopt__error(ctx, st, "%s: %s: %s", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

#define CUDA_CHECK(ctx, call, what)                                            \
  do {                                                                         \
    cudaError_t cuda_e_ = (call);                                              \
    if (cuda_e_ != cudaSuccess) return mtopt__cuda_fail((ctx), cuda_e_, (what)); \
  } while (0)

void *mtopt__driver_fn(const char *name) {
#if defined(CUDART_VERSION) && CUDART_VERSION >= 12050 && CUDA_VERSION >= 12050
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion(name, &fn, CUDA_VERSION, cudaEnableDefault, &q) ==
          cudaSuccess &&
      q == cudaDriverEntryPointSuccess)
    return fn;
  (void)cudaGetLastError(); /* not a launch error to report later */
#else
  (void)name;
#endif
  return NULL;
}

mtopt_status_t mtopt__device_enter(mtopt_context_t *ctx, mtopt__device_guard_t *g) {
  g->switched = 0;
  CUDA_CHECK(ctx, cudaGetDevice(&g->prev), "cudaGetDevice");
  if (g->prev != mtopt__context_device(ctx)) {
    CUDA_CHECK(ctx, cudaSetDevice(mtopt__context_device(ctx)), "cudaSetDevice");
    g->switched = 1;
  }
  return MTOPT_STATUS_SUCCESS;
}

void mtopt__device_leave(const mtopt__device_guard_t *g) {
  if (g->switched) (void)cudaSetDevice(g->prev);
}

/* ---- context ---- */

static mtopt_status_t cuda_init(mtopt_context_t *ctx) {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return mtopt__error(ctx, MTOPT_STATUS_CUDA_ERROR, "no CUDA device: %s",
                        e != cudaSuccess ? cudaGetErrorString(e) : "the device count is 0");
  }
  if (mtopt__context_device(ctx) < 0 || mtopt__context_device(ctx) >= count)
    return mtopt__error(ctx, MTOPT_STATUS_CUDA_ERROR,
                        "CUDA device %d does not exist (%d device%s present)", mtopt__context_device(ctx),
                        count, count == 1 ? "" : "s");
  mtopt__device_guard_t g;
  CHECK(mtopt__device_enter(ctx, &g));
  int sms = 0;
  e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, mtopt__context_device(ctx));
  /* Initialise the device's primary context now, at set-up, not in a step. */
  if (e == cudaSuccess) e = cudaFree(NULL);
  mtopt__device_leave(&g);
  if (e != cudaSuccess) return mtopt__cuda_fail(ctx, e, "initialising the CUDA device");
  cuda_state_t *s = calloc(1, sizeof *s);
  if (!s) return mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "CUDA context: calloc failed");
  s->stream = 0;
  s->sm_count = sms;
  s->pointer_attr = (__typeof__(&cuPointerGetAttribute))mtopt__driver_fn("cuPointerGetAttribute");
  mtopt__context_set_backend_state(ctx, s);
  return MTOPT_STATUS_SUCCESS;
}

static void cuda_fini(mtopt_context_t *ctx) {
  free(state_of(ctx));
  mtopt__context_set_backend_state(ctx, NULL);
}

/* ---- memory ---- */

static mtopt_status_t cuda_alloc(mtopt_context_t *ctx, size_t bytes, void **out) {
  mtopt__device_guard_t g;
  CHECK(mtopt__device_enter(ctx, &g));
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, bytes ? bytes : 256); /* 256-byte aligned */
  /* Zeroed before any later work on the context's stream can see it (the
   * stream may be a non-blocking one that does not wait for stream 0). */
  if (e == cudaSuccess) e = cudaMemsetAsync(p, 0, bytes, state_of(ctx)->stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(state_of(ctx)->stream);
  if (e != cudaSuccess && p) (void)cudaFree(p);
  mtopt__device_leave(&g);
  if (e != cudaSuccess) {
    char what[96];
    snprintf(what, sizeof what, "allocating %zu bytes of device memory", bytes);
    return mtopt__cuda_fail(ctx, e, what);
  }
  *out = p;
  return MTOPT_STATUS_SUCCESS;
}

static void cuda_release(mtopt_context_t *ctx, void *p) {
  mtopt__device_guard_t g;
  if (mtopt__device_enter(ctx, &g) != MTOPT_STATUS_SUCCESS) return;
  if (cudaFree(p) != cudaSuccess) (void)cudaGetLastError();
  mtopt__device_leave(&g);
}

/* Set-up copy, complete on return. On the context's stream and synchronised,
 * because a plain cudaMemcpy from pageable memory may return before the DMA
 * lands and is ordered only with stream 0. */
static mtopt_status_t cuda_upload(mtopt_context_t *ctx, void *dst, const void *src,
                                  size_t bytes) {
  if (bytes == 0) return MTOPT_STATUS_SUCCESS;
  mtopt__device_guard_t g;
  CHECK(mtopt__device_enter(ctx, &g));
  const cudaStream_t s = state_of(ctx)->stream;
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  mtopt__device_leave(&g);
  if (e != cudaSuccess) return mtopt__cuda_fail(ctx, e, "copying to the device");
  return MTOPT_STATUS_SUCCESS;
}

/* After the steps already enqueued: same stream, then wait. */
static mtopt_status_t cuda_download(mtopt_context_t *ctx, void *dst, const void *src,
                                    size_t bytes) {
  if (bytes == 0) return MTOPT_STATUS_SUCCESS;
  mtopt__device_guard_t g;
  CHECK(mtopt__device_enter(ctx, &g));
  const cudaStream_t s = state_of(ctx)->stream;
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s);
  if (e == cudaSuccess) e = cudaStreamSynchronize(s);
  mtopt__device_leave(&g);
  if (e != cudaSuccess) return mtopt__cuda_fail(ctx, e, "copying from the device");
  return MTOPT_STATUS_SUCCESS;
}

/* A setter's write, ordered after earlier steps. It is a one-block kernel that
 * carries the bytes as its arguments (mtopt__launch_write), not a
 * cudaMemcpyAsync from the caller's memory: the source is often a stack
 * variable, and an async copy from pageable memory may synchronise the host
 * with the stream (stalling the training loop behind queued steps) and cannot
 * be captured. The launch copies the value at once, never blocks, and is
 * capturable (the value is then fixed in the graph). */
static mtopt_status_t cuda_write_ordered(mtopt_context_t *ctx, void *dst, const void *src,
                                         size_t bytes) {
  if (bytes == 0) return MTOPT_STATUS_SUCCESS;
  mtopt__device_guard_t g;
  CHECK(mtopt__device_enter(ctx, &g));
  const cudaError_t e = mtopt__launch_write(dst, src, bytes, state_of(ctx)->stream);
  mtopt__device_leave(&g);
  if (e != cudaSuccess) return mtopt__cuda_fail(ctx, e, "launching a hyperparameter write");
  return MTOPT_STATUS_SUCCESS;
}

static mtopt_status_t cuda_zero_ordered(mtopt_context_t *ctx, void *dst, size_t bytes) {
  if (bytes == 0) return MTOPT_STATUS_SUCCESS;
  mtopt__device_guard_t g;
  CHECK(mtopt__device_enter(ctx, &g));
  const cudaError_t e = cudaMemsetAsync(dst, 0, bytes, state_of(ctx)->stream);
  mtopt__device_leave(&g);
  if (e != cudaSuccess) return mtopt__cuda_fail(ctx, e, "cudaMemsetAsync");
  return MTOPT_STATUS_SUCCESS;
}

/* The kernels dereference tensor pointers on the context's device, so each
 * must be device memory of that device or managed memory. The runtime cannot
 * tell where an allocation ends; checking the first and the last byte catches
 * host pointers and ranges that run off into another kind of memory. */
static mtopt_status_t check_one(mtopt_context_t *ctx, const void *p, const char *what,
                                int64_t tensor, const char *which) {
  struct cudaPointerAttributes a;
  memset(&a, 0, sizeof a);
  const cudaError_t e = cudaPointerGetAttributes(&a, p);
  if (e != cudaSuccess) {
    (void)cudaGetLastError(); /* older runtimes fail for plain host memory */
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "mtopt_optimizer_create: tensor %lld: the %s pointer %p (%s byte) "
                        "is not CUDA memory: %s",
                        (long long)tensor, what, p, which, cudaGetErrorString(e));
  }
  const char *bad = NULL;
  switch (a.type) {
  case cudaMemoryTypeDevice:
    if (a.device != mtopt__context_device(ctx)) bad = "device memory of another GPU";
    break;
  case cudaMemoryTypeManaged:
    break;
  case cudaMemoryTypeHost:
    bad = "pinned host memory";
    break;
  default:
    bad = "host memory";
    break;
  }
  if (bad)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "mtopt_optimizer_create: tensor %lld: the %s pointer %p (%s byte) "
                        "is %s; a CUDA context needs device memory of device %d or "
                        "managed memory",
                        (long long)tensor, what, p, which, bad, mtopt__context_device(ctx));
  return MTOPT_STATUS_SUCCESS;
}

static mtopt_status_t cuda_check_pointer(mtopt_context_t *ctx, const void *p, size_t bytes,
                                         const char *what, int64_t tensor) {
  if (bytes == 0) return MTOPT_STATUS_SUCCESS;
  mtopt__device_guard_t g;
  CHECK(mtopt__device_enter(ctx, &g));
  mtopt_status_t st = check_one(ctx, p, what, tensor, "first");
  if (st == MTOPT_STATUS_SUCCESS && bytes > 1)
    st = check_one(ctx, (const char *)p + bytes - 1, what, tensor, "last");
  mtopt__device_leave(&g);
  return st;
}

/* The driver's range of the allocation holding p (a cudaMalloc'd block; a
 * caching allocator's segment of many tensors). */
static int cuda_one_allocation(mtopt_context_t *ctx, const void *p, size_t bytes) {
  const cuda_state_t *s = state_of(ctx);
  if (!s->pointer_attr || bytes == 0) return 0;
  mtopt__device_guard_t g;
  if (mtopt__device_enter(ctx, &g) != MTOPT_STATUS_SUCCESS) return 0;
  const CUdeviceptr at = (CUdeviceptr)(uintptr_t)p;
  CUdeviceptr start = 0;
  size_t size = 0;
  const int in = s->pointer_attr(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, at) ==
                     CUDA_SUCCESS &&
                 s->pointer_attr(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, at) == CUDA_SUCCESS &&
                 at >= start && bytes <= size && at - start <= size - bytes;
  mtopt__device_leave(&g);
  return in;
}

/* ---- the step ---- */

static mtopt_status_t cuda_run_pass(mtopt_context_t *ctx, const mtopt__plan_t *plan,
                                    mtopt__pass_t pass, int64_t c0, int64_t c1,
                                    void *const *stream) {
  if (c0 < 0 || c1 > plan->num_chunks || c0 > c1)
    return mtopt__error(ctx, MTOPT_STATUS_INTERNAL,
                        "run_pass: chunk range [%lld, %lld) outside [0, %lld)", (long long)c0,
                        (long long)c1, (long long)plan->num_chunks);
  mtopt__device_guard_t g;
  CHECK(mtopt__device_enter(ctx, &g));
  const cudaStream_t on = stream ? (cudaStream_t)*stream : state_of(ctx)->stream;
  const cudaError_t e = mtopt__launch_pass(plan, state_of(ctx)->sm_count, (int)pass, c0, c1, on);
  mtopt__device_leave(&g);
  if (e != cudaSuccess) {
    static const char *const names[] = {"statistics", "update", "LAMB apply"};
    char what[64];
    snprintf(what, sizeof what, "launching the %s pass",
             (unsigned)pass < 3 ? names[pass] : "unknown");
    return mtopt__cuda_fail(ctx, e, what);
  }
  return MTOPT_STATUS_SUCCESS;
}

static mtopt_status_t cuda_synchronize(mtopt_context_t *ctx) {
  mtopt__device_guard_t g;
  CHECK(mtopt__device_enter(ctx, &g));
  const cudaError_t e = cudaStreamSynchronize(state_of(ctx)->stream);
  mtopt__device_leave(&g);
  if (e != cudaSuccess)
    return mtopt__cuda_fail(ctx, e, "cudaStreamSynchronize (an earlier step or copy failed)");
  return MTOPT_STATUS_SUCCESS;
}

/* The deferred end of a STATS pass (plan.h: defer_stats), after the caller
 * summed the ranks' stats_sum on the stream. */
static mtopt_status_t cuda_finish_stats(mtopt_context_t *ctx, const mtopt__plan_t *plan) {
  mtopt__device_guard_t g;
  CHECK(mtopt__device_enter(ctx, &g));
  const cudaError_t e =
      mtopt__launch_finish_stats(plan->hyper, plan->stats_sum, state_of(ctx)->stream);
  mtopt__device_leave(&g);
  if (e != cudaSuccess) return mtopt__cuda_fail(ctx, e, "launching the statistics finaliser");
  return MTOPT_STATUS_SUCCESS;
}

static mtopt_status_t cuda_widen(mtopt_context_t *ctx, float *dst, const void *src, int dt,
                                 int64_t n, void *const *stream) {
  if (n == 0) return MTOPT_STATUS_SUCCESS;
  mtopt__device_guard_t g;
  CHECK(mtopt__device_enter(ctx, &g));
  const cudaStream_t on = stream ? (cudaStream_t)*stream : state_of(ctx)->stream;
  const cudaError_t e = mtopt__launch_widen(dst, src, dt, n, on);
  mtopt__device_leave(&g);
  if (e != cudaSuccess) return mtopt__cuda_fail(ctx, e, "launching the fp32 widening");
  return MTOPT_STATUS_SUCCESS;
}

static const mtopt__backend_ops_t cuda_ops = {
    .name = "cuda",
    .mixed_precision = 1,
    .init = cuda_init,
    .fini = cuda_fini,
    .alloc = cuda_alloc,
    .release = cuda_release,
    .upload = cuda_upload,
    .download = cuda_download,
    .write_ordered = cuda_write_ordered,
    .zero_ordered = cuda_zero_ordered,
    .check_pointer = cuda_check_pointer,
    .one_allocation = cuda_one_allocation,
    .run_pass = cuda_run_pass,
    .synchronize = cuda_synchronize,
    .finish_stats = cuda_finish_stats,
    .widen = cuda_widen,
};

const mtopt__backend_ops_t *mtopt__cuda_ops(void) { return &cuda_ops; }

/* ---- mtopt_cuda.h ---- */

static mtopt_status_t check_cuda_ctx(const mtopt_context_t *ctx, const char *fn) {
  if (!ctx) return mtopt__error(NULL, MTOPT_STATUS_INVALID_ARGUMENT, "%s: ctx is NULL", fn);
  mtopt_backend_t backend = MTOPT_BACKEND_CPU;
  if (mtopt_context_get_backend(ctx, &backend) != MTOPT_STATUS_SUCCESS ||
      backend != MTOPT_BACKEND_CUDA || !state_of(ctx))
    return mtopt__error((mtopt_context_t *)ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: the context is not a CUDA context", fn);
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_cuda_context_set_stream(mtopt_context_t *ctx, cudaStream_t stream) {
  static const char fn[] = "mtopt_cuda_context_set_stream";
  CHECK(check_cuda_ctx(ctx, fn));
  cuda_state_t *s = state_of(ctx);
  if (stream == s->stream) return MTOPT_STATUS_SUCCESS;
  /* Work on the old stream (steps, setters) must not overtake or be overtaken
   * by work on the new one: wait for it. A rare call; simplicity wins. */
  CHECK(cuda_synchronize(ctx));
  s->stream = stream;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_cuda_context_get_stream(const mtopt_context_t *ctx, cudaStream_t *stream) {
  static const char fn[] = "mtopt_cuda_context_get_stream";
  CHECK(check_cuda_ctx(ctx, fn));
  if (!stream)
    return mtopt__error((mtopt_context_t *)ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: stream is NULL", fn);
  *stream = state_of(ctx)->stream;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_cuda_optimizer_get_device_results(mtopt_optimizer_t *opt,
                                                       const float **last_grad_norm,
                                                       const int32_t **last_skipped,
                                                       const float **loss_scale) {
  static const char fn[] = "mtopt_cuda_optimizer_get_device_results";
  if (!opt) return mtopt__error(NULL, MTOPT_STATUS_INVALID_ARGUMENT, "%s: opt is NULL", fn);
  const mtopt__plan_t *plan = mtopt__optimizer_plan(opt);
  CHECK(check_cuda_ctx(mtopt__optimizer_context(opt), fn));
  mtopt__hyper_t *h = plan->hyper;
  if (last_grad_norm) *last_grad_norm = &h->last_grad_norm;
  if (last_skipped) *last_skipped = &h->last_skipped;
  if (loss_scale) *loss_scale = &h->loss_scale;
  return MTOPT_STATUS_SUCCESS;
}

/* NCCL collectives for the distributed layer (CUDA contexts). With
 * backend_cuda.c, the only host file that includes CUDA or NCCL headers.
 *
 * Ordering: collectives run on a communication stream owned here; events
 * order it after the context's stream (the gradients are written) and the
 * context's stream after it (the step reads the reduced gradients). Nothing
 * here synchronises the host except set-up, mtopt__nccl_synchronize and
 * destroy. */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "comm_internal.h"
#include "mtopt/mtopt_cuda.h"

struct mtopt__nccl {
  mtopt_context_t *ctx;
  ncclComm_t comm;
  int owned; /* made here from a unique id: destroyed (or aborted) here */
  int world, rank;
  int timeout_ms;
  cudaStream_t stream;        /* communication stream */
  cudaEvent_t compute_done;   /* recorded on the context's stream */
  cudaEvent_t comm_done;      /* recorded on the communication stream */
};

static mtopt_status_t cuda_fail(mtopt_context_t *ctx, cudaError_t e, const char *what) {
  return mtopt__error(ctx, MTOPT_STATUS_CUDA_ERROR, "%s: CUDA error %s: %s", what,
                      cudaGetErrorName(e), cudaGetErrorString(e));
}

static mtopt_status_t nccl_fail(mtopt_context_t *ctx, ncclResult_t r, const char *what) {
  return mtopt__error(ctx, MTOPT_STATUS_COMM_ERROR, "%s: NCCL error %d: %s", what, (int)r,
                      ncclGetErrorString(r));
}

#define CUDA_CHECK(ctx, expr, what)                                            \
  do {                                                                         \
    cudaError_t e_ = (expr);                                                   \
    if (e_ != cudaSuccess) return cuda_fail((ctx), e_, (what));                \
  } while (0)
#define NCCL_CHECK(ctx, expr, what)                                            \
  do {                                                                         \
    ncclResult_t r_ = (expr);                                                  \
    if (r_ != ncclSuccess) return nccl_fail((ctx), r_, (what));                \
  } while (0)

/* The context's stream, read at every use: the user may switch it
 * (mtopt_cuda_context_set_stream) between steps. */
static cudaStream_t ctx_stream(mtopt_context_t *ctx) {
  cudaStream_t s = 0;
  if (mtopt_cuda_context_get_stream(ctx, &s) != MTOPT_STATUS_SUCCESS) return 0;
  return s;
}

mtopt_status_t mtopt__nccl_unique_id(mtopt_context_t *ctx, void *id) {
  _Static_assert(sizeof(ncclUniqueId) == MTOPT__NCCL_ID_BYTES, "ncclUniqueId size");
  ncclUniqueId u;
  NCCL_CHECK(ctx, ncclGetUniqueId(&u), "ncclGetUniqueId");
  memcpy(id, &u, sizeof u);
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt__nccl_comm_info(mtopt_context_t *ctx, void *nccl_comm, int *rank,
                                     int *size) {
  ncclComm_t c = (ncclComm_t)nccl_comm;
  NCCL_CHECK(ctx, ncclCommUserRank(c, rank), "ncclCommUserRank");
  NCCL_CHECK(ctx, ncclCommCount(c, size), "ncclCommCount");
  int dev = -1;
  NCCL_CHECK(ctx, ncclCommCuDevice(c, &dev), "ncclCommCuDevice");
  if (dev != ctx->device)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "mtopt_comm_create_nccl: the NCCL communicator is on device %d, the "
                        "context on device %d",
                        dev, ctx->device);
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt__nccl_create(mtopt_context_t *ctx, const void *id, int world, int rank,
                                  void *existing, int timeout_ms, mtopt__nccl_t **out) {
  static const char fn[] = "mtopt_comm_create (NCCL)";
  CUDA_CHECK(ctx, cudaSetDevice(ctx->device), "cudaSetDevice");
  mtopt__nccl_t *n = calloc(1, sizeof *n);
  if (!n) return mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: calloc failed", fn);
  n->ctx = ctx;
  n->world = world;
  n->rank = rank;
  n->timeout_ms = timeout_ms;
  mtopt_status_t st = MTOPT_STATUS_SUCCESS;
  cudaError_t e = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&n->compute_done, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&n->comm_done, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    st = cuda_fail(ctx, e, "creating the communication stream");
    goto fail;
  }
  if (existing) {
    n->comm = (ncclComm_t)existing;
  } else {
    ncclUniqueId u;
    memcpy(&u, id, sizeof u);
    ncclResult_t r = ncclCommInitRank(&n->comm, world, u, rank);
    if (r != ncclSuccess) {
      st = nccl_fail(ctx, r, "ncclCommInitRank");
      goto fail;
    }
    n->owned = 1;
  }
  *out = n;
  return MTOPT_STATUS_SUCCESS;
fail:
  if (n->comm_done) cudaEventDestroy(n->comm_done);
  if (n->compute_done) cudaEventDestroy(n->compute_done);
  if (n->stream) cudaStreamDestroy(n->stream);
  free(n);
  return st;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Polls the communication stream and the context's stream with the NCCL
 * asynchronous error, at most timeout_ms. On expiry or an NCCL error an
 * owned communicator is aborted (its kernels stop), so the streams drain. */
mtopt_status_t mtopt__nccl_synchronize(mtopt__nccl_t *n) {
  mtopt_context_t *ctx = n->ctx;
  static const char fn[] = "mtopt_dist_synchronize";
  CUDA_CHECK(ctx, cudaSetDevice(ctx->device), "cudaSetDevice");
  const double deadline = now_ms() + n->timeout_ms;
  cudaStream_t s2 = ctx_stream(ctx);
  for (;;) {
    ncclResult_t async = ncclSuccess;
    NCCL_CHECK(ctx, ncclCommGetAsyncError(n->comm, &async), "ncclCommGetAsyncError");
    if (async != ncclSuccess) {
      if (n->owned) ncclCommAbort(n->comm), n->comm = NULL;
      return nccl_fail(ctx, async, fn);
    }
    cudaError_t e1 = cudaStreamQuery(n->stream);
    cudaError_t e2 = cudaStreamQuery(s2);
    if (e1 == cudaSuccess && e2 == cudaSuccess) return MTOPT_STATUS_SUCCESS;
    if (e1 != cudaSuccess && e1 != cudaErrorNotReady) return cuda_fail(ctx, e1, fn);
    if (e2 != cudaSuccess && e2 != cudaErrorNotReady) return cuda_fail(ctx, e2, fn);
    if (n->timeout_ms > 0 && now_ms() > deadline) {
      if (n->owned) ncclCommAbort(n->comm), n->comm = NULL;
      return mtopt__error(ctx, MTOPT_STATUS_COMM_ERROR,
                          "%s: the collectives did not finish within timeout_ms = %d; the "
                          "NCCL communicator was aborted",
                          fn, n->timeout_ms);
    }
    sched_yield();
  }
}

mtopt_status_t mtopt__nccl_destroy(mtopt__nccl_t *n) {
  if (!n) return MTOPT_STATUS_SUCCESS;
  mtopt_status_t st = MTOPT_STATUS_SUCCESS;
  if (n->comm) st = mtopt__nccl_synchronize(n);
  if (n->owned && n->comm) {
    ncclResult_t r = ncclCommDestroy(n->comm);
    if (r != ncclSuccess && st == MTOPT_STATUS_SUCCESS) st = nccl_fail(n->ctx, r, "ncclCommDestroy");
  }
  cudaEventDestroy(n->comm_done);
  cudaEventDestroy(n->compute_done);
  cudaStreamDestroy(n->stream);
  free(n);
  return st;
}

static mtopt_status_t usable(mtopt__nccl_t *n, const char *what) {
  if (!n->comm)
    return mtopt__error(n->ctx, MTOPT_STATUS_COMM_ERROR,
                        "%s: the NCCL communicator was aborted after an earlier failure", what);
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt__nccl_comm_wait_compute(mtopt__nccl_t *n) {
  mtopt_context_t *ctx = n->ctx;
  CUDA_CHECK(ctx, cudaEventRecord(n->compute_done, ctx_stream(ctx)), "cudaEventRecord");
  CUDA_CHECK(ctx, cudaStreamWaitEvent(n->stream, n->compute_done, 0), "cudaStreamWaitEvent");
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt__nccl_compute_wait_comm(mtopt__nccl_t *n) {
  mtopt_context_t *ctx = n->ctx;
  CUDA_CHECK(ctx, cudaEventRecord(n->comm_done, n->stream), "cudaEventRecord");
  CUDA_CHECK(ctx, cudaStreamWaitEvent(ctx_stream(ctx), n->comm_done, 0), "cudaStreamWaitEvent");
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt__nccl_allreduce_avg_f32(mtopt__nccl_t *n, float *buf, int64_t count) {
  static const char what[] = "ncclAllReduce (bucket)";
  CHECK(usable(n, what));
  if (count == 0) return MTOPT_STATUS_SUCCESS;
  NCCL_CHECK(n->ctx, ncclAllReduce(buf, buf, (size_t)count, ncclFloat32, ncclAvg, n->comm,
                                   n->stream),
             what);
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt__nccl_reduce_scatter_avg_f32(mtopt__nccl_t *n, const float *send,
                                                  float *recv, int64_t recvcount) {
  static const char what[] = "ncclReduceScatter (bucket)";
  CHECK(usable(n, what));
  if (recvcount == 0) return MTOPT_STATUS_SUCCESS;
  NCCL_CHECK(n->ctx, ncclReduceScatter(send, recv, (size_t)recvcount, ncclFloat32, ncclAvg,
                                       n->comm, n->stream),
             what);
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt__nccl_allgather_f32(mtopt__nccl_t *n, float *buf, int64_t count) {
  static const char what[] = "ncclAllGather (weights)";
  CHECK(usable(n, what));
  if (count == 0) return MTOPT_STATUS_SUCCESS;
  NCCL_CHECK(n->ctx, ncclAllGather(buf + (int64_t)n->rank * count, buf, (size_t)count,
                                   ncclFloat32, n->comm, n->stream),
             what);
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt__nccl_allreduce_sum_f64(mtopt__nccl_t *n, double *buf, int64_t count) {
  static const char what[] = "ncclAllReduce (gradient norm)";
  CHECK(usable(n, what));
  NCCL_CHECK(n->ctx, ncclAllReduce(buf, buf, (size_t)count, ncclFloat64, ncclSum, n->comm,
                                   n->stream),
             what);
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt__nccl_copy(mtopt__nccl_t *n, void *dst, const void *src, size_t bytes) {
  if (bytes == 0 || dst == src) return MTOPT_STATUS_SUCCESS;
  CUDA_CHECK(n->ctx, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, n->stream),
             "cudaMemcpyAsync (ZeRO-1 weights)");
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt__nccl_allreduce_max_i64(mtopt__nccl_t *n, int64_t *host, int count) {
  mtopt_context_t *ctx = n->ctx;
  static const char what[] = "mtopt_dist_optimizer_create (plan check)";
  CHECK(usable(n, what));
  void *dev = NULL;
  const size_t bytes = (size_t)count * sizeof(int64_t);
  CUDA_CHECK(ctx, cudaMalloc(&dev, bytes), "cudaMalloc (plan check)");
  mtopt_status_t st = MTOPT_STATUS_SUCCESS;
  cudaError_t e = cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, n->stream);
  if (e != cudaSuccess) {
    st = cuda_fail(ctx, e, what);
    goto done;
  }
  ncclResult_t r = ncclAllReduce(dev, dev, (size_t)count, ncclInt64, ncclMax, n->comm, n->stream);
  if (r != ncclSuccess) {
    st = nccl_fail(ctx, r, what);
    goto done;
  }
  e = cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, n->stream);
  if (e != cudaSuccess) {
    st = cuda_fail(ctx, e, what);
    goto done;
  }
  st = mtopt__nccl_synchronize(n); /* bounded by the timeout */
done:
  if (st == MTOPT_STATUS_SUCCESS || n->comm == NULL) cudaFree(dev);
  return st;
}

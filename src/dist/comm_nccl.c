/* NCCL collectives for the distributed layer (CUDA contexts). With
 * backend_cuda.c and sm_partition.c, the only host files that include CUDA
 * headers, and the only one with NCCL's.
 *
 * Ordering: collectives run on a communication stream owned here (created
 * non-blocking, so that it never serialises implicitly with the legacy default
 * stream the context may use); events order it after the context's stream
 * (the gradients are written) and the bucket steps after it (a segment's pass
 * reads its reduced gradients: one event per segment, see
 * mtopt__nccl_events_t). Nothing here synchronises the host except set-up,
 * mtopt__nccl_synchronize and destroy.
 *
 * SM partition. A bucket step streams w, g, m, v at full bandwidth from every
 * SM; NCCL's kernels, overlapped with it on the same SMs, slowed so much that
 * the overlap hid almost nothing (GPT-2 XL, 2 H200s, 100 MB buckets:
 * communication 21.7 ms, step 11.4 ms, both together 31-33 ms). Throttling the
 * step's grid did not help (its slower step ran into the end of the
 * communication). Giving each its own SMs did: the collectives on 32 SMs (NCCL
 * with 32 CTAs), the steps on the other 100 (where the step alone takes 11.5
 * ms instead of 11.4) gave 23.5 ms, the collectives running at 98% of their
 * speed alone. So the communication stream and the bucket steps' stream live
 * in two green contexts that split the device (sm_partition.c). Without a
 * partition both are ordinary non-blocking streams, so that the bucket steps
 * are ordered the same way with and without one: the steps' stream is joined
 * to the context's stream at both ends of a step.
 *
 * Collectives are issued one by one, never inside ncclGroupStart/End: a group
 * would launch them together at ncclGroupEnd, and the per-segment event recorded
 * after each could then not separate one segment's completion from the next.
 *
 * Device: the runtime's current device is per host thread and belongs to the
 * caller; every entry point makes the context's device current and puts the
 * caller's back (as backend_cuda.c does). */
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime.h>
#include <nccl.h>

#include "comm_internal.h"
#include "../backend/cuda/cuda_glue.h"
#include "mtopt/mtopt_cuda.h"
#include "sm_partition.h"

/* ncclAvg (the average folded into the reduction) arrived in NCCL 2.10. */
#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < NCCL_VERSION(2, 10, 0)
#error "mtopt's NCCL path needs NCCL 2.10 or newer (ncclAvg)"
#endif
#define MTOPT__NCCL_MIN_VERSION 21000 /* 2.10.0 in ncclGetVersion's encoding */

struct mtopt__nccl {
  mtopt_context_t *ctx;
  ncclComm_t comm; /* NULL once aborted */
  int owned;       /* made here from a unique id: destroyed (or aborted) here */
  int failed;      /* an asynchronous error or timeout was seen */
  int world, rank;
  int timeout_ms;
  cudaStream_t stream;      /* communication stream */
  cudaEvent_t compute_done; /* recorded on the context's stream */
  cudaEvent_t comm_done;    /* recorded on the communication stream */
  /* The SM partition, or NULL: then both streams are ordinary ones. */
  mtopt__sm_partition_t *part;
  cudaStream_t steps;     /* the bucket steps' stream */
  void *steps_handle;     /* the same, as ops->run_pass takes it */
  cudaEvent_t steps_done; /* recorded on `steps` */
};

struct mtopt__nccl_events {
  mtopt__nccl_t *n;
  int count;
  cudaEvent_t ev[];
};

static mtopt_status_t nccl_fail(mtopt_context_t *ctx, ncclResult_t r, const char *what) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  const char *detail = ncclGetLastError(NULL); /* NCCL's own detail, if any */
#else
  const char *detail = "";
#endif
  return mtopt__error(ctx, MTOPT_STATUS_COMM_ERROR, "%s: NCCL error %d: %s%s%s%s", what, (int)r,
                      ncclGetErrorString(r), detail && *detail ? " (" : "",
                      detail ? detail : "", detail && *detail ? ")" : "");
}

/* Inside a function holding `mtopt__device_guard_t g_` and `mtopt_status_t st_`, with a
 * `done:` label that calls mtopt__device_leave. */
#define CUDA_TRY(ctx, expr, what)                                              \
  do {                                                                         \
    cudaError_t e_ = (expr);                                                   \
    if (e_ != cudaSuccess) {                                                   \
      st_ = mtopt__cuda_fail((ctx), e_, (what));                                      \
      goto done;                                                               \
    }                                                                          \
  } while (0)
#define NCCL_TRY(ctx, expr, what)                                              \
  do {                                                                         \
    ncclResult_t r_ = (expr);                                                  \
    if (r_ != ncclSuccess) {                                                   \
      st_ = nccl_fail((ctx), r_, (what));                                      \
      goto done;                                                               \
    }                                                                          \
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
  int version = 0;
  ncclResult_t r = ncclGetVersion(&version);
  if (r != ncclSuccess) return nccl_fail(ctx, r, "ncclGetVersion");
  if (version < MTOPT__NCCL_MIN_VERSION)
    return mtopt__error(ctx, MTOPT_STATUS_NOT_SUPPORTED,
                        "mtopt_comm_create_mpi: the NCCL library loaded is version code %d; "
                        "mtopt needs 2.10 or newer (ncclAvg)",
                        version);
  ncclUniqueId u;
  r = ncclGetUniqueId(&u);
  if (r != ncclSuccess) return nccl_fail(ctx, r, "ncclGetUniqueId");
  memcpy(id, &u, sizeof u);
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt__nccl_comm_info(mtopt_context_t *ctx, void *nccl_comm, int *rank,
                                     int *size) {
  ncclComm_t c = (ncclComm_t)nccl_comm;
  ncclResult_t r = ncclCommUserRank(c, rank);
  if (r == ncclSuccess) r = ncclCommCount(c, size);
  int dev = -1;
  if (r == ncclSuccess) r = ncclCommCuDevice(c, &dev);
  if (r != ncclSuccess) return nccl_fail(ctx, r, "mtopt_comm_create_nccl");
  if (dev != mtopt__context_device(ctx))
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "mtopt_comm_create_nccl: the NCCL communicator is on device %d, the "
                        "context on device %d",
                        dev, mtopt__context_device(ctx));
  return MTOPT_STATUS_SUCCESS;
}

/* An owned communicator on a partition: as many CTAs as the collectives have
 * SMs (NCCL's default, 24 channels on 2 H200s, ran the collectives 10% slower
 * on 32 SMs than 32 CTAs did). */
static ncclResult_t init_owned(mtopt__nccl_t *n, const ncclUniqueId u) {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 17, 0)
  if (n->part) {
    int ctas = mtopt__sm_partition_sms(n->part, 0);
    if (ctas > MTOPT_COMM_AUTO_SMS) ctas = MTOPT_COMM_AUTO_SMS;
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.minCTAs = cfg.maxCTAs = ctas;
    return ncclCommInitRankConfig(&n->comm, n->world, u, n->rank, &cfg);
  }
#endif
  return ncclCommInitRank(&n->comm, n->world, u, n->rank);
}

mtopt_status_t mtopt__nccl_create(mtopt_context_t *ctx, int world, int rank, void *existing,
                                  int timeout_ms, int comm_sm_count, mtopt__nccl_t **out) {
  static const char fn[] = "mtopt_comm_create (NCCL)";
  mtopt__device_guard_t g_;
  CHECK(mtopt__device_enter(ctx, &g_));
  mtopt_status_t st_ = MTOPT_STATUS_SUCCESS;
  mtopt__nccl_t *n = calloc(1, sizeof *n);
  if (!n) {
    mtopt__device_leave(&g_);
    return mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: calloc failed", fn);
  }
  n->ctx = ctx;
  n->world = world;
  n->rank = rank;
  n->timeout_ms = timeout_ms;
  {
    const int sms = comm_sm_count > 0                  ? comm_sm_count
                    : comm_sm_count == 0 && world > 1 ? MTOPT_COMM_AUTO_SMS
                                                      : 0;
    if (sms > 0) {
      st_ = mtopt__sm_partition_create(ctx, sms, comm_sm_count > 0, &n->part);
      if (st_ != MTOPT_STATUS_SUCCESS) goto done;
    }
  }
  if (n->part) {
    n->stream = mtopt__sm_partition_stream(n->part, 0);
    n->steps = mtopt__sm_partition_stream(n->part, 1);
  } else {
    CUDA_TRY(ctx, cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking),
             "creating the communication stream");
    CUDA_TRY(ctx, cudaStreamCreateWithFlags(&n->steps, cudaStreamNonBlocking),
             "creating the steps' stream");
  }
  n->steps_handle = (void *)n->steps;
  CUDA_TRY(ctx, cudaEventCreateWithFlags(&n->steps_done, cudaEventDisableTiming),
           "creating an event");
  CUDA_TRY(ctx, cudaEventCreateWithFlags(&n->compute_done, cudaEventDisableTiming),
           "creating an event");
  CUDA_TRY(ctx, cudaEventCreateWithFlags(&n->comm_done, cudaEventDisableTiming),
           "creating an event");
  n->comm = (ncclComm_t)existing;
done:
  if (st_ != MTOPT_STATUS_SUCCESS) {
    if (n->comm_done) cudaEventDestroy(n->comm_done);
    if (n->compute_done) cudaEventDestroy(n->compute_done);
    if (n->steps_done) cudaEventDestroy(n->steps_done);
    if (n->part) {
      mtopt__sm_partition_destroy(n->part);
    } else {
      if (n->stream) cudaStreamDestroy(n->stream);
      if (n->steps) cudaStreamDestroy(n->steps);
    }
    free(n);
  } else {
    *out = n;
  }
  mtopt__device_leave(&g_);
  return st_;
}

mtopt_status_t mtopt__nccl_init(mtopt__nccl_t *n, const void *id) {
  mtopt__device_guard_t g_;
  CHECK(mtopt__device_enter(n->ctx, &g_));
  mtopt_status_t st_ = MTOPT_STATUS_SUCCESS;
  ncclUniqueId u;
  memcpy(&u, id, sizeof u);
  /* Blocking, on the context's device (current here). */
  NCCL_TRY(n->ctx, init_owned(n, u), "ncclCommInitRank");
  n->owned = 1;
done:
  mtopt__device_leave(&g_);
  return st_;
}

int mtopt__nccl_is_wrapped(const mtopt__nccl_t *n) { return !n->owned; }

void mtopt__nccl_sm_split(const mtopt__nccl_t *n, int *comm_sms, int *step_sms) {
  *comm_sms = n->part ? mtopt__sm_partition_sms(n->part, 0) : 0;
  *step_sms = n->part ? mtopt__sm_partition_sms(n->part, 1) : 0;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* After an asynchronous error or a timeout: an owned communicator is aborted
 * (its kernels stop, so the streams drain and buffers can be freed). */
static void abort_owned(mtopt__nccl_t *n) {
  n->failed = 1;
  if (n->owned && n->comm) {
    (void)ncclCommAbort(n->comm);
    n->comm = NULL;
  }
}

static mtopt_status_t usable(mtopt__nccl_t *n, const char *what) {
  if (!n->comm || n->failed)
    return mtopt__error(n->ctx, MTOPT_STATUS_COMM_ERROR,
                        "%s: the NCCL communicator failed earlier (asynchronous error or "
                        "timeout)%s",
                        what, n->comm ? "" : "; it was aborted");
  return MTOPT_STATUS_SUCCESS;
}

/* ncclCommGetAsyncError reads a flag: cheap enough for every enqueueing call.
 * ncclInProgress (a non-blocking communicator of the caller's still
 * initialising or running) is not an error. */
static ncclResult_t async_error(mtopt__nccl_t *n) {
  ncclResult_t async = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(n->comm, &async);
  if (r != ncclSuccess) return r;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
  if (async == ncclInProgress) return ncclSuccess;
#endif
  return async;
}

mtopt_status_t mtopt__nccl_check(mtopt__nccl_t *n, const char *what) {
  CHECK(usable(n, what));
  const ncclResult_t r = async_error(n);
  if (r != ncclSuccess) {
    abort_owned(n);
    return nccl_fail(n->ctx, r, what);
  }
  return MTOPT_STATUS_SUCCESS;
}

/* Polls the communication, steps' and context's streams with the NCCL
 * asynchronous error, at most timeout_ms. On expiry or an NCCL error an
 * owned communicator is aborted (its kernels stop), so the streams drain. */
mtopt_status_t mtopt__nccl_synchronize(mtopt__nccl_t *n) {
  mtopt_context_t *ctx = n->ctx;
  static const char fn[] = "mtopt_dist_synchronize";
  CHECK(usable(n, fn));
  mtopt__device_guard_t g_;
  CHECK(mtopt__device_enter(ctx, &g_));
  mtopt_status_t st_ = MTOPT_STATUS_SUCCESS;
  const double deadline = now_ms() + n->timeout_ms;
  const cudaStream_t s2 = ctx_stream(ctx);
  for (unsigned spin = 0;; spin++) {
    const ncclResult_t async = async_error(n);
    if (async != ncclSuccess) {
      abort_owned(n);
      st_ = nccl_fail(ctx, async, fn);
      goto done;
    }
    const cudaError_t e1 = cudaStreamQuery(n->stream);
    const cudaError_t e2 = cudaStreamQuery(s2);
    const cudaError_t e3 = cudaStreamQuery(n->steps);
    if (e1 == cudaSuccess && e2 == cudaSuccess && e3 == cudaSuccess) goto done;
    if (e1 != cudaSuccess && e1 != cudaErrorNotReady) CUDA_TRY(ctx, e1, fn);
    if (e2 != cudaSuccess && e2 != cudaErrorNotReady) CUDA_TRY(ctx, e2, fn);
    if (e3 != cudaSuccess && e3 != cudaErrorNotReady) CUDA_TRY(ctx, e3, fn);
    if (n->timeout_ms > 0 && (spin & 15) == 0 && now_ms() > deadline) {
      const int owned = n->owned;
      abort_owned(n);
      st_ = mtopt__error(ctx, MTOPT_STATUS_COMM_ERROR,
                         "%s: the collectives did not finish within timeout_ms = %d (a rank "
                         "did not join, or the network stalled); %s",
                         fn, n->timeout_ms,
                         owned ? "the NCCL communicator was aborted"
                               : "the caller's NCCL communicator was left as it is");
      goto done;
    }
    sched_yield();
  }
done:
  mtopt__device_leave(&g_);
  return st_;
}

mtopt_status_t mtopt__nccl_destroy(mtopt__nccl_t *n) {
  if (!n) return MTOPT_STATUS_SUCCESS;
  mtopt_status_t st = MTOPT_STATUS_SUCCESS;
  if (n->comm && !n->failed) st = mtopt__nccl_synchronize(n);
  mtopt__device_guard_t g;
  const int entered = mtopt__device_enter(n->ctx, &g) == MTOPT_STATUS_SUCCESS;
  if (n->owned && n->comm) {
    ncclResult_t r = ncclCommDestroy(n->comm);
    if (r != ncclSuccess && st == MTOPT_STATUS_SUCCESS) st = nccl_fail(n->ctx, r, "ncclCommDestroy");
  }
  cudaEventDestroy(n->comm_done);
  cudaEventDestroy(n->compute_done);
  cudaEventDestroy(n->steps_done);
  if (n->failed && !n->owned) {
    /* A caller's communicator that failed is never aborted here, so its
     * kernels may still run on our streams: leak the streams and green
     * contexts rather than destroy them under those kernels. */
  } else if (n->part) {
    mtopt__sm_partition_destroy(n->part);
  } else { /* returns at once; resources go when the work is done */
    cudaStreamDestroy(n->stream);
    cudaStreamDestroy(n->steps);
  }
  if (entered) mtopt__device_leave(&g);
  free(n);
  return st;
}

/* Stream `waiter` waits for the work enqueued on stream `on` so far, through
 * event e. */
static mtopt_status_t order(mtopt__nccl_t *n, cudaEvent_t e, cudaStream_t on,
                            cudaStream_t waiter) {
  mtopt__device_guard_t g_;
  CHECK(mtopt__device_enter(n->ctx, &g_));
  mtopt_status_t st_ = MTOPT_STATUS_SUCCESS;
  CUDA_TRY(n->ctx, cudaEventRecord(e, on), "cudaEventRecord");
  CUDA_TRY(n->ctx, cudaStreamWaitEvent(waiter, e, 0), "cudaStreamWaitEvent");
done:
  mtopt__device_leave(&g_);
  return st_;
}

mtopt_status_t mtopt__nccl_comm_wait_compute(mtopt__nccl_t *n) {
  return order(n, n->compute_done, ctx_stream(n->ctx), n->stream);
}

mtopt_status_t mtopt__nccl_compute_wait_comm(mtopt__nccl_t *n) {
  return order(n, n->comm_done, n->stream, ctx_stream(n->ctx));
}

mtopt_status_t mtopt__nccl_steps_begin(mtopt__nccl_t *n) {
  return order(n, n->compute_done, ctx_stream(n->ctx), n->steps);
}

mtopt_status_t mtopt__nccl_steps_end(mtopt__nccl_t *n) {
  return order(n, n->steps_done, n->steps, ctx_stream(n->ctx));
}

void *const *mtopt__nccl_steps_stream(const mtopt__nccl_t *n) { return &n->steps_handle; }

/* ---- per-segment events ---- */

mtopt_status_t mtopt__nccl_events_create(mtopt__nccl_t *n, int count,
                                         mtopt__nccl_events_t **out) {
  mtopt_context_t *ctx = n->ctx;
  if (count < 0) count = 0;
  mtopt__nccl_events_t *ev = calloc(1, sizeof *ev + (size_t)count * sizeof(cudaEvent_t));
  if (!ev) return mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "events: calloc failed");
  ev->n = n;
  mtopt__device_guard_t g_;
  mtopt_status_t st_ = mtopt__device_enter(ctx, &g_);
  if (st_ != MTOPT_STATUS_SUCCESS) {
    free(ev);
    return st_;
  }
  for (; ev->count < count; ev->count++)
    CUDA_TRY(ctx, cudaEventCreateWithFlags(&ev->ev[ev->count], cudaEventDisableTiming),
             "creating the segment events");
done:
  mtopt__device_leave(&g_);
  if (st_ != MTOPT_STATUS_SUCCESS) {
    mtopt__nccl_events_destroy(ev);
    return st_;
  }
  *out = ev;
  return MTOPT_STATUS_SUCCESS;
}

void mtopt__nccl_events_destroy(mtopt__nccl_events_t *ev) {
  if (!ev) return;
  mtopt__device_guard_t g;
  const int entered = mtopt__device_enter(ev->n->ctx, &g) == MTOPT_STATUS_SUCCESS;
  for (int i = 0; i < ev->count; i++) cudaEventDestroy(ev->ev[i]);
  if (entered) mtopt__device_leave(&g);
  free(ev);
}

mtopt_status_t mtopt__nccl_record(mtopt__nccl_events_t *ev, int i) {
  mtopt__nccl_t *n = ev->n;
  if (i < 0 || i >= ev->count)
    return mtopt__error(n->ctx, MTOPT_STATUS_INTERNAL, "segment event %d out of [0, %d)", i,
                        ev->count);
  mtopt__device_guard_t g_;
  CHECK(mtopt__device_enter(n->ctx, &g_));
  mtopt_status_t st_ = MTOPT_STATUS_SUCCESS;
  CUDA_TRY(n->ctx, cudaEventRecord(ev->ev[i], n->stream), "cudaEventRecord (segment)");
done:
  mtopt__device_leave(&g_);
  return st_;
}

mtopt_status_t mtopt__nccl_steps_wait(mtopt__nccl_events_t *ev, int i) {
  mtopt__nccl_t *n = ev->n;
  if (i < 0 || i >= ev->count)
    return mtopt__error(n->ctx, MTOPT_STATUS_INTERNAL, "segment event %d out of [0, %d)", i,
                        ev->count);
  mtopt__device_guard_t g_;
  CHECK(mtopt__device_enter(n->ctx, &g_));
  mtopt_status_t st_ = MTOPT_STATUS_SUCCESS;
  CUDA_TRY(n->ctx, cudaStreamWaitEvent(n->steps, ev->ev[i], 0),
           "cudaStreamWaitEvent (segment)");
done:
  mtopt__device_leave(&g_);
  return st_;
}

/* ---- collectives ---- */

/* The body every collective shares: refused on a failed communicator, nothing
 * to do for an empty range (every rank has the same plan, so all skip it), the
 * context's device current around the NCCL call. */
#define COLLECTIVE(n, what, count, call)                                       \
  do {                                                                         \
    CHECK(usable((n), (what)));                                                \
    if ((count) == 0) return MTOPT_STATUS_SUCCESS;                             \
    mtopt__device_guard_t g_;                                                            \
    CHECK(mtopt__device_enter((n)->ctx, &g_));                                           \
    const ncclResult_t r_ = (call);                                            \
    mtopt__device_leave(&g_);                                                            \
    return r_ == ncclSuccess ? MTOPT_STATUS_SUCCESS : nccl_fail((n)->ctx, r_, (what)); \
  } while (0)

mtopt_status_t mtopt__nccl_allreduce_avg_f32(mtopt__nccl_t *n, float *buf, int64_t count) {
  COLLECTIVE(n, "ncclAllReduce (bucket)", count,
             ncclAllReduce(buf, buf, (size_t)count, ncclFloat32, ncclAvg, n->comm, n->stream));
}

mtopt_status_t mtopt__nccl_reduce_scatter_avg_f32(mtopt__nccl_t *n, const float *send,
                                                  float *recv, int64_t recvcount) {
  COLLECTIVE(n, "ncclReduceScatter (bucket)", recvcount,
             ncclReduceScatter(send, recv, (size_t)recvcount, ncclFloat32, ncclAvg, n->comm,
                               n->stream));
}

mtopt_status_t mtopt__nccl_allgather_f32(mtopt__nccl_t *n, float *buf, int64_t count) {
  /* In place: NCCL's rule is sendbuff == recvbuff + rank * sendcount. */
  COLLECTIVE(n, "ncclAllGather (weights)", count,
             ncclAllGather(buf + (int64_t)n->rank * count, buf, (size_t)count, ncclFloat32,
                           n->comm, n->stream));
}

mtopt_status_t mtopt__nccl_allreduce_sum_f64(mtopt__nccl_t *n, double *buf, int64_t count) {
  COLLECTIVE(n, "ncclAllReduce (gradient norm)", count,
             ncclAllReduce(buf, buf, (size_t)count, ncclFloat64, ncclSum, n->comm, n->stream));
}

mtopt_status_t mtopt__nccl_copy(mtopt__nccl_t *n, void *dst, const void *src, size_t bytes) {
  if (bytes == 0 || dst == src) return MTOPT_STATUS_SUCCESS;
  mtopt__device_guard_t g_;
  CHECK(mtopt__device_enter(n->ctx, &g_));
  mtopt_status_t st_ = MTOPT_STATUS_SUCCESS;
  CUDA_TRY(n->ctx, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, n->stream),
           "cudaMemcpyAsync (ZeRO-1 weights)");
done:
  mtopt__device_leave(&g_);
  return st_;
}

mtopt_status_t mtopt__nccl_allreduce_max_i64(mtopt__nccl_t *n, int64_t *host, int count) {
  mtopt_context_t *ctx = n->ctx;
  static const char what[] = "mtopt_dist_optimizer_create (plan check)";
  CHECK(usable(n, what));
  if (count <= 0) return MTOPT_STATUS_SUCCESS;
  mtopt__device_guard_t g_;
  CHECK(mtopt__device_enter(ctx, &g_));
  mtopt_status_t st_ = MTOPT_STATUS_SUCCESS;
  void *dev = NULL;
  const size_t bytes = (size_t)count * sizeof(int64_t);
  CUDA_TRY(ctx, cudaMalloc(&dev, bytes), "cudaMalloc (plan check)");
  CUDA_TRY(ctx, cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, n->stream), what);
  NCCL_TRY(ctx, ncclAllReduce(dev, dev, (size_t)count, ncclInt64, ncclMax, n->comm, n->stream),
           what);
  /* Wait (bounded) before the copy back: a copy into pageable memory blocks
   * the host until the stream gets there, with no timeout. */
  st_ = mtopt__nccl_synchronize(n);
  if (st_ != MTOPT_STATUS_SUCCESS) goto done;
  CUDA_TRY(ctx, cudaMemcpy(host, dev, bytes, cudaMemcpyDeviceToHost), what);
done:
  /* A collective that never finished may still write dev (a caller's
   * communicator is not aborted): leak it rather than free it under NCCL. */
  if (dev && (st_ == MTOPT_STATUS_SUCCESS || n->comm == NULL)) cudaFree(dev);
  mtopt__device_leave(&g_);
  return st_;
}

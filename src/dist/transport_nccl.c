/* The NCCL transport (transport.h): the collectives of CUDA contexts; its
 * set-up is in transport_nccl_setup.c. With backend_cuda.c and sm_partition.c,
 * the only host files that include CUDA headers, and the only ones with
 * NCCL's.
 *
 * Ordering: collectives run on a communication stream owned here (created
 * non-blocking, so that it never serialises implicitly with the legacy default
 * stream the context may use); events order it after the context's stream
 * (the gradients are written) and the bucket steps after it (a segment's pass
 * reads its reduced gradients: one event per segment, see the slots below).
 * Nothing here synchronises the host except set-up, synchronize and destroy.
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
#include <stdlib.h>

#include "clock.h"
#include "transport_nccl.h"

/* Per-segment completion events: event i is recorded on the communication
 * stream right after segment i's collective, and the steps' stream waits on
 * exactly that one before segment i's pass, so the pass of segment i overlaps
 * the collectives of segments i+1, ... (a single event re-recorded per
 * segment could not express this once several collectives are queued ahead).
 * The all-gather slots need none: only the communication stream reads them. */
struct mtopt__transport_slots {
  mtopt__transport_t *n;
  int count; /* events made: the reductions */
  cudaEvent_t ev[];
};
/* ------------------------------------------------ failures and waits ----- */

/* After an asynchronous error or a timeout: an owned communicator is aborted
 * (its kernels stop, so the streams drain and buffers can be freed). */
void mtopt__nccl_abort(nccl_t *n) {
  n->failed = 1;
  if (n->owned && n->comm) {
    (void)ncclCommAbort(n->comm);
    n->comm = NULL;
  }
}

mtopt_status_t mtopt__nccl_usable(nccl_t *n, const char *what) {
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
static ncclResult_t async_error(nccl_t *n) {
  ncclResult_t async = ncclSuccess;
  const ncclResult_t r = ncclCommGetAsyncError(n->comm, &async);
  if (r != ncclSuccess) return r;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
  if (async == ncclInProgress) return ncclSuccess;
#endif
  return async;
}

/* A non-blocking look at ncclCommGetAsyncError (and whether the communicator
 * was aborted): COMM_ERROR if the communicator is unusable. */
static mtopt_status_t nccl_check(nccl_t *n, const char *what) {
  CHECK(mtopt__nccl_usable(n, what));
  const ncclResult_t r = async_error(n);
  if (r != ncclSuccess) {
    mtopt__nccl_abort(n);
    return nccl_fail(n->ctx, r, what);
  }
  return MTOPT_STATUS_SUCCESS;
}

/* A stream's state: done (1), not yet (0), or a CUDA error (-1, set). */
static int stream_done(nccl_t *n, cudaStream_t s, mtopt_status_t *st, const char *what) {
  const cudaError_t e = cudaStreamQuery(s);
  if (e == cudaSuccess) return 1;
  if (e == cudaErrorNotReady) return 0;
  *st = mtopt__cuda_fail(n->ctx, e, what);
  return -1;
}

/* Polls the communication, steps' and context's streams with the NCCL
 * asynchronous error until one deadline, timeout_ms from the call, sleeping
 * between polls once the wait grows long (clock.h). Any failure (expiry, an
 * NCCL or a CUDA error) marks the transport failed and aborts an owned
 * communicator (its kernels stop, so the streams drain): every later call
 * is refused at once (mtopt__nccl_usable), destroy included, so nothing
 * waits a second time. */
mtopt_status_t mtopt__nccl_synchronize(nccl_t *n) {
  mtopt_context_t *ctx = n->ctx;
  static const char fn[] = "mtopt_dist_synchronize";
  CHECK(mtopt__nccl_usable(n, fn));
  mtopt__device_guard_t g_;
  CHECK(mtopt__device_enter(ctx, &g_));
  mtopt_status_t st_ = MTOPT_STATUS_SUCCESS;
  const double start = mtopt__now_ms();
  const cudaStream_t s2 = ctx_stream(ctx);
  for (;;) {
    const ncclResult_t async = async_error(n);
    if (async != ncclSuccess) {
      st_ = nccl_fail(ctx, async, fn);
      break;
    }
    const int d1 = stream_done(n, n->stream, &st_, fn);
    const int d2 = d1 < 0 ? -1 : stream_done(n, s2, &st_, fn);
    const int d3 = d2 < 0 ? -1 : stream_done(n, n->steps, &st_, fn);
    if (d3 < 0) break;
    if (d1 && d2 && d3) break;
    const double waited = mtopt__now_ms() - start;
    if (n->timeout_ms > 0 && waited > n->timeout_ms) {
      st_ = mtopt__error(ctx, MTOPT_STATUS_COMM_ERROR,
                         "%s: the collectives did not finish within timeout_ms = %d (a rank "
                         "did not join, or the network stalled); %s",
                         fn, n->timeout_ms,
                         n->owned ? "the NCCL communicator was aborted"
                                  : "the caller's NCCL communicator was left as it is");
      break;
    }
    mtopt__poll_pause(waited);
  }
  if (st_ != MTOPT_STATUS_SUCCESS) mtopt__nccl_abort(n);
  mtopt__device_leave(&g_);
  return st_;
}

/* ----------------------------------------------------------- ordering ---- */

/* Stream `waiter` waits for the work enqueued on stream `on` so far, through
 * event e. */
static mtopt_status_t order(nccl_t *n, cudaEvent_t e, cudaStream_t on, cudaStream_t waiter) {
  mtopt__device_guard_t g_;
  CHECK(mtopt__device_enter(n->ctx, &g_));
  mtopt_status_t st_ = MTOPT_STATUS_SUCCESS;
  CUDA_TRY(n->ctx, cudaEventRecord(e, on), "cudaEventRecord");
  CUDA_TRY(n->ctx, cudaStreamWaitEvent(waiter, e, 0), "cudaStreamWaitEvent");
done:
  mtopt__device_leave(&g_);
  return st_;
}

static mtopt_status_t nccl_comm_wait_compute(nccl_t *n) {
  return order(n, n->compute_done, ctx_stream(n->ctx), n->stream);
}

static mtopt_status_t nccl_compute_wait_comm(nccl_t *n) {
  return order(n, n->comm_done, n->stream, ctx_stream(n->ctx));
}

static mtopt_status_t nccl_steps_begin(nccl_t *n) {
  return order(n, n->compute_done, ctx_stream(n->ctx), n->steps);
}

static mtopt_status_t nccl_steps_end(nccl_t *n) {
  return order(n, n->steps_done, n->steps, ctx_stream(n->ctx));
}

static mtopt_status_t nccl_comm_wait_steps(nccl_t *n) {
  return order(n, n->steps_done, n->steps, n->stream);
}

static void *const *nccl_steps_stream(const nccl_t *n) { return &n->steps_handle; }
static void *const *nccl_comm_stream(const nccl_t *n) { return &n->stream_handle; }

/* ------------------------------------------------ per-segment events ----- */

static void nccl_slots_destroy(mtopt__transport_slots_t *ev) {
  if (!ev) return;
  mtopt__device_guard_t g;
  const int entered = mtopt__device_enter(ev->n->ctx, &g) == MTOPT_STATUS_SUCCESS;
  for (int i = 0; i < ev->count; i++) cudaEventDestroy(ev->ev[i]);
  if (entered) mtopt__device_leave(&g);
  free(ev);
}

static mtopt_status_t nccl_slots_create(nccl_t *n, int count, int gathers,
                                        mtopt__transport_slots_t **out) {
  (void)gathers; /* ordered on the communication stream: no event */
  mtopt_context_t *ctx = n->ctx;
  if (count < 0) count = 0;
  mtopt__transport_slots_t *ev = calloc(1, sizeof *ev + (size_t)count * sizeof(cudaEvent_t));
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
    nccl_slots_destroy(ev);
    return st_;
  }
  *out = ev;
  return MTOPT_STATUS_SUCCESS;
}

/* Event i on the communication stream (`steps` 0), or the steps' stream
 * waiting on it (`steps` 1). */
static mtopt_status_t event_op(mtopt__transport_slots_t *ev, int i, int steps) {
  nccl_t *n = ev->n;
  if (i < 0 || i >= ev->count)
    return mtopt__error(n->ctx, MTOPT_STATUS_INTERNAL, "segment event %d out of [0, %d)", i,
                        ev->count);
  mtopt__device_guard_t g_;
  CHECK(mtopt__device_enter(n->ctx, &g_));
  mtopt_status_t st_ = MTOPT_STATUS_SUCCESS;
  if (steps)
    CUDA_TRY(n->ctx, cudaStreamWaitEvent(n->steps, ev->ev[i], 0),
             "cudaStreamWaitEvent (segment)");
  else
    CUDA_TRY(n->ctx, cudaEventRecord(ev->ev[i], n->stream), "cudaEventRecord (segment)");
done:
  mtopt__device_leave(&g_);
  return st_;
}

/* Nothing completes on the host: the steps wait in stream order (wait). */
static mtopt_status_t nccl_test(mtopt__transport_slots_t *s, int i, int *done, const char *what) {
  (void)s, (void)i, (void)what;
  *done = 0;
  return MTOPT_STATUS_SUCCESS;
}

static mtopt_status_t nccl_wait(mtopt__transport_slots_t *s, int i, mtopt__consumer_t who,
                                const char *what) {
  (void)what;
  return who == MTOPT__FOR_STEPS ? event_op(s, i, 1) : MTOPT_STATUS_SUCCESS;
}

static mtopt_status_t nccl_poke(mtopt__transport_slots_t *s, int first, int end) {
  (void)s, (void)first, (void)end;
  return MTOPT_STATUS_SUCCESS;
}

/* An owned communicator that failed was aborted, so its kernels stopped and
 * the buffers can go. A caller's is never aborted here: its kernels may still
 * write the buffers (and cudaFree would wait for them forever). */
static mtopt_status_t nccl_drain(mtopt__transport_slots_t *s, int *leaked) {
  const mtopt_status_t st = mtopt__nccl_synchronize(s->n);
  if (st != MTOPT_STATUS_SUCCESS && !s->n->owned) (*leaked)++;
  return st;
}

/* -------------------------------------------------------- collectives ---- */

/* The body every collective shares: refused on a failed communicator, nothing
 * to do for an empty range (every rank has the same layout, so all skip it), the
 * context's device current around the NCCL call. */
#define COLLECTIVE(n, what, count, call)                                       \
  do {                                                                         \
    CHECK(mtopt__nccl_usable((n), (what)));                                    \
    if ((count) == 0) return MTOPT_STATUS_SUCCESS;                             \
    mtopt__device_guard_t g_;                                                  \
    CHECK(mtopt__device_enter((n)->ctx, &g_));                                 \
    const ncclResult_t r_ = (call);                                            \
    mtopt__device_leave(&g_);                                                  \
    return r_ == ncclSuccess ? MTOPT_STATUS_SUCCESS : nccl_fail((n)->ctx, r_, (what)); \
  } while (0)

static ncclDataType_t nccl_dtype(int dt) {
  return dt == MTOPT__DT_BF16 ? ncclBfloat16 : dt == MTOPT__DT_F16 ? ncclFloat16 : ncclFloat32;
}

static mtopt_status_t allreduce_avg(nccl_t *n, void *buf, int64_t count, int dt) {
  COLLECTIVE(n, "ncclAllReduce (bucket)", count,
             ncclAllReduce(buf, buf, (size_t)count, nccl_dtype(dt), ncclAvg, n->comm, n->stream));
}

static mtopt_status_t reduce_scatter_avg(nccl_t *n, void *send, void *recv,
                                         int64_t recvcount, int dt) {
  COLLECTIVE(n, "ncclReduceScatter (bucket)", recvcount,
             ncclReduceScatter(send, recv, (size_t)recvcount, nccl_dtype(dt), ncclAvg, n->comm,
                               n->stream));
}

/* A reduction, then its slot's event (recorded even for an empty range: the
 * steps' stream waits on every segment's event). */
static mtopt_status_t nccl_allreduce_avg(mtopt__transport_slots_t *s, int i, void *buf,
                                         int64_t count, int dt, const char *what) {
  (void)what;
  CHECK(allreduce_avg(s->n, buf, count, dt));
  return event_op(s, i, 0);
}

static mtopt_status_t nccl_reduce_scatter_avg(mtopt__transport_slots_t *s, int i, void *send,
                                              void *recv, int64_t recvcount,
                                              int dt, const char *what) {
  (void)what;
  CHECK(reduce_scatter_avg(s->n, send, recv, recvcount, dt));
  return event_op(s, i, 0);
}

static mtopt_status_t nccl_allgather(mtopt__transport_slots_t *s, int i, void *buf,
                                     int64_t count, int dt, const char *what) {
  (void)i, (void)what;
  nccl_t *n = s->n;
  /* In place: NCCL's rule is sendbuff == recvbuff + rank * sendcount. */
  const size_t part = (size_t)count * (size_t)mtopt__dt_size(dt);
  COLLECTIVE(n, "ncclAllGather (weights)", count,
             ncclAllGather((char *)buf + (size_t)n->rank * part, buf, (size_t)count,
                           nccl_dtype(dt), n->comm, n->stream));
}

static mtopt_status_t nccl_sum_stats(nccl_t *n, double *stats) {
  COLLECTIVE(n, "ncclAllReduce (gradient norm)", 2,
             ncclAllReduce(stats, stats, 2, ncclFloat64, ncclSum, n->comm, n->stream));
}

/* Device-to-device copy on the communication stream. */
static mtopt_status_t nccl_copy(nccl_t *n, void *dst, const void *src, size_t bytes) {
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

static const mtopt__transport_ops_t nccl_ops = {
    .name = "nccl",
    .host_progress = 0,
    .create = mtopt__nccl_create,
    .destroy = mtopt__nccl_destroy,
    .sm_split = mtopt__nccl_sm_split,
    .max_i64 = mtopt__nccl_max_i64,
    .slots_create = nccl_slots_create,
    .slots_destroy = nccl_slots_destroy,
    .allreduce_avg = nccl_allreduce_avg,
    .reduce_scatter_avg = nccl_reduce_scatter_avg,
    .allgather = nccl_allgather,
    .test = nccl_test,
    .wait = nccl_wait,
    .poke = nccl_poke,
    .drain = nccl_drain,
    .sum_stats = nccl_sum_stats,
    .copy = nccl_copy,
    .check = nccl_check,
    .comm_wait_compute = nccl_comm_wait_compute,
    .compute_wait_comm = nccl_compute_wait_comm,
    .comm_wait_steps = nccl_comm_wait_steps,
    .steps_begin = nccl_steps_begin,
    .steps_end = nccl_steps_end,
    .steps_stream = nccl_steps_stream,
    .comm_stream = nccl_comm_stream,
    .synchronize = mtopt__nccl_synchronize,
};

const mtopt__transport_ops_t *mtopt__transport_nccl(void) { return &nccl_ops; }

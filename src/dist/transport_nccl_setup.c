/* The NCCL transport's set-up and tear-down (transport_nccl.h): the streams,
 * events and SM partition of a communicator, the NCCL communicator itself
 * (made from a unique id broadcast over MPI, or the caller's), and the
 * set-up's host reduction (the rank agreement check). */
#include <stdlib.h>
#include <string.h>

#include "transport_nccl.h"

/* rank 0: a fresh unique id, from an NCCL recent enough for ncclAvg. */
static mtopt_status_t unique_id(mtopt_context_t *ctx, ncclUniqueId *u) {
  int version = 0;
  ncclResult_t r = ncclGetVersion(&version);
  if (r != ncclSuccess) return nccl_fail(ctx, r, "ncclGetVersion");
  if (version < MTOPT__NCCL_MIN_VERSION)
    return mtopt__error(ctx, MTOPT_STATUS_NOT_SUPPORTED,
                        "mtopt_comm_create_mpi: the NCCL library loaded is version code %d; "
                        "mtopt needs 2.10 or newer (ncclAvg)",
                        version);
  r = ncclGetUniqueId(u);
  if (r != ncclSuccess) return nccl_fail(ctx, r, "ncclGetUniqueId");
  return MTOPT_STATUS_SUCCESS;
}

/* Rank and size of a user's ncclComm_t, which must be on the context's
 * device. */
static mtopt_status_t comm_info(mtopt_context_t *ctx, ncclComm_t c, int *rank, int *size) {
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
static ncclResult_t init_owned(nccl_t *n, const ncclUniqueId u) {
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

/* Makes the communication stream, the bucket steps' stream and events on the
 * context's device, with the SM partition comm_sm_count asks for
 * (mtopt_comm_config_t), and wraps `existing` (a caller's ncclComm_t, not
 * owned) or, with existing == NULL, leaves the communicator to init_comm.
 * Local: ranks agree that all succeeded before the collective
 * initialisation. */
static mtopt_status_t make(const mtopt__transport_args_t *a, ncclComm_t existing, nccl_t **out) {
  static const char fn[] = "mtopt_comm_create (NCCL)";
  mtopt_context_t *ctx = a->ctx;
  const int comm_sm_count = a->cfg->comm_sm_count;
  mtopt__device_guard_t g_;
  CHECK(mtopt__device_enter(ctx, &g_));
  mtopt_status_t st_ = MTOPT_STATUS_SUCCESS;
  nccl_t *n = calloc(1, sizeof *n);
  if (!n) {
    mtopt__device_leave(&g_);
    return mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: calloc failed", fn);
  }
  n->ctx = ctx;
  n->world = a->world;
  n->rank = a->rank;
  n->timeout_ms = a->cfg->timeout_ms;
  n->boot = a->mpi;
  {
    const int sms = comm_sm_count > 0                    ? comm_sm_count
                    : comm_sm_count == 0 && a->world > 1 ? MTOPT_COMM_AUTO_SMS
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
  n->stream_handle = (void *)n->stream;
  CUDA_TRY(ctx, cudaEventCreateWithFlags(&n->steps_done, cudaEventDisableTiming),
           "creating an event");
  CUDA_TRY(ctx, cudaEventCreateWithFlags(&n->compute_done, cudaEventDisableTiming),
           "creating an event");
  CUDA_TRY(ctx, cudaEventCreateWithFlags(&n->comm_done, cudaEventDisableTiming),
           "creating an event");
  n->comm = existing;
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

/* Initialises an owned communicator (destroyed with the object) from the
 * unique id; collective over the ranks, blocking. */
static mtopt_status_t init_comm(nccl_t *n, const ncclUniqueId *u) {
  mtopt__device_guard_t g_;
  CHECK(mtopt__device_enter(n->ctx, &g_));
  mtopt_status_t st_ = MTOPT_STATUS_SUCCESS;
  /* Blocking, on the context's device (current here). */
  NCCL_TRY(n->ctx, init_owned(n, *u), "ncclCommInitRank");
  n->owned = 1;
done:
  mtopt__device_leave(&g_);
  return st_;
}

/* Over MPI: rank 0 makes the unique id and broadcasts it, every rank makes
 * its streams, the ranks agree that all did, then initialise together. */
static mtopt_status_t create_over_mpi(mtopt__transport_args_t *a, nccl_t **out) {
  static const char fn[] = "mtopt_comm_create_mpi";
  mtopt_context_t *ctx = a->ctx;
  ncclUniqueId id;
  memset(&id, 0, sizeof id);
  /* Rank 0's failure must reach the others, or they would wait in the
   * broadcast for an id that never comes: broadcast a flag with it. */
  mtopt_status_t idst = MTOPT_STATUS_SUCCESS;
  if (a->rank == 0) idst = unique_id(ctx, &id);
  unsigned char msg[sizeof(ncclUniqueId) + 1];
  msg[0] = idst == MTOPT_STATUS_SUCCESS;
  memcpy(msg + 1, &id, sizeof id);
  int rc = MPI_Bcast(msg, (int)sizeof msg, MPI_BYTE, 0, a->mpi);
  if (rc != MPI_SUCCESS) return mtopt__mpi_fail(ctx, rc, fn);
  if (!msg[0])
    return a->rank == 0 ? idst
                        : mtopt__error(ctx, MTOPT_STATUS_COMM_ERROR,
                                       "%s: rank 0 could not make the NCCL unique id", fn);
  memcpy(&id, msg + 1, sizeof id);
  /* The streams and the SM partition first: a rank that cannot make them
   * must not leave the others waiting in the collective initialisation. */
  nccl_t *n = NULL;
  mtopt_status_t st = make(a, NULL, &n);
  int ok = st == MTOPT_STATUS_SUCCESS, all = 0;
  rc = MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, a->mpi);
  if (rc != MPI_SUCCESS && st == MTOPT_STATUS_SUCCESS) st = mtopt__mpi_fail(ctx, rc, fn);
  if (st == MTOPT_STATUS_SUCCESS && !all)
    st = mtopt__error(ctx, MTOPT_STATUS_COMM_ERROR,
                      "%s: another rank could not set up its CUDA streams (its own "
                      "error says why)",
                      fn);
  if (st == MTOPT_STATUS_SUCCESS) st = init_comm(n, &id);
  if (st != MTOPT_STATUS_SUCCESS) {
    if (n) mtopt__nccl_destroy(n);
    return st;
  }
  *out = n;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt__nccl_create(mtopt__transport_args_t *a, nccl_t **out) {
  if (!a->existing) return create_over_mpi(a, out);
  CHECK(comm_info(a->ctx, (ncclComm_t)a->existing, &a->rank, &a->world));
  return make(a, (ncclComm_t)a->existing, out);
}

void mtopt__nccl_sm_split(const nccl_t *n, int *comm_sms, int *step_sms) {
  *comm_sms = n->part ? mtopt__sm_partition_sms(n->part, 0) : 0;
  *step_sms = n->part ? mtopt__sm_partition_sms(n->part, 1) : 0;
}

/* Waits for outstanding work (at most timeout_ms, aborting an owned
 * communicator on expiry), then frees everything. */
mtopt_status_t mtopt__nccl_destroy(nccl_t *n) {
  if (!n) return MTOPT_STATUS_SUCCESS;
  mtopt_status_t st = MTOPT_STATUS_SUCCESS;
  if (n->comm && !n->failed) st = mtopt__nccl_synchronize(n);
  mtopt__device_guard_t g;
  const int entered = mtopt__device_enter(n->ctx, &g) == MTOPT_STATUS_SUCCESS;
  if (n->owned && n->comm) {
    ncclResult_t r = ncclCommDestroy(n->comm);
    if (r != ncclSuccess && st == MTOPT_STATUS_SUCCESS)
      st = nccl_fail(n->ctx, r, "ncclCommDestroy");
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

/* Over the MPI communicator of the set-up where there is one; else (a
 * caller's NCCL communicator) through device memory, bounded by the
 * timeout. */
mtopt_status_t mtopt__nccl_max_i64(nccl_t *n, int64_t *host, int count, const char *what) {
  mtopt_context_t *ctx = n->ctx;
  CHECK(mtopt__nccl_usable(n, what));
  if (n->boot != MPI_COMM_NULL) {
    /* A reduction left pending on the set-up communicator would pair with
     * the next one: the transport has failed. */
    const mtopt_status_t st = mtopt__mpi_max_i64(ctx, n->boot, n->timeout_ms, host, count, what);
    if (st == MTOPT_STATUS_COMM_ERROR) mtopt__nccl_abort(n);
    return st;
  }
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


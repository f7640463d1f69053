/* What the two files of the NCCL transport share (transport_nccl_setup.c:
 * making and destroying it; transport_nccl.c: its operations and the
 * vtable). Includes CUDA and NCCL headers: only those two files include it. */
#ifndef MTOPT_DIST_TRANSPORT_NCCL_H
#define MTOPT_DIST_TRANSPORT_NCCL_H

#include <cuda_runtime.h>
#include <nccl.h>

#include "../backend/cuda/cuda_glue.h"
#include "mtopt/mtopt_cuda.h"
#include "sm_partition.h"
#include "transport.h"

/* ncclAvg (the average folded into the reduction) arrived in NCCL 2.10. */
#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < NCCL_VERSION(2, 10, 0)
#error "mtopt's NCCL path needs NCCL 2.10 or newer (ncclAvg)"
#endif
#define MTOPT__NCCL_MIN_VERSION 21000 /* 2.10.0 in ncclGetVersion's encoding */

struct mtopt__transport {
  mtopt_context_t *ctx;
  ncclComm_t comm; /* NULL once aborted */
  int owned;       /* made here from a unique id: destroyed (or aborted) here */
  int failed;      /* an asynchronous error or timeout was seen */
  int world, rank;
  int timeout_ms;
  /* The MPI communicator the unique id came over (not owned), or
   * MPI_COMM_NULL for a caller's NCCL communicator: the set-up's host
   * reductions (max_i64) go over it. */
  MPI_Comm boot;
  cudaStream_t stream;      /* communication stream */
  void *stream_handle;      /* the same, as the backend's widen takes it */
  cudaEvent_t compute_done; /* recorded on the context's stream */
  cudaEvent_t comm_done;    /* recorded on the communication stream */
  /* The SM partition, or NULL: then both streams are ordinary ones. */
  mtopt__sm_partition_t *part;
  cudaStream_t steps;     /* the bucket steps' stream */
  void *steps_handle;     /* the same, as ops->run_pass takes it */
  cudaEvent_t steps_done; /* recorded on `steps` */
};

typedef mtopt__transport_t nccl_t;

static inline mtopt_status_t nccl_fail(mtopt_context_t *ctx, ncclResult_t r, const char *what) {
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
      st_ = mtopt__cuda_fail((ctx), e_, (what));                               \
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
static inline cudaStream_t ctx_stream(mtopt_context_t *ctx) {
  cudaStream_t s = 0;
  if (mtopt_cuda_context_get_stream(ctx, &s) != MTOPT_STATUS_SUCCESS) return 0;
  return s;
}


/* Set-up (transport_nccl_setup.c): the vtable's create, destroy, sm_split
 * and max_i64. */
MTOPT__HIDDEN mtopt_status_t mtopt__nccl_create(mtopt__transport_args_t *a, nccl_t **out);
MTOPT__HIDDEN mtopt_status_t mtopt__nccl_destroy(nccl_t *n);
MTOPT__HIDDEN void mtopt__nccl_sm_split(const nccl_t *n, int *comm_sms, int *step_sms);
MTOPT__HIDDEN mtopt_status_t mtopt__nccl_max_i64(nccl_t *n, int64_t *host, int count,
                                                 const char *what);
/* Operations (transport_nccl.c). COMM_ERROR if the communicator failed
 * earlier (or was aborted). */
MTOPT__HIDDEN mtopt_status_t mtopt__nccl_usable(nccl_t *n, const char *what);
/* Marks the transport failed (every later call is refused) and aborts an
 * owned communicator, so that its kernels stop and nothing waits on them. */
MTOPT__HIDDEN void mtopt__nccl_abort(nccl_t *n);
/* Waits for the communication, steps' and context's streams, at most
 * timeout_ms; reports asynchronous NCCL errors; aborts an owned communicator
 * on expiry. */
MTOPT__HIDDEN mtopt_status_t mtopt__nccl_synchronize(nccl_t *n);

#endif /* MTOPT_DIST_TRANSPORT_NCCL_H */

/* Internal interface of the distributed layer: what comm.c (MPI, the plan,
 * the epilogue) needs from comm_nccl.c (the only file besides the CUDA backend
 * that includes CUDA/NCCL headers), and hooks for the benchmark. Not
 * installed. */
#ifndef MTOPT_COMM_INTERNAL_H
#define MTOPT_COMM_INTERNAL_H

#include "../common/error.h"
#include "../core/internal_api.h"
#include "mtopt/mtopt_dist.h"

/* ncclUniqueId is NCCL_UNIQUE_ID_BYTES (128) bytes. */
#define MTOPT__NCCL_ID_BYTES 128

typedef struct mtopt__nccl mtopt__nccl_t;
typedef struct mtopt__nccl_events mtopt__nccl_events_t;

#ifdef MTOPT_HAVE_NCCL
/* rank 0: a fresh unique id into id[MTOPT__NCCL_ID_BYTES]. */
MTOPT__HIDDEN mtopt_status_t mtopt__nccl_unique_id(mtopt_context_t *ctx, void *id);
/* Rank and size of a user's ncclComm_t. */
MTOPT__HIDDEN mtopt_status_t mtopt__nccl_comm_info(mtopt_context_t *ctx, void *nccl_comm,
                                                   int *rank, int *size);
/* Makes the communication stream, the bucket steps' stream and events on the
 * context's device, with the SM partition comm_sm_count asks for
 * (mtopt_comm_config_t), and wraps `existing` (a caller's ncclComm_t, not
 * owned) or, with existing == NULL, leaves the communicator to
 * mtopt__nccl_init. Local: ranks agree that all succeeded before the
 * collective initialisation. */
MTOPT__HIDDEN mtopt_status_t mtopt__nccl_create(mtopt_context_t *ctx, int world, int rank,
                                                void *existing, int timeout_ms,
                                                int comm_sm_count, mtopt__nccl_t **out);
/* Initialises an owned communicator (destroyed with the object) from the
 * unique id; collective over the ranks, blocking. */
MTOPT__HIDDEN mtopt_status_t mtopt__nccl_init(mtopt__nccl_t *n, const void *id);
/* The partition in force (0, 0: none). */
MTOPT__HIDDEN void mtopt__nccl_sm_split(const mtopt__nccl_t *n, int *comm_sms, int *step_sms);
/* Waits for outstanding work (at most timeout_ms, aborting an owned
 * communicator on expiry), then frees everything. */
MTOPT__HIDDEN mtopt_status_t mtopt__nccl_destroy(mtopt__nccl_t *n);
/* Stream ordering: the communication stream waits for the work enqueued on
 * the context's stream so far, or the other way round. */
MTOPT__HIDDEN mtopt_status_t mtopt__nccl_comm_wait_compute(mtopt__nccl_t *n);
MTOPT__HIDDEN mtopt_status_t mtopt__nccl_compute_wait_comm(mtopt__nccl_t *n);
/* The bucket steps' stream: the steps of one mtopt_dist_step go between
 * steps_begin (it waits for the context's stream) and steps_end (the context's
 * stream waits for it). steps_stream is what ops->run_pass takes. */
MTOPT__HIDDEN mtopt_status_t mtopt__nccl_steps_begin(mtopt__nccl_t *n);
MTOPT__HIDDEN mtopt_status_t mtopt__nccl_steps_end(mtopt__nccl_t *n);
MTOPT__HIDDEN void *const *mtopt__nccl_steps_stream(const mtopt__nccl_t *n);
/* Per-segment completion events: event i is recorded on the communication
 * stream right after segment i's collective, and the steps' stream waits on
 * exactly that one before segment i's pass, so the pass of segment i overlaps
 * the collectives of segments i+1, ... (a single event re-recorded per
 * segment could not express this once several collectives are queued ahead). */
MTOPT__HIDDEN mtopt_status_t mtopt__nccl_events_create(mtopt__nccl_t *n, int count,
                                                       mtopt__nccl_events_t **out);
MTOPT__HIDDEN void mtopt__nccl_events_destroy(mtopt__nccl_events_t *ev);
MTOPT__HIDDEN mtopt_status_t mtopt__nccl_record(mtopt__nccl_events_t *ev, int i);
MTOPT__HIDDEN mtopt_status_t mtopt__nccl_steps_wait(mtopt__nccl_events_t *ev, int i);
/* A non-blocking look at ncclCommGetAsyncError (and whether the communicator
 * was aborted): COMM_ERROR if the communicator is unusable. */
MTOPT__HIDDEN mtopt_status_t mtopt__nccl_check(mtopt__nccl_t *n, const char *what);
/* 1 if the communicator is the caller's (mtopt_comm_create_nccl): it is never
 * aborted here, so after a failed synchronize its kernels may still run. */
MTOPT__HIDDEN int mtopt__nccl_is_wrapped(const mtopt__nccl_t *n);
/* Collectives on the communication stream. */
MTOPT__HIDDEN mtopt_status_t mtopt__nccl_allreduce_avg_f32(mtopt__nccl_t *n, float *buf,
                                                           int64_t count);
MTOPT__HIDDEN mtopt_status_t mtopt__nccl_reduce_scatter_avg_f32(mtopt__nccl_t *n,
                                                                const float *send,
                                                                float *recv,
                                                                int64_t recvcount);
/* In place: rank r's part is buf[r*count, (r+1)*count). */
MTOPT__HIDDEN mtopt_status_t mtopt__nccl_allgather_f32(mtopt__nccl_t *n, float *buf,
                                                       int64_t count);
MTOPT__HIDDEN mtopt_status_t mtopt__nccl_allreduce_sum_f64(mtopt__nccl_t *n, double *buf,
                                                           int64_t count);
/* Device-to-device copy on the communication stream. */
MTOPT__HIDDEN mtopt_status_t mtopt__nccl_copy(mtopt__nccl_t *n, void *dst, const void *src,
                                              size_t bytes);
/* Host int64 values, element-wise maximum over ranks; synchronous, bounded by
 * the timeout (the set-up plan check of a wrapped communicator). */
MTOPT__HIDDEN mtopt_status_t mtopt__nccl_allreduce_max_i64(mtopt__nccl_t *n, int64_t *host,
                                                           int count);
/* Waits for the communication, steps' and context's streams, at most
 * timeout_ms; reports asynchronous NCCL errors; aborts an owned communicator
 * on expiry. */
MTOPT__HIDDEN mtopt_status_t mtopt__nccl_synchronize(mtopt__nccl_t *n);
#endif

/* CPU: elements stepped between two progress pokes of the collectives in
 * flight (2^20; tests lower it so that buckets are stepped in slices). */
MTOPT__HIDDEN extern int64_t mtopt__dist_slice_elems;

/* The fewest chunks a segment is cut to (256: a pass of fewer blocks than
 * about two per SM leaves a GPU idle; at 64 K-element chunks, 64 MB); tests
 * lower it so that their small buckets are cut. */
MTOPT__HIDDEN extern int64_t mtopt__dist_min_segment_chunks;

/* Benchmark hook: the collectives of one step over every bucket (all-reduce,
 * or reduce-scatter then all-gather), with no optimizer work, completed
 * (CPU) or enqueued (CUDA; call mtopt_dist_synchronize). */
MTOPT__HIDDEN mtopt_status_t mtopt__dist_comm_only(mtopt_dist_optimizer_t *dopt);

/* Tests and benchmark: the segments (one collective each) of the plan. */
MTOPT__HIDDEN int mtopt__dist_segment_count(const mtopt_dist_optimizer_t *dopt);
MTOPT__HIDDEN void mtopt__dist_segment(const mtopt_dist_optimizer_t *dopt, int s, int *bucket,
                                       int64_t *offset, int64_t *numel, int64_t *c0,
                                       int64_t *c1);

#endif /* MTOPT_COMM_INTERNAL_H */

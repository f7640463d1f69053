/* How the distributed layer's collectives move: one interface, two
 * transports. transport_mpi.c runs MPI's non-blocking collectives on host
 * memory (CPU contexts); transport_nccl.c runs NCCL on a communication stream
 * (CUDA contexts). The communicator picks one at mtopt_comm_create_mpi /
 * mtopt_comm_create_nccl; the epilogue (epilogue.c) has one control flow over
 * these operations and never asks which transport it has.
 *
 * The two differ in who drives a collective to completion:
 * - host progress (MPI, host_progress = 1): a collective moves only inside MPI
 *   calls on the host, and its result may be read once the host has seen it
 *   complete (test, wait). The ordering calls are no-ops.
 * - stream order (NCCL, host_progress = 0): a collective is enqueued on the
 *   communication stream and completes there; nothing is observed on the
 *   host (test never reports completion, poke does nothing). Its consumers
 *   are ordered after it on the device: work of the transport itself
 *   (copies, later collectives) by the stream's order, the bucket steps by an
 *   event per reduction that the steps' stream waits on.
 *
 * This header names MPI types (the communicator is made from an MPI_Comm)
 * but no CUDA or NCCL type. Not installed. */
#ifndef MTOPT_DIST_TRANSPORT_H
#define MTOPT_DIST_TRANSPORT_H

#include <mpi.h>
#include <stddef.h>
#include <stdint.h>

#include "../common/dtype.h"
#include "../common/error.h"
#include "../core/internal_api.h"
#include "mtopt/mtopt_dist.h"

/* A transport instance, one per communicator; each implementation defines
 * it. */
typedef struct mtopt__transport mtopt__transport_t;
/* The collectives of one distributed optimizer that may be in flight, by slot
 * index: slots [0, reductions) are the segments' reductions (read by the
 * bucket steps), then [reductions, reductions + gathers) the buckets'
 * all-gathers (read by the transport's own copies). Each implementation
 * defines it; every slot operation takes it, and it knows its transport. */
typedef struct mtopt__transport_slots mtopt__transport_slots_t;

/* Who reads a collective's result after a wait. */
typedef enum {
  MTOPT__FOR_STEPS, /* the bucket steps, on steps_stream */
  MTOPT__FOR_COMM   /* the transport's own later work: copies, collectives */
} mtopt__consumer_t;

/* What a transport is made from. */
typedef struct {
  mtopt_context_t *ctx;
  const mtopt_comm_config_t *cfg; /* as read and checked */
  /* The communicator's duplicate of the caller's MPI_Comm (owned by the
   * communicator, which frees it after the transport), or MPI_COMM_NULL when
   * wrapping `existing`. */
  MPI_Comm mpi;
  void *existing; /* NCCL: the caller's ncclComm_t (not owned), or NULL */
  int rank, world; /* of mpi; with `existing`, written by create */
} mtopt__transport_args_t;

/* Every operation returns SUCCESS or a status with the detail set in the
 * context (mtopt__error). A wait for a collective is bounded by
 * cfg->timeout_ms (0: forever), as is every host synchronisation after
 * set-up; a wait that grows long sleeps between its polls (clock.h).
 * Failure: the first collective or synchronisation that fails or times out
 * marks the transport failed, and from then on no operation waits: waits
 * test once, collectives are refused (COMM_ERROR), so everything after a
 * failure, destroy included, returns within one timeout in total. "Enqueued" means on the communication stream (NCCL); an MPI
 * operation either completes before it returns or leaves a request in its
 * slot. `what` names the operation in an error message (MPI; the NCCL
 * transport names the NCCL or CUDA call that failed instead). One thread at a
 * time per transport, as for its communicator. */
typedef struct mtopt__transport_ops {
  const char *name; /* "mpi", "nccl" */
  /* 1: collectives complete only under host calls (test, wait, poke), and the
   * epilogue steps a segment in slices with a poke between them so that the
   * following collectives move meanwhile; 0: stream-ordered. */
  int host_progress;

  /* ---- set-up (local unless said otherwise) ---- */
  /* Collective over the ranks of a->mpi where one is given (NCCL: the unique
   * id is broadcast over it and the communicator initialised); on failure
   * nothing is left. */
  mtopt_status_t (*create)(mtopt__transport_args_t *a, mtopt__transport_t **out);
  /* Waits (bounded) for outstanding work, then frees the transport. A failure
   * is returned after everything that can be freed is. */
  mtopt_status_t (*destroy)(mtopt__transport_t *t);
  /* The SM partition in force (0, 0: none; always so on MPI). */
  void (*sm_split)(const mtopt__transport_t *t, int *comm_sms, int *step_sms);
  /* Host int64 values, element-wise maximum over ranks, in place;
   * synchronous, bounded by the timeout (the rank agreement check). */
  mtopt_status_t (*max_i64)(mtopt__transport_t *t, int64_t *v, int count, const char *what);

  /* ---- the slots of one distributed optimizer ---- */
  mtopt_status_t (*slots_create)(mtopt__transport_t *t, int reductions, int gathers,
                                 mtopt__transport_slots_t **out);
  /* Frees the slots. An MPI request still pending stays with MPI (its buffers
   * are the caller's to keep alive or leak: see drain). */
  void (*slots_destroy)(mtopt__transport_slots_t *s);

  /* ---- the collectives (slot: where the collective is tracked) ----
   * dt: the elements' dtype (MTOPT__DT_*). 16-bit sums are rounded to
   * nearest in their dtype after each addition (NCCL's, and the MPI
   * transport's user-defined operation). */
  /* In place, buf[0, count) becomes the average over ranks. MPI: the sum,
   * scaled by (float)(1 / world) in float (and rounded to dt) when test or
   * wait sees it land; F16, each rank's values scaled before the sum (its
   * range would not hold the sum). NCCL: ncclAvg. */
  mtopt_status_t (*allreduce_avg)(mtopt__transport_slots_t *s, int slot, void *buf,
                                  int64_t count, int dt, const char *what);
  /* recv[0, recvcount) becomes the average of every rank's
   * send[rank * recvcount, (rank + 1) * recvcount); scaled as above (MPI,
   * F16: send is scaled in place first). */
  mtopt_status_t (*reduce_scatter_avg)(mtopt__transport_slots_t *s, int slot, void *send,
                                       void *recv, int64_t recvcount, int dt, const char *what);
  /* In place: rank r's part is elements [r * count, (r + 1) * count) of buf
   * (moved, never added: any dtype of that size). */
  mtopt_status_t (*allgather)(mtopt__transport_slots_t *s, int slot, void *buf, int64_t count,
                              int dt, const char *what);
  /* Whether the host may read slot's result now (MPI_Test; scales an average
   * that lands). Never blocks. Stream-ordered: always 0. */
  mtopt_status_t (*test)(mtopt__transport_slots_t *s, int slot, int *done, const char *what);
  /* Orders `who` after slot's collective. MPI: waits on the host, at most the
   * timeout (a collective that does not land stays pending: MPI cannot cancel
   * it), and scales an average. NCCL: FOR_STEPS makes the steps' stream wait
   * on the slot's event; FOR_COMM is a no-op (the stream's own order). */
  mtopt_status_t (*wait)(mtopt__transport_slots_t *s, int slot, mtopt__consumer_t who,
                         const char *what);
  /* Drives the first collective still in flight among slots [first, end)
   * (MPI without an asynchronous progress thread moves only inside MPI
   * calls). Never blocks; a no-op where stream-ordered. */
  mtopt_status_t (*poke)(mtopt__transport_slots_t *s, int first, int end);
  /* Before the buffers go: waits for every collective of the slots until one
   * deadline, timeout_ms from the call (once the transport has failed: no
   * wait), and counts in *leaked those that may still write the buffers
   * (their memory must then be leaked, not freed). Returns a failure of the
   * transport itself (NCCL: the synchronise), SUCCESS otherwise. */
  mtopt_status_t (*drain)(mtopt__transport_slots_t *s, int *leaked);

  /* ---- small reductions and copies ---- */
  /* stats[0, 2) (the ZeRO-1 statistics: sum of squares, non-finite count)
   * summed over ranks, in place. MPI: in rank order on the host, so every
   * rank gets the same bits; NCCL: enqueued (stats in device memory). */
  mtopt_status_t (*sum_stats)(mtopt__transport_t *t, double *stats);
  /* dst <- src in the context's memory: memcpy (MPI), or enqueued (NCCL). */
  mtopt_status_t (*copy)(mtopt__transport_t *t, void *dst, const void *src, size_t bytes);

  /* ---- ordering (no-ops where host-driven) ---- */
  /* A non-blocking look for an asynchronous failure of the communicator. */
  mtopt_status_t (*check)(mtopt__transport_t *t, const char *what);
  /* The transport's later work waits for the context's stream so far, or the
   * context's stream for the transport's work so far. */
  mtopt_status_t (*comm_wait_compute)(mtopt__transport_t *t);
  mtopt_status_t (*compute_wait_comm)(mtopt__transport_t *t);
  /* The transport's later work waits for the bucket steps enqueued so far
   * (ZeRO-1: a bucket's all-gather after its update). */
  mtopt_status_t (*comm_wait_steps)(mtopt__transport_t *t);
  /* The bucket steps of one mtopt_dist_step go between steps_begin (their
   * stream waits for the context's stream) and steps_end (the context's
   * stream waits for them); steps_stream is what ops->run_pass takes (NULL:
   * the context's stream). */
  mtopt_status_t (*steps_begin)(mtopt__transport_t *t);
  mtopt_status_t (*steps_end)(mtopt__transport_t *t);
  void *const *(*steps_stream)(const mtopt__transport_t *t);
  /* The stream the collectives are enqueued on, as ops->run_pass and the
   * backend's widen take it: work there runs after the transport's work so
   * far and before its next collective (NULL: host-driven, none). */
  void *const *(*comm_stream)(const mtopt__transport_t *t);
  /* Waits for everything enqueued, at most the timeout; reports asynchronous
   * failures. */
  mtopt_status_t (*synchronize)(mtopt__transport_t *t);
} mtopt__transport_ops_t;

/* The transports. _nccl is NULL in a build without NCCL. */
MTOPT__HIDDEN const mtopt__transport_ops_t *mtopt__transport_mpi(void);
MTOPT__HIDDEN const mtopt__transport_ops_t *mtopt__transport_nccl(void);

/* ---- MPI helpers of transport_mpi.c, for the communicator and the NCCL
 * transport's set-up over MPI ---- */

/* COMM_ERROR with MPI's text for rc. */
MTOPT__HIDDEN mtopt_status_t mtopt__mpi_fail(mtopt_context_t *ctx, int rc, const char *what);
/* Element-wise maximum of v[0, n) over the ranks of comm, in place, at most
 * timeout_ms (0: forever). */
MTOPT__HIDDEN mtopt_status_t mtopt__mpi_max_i64(mtopt_context_t *ctx, MPI_Comm comm,
                                                int timeout_ms, int64_t *v, int n,
                                                const char *what);

#endif /* MTOPT_DIST_TRANSPORT_H */

/* Data parallel for mnist_mlp: MPI start-up, mtopt's distributed optimizer
 * (mtopt_dist.h: bucketed all-reduce, or ZeRO-1, fused with the step) and
 * sums over ranks.
 *
 * Every rank holds the whole model and data set, takes its share of each
 * global batch, and steps through mtopt_dist_step, which averages the
 * gradients over the ranks before the update, so every rank applies the same
 * update to the same weights. Without MPI in the build, or when the program
 * is not launched by mpirun with more than one process (and --dist is not
 * given), it is one process: dp.on is 0, world 1, and the sums do nothing. */
#ifndef MNIST_DP_H
#define MNIST_DP_H

#include <stdint.h>

#include "mtopt/mtopt.h"
#ifdef MTOPT_HAVE_MPI
#include "mtopt/mtopt_dist.h"
#endif

typedef struct {
  int on;          /* MPI initialised: step with mtopt_dist */
  int rank, world; /* 0 and 1 when off */
  int local_rank;  /* rank among this node's ranks: picks the GPU */
  int zero_stage;  /* 0: all-reduce, 1: ZeRO-1 */
#ifdef MTOPT_HAVE_MPI
  mtopt_comm_t *comm;
  mtopt_dist_optimizer_t *dopt;
  int num_buckets;
  int64_t *bucket_first; /* each bucket's first tensor (registration index) */
  int marked;            /* buckets 0 .. marked-1 are marked ready this step */
#endif
} dp_t;

/* Initialises MPI when the launcher (mpirun, mpiexec) started more than one
 * process, or when `force` (--dist) asks for it at any size. Dies with a
 * message when that needs MPI and the build has none. */
void dp_start(dp_t *dp, int *argc, char ***argv, int force);

/* Makes the communicator on ctx (CPU: MPI collectives; CUDA: NCCL) and the
 * distributed optimizer over `list` (every tensor added with grad == NULL,
 * in any dtypes mtopt steps: fp32, or 16-bit weights and gradients with or
 * without masters), writes each tensor's gradient view
 * (mtopt_dist_optimizer_get_grad: numel elements of its grad_dtype) to
 * grads[0 .. count) and returns the inner optimizer: lr and step info go
 * through it. A configuration the library refuses is refused alike on every
 * rank: the message names `flags` (the flags it was made from). Collective:
 * every rank calls it. */
mtopt_optimizer_t *dp_optimizer_create(dp_t *dp, mtopt_context_t *ctx,
                                       mtopt_tensor_list_t *list,
                                       const mtopt_optimizer_config_t *cfg, const char *flags,
                                       void **grads, int count);
/* The number of buckets (0 when off). */
int dp_bucket_count(const dp_t *dp);
/* Rank 0's lines about data parallel: ranks, transport, the buckets (count
 * and dtype) and the memory the distributed optimizer owns on rank 0
 * (mtopt_dist_optimizer_get_memory). Prints nothing when off. */
void dp_print(const dp_t *dp, int on_gpu);
/* Checkpoints through mtopt_dist_optimizer_save / _load: with zero_stage 0
 * rank 0 writes `path` and every rank reads it; with zero_stage 1 each rank
 * writes and reads its own shard, "<path>.rank<r>-of-<world>". Collective;
 * every rank gets the same verdict, so a failure is reported once and every
 * rank exits (dp_die_all). */
void dp_save(dp_t *dp, const char *path);
void dp_load(dp_t *dp, const char *path);
/* Backward has written the gradients of tensors first_tensor and above:
 * starts the reduction of every bucket that is now complete. */
void dp_tensors_done(dp_t *dp, int64_t first_tensor);
void dp_zero_grad(dp_t *dp);
/* Reduces what is not reduced yet and steps (mtopt_dist_step). */
void dp_step(dp_t *dp);
/* Waits for the step and reports asynchronous NCCL errors. */
void dp_synchronize(dp_t *dp);

/* In-place sums over the ranks (nothing to do when off). */
void dp_sum_f64(dp_t *dp, double *v, int n);
void dp_sum_i64(dp_t *dp, int64_t *v, int n);

/* Destroys the distributed optimizer and the communicator, then finalises
 * MPI. */
void dp_finish(dp_t *dp);

/* For errors that every rank finds alike (bad flags): rank 0 prints the
 * message, every rank finalises MPI and exits with status 1. A rank that
 * fails alone uses MLP_DIE: its exit aborts the whole job. */
void dp_die_all(const dp_t *dp, const char *fmt, ...);

#endif /* MNIST_DP_H */

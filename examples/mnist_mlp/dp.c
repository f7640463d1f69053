/* Data parallel for mnist_mlp; see dp.h. */
#include "dp.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "mlp.h"
#include "mnist.h" /* dtype_flag */

/* The model is 2.1 MB of gradients: DDP's 1 MiB first bucket would hold all
 * of it. With 256 KiB, bucket 0 holds layers 2 and 3 (W2 b2 W3 b3, 0.5 MB)
 * and its reduction runs while backward computes layer 1; bucket 1 holds
 * W1 b1 (1.6 MB). */
#define DP_FIRST_BUCKET_BYTES ((size_t)256 << 10)

/* The process count the launcher announced, or 1: OpenMPI's mpirun sets
 * OMPI_COMM_WORLD_SIZE, MPICH's and Intel MPI's (Hydra) PMI_SIZE. Reading it
 * before MPI_Init keeps plain runs free of MPI start-up. */
static int launcher_world_size(void) {
  const char *vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"};
  for (int i = 0; i < 2; i++) {
    const char *v = getenv(vars[i]);
    if (v && atoi(v) > 0) return atoi(v);
  }
  return 1;
}

#ifdef MTOPT_HAVE_MPI

/* A rank that dies (MLP_DIE, exit(1)) must not leave the others waiting in a
 * collective: abort the whole job. dp_finish finalises MPI first, so a
 * normal exit does not come here. */
static void abort_if_running(void) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (init && !fin) MPI_Abort(MPI_COMM_WORLD, 1);
}

void dp_start(dp_t *dp, int *argc, char ***argv, int force) {
  *dp = (dp_t){.rank = 0, .world = 1};
  if (!force && launcher_world_size() <= 1) return;
  /* OpenBLAS and OpenMP run threads of their own, but only this thread
   * calls MPI. */
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
    MLP_DIE("MPI_Init_thread failed");
  atexit(abort_if_running);
  MPI_Comm_rank(MPI_COMM_WORLD, &dp->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &dp->world);
  MTOPT_CHECK(mtopt_comm_local_rank(MPI_COMM_WORLD, &dp->local_rank));
  dp->on = 1;
}

mtopt_optimizer_t *dp_optimizer_create(dp_t *dp, mtopt_context_t *ctx,
                                       mtopt_tensor_list_t *list,
                                       const mtopt_optimizer_config_t *cfg, const char *flags,
                                       void **grads, int count) {
  mtopt_comm_config_t cc = MTOPT_COMM_CONFIG_INIT;
  cc.first_bucket_bytes = DP_FIRST_BUCKET_BYTES;
  cc.zero_stage = dp->zero_stage;
  MTOPT_CHECK(mtopt_comm_create_mpi(ctx, MPI_COMM_WORLD, &cc, &dp->comm));
  /* A configuration the library refuses (--precision fp16 --master
   * remainder, LAMB with ZeRO-1) is refused alike on every rank, before any
   * collective: say it once and exit cleanly. */
  const mtopt_status_t st = mtopt_dist_optimizer_create(dp->comm, list, cfg, &dp->dopt);
  if (st == MTOPT_STATUS_INVALID_ARGUMENT || st == MTOPT_STATUS_NOT_SUPPORTED)
    dp_die_all(dp, "mtopt_dist_optimizer_create refused %s --zero %d: %s", flags,
               dp->zero_stage, mtopt_last_error()); /* which starts with the status name */
  MTOPT_CHECK(st);
  /* The views are in each tensor's grad_dtype (here the weights' dtype):
   * backward writes 16-bit gradients into them, and the 16-bit buckets are
   * reduced in 16 bits. */
  for (int t = 0; t < count; t++)
    MTOPT_CHECK(mtopt_dist_optimizer_get_grad(dp->dopt, t, &grads[t]));
  MTOPT_CHECK(mtopt_dist_get_bucket_count(dp->dopt, &dp->num_buckets));
  dp->bucket_first = malloc((size_t)(dp->num_buckets > 0 ? dp->num_buckets : 1) *
                            sizeof *dp->bucket_first);
  if (!dp->bucket_first) MLP_DIE("out of host memory");
  for (int b = 0; b < dp->num_buckets; b++)
    MTOPT_CHECK(mtopt_dist_get_bucket(dp->dopt, b, &dp->bucket_first[b], NULL, NULL, NULL));
  mtopt_optimizer_t *inner = NULL;
  MTOPT_CHECK(mtopt_dist_optimizer_get_optimizer(dp->dopt, &inner));
  return inner;
}

void dp_print(const dp_t *dp, int on_gpu) {
  if (!dp->on) return;
  /* Every tensor has the weights' dtype, so every bucket is of one class. */
  mtopt_dtype_t gdt = MTOPT_DTYPE_F32;
  if (dp->num_buckets > 0) MTOPT_CHECK(mtopt_dist_get_bucket_dtype(dp->dopt, 0, &gdt, NULL));
  printf("data parallel: %d rank(s), %s over %s, %d buckets of %s gradients (reduced in "
         "%s); each rank takes 1/%d of every batch\n",
         dp->world, dp->zero_stage ? "ZeRO-1 (reduce-scatter, all-gather)" : "all-reduce",
         on_gpu ? "NCCL" : "MPI", dp->num_buckets, dtype_flag(gdt), dtype_flag(gdt),
         dp->world);
  mtopt_dist_memory_t mem = MTOPT_DIST_MEMORY_INIT;
  MTOPT_CHECK(mtopt_dist_optimizer_get_memory(dp->dopt, &mem));
  const double n = mem.params > 0 ? (double)mem.params : 1.0;
  printf("optimizer memory on rank 0: state and masters %.2f B/param, gradients %.2f, "
         "ZeRO-1 shard %.2f (%lld parameters)\n",
         (double)mem.state_bytes / n, (double)mem.grad_bytes / n, (double)mem.shard_bytes / n,
         (long long)mem.params);
}

/* save and load return the same status on every rank (mtopt_dist.h), so a
 * failure is the job's, not one rank's: one message, a clean exit. */
void dp_save(dp_t *dp, const char *path) {
  const mtopt_status_t st = mtopt_dist_optimizer_save(dp->dopt, path);
  if (st != MTOPT_STATUS_SUCCESS)
    dp_die_all(dp, "--save %s: mtopt_dist_optimizer_save failed: %s", path, mtopt_last_error());
}

void dp_load(dp_t *dp, const char *path) {
  const mtopt_status_t st = mtopt_dist_optimizer_load(dp->dopt, path);
  if (st != MTOPT_STATUS_SUCCESS)
    dp_die_all(dp, "--resume %s: mtopt_dist_optimizer_load failed: %s (--zero 0 reads %s as "
                   "rank 0 saved it; --zero 1 reads %s.rank<r>-of-<N>, saved with --zero 1 "
                   "at the same N ranks)",
               path, mtopt_last_error(), path, path);
}

int dp_bucket_count(const dp_t *dp) { return dp->on ? dp->num_buckets : 0; }

/* Bucket 0 holds the last tensors and the buckets go down from there, so the
 * complete ones are always a prefix: 0 .. k-1, those whose first tensor has
 * its gradient. */
void dp_tensors_done(dp_t *dp, int64_t first_tensor) {
  if (!dp->on) return;
  while (dp->marked < dp->num_buckets && dp->bucket_first[dp->marked] >= first_tensor)
    MTOPT_CHECK(mtopt_dist_bucket_ready(dp->dopt, dp->marked++));
}

void dp_zero_grad(dp_t *dp) {
  if (dp->on) MTOPT_CHECK(mtopt_dist_optimizer_zero_grad(dp->dopt));
}

void dp_step(dp_t *dp) {
  MTOPT_CHECK(mtopt_dist_step(dp->dopt)); /* marks the buckets not marked yet */
  dp->marked = 0;
}

void dp_synchronize(dp_t *dp) {
  if (dp->on) MTOPT_CHECK(mtopt_dist_synchronize(dp->dopt));
}

void dp_sum_f64(dp_t *dp, double *v, int n) {
  if (dp->on && MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS)
    MLP_DIE("MPI_Allreduce failed");
}

void dp_sum_i64(dp_t *dp, int64_t *v, int n) {
  if (dp->on && MPI_Allreduce(MPI_IN_PLACE, v, n, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS)
    MLP_DIE("MPI_Allreduce failed");
}

void dp_finish(dp_t *dp) {
  if (!dp->on) return;
  MTOPT_CHECK(mtopt_dist_optimizer_destroy(dp->dopt));
  MTOPT_CHECK(mtopt_comm_destroy(dp->comm));
  free(dp->bucket_first);
  MPI_Finalize();
  dp->on = 0;
}

void dp_die_all(const dp_t *dp, const char *fmt, ...) {
  if (dp->rank == 0) {
    va_list ap;
    va_start(ap, fmt);
    fputs("error: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
  }
  if (dp->on) MPI_Finalize();
  exit(1);
}

#else /* no MPI in this build: one process, and a clear error when asked for more */

void dp_start(dp_t *dp, int *argc, char ***argv, int force) {
  *dp = (dp_t){.rank = 0, .world = 1};
  if (force)
    MLP_DIE("--dist: this build has no MPI (install an MPI, e.g. libopenmpi-dev, and "
            "configure mtopt with -DMTOPT_WITH_MPI=ON)");
  const int n = launcher_world_size();
  if (n > 1)
    MLP_DIE("started by mpirun as one of %d processes, but this build has no MPI: each "
            "would train alone (configure mtopt with -DMTOPT_WITH_MPI=ON)",
            n);
}

mtopt_optimizer_t *dp_optimizer_create(dp_t *dp, mtopt_context_t *ctx,
                                       mtopt_tensor_list_t *list,
                                       const mtopt_optimizer_config_t *cfg, const char *flags,
                                       void **grads, int count) {
  MLP_DIE("dp_optimizer_create: no MPI in this build");
}
int dp_bucket_count(const dp_t *dp) { return 0; }
void dp_print(const dp_t *dp, int on_gpu) {}
void dp_save(dp_t *dp, const char *path) { MLP_DIE("dp_save: no MPI in this build"); }
void dp_load(dp_t *dp, const char *path) { MLP_DIE("dp_load: no MPI in this build"); }
void dp_tensors_done(dp_t *dp, int64_t first_tensor) {}
void dp_zero_grad(dp_t *dp) {}
void dp_step(dp_t *dp) { MLP_DIE("dp_step: no MPI in this build"); }
void dp_synchronize(dp_t *dp) {}
void dp_sum_f64(dp_t *dp, double *v, int n) {}
void dp_sum_i64(dp_t *dp, int64_t *v, int n) {}
void dp_finish(dp_t *dp) {}

void dp_die_all(const dp_t *dp, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fputs("error: ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  exit(1);
}

#endif

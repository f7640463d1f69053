/* mtopt_dist_bench: the distributed epilogue, per bucket size, under mpirun.
 *
 * For each bucket size it times, on the same shapes and buffers:
 *   comm     the collectives of one step alone (all-reduce of every bucket, or
 *            reduce-scatter + all-gather with --zero 1), no optimizer work;
 *   step     the local optimizer step alone (the whole model with zero_stage
 *            0, this rank's shard with 1), no communication;
 *   epilogue mtopt_dist_step: communication with each bucket's step
 *            overlapped behind the following buckets' communication.
 * Each figure is the median over --iters of the slowest rank's time (ranks
 * start each timed call together after a barrier). "saved" is how much of the
 * shorter of comm and step the overlap hid: (comm + step - epilogue) /
 * min(comm, step); "e/c" is epilogue / comm (1.0: the step is hidden
 * entirely).
 * Bandwidth as nccl-tests defines it for all-reduce: algbw = gradient bytes /
 * comm time, busbw = algbw * 2(n-1)/n (the bytes each rank's link carries; the
 * same factor for reduce-scatter + all-gather). At one rank the factor is 0,
 * so busbw is 0 by definition (nothing crosses a link) and the comm figure is
 * the per-call cost of the collectives (NCCL: launches of in-place no-ops);
 * the output says so.
 *
 * Times are host wall-clock from the first call to the end of the wait
 * (mtopt_dist_synchronize / mtopt_context_synchronize on CUDA), so they
 * include launch overhead and one host synchronisation per iteration.
 *
 * "colls" is the number of collectives per step (segments: a bucket over its
 * size, such as one holding a large embedding, is reduced in several).
 *
 *   mpirun -np 2 mtopt_dist_bench [--shape gpt2] [--buckets 1,4,25,100]
 *       [--iters 5] [--warmup 1] [--zero 0|1] [--backend cpu|cuda]
 *       [--kind adamw|sgd|lamb] [--threads N] [--comm-sms N] [--csv]
 * --comm-sms sets mtopt_comm_config_t.comm_sm_count (CUDA: 0 automatic, -1 no
 * SM partition, N SMs for the collectives); the header says what was used.
 * On CUDA each rank uses its node-local rank as the device (NCCL: set
 * NCCL_NVLS_ENABLE=0 on hosts where NVLink multicast must stay off). */
#include <mpi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/core.h"
#include "dist/dist_internal.h"
#include "mtopt/mtopt.h"
#include "mtopt/mtopt_dist.h"
#include "shapes.h"

static int g_rank, g_world;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

#define DIE_IF(cond, ...)                                                      \
  do {                                                                         \
    if (cond) {                                                                \
      fprintf(stderr, "rank %d: ", g_rank);                                    \
      fprintf(stderr, __VA_ARGS__);                                            \
      fprintf(stderr, "\n");                                                   \
      MPI_Abort(MPI_COMM_WORLD, 1);                                            \
    }                                                                          \
  } while (0)
#define OK(expr)                                                               \
  do {                                                                         \
    mtopt_status_t st_ = (expr);                                               \
    DIE_IF(st_ != MTOPT_STATUS_SUCCESS, "%s -> %s: %s", #expr,                 \
           mtopt_status_name(st_), mtopt_last_error());                        \
  } while (0)

static int cmp_double(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Median over iterations of the slowest rank's time of fn. */
typedef void (*timed_fn)(void *);
static double time_it(timed_fn fn, void *arg, int warmup, int iters) {
  for (int i = 0; i < warmup; i++) fn(arg);
  double *t = malloc((size_t)iters * sizeof *t);
  for (int i = 0; i < iters; i++) {
    MPI_Barrier(MPI_COMM_WORLD);
    const double t0 = now_s();
    fn(arg);
    double dt = now_s() - t0, mx = 0.0;
    MPI_Allreduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    t[i] = mx;
  }
  qsort(t, (size_t)iters, sizeof *t, cmp_double);
  const double m = t[iters / 2];
  free(t);
  return m;
}

typedef struct {
  mtopt_dist_optimizer_t *d;
  mtopt_optimizer_t *inner;
  mtopt_context_t *ctx;
} run_t;

static void run_comm(void *p) {
  run_t *r = p;
  OK(mtopt__dist_comm_only(r->d));
  OK(mtopt_dist_synchronize(r->d));
}
static void run_step(void *p) {
  run_t *r = p;
  OK(mtopt_optimizer_step(r->inner));
  OK(mtopt_context_synchronize(r->ctx));
}
static void run_epilogue(void *p) {
  run_t *r = p;
  OK(mtopt_dist_step(r->d));
  OK(mtopt_dist_synchronize(r->d));
}

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  const char *shape_name = "gpt2", *buckets = "1,4,25,100", *backend = "cpu", *kind = "adamw";
  int iters = 5, warmup = 1, zero = 0, threads = 0, csv = 0, comm_sms = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--shape") && v) shape_name = argv[++i];
    else if (!strcmp(a, "--buckets") && v) buckets = argv[++i];
    else if (!strcmp(a, "--iters") && v) iters = atoi(argv[++i]);
    else if (!strcmp(a, "--warmup") && v) warmup = atoi(argv[++i]);
    else if (!strcmp(a, "--zero") && v) zero = atoi(argv[++i]);
    else if (!strcmp(a, "--backend") && v) backend = argv[++i];
    else if (!strcmp(a, "--kind") && v) kind = argv[++i];
    else if (!strcmp(a, "--threads") && v) threads = atoi(argv[++i]);
    else if (!strcmp(a, "--comm-sms") && v) comm_sms = atoi(argv[++i]);
    else if (!strcmp(a, "--csv")) csv = 1;
    else DIE_IF(1, "unknown argument '%s' (see the comment at the top of dist_bench.c)", a);
  }
  DIE_IF(iters < 1 || warmup < 0, "--iters must be >= 1, --warmup >= 0");
  DIE_IF(strcmp(backend, "cpu") && strcmp(backend, "cuda"), "--backend must be cpu or cuda");
  DIE_IF(strcmp(kind, "adamw") && strcmp(kind, "sgd") && strcmp(kind, "lamb"),
         "--kind must be adamw, sgd or lamb");
  DIE_IF(zero != 0 && zero != 1, "--zero must be 0 or 1");
  DIE_IF(!strcmp(backend, "cuda") && !mtopt_backend_available(MTOPT_BACKEND_CUDA),
         "--backend cuda: no CUDA device (or a build without CUDA)");

  bench_shape_t shape;
  char err[256];
  DIE_IF(bench_shape_make(shape_name, &shape, err, sizeof err) != 0, "%s", err);
  int local = 0;
  OK(mtopt_comm_local_rank(MPI_COMM_WORLD, &local));
  mtopt_context_config_t cc = MTOPT_CONTEXT_CONFIG_INIT;
  cc.backend = !strcmp(backend, "cuda") ? MTOPT_BACKEND_CUDA : MTOPT_BACKEND_CPU;
  cc.device = local;
  cc.num_threads = threads;
  mtopt_context_t *ctx = NULL;
  OK(mtopt_context_create(&cc, &ctx));
  mtopt_optimizer_config_t oc = MTOPT_OPTIMIZER_CONFIG_INIT;
  oc.kind = !strcmp(kind, "sgd") ? MTOPT_OPTIMIZER_SGD
            : !strcmp(kind, "lamb") ? MTOPT_OPTIMIZER_LAMB
                                    : MTOPT_OPTIMIZER_ADAMW;
  if (oc.kind == MTOPT_OPTIMIZER_SGD) oc.momentum = 0.9f;

  /* One parameter slab in the context's memory, every tensor 16-byte
   * aligned, filled from the host. */
  int64_t *off = malloc((size_t)shape.n * sizeof *off), total = 0;
  for (int64_t i = 0; i < shape.n; i++) {
    off[i] = total;
    total += (shape.numel[i] + 3) / 4 * 4;
  }
  float *params = NULL;
  OK(ctx->ops->alloc(ctx, (size_t)total * sizeof(float), (void **)&params));
  {
    float *h = malloc((size_t)total * sizeof(float));
    DIE_IF(!h, "out of host memory");
    for (int64_t i = 0; i < total; i++) h[i] = (float)((i * 2654435761u) % 2001) * 1e-3f - 1.0f;
    OK(ctx->ops->upload(ctx, params, h, (size_t)total * sizeof(float)));
    free(h);
  }
  const double gbytes = (double)shape.total * sizeof(float);
  if (g_rank == 0) {
    printf("# mtopt_dist_bench: %s (%lld tensors, %lld params, %.1f MB of gradients), %d "
           "ranks, %s, %s, zero_stage %d, median of %d (warm-up %d)\n",
           shape.name, (long long)shape.n, (long long)shape.total, gbytes / 1e6, g_world,
           backend, kind, zero, iters, warmup);
    printf("# comm: collectives alone; step: local step alone; epilogue: mtopt_dist_step "
           "(overlapped); e/c = epilogue / comm; saved = (comm + step - epilogue) / "
           "min(comm, step); colls = collectives per step\n");
    printf("# algbw = gradient bytes / comm; busbw = algbw * 2(n-1)/n (nccl-tests)\n");
    if (g_world == 1)
      printf("# 1 rank: busbw is 0 by definition (2(n-1)/n = 0: no bytes cross a link); "
             "comm is the per-call cost of the collectives (%s)\n",
             strcmp(backend, "cuda") ? "MPI on one rank" : "NCCL launches of in-place no-ops");
    if (g_world == 1)
      printf("# 1 rank: saved is not reported (there is no communication to hide)\n");
  }

  char *list_copy = strdup(buckets);
  for (char *tok = strtok(list_copy, ","); tok; tok = strtok(NULL, ",")) {
    const double mb = atof(tok);
    DIE_IF(mb <= 0, "bad bucket size '%s'", tok);
    mtopt_comm_config_t cfg = MTOPT_COMM_CONFIG_INIT;
    cfg.bucket_bytes = (size_t)(mb * (1 << 20));
    cfg.first_bucket_bytes = cfg.bucket_bytes < ((size_t)1 << 20) ? cfg.bucket_bytes
                                                                   : ((size_t)1 << 20);
    cfg.zero_stage = zero;
    cfg.comm_sm_count = comm_sms;
    mtopt_comm_t *comm = NULL;
    OK(mtopt_comm_create_mpi(ctx, MPI_COMM_WORLD, &cfg, &comm));
    if (g_rank == 0 && tok == list_copy) { /* the first size: the table's header */
      int cs = 0, ss = 0;
      OK(mtopt_comm_get_sm_split(comm, &cs, &ss));
      if (cs > 0)
        printf("# SM partition (comm_sm_count %d): collectives on %d SMs, bucket steps on %d\n",
               comm_sms, cs, ss);
      else
        printf("# SM partition (comm_sm_count %d): none\n", comm_sms);
      if (csv)
        printf("bucket_mb,buckets,colls,comm_ms,step_ms,epilogue_ms,epilogue_over_comm,saved,"
               "algbw_gbs,busbw_gbs\n");
      else
        printf("%9s %7s %5s %10s %10s %11s %6s %7s %11s %11s\n", "bucket_MB", "buckets",
               "colls", "comm_ms", "step_ms", "epilogue_ms", "e/c", "saved", "algbw_GB/s",
               "busbw_GB/s");
    }
    mtopt_tensor_list_t *l = NULL;
    OK(mtopt_tensor_list_create(ctx, &l));
    for (int64_t i = 0; i < shape.n; i++)
      OK(mtopt_tensor_list_add_f32(l, params + off[i], NULL, shape.numel[i], 0, NULL));
    run_t r = {NULL, NULL, ctx};
    OK(mtopt_dist_optimizer_create(comm, l, &oc, &r.d));
    OK(mtopt_dist_optimizer_get_optimizer(r.d, &r.inner));
    int nb = 0;
    OK(mtopt_dist_get_bucket_count(r.d, &nb));
    const int colls = mtopt__dist_segment_count(r.d);
    OK(mtopt_dist_optimizer_zero_grad(r.d)); /* timing does not depend on the values */
    const double tc = time_it(run_comm, &r, warmup, iters);
    const double ts = time_it(run_step, &r, warmup, iters);
    const double te = time_it(run_epilogue, &r, warmup, iters);
    const double mn = tc < ts ? tc : ts;
    const double saved = mn > 0 ? (tc + ts - te) / mn : 0.0;
    const double algbw = tc > 0 ? gbytes / tc / 1e9 : 0.0;
    const double busbw = algbw * 2.0 * (g_world - 1) / g_world; /* 0 at one rank */
    if (g_rank == 0) {
      const double ratio = tc > 0 ? te / tc : 0.0;
      if (csv)
        printf("%g,%d,%d,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f\n", mb, nb, colls, tc * 1e3,
               ts * 1e3, te * 1e3, ratio, g_world > 1 ? saved : 0.0, algbw, busbw);
      else if (g_world == 1)
        printf("%9g %7d %5d %10.3f %10.2f %11.2f %6s %7s %11.2f %11s\n", mb, nb, colls,
               tc * 1e3, ts * 1e3, te * 1e3, "-", "-", algbw, "0 (1 rank)");
      else
        printf("%9g %7d %5d %10.2f %10.2f %11.2f %6.3f %6.0f%% %11.2f %11.2f\n", mb, nb, colls,
               tc * 1e3, ts * 1e3, te * 1e3, ratio, 100.0 * saved, algbw, busbw);
      fflush(stdout);
    }
    OK(mtopt_dist_optimizer_destroy(r.d));
    OK(mtopt_tensor_list_destroy(l));
    OK(mtopt_comm_destroy(comm));
  }
  free(list_copy);
  ctx->ops->release(ctx, params);
  free(off);
  bench_shape_free(&shape);
  OK(mtopt_context_destroy(ctx));
  MPI_Finalize();
  return 0;
}

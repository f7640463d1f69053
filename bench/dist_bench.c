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
 * Bandwidth as nccl-tests defines it for all-reduce: algbw = gradient bytes
 * (in the gradients' dtype: 2 per parameter with --dtype bf16) / comm time,
 * busbw = algbw * 2(n-1)/n (the bytes each rank's link carries; the same
 * factor for reduce-scatter + all-gather). At one rank the factor is 0,
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
 * Precision. --dtype f32 (default): fp32 weights and gradients. --dtype bf16:
 * bf16 weights and gradients, so every bucket is bf16 and is reduced (and,
 * with --zero 1, its weights all-gathered) in 16 bits, half the bytes;
 * --master f32 (default) | remainder | none picks the masters and
 * --state-dtype f32 | bf16 the moments (with --dtype f32: no master, either
 * state dtype); --reduce-f32 sets mtopt_comm_config_t.reduce_f32 (16-bit
 * buckets widened and reduced in fp32: the comm figure includes the
 * widening, algbw still counts the gradients' own bytes). Bucket sizes are in
 * gradient bytes, as mtopt_comm_config_t counts them: a bf16 bucket of a size
 * holds twice the parameters of an f32 one.
 *
 * Memory. "state_B/p" is the optimizer state and masters the distributed
 * optimizer owns on rank 0 (mtopt_dist_optimizer_get_memory: state_bytes)
 * per parameter of the model; "total_B/p" adds its gradient buffer
 * (grad_bytes) and, with --zero 1, the reduced shard and staging
 * (shard_bytes). With --zero 1 state_B/p is about 1/world of zero_stage 0's.
 * The weights themselves are the caller's and are not counted.
 *
 *   mpirun -np 2 mtopt_dist_bench [--shape gpt2] [--buckets 1,4,25,100]
 *       [--iters 5] [--warmup 1] [--zero 0|1] [--backend cpu|cuda]
 *       [--kind adamw|sgd|lamb] [--dtype f32|bf16] [--master f32|remainder|none]
 *       [--state-dtype f32|bf16] [--reduce-f32] [--threads N] [--comm-sms N] [--csv]
 * --comm-sms sets mtopt_comm_config_t.comm_sm_count (CUDA: 0 automatic, -1 no
 * SM partition, N SMs for the collectives); the header says what was used.
 * On CUDA each rank uses its node-local rank as the device (NCCL: set
 * NCCL_NVLS_ENABLE=0 on hosts where NVLink multicast must stay off). */
#include <mpi.h>

#include <stdint.h>
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

/* fp32 to bf16, to nearest even (the fill values are finite). */
static uint16_t to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/* The index of v in names[0 .. n), or -1. */
static int pick(const char *v, const char *const *names, int n) {
  for (int i = 0; i < n; i++)
    if (!strcmp(v, names[i])) return i;
  return -1;
}

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
  const char *dtype = "f32", *master = NULL, *state = "f32";
  int iters = 5, warmup = 1, zero = 0, threads = 0, csv = 0, comm_sms = 0, reduce_f32 = 0;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--shape") && v) shape_name = argv[++i];
    else if (!strcmp(a, "--buckets") && v) buckets = argv[++i];
    else if (!strcmp(a, "--iters") && v) iters = atoi(argv[++i]);
    else if (!strcmp(a, "--warmup") && v) warmup = atoi(argv[++i]);
    else if (!strcmp(a, "--zero") && v) zero = atoi(argv[++i]);
    else if (!strcmp(a, "--backend") && v) backend = argv[++i];
    else if (!strcmp(a, "--kind") && v) kind = argv[++i];
    else if (!strcmp(a, "--dtype") && v) dtype = argv[++i];
    else if (!strcmp(a, "--master") && v) master = argv[++i];
    else if (!strcmp(a, "--state-dtype") && v) state = argv[++i];
    else if (!strcmp(a, "--threads") && v) threads = atoi(argv[++i]);
    else if (!strcmp(a, "--comm-sms") && v) comm_sms = atoi(argv[++i]);
    else if (!strcmp(a, "--reduce-f32")) reduce_f32 = 1;
    else if (!strcmp(a, "--csv")) csv = 1;
    else DIE_IF(1, "unknown argument '%s' (see the comment at the top of dist_bench.c)", a);
  }
  DIE_IF(iters < 1 || warmup < 0, "--iters must be >= 1, --warmup >= 0");
  DIE_IF(strcmp(backend, "cpu") && strcmp(backend, "cuda"), "--backend must be cpu or cuda");
  DIE_IF(strcmp(kind, "adamw") && strcmp(kind, "sgd") && strcmp(kind, "lamb"),
         "--kind must be adamw, sgd or lamb");
  DIE_IF(zero != 0 && zero != 1, "--zero must be 0 or 1");
  static const char *const dtypes[] = {"f32", "bf16"}, *const masters[] = {"none", "f32",
                                                                          "remainder"};
  const int bf16 = pick(dtype, dtypes, 2), st16 = pick(state, dtypes, 2);
  DIE_IF(bf16 < 0, "--dtype must be f32 or bf16");
  DIE_IF(st16 < 0, "--state-dtype must be f32 or bf16");
  if (!master) master = bf16 ? "f32" : "none";
  const int mw = pick(master, masters, 3);
  DIE_IF(mw < 0, "--master must be f32, remainder or none");
  DIE_IF(!bf16 && mw != 0, "--master %s: fp32 weights have no master (add --dtype bf16)", master);
  const mtopt_dtype_t dt = bf16 ? MTOPT_DTYPE_BF16 : MTOPT_DTYPE_F32;
  const size_t es = bf16 ? 2 : 4; /* bytes per weight and per gradient */
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
  oc.master_weights = mw == 1 ? MTOPT_MASTER_F32 : mw == 2 ? MTOPT_MASTER_REMAINDER
                                                           : MTOPT_MASTER_NONE;
  oc.state_dtype = st16 ? MTOPT_DTYPE_BF16 : MTOPT_DTYPE_F32;

  /* One parameter slab of the weights' dtype in the context's memory, every
   * tensor 16-byte aligned, filled from the host. */
  int64_t *off = malloc((size_t)shape.n * sizeof *off), total = 0;
  for (int64_t i = 0; i < shape.n; i++) {
    off[i] = total;
    total += (shape.numel[i] + 7) / 8 * 8;
  }
  char *params = NULL;
  OK(ctx->ops->alloc(ctx, (size_t)total * es, (void **)&params));
  {
    void *h = malloc((size_t)total * es);
    DIE_IF(!h, "out of host memory");
    for (int64_t i = 0; i < total; i++) {
      const float x = (float)((i * 2654435761u) % 2001) * 1e-3f - 1.0f;
      if (bf16) ((uint16_t *)h)[i] = to_bf16(x);
      else ((float *)h)[i] = x;
    }
    OK(ctx->ops->upload(ctx, params, h, (size_t)total * es));
    free(h);
  }
  const double gbytes = (double)shape.total * (double)es; /* gradient bytes */
  if (g_rank == 0) {
    printf("# mtopt_dist_bench: %s (%lld tensors, %lld params, %.1f MB of %s gradients), %d "
           "ranks, %s, %s, zero_stage %d, median of %d (warm-up %d)\n",
           shape.name, (long long)shape.n, (long long)shape.total, gbytes / 1e6, dtype, g_world,
           backend, kind, zero, iters, warmup);
    printf("# weights and gradients %s (buckets reduced in %s), master %s, state %s\n", dtype,
           reduce_f32 ? "f32" : dtype, master, state);
    printf("# comm: collectives alone; step: local step alone; epilogue: mtopt_dist_step "
           "(overlapped); e/c = epilogue / comm; saved = (comm + step - epilogue) / "
           "min(comm, step); colls = collectives per step\n");
    printf("# algbw = gradient bytes / comm; busbw = algbw * 2(n-1)/n (nccl-tests)\n");
    printf("# state_B/p = optimizer state and masters owned on rank 0 / parameters; total_B/p "
           "adds its gradient buffer and (ZeRO-1) reduced shard and staging "
           "(mtopt_dist_optimizer_get_memory; the weights are not counted)\n");
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
    cfg.reduce_f32 = reduce_f32;
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
               "algbw_gbs,busbw_gbs,state_bytes_per_param,total_bytes_per_param\n");
      else
        printf("%9s %7s %5s %10s %10s %11s %6s %7s %11s %11s %9s %9s\n", "bucket_MB",
               "buckets", "colls", "comm_ms", "step_ms", "epilogue_ms", "e/c", "saved",
               "algbw_GB/s", "busbw_GB/s", "state_B/p", "total_B/p");
    }
    mtopt_tensor_list_t *l = NULL;
    OK(mtopt_tensor_list_create(ctx, &l));
    for (int64_t i = 0; i < shape.n; i++) {
      mtopt_tensor_desc_t td = MTOPT_TENSOR_DESC_INIT;
      td.param = params + (size_t)off[i] * es;
      td.grad = NULL; /* the distributed optimizer's contiguous buffer */
      td.numel = shape.numel[i];
      td.param_dtype = dt;
      td.grad_dtype = dt;
      OK(mtopt_tensor_list_add(l, &td, NULL));
    }
    run_t r = {NULL, NULL, ctx};
    OK(mtopt_dist_optimizer_create(comm, l, &oc, &r.d));
    OK(mtopt_dist_optimizer_get_optimizer(r.d, &r.inner));
    int nb = 0;
    OK(mtopt_dist_get_bucket_count(r.d, &nb));
    const int colls = mtopt__dist_segment_count(r.d);
    mtopt_dist_memory_t mem = MTOPT_DIST_MEMORY_INIT;
    OK(mtopt_dist_optimizer_get_memory(r.d, &mem));
    const double np_ = mem.params > 0 ? (double)mem.params : 1.0;
    const double state_bp = (double)mem.state_bytes / np_;
    const double total_bp = (double)(mem.state_bytes + mem.grad_bytes + mem.shard_bytes) / np_;
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
        printf("%g,%d,%d,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f\n", mb, nb, colls,
               tc * 1e3, ts * 1e3, te * 1e3, ratio, g_world > 1 ? saved : 0.0, algbw, busbw,
               state_bp, total_bp);
      else if (g_world == 1)
        printf("%9g %7d %5d %10.3f %10.2f %11.2f %6s %7s %11.2f %11s %9.2f %9.2f\n", mb, nb,
               colls, tc * 1e3, ts * 1e3, te * 1e3, "-", "-", algbw, "0 (1 rank)", state_bp,
               total_bp);
      else
        printf("%9g %7d %5d %10.2f %10.2f %11.2f %6.3f %6.0f%% %11.2f %11.2f %9.2f %9.2f\n", mb,
               nb, colls, tc * 1e3, ts * 1e3, te * 1e3, ratio, 100.0 * saved, algbw, busbw,
               state_bp, total_bp);
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

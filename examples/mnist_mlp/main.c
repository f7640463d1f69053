/* mnist_mlp: trains a 784-512-256-10 MLP on Fashion-MNIST (or any IDX data
 * set: MNIST, KMNIST) with mtopt doing every optimizer step in one fused pass.
 *
 * The loop, per batch:
 *   forward + backward (backend: OpenBLAS on the CPU, cuBLAS on the GPU), the
 *   backward writing gradients straight into the optimizer's gradient buffer;
 *   mtopt_optimizer_step (one pass over all six tensors; optionally a CUDA
 *   graph replay).
 * Once per epoch it also times the same step done the usual way, one optimizer
 * per tensor, on copies of the weights, to show what fusing buys.
 *
 * Data parallel: under `mpirun -np N` (or with --dist) every rank trains on
 * its 1/N of each global batch and steps with mtopt_dist_step, which averages
 * the gradients over the ranks (MPI collectives on the CPU, NCCL on GPUs),
 * bucket by bucket as backward produces them, fused with the update. The
 * MPI/mtopt_dist calls are in dp.c.
 *
 * Run with --help for the flags. docs/mnist.md has sample output. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dp.h"
#include "idx.h"
#include "mlp.h"
#include "mtopt/mtopt.h"

#define DEFAULT_DATA_DIR "/usr/share/datasets/fashion-mnist"
#define COMPARE_WARMUP 3
#define COMPARE_STEPS 20

/* ------------------------------------------------------------- options -- */

typedef enum { FORCE_AUTO, FORCE_CPU, FORCE_GPU } force_t;

typedef struct {
  const char *data_dir;
  int epochs;
  int batch;
  mtopt_optimizer_kind_t kind;
  float lr, wd;           /* < 0: the optimizer's default below */
  int cosine;             /* cosine decay of lr to 0 over the run */
  force_t force;
  uint64_t seed;
  float clip;             /* max_grad_norm, 0 = off */
  float loss_scale;       /* static scale; with dynamic, the initial one */
  int dynamic_loss_scale;
  int64_t train_limit;    /* 0 = all */
  const char *csv, *plot;
  const char *save, *resume; /* checkpoint files */
  int threads;      /* BLAS threads, 0 = OpenBLAS's default */
  int step_threads; /* mtopt CPU step threads, 0 = OpenMP's default */
  int graph;
  int dist;       /* data parallel even at one process */
  int zero_stage; /* data parallel: 0 all-reduce, 1 ZeRO-1 */
} options_t;

static void usage(FILE *f) {
  fprintf(f,
      "usage: mnist_mlp [flags]\n"
      "Trains a 784-512-256-10 MLP (ReLU, softmax cross-entropy) with mtopt.\n"
      "\n"
      "  --data DIR            IDX files (NAME.gz or NAME) [" DEFAULT_DATA_DIR "]\n"
      "  --epochs N            passes over the training set [5]\n"
      "  --batch N             images per step, over all ranks [128]\n"
      "  --optimizer NAME      adamw | sgd | lamb [adamw]\n"
      "  --lr X                peak learning rate [adamw 1e-3, sgd 0.05, lamb 5e-3]\n"
      "  --wd X                weight decay, not applied to biases\n"
      "                        [adamw 1e-2, sgd 5e-4, lamb 1e-2]\n"
      "  --schedule NAME       cosine (decay to 0 over the run) | constant [cosine]\n"
      "  --clip X              clip the global gradient norm to X, 0 = off [0]\n"
      "  --loss-scale X        static loss scale [1]\n"
      "  --dynamic-loss-scale  GradScaler-style dynamic scale, starting at\n"
      "                        --loss-scale if given, else 65536\n"
      "  --cpu | --gpu         force a backend [GPU if built and present, else CPU]\n"
      "  --graph               GPU: replay the optimizer step from a CUDA graph\n"
      "  --threads N           CPU: OpenBLAS threads, 0 = OpenBLAS's default\n"
      "                        (OPENBLAS_NUM_THREADS, else all cores) [0]\n"
      "  --step-threads N      CPU: threads of the mtopt step, 0 = OpenMP's\n"
      "                        default [1] (see docs/mnist.md)\n"
      "  --seed N              weight init and shuffling [42]\n"
      "  --train-limit N       use only the first N training images, 0 = all [0]\n"
      "  --csv FILE            write the loss curve (step,loss) as CSV\n"
      "  --plot FILE.png       plot the loss curve with gnuplot (if installed)\n"
      "  --save FILE           checkpoint (weights, optimizer state, step) after\n"
      "                        every epoch\n"
      "  --resume FILE         continue from a --save checkpoint, at the epoch after\n"
      "                        the one it was written at (same flags otherwise)\n"
      "  --help                this text\n"
      "\n"
      "Data parallel (a build with MPI): run under mpirun, e.g.\n"
      "  mpirun -np 4 mnist_mlp            (GPUs: one per rank, NCCL;\n"
      "                                     CPUs: add --cpu --threads 1)\n"
      "Each rank takes 1/N of every batch; mtopt_dist averages the gradients\n"
      "over the ranks in the fused step. Rank 0 prints and writes the files.\n"
      "  --dist                data parallel even with one process\n"
      "  --zero 0|1            0: all-reduce the gradients; 1: ZeRO-1 (each rank\n"
      "                        keeps 1/N of the optimizer state; no --save) [0]\n");
}

static const char *need_value(int argc, char **argv, int *i) {
  if (*i + 1 >= argc) MLP_DIE("%s needs a value (see --help)", argv[*i]);
  return argv[++*i];
}

static long long parse_int(const char *flag, const char *s, long long lo, long long hi) {
  char *end = NULL;
  long long v = strtoll(s, &end, 10);
  if (end == s || *end != '\0' || v < lo || v > hi)
    MLP_DIE("%s: '%s' is not an integer in [%lld, %lld]", flag, s, lo, hi);
  return v;
}

static float parse_float(const char *flag, const char *s, double lo, double hi) {
  char *end = NULL;
  double v = strtod(s, &end);
  if (end == s || *end != '\0' || !(v >= lo && v <= hi))
    MLP_DIE("%s: '%s' is not a number in [%g, %g]", flag, s, lo, hi);
  return (float)v;
}

static options_t parse_options(int argc, char **argv) {
  options_t o = {.data_dir = DEFAULT_DATA_DIR, .epochs = 5, .batch = 128,
                 .kind = MTOPT_OPTIMIZER_ADAMW, .lr = -1.0f, .wd = -1.0f, .cosine = 1,
                 .seed = 42, .loss_scale = 0.0f,
                 /* One step thread: OpenBLAS keeps its threads spinning between
                  * GEMMs, and a second busy-waiting pool (OpenMP's) on the same
                  * cores makes both slow; the step is small next to the GEMMs. */
                 .step_threads = 1};
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
      usage(stdout);
      exit(0);
    } else if (!strcmp(a, "--data")) {
      o.data_dir = need_value(argc, argv, &i);
    } else if (!strcmp(a, "--epochs")) {
      o.epochs = (int)parse_int(a, need_value(argc, argv, &i), 1, 100000);
    } else if (!strcmp(a, "--batch")) {
      o.batch = (int)parse_int(a, need_value(argc, argv, &i), 1, 65536);
    } else if (!strcmp(a, "--optimizer")) {
      const char *v = need_value(argc, argv, &i);
      if (!strcmp(v, "adamw")) o.kind = MTOPT_OPTIMIZER_ADAMW;
      else if (!strcmp(v, "sgd")) o.kind = MTOPT_OPTIMIZER_SGD;
      else if (!strcmp(v, "lamb")) o.kind = MTOPT_OPTIMIZER_LAMB;
      else MLP_DIE("--optimizer: '%s' is not one of adamw, sgd, lamb", v);
    } else if (!strcmp(a, "--lr")) {
      o.lr = parse_float(a, need_value(argc, argv, &i), 0.0, 1e3);
    } else if (!strcmp(a, "--wd")) {
      o.wd = parse_float(a, need_value(argc, argv, &i), 0.0, 1e3);
    } else if (!strcmp(a, "--schedule")) {
      const char *v = need_value(argc, argv, &i);
      if (!strcmp(v, "cosine")) o.cosine = 1;
      else if (!strcmp(v, "constant")) o.cosine = 0;
      else MLP_DIE("--schedule: '%s' is not one of cosine, constant", v);
    } else if (!strcmp(a, "--clip")) {
      o.clip = parse_float(a, need_value(argc, argv, &i), 0.0, 1e30);
    } else if (!strcmp(a, "--loss-scale")) {
      o.loss_scale = parse_float(a, need_value(argc, argv, &i), 1e-30, 1e30);
    } else if (!strcmp(a, "--dynamic-loss-scale")) {
      o.dynamic_loss_scale = 1;
    } else if (!strcmp(a, "--cpu")) {
      o.force = FORCE_CPU;
    } else if (!strcmp(a, "--gpu")) {
      o.force = FORCE_GPU;
    } else if (!strcmp(a, "--graph")) {
      o.graph = 1;
    } else if (!strcmp(a, "--threads")) {
      o.threads = (int)parse_int(a, need_value(argc, argv, &i), 0, 4096);
    } else if (!strcmp(a, "--step-threads")) {
      o.step_threads = (int)parse_int(a, need_value(argc, argv, &i), 0, 4096);
    } else if (!strcmp(a, "--seed")) {
      o.seed = (uint64_t)parse_int(a, need_value(argc, argv, &i), 0, INT64_MAX);
    } else if (!strcmp(a, "--train-limit")) {
      o.train_limit = parse_int(a, need_value(argc, argv, &i), 0, INT64_MAX);
    } else if (!strcmp(a, "--csv")) {
      o.csv = need_value(argc, argv, &i);
    } else if (!strcmp(a, "--plot")) {
      o.plot = need_value(argc, argv, &i);
    } else if (!strcmp(a, "--save")) {
      o.save = need_value(argc, argv, &i);
    } else if (!strcmp(a, "--resume")) {
      o.resume = need_value(argc, argv, &i);
    } else if (!strcmp(a, "--dist")) {
      o.dist = 1;
    } else if (!strcmp(a, "--zero")) {
      o.zero_stage = (int)parse_int(a, need_value(argc, argv, &i), 0, 1);
    } else {
      fprintf(stderr, "error: unknown flag '%s'\n\n", a);
      usage(stderr);
      exit(2);
    }
  }
  /* Defaults that depend on the optimizer, tuned on Fashion-MNIST. */
  if (o.lr < 0.0f)
    o.lr = o.kind == MTOPT_OPTIMIZER_SGD ? 0.05f : o.kind == MTOPT_OPTIMIZER_LAMB ? 5e-3f : 1e-3f;
  if (o.wd < 0.0f) o.wd = o.kind == MTOPT_OPTIMIZER_SGD ? 5e-4f : 1e-2f;
  if (o.loss_scale == 0.0f) o.loss_scale = o.dynamic_loss_scale ? 65536.0f : 1.0f;
  return o;
}

/* ------------------------------------------------------ small utilities -- */

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* splitmix64: tiny and reproducible from --seed. */
static uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static double rng_uniform(uint64_t *s) { /* in (0, 1) */
  return ((double)(rng_next(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
static double rng_normal(uint64_t *s) { /* Box-Muller */
  const double u = rng_uniform(s), v = rng_uniform(s);
  return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

static void shuffle(int32_t *perm, int64_t n, uint64_t *rng) {
  for (int64_t i = n - 1; i > 0; i--) {
    const int64_t j = (int64_t)(rng_next(rng) % (uint64_t)(i + 1));
    const int32_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
}

static void load_data(const char *dir, int64_t limit, idx_set_t *train, idx_set_t *test) {
  if (idx_load_set(dir, "train-images-idx3-ubyte", "train-labels-idx1-ubyte", train) ||
      idx_load_set(dir, "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte", test)) {
    fprintf(stderr, "error: could not read the data set in %s (use --data DIR)\n", dir);
    exit(1);
  }
  idx_truncate(train, limit);
}

/* Mean and standard deviation of the training pixels, in [0, 1] units. */
static void pixel_stats(const idx_set_t *set, float *mean, float *std) {
  const int64_t n = set->count * MLP_INPUT;
  double s = 0.0, s2 = 0.0;
  for (int64_t i = 0; i < n; i++) {
    const double p = set->pixels[i] / 255.0;
    s += p;
    s2 += p * p;
  }
  const double mu = s / (double)n;
  *mean = (float)mu;
  *std = (float)sqrt(fmax(s2 / (double)n - mu * mu, 1e-12));
}

/* The backend, and on the GPU the device: with data parallel, one per rank
 * of the node (the node-local rank, wrapped when CUDA_VISIBLE_DEVICES leaves
 * each rank fewer devices than there are ranks). */
static const mlp_ops_t *choose_backend(const options_t *o, const dp_t *dp, int *device) {
  *device = 0;
#ifdef MNIST_WITH_CUDA
  const int count = mtopt_backend_available(MTOPT_BACKEND_CUDA) ? mlp_cuda_device_count() : 0;
  if (o->force == FORCE_GPU && count == 0)
    MLP_DIE("--gpu: no usable CUDA device (mtopt_backend_available(CUDA) is false)");
  if (o->force != FORCE_CPU && count > 0) {
#ifndef MTOPT_HAVE_NCCL
    if (dp->on)
      MLP_DIE("data parallel on GPUs needs NCCL, and this build has none (configure mtopt "
              "with -DMTOPT_WITH_NCCL=ON, or use --cpu for MPI collectives)");
#endif
    *device = dp->local_rank % count;
    return &mlp_cuda_ops;
  }
#else
  if (o->force == FORCE_GPU)
    MLP_DIE("--gpu: this build has no CUDA support (configure mtopt with -DMTOPT_WITH_CUDA=ON)");
#endif
  if (o->graph) MLP_DIE("--graph needs the GPU backend");
  return &mlp_cpu_ops;
}

static mtopt_optimizer_config_t optimizer_config(const options_t *o) {
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  c.kind = o->kind;
  c.lr = o->lr;
  c.weight_decay = o->wd;
  if (o->kind == MTOPT_OPTIMIZER_SGD) c.momentum = 0.9f;
  c.max_grad_norm = o->clip;
  c.loss_scale = o->loss_scale;
  c.dynamic_loss_scale = o->dynamic_loss_scale;
  return c;
}

/* The tensors param[first .. first+count), with their gradients in the
 * library's contiguous buffer (grad = NULL: the distributed optimizer needs
 * it, its buckets are ranges of it); biases get no weight decay, as usual. */
static mtopt_tensor_list_t *make_list(mtopt_context_t *ctx, float *const *param,
                                      const int64_t *numel, int first, int count) {
  static const char *names[MLP_TENSORS] = {"W1", "b1", "W2", "b2", "W3", "b3"};
  mtopt_tensor_list_t *list = NULL;
  MTOPT_CHECK(mtopt_tensor_list_create(ctx, &list));
  for (int t = first; t < first + count; t++) {
    mtopt_tensor_desc_t d = MTOPT_TENSOR_DESC_INIT;
    d.param = param[t];
    d.grad = NULL;
    d.numel = numel[t];
    d.flags = (t % 2 == 1) ? MTOPT_TENSOR_NO_WEIGHT_DECAY : 0u; /* b1, b2, b3 */
    d.name = names[t];
    MTOPT_CHECK(mtopt_tensor_list_add(list, &d, NULL));
  }
  return list;
}

/* A plain (one-process) optimizer over those tensors. */
static mtopt_optimizer_t *make_optimizer(mtopt_context_t *ctx, const options_t *o,
                                         float *const *param, const int64_t *numel, int first,
                                         int count, mtopt_tensor_list_t **list_out) {
  *list_out = make_list(ctx, param, numel, first, count);
  const mtopt_optimizer_config_t cfg = optimizer_config(o);
  mtopt_optimizer_t *opt = NULL;
  MTOPT_CHECK(mtopt_optimizer_create(ctx, *list_out, &cfg, &opt));
  return opt;
}

/* The comparison: the same update done the way most training loops do it, one
 * optimizer (one step call) per tensor, against one fused step, both on copies
 * of the current weights and gradients. Timed, never trained with. The two are
 * alternated step by step so that both see the same cache and clock state. */
typedef struct {
  float *fused_param[MLP_TENSORS], *loop_param[MLP_TENSORS];
  mtopt_optimizer_t *fused, *loop[MLP_TENSORS];
  mtopt_tensor_list_t *fused_list, *loop_list[MLP_TENSORS];
} compare_t;

static void compare_create(compare_t *c, mlp_t *m, mtopt_context_t *ctx, const options_t *o) {
  for (int t = 0; t < MLP_TENSORS; t++) {
    c->fused_param[t] = m->ops->alloc(m, m->numel[t]);
    c->loop_param[t] = m->ops->alloc(m, m->numel[t]);
  }
  c->fused = make_optimizer(ctx, o, c->fused_param, m->numel, 0, MLP_TENSORS, &c->fused_list);
  for (int t = 0; t < MLP_TENSORS; t++)
    c->loop[t] = make_optimizer(ctx, o, c->loop_param, m->numel, t, 1, &c->loop_list[t]);
}

/* Mean ms of one fused step and of one per-tensor loop over all tensors. */
static void compare_time(compare_t *c, mlp_t *m, double *fused_ms, double *loop_ms) {
  for (int t = 0; t < MLP_TENSORS; t++) {
    void *g_fused = NULL, *g_loop = NULL;
    MTOPT_CHECK(mtopt_optimizer_get_grad(c->fused, t, &g_fused));
    MTOPT_CHECK(mtopt_optimizer_get_grad(c->loop[t], 0, &g_loop));
    m->ops->copy(m, c->fused_param[t], m->param[t], m->numel[t]);
    m->ops->copy(m, c->loop_param[t], m->param[t], m->numel[t]);
    m->ops->copy(m, g_fused, m->grad[t], m->numel[t]);
    m->ops->copy(m, g_loop, m->grad[t], m->numel[t]);
  }
  double fused = 0.0, loop = 0.0;
  for (int s = 0; s < COMPARE_WARMUP + COMPARE_STEPS; s++) {
    m->ops->synchronize(m);
    const double t0 = now_s();
    MTOPT_CHECK(mtopt_optimizer_step(c->fused));
    m->ops->synchronize(m);
    const double t1 = now_s();
    for (int t = 0; t < MLP_TENSORS; t++) MTOPT_CHECK(mtopt_optimizer_step(c->loop[t]));
    m->ops->synchronize(m);
    const double t2 = now_s();
    if (s >= COMPARE_WARMUP) {
      fused += t1 - t0;
      loop += t2 - t1;
    }
  }
  *fused_ms = 1e3 * fused / COMPARE_STEPS;
  *loop_ms = 1e3 * loop / COMPARE_STEPS;
}

static void compare_destroy(compare_t *c, mlp_t *m) {
  MTOPT_CHECK(mtopt_optimizer_destroy(c->fused));
  MTOPT_CHECK(mtopt_tensor_list_destroy(c->fused_list));
  for (int t = 0; t < MLP_TENSORS; t++) {
    MTOPT_CHECK(mtopt_optimizer_destroy(c->loop[t]));
    MTOPT_CHECK(mtopt_tensor_list_destroy(c->loop_list[t]));
    m->ops->release(m, c->fused_param[t]);
    m->ops->release(m, c->loop_param[t]);
  }
}

/* The loss curve as a PNG, through gnuplot if it is on PATH. */
/* Plots steps [first, first + n) of the curve. */
static void plot_loss(const char *png, const float *curve, int64_t first, int64_t n,
                      const char *title) {
  if (system("command -v gnuplot >/dev/null 2>&1") != 0) {
    printf("gnuplot is not installed: no plot written (the --csv file has the curve)\n");
    return;
  }
  FILE *gp = popen("gnuplot", "w");
  if (!gp) {
    printf("could not start gnuplot: no plot written\n");
    return;
  }
  fprintf(gp, "set terminal pngcairo size 900,500\nset output '%s'\n", png);
  fprintf(gp, "set termoption noenhanced\nset title '%s'\n", title);
  fprintf(gp, "set xlabel 'step'\nset ylabel 'training loss'\nset logscale y\nset grid\n");
  fprintf(gp, "$loss << EOD\n");
  for (int64_t i = first; i < first + n; i++)
    fprintf(gp, "%lld %.6g\n", (long long)i + 1, curve[i]);
  fprintf(gp, "EOD\nplot $loss with lines lc rgb '#a0c0e0' title 'loss per step', \\\n"
              "     $loss smooth bezier lw 2 lc rgb '#1050a0' title 'smoothed'\n");
  if (pclose(gp) != 0) printf("gnuplot failed: no plot written to %s\n", png);
  else printf("wrote %s\n", png);
}

/* ------------------------------------------------------- data parallel -- */

/* Flags that data parallel changes the meaning of, checked once MPI is up
 * (every rank finds the same errors: one message, a clean exit). */
static void check_dist_options(const options_t *o, const dp_t *dp) {
  if (o->zero_stage != 0 && !dp->on)
    dp_die_all(dp, "--zero needs data parallel: run under mpirun -np N (N > 1), or add --dist");
  if (dp->on && o->graph)
    dp_die_all(dp, "--graph is not supported with data parallel (mtopt_dist_step issues "
                   "collectives; it is not captured into a CUDA graph)");
  if (dp->on && o->zero_stage == 1 && (o->save || o->resume))
    dp_die_all(dp, "%s with --zero 1: each rank keeps only 1/%d of the optimizer state and "
                   "mtopt_dist has no call that saves or loads it as a whole; use --zero 0",
               o->save ? "--save" : "--resume", dp->world);
}

/* Rank r's share of a global batch of n images: [n r / world, n (r+1) / world),
 * so shares differ by at most one image (and may be empty when n < world). */
static void batch_share(const dp_t *dp, int n, int *lo, int *rows) {
  *lo = (int)((int64_t)n * dp->rank / dp->world);
  *rows = (int)((int64_t)n * (dp->rank + 1) / dp->world) - *lo;
}

/* Images in batch b of an epoch (the last one may be short). */
static int batch_size(int64_t count, int batch, int64_t b) {
  const int64_t left = count - b * batch;
  return (int)(left < batch ? left : batch);
}

/* Test accuracy in %, each rank evaluating its share of the test split. */
static double test_accuracy(mlp_t *m, dp_t *dp) {
  const int64_t n = m->test->count;
  const int64_t lo = n * dp->rank / dp->world, hi = n * (dp->rank + 1) / dp->world;
  int64_t correct = hi > lo ? m->ops->evaluate(m, lo, hi - lo) : 0;
  dp_sum_i64(dp, &correct, 1);
  return 100.0 * (double)correct / (double)n;
}

/* Backward finished layer l (tensors 2l, 2l+1 and everything above):
 * the buckets it completes start their all-reduce now. */
static void grads_done(void *dp, int layer) { dp_tensors_done(dp, 2 * layer); }

/* ----------------------------------------------------------------- main -- */

int main(int argc, char **argv) {
  const options_t o = parse_options(argc, argv);
  /* Data parallel when mpirun started several processes (or --dist): MPI
   * starts here. Only rank 0 talks; the others' errors still go to stderr. */
  dp_t dp;
  dp_start(&dp, &argc, &argv, o.dist);
  if (dp.rank != 0 && !freopen("/dev/null", "w", stdout))
    MLP_DIE("rank %d: cannot redirect stdout", dp.rank);
  check_dist_options(&o, &dp);
  dp.zero_stage = o.zero_stage;
  const int lead = dp.rank == 0; /* writes the CSV, the plot, the checkpoints */
  int device = 0;
  const mlp_ops_t *ops = choose_backend(&o, &dp, &device);

  idx_set_t train = {0}, test = {0};
  load_data(o.data_dir, o.train_limit, &train, &test);
  const int64_t steps_per_epoch = (train.count + o.batch - 1) / o.batch;
  const int64_t total_steps = steps_per_epoch * o.epochs;

  mlp_t m = {.ops = ops, .threads = o.threads, .use_graph = o.graph, .device = device,
             .train = &train, .test = &test};
  m.max_batch = o.batch > MLP_EVAL_BATCH ? o.batch : MLP_EVAL_BATCH;
  m.max_slots = steps_per_epoch;
  pixel_stats(&train, &m.mean, &m.std);
  ops->init(&m);
  ops->set_data(&m, &train, &test);

  /* The mtopt context: where the optimizer's state lives and its steps run. */
  mtopt_context_config_t ccfg = MTOPT_CONTEXT_CONFIG_INIT;
  ccfg.backend = ops->mtopt_backend;
  ccfg.device = device;
  ccfg.num_threads = o.step_threads;
  mtopt_context_t *ctx = NULL;
  MTOPT_CHECK(mtopt_context_create(&ccfg, &ctx));
  ops->bind(&m, ctx);

  /* He initialisation: W ~ N(0, 2 / fan_in), b = 0. Every rank draws the
   * same numbers from --seed, so the ranks start from the same weights. */
  uint64_t rng = o.seed;
  for (int l = 0; l < MLP_LAYERS; l++) {
    const int fan_in = mlp_dims[l], out = mlp_dims[l + 1];
    m.numel[2 * l] = (int64_t)out * fan_in;
    m.numel[2 * l + 1] = out;
    float *w = malloc((size_t)m.numel[2 * l] * sizeof(float));
    float *b = calloc((size_t)out, sizeof(float));
    if (!w || !b) MLP_DIE("out of host memory");
    const double sd = sqrt(2.0 / fan_in);
    for (int64_t i = 0; i < m.numel[2 * l]; i++) w[i] = (float)(sd * rng_normal(&rng));
    m.param[2 * l] = ops->alloc(&m, m.numel[2 * l]);
    m.param[2 * l + 1] = ops->alloc(&m, out);
    ops->upload(&m, m.param[2 * l], w, m.numel[2 * l]);
    ops->upload(&m, m.param[2 * l + 1], b, out);
    free(w);
    free(b);
  }
  int64_t num_params = 0;
  for (int t = 0; t < MLP_TENSORS; t++) num_params += m.numel[t];

  /* One optimizer over all six tensors; backward writes into its gradient
   * buffer. Data parallel: the distributed optimizer, whose inner optimizer
   * takes the lr, gives the step info and saves checkpoints like the plain
   * one; backward tells it when each bucket's gradients are complete. */
  mtopt_tensor_list_t *list = make_list(ctx, m.param, m.numel, 0, MLP_TENSORS);
  const mtopt_optimizer_config_t cfg = optimizer_config(&o);
  mtopt_optimizer_t *opt = NULL;
  if (dp.on) {
    opt = dp_optimizer_create(&dp, ctx, list, &cfg, m.grad, MLP_TENSORS);
    m.grads_done = grads_done;
    m.grads_done_arg = &dp;
  } else {
    MTOPT_CHECK(mtopt_optimizer_create(ctx, list, &cfg, &opt));
    for (int t = 0; t < MLP_TENSORS; t++)
      MTOPT_CHECK(mtopt_optimizer_get_grad(opt, t, (void **)&m.grad[t]));
  }
  const int scale_on_device = o.dynamic_loss_scale && ops->use_dynamic_scale(&m, opt);
  mtopt_optimizer_info_t info = MTOPT_OPTIMIZER_INFO_INIT;
  MTOPT_CHECK(mtopt_optimizer_get_info(opt, &info));

  compare_t cmp; /* rank 0 only: it prints the timings */
  if (lead) compare_create(&cmp, &m, ctx, &o);

  /* Resuming: the checkpoint holds the weights, the optimizer state and the
   * step count; the epoch to continue at follows from the count (skipped
   * steps count too: they used a batch). Data parallel (ZeRO stage 0): rank
   * 0 wrote it and every rank loads it. */
  int first_epoch = 1;
  if (o.resume) {
    MTOPT_CHECK(mtopt_optimizer_load(opt, o.resume));
    mtopt_step_info_t r = MTOPT_STEP_INFO_INIT;
    MTOPT_CHECK(mtopt_optimizer_get_step_info(opt, &r));
    const int64_t done = r.step + r.skipped_steps;
    if (done % steps_per_epoch != 0)
      MLP_DIE("%s: %lld steps done is not a whole number of epochs of %lld steps "
              "(was it saved with other --batch or --train-limit values?)",
              o.resume, (long long)done, (long long)steps_per_epoch);
    first_epoch = (int)(done / steps_per_epoch) + 1;
    if (!o.cosine) MTOPT_CHECK(mtopt_optimizer_set_lr(opt, o.lr)); /* --lr wins */
  }

  static const char *kind_names[] = {"adamw", "adam", "sgd", "lamb"};
  printf("mtopt %s | backend %s%s | data %s (%lld train, %lld test)\n", mtopt_version_string(),
         ops->name, o.graph ? " + CUDA graph" : "", o.data_dir, (long long)train.count,
         (long long)test.count);
  if (dp.on)
    printf("data parallel: %d rank(s), %s over %s, %d buckets; each rank takes 1/%d of "
           "every batch\n",
           dp.world, dp.zero_stage ? "ZeRO-1 (reduce-scatter, all-gather)" : "all-reduce",
           ops->mtopt_backend == MTOPT_BACKEND_CUDA ? "NCCL" : "MPI", dp_bucket_count(&dp),
           dp.world);
  printf("model 784-512-256-10: %lld parameters in %d tensors; the step: %lld parameters%s, "
         "%lld chunks, %d launch(es)\n",
         (long long)num_params, MLP_TENSORS, (long long)info.total_numel,
         dp.zero_stage ? " (this rank's shard)" : "", (long long)info.num_chunks,
         info.launches_per_step);
  printf("%s lr %g (%s) wd %g | batch %d | epochs %d | seed %llu%s%s\n", kind_names[o.kind],
         o.lr, o.cosine ? "cosine" : "constant", o.wd, o.batch, o.epochs,
         (unsigned long long)o.seed, o.clip > 0.0f ? " | clip" : "",
         o.dynamic_loss_scale ? " | dynamic loss scale" : o.loss_scale != 1.0f ? " | loss scale" : "");
  if (o.resume) printf("resumed from %s after epoch %d\n", o.resume, first_epoch - 1);
  if (dp.on)
    printf("step_ms: mean time in mtopt_dist_step after backward (buckets marked ready\n"
           "during backward are reduced, and stepped, from there on)\n");
  else
    printf("step_ms: mean fused step while training\n");
  printf("fused_ms / loop_ms: one fused step vs one optimizer per tensor, alternated on\n"
         "copies of the weights (%d steps)\n",
         COMPARE_STEPS);
  printf("%5s %10s %9s %9s %9s %8s %9s %9s\n", "epoch", "train_loss", "train_acc", "test_acc",
         "images/s", "step_ms", "fused_ms", "loop_ms");

  FILE *csv = NULL;
  if (o.csv && lead) {
    csv = fopen(o.csv, "w");
    if (!csv) MLP_DIE("cannot write %s", o.csv);
    fprintf(csv, "step,loss\n");
  }
  float *curve = malloc((size_t)total_steps * sizeof(float));
  int32_t *perm = malloc((size_t)train.count * sizeof(int32_t));
  float *slot_loss = malloc((size_t)steps_per_epoch * sizeof(float));
  int32_t *slot_correct = malloc((size_t)steps_per_epoch * sizeof(int32_t));
  double *step_loss = malloc((size_t)steps_per_epoch * sizeof(double));
  if (!curve || !perm || !slot_loss || !slot_correct || !step_loss)
    MLP_DIE("out of host memory");
  for (int64_t i = 0; i < train.count; i++) perm[i] = (int32_t)i;

  double test_acc = 0.0;
  int64_t step = 0;
  for (int epoch = 1; epoch <= o.epochs; epoch++) {
    shuffle(perm, train.count, &rng); /* the same order on every rank */
    if (epoch < first_epoch) { /* done before the checkpoint: keep the RNG in step */
      step += steps_per_epoch;
      continue;
    }
    ops->set_order(&m, perm, train.count);
    double step_time = 0.0;
    const double t_epoch = now_s();
    for (int64_t b = 0; b < steps_per_epoch; b++, step++) {
      const int n = batch_size(train.count, o.batch, b);
      int lo = 0, rows = 0;
      batch_share(&dp, n, &lo, &rows);
      if (o.cosine) {
        const double lr = 0.5 * o.lr * (1.0 + cos(M_PI * (double)step / (double)total_steps));
        MTOPT_CHECK(mtopt_optimizer_set_lr(opt, (float)lr));
      }
      /* Dynamic scaling moves the scale inside the optimizer; the backward
       * pass must use the scale the step will divide by. The CUDA backend
       * reads it on the device; otherwise ask for it here. */
      float scale = o.loss_scale;
      if (o.dynamic_loss_scale && !scale_on_device) {
        mtopt_step_info_t si = MTOPT_STEP_INFO_INIT;
        MTOPT_CHECK(mtopt_optimizer_get_step_info(opt, &si));
        scale = si.loss_scale;
      }
      /* ZeRO-1 stages its all-gather in the gradient buffer, which is
       * undefined after a step: zero it before backward, as mtopt_dist.h asks. */
      if (dp.zero_stage == 1) dp_zero_grad(&dp);
      /* Each rank's gradient is of its rows' summed loss / (n / world): the
       * ranks' average, which mtopt_dist_step takes, is then the gradient of
       * the mean loss over all n images, as one process computes it. */
      if (rows > 0)
        ops->train_batch(&m, b * o.batch + lo, rows, (float)n / (float)dp.world, scale, b);
      else
        dp_zero_grad(&dp); /* fewer images than ranks: this one adds nothing */
      ops->synchronize(&m); /* so the timer sees the step alone */
      const double t0 = now_s();
      if (dp.on)
        dp_step(&dp);
      else
        ops->optimizer_step(&m, opt);
      ops->synchronize(&m);
      step_time += now_s() - t0;
    }
    dp_synchronize(&dp); /* reports asynchronous NCCL errors */
    const double train_time = now_s() - t_epoch;

    /* Each step's loss over the whole batch and the correct count: every
     * rank weighs its mean loss by its rows, and the ranks' sums add up. */
    ops->read_slots(&m, steps_per_epoch, slot_loss, slot_correct);
    int64_t correct = 0;
    for (int64_t b = 0; b < steps_per_epoch; b++) {
      int lo = 0, rows = 0;
      batch_share(&dp, batch_size(train.count, o.batch, b), &lo, &rows);
      step_loss[b] = rows > 0 ? (double)slot_loss[b] * rows : 0.0;
      correct += rows > 0 ? slot_correct[b] : 0;
    }
    dp_sum_f64(&dp, step_loss, (int)steps_per_epoch);
    dp_sum_i64(&dp, &correct, 1);
    double loss_sum = 0.0;
    for (int64_t b = 0; b < steps_per_epoch; b++) {
      const int64_t s = (epoch - 1) * steps_per_epoch + b;
      curve[s] = (float)(step_loss[b] / batch_size(train.count, o.batch, b));
      if (csv) fprintf(csv, "%lld,%.6g\n", (long long)s + 1, curve[s]);
      loss_sum += curve[s];
    }
    test_acc = test_accuracy(&m, &dp);
    double fused_ms = 0.0, loop_ms = 0.0;
    if (lead) compare_time(&cmp, &m, &fused_ms, &loop_ms);
    printf("%5d %10.4f %8.2f%% %8.2f%% %9.0f %8.3f %9.3f %9.3f\n", epoch,
           loss_sum / (double)steps_per_epoch, 100.0 * (double)correct / (double)train.count,
           test_acc, (double)train.count / train_time, 1e3 * step_time / steps_per_epoch,
           fused_ms, loop_ms);
    fflush(stdout);
    if (o.save && lead) MTOPT_CHECK(mtopt_optimizer_save(opt, o.save));
  }
  if (first_epoch > o.epochs) /* the checkpoint was already at the end */
    test_acc = test_accuracy(&m, &dp);
  if (o.save) printf("saved %s\n", o.save);

  mtopt_step_info_t si = MTOPT_STEP_INFO_INIT;
  MTOPT_CHECK(mtopt_optimizer_get_step_info(opt, &si));
  if (si.skipped_steps > 0 || o.dynamic_loss_scale)
    printf("steps applied %lld, skipped for non-finite gradients %lld, final loss scale %g\n",
           (long long)si.step, (long long)si.skipped_steps, si.loss_scale);
  if (csv) {
    if (fclose(csv) != 0) MLP_DIE("error writing %s", o.csv);
    printf("wrote %s\n", o.csv);
  }
  if (o.plot && lead) {
    char title[256];
    snprintf(title, sizeof title, "mnist_mlp: %s on %s%s, test accuracy %.2f%%",
             kind_names[o.kind], ops->name, dp.on ? " (data parallel)" : "", test_acc);
    const int64_t first_step = (first_epoch - 1) * steps_per_epoch;
    if (first_step < total_steps)
      plot_loss(o.plot, curve, first_step, total_steps - first_step, title);
  }
  printf("test accuracy: %.2f%%\n", test_acc);

  /* The context enqueues on the backend's stream: destroy it first. The
   * distributed optimizer owns the inner one; MPI is finalised after it. */
  if (lead) compare_destroy(&cmp, &m);
  if (dp.on)
    dp_finish(&dp);
  else
    MTOPT_CHECK(mtopt_optimizer_destroy(opt));
  MTOPT_CHECK(mtopt_tensor_list_destroy(list));
  for (int t = 0; t < MLP_TENSORS; t++) ops->release(&m, m.param[t]);
  MTOPT_CHECK(mtopt_context_destroy(ctx));
  ops->destroy(&m);
  free(curve);
  free(perm);
  free(slot_loss);
  free(slot_correct);
  free(step_loss);
  idx_free(&train);
  idx_free(&test);
  return 0;
}

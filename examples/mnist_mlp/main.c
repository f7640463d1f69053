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
 * Mixed precision (--precision bf16|fp16, --master, --state-dtype,
 * --rounding): the weights and gradients are 16-bit tensors registered with
 * mtopt in that dtype; the products take 16-bit inputs and sum in fp32
 * (mlp.h), and mtopt keeps the master weights and rounds as asked. Under
 * data parallel the same: the 16-bit gradients are reduced in 16 bits, and
 * with --zero 1 each rank keeps the masters and state of its shard only.
 *
 * This file: start-up, the backend, the data, the epoch loop and its
 * report. The flags are in options.c, the parameters and the optimizer in
 * model.c, one epoch in train.c, the per-tensor comparison in compare.c.
 * Run with --help for the flags. docs/mnist.md has sample output. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp.h"
#include "idx.h"
#include "mlp.h"
#include "mnist.h"
#include "mtopt/mtopt.h"

/* ------------------------------------------------------------ set-up -- */

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
}

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
  const int lead = dp.rank == 0; /* writes the CSV and the plot */
  int device = 0;
  const mlp_ops_t *ops = choose_backend(&o, &dp, &device);

  idx_set_t train = {0}, test = {0};
  load_data(o.data_dir, o.train_limit, &train, &test);
  const int64_t steps_per_epoch = (train.count + o.batch - 1) / o.batch;
  const int64_t total_steps = steps_per_epoch * o.epochs;

  mlp_t m = {.ops = ops, .threads = o.threads, .use_graph = o.graph, .device = device,
             .dtype = o.precision, .train = &train, .test = &test};
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

  /* He initialisation from --seed; the same RNG then shuffles each epoch. */
  uint64_t rng = o.seed;
  model_init(&m, &rng);
  int64_t num_params = 0;
  for (int t = 0; t < MLP_TENSORS; t++) num_params += m.numel[t];

  /* One optimizer over all six tensors; backward writes into its gradient
   * buffer. Data parallel: the distributed optimizer, whose inner optimizer
   * takes the lr, gives the step info and saves checkpoints like the plain
   * one; backward tells it when each bucket's gradients are complete. */
  mtopt_tensor_list_t *list = make_list(ctx, m.param, m.numel, m.dtype, 0, MLP_TENSORS);
  mtopt_optimizer_t *opt = NULL;
  if (dp.on) {
    const mtopt_optimizer_config_t cfg = optimizer_config(&o);
    char flags[160];
    precision_flags(&o, flags, sizeof flags);
    opt = dp_optimizer_create(&dp, ctx, list, &cfg, flags, m.grad, MLP_TENSORS);
    m.grads_done = grads_done;
    m.grads_done_arg = &dp;
  } else {
    opt = make_optimizer(ctx, &o, list);
    for (int t = 0; t < MLP_TENSORS; t++)
      MTOPT_CHECK(mtopt_optimizer_get_grad(opt, t, &m.grad[t]));
  }
  const int scale_on_device = o.dynamic_loss_scale && ops->use_dynamic_scale(&m, opt);
  mtopt_optimizer_info_t info = MTOPT_OPTIMIZER_INFO_INIT;
  MTOPT_CHECK(mtopt_optimizer_get_info(opt, &info));

  compare_t cmp; /* rank 0 only: it prints the timings */
  if (lead) compare_create(&cmp, &m, ctx, &o);

  /* Resuming: the checkpoint holds the weights, the optimizer state (with
   * the masters of 16-bit weights) and the step count; the epoch to continue
   * at follows from the count (skipped steps count too: they used a batch).
   * Data parallel: mtopt_dist_optimizer_load, collective (ZeRO stage 0:
   * every rank reads the file rank 0 wrote; stage 1: each rank its shard). */
  int first_epoch = 1;
  if (o.resume) {
    if (dp.on)
      dp_load(&dp, o.resume);
    else
      MTOPT_CHECK(mtopt_optimizer_load(opt, o.resume));
    mtopt_step_info_t r = MTOPT_STEP_INFO_INIT;
    MTOPT_CHECK(mtopt_optimizer_get_step_info(opt, &r));
    const int64_t done = r.step + r.skipped_steps;
    if (done % steps_per_epoch != 0) /* the same count on every rank */
      dp_die_all(&dp, "%s: %lld steps done is not a whole number of epochs of %lld steps "
                      "(was it saved with other --batch or --train-limit values?)",
                 o.resume, (long long)done, (long long)steps_per_epoch);
    first_epoch = (int)(done / steps_per_epoch) + 1;
    if (!o.cosine) MTOPT_CHECK(mtopt_optimizer_set_lr(opt, o.lr)); /* --lr wins */
  }

  static const char *kind_names[] = {"adamw", "adam", "sgd", "lamb"};
  printf("mtopt %s | backend %s%s | data %s (%lld train, %lld test)\n", mtopt_version_string(),
         ops->name, o.graph ? " + CUDA graph" : "", o.data_dir, (long long)train.count,
         (long long)test.count);
  dp_print(&dp, ops->mtopt_backend == MTOPT_BACKEND_CUDA);
  printf("model 784-512-256-10: %lld parameters in %d tensors; the step: %lld parameters%s, "
         "%lld chunks, %d launch(es)\n",
         (long long)num_params, MLP_TENSORS, (long long)info.total_numel,
         dp.zero_stage ? " (this rank's shard)" : "", (long long)info.num_chunks,
         info.launches_per_step);
  printf("%s lr %g (%s) wd %g | batch %d | epochs %d | seed %llu%s%s\n", kind_names[o.kind],
         o.lr, o.cosine ? "cosine" : "constant", o.wd, o.batch, o.epochs,
         (unsigned long long)o.seed, o.clip > 0.0f ? " | clip" : "",
         o.dynamic_loss_scale ? " | dynamic loss scale" : o.loss_scale != 1.0f ? " | loss scale" : "");
  if (o.precision != MTOPT_DTYPE_F32 || o.state_dtype != MTOPT_DTYPE_F32)
    printf("precision %s (weights, gradients, product inputs; products sum in fp32) | "
           "master %s | state %s | rounding %s | step %d bytes/param\n",
           dtype_flag(o.precision), master_flag(o.master),
           o.state_dtype == MTOPT_DTYPE_BF16 ? "bf16" : "f32", rounding_flag(o.rounding),
           info.bytes_per_param);
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
  trainer_t tr;
  trainer_init(&tr, &o, &m, &dp, opt, scale_on_device, csv);
  int32_t *perm = malloc((size_t)train.count * sizeof(int32_t));
  if (!perm) MLP_DIE("out of host memory");
  for (int64_t i = 0; i < train.count; i++) perm[i] = (int32_t)i;

  double test_acc = 0.0;
  for (int epoch = 1; epoch <= o.epochs; epoch++) {
    shuffle(perm, train.count, &rng); /* the same order on every rank */
    if (epoch < first_epoch) continue; /* done before the checkpoint: the RNG kept in step */
    epoch_stats_t st;
    train_epoch(&tr, epoch, perm, &st);
    test_acc = test_accuracy(&m, &dp);
    double fused_ms = 0.0, loop_ms = 0.0;
    if (lead) compare_time(&cmp, &m, &fused_ms, &loop_ms);
    printf("%5d %10.4f %8.2f%% %8.2f%% %9.0f %8.3f %9.3f %9.3f\n", epoch, st.loss,
           st.train_acc, test_acc, st.images_per_s, st.step_ms, fused_ms, loop_ms);
    fflush(stdout);
    /* Data parallel: collective (ZeRO-1: every rank writes its shard). */
    if (o.save && dp.on)
      dp_save(&dp, o.save);
    else if (o.save)
      MTOPT_CHECK(mtopt_optimizer_save(opt, o.save));
  }
  if (first_epoch > o.epochs) /* the checkpoint was already at the end */
    test_acc = test_accuracy(&m, &dp);
  if (o.save && dp.on && dp.zero_stage == 1)
    printf("saved %s.rank<r>-of-%d (one shard per rank)\n", o.save, dp.world);
  else if (o.save)
    printf("saved %s\n", o.save);

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
      plot_loss(o.plot, tr.curve, first_step, total_steps - first_step, title);
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
  trainer_free(&tr);
  free(perm);
  idx_free(&train);
  idx_free(&test);
  return 0;
}

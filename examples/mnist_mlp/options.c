/* mnist_mlp's flags: parsing, defaults, and the rules between the precision
 * flags. See --help and docs/mnist.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mnist.h"

const char *dtype_flag(mtopt_dtype_t dt) {
  return dt == MTOPT_DTYPE_BF16 ? "bf16" : dt == MTOPT_DTYPE_F16 ? "fp16" : "fp32";
}
const char *master_flag(mtopt_master_t master) {
  return master == MTOPT_MASTER_F32 ? "f32" : master == MTOPT_MASTER_REMAINDER ? "remainder"
                                                                               : "none";
}
const char *rounding_flag(mtopt_rounding_t r) {
  return r == MTOPT_ROUNDING_STOCHASTIC ? "stochastic" : "nearest";
}

void precision_flags(const options_t *o, char *buf, size_t size) {
  snprintf(buf, size, "--precision %s --master %s --state-dtype %s --rounding %s",
           dtype_flag(o->precision), master_flag(o->master),
           o->state_dtype == MTOPT_DTYPE_BF16 ? "bf16" : "f32", rounding_flag(o->rounding));
}

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
      "  --precision NAME      fp32 | bf16 | fp16: weights, gradients and the inputs\n"
      "                        of every matrix product (which sums in fp32) [fp32];\n"
      "                        fp16 turns on --dynamic-loss-scale\n"
      "  --master NAME         for bf16/fp16 weights: none (stepped in place) | f32\n"
      "                        (an fp32 copy in the optimizer) | remainder (bf16: the\n"
      "                        low 16 bits of the fp32 master) [none]\n"
      "  --state-dtype NAME    the optimizer's moments / momentum: f32 | bf16 [f32]\n"
      "  --rounding NAME       bf16 values written without a master (weights with\n"
      "                        --master none, bf16 state): nearest | stochastic\n"
      "                        [nearest]\n"
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
      "                        every epoch (--zero 1: one shard per rank,\n"
      "                        FILE.rank<r>-of-<N>)\n"
      "  --resume FILE         continue from a --save checkpoint, at the epoch after\n"
      "                        the one it was written at (same flags otherwise)\n"
      "  --help                this text\n"
      "\n"
      "Data parallel (a build with MPI): run under mpirun, e.g.\n"
      "  mpirun -np 4 mnist_mlp            (GPUs: one per rank, NCCL;\n"
      "                                     CPUs: add --cpu --threads 1)\n"
      "Each rank takes 1/N of every batch; mtopt_dist averages the gradients\n"
      "over the ranks in the fused step. Rank 0 prints and writes the CSV and\n"
      "the plot; --save is collective.\n"
      "  --dist                data parallel even with one process\n"
      "  --zero 0|1            0: all-reduce the gradients; 1: ZeRO-1 (each rank\n"
      "                        keeps 1/N of the optimizer state and masters) [0]\n"
      "The precision flags apply as in one process; 16-bit gradients are reduced\n"
      "in 16 bits.\n");
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

/* --precision fp32|bf16|fp16 (with_f16), --state-dtype f32|bf16. */
static mtopt_dtype_t parse_dtype(const char *flag, const char *v, int with_f16) {
  if (!strcmp(v, with_f16 ? "fp32" : "f32")) return MTOPT_DTYPE_F32;
  if (!strcmp(v, "bf16")) return MTOPT_DTYPE_BF16;
  if (with_f16 && !strcmp(v, "fp16")) return MTOPT_DTYPE_F16;
  MLP_DIE("%s: '%s' is not one of %s", flag, v, with_f16 ? "fp32, bf16, fp16" : "f32, bf16");
}

/* The precision flags together. mtopt accepts some combinations that do
 * nothing (docs/optimizers.md): master weights of fp32 parameters,
 * stochastic rounding where nothing is rounded stochastically. The example
 * refuses those, so that a flag never silently does nothing. What the library
 * itself refuses (--master remainder with fp16 weights: the remainder is the
 * low half of an fp32 whose high half is a bf16) is left to it:
 * make_optimizer prints its status and message. */
static void check_precision(options_t *o) {
  if (o->precision == MTOPT_DTYPE_F32 && o->master != MTOPT_MASTER_NONE)
    MLP_DIE("--master %s: the weights are fp32 (--precision fp32); master weights are kept "
            "for bf16 or fp16 weights only (add --precision bf16 or fp16)",
            master_flag(o->master));
  /* mtopt rounds stochastically only bf16 values written without a master:
   * the weights under MTOPT_MASTER_NONE, and bf16 state. fp16 is always
   * rounded to nearest; with a master the weights are its nearest rounding. */
  const int sr_used = (o->precision == MTOPT_DTYPE_BF16 && o->master == MTOPT_MASTER_NONE) ||
                      o->state_dtype == MTOPT_DTYPE_BF16;
  if (o->rounding == MTOPT_ROUNDING_STOCHASTIC && !sr_used)
    MLP_DIE("--rounding stochastic: nothing would be rounded stochastically with "
            "--precision %s --master %s --state-dtype f32: mtopt rounds stochastically only "
            "bf16 values written without a master (bf16 weights with --master none, or "
            "--state-dtype bf16); fp16 values are always rounded to nearest, and with "
            "master weights the weights are the master rounded to nearest",
            dtype_flag(o->precision), master_flag(o->master));
  /* fp16's range (6e-8 .. 65504) loses small gradients without a loss scale
   * and overflows with too large a one: the dynamic scale finds the range. */
  if (o->precision == MTOPT_DTYPE_F16) o->dynamic_loss_scale = 1;
}

options_t parse_options(int argc, char **argv) {
  options_t o = {.data_dir = DEFAULT_DATA_DIR, .epochs = 5, .batch = 128,
                 .kind = MTOPT_OPTIMIZER_ADAMW, .lr = -1.0f, .wd = -1.0f, .cosine = 1,
                 .seed = 42, .loss_scale = 0.0f,
                 .precision = MTOPT_DTYPE_F32, .master = MTOPT_MASTER_NONE,
                 .state_dtype = MTOPT_DTYPE_F32, .rounding = MTOPT_ROUNDING_NEAREST,
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
    } else if (!strcmp(a, "--precision")) {
      o.precision = parse_dtype(a, need_value(argc, argv, &i), 1);
    } else if (!strcmp(a, "--master")) {
      const char *v = need_value(argc, argv, &i);
      if (!strcmp(v, "none")) o.master = MTOPT_MASTER_NONE;
      else if (!strcmp(v, "f32")) o.master = MTOPT_MASTER_F32;
      else if (!strcmp(v, "remainder")) o.master = MTOPT_MASTER_REMAINDER;
      else MLP_DIE("--master: '%s' is not one of none, f32, remainder", v);
    } else if (!strcmp(a, "--state-dtype")) {
      o.state_dtype = parse_dtype(a, need_value(argc, argv, &i), 0);
    } else if (!strcmp(a, "--rounding")) {
      const char *v = need_value(argc, argv, &i);
      if (!strcmp(v, "nearest")) o.rounding = MTOPT_ROUNDING_NEAREST;
      else if (!strcmp(v, "stochastic")) o.rounding = MTOPT_ROUNDING_STOCHASTIC;
      else MLP_DIE("--rounding: '%s' is not one of nearest, stochastic", v);
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
  check_precision(&o);
  /* Defaults that depend on the optimizer, tuned on Fashion-MNIST. */
  if (o.lr < 0.0f)
    o.lr = o.kind == MTOPT_OPTIMIZER_SGD ? 0.05f : o.kind == MTOPT_OPTIMIZER_LAMB ? 5e-3f : 1e-3f;
  if (o.wd < 0.0f) o.wd = o.kind == MTOPT_OPTIMIZER_SGD ? 5e-4f : 1e-2f;
  if (o.loss_scale == 0.0f) o.loss_scale = o.dynamic_loss_scale ? 65536.0f : 1.0f;
  return o;
}


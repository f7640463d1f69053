/* The pieces of the mnist_mlp program, which main.c ties together:
 *   options.c  the flags, their defaults and the rules between them
 *   model.c    the parameters (He initialisation, in the chosen dtype), their
 *              mtopt tensor list and the optimizer
 *   compare.c  the fused step against one optimizer per tensor, timed
 *   train.c    one epoch of training, and the test accuracy
 * and a few small utilities (a clock, the RNG). The model and its two
 * backends are in mlp.h; data parallel in dp.h. */
#ifndef MNIST_MNIST_H
#define MNIST_MNIST_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#include "dp.h"
#include "mlp.h"
#include "mtopt/mtopt.h"

#define DEFAULT_DATA_DIR "/usr/share/datasets/fashion-mnist"

/* ------------------------------------------------------ options.c ------ */

typedef enum { FORCE_AUTO, FORCE_CPU, FORCE_GPU } force_t;

typedef struct {
  const char *data_dir;
  int epochs;
  int batch;
  mtopt_optimizer_kind_t kind;
  float lr, wd;           /* the optimizer's default when not given */
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
  /* Mixed precision: the dtype of weights, gradients and product inputs,
   * and the optimizer's master weights, state dtype and rounding. */
  mtopt_dtype_t precision;
  mtopt_master_t master;
  mtopt_dtype_t state_dtype;
  mtopt_rounding_t rounding;
} options_t;

/* Parses and checks the flags; prints a message naming the flag and exits
 * on a bad one (--help: the usage, exit 0). */
options_t parse_options(int argc, char **argv);

/* The flag spellings of the precision settings ("bf16", "remainder", ...). */
const char *dtype_flag(mtopt_dtype_t dt);
const char *master_flag(mtopt_master_t master);
const char *rounding_flag(mtopt_rounding_t rounding);

/* "--precision X --master X --state-dtype X --rounding X", for messages. */
void precision_flags(const options_t *o, char *buf, size_t size);

/* -------------------------------------------------------- model.c ------ */

/* He initialisation, W ~ N(0, 2 / fan_in) and b = 0, drawn from *rng in
 * fp32 and stored in m->dtype (rounded to nearest): allocates m->param
 * through the backend and sets m->numel. */
void model_init(mlp_t *m, uint64_t *rng);

mtopt_optimizer_config_t optimizer_config(const options_t *o);

/* The tensors param[first .. first + count) of dtype dt, gradients in the
 * library's contiguous buffer; biases get no weight decay. */
mtopt_tensor_list_t *make_list(mtopt_context_t *ctx, void *const *param, const int64_t *numel,
                               mtopt_dtype_t dt, int first, int count);

/* mtopt_optimizer_create; when the library refuses the configuration, says
 * which flags it was made from, with the library's status and message. */
mtopt_optimizer_t *make_optimizer(mtopt_context_t *ctx, const options_t *o,
                                  mtopt_tensor_list_t *list);

/* ------------------------------------------------------ compare.c ------ */

/* The same update done the way most training loops do it, one optimizer
 * (one step call) per tensor, against one fused step, both on copies of the
 * current weights and gradients. Timed, never trained with. */
#define COMPARE_STEPS 20 /* timed steps, after 3 of warm-up */

typedef struct {
  void *fused_param[MLP_TENSORS], *loop_param[MLP_TENSORS];
  mtopt_optimizer_t *fused, *loop[MLP_TENSORS];
  mtopt_tensor_list_t *fused_list, *loop_list[MLP_TENSORS];
} compare_t;

void compare_create(compare_t *c, mlp_t *m, mtopt_context_t *ctx, const options_t *o);
/* Mean ms of one fused step and of one per-tensor loop over all tensors. */
void compare_time(compare_t *c, mlp_t *m, double *fused_ms, double *loop_ms);
void compare_destroy(compare_t *c, mlp_t *m);

/* -------------------------------------------------------- train.c ------ */

typedef struct {
  const options_t *o;
  mlp_t *m;
  dp_t *dp;
  mtopt_optimizer_t *opt;
  int scale_on_device; /* the backend reads the dynamic loss scale itself */
  int64_t steps_per_epoch, total_steps;
  FILE *csv;           /* the loss curve, or NULL */
  float *curve;        /* [total_steps] loss per step */
  float *slot_loss;    /* per epoch: each step's loss and correct count */
  int32_t *slot_correct;
  double *step_loss;
} trainer_t;

typedef struct {
  double loss;      /* mean training loss of the epoch */
  double train_acc; /* % of the batches as they were trained */
  double images_per_s;
  double step_ms;   /* mean time of the optimizer step */
} epoch_stats_t;

void trainer_init(trainer_t *t, const options_t *o, mlp_t *m, dp_t *dp, mtopt_optimizer_t *opt,
                  int scale_on_device, FILE *csv);
void trainer_free(trainer_t *t);
/* Trains epoch `epoch` (1-based: steps (epoch - 1) steps_per_epoch and on) on
 * the training images in the order perm. */
void train_epoch(trainer_t *t, int epoch, const int32_t *perm, epoch_stats_t *out);
/* Test accuracy in %, each rank evaluating its share of the test split. */
double test_accuracy(mlp_t *m, dp_t *dp);
/* mlp_t.grads_done for data parallel (arg: the dp_t). */
void grads_done(void *dp, int layer);

/* ------------------------------------------------------- utilities ----- */

static inline double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* splitmix64: tiny and reproducible from --seed. */
static inline uint64_t rng_next(uint64_t *s) {
  uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
static inline double rng_uniform(uint64_t *s) { /* in (0, 1) */
  return ((double)(rng_next(s) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}
static inline double rng_normal(uint64_t *s) { /* Box-Muller */
  const double u = rng_uniform(s), v = rng_uniform(s);
  return sqrt(-2.0 * log(u)) * cos(2.0 * M_PI * v);
}

static inline void shuffle(int32_t *perm, int64_t n, uint64_t *rng) {
  for (int64_t i = n - 1; i > 0; i--) {
    const int64_t j = (int64_t)(rng_next(rng) % (uint64_t)(i + 1));
    const int32_t t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
}

#endif /* MNIST_MNIST_H */

/* A test rig: a random tensor list stepped by mtopt (CPU backend) and by the
 * double reference side by side. Used by optimizers.c and mixed_precision.c. */
#ifndef MTOPT_TEST_RIG_H
#define MTOPT_TEST_RIG_H

#include "reference.h"
#include "test_util.h"

typedef struct {
  int64_t n_tensors; /* tensor count */
  int64_t max_numel; /* sizes are drawn up to this (plus a few fixed odd ones) */
  int n_groups;      /* groups 0..n_groups-1 with random multipliers */
  int lib_grads;     /* 0: user grads, 1: all library-owned, 2: a random mix */
  int num_threads;   /* context threads (0: OpenMP default) */
  int allow_empty;   /* some tensors with numel 0 */
} rig_opts_t;

#define RIG_OPTS_INIT {12, 3000, 3, 2, 0, 1}

typedef struct {
  mtopt_context_t *ctx;
  mtopt_tensor_list_t *list;
  mtopt_optimizer_t *opt;
  mtopt_optimizer_config_t cfg;
  int64_t n;
  int64_t *numel;
  int32_t *group;
  uint32_t *flags;
  float **w_mem, **g_mem; /* allocations (w, user grads sit at odd offsets) */
  float **w;              /* the weights mtopt steps */
  float **g;              /* where each step reads its gradient */
  float lr_mult[MTOPT_MAX_GROUPS], wd_mult[MTOPT_MAX_GROUPS];
  ref_opt_t ref;
} rig_t;

/* Builds everything from the rng; the same seed gives the same rig. */
void rig_build(rig_t *r, tu_rng_t *rng, const mtopt_optimizer_config_t *cfg,
               const rig_opts_t *o);
void rig_destroy(rig_t *r);
/* Fresh random gradients in [-1, 1), times scale, in every g[i]. */
void rig_fill_grads(rig_t *r, tu_rng_t *rng, float scale);
/* One step of both. */
void rig_step(rig_t *r);
/* Sets a hyperparameter on both. */
void rig_set(rig_t *r, mtopt_hyperparam_t which, double value);

typedef struct {
  double w_atol, w_rtol; /* weights */
  double s_atol, s_rtol; /* state (m, momentum buffer) */
  double v_atol, v_rtol; /* second moment */
} rig_tol_t;

/* Compares weights and every state buffer the optimizer keeps with the
 * reference; fails the test naming the tensor, buffer and step. */
void rig_check(rig_t *r, const rig_tol_t *tol, int step);

/* Total elements, and a snapshot of all weights and state (for bit checks). */
int64_t rig_total(const rig_t *r);
/* Writes w then every state buffer into out (rig_snapshot_len floats). */
int64_t rig_snapshot_len(const rig_t *r);
void rig_snapshot(rig_t *r, float *out);

#endif /* MTOPT_TEST_RIG_H */

/* The distributed layer's mixed precision under mpirun (the rig of
 * dist_rig.h: the CPU backend at -np 1, 2 and 3, CUDA with --backend cuda):
 * F16/BF16 parameters and gradients, masters or remainders, BF16 state,
 * stochastic rounding and mixed tables against one process; the buckets'
 * classes; sharded checkpoints; memory; bad inputs.
 *
 * The oracle, as dist.c's: the plain optimizer on the same backend stepping
 * the averaged gradient, computed as the transport does: the ranks' small
 * integers summed (exact in every dtype, in any order), times
 * (float)(1/world) in float, rounded to the gradient dtype. So parameters,
 * state and masters must equal it bit for bit, except where the norm is
 * summed in another order (ZeRO-1 with clipping) or NCCL's ncclAvg
 * premultiplies (CUDA, world not a power of two): there the parameters agree
 * within two ulps of their dtype (dist_rig.h, differs), the norm to 1e-6. */
#include <mpi.h>

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/dtype.h"
#include "dist_rig.h"

enum { NTM = DR_MAXT, MAXN = DR_MAXN, STEPS = 4 };
#define F32 MTOPT__DT_F32
#define F16 MTOPT__DT_F16
#define BF16 MTOPT__DT_BF16

static size_t esz(int dt) { return (size_t)mtopt__dt_size(dt); }

/* ---- the buckets: one class each, matching their tensors ---- */
static void check_buckets(mtopt_dist_optimizer_t *d, const model_t *t,
                          const mtopt_comm_config_t *cc, int ncls, rec_t *rec) {
  int nb = 0, seen[9] = {0}, classes = 0;
  EXPECT_OK(rec, mtopt_dist_get_bucket_count(d, &nb));
  EXPECT(rec, nb >= 3, "only %d buckets: the test wants several", nb);
  int64_t prev_first = t->n;
  for (int b = 0; b < nb; b++) {
    int64_t ft = -1, ntn = 0, off = 0, len = 0;
    mtopt_dtype_t g = 9, p = 9;
    EXPECT_OK(rec, mtopt_dist_get_bucket(d, b, &ft, &ntn, &off, &len));
    EXPECT_OK(rec, mtopt_dist_get_bucket_dtype(d, b, &g, &p));
    if (ft < 0 || ntn <= 0 || ft + ntn > t->n || g > 2 || p > 2) {
      EXPECT(rec, 0, "bucket %d: span [%lld, +%lld), class %d/%d", b, (long long)ft,
             (long long)ntn, (int)g, (int)p);
      continue;
    }
    EXPECT(rec, ft < prev_first, "bucket %d starts at tensor %lld, after %lld", b,
           (long long)ft, (long long)prev_first);
    prev_first = ft;
    if (!seen[g * 3 + p]++) classes++;
    void *gb = NULL;
    int64_t gn = 0;
    EXPECT_OK(rec, mtopt_dist_optimizer_get_grad_buffer_dtype(d, g, &gb, &gn));
    EXPECT(rec, off >= 0 && off + len <= gn, "bucket %d outside its buffer", b);
    int64_t lo = -1, hi = -1, bytes = 0, lowest_class = -1;
    for (int i = 0; i < t->n; i++)
      if (t->gdt[i] == (int)g && t->pdt[i] == (int)p && lowest_class < 0) lowest_class = i;
    for (int64_t i = ft; i < ft + ntn; i++) {
      int tb = -1;
      EXPECT_OK(rec, mtopt_dist_get_tensor_bucket(d, i, &tb));
      const int same = t->gdt[i] == (int)g && t->pdt[i] == (int)p;
      EXPECT(rec, same == (tb == b), "tensor %lld (%d/%d) in bucket %d, span of bucket %d (%d/%d)",
             (long long)i, t->gdt[i], t->pdt[i], tb, b, (int)g, (int)p);
      if (tb != b) continue;
      if (lo < 0) lo = i;
      hi = i;
      bytes += t->numel[i] * (int64_t)esz(t->gdt[i]);
      char *v = NULL;
      EXPECT_OK(rec, mtopt_dist_optimizer_get_grad(d, i, (void **)&v));
      if (t->numel[i])
        EXPECT(rec, v >= (char *)gb + off * esz(g) &&
                        v + t->numel[i] * esz(g) <= (char *)gb + (off + len) * esz(g),
               "tensor %lld's gradient lies outside bucket %d", (long long)i, b);
    }
    EXPECT(rec, lo == ft && hi == ft + ntn - 1,
           "bucket %d spans [%lld, %lld], members [%lld, %lld]", b, (long long)ft,
           (long long)(ft + ntn - 1), (long long)lo, (long long)hi);
    /* Closed once it reaches its size (the class's first bucket: the first
     * size): without its last tensor it was below it. */
    const int64_t cap = seen[g * 3 + p] == 1 ? (int64_t)cc->first_bucket_bytes
                                             : (int64_t)cc->bucket_bytes;
    EXPECT(rec, bytes >= cap || lo == lowest_class, "bucket %d: %lld bytes < %lld", b,
           (long long)bytes, (long long)cap);
    if (lo >= 0)
      EXPECT(rec, bytes - t->numel[lo] * (int64_t)esz(g) < cap, "bucket %d too full: %lld", b,
             (long long)bytes);
  }
  EXPECT(rec, classes == ncls, "%d classes of buckets, the table has %d", classes, ncls);
  for (int i = 0; i < t->n; i++) {
    int tb = -1;
    EXPECT_OK(rec, mtopt_dist_get_tensor_bucket(d, i, &tb));
    EXPECT(rec, tb >= 0 && tb < nb, "tensor %d in bucket %d of %d", i, tb, nb);
  }
  /* One buffer call where the gradients have one dtype. */
  int gdts = 0;
  for (int g = 0; g < 3; g++) gdts += seen[g * 3] + seen[g * 3 + 1] + seen[g * 3 + 2] > 0;
  void *one = NULL;
  int64_t n1 = 0;
  EXPECT_ST(rec, mtopt_dist_optimizer_get_grad_buffer(d, &one, &n1),
            gdts == 1 ? MTOPT_STATUS_SUCCESS : MTOPT_STATUS_INVALID_USAGE);
}

/* ---- equivalence with one process ---- */
typedef struct {
  const char *name;
  int pdt[4], gdt[4], ncls; /* tensor i: class i % ncls */
  mtopt_optimizer_kind_t kind;
  mtopt_master_t master;
  int state_dtype, rounding, loss_scale;
} mx_case_t;

static const mx_case_t mx_cases[] = {
    {"bf16, f32 masters", {BF16}, {BF16}, 1, MTOPT_OPTIMIZER_ADAMW, MTOPT_MASTER_F32, F32, 0, 0},
    {"bf16, remainders", {BF16}, {BF16}, 1, MTOPT_OPTIMIZER_ADAMW, MTOPT_MASTER_REMAINDER, F32,
     0, 0},
    {"bf16 state", {BF16, F32}, {BF16, F32}, 2, MTOPT_OPTIMIZER_ADAMW, MTOPT_MASTER_F32, BF16,
     0, 0},
    {"stochastic rounding", {BF16}, {BF16}, 1, MTOPT_OPTIMIZER_ADAMW, MTOPT_MASTER_NONE, F32, 1, 0},
    {"stochastic rounding, bf16 state", {BF16}, {BF16}, 1, MTOPT_OPTIMIZER_ADAMW,
     MTOPT_MASTER_NONE, BF16, 1, 0},
    {"f16 grads, dynamic loss scale", {F16, F32}, {F16, F16}, 2, MTOPT_OPTIMIZER_ADAM,
     MTOPT_MASTER_F32, F32, 0, 1},
    {"mixed table", {F32, BF16, F32, BF16}, {F32, BF16, BF16, F32}, 4, MTOPT_OPTIMIZER_ADAMW,
     MTOPT_MASTER_F32, F32, 0, 0},
    {"mixed table, sgd, remainders", {F32, BF16, F32, BF16}, {F32, BF16, BF16, F32}, 4,
     MTOPT_OPTIMIZER_SGD, MTOPT_MASTER_REMAINDER, F32, 0, 0},
};
#define N_MX ((int)(sizeof mx_cases / sizeof mx_cases[0]))

static mtopt_optimizer_config_t mx_config(const mx_case_t *c, int clip) {
  mtopt_optimizer_config_t oc = MTOPT_OPTIMIZER_CONFIG_INIT;
  oc.kind = c->kind;
  oc.chunk_size = 64;
  oc.lr = 1e-2f;
  oc.weight_decay = 0.05f;
  if (c->kind == MTOPT_OPTIMIZER_SGD) {
    oc.momentum = 0.9f;
    oc.nesterov = 1;
    oc.lr = 0.05f;
  }
  oc.max_grad_norm = clip ? 20.0f : 0.0f; /* the averaged gradient's norm is ~100 */
  if (c->loss_scale) {
    oc.loss_scale = 1024.0f; /* 6 * 1024 * 3 ranks: well inside f16 */
    oc.dynamic_loss_scale = 1;
    oc.growth_interval = 2;
  }
  oc.master_weights = c->master;
  oc.state_dtype = (mtopt_dtype_t)c->state_dtype;
  oc.rounding = c->rounding ? MTOPT_ROUNDING_STOCHASTIC : MTOPT_ROUNDING_NEAREST;
  oc.seed = 0x5eed0000u + (uint64_t)c->kind;
  return oc;
}

/* Loop index: case _i / 4; zero_stage _i % 2; clipping (_i / 2) % 2. */
START_TEST(test_equivalence) {
  const mx_case_t *c = &mx_cases[_i / 4];
  const int zero = _i % 2, clip = (_i / 2) % 2;
  rec_t rec = {0};
  mtopt_context_t *ctx = test_context();
  static model_t t;
  model_init(&t, NTM, NULL, c->pdt, c->gdt, c->ncls, 1, 0x3a11u + (uint64_t)_i);
  const mtopt_comm_config_t cc = small_buckets(zero);
  mtopt_comm_t *comm = NULL;
  EXPECT_OK(&rec, mtopt_comm_create_mpi(ctx, MPI_COMM_WORLD, &cc, &comm));
  const mtopt_optimizer_config_t oc = mx_config(c, clip);
  mtopt_tensor_list_t *dl = model_list(ctx, &t, 0, -1, NULL, 0, &rec);
  mtopt_tensor_list_t *rl = model_list(ctx, &t, 1, -1, NULL, 0, &rec);
  mtopt_dist_optimizer_t *d = NULL;
  mtopt_optimizer_t *ref = NULL, *inner = NULL;
  EXPECT_OK(&rec, mtopt_dist_optimizer_create(comm, dl, &oc, &d));
  EXPECT_OK(&rec, mtopt_optimizer_create(ctx, rl, &oc, &ref));
  if (!d || !ref) goto done; /* the same on every rank: create agrees */
  EXPECT_OK(&rec, mtopt_dist_optimizer_get_optimizer(d, &inner));
  check_buckets(d, &t, &cc, c->ncls, &rec);
  /* Bit for bit but where the norm is summed in another order or the
   * average is premultiplied inexactly (ncclAvg; F16 on both transports: the
   * averaged gradients then differ by an ulp, and atol allows that in every
   * update). */
  int avg_exact = 1;
  for (int k = 0; k < c->ncls; k++) avg_exact = avg_exact && average_is_exact_for(c->gdt[k]);
  const int tol = (zero && clip) || !avg_exact;
  const double atol = avg_exact ? 1e-6 : STEPS * (double)oc.lr * 0x1p-6;
  for (int s = 0; s < STEPS; s++) {
    mtopt_step_info_t ri = MTOPT_STEP_INFO_INIT, di = MTOPT_STEP_INFO_INIT;
    EXPECT_OK(&rec, mtopt_optimizer_get_step_info(ref, &ri));
    EXPECT_OK(&rec, mtopt_optimizer_get_step_info(inner, &di));
    EXPECT(&rec, di.loss_scale == ri.loss_scale, "%s, step %d: loss scale %g vs %g", c->name, s,
           (double)di.loss_scale, (double)ri.loss_scale);
    step_both(&t, d, ref, s, c->loss_scale ? ri.loss_scale : 1.0f,
              c->loss_scale && s == 1 ? 1 : -1, &rec); /* one overflow: a skipped step */
  }
  EXPECT_OK(&rec, mtopt_context_synchronize(ctx));
  static float a[MAXN], b[MAXN];
  for (int i = 0; i < t.n; i++) {
    const int64_t n = t.numel[i];
    mem_get_as(a, t.w[0][i], t.pdt[i], n);
    mem_get_as(b, t.w[1][i], t.pdt[i], n);
    const int64_t k = differs(a, b, n, t.pdt[i], tol, atol);
    EXPECT(&rec, k < 0,
           "%s, zero %d, clip %d, rank %d/%d: tensor %d (%d/%d) differs at %lld: %.9g vs %.9g",
           c->name, zero, clip, g_rank, g_world, i, t.pdt[i], t.gdt[i], (long long)k,
           k < 0 ? 0.0 : a[k], k < 0 ? 0.0 : b[k]);
    /* The steps moved the weights (a one-element tensor may come back). */
    EXPECT(&rec, n < 8 || tu_first_bit_diff(a, t.init[i], n) >= 0, "%s: tensor %d never moved",
           c->name, i);
  }
  if (!tol) same_state(&t, zero, c->kind, c->master, inner, ref, &rec);
  mtopt_step_info_t di = MTOPT_STEP_INFO_INIT, ri = MTOPT_STEP_INFO_INIT;
  EXPECT_OK(&rec, mtopt_optimizer_get_step_info(inner, &di));
  EXPECT_OK(&rec, mtopt_optimizer_get_step_info(ref, &ri));
  EXPECT(&rec, di.step == ri.step && di.skipped_steps == ri.skipped_steps &&
                   di.loss_scale == ri.loss_scale && di.step == STEPS - c->loss_scale,
         "%s: step %lld/%lld skipped %lld/%lld scale %g/%g", c->name, (long long)di.step,
         (long long)ri.step, (long long)di.skipped_steps, (long long)ri.skipped_steps,
         (double)di.loss_scale, (double)ri.loss_scale);
  if (clip)
    EXPECT(&rec, tol ? fabsf(di.last_grad_norm - ri.last_grad_norm) <= 1e-6f * ri.last_grad_norm
                     : di.last_grad_norm == ri.last_grad_norm,
           "%s: grad norm %.9g vs %.9g", c->name, (double)di.last_grad_norm,
           (double)ri.last_grad_norm);
  if (clip) EXPECT(&rec, ri.last_grad_norm > oc.max_grad_norm, "norm %g: no clipping",
                   (double)ri.last_grad_norm);
done:
  EXPECT_OK(&rec, mtopt_dist_optimizer_destroy(d));
  EXPECT_OK(&rec, mtopt_optimizer_destroy(ref));
  EXPECT_OK(&rec, mtopt_comm_destroy(comm));
  EXPECT_OK(&rec, mtopt_tensor_list_destroy(dl));
  EXPECT_OK(&rec, mtopt_tensor_list_destroy(rl));
  EXPECT_OK(&rec, mtopt_context_destroy(ctx));
  model_free(&t);
  REC_ASSERT(rec);
}
END_TEST

/* ---- sharded checkpoints ---- */

static void ck_path(char *out, const char *dir, const char *name) {
  snprintf(out, 256, "%s/%s", dir, name);
}

typedef struct {
  float w[NTM][MAXN];
} wsnap_t;

static void weights(const model_t *t, wsnap_t *sn) {
  for (int i = 0; i < t->n; i++) mem_get_as(sn->w[i], t->w[0][i], t->pdt[i], t->numel[i]);
}

/* The weights equal snapshot `sn` bit for bit (want 1) or differ (want 0),
 * and the step count is `step`. */
static void expect_weights(const model_t *t, mtopt_dist_optimizer_t *d, const wsnap_t *sn,
                           int want, int64_t step, const char *what, rec_t *rec) {
  static wsnap_t now;
  weights(t, &now);
  int same = 1;
  for (int i = 0; i < t->n; i++) same &= tu_first_bit_diff(now.w[i], sn->w[i], t->numel[i]) < 0;
  EXPECT(rec, same == want, "rank %d: %s: weights %s", g_rank, what,
         want ? "differ from the recorded ones" : "did not move");
  mtopt_optimizer_t *inner = NULL;
  mtopt_step_info_t si = MTOPT_STEP_INFO_INIT;
  EXPECT_OK(rec, mtopt_dist_optimizer_get_optimizer(d, &inner));
  if (inner) EXPECT_OK(rec, mtopt_optimizer_get_step_info(inner, &si));
  EXPECT(rec, si.step == step, "rank %d: %s: step %lld, expected %lld", g_rank, what,
         (long long)si.step, (long long)step);
}

/* A BF16 table's distributed optimizer: variant 0 F32 masters, 1 stochastic
 * rounding without masters and BF16 state. */
typedef struct {
  mtopt_context_t *ctx;
  mtopt_comm_t *comm;
  mtopt_tensor_list_t *list;
  mtopt_dist_optimizer_t *d;
  model_t t;
} bf16_run_t;

static void bf16_open(bf16_run_t *r, int zero, int variant, rec_t *rec) {
  static const int bf[1] = {BF16};
  r->ctx = test_context();
  model_init(&r->t, NTM, NULL, bf, bf, 1, 1, 0xc4e0u + (uint64_t)variant);
  const mtopt_comm_config_t cc = small_buckets(zero);
  EXPECT_OK(rec, mtopt_comm_create_mpi(r->ctx, MPI_COMM_WORLD, &cc, &r->comm));
  const mx_case_t *c = &mx_cases[variant ? 4 : 0];
  const mtopt_optimizer_config_t oc = mx_config(c, 0);
  r->list = model_list(r->ctx, &r->t, 0, -1, NULL, 0, rec);
  r->d = NULL;
  EXPECT_OK(rec, mtopt_dist_optimizer_create(r->comm, r->list, &oc, &r->d));
}

static void bf16_close(bf16_run_t *r, rec_t *rec) {
  EXPECT_OK(rec, mtopt_dist_optimizer_destroy(r->d));
  EXPECT_OK(rec, mtopt_comm_destroy(r->comm));
  EXPECT_OK(rec, mtopt_tensor_list_destroy(r->list));
  EXPECT_OK(rec, mtopt_context_destroy(r->ctx));
  model_free(&r->t);
}

/* Save after step 3, step twice more; load, step twice: the same bits.
 * Loop index: zero_stage _i % 2; variant _i / 2 (bf16_open). */
START_TEST(test_checkpoint) {
  const int zero = _i % 2;
  rec_t rec = {0};
  static bf16_run_t r;
  bf16_open(&r, zero, _i / 2, &rec);
  char dir[64], pa[256], pb[256], pc[256], f[320];
  dir_make(dir);
  EXPECT(&rec, dir[0], "no temporary directory");
  if (!r.d || !dir[0]) goto done; /* the same on every rank */
  ck_path(pa, dir, "a");
  ck_path(pb, dir, "b");
  ck_path(pc, dir, "c");
  static wsnap_t w3, w5;
  for (int s = 0; s < 3; s++) step_both(&r.t, r.d, NULL, s, 1.0f, -1, &rec);
  EXPECT_OK(&rec, mtopt_dist_optimizer_save(r.d, pa));
  MPI_Barrier(MPI_COMM_WORLD);
  /* zero_stage 0: rank 0 wrote the path alone; 1: each rank its shard. */
  ck_file(f, pa, zero, g_rank);
  EXPECT(&rec, access(f, R_OK) == 0, "rank %d: no file %s", g_rank, f);
  ck_file(f, pa, !zero, g_rank);
  EXPECT(&rec, access(f, F_OK) != 0, "rank %d: a file %s of the other stage", g_rank, f);
  weights(&r.t, &w3);
  for (int s = 3; s < 5; s++) step_both(&r.t, r.d, NULL, s, 1.0f, -1, &rec);
  weights(&r.t, &w5);
  expect_weights(&r.t, r.d, &w3, 0, 5, "two steps after the save", &rec);
  EXPECT_OK(&rec, mtopt_dist_optimizer_save(r.d, pb));
  EXPECT_OK(&rec, mtopt_dist_optimizer_load(r.d, pa));
  expect_weights(&r.t, r.d, &w3, 1, 3, "loaded", &rec);
  for (int s = 3; s < 5; s++) step_both(&r.t, r.d, NULL, s, 1.0f, -1, &rec);
  expect_weights(&r.t, r.d, &w5, 1, 5, "resumed", &rec);
  EXPECT_OK(&rec, mtopt_dist_optimizer_save(r.d, pc));
  MPI_Barrier(MPI_COMM_WORLD);
  same_files(pb, pc, zero, &rec); /* masters and state too */
done:
  dir_remove(dir);
  bf16_close(&r, &rec);
  REC_ASSERT(rec);
}
END_TEST

/* A load that must fail: the same status everywhere, nothing written. */
static void load_fails(bf16_run_t *r, const char *path, mtopt_status_t want, int culprit,
                       const char *what, rec_t *rec) {
  const mtopt_status_t st = mtopt_dist_optimizer_load(r->d, path);
  EXPECT(rec, st == want, "rank %d: %s: %s, expected %s (%s)", g_rank, what,
         mtopt_status_name(st), mtopt_status_name(want), mtopt_last_error());
  char name[32];
  snprintf(name, sizeof name, "rank %d", culprit);
  if (culprit >= 0 && culprit != g_rank)
    EXPECT(rec, strstr(mtopt_last_error(), name) != NULL, "rank %d: %s: message '%s' lacks '%s'",
           g_rank, what, mtopt_last_error(), name);
}

/* Loop index: zero_stage. */
START_TEST(test_checkpoint_bad) {
  const int zero = _i, victim = g_world - 1;
  rec_t rec = {0};
  static bf16_run_t r;
  bf16_open(&r, zero, 0, &rec);
  char dir[64], pa[256], pb[256], s1[256], s2[256], none[256], f[320], away[330];
  dir_make(dir);
  EXPECT(&rec, dir[0], "no temporary directory");
  if (!r.d || !dir[0]) goto done;
  ck_path(pa, dir, "a");
  ck_path(pb, dir, "b");
  ck_path(s1, dir, "s1");
  ck_path(s2, dir, "s2");
  ck_path(none, dir, "none");
  static wsnap_t w4, w5;
  for (int s = 0; s < 3; s++) step_both(&r.t, r.d, NULL, s, 1.0f, -1, &rec);
  EXPECT_OK(&rec, mtopt_dist_optimizer_save(r.d, pa));
  step_both(&r.t, r.d, NULL, 3, 1.0f, -1, &rec);
  EXPECT_OK(&rec, mtopt_dist_optimizer_save(r.d, pb));
  weights(&r.t, &w4);
  step_both(&r.t, r.d, NULL, 4, 1.0f, -1, &rec);
  weights(&r.t, &w5);
  EXPECT_OK(&rec, mtopt_dist_optimizer_save(r.d, s1));
  MPI_Barrier(MPI_COMM_WORLD);

  /* A missing file on one rank (zero_stage 0: a path of its own). */
  ck_file(f, pb, zero, g_rank);
  snprintf(away, sizeof away, "%s.away", f);
  if (zero && g_rank == victim) EXPECT(&rec, rename(f, away) == 0, "rename %s", f);
  MPI_Barrier(MPI_COMM_WORLD);
  load_fails(&r, !zero && g_rank == victim ? none : pb, MTOPT_STATUS_IO_ERROR, victim,
             "a missing file", &rec);
  expect_weights(&r.t, r.d, &w5, 1, 5, "after a failed load", &rec);
  MPI_Barrier(MPI_COMM_WORLD);
  if (zero && g_rank == victim) EXPECT(&rec, rename(away, f) == 0, "rename %s", away);
  MPI_Barrier(MPI_COMM_WORLD);

  /* A NULL path, on every rank or on one: refused on every rank (the
   * agreement carries one rank's failure to all), nothing written. */
  EXPECT_ST(&rec, mtopt_dist_optimizer_save(r.d, NULL), MTOPT_STATUS_INVALID_ARGUMENT);
  EXPECT_ST(&rec, mtopt_dist_optimizer_load(r.d, NULL), MTOPT_STATUS_INVALID_ARGUMENT);
  EXPECT_ST(&rec, mtopt_dist_optimizer_save(r.d, g_rank == victim ? NULL : s2),
            MTOPT_STATUS_INVALID_ARGUMENT);
  EXPECT_ST(&rec, mtopt_dist_optimizer_load(r.d, g_rank == victim ? NULL : pb),
            MTOPT_STATUS_INVALID_ARGUMENT);
  expect_weights(&r.t, r.d, &w5, 1, 5, "after a load with one NULL path", &rec);
  /* A NULL optimizer: refused here, before any collective. */
  EXPECT_ST(&rec, mtopt_dist_optimizer_save(NULL, pb), MTOPT_STATUS_INVALID_ARGUMENT);
  EXPECT_ST(&rec, mtopt_dist_optimizer_load(NULL, pb), MTOPT_STATUS_INVALID_ARGUMENT);
  /* Nothing of the state moved either: a save now is the save before. */
  EXPECT_OK(&rec, mtopt_dist_optimizer_save(r.d, s2));
  MPI_Barrier(MPI_COMM_WORLD);
  same_files(s1, s2, zero, &rec);
  /* The set was whole: it loads. */
  EXPECT_OK(&rec, mtopt_dist_optimizer_load(r.d, pb));
  expect_weights(&r.t, r.d, &w4, 1, 4, "loaded after the failures", &rec);

  /* Shards of different steps: rank 0's from the older save. */
  if (zero && g_world > 1) {
    step_both(&r.t, r.d, NULL, 4, 1.0f, -1, &rec);
    expect_weights(&r.t, r.d, &w5, 1, 5, "stepped again", &rec);
    MPI_Barrier(MPI_COMM_WORLD);
    if (g_rank == 0) {
      char src[320];
      long n = 0;
      ck_file(src, pa, zero, 0);
      ck_file(f, pb, zero, 0);
      char *bytes = slurp(src, &n);
      FILE *o = bytes ? fopen(f, "wb") : NULL;
      EXPECT(&rec, o && fwrite(bytes, 1, (size_t)n, o) == (size_t)n, "copy %s", src);
      if (o) fclose(o);
      free(bytes);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    load_fails(&r, pb, MTOPT_STATUS_INVALID_ARGUMENT, -1, "shards of two steps", &rec);
    EXPECT(&rec, strstr(mtopt_last_error(), "different steps") != NULL, "message: %s",
           mtopt_last_error());
    expect_weights(&r.t, r.d, &w5, 1, 5, "after loading shards of two steps", &rec);
    EXPECT_OK(&rec, mtopt_dist_optimizer_save(r.d, s2));
    MPI_Barrier(MPI_COMM_WORLD);
    same_files(s1, s2, zero, &rec);
  }
done:
  dir_remove(dir);
  bf16_close(&r, &rec);
  REC_ASSERT(rec);
}
END_TEST

/* ---- memory ---- */

/* ZeRO-1 keeps about 1/world of plain data parallel's state and masters:
 * each rank's slice of a bucket is ceil(elements / world) rounded up to 8,
 * tensors in it start at their weights' residue (under 8 elements of gap
 * each), and each inner array starts 16-byte aligned (under 16 bytes, three
 * arrays); 12 bytes per element at most (two fp32 moments, an fp32 master). */
START_TEST(test_memory) {
  static const int pd[2] = {BF16, F32}, gd[2] = {BF16, BF16};
  static const int64_t numel[NTM] = {1,   1001, 999,  1023, 0,    1017,
                                     995, 1021, 1013, 1003, 1019, 1007};
  rec_t rec = {0};
  mtopt_context_t *ctx = test_context();
  static model_t t;
  model_init(&t, NTM, numel, pd, gd, 2, 1, 0x3e30u);
  mtopt_optimizer_config_t oc = mx_config(&mx_cases[0], 0);
  mtopt_dist_memory_t m[2];
  int64_t total = 0, want = 0, f32_numel = 0;
  for (int i = 0; i < t.n; i++) {
    total += t.numel[i];
    want += t.numel[i] * (t.pdt[i] == F32 ? 8 : 12);
    f32_numel += t.pdt[i] == F32 ? t.numel[i] : 0;
  }
  int nb[2] = {0, 0};
  for (int zero = 0; zero < 2; zero++) {
    mtopt_comm_config_t cc = MTOPT_COMM_CONFIG_INIT; /* one bucket per class */
    cc.zero_stage = zero;
    mtopt_comm_t *comm = NULL;
    mtopt_tensor_list_t *l = model_list(ctx, &t, zero, -1, NULL, 0, &rec);
    mtopt_dist_optimizer_t *d = NULL;
    EXPECT_OK(&rec, mtopt_comm_create_mpi(ctx, MPI_COMM_WORLD, &cc, &comm));
    EXPECT_OK(&rec, mtopt_dist_optimizer_create(comm, l, &oc, &d));
    mtopt_dist_memory_t x = {sizeof x, -7, -7, -7, -7};
    m[zero] = x;
    if (d) {
      EXPECT_OK(&rec, mtopt_dist_optimizer_get_memory(d, &m[zero]));
      EXPECT_OK(&rec, mtopt_dist_get_bucket_count(d, &nb[zero]));
      int64_t grads = 0;
      for (int dt = 0; dt < 3; dt++) {
        void *p = NULL;
        int64_t n = -1;
        EXPECT_OK(&rec, mtopt_dist_optimizer_get_grad_buffer_dtype(d, (mtopt_dtype_t)dt, &p, &n));
        grads += n * (int64_t)esz(dt);
      }
      EXPECT(&rec, m[zero].grad_bytes == grads && grads >= 2 * total,
             "zero %d: grad_bytes %lld, buffers %lld", zero, (long long)m[zero].grad_bytes,
             (long long)grads);
      /* Bad arguments change nothing. */
      EXPECT_ST(&rec, mtopt_dist_optimizer_get_memory(d, NULL), MTOPT_STATUS_INVALID_ARGUMENT);
      x.struct_size = 0;
      EXPECT_ST(&rec, mtopt_dist_optimizer_get_memory(d, &x), MTOPT_STATUS_INVALID_ARGUMENT);
      x.struct_size = sizeof x - 1;
      EXPECT_ST(&rec, mtopt_dist_optimizer_get_memory(d, &x), MTOPT_STATUS_INVALID_ARGUMENT);
      EXPECT(&rec, x.params == -7 && x.state_bytes == -7, "a refused call wrote the struct");
    }
    EXPECT_ST(&rec, mtopt_dist_optimizer_get_memory(NULL, &x), MTOPT_STATUS_INVALID_ARGUMENT);
    EXPECT_OK(&rec, mtopt_dist_optimizer_destroy(d));
    EXPECT_OK(&rec, mtopt_comm_destroy(comm));
    EXPECT_OK(&rec, mtopt_tensor_list_destroy(l));
  }
  EXPECT(&rec, m[0].params == total && m[1].params == total, "params %lld, %lld of %lld",
         (long long)m[0].params, (long long)m[1].params, (long long)total);
  EXPECT(&rec, m[0].state_bytes >= want && m[0].state_bytes <= want + 48 * t.n,
         "zero 0: state %lld bytes for %lld", (long long)m[0].state_bytes, (long long)want);
  const int64_t W = g_world, slack = 12 * (nb[1] * 8 * W + 8 * t.n) + 48 * (2 * t.n + nb[1]);
  EXPECT(&rec, llabs(m[1].state_bytes * W - m[0].state_bytes) <= slack * W,
         "zero 1, %d ranks: state %lld bytes, zero 0 %lld (slack %lld)", g_world,
         (long long)m[1].state_bytes, (long long)m[0].state_bytes, (long long)slack);
  int64_t sum = 0;
  MPI_Allreduce(&m[1].state_bytes, &sum, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT(&rec, llabs(sum - want) <= 48 * (t.n + nb[1]) * W, "zero 1: %lld bytes over ranks, %lld",
         (long long)sum, (long long)want);
  /* The shard: this rank's slices of the bf16 gradients; the f32 weights
   * staged whole for their all-gather. */
  EXPECT(&rec, m[0].shard_bytes == 0, "zero 0: shard %lld", (long long)m[0].shard_bytes);
  EXPECT(&rec, m[1].shard_bytes >= 2 * total / W + 4 * f32_numel &&
                   m[1].shard_bytes <= 2 * total / W + 4 * f32_numel + slack,
         "zero 1: shard %lld bytes", (long long)m[1].shard_bytes);
  EXPECT_OK(&rec, mtopt_context_destroy(ctx));
  model_free(&t);
  REC_ASSERT(rec);
}
END_TEST

/* ---- bad inputs (identical on every rank, before any collective) ---- */

START_TEST(test_bad_inputs) {
  static const int pd[2] = {F32, BF16};
  rec_t rec = {0};
  mtopt_context_t *ctx = test_context();
  static model_t t;
  model_init(&t, NTM, NULL, pd, pd, 2, 1, 0xbadu);
  mtopt_optimizer_config_t oc = mx_config(&mx_cases[0], 0);
  mtopt_comm_config_t cc = small_buckets(0);
  mtopt_comm_t *comm = NULL, *comm1 = NULL;
  mtopt_tensor_list_t *l = model_list(ctx, &t, 0, -1, NULL, 0, &rec);
  mtopt_tensor_list_t *l1 = model_list(ctx, &t, 1, -1, NULL, 0, &rec);
  mtopt_dist_optimizer_t *d = NULL, *d1 = NULL;
  EXPECT_OK(&rec, mtopt_comm_create_mpi(ctx, MPI_COMM_WORLD, &cc, &comm));
  EXPECT_OK(&rec, mtopt_dist_optimizer_create(comm, l, &oc, &d));
  if (d) {
    void *p = &rec;
    int64_t n = -3;
    int nb = 0;
    EXPECT_ST(&rec, mtopt_dist_optimizer_get_grad_buffer(d, &p, &n), MTOPT_STATUS_INVALID_USAGE);
    EXPECT(&rec, p == &rec && n == -3, "a refused call wrote its outputs");
    EXPECT_ST(&rec, mtopt_dist_optimizer_get_grad_buffer_dtype(d, (mtopt_dtype_t)7, &p, &n),
              MTOPT_STATUS_INVALID_ARGUMENT);
    EXPECT_ST(&rec, mtopt_dist_optimizer_get_grad_buffer_dtype(d, MTOPT_DTYPE_U16, &p, &n),
              MTOPT_STATUS_INVALID_ARGUMENT);
    EXPECT_ST(&rec, mtopt_dist_optimizer_get_grad_buffer_dtype(d, MTOPT_DTYPE_BF16, NULL, &n),
              MTOPT_STATUS_INVALID_ARGUMENT);
    EXPECT(&rec, p == &rec && n == -3, "a refused call wrote its outputs");
    EXPECT_OK(&rec, mtopt_dist_optimizer_get_grad_buffer_dtype(d, MTOPT_DTYPE_F16, &p, &n));
    EXPECT(&rec, p == NULL && n == 0, "no f16 gradients, yet %p, %lld", p, (long long)n);
    EXPECT_OK(&rec, mtopt_dist_get_bucket_count(d, &nb));
    mtopt_dtype_t g = 9, q = 9;
    EXPECT_ST(&rec, mtopt_dist_get_bucket_dtype(d, nb, &g, &q), MTOPT_STATUS_INVALID_ARGUMENT);
    EXPECT_ST(&rec, mtopt_dist_get_bucket_dtype(d, -1, &g, &q), MTOPT_STATUS_INVALID_ARGUMENT);
    EXPECT_ST(&rec, mtopt_dist_get_bucket_dtype(NULL, 0, &g, &q), MTOPT_STATUS_INVALID_ARGUMENT);
    EXPECT(&rec, g == 9 && q == 9, "a refused call wrote its outputs");
    EXPECT_OK(&rec, mtopt_dist_get_bucket_dtype(d, 0, NULL, NULL));
  }
  /* LAMB with ZeRO-1: still refused (on every rank, before a collective). */
  cc.zero_stage = 1;
  oc.kind = MTOPT_OPTIMIZER_LAMB;
  EXPECT_OK(&rec, mtopt_comm_create_mpi(ctx, MPI_COMM_WORLD, &cc, &comm1));
  EXPECT_ST(&rec, mtopt_dist_optimizer_create(comm1, l1, &oc, &d1), MTOPT_STATUS_NOT_SUPPORTED);
  EXPECT(&rec, d1 == NULL, "a failed create wrote *out");
  EXPECT_OK(&rec, mtopt_dist_optimizer_destroy(d));
  EXPECT_OK(&rec, mtopt_comm_destroy(comm));
  EXPECT_OK(&rec, mtopt_comm_destroy(comm1));
  EXPECT_OK(&rec, mtopt_tensor_list_destroy(l));
  EXPECT_OK(&rec, mtopt_tensor_list_destroy(l1));
  EXPECT_OK(&rec, mtopt_context_destroy(ctx));
  model_free(&t);
  REC_ASSERT(rec);
}
END_TEST

Suite *dist_mixed_suite(void) {
  Suite *s = suite_create("dist_mixed");
  TCase *tc = tcase_create("dist_mixed");
  tcase_set_timeout(tc, 120); /* per test; CK_NOFORK: ctest's TIMEOUT bounds the run */
  tcase_add_test(tc, test_bad_inputs);
  tcase_add_test(tc, test_memory);
  tcase_add_loop_test(tc, test_equivalence, 0, 4 * N_MX);
  tcase_add_loop_test(tc, test_checkpoint, 0, 4);
  tcase_add_loop_test(tc, test_checkpoint_bad, 0, 2);
  suite_add_tcase(s, tc);
  return s;
}

int main(int argc, char **argv) { return dist_main(argc, argv, "dist_mixed", dist_mixed_suite); }

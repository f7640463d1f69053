/* The fp32 reduction of 16-bit gradient buckets (mtopt_comm_config_t
 * reduce_f32) under mpirun, on the rig of dist_rig.h (the CPU backend at
 * -np 1, 2 and 3; CUDA with --backend cuda): BF16 and F16 gradients and a
 * mixed table with F32 ones, at zero_stage 0 and 1, with and without
 * clipping, against one process; its accuracy against 16-bit reduction;
 * memory; sharded checkpoints; bad configs and ranks that disagree; and,
 * without it, F16 buckets whose sum over ranks leaves F16's range.
 *
 * The oracle: one process stepping the plain optimizer, with F32 gradients,
 * on the fp32 average: the ranks' gradients summed in rank order, times
 * (float)(1/world). The gradients are random values of their dtype, fresh
 * per step, rank and tensor, never zero, of magnitude in [2^-8, 1) with at
 * most 11 significant bits: a sum over up to 32 ranks spans under 24 bits,
 * so it is exact in fp32 in whatever order MPI (or NCCL) adds, while a 16-bit
 * sum of the same values rounds. So weights, masters and state must equal
 * the oracle's bit for bit at every world size, except where the norm is
 * summed over other chunks (ZeRO-1 with clipping: two ulps of the dtype, the
 * norm to 1e-6) or NCCL's ncclAvg premultiplies inexactly (CUDA at a world
 * that is not a power of two: to 1e-5 of an f32, two ulps of a 16-bit
 * dtype). The oracle orders its chunks as the inner optimizer does, so that
 * zero_stage 0's norm is summed in the same order. */
#include <mpi.h>

#include <check.h>
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "core/internal_api.h"
#include "dist/dist_internal.h"
#include "dist_rig.h"

enum { NTM = DR_MAXT, MAXN = DR_MAXN, STEPS = 4, INF_STEP = 2, INF_TENSOR = 1 };
#define F32 MTOPT__DT_F32
#define F16 MTOPT__DT_F16
#define BF16 MTOPT__DT_BF16

/* Rank q's gradient of tensor t at step s, as values of dtype dt (F32: with
 * F16's 11 bits): +-(1 + k / 2^bits) * 2^e, e in [-8, -1]. */
static void grad16(int s, int q, int t, int dt, int64_t n, float *g) {
  tu_rng_t r;
  tu_rng_init(&r, g_seed ^ (0x9d2c5680u + 1000003u * (uint64_t)s + 7919u * (uint64_t)q +
                            31u * (uint64_t)t));
  const int bits = dt == BF16 ? 7 : 10;
  for (int64_t i = 0; i < n; i++) {
    const float k = (float)tu_int(&r, 0, (1 << bits) - 1);
    const float v = ldexpf(1.0f + k / (float)(1 << bits), (int)tu_int(&r, -8, -1));
    g[i] = (tu_next(&r) & 1) ? v : -v;
  }
}

/* Step s's gradients (grad16): this rank's into d's views, the fp32 average
 * into ref's F32 views (ref may be NULL); inf_tensor >= 0: its element 0 is
 * +inf on the last rank, so in the average. */
static void write_f32avg(const model_t *m, mtopt_dist_optimizer_t *d, mtopt_optimizer_t *ref,
                         int s, int inf_tensor, rec_t *rec) {
  write_grads_of(m, d, ref, s, 1.0f, inf_tensor, grad16, 1, rec);
}

static mtopt_comm_config_t f32_buckets(int zero) {
  mtopt_comm_config_t c = small_buckets(zero);
  c.reduce_f32 = 1;
  return c;
}

/* A communicator, a list of side k and the distributed optimizer on it. */
typedef struct {
  mtopt_comm_t *comm;
  mtopt_tensor_list_t *list;
  mtopt_dist_optimizer_t *d;
} run_t;

static void run_open(run_t *r, mtopt_context_t *ctx, const model_t *t, int k,
                     const mtopt_comm_config_t *cc, const mtopt_optimizer_config_t *oc,
                     rec_t *rec) {
  memset(r, 0, sizeof *r);
  EXPECT_OK(rec, mtopt_comm_create_mpi(ctx, MPI_COMM_WORLD, cc, &r->comm));
  r->list = model_list(ctx, t, k, -1, NULL, 0, rec);
  if (r->comm && r->list) EXPECT_OK(rec, mtopt_dist_optimizer_create(r->comm, r->list, oc, &r->d));
}

static void run_close(run_t *r, rec_t *rec) {
  EXPECT_OK(rec, mtopt_dist_optimizer_destroy(r->d));
  EXPECT_OK(rec, mtopt_comm_destroy(r->comm));
  EXPECT_OK(rec, mtopt_tensor_list_destroy(r->list));
}

/* ---- equivalence with one process ---- */
typedef struct {
  const char *name;
  int pdt[4], gdt[4], ncls; /* tensor i: class i % ncls */
  mtopt_optimizer_kind_t kind;
} rf_case_t;

static const rf_case_t rf_cases[] = {
    {"bf16", {BF16}, {BF16}, 1, MTOPT_OPTIMIZER_ADAMW},
    {"f16", {F16}, {F16}, 1, MTOPT_OPTIMIZER_ADAMW},
    {"mixed table, sgd", {BF16, F32, F32, F16}, {BF16, F32, BF16, F16}, 4, MTOPT_OPTIMIZER_SGD},
};
#define N_RF ((int)(sizeof rf_cases / sizeof rf_cases[0]))

static mtopt_optimizer_config_t rf_config(mtopt_optimizer_kind_t kind, int clip) {
  mtopt_optimizer_config_t oc = MTOPT_OPTIMIZER_CONFIG_INIT;
  oc.kind = kind;
  oc.chunk_size = 64;
  oc.lr = 1e-2f;
  oc.weight_decay = 0.05f;
  if (kind == MTOPT_OPTIMIZER_SGD) {
    oc.momentum = 0.9f;
    oc.nesterov = 1;
    oc.lr = 0.05f;
  }
  oc.max_grad_norm = clip ? 2.0f : 0.0f; /* the averaged gradient's norm is about 10 */
  oc.skip_nonfinite = 1;
  oc.master_weights = MTOPT_MASTER_F32;
  return oc;
}

/* The inner optimizer steps F32 gradients only, while the buckets and the
 * buffers the user writes keep the list's 16-bit dtypes. */
static void check_dtypes(const model_t *t, mtopt_dist_optimizer_t *d, mtopt_optimizer_t *inner,
                         rec_t *rec) {
  mtopt_optimizer_info_t info = MTOPT_OPTIMIZER_INFO_INIT;
  EXPECT_OK(rec, mtopt_optimizer_get_info(inner, &info));
  for (int64_t p = 0; p < info.num_tensors; p++)
    EXPECT(rec, mtopt__optimizer_tensor(inner, p)->gdt == F32,
           "inner tensor %lld steps a gradient of dtype %d", (long long)p,
           (int)mtopt__optimizer_tensor(inner, p)->gdt);
  for (int i = 0; i < t->n; i++) {
    int b = -1;
    mtopt_dtype_t g = 9;
    void *buf = NULL;
    int64_t n = 0;
    EXPECT_OK(rec, mtopt_dist_get_tensor_bucket(d, i, &b));
    EXPECT_OK(rec, mtopt_dist_get_bucket_dtype(d, b, &g, NULL));
    EXPECT_OK(rec, mtopt_dist_optimizer_get_grad_buffer_dtype(d, (mtopt_dtype_t)t->gdt[i], &buf,
                                                              &n));
    EXPECT(rec, (int)g == t->gdt[i] && buf && n >= t->numel[i],
           "tensor %d (grad dtype %d): bucket of dtype %d, buffer %p of %lld", i, t->gdt[i],
           (int)g, buf, (long long)n);
  }
}

/* Loop index: case _i / 4; zero_stage _i % 2; clipping (_i / 2) % 2. */
START_TEST(test_equivalence) {
  const rf_case_t *c = &rf_cases[_i / 4];
  const int zero = _i % 2, clip = (_i / 2) % 2;
  rec_t rec = {0};
  mtopt_context_t *ctx = test_context();
  static model_t t, tr; /* tr: t with F32 gradients, the oracle's list */
  model_init(&t, NTM, NULL, c->pdt, c->gdt, c->ncls, 1, 0x7ed0u + (uint64_t)_i);
  tr = t;
  for (int i = 0; i < t.n; i++) tr.gdt[i] = F32;
  const mtopt_comm_config_t cc = f32_buckets(zero);
  const mtopt_optimizer_config_t oc = rf_config(c->kind, clip);
  run_t r;
  run_open(&r, ctx, &t, 0, &cc, &oc, &rec);
  mtopt_tensor_list_t *rl = model_list(ctx, &tr, 1, -1, NULL, 0, &rec);
  mtopt_optimizer_t *ref = NULL, *inner = NULL;
  if (r.d && rl) {
    const mtopt__optimizer_options_t order = {.order = zero ? NULL : r.d->lay.order,
                                              .keep_tensors = 1};
    EXPECT_OK(&rec, mtopt__optimizer_create(ctx, rl, &oc, &order, &ref));
  }
  if (!r.d || !ref) goto done; /* the same on every rank: create agrees */
  EXPECT_OK(&rec, mtopt_dist_optimizer_get_optimizer(r.d, &inner));
  check_dtypes(&t, r.d, inner, &rec);
  for (int s = 0; s < STEPS; s++) {
    write_f32avg(&t, r.d, ref, s, s == INF_STEP ? INF_TENSOR : -1, &rec);
    step_written(r.d, ref, s, &rec);
  }
  EXPECT_OK(&rec, mtopt_context_synchronize(ctx));
  const int tol = (zero && clip) || !average_is_exact();
  static float a[MAXN], b[MAXN];
  for (int i = 0; i < t.n; i++) {
    const int64_t n = t.numel[i];
    mem_get_as(a, t.w[0][i], t.pdt[i], n);
    mem_get_as(b, t.w[1][i], t.pdt[i], n);
    const int64_t k = differs(a, b, n, t.pdt[i], tol, tol ? 1e-6 : 0.0);
    EXPECT(&rec, k < 0, "%s, zero %d, clip %d, rank %d/%d: tensor %d (%d/%d) differs at %lld: "
           "%.9g vs %.9g", c->name, zero, clip, g_rank, g_world, i, t.pdt[i], t.gdt[i],
           (long long)k, k < 0 ? 0.0 : a[k], k < 0 ? 0.0 : b[k]);
    EXPECT(&rec, n < 8 || tu_first_bit_diff(a, t.init[i], n) >= 0, "%s: tensor %d never moved",
           c->name, i);
  }
  if (!tol) same_state(&t, zero, c->kind, MTOPT_MASTER_F32, inner, ref, &rec);
  mtopt_step_info_t di = MTOPT_STEP_INFO_INIT, ri = MTOPT_STEP_INFO_INIT;
  EXPECT_OK(&rec, mtopt_optimizer_get_step_info(inner, &di));
  EXPECT_OK(&rec, mtopt_optimizer_get_step_info(ref, &ri));
  /* The inf on one rank skipped step INF_STEP on every rank. */
  EXPECT(&rec, di.step == STEPS - 1 && ri.step == STEPS - 1 && di.skipped_steps == 1 &&
                   ri.skipped_steps == 1,
         "%s: step %lld/%lld, skipped %lld/%lld", c->name, (long long)di.step,
         (long long)ri.step, (long long)di.skipped_steps, (long long)ri.skipped_steps);
  if (clip) {
    EXPECT(&rec, tol ? fabsf(di.last_grad_norm - ri.last_grad_norm) <= 1e-6f * ri.last_grad_norm
                     : di.last_grad_norm == ri.last_grad_norm,
           "%s: grad norm %.9g vs %.9g", c->name, (double)di.last_grad_norm,
           (double)ri.last_grad_norm);
    EXPECT(&rec, ri.last_grad_norm > oc.max_grad_norm, "norm %g: no clipping",
           (double)ri.last_grad_norm);
  }
done:
  run_close(&r, &rec);
  EXPECT_OK(&rec, mtopt_optimizer_destroy(ref));
  EXPECT_OK(&rec, mtopt_tensor_list_destroy(rl));
  EXPECT_OK(&rec, mtopt_context_destroy(ctx));
  model_free(&t);
  REC_ASSERT(rec);
}
END_TEST

/* ---- closer to the exact average than a 16-bit reduction ----
 * F32 weights at zero with BF16 and F16 gradients, one SGD step of lr 1:
 * the weights become minus the averaged gradient the step read, exactly.
 * With reduce_f32 each is the fp64 average to fp32 rounding (of the product
 * by (float)(1/world); premultiplied, of each rank's share); at one rank
 * both runs are the same bits; at two or more the 16-bit sums round, so
 * their total error over each dtype's elements is larger. Loop index:
 * zero_stage. */
START_TEST(test_closer) {
  static const int pd[2] = {F32, F32}, gd[2] = {BF16, F16};
  const int zero = _i;
  rec_t rec = {0};
  mtopt_context_t *ctx = test_context();
  static model_t t;
  static float zeros[MAXN], w[2][MAXN], tmp[MAXN];
  static double avg[MAXN], mag[MAXN];
  model_init(&t, NTM, NULL, pd, gd, 2, 1, 0xc105u + (uint64_t)_i);
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < t.n; i++) mem_put_as(t.w[k][i], F32, zeros, t.numel[i]);
  mtopt_optimizer_config_t oc = MTOPT_OPTIMIZER_CONFIG_INIT;
  oc.kind = MTOPT_OPTIMIZER_SGD;
  oc.lr = 1.0f;
  oc.chunk_size = 64;
  run_t r[2]; /* reduce_f32 0 on side 0, 1 on side 1 */
  for (int k = 0; k < 2; k++) {
    mtopt_comm_config_t cc = small_buckets(zero);
    cc.reduce_f32 = k;
    run_open(&r[k], ctx, &t, k, &cc, &oc, &rec);
  }
  if (!r[0].d || !r[1].d) goto done;
  for (int k = 0; k < 2; k++) {
    write_f32avg(&t, r[k].d, NULL, 0, -1, &rec);
    step_written(r[k].d, NULL, 0, &rec);
  }
  EXPECT_OK(&rec, mtopt_context_synchronize(ctx));
  double err[2][2] = {{0, 0}, {0, 0}}; /* [reduce_f32][class] */
  for (int i = 0; i < t.n; i++) {
    const int64_t n = t.numel[i];
    for (int64_t e = 0; e < n; e++) avg[e] = mag[e] = 0.0;
    for (int q = 0; q < g_world; q++) {
      grad16(0, q, i, t.gdt[i], n, tmp);
      for (int64_t e = 0; e < n; e++) { /* exact sums, one division */
        avg[e] += (double)tmp[e];
        mag[e] += fabs((double)tmp[e]);
      }
    }
    for (int k = 0; k < 2; k++) mem_get_as(w[k], t.w[k][i], F32, n);
    const double lr = i == 5 || i == 6 ? 0.5 : 1.0; /* group 1's lr (model_list), exact */
    for (int64_t e = 0; e < n; e++) avg[e] *= lr / g_world, mag[e] *= lr / g_world;
    for (int64_t e = 0; e < n; e++) {
      for (int k = 0; k < 2; k++) err[k][i % 2] += fabs((double)w[k][e] + avg[e]);
      /* Premultiplied (ncclAvg), each rank's share rounds on its own. */
      const double bound = (average_is_exact() ? fabs(avg[e]) : g_world * mag[e]) * 0x1p-22;
      EXPECT(&rec, fabs((double)w[1][e] + avg[e]) <= bound,
             "zero %d, rank %d/%d: tensor %d element %lld: %.9g, the fp64 average %.12g", zero,
             g_rank, g_world, i, (long long)e, (double)-w[1][e], avg[e]);
    }
    if (g_world == 1)
      EXPECT(&rec, tu_first_bit_diff(w[0], w[1], n) < 0,
             "one rank: tensor %d differs between the 16-bit and the fp32 reduction", i);
  }
  for (int c = 0; c < 2 && g_world > 1; c++)
    EXPECT(&rec, err[1][c] < err[0][c],
           "zero %d, %d ranks, %s: total error %.6g in fp32, %.6g in 16 bits", zero, g_world,
           c ? "f16" : "bf16", err[1][c], err[0][c]);
done:
  for (int k = 0; k < 2; k++) run_close(&r[k], &rec);
  EXPECT_OK(&rec, mtopt_context_destroy(ctx));
  model_free(&t);
  REC_ASSERT(rec);
}
END_TEST

/* ---- memory: the fp32 copies in grad_bytes, fp32 slices in shard_bytes,
 * the state unchanged ---- */
START_TEST(test_memory) {
  static const int pd[3] = {BF16, F32, F32}, gd[3] = {BF16, F16, F32};
  rec_t rec = {0};
  mtopt_context_t *ctx = test_context();
  static model_t t;
  model_init(&t, NTM, NULL, pd, gd, 3, 1, 0x3e31u);
  const mtopt_optimizer_config_t oc = rf_config(MTOPT_OPTIMIZER_ADAMW, 0);
  for (int zero = 0; zero < 2; zero++) {
    mtopt_dist_memory_t m[2] = {MTOPT_DIST_MEMORY_INIT, MTOPT_DIST_MEMORY_INIT};
    int64_t slices16 = 0; /* reduce_f32: elements of this rank's 16-bit slices */
    for (int k = 0; k < 2; k++) {
      mtopt_comm_config_t cc = small_buckets(zero);
      cc.reduce_f32 = k;
      run_t r;
      run_open(&r, ctx, &t, 0, &cc, &oc, &rec);
      if (r.d) {
        EXPECT_OK(&rec, mtopt_dist_optimizer_get_memory(r.d, &m[k]));
        int64_t grads = 0, n16 = 0, bn = 0;
        for (int dt = 0; dt < 3; dt++) {
          void *p = NULL;
          int64_t n = 0;
          EXPECT_OK(&rec, mtopt_dist_optimizer_get_grad_buffer_dtype(r.d, (mtopt_dtype_t)dt, &p,
                                                                    &n));
          grads += n * mtopt__dt_size(dt);
          if (dt != F32) n16 += n;
        }
        EXPECT(&rec, m[k].grad_bytes == grads + (k ? 4 * n16 : 0),
               "zero %d, reduce_f32 %d: grad_bytes %lld, buffers %lld, 16-bit elements %lld",
               zero, k, (long long)m[k].grad_bytes, (long long)grads, (long long)n16);
        int count = 0;
        EXPECT_OK(&rec, mtopt_dist_get_bucket_count(r.d, &count));
        for (int b = 0; b < count && k && zero; b++) {
          mtopt_dtype_t g = F32;
          EXPECT_OK(&rec, mtopt_dist_get_bucket(r.d, b, NULL, NULL, NULL, &bn));
          EXPECT_OK(&rec, mtopt_dist_get_bucket_dtype(r.d, b, &g, NULL));
          if (g != MTOPT_DTYPE_F32) slices16 += bn / g_world;
        }
      }
      run_close(&r, &rec);
    }
    EXPECT(&rec, m[1].state_bytes == m[0].state_bytes && m[1].params == m[0].params,
           "zero %d: state %lld vs %lld bytes", zero, (long long)m[1].state_bytes,
           (long long)m[0].state_bytes);
    EXPECT(&rec, m[1].shard_bytes == m[0].shard_bytes + 2 * slices16,
           "zero %d: shard %lld bytes in fp32, %lld in 16 bits, 16-bit slices of %lld", zero,
           (long long)m[1].shard_bytes, (long long)m[0].shard_bytes, (long long)slices16);
  }
  EXPECT_OK(&rec, mtopt_context_destroy(ctx));
  model_free(&t);
  REC_ASSERT(rec);
}
END_TEST

/* ---- sharded checkpoints: the state is the same ----
 * BF16 weights with F32 masters, reduce_f32: save after step 2, two steps,
 * load, two steps: the same weights and a second save byte for byte. The
 * checkpoint also loads into a 16-bit reduction's optimizer (side 1, laid
 * out alike: skew 0), which then saves the same bytes. Loop index:
 * zero_stage. */
START_TEST(test_checkpoint) {
  static const int bf[1] = {BF16};
  const int zero = _i;
  rec_t rec = {0};
  mtopt_context_t *ctx = test_context();
  static model_t t;
  static float w2[NTM][MAXN], w4[NTM][MAXN], now[MAXN];
  model_init(&t, NTM, NULL, bf, bf, 1, 0, 0xc4e1u + (uint64_t)_i);
  const mtopt_optimizer_config_t oc = rf_config(MTOPT_OPTIMIZER_ADAMW, 0);
  mtopt_comm_config_t cc = f32_buckets(zero);
  run_t r, r16;
  run_open(&r, ctx, &t, 0, &cc, &oc, &rec);
  cc.reduce_f32 = 0;
  run_open(&r16, ctx, &t, 1, &cc, &oc, &rec);
  char dir[64], pa[256], pb[256], pc[256], pd[256];
  dir_make(dir);
  EXPECT(&rec, dir[0], "no temporary directory");
  if (!r.d || !r16.d || !dir[0]) goto done; /* the same on every rank */
  snprintf(pa, sizeof pa, "%s/a", dir);
  snprintf(pb, sizeof pb, "%s/b", dir);
  snprintf(pc, sizeof pc, "%s/c", dir);
  snprintf(pd, sizeof pd, "%s/d", dir);
  for (int s = 0; s < 4; s++) {
    if (s == 2) EXPECT_OK(&rec, mtopt_dist_optimizer_save(r.d, pa));
    for (int i = 0; i < t.n && s == 2; i++) mem_get_as(w2[i], t.w[0][i], BF16, t.numel[i]);
    write_f32avg(&t, r.d, NULL, s, -1, &rec);
    step_written(r.d, NULL, s, &rec);
  }
  for (int i = 0; i < t.n; i++) mem_get_as(w4[i], t.w[0][i], BF16, t.numel[i]);
  EXPECT_OK(&rec, mtopt_dist_optimizer_save(r.d, pb));
  EXPECT_OK(&rec, mtopt_dist_optimizer_load(r.d, pa));
  for (int s = 2; s < 4; s++) {
    write_f32avg(&t, r.d, NULL, s, -1, &rec);
    step_written(r.d, NULL, s, &rec);
  }
  EXPECT_OK(&rec, mtopt_dist_optimizer_save(r.d, pc));
  EXPECT_OK(&rec, mtopt_dist_optimizer_load(r16.d, pa));
  EXPECT_OK(&rec, mtopt_dist_optimizer_save(r16.d, pd));
  MPI_Barrier(MPI_COMM_WORLD);
  same_files(pb, pc, zero, &rec);
  same_files(pa, pd, zero, &rec);
  for (int i = 0; i < t.n; i++) {
    mem_get_as(now, t.w[0][i], BF16, t.numel[i]);
    EXPECT(&rec, tu_first_bit_diff(now, w4[i], t.numel[i]) < 0,
           "rank %d: tensor %d: the resumed run differs", g_rank, i);
    mem_get_as(now, t.w[1][i], BF16, t.numel[i]);
    EXPECT(&rec, tu_first_bit_diff(now, w2[i], t.numel[i]) < 0,
           "rank %d: tensor %d: loaded with reduce_f32 0, not the saved weights", g_rank, i);
  }
done:
  dir_remove(dir);
  run_close(&r, &rec);
  run_close(&r16, &rec);
  EXPECT_OK(&rec, mtopt_context_destroy(ctx));
  model_free(&t);
  REC_ASSERT(rec);
}
END_TEST

/* ---- bad configs, an older caller's struct, ranks that disagree ---- */
START_TEST(test_bad_inputs) {
  static const int pd[2] = {F32, BF16};
  rec_t rec = {0};
  mtopt_context_t *ctx = test_context();
  static model_t t;
  model_init(&t, NTM, NULL, pd, pd, 2, 1, 0xbad1u);
  const mtopt_optimizer_config_t oc = rf_config(MTOPT_OPTIMIZER_ADAMW, 0);
  mtopt_comm_t *comm = NULL;
  mtopt_comm_config_t cc = f32_buckets(0);
  int dummy = 0;
  static const int bad[] = {2, -1, 1 << 30};
  for (int j = 0; j < 3; j++) {
    cc.reduce_f32 = bad[j];
    EXPECT_ST(&rec, mtopt_comm_create_mpi(ctx, MPI_COMM_WORLD, &cc, &comm),
              MTOPT_STATUS_INVALID_ARGUMENT);
    EXPECT(&rec, strstr(mtopt_last_error(), "reduce_f32") != NULL, "message: %s",
           mtopt_last_error());
    /* The config is read before the NCCL communicator is looked at. */
    EXPECT_ST(&rec, mtopt_comm_create_nccl(ctx, &dummy, &cc, &comm),
              MTOPT_STATUS_INVALID_ARGUMENT);
    EXPECT(&rec, comm == NULL, "a failed create wrote *out");
  }
  /* An older caller's struct ends before the field: not read, 0. */
  cc.reduce_f32 = 7;
  cc.struct_size = offsetof(mtopt_comm_config_t, reduce_f32);
  run_t r;
  run_open(&r, ctx, &t, 0, &cc, &oc, &rec);
  if (r.d) {
    mtopt_dist_memory_t m = MTOPT_DIST_MEMORY_INIT;
    int64_t grads = 0;
    EXPECT_OK(&rec, mtopt_dist_optimizer_get_memory(r.d, &m));
    for (int dt = 0; dt < 3; dt++) {
      void *p = NULL;
      int64_t n = 0;
      EXPECT_OK(&rec, mtopt_dist_optimizer_get_grad_buffer_dtype(r.d, (mtopt_dtype_t)dt, &p, &n));
      grads += n * mtopt__dt_size(dt);
    }
    EXPECT(&rec, m.grad_bytes == grads, "a short config: grad_bytes %lld for buffers of %lld",
           (long long)m.grad_bytes, (long long)grads);
  }
  run_close(&r, &rec);
  /* Rank 0 reduces in fp32, the others in 16 bits: refused on every rank,
   * naming the setting (not the gradient offsets that follow from it). */
  if (g_world > 1) {
    cc = f32_buckets(0);
    cc.reduce_f32 = g_rank == 0;
    mtopt_comm_t *split = NULL;
    mtopt_tensor_list_t *l = model_list(ctx, &t, 1, -1, NULL, 0, &rec);
    mtopt_dist_optimizer_t *d = NULL;
    EXPECT_OK(&rec, mtopt_comm_create_mpi(ctx, MPI_COMM_WORLD, &cc, &split));
    if (split)
      EXPECT_ST(&rec, mtopt_dist_optimizer_create(split, l, &oc, &d),
                MTOPT_STATUS_INVALID_ARGUMENT);
    EXPECT(&rec, d == NULL && strstr(mtopt_last_error(), "reduce_f32 is between 0 and 1"),
           "rank %d: %p, message: %s", g_rank, (void *)d, mtopt_last_error());
    EXPECT_OK(&rec, mtopt_comm_destroy(split));
    EXPECT_OK(&rec, mtopt_tensor_list_destroy(l));
  }
  EXPECT_OK(&rec, mtopt_context_destroy(ctx));
  model_free(&t);
  REC_ASSERT(rec);
}
END_TEST

static float round16(float x) { return mtopt__f16_to_f32(mtopt__f32_to_f16(x)); }

/* Without reduce_f32: F16 gradients each rank holds finite, whose sum over
 * ranks is not (two ranks' 40000 sum past 65504): the average is finite, so
 * the step must not be skipped, and the averaged gradient must be each
 * rank's value over the world, rounded (every transport scales F16 before
 * summing). */
START_TEST(test_f16_range) {
  rec_t rec = {0};
  mtopt_context_t *ctx = test_context();
  enum { N = 37 };
  void *w = mem_alloc(N * 2);
  float h[N], got[N];
  for (int i = 0; i < N; i++) h[i] = 0.25f + 0.01f * (float)i;
  mem_put_as(w, MTOPT_DTYPE_F16, h, N);
  mtopt_comm_config_t cc = small_buckets(_i);
  mtopt_comm_t *comm = NULL;
  EXPECT_OK(&rec, mtopt_comm_create_mpi(ctx, MPI_COMM_WORLD, &cc, &comm));
  mtopt_tensor_list_t *l = NULL;
  EXPECT_OK(&rec, mtopt_tensor_list_create(ctx, &l));
  mtopt_tensor_desc_t t = MTOPT_TENSOR_DESC_INIT;
  t.param = w, t.numel = N, t.param_dtype = t.grad_dtype = MTOPT_DTYPE_F16;
  EXPECT_OK(&rec, mtopt_tensor_list_add(l, &t, NULL));
  mtopt_optimizer_config_t oc = MTOPT_OPTIMIZER_CONFIG_INIT;
  oc.master_weights = MTOPT_MASTER_F32;
  oc.skip_nonfinite = 1;
  mtopt_dist_optimizer_t *d = NULL;
  EXPECT_OK(&rec, mtopt_dist_optimizer_create(comm, l, &oc, &d));
  void *g = NULL;
  if (d) EXPECT_OK(&rec, mtopt_dist_optimizer_get_grad(d, 0, &g));
  /* Rank q's values, exact in f16 (whose spacing is 32 there). */
#define F16_RANGE_G(i, q) (40000.0f + 32.0f * (float)(i) - 32.0f * (float)(q))
  for (int i = 0; i < N; i++) h[i] = F16_RANGE_G(i, g_rank);
  if (g) mem_put_as(g, MTOPT_DTYPE_F16, h, N);
  if (d) EXPECT_OK(&rec, mtopt_dist_step(d));
  if (d) EXPECT_OK(&rec, mtopt_dist_synchronize(d));
  mtopt_optimizer_t *inner = NULL;
  mtopt_step_info_t si = MTOPT_STEP_INFO_INIT;
  if (d) EXPECT_OK(&rec, mtopt_dist_optimizer_get_optimizer(d, &inner));
  if (inner) EXPECT_OK(&rec, mtopt_optimizer_get_step_info(inner, &si));
  EXPECT(&rec, si.last_skipped == 0 && si.step == 1, "rank %d: skipped %d, step %lld", g_rank,
         si.last_skipped, (long long)si.step);
  if (g && !_i) { /* zero_stage 0: the buffer holds the average after the step */
    mem_get_as(got, g, MTOPT_DTYPE_F16, N);
    const float inv = (float)(1.0 / (double)g_world);
    for (int i = 0; i < N; i++) {
      float want = 0.0f; /* each rank's value scaled, rounded, summed in rank order */
      for (int q = 0; q < g_world; q++)
        want = round16(want + round16(F16_RANGE_G(i, q) * inv));
      /* MPI may add three ranks' values in another order: one f16 ulp. */
      const float slack = (g_world & (g_world - 1)) ? 32.0f : 0.0f;
      EXPECT(&rec, fabsf(got[i] - want) <= slack, "rank %d: averaged g[%d] = %g, not %g", g_rank, i,
             (double)got[i], (double)want);
    }
  }
  EXPECT_OK(&rec, mtopt_dist_optimizer_destroy(d));
  EXPECT_OK(&rec, mtopt_comm_destroy(comm));
  EXPECT_OK(&rec, mtopt_tensor_list_destroy(l));
  EXPECT_OK(&rec, mtopt_context_destroy(ctx));
  mem_free(w);
  REC_ASSERT(rec);
}
END_TEST

Suite *dist_reduce_suite(void) {
  Suite *s = suite_create("dist_reduce");
  TCase *tc = tcase_create("dist_reduce");
  tcase_set_timeout(tc, 120); /* per test; CK_NOFORK: ctest's TIMEOUT bounds the run */
  tcase_add_test(tc, test_bad_inputs);
  tcase_add_test(tc, test_memory);
  tcase_add_loop_test(tc, test_equivalence, 0, 4 * N_RF);
  tcase_add_loop_test(tc, test_closer, 0, 2);
  tcase_add_loop_test(tc, test_checkpoint, 0, 2);
  tcase_add_loop_test(tc, test_f16_range, 0, 2);
  suite_add_tcase(s, tc);
  return s;
}

int main(int argc, char **argv) { return dist_main(argc, argv, "dist_reduce", dist_reduce_suite); }

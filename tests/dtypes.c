/* Mixed precision through the public API (CPU backend; MTOPT_TEST_BACKEND=cuda
 * runs it on CUDA): F16/BF16 parameters and gradients in any mix, fp32 master
 * weights and bf16 remainders, bf16 state, stochastic rounding.
 *
 * The references are the fp32 optimizer and the formats of dtype.h (tested on
 * their own in dtype_convert.c):
 *  - MASTER_F32: the masters step exactly as an fp32 optimizer stepping fp32
 *    copies of the parameters on the gradients converted to fp32, bit for bit,
 *    and each parameter is its master rounded to nearest even;
 *  - REMAINDER: the same masters and state as MASTER_F32, bit for bit; the
 *    parameters the same except at exact ties (rounded away from zero);
 *  - NONE: one step equals the fp32 step of the upcast values, rounded;
 *  - stochastic rounding gives one of the two neighbours, independently of
 *    chunk size and thread count;
 *  - a skipped step changes nothing, masters and remainders included.
 * Sizes are odd, starts misaligned, values random; outputs are compared after
 * every step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/dtype.h"
#include "test_util.h"

enum { MAXT = 9, STEPS = 6 };

typedef struct {
  mtopt_backend_t be;
  int n;
  int64_t numel[MAXT];
  int pdt[MAXT], gdt[MAXT];
  void *w[MAXT], *g[MAXT];       /* backend memory, at misaligned starts */
  void *wmem[MAXT], *gmem[MAXT]; /* the allocations */
} table_t;

static size_t esize(int dt) { return (size_t)mtopt__dt_size(dt); }

static void *alloc_at(mtopt_backend_t be, int64_t n, int dt, int skew, void **mem) {
  *mem = tu_alloc(be, (size_t)(n + 16) * esize(dt));
  return (char *)*mem + (size_t)skew * esize(dt);
}

/* Host fp32 values into a backend array of dtype dt, rounded to nearest. */
static void put(mtopt_backend_t be, void *dst, int dt, const float *x, int64_t n) {
  if (dt == MTOPT__DT_F32) {
    tu_to_backend(be, dst, x, (size_t)n * 4);
    return;
  }
  uint16_t *h = malloc((size_t)n * 2);
  for (int64_t i = 0; i < n; i++)
    h[i] = dt == MTOPT__DT_BF16 ? mtopt__f32_to_bf16(x[i]) : mtopt__f32_to_f16(x[i]);
  tu_to_backend(be, dst, h, (size_t)n * 2);
  free(h);
}

/* A backend array of dtype dt as host fp32 (exact). */
static void get(mtopt_backend_t be, float *x, const void *src, int dt, int64_t n) {
  if (dt == MTOPT__DT_F32) {
    tu_to_host(be, x, src, (size_t)n * 4);
    return;
  }
  uint16_t *h = malloc((size_t)n * 2);
  tu_to_host(be, h, src, (size_t)n * 2);
  for (int64_t i = 0; i < n; i++) x[i] = mtopt__ld(h, dt, i);
  free(h);
}

/* n tensors of the given dtypes: sizes from `numel` (or random, odd, with a
 * one-element tensor first), each at a random misaligned start. */
static void table_make(table_t *t, tu_rng_t *rng, mtopt_backend_t be, int n, const int *pdt,
                       const int *gdt, const int64_t *numel) {
  memset(t, 0, sizeof *t);
  t->be = be;
  t->n = n;
  for (int i = 0; i < n; i++) {
    t->numel[i] = numel ? numel[i] : i == 0 ? 1 : tu_int(rng, 2, i % 3 == 0 ? 5000 : 300);
    t->pdt[i] = pdt[i];
    t->gdt[i] = gdt[i];
    t->w[i] = alloc_at(be, t->numel[i], pdt[i], (int)tu_int(rng, 0, 7), &t->wmem[i]);
    t->g[i] = alloc_at(be, t->numel[i], gdt[i], (int)tu_int(rng, 0, 7), &t->gmem[i]);
  }
}

/* dst's weights := src's (upcast or rounded into dst's dtypes). */
static void copy_w(table_t *dst, const table_t *src) {
  for (int i = 0; i < src->n; i++) {
    float *x = malloc((size_t)src->numel[i] * 4);
    get(src->be, x, src->w[i], src->pdt[i], src->numel[i]);
    put(dst->be, dst->w[i], dst->pdt[i], x, src->numel[i]);
    free(x);
  }
}

/* Random weights in [-2, 2), rounded into each tensor's dtype. */
static void table_fill_w(table_t *t, tu_rng_t *rng) {
  for (int i = 0; i < t->n; i++) {
    float *x = malloc((size_t)t->numel[i] * 4);
    tu_fill(rng, x, t->numel[i], -2.0f, 2.0f);
    put(t->be, t->w[i], t->pdt[i], x, t->numel[i]);
    free(x);
  }
}

static void table_free(table_t *t) {
  for (int i = 0; i < t->n; i++) {
    tu_free(t->be, t->wmem[i]);
    tu_free(t->be, t->gmem[i]);
  }
}

/* A table of t's sizes and weights in other dtypes (twin of t). */
static void table_like(table_t *f, const table_t *t, tu_rng_t *rng, int pdt, int gdt) {
  int p[MAXT], g[MAXT];
  for (int i = 0; i < t->n; i++) {
    p[i] = pdt < 0 ? t->pdt[i] : pdt;
    g[i] = gdt < 0 ? t->gdt[i] : gdt;
  }
  table_make(f, rng, t->be, t->n, p, g, t->numel);
  copy_w(f, t);
}

/* Fresh random gradients (times scale) in every table of ts[0..k): each in
 * its own dtype, all the same values (those of ts[0]'s dtype, which every
 * other table can hold exactly when it is F32 or the same dtype). */
static void set_grads(table_t *const *ts, int k, tu_rng_t *rng, float scale) {
  const table_t *a = ts[0];
  for (int i = 0; i < a->n; i++) {
    const int64_t n = a->numel[i];
    float *x = malloc((size_t)n * 4);
    tu_fill(rng, x, n, -scale, scale);
    put(a->be, a->g[i], a->gdt[i], x, n);
    get(a->be, x, a->g[i], a->gdt[i], n); /* the values it holds */
    for (int j = 1; j < k; j++) put(ts[j]->be, ts[j]->g[i], ts[j]->gdt[i], x, n);
    free(x);
  }
}

static mtopt_optimizer_t *make_opt(mtopt_context_t *ctx, const table_t *t,
                                   const mtopt_optimizer_config_t *c, mtopt_tensor_list_t **list) {
  TU_OK(mtopt_tensor_list_create(ctx, list));
  for (int i = 0; i < t->n; i++) {
    mtopt_tensor_desc_t d = MTOPT_TENSOR_DESC_INIT;
    d.param = t->w[i];
    d.grad = t->g[i];
    d.numel = t->numel[i];
    d.param_dtype = (mtopt_dtype_t)t->pdt[i];
    d.grad_dtype = (mtopt_dtype_t)t->gdt[i];
    d.flags = i == 1 ? MTOPT_TENSOR_NO_WEIGHT_DECAY : 0u;
    TU_OK(mtopt_tensor_list_add(*list, &d, NULL));
  }
  mtopt_optimizer_t *opt = NULL;
  TU_OK(mtopt_optimizer_create(ctx, *list, c, &opt));
  return opt;
}

static void drop_opt(mtopt_optimizer_t *opt, mtopt_tensor_list_t *list) {
  TU_OK(mtopt_optimizer_destroy(opt));
  TU_OK(mtopt_tensor_list_destroy(list));
}

/* A test's rng (seeded from the run's seed and a salt) and context. */
static mtopt_context_t *begin(tu_rng_t *rng, uint64_t salt) {
  tu_rng_init(rng, tu_seed() + salt);
  return tu_context(tu_backend());
}

/* Destroys two optimizers, their tables and the context. */
static void finish2(mtopt_context_t *ctx, mtopt_optimizer_t *oa, mtopt_tensor_list_t *la,
                    table_t *a, mtopt_optimizer_t *ob, mtopt_tensor_list_t *lb, table_t *b) {
  drop_opt(oa, la);
  drop_opt(ob, lb);
  table_free(a);
  table_free(b);
  TU_OK(mtopt_context_destroy(ctx));
}

static mtopt_optimizer_config_t kind_config(int k) {
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  c.lr = 1e-2f;
  c.chunk_size = 256;
  switch (k % 4) {
  case 0: c.kind = MTOPT_OPTIMIZER_ADAMW; c.weight_decay = 0.05f; break;
  case 1: c.kind = MTOPT_OPTIMIZER_ADAM; c.weight_decay = 0.01f; break;
  case 2: c.kind = MTOPT_OPTIMIZER_SGD; c.momentum = 0.9f; c.weight_decay = 0.01f; break;
  default: c.kind = MTOPT_OPTIMIZER_LAMB; c.weight_decay = 0.01f; break;
  }
  if (k >= 4) c.max_grad_norm = 0.5f; /* a statistics pass, clipping on */
  return c;
}

static const mtopt_state_t state_of_kind[4][2] = {
    {MTOPT_STATE_EXP_AVG, MTOPT_STATE_EXP_AVG_SQ},
    {MTOPT_STATE_EXP_AVG, MTOPT_STATE_EXP_AVG_SQ},
    {MTOPT_STATE_MOMENTUM, MTOPT_STATE_MOMENTUM},
    {MTOPT_STATE_EXP_AVG, MTOPT_STATE_EXP_AVG_SQ}};

/* Reductions (clipping's norm, LAMB's norms) are summed in another order by
 * the CUDA kernels' fp32 and mixed paths: there, runs that take them agree to
 * a tolerance, elsewhere bit for bit. */
static int exact_run;

/* Asserts two host arrays are equal bit for bit (or, !exact_run, close). */
static void same_bits(const float *a, const float *b, int64_t n, const char *what, int tensor,
                      int step) {
  if (!exact_run) {
    const tu_err_t e = tu_compare_f(a, b, n, 1e-6, 1e-5);
    ck_assert_msg(e.n_bad == 0, "%s, tensor %d, step %d: %lld far apart, first at %lld", what,
                  tensor, step, (long long)e.n_bad, (long long)e.first_bad);
    return;
  }
  const int64_t d = tu_first_bit_diff(a, b, n);
  ck_assert_msg(d < 0, "%s, tensor %d, step %d: element %lld differs (%.9g vs %.9g)", what,
                tensor, step, (long long)d, d < 0 ? 0.0 : (double)a[d], d < 0 ? 0.0 : (double)b[d]);
}

/* The state buffers of two optimizers agree bit for bit. */
static void same_state(mtopt_optimizer_t *a, mtopt_optimizer_t *b, const table_t *t, int kind,
                       int step) {
  for (int i = 0; i < t->n; i++) {
    float *x = malloc((size_t)t->numel[i] * 4), *y = malloc((size_t)t->numel[i] * 4);
    for (int s = 0; s < (kind == 2 ? 1 : 2); s++) {
      TU_OK(mtopt_optimizer_read_state(a, i, state_of_kind[kind][s], x));
      TU_OK(mtopt_optimizer_read_state(b, i, state_of_kind[kind][s], y));
      same_bits(x, y, t->numel[i], s ? "second moment" : "first moment/buffer", i, step);
    }
    free(x);
    free(y);
  }
}

/* _i: kind (0..7: AdamW, Adam, SGD, LAMB, then the same with clipping) x
 * parameter dtype (BF16, F16) x gradient dtype (F32, BF16, F16). */
START_TEST(test_master_f32_is_fp32) {
  const int kind = _i % 8, pdt = (_i / 8) % 2 ? MTOPT__DT_F16 : MTOPT__DT_BF16, gsel = _i / 16;
  const int gdt = gsel == 0 ? MTOPT__DT_F32 : gsel == 1 ? MTOPT__DT_BF16 : MTOPT__DT_F16;
  tu_rng_t rng;
  const mtopt_backend_t be = tu_backend();
  mtopt_context_t *ctx = begin(&rng, 31u * (uint64_t)_i);
  int p[MAXT], g[MAXT];
  for (int i = 0; i < MAXT; i++) {
    p[i] = pdt;
    g[i] = gdt;
  }
  table_t a, f;
  table_make(&a, &rng, be, MAXT, p, g, NULL);
  table_fill_w(&a, &rng);
  table_like(&f, &a, &rng, MTOPT__DT_F32, MTOPT__DT_F32);
  mtopt_optimizer_config_t c = kind_config(kind);
  mtopt_tensor_list_t *la, *lf;
  exact_run = be == MTOPT_BACKEND_CPU || (kind < 4 && kind != 3);
  c.master_weights = MTOPT_MASTER_F32;
  mtopt_optimizer_t *oa = make_opt(ctx, &a, &c, &la);
  c.master_weights = MTOPT_MASTER_NONE;
  mtopt_optimizer_t *of = make_opt(ctx, &f, &c, &lf);
  table_t *both[2] = {&a, &f};
  for (int step = 1; step <= STEPS; step++) {
    set_grads(both, 2, &rng, 1.0f);
    TU_OK(mtopt_optimizer_step(oa));
    TU_OK(mtopt_optimizer_step(of));
    for (int i = 0; i < a.n; i++) {
      const int64_t n = a.numel[i];
      float *m = malloc((size_t)n * 4), *w32 = malloc((size_t)n * 4), *pw = malloc((size_t)n * 4);
      tu_poison(m, n);
      TU_OK(mtopt_optimizer_read_state(oa, i, MTOPT_STATE_MASTER, m));
      get(be, w32, f.w[i], MTOPT__DT_F32, n);
      same_bits(m, w32, n, "master vs fp32 weights", i, step);
      const int exact = exact_run;
      exact_run = 1; /* the parameter is its own master rounded, always */
      get(be, pw, a.w[i], pdt, n);
      for (int64_t k = 0; k < n; k++) { /* the master rounded to nearest even */
        const uint16_t h = pdt == MTOPT__DT_BF16 ? mtopt__f32_to_bf16(m[k]) : mtopt__f32_to_f16(m[k]);
        w32[k] = mtopt__ld(&h, pdt, 0);
      }
      same_bits(pw, w32, n, "param vs its master rounded", i, step);
      exact_run = exact;
      free(m);
      free(w32);
      free(pw);
    }
    same_state(oa, of, &a, kind % 4, step);
  }
  mtopt_dtype_t dt;
  TU_OK(mtopt_optimizer_get_state_dtype(oa, 0, MTOPT_STATE_MASTER, &dt));
  ck_assert_int_eq(dt, MTOPT_DTYPE_F32);
  finish2(ctx, oa, la, &a, of, lf, &f);
}
END_TEST

/* REMAINDER against MASTER_F32 on the same bf16 table: masters and state bit
 * for bit; parameters equal but where the master's low half is exactly 0x8000
 * (a tie: REMAINDER rounds it away from zero, F32 to even). _i: kind x stats. */
START_TEST(test_remainder_is_master_f32) {
  tu_rng_t rng;
  const mtopt_backend_t be = tu_backend();
  mtopt_context_t *ctx = begin(&rng, 77u * (uint64_t)_i);
  int p[MAXT], g[MAXT];
  for (int i = 0; i < MAXT; i++) {
    p[i] = MTOPT__DT_BF16;
    g[i] = i % 2 ? MTOPT__DT_BF16 : MTOPT__DT_F32;
  }
  table_t a, b;
  table_make(&a, &rng, be, MAXT, p, g, NULL);
  table_fill_w(&a, &rng);
  table_like(&b, &a, &rng, -1, -1);
  const int kind = _i % 8;
  mtopt_optimizer_config_t c = kind_config(kind);
  mtopt_tensor_list_t *la, *lb;
  exact_run = 1; /* both take the mixed path */
  c.master_weights = MTOPT_MASTER_REMAINDER;
  mtopt_optimizer_t *oa = make_opt(ctx, &a, &c, &la);
  c.master_weights = MTOPT_MASTER_F32;
  mtopt_optimizer_t *ob = make_opt(ctx, &b, &c, &lb);
  table_t *both[2] = {&a, &b};
  int64_t ties = 0;
  for (int step = 1; step <= STEPS; step++) {
    set_grads(both, 2, &rng, 1.0f);
    TU_OK(mtopt_optimizer_step(oa));
    TU_OK(mtopt_optimizer_step(ob));
    for (int i = 0; i < a.n; i++) {
      const int64_t n = a.numel[i];
      float *ma = malloc((size_t)n * 4), *mb = malloc((size_t)n * 4);
      uint16_t *pa = malloc((size_t)n * 2), *pb = malloc((size_t)n * 2);
      TU_OK(mtopt_optimizer_read_state(oa, i, MTOPT_STATE_MASTER, ma));
      TU_OK(mtopt_optimizer_read_state(ob, i, MTOPT_STATE_MASTER, mb));
      same_bits(ma, mb, n, "remainder master vs F32 master", i, step);
      tu_to_host(be, pa, a.w[i], (size_t)n * 2);
      tu_to_host(be, pb, b.w[i], (size_t)n * 2);
      for (int64_t k = 0; k < n; k++) {
        const uint32_t bits = mtopt__f32_bits(ma[k]);
        if ((bits & 0xffffu) == 0x8000u) {
          ties++;
          uint16_t hp, hr;
          mtopt__split_master(ma[k], &hp, &hr);
          ck_assert_int_eq(pa[k], hp);
        } else {
          ck_assert_msg(pa[k] == pb[k], "tensor %d element %lld step %d: param %04x vs %04x", i,
                        (long long)k, step, pa[k], pb[k]);
        }
      }
      free(ma);
      free(mb);
      free(pa);
      free(pb);
    }
    same_state(oa, ob, &a, kind % 4, step);
  }
  (void)ties; /* rare: about one element in 65536 per step */
  mtopt_dtype_t dt;
  TU_OK(mtopt_optimizer_get_state_dtype(oa, 0, MTOPT_STATE_MASTER, &dt));
  ck_assert_int_eq(dt, MTOPT_DTYPE_U16);
  finish2(ctx, oa, la, &a, ob, lb, &b);
}
END_TEST

/* Host copies of every array an optimizer writes (params, masters, states),
 * as raw bytes, to compare two runs bit for bit. */
typedef struct {
  int n;
  void *buf[MAXT][4];
  size_t bytes[MAXT][4];
} snap_t;

static void snap_take(snap_t *sn, mtopt_optimizer_t *opt, const table_t *t, int nstate) {
  static const mtopt_state_t st[2][2] = {{MTOPT_STATE_EXP_AVG, MTOPT_STATE_EXP_AVG_SQ},
                                         {MTOPT_STATE_MOMENTUM, MTOPT_STATE_MOMENTUM}};
  const int sgd = nstate == 1;
  memset(sn, 0, sizeof *sn);
  sn->n = t->n;
  for (int i = 0; i < t->n; i++) {
    const size_t n = (size_t)t->numel[i];
    sn->bytes[i][0] = n * esize(t->pdt[i]);
    sn->buf[i][0] = malloc(sn->bytes[i][0]);
    tu_to_host(t->be, sn->buf[i][0], t->w[i], sn->bytes[i][0]);
    for (int s = 0; s < nstate; s++) {
      sn->bytes[i][1 + s] = n * 4;
      sn->buf[i][1 + s] = malloc(n * 4);
      TU_OK(mtopt_optimizer_read_state(opt, i, st[sgd][s], sn->buf[i][1 + s]));
    }
    if (t->pdt[i] != MTOPT__DT_F32) {
      mtopt_dtype_t dt;
      if (mtopt_optimizer_get_state_dtype(opt, i, MTOPT_STATE_MASTER, &dt) == MTOPT_STATUS_SUCCESS) {
        sn->bytes[i][3] = n * 4;
        sn->buf[i][3] = malloc(n * 4);
        TU_OK(mtopt_optimizer_read_state(opt, i, MTOPT_STATE_MASTER, sn->buf[i][3]));
      }
    }
  }
}

static void snap_same(const snap_t *a, const snap_t *b, const char *what) {
  for (int i = 0; i < a->n; i++)
    for (int k = 0; k < 4; k++) {
      ck_assert_int_eq(a->bytes[i][k], b->bytes[i][k]);
      if (a->bytes[i][k])
        ck_assert_msg(memcmp(a->buf[i][k], b->buf[i][k], a->bytes[i][k]) == 0,
                      "%s: tensor %d array %d differs", what, i, k);
    }
}

static void snap_free(snap_t *sn) {
  for (int i = 0; i < sn->n; i++)
    for (int k = 0; k < 4; k++) free(sn->buf[i][k]);
}

/* Stochastic rounding's bits come from (seed, step, tensor, element) alone:
 * the same with chunks of 64 and of 4096 elements and with 1 or 3 threads;
 * another seed gives other bits. All-BF16 (params, grads, state), AdamW. */
START_TEST(test_stochastic_invariance) {
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 101);
  const mtopt_backend_t be = tu_backend();
  int p[MAXT], g[MAXT];
  for (int i = 0; i < MAXT; i++) p[i] = g[i] = MTOPT__DT_BF16;
  table_t t[4];
  table_make(&t[0], &rng, be, MAXT, p, g, NULL);
  table_fill_w(&t[0], &rng);
  for (int k = 1; k < 4; k++) table_like(&t[k], &t[0], &rng, -1, -1);
  mtopt_context_config_t cc = MTOPT_CONTEXT_CONFIG_INIT;
  cc.backend = be;
  mtopt_context_t *ctx[4];
  mtopt_optimizer_t *o[4];
  mtopt_tensor_list_t *l[4];
  for (int k = 0; k < 4; k++) {
    cc.num_threads = be == MTOPT_BACKEND_CPU && k == 1 ? 1 : 3;
    TU_OK(mtopt_context_create(&cc, &ctx[k]));
    mtopt_optimizer_config_t c = kind_config(0);
    c.state_dtype = MTOPT_DTYPE_BF16;
    c.rounding = MTOPT_ROUNDING_STOCHASTIC;
    c.seed = k == 3 ? 43u : 42u;
    c.chunk_size = k == 2 ? 4096 : 64;
    c.lr = 1e-3f; /* small updates: rounding decides most of them */
    o[k] = make_opt(ctx[k], &t[k], &c, &l[k]);
  }
  table_t *all[4] = {&t[0], &t[1], &t[2], &t[3]};
  for (int step = 1; step <= STEPS; step++) {
    set_grads(all, 4, &rng, 1.0f);
    for (int k = 0; k < 4; k++) TU_OK(mtopt_optimizer_step(o[k]));
  }
  snap_t s[4];
  for (int k = 0; k < 4; k++) snap_take(&s[k], o[k], &t[k], 2);
  snap_same(&s[0], &s[1], "1 thread vs 3");
  snap_same(&s[0], &s[2], "chunks of 64 vs 4096");
  int differ = 0;
  for (int i = 0; i < MAXT; i++) differ |= memcmp(s[0].buf[i][0], s[3].buf[i][0], s[0].bytes[i][0]);
  ck_assert_msg(differ, "another seed rounded every parameter the same way");
  for (int k = 0; k < 4; k++) {
    snap_free(&s[k]);
    drop_opt(o[k], l[k]);
    table_free(&t[k]);
    TU_OK(mtopt_context_destroy(ctx[k]));
  }
}
END_TEST

/* Stochastic rounding through the optimizer, over steps: SGD moves every bf16
 * weight in [1, 1.25) by half an ulp per step (lr 2^-8, g = -1). Rounded
 * stochastically with fresh bits each step, the displacement after K steps
 * is binomial(K, 1/2) ulps: its mean is K/2 (unbiased), and few weights moved
 * every time or never (2^(1-K)). Bits that repeated across steps would move
 * each weight every time or never. */
START_TEST(test_stochastic_steps) {
  tu_rng_t rng;
  const mtopt_backend_t be = tu_backend();
  mtopt_context_t *ctx = begin(&rng, 601);
  int p[1] = {MTOPT__DT_BF16}, g[1] = {MTOPT__DT_BF16};
  const int64_t n = 6000, nn[1] = {6000};
  const int K = 8;
  table_t a;
  table_make(&a, &rng, be, 1, p, g, nn);
  float *x = malloc((size_t)n * 4), *x0 = malloc((size_t)n * 4);
  for (int64_t k = 0; k < n; k++) x[k] = 1.0f + (float)tu_int(&rng, 0, 31) * 0.0078125f;
  memcpy(x0, x, (size_t)n * 4);
  put(be, a.w[0], MTOPT__DT_BF16, x, n);
  for (int64_t k = 0; k < n; k++) x[k] = -1.0f;
  put(be, a.g[0], MTOPT__DT_BF16, x, n);
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  c.kind = MTOPT_OPTIMIZER_SGD;
  c.lr = 0.00390625f;
  c.weight_decay = 0.0f;
  c.rounding = MTOPT_ROUNDING_STOCHASTIC;
  c.seed = tu_seed();
  c.chunk_size = 1024;
  mtopt_tensor_list_t *l;
  mtopt_optimizer_t *o = make_opt(ctx, &a, &c, &l);
  for (int k = 0; k < K; k++) TU_OK(mtopt_optimizer_step(o));
  get(be, x, a.w[0], MTOPT__DT_BF16, n);
  double sum = 0.0;
  int64_t extreme = 0;
  for (int64_t k = 0; k < n; k++) {
    const double ulps = ((double)x[k] - x0[k]) / 0.0078125;
    ck_assert_msg(ulps == floor(ulps) && ulps >= 0 && ulps <= K, "element %lld moved %g ulps",
                  (long long)k, ulps);
    sum += ulps;
    extreme += ulps == 0 || ulps == K;
  }
  const double mean = sum / n, se = sqrt(K * 0.25 / n);
  ck_assert_msg(fabs(mean - K / 2.0) < 5 * se, "mean displacement %.4f ulps, want %d", mean, K / 2);
  ck_assert_msg(extreme < n / 20, "%lld of %lld weights moved every step or never",
                (long long)extreme, (long long)n);
  free(x);
  free(x0);
  drop_opt(o, l);
  table_free(&a);
  TU_OK(mtopt_context_destroy(ctx));
}
END_TEST

/* Without masters one step is the fp32 step of the upcast values, rounded:
 * to nearest even, or stochastically to one of the two neighbours (and not
 * always the nearest). BF16 parameters and state, first step, every kind. */
START_TEST(test_no_master_one_step) {
  const int kind = _i % 4, sr = _i / 4;
  tu_rng_t rng;
  const mtopt_backend_t be = tu_backend();
  mtopt_context_t *ctx = begin(&rng, 211u * (uint64_t)_i);
  int p[MAXT], g[MAXT];
  for (int i = 0; i < MAXT; i++) {
    p[i] = MTOPT__DT_BF16;
    g[i] = i % 2 ? MTOPT__DT_BF16 : MTOPT__DT_F16;
  }
  table_t a, f;
  table_make(&a, &rng, be, MAXT, p, g, NULL);
  table_fill_w(&a, &rng);
  table_like(&f, &a, &rng, MTOPT__DT_F32, MTOPT__DT_F32);
  mtopt_optimizer_config_t c = kind_config(kind);
  mtopt_tensor_list_t *la, *lf;
  mtopt_optimizer_t *of = make_opt(ctx, &f, &c, &lf);
  /* LAMB's second pass reads the moments as stored: with bf16 state its step
   * is not the rounded fp32 step. */
  c.state_dtype = kind == 3 ? MTOPT_DTYPE_F32 : MTOPT_DTYPE_BF16;
  c.rounding = sr ? MTOPT_ROUNDING_STOCHASTIC : MTOPT_ROUNDING_NEAREST;
  mtopt_optimizer_t *oa = make_opt(ctx, &a, &c, &la);
  table_t *both[2] = {&a, &f};
  set_grads(both, 2, &rng, 1.0f);
  TU_OK(mtopt_optimizer_step(oa));
  TU_OK(mtopt_optimizer_step(of));
  int64_t off_nearest = 0, total = 0;
  for (int i = 0; i < a.n; i++) {
    const int64_t n = a.numel[i];
    float *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
    get(be, x, a.w[i], MTOPT__DT_BF16, n);
    get(be, y, f.w[i], MTOPT__DT_F32, n);
    for (int64_t k = 0; k < n; k++) {
      const uint16_t near = mtopt__f32_to_bf16(y[k]);
      const uint16_t got = mtopt__f32_to_bf16(x[k]); /* x is a bf16 value */
      if (!sr && (kind != 3 || be == MTOPT_BACKEND_CPU)) { /* CUDA: LAMB's norms differ */
        ck_assert_msg(got == near, "tensor %d element %lld: %04x, nearest %04x", i, (long long)k,
                      got, near);
        continue;
      }
      const float lo = mtopt__bits_f32(mtopt__f32_bits(y[k]) & 0xffff0000u);
      const float hi = mtopt__bf16_to_f32((uint16_t)((mtopt__f32_bits(y[k]) >> 16) + 1));
      ck_assert_msg(x[k] == lo || x[k] == hi || x[k] == y[k], "tensor %d element %lld: %.9g not "
                    "beside %.9g", i, (long long)k, (double)x[k], (double)y[k]);
      off_nearest += got != near;
      total++;
    }
    free(x);
    free(y);
  }
  if (sr && kind != 3) ck_assert_msg(off_nearest > total / 50, "stochastic rounding went to the nearest "
                        "value %lld times of %lld", (long long)(total - off_nearest), (long long)total);
  finish2(ctx, oa, la, &a, of, lf, &f);
}
END_TEST

/* An fp16 gradient overflow under the dynamic loss scale: the step is skipped,
 * and parameters, masters, remainders and states are unchanged bit for bit;
 * the scale backs off. _i: master mode (NONE, F32, REMAINDER). */
START_TEST(test_skip_changes_nothing) {
  tu_rng_t rng;
  const mtopt_backend_t be = tu_backend();
  mtopt_context_t *ctx = begin(&rng, 307u * (uint64_t)_i);
  int p[MAXT], g[MAXT];
  for (int i = 0; i < MAXT; i++) {
    p[i] = i == 4 ? MTOPT__DT_F32 : MTOPT__DT_BF16;
    g[i] = MTOPT__DT_F16;
  }
  table_t a;
  table_make(&a, &rng, be, MAXT, p, g, NULL);
  table_fill_w(&a, &rng);
  mtopt_optimizer_config_t c = kind_config(0);
  c.master_weights = (mtopt_master_t)_i;
  c.state_dtype = MTOPT_DTYPE_BF16;
  c.dynamic_loss_scale = 1;
  c.loss_scale = 1024.0f;
  mtopt_tensor_list_t *l;
  mtopt_optimizer_t *o = make_opt(ctx, &a, &c, &l);
  table_t *one[1] = {&a};
  set_grads(one, 1, &rng, 100.0f);
  TU_OK(mtopt_optimizer_step(o)); /* a real step first: state is not zero */
  snap_t before, after;
  snap_take(&before, o, &a, 2);
  /* 70000 does not fit fp16: an inf in tensor 3 */
  uint16_t inf = mtopt__f32_to_f16(70000.0f);
  tu_to_backend(be, (uint16_t *)a.g[3] + a.numel[3] / 2, &inf, 2);
  TU_OK(mtopt_optimizer_step(o));
  snap_take(&after, o, &a, 2);
  snap_same(&before, &after, "skipped step");
  mtopt_step_info_t info = MTOPT_STEP_INFO_INIT;
  TU_OK(mtopt_optimizer_get_step_info(o, &info));
  ck_assert_int_eq(info.last_skipped, 1);
  ck_assert_int_eq(info.step, 1);
  ck_assert(info.loss_scale == 512.0f);
  snap_free(&before);
  snap_free(&after);
  drop_opt(o, l);
  table_free(&a);
  TU_OK(mtopt_context_destroy(ctx));
}
END_TEST

/* A mixed table (fp32 vectors, bf16 matrices, as models register them) steps
 * in one launch per pass, each tensor as it would alone in a table of its own
 * dtypes: without statistics the tensors do not interact. */
START_TEST(test_mixed_table) {
  tu_rng_t rng;
  const mtopt_backend_t be = tu_backend();
  mtopt_context_t *ctx = begin(&rng, 401);
  int p[MAXT], g[MAXT];
  for (int i = 0; i < MAXT; i++) p[i] = g[i] = i % 3 == 1 ? MTOPT__DT_F32 : MTOPT__DT_BF16;
  table_t a, single;
  table_make(&a, &rng, be, MAXT, p, g, NULL);
  table_fill_w(&a, &rng);
  table_like(&single, &a, &rng, -1, -1);
  mtopt_optimizer_config_t c = kind_config(0);
  c.master_weights = MTOPT_MASTER_F32;
  c.weight_decay = 0.0f; /* make_opt flags tensor 1 no-decay: alone it is tensor 0 */
  mtopt_tensor_list_t *la;
  mtopt_optimizer_t *oa = make_opt(ctx, &a, &c, &la);
  mtopt_optimizer_info_t info = MTOPT_OPTIMIZER_INFO_INIT;
  TU_OK(mtopt_optimizer_get_info(oa, &info));
  ck_assert_int_eq(info.launches_per_step, 1);
  /* each tensor alone */
  mtopt_optimizer_t *os[MAXT];
  mtopt_tensor_list_t *ls[MAXT];
  table_t one[MAXT];
  for (int i = 0; i < MAXT; i++) {
    one[i] = single;
    one[i].n = 1;
    one[i].numel[0] = single.numel[i];
    one[i].pdt[0] = single.pdt[i];
    one[i].gdt[0] = single.gdt[i];
    one[i].w[0] = single.w[i];
    one[i].g[0] = single.g[i];
    os[i] = make_opt(ctx, &one[i], &c, &ls[i]);
  }
  table_t *both[2] = {&a, &single};
  for (int step = 1; step <= STEPS; step++) {
    set_grads(both, 2, &rng, 1.0f);
    TU_OK(mtopt_optimizer_step(oa));
    for (int i = 0; i < MAXT; i++) TU_OK(mtopt_optimizer_step(os[i]));
  }
  for (int i = 0; i < MAXT; i++) {
    const size_t bytes = (size_t)a.numel[i] * esize(a.pdt[i]);
    void *x = malloc(bytes), *y = malloc(bytes);
    tu_to_host(be, x, a.w[i], bytes);
    tu_to_host(be, y, single.w[i], bytes);
    ck_assert_msg(memcmp(x, y, bytes) == 0, "tensor %d (dtype %d) differs from its own table", i,
                  a.pdt[i]);
    free(x);
    free(y);
    drop_opt(os[i], ls[i]);
  }
  drop_opt(oa, la);
  table_free(&a);
  table_free(&single);
  TU_OK(mtopt_context_destroy(ctx));
}
END_TEST

/* Checkpoints carry dtypes, masters or remainders, state dtype, seed and step:
 * a run saved at step 3 and resumed in another optimizer rounds as the
 * uninterrupted run, bit for bit; an optimizer of another dtype layout
 * refuses the file and is left as it was. */
START_TEST(test_checkpoint_resume) {
  tu_rng_t rng;
  const mtopt_backend_t be = tu_backend();
  mtopt_context_t *ctx = begin(&rng, 701);
  int p[MAXT], g[MAXT];
  for (int i = 0; i < MAXT; i++) {
    p[i] = i % 3 == 1 ? MTOPT__DT_F32 : MTOPT__DT_BF16;
    g[i] = i % 2 ? MTOPT__DT_F32 : MTOPT__DT_BF16;
  }
  table_t a, b, wrong;
  table_make(&a, &rng, be, MAXT, p, g, NULL);
  table_fill_w(&a, &rng);
  table_like(&b, &a, &rng, -1, -1);
  table_fill_w(&b, &rng); /* b starts elsewhere: load must bring it back */
  table_like(&wrong, &a, &rng, -1, -1);
  mtopt_optimizer_config_t c = kind_config(4); /* AdamW with clipping */
  c.master_weights = MTOPT_MASTER_REMAINDER;
  c.state_dtype = MTOPT_DTYPE_BF16;
  c.rounding = MTOPT_ROUNDING_STOCHASTIC;
  c.seed = 1234567u;
  mtopt_tensor_list_t *la, *lb, *lw;
  mtopt_optimizer_t *oa = make_opt(ctx, &a, &c, &la);
  c.seed = 7u; /* the file's seed replaces it */
  mtopt_optimizer_t *ob = make_opt(ctx, &b, &c, &lb);
  c.state_dtype = MTOPT_DTYPE_F32;
  mtopt_optimizer_t *ow = make_opt(ctx, &wrong, &c, &lw);
  table_t *ta[1] = {&a}, *tb[1] = {&b};
  for (int step = 0; step < 3; step++) {
    set_grads(ta, 1, &rng, 1.0f);
    TU_OK(mtopt_optimizer_step(oa));
  }
  char path[] = "/tmp/mtopt_dtypes_XXXXXX";
  const int fd = mkstemp(path);
  ck_assert_int_ge(fd, 0);
  TU_OK(mtopt_optimizer_save(oa, path));
  snap_t w0, w1;
  snap_take(&w0, ow, &wrong, 2);
  ck_assert_int_eq(mtopt_optimizer_load(ow, path), MTOPT_STATUS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(mtopt_last_error(), "state_dtype") != NULL, "%s", mtopt_last_error());
  snap_take(&w1, ow, &wrong, 2);
  snap_same(&w0, &w1, "a refused load");
  TU_OK(mtopt_optimizer_load(ob, path));
  const uint64_t s2 = tu_next(&rng);
  tu_rng_t r1, r2;
  tu_rng_init(&r1, s2);
  tu_rng_init(&r2, s2);
  for (int step = 0; step < 3; step++) {
    set_grads(ta, 1, &r1, 1.0f);
    set_grads(tb, 1, &r2, 1.0f);
    TU_OK(mtopt_optimizer_step(oa));
    TU_OK(mtopt_optimizer_step(ob));
  }
  snap_t sa, sb;
  snap_take(&sa, oa, &a, 2);
  snap_take(&sb, ob, &b, 2);
  snap_same(&sa, &sb, "resumed vs uninterrupted");
  mtopt_step_info_t ia = MTOPT_STEP_INFO_INIT, ib = MTOPT_STEP_INFO_INIT;
  TU_OK(mtopt_optimizer_get_step_info(oa, &ia));
  TU_OK(mtopt_optimizer_get_step_info(ob, &ib));
  ck_assert_int_eq(ia.step, 6);
  ck_assert_int_eq(ib.step, 6);
  remove(path);
  close(fd);
  snap_free(&w0);
  snap_free(&w1);
  snap_free(&sa);
  snap_free(&sb);
  drop_opt(oa, la);
  drop_opt(ob, lb);
  drop_opt(ow, lw);
  table_free(&a);
  table_free(&b);
  table_free(&wrong);
  TU_OK(mtopt_context_destroy(ctx));
}
END_TEST

/* The CUDA backend against the CPU one on the same mixed table: bit for bit
 * for element-wise steps in every dtype combination and rounding mode (the
 * same functions of step_elem.h on both); the reductions of clipping and
 * LAMB are summed in another order, so there to a tolerance. On the CPU
 * backend this test has nothing to compare and passes. _i: kind x stats. */
START_TEST(test_cpu_equals_cuda) {
  if (tu_backend() != MTOPT_BACKEND_CUDA) return;
  const int kind = _i % 8;
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 809u * (uint64_t)_i);
  int p[MAXT], g[MAXT];
  static const int dts[3] = {MTOPT__DT_F32, MTOPT__DT_BF16, MTOPT__DT_F16};
  for (int i = 0; i < MAXT; i++) {
    p[i] = dts[i % 3];
    g[i] = dts[(i / 3) % 3];
  }
  table_t h, d;
  table_make(&h, &rng, MTOPT_BACKEND_CPU, MAXT, p, g, NULL);
  table_fill_w(&h, &rng);
  table_make(&d, &rng, MTOPT_BACKEND_CUDA, MAXT, p, g, h.numel);
  copy_w(&d, &h);
  mtopt_context_t *ch = tu_context(MTOPT_BACKEND_CPU), *cd = tu_context(MTOPT_BACKEND_CUDA);
  mtopt_optimizer_config_t c = kind_config(kind);
  c.master_weights = MTOPT_MASTER_F32;
  c.state_dtype = MTOPT_DTYPE_BF16;
  c.rounding = MTOPT_ROUNDING_STOCHASTIC;
  c.seed = tu_seed();
  mtopt_tensor_list_t *lh, *ld;
  mtopt_optimizer_t *oh = make_opt(ch, &h, &c, &lh), *od = make_opt(cd, &d, &c, &ld);
  table_t *both[2] = {&h, &d};
  exact_run = kind < 4 && kind != 3;
  for (int step = 1; step <= STEPS; step++) {
    set_grads(both, 2, &rng, 1.0f);
    TU_OK(mtopt_optimizer_step(oh));
    TU_OK(mtopt_optimizer_step(od));
  }
  snap_t sh, sd;
  snap_take(&sh, oh, &h, kind % 4 == 2 ? 1 : 2);
  snap_take(&sd, od, &d, kind % 4 == 2 ? 1 : 2);
  if (exact_run) {
    snap_same(&sh, &sd, "CPU vs CUDA");
  } else {
    for (int i = 0; i < MAXT; i++) { /* weights, as fp32 values */
      float *x = malloc((size_t)h.numel[i] * 4), *y = malloc((size_t)h.numel[i] * 4);
      get(MTOPT_BACKEND_CPU, x, h.w[i], p[i], h.numel[i]);
      get(MTOPT_BACKEND_CUDA, y, d.w[i], p[i], h.numel[i]);
      const tu_err_t e = tu_compare_f(y, x, h.numel[i], 1e-2, 1e-2); /* bf16/f16 ulps */
      ck_assert_msg(e.n_bad == 0, "tensor %d: %lld far apart", i, (long long)e.n_bad);
      free(x);
      free(y);
    }
  }
  snap_free(&sh);
  snap_free(&sd);
  drop_opt(oh, lh);
  drop_opt(od, ld);
  table_free(&h);
  table_free(&d);
  TU_OK(mtopt_context_destroy(ch));
  TU_OK(mtopt_context_destroy(cd));
}
END_TEST

/* Bad mixed-precision input: a clear status, nothing built. */
START_TEST(test_bad_configs) {
  tu_rng_t rng;
  const mtopt_backend_t be = tu_backend();
  mtopt_context_t *ctx = begin(&rng, 503);
  int p[2] = {MTOPT__DT_F16, MTOPT__DT_BF16}, g[2] = {MTOPT__DT_F16, MTOPT__DT_F32};
  table_t a;
  table_make(&a, &rng, be, 2, p, g, NULL);
  table_fill_w(&a, &rng);
  mtopt_tensor_list_t *l;
  TU_OK(mtopt_tensor_list_create(ctx, &l));
  for (int i = 0; i < 2; i++) {
    mtopt_tensor_desc_t d = MTOPT_TENSOR_DESC_INIT;
    d.param = a.w[i];
    d.grad = a.g[i];
    d.numel = a.numel[i];
    d.param_dtype = (mtopt_dtype_t)p[i];
    d.grad_dtype = (mtopt_dtype_t)g[i];
    TU_OK(mtopt_tensor_list_add(l, &d, NULL));
  }
  struct {
    const char *needle;
    mtopt_master_t master;
    mtopt_dtype_t state;
    mtopt_rounding_t rounding;
  } bad[] = {
      {"REMAINDER needs BF16", MTOPT_MASTER_REMAINDER, MTOPT_DTYPE_F32, MTOPT_ROUNDING_NEAREST},
      {"master_weights", (mtopt_master_t)3, MTOPT_DTYPE_F32, MTOPT_ROUNDING_NEAREST},
      {"state_dtype", MTOPT_MASTER_NONE, MTOPT_DTYPE_F16, MTOPT_ROUNDING_NEAREST},
      {"state_dtype", MTOPT_MASTER_NONE, MTOPT_DTYPE_U16, MTOPT_ROUNDING_NEAREST},
      {"rounding", MTOPT_MASTER_NONE, MTOPT_DTYPE_F32, (mtopt_rounding_t)2},
  };
  for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
    mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
    c.master_weights = bad[k].master;
    c.state_dtype = bad[k].state;
    c.rounding = bad[k].rounding;
    mtopt_optimizer_t *o = NULL;
    ck_assert_int_eq(mtopt_optimizer_create(ctx, l, &c, &o), MTOPT_STATUS_INVALID_ARGUMENT);
    ck_assert_msg(strstr(mtopt_last_error(), bad[k].needle) != NULL, "'%s' does not name '%s'",
                  mtopt_last_error(), bad[k].needle);
    ck_assert_ptr_null(o);
  }
  /* A good one: state buffers report their dtypes; F32 tensors have no master. */
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  c.master_weights = MTOPT_MASTER_F32;
  c.state_dtype = MTOPT_DTYPE_BF16;
  mtopt_optimizer_t *o = NULL;
  TU_OK(mtopt_optimizer_create(ctx, l, &c, &o));
  mtopt_dtype_t dt = MTOPT_DTYPE_U16;
  TU_OK(mtopt_optimizer_get_state_dtype(o, 1, MTOPT_STATE_EXP_AVG, &dt));
  ck_assert_int_eq(dt, MTOPT_DTYPE_BF16);
  ck_assert_int_eq(mtopt_optimizer_get_state_dtype(o, 1, MTOPT_STATE_MOMENTUM, &dt),
                   MTOPT_STATUS_INVALID_ARGUMENT);
  void *gb = NULL;
  int64_t gn = 0;
  TU_OK(mtopt_optimizer_get_grad_buffer(o, &gb, &gn)); /* user gradients: none */
  ck_assert_ptr_null(gb);
  drop_opt(o, l);
  table_free(&a);
  TU_OK(mtopt_context_destroy(ctx));
}
END_TEST

Suite *dtypes_suite(void) {
  Suite *s = suite_create("dtypes");
  TCase *tc = tcase_create("masters");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_master_f32_is_fp32, 0, 48);
  tcase_add_loop_test(tc, test_remainder_is_master_f32, 0, 8);
  tcase_add_test(tc, test_stochastic_invariance);
  tcase_add_test(tc, test_stochastic_steps);
  tcase_add_loop_test(tc, test_no_master_one_step, 0, 8);
  tcase_add_loop_test(tc, test_skip_changes_nothing, 0, 3);
  tcase_add_test(tc, test_mixed_table);
  tcase_add_test(tc, test_bad_configs);
  tcase_add_test(tc, test_checkpoint_resume);
  tcase_add_loop_test(tc, test_cpu_equals_cuda, 0, 8);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_main(dtypes_suite()); }

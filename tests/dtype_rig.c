/* Helpers of the mixed-precision suites: dtype_rig.h says what each does. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype_rig.h"


size_t esize(int dt) { return (size_t)mtopt__dt_size(dt); }

void *alloc_at(mtopt_backend_t be, int64_t n, int dt, int skew, void **mem) {
  *mem = tu_alloc(be, (size_t)(n + 16) * esize(dt));
  return (char *)*mem + (size_t)skew * esize(dt);
}

/* Host fp32 values into a backend array of dtype dt, rounded to nearest. */
void put(mtopt_backend_t be, void *dst, int dt, const float *x, int64_t n) {
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
void get(mtopt_backend_t be, float *x, const void *src, int dt, int64_t n) {
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
void table_make(table_t *t, tu_rng_t *rng, mtopt_backend_t be, int n, const int *pdt,
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
void copy_w(table_t *dst, const table_t *src) {
  for (int i = 0; i < src->n; i++) {
    float *x = malloc((size_t)src->numel[i] * 4);
    get(src->be, x, src->w[i], src->pdt[i], src->numel[i]);
    put(dst->be, dst->w[i], dst->pdt[i], x, src->numel[i]);
    free(x);
  }
}

void table_cycles(table_t *t, tu_rng_t *rng, mtopt_backend_t be, const int *pdt, int np,
                  const int *gdt, int ng) {
  int p[MAXT], g[MAXT];
  for (int i = 0; i < MAXT; i++) {
    p[i] = pdt[i % np];
    g[i] = gdt[i % ng];
  }
  table_make(t, rng, be, MAXT, p, g, NULL);
  table_fill_w(t, rng);
}

/* Random weights in [-2, 2), rounded into each tensor's dtype. */
void table_fill_w(table_t *t, tu_rng_t *rng) {
  for (int i = 0; i < t->n; i++) {
    float *x = malloc((size_t)t->numel[i] * 4);
    tu_fill(rng, x, t->numel[i], -2.0f, 2.0f);
    put(t->be, t->w[i], t->pdt[i], x, t->numel[i]);
    free(x);
  }
}

void table_free(table_t *t) {
  for (int i = 0; i < t->n; i++) {
    tu_free(t->be, t->wmem[i]);
    tu_free(t->be, t->gmem[i]);
  }
}

/* A table of t's sizes and weights in other dtypes (twin of t). */
void table_like(table_t *f, const table_t *t, tu_rng_t *rng, int pdt, int gdt) {
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
void set_grads(table_t *const *ts, int k, tu_rng_t *rng, float scale) {
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

mtopt_optimizer_t *make_opt(mtopt_context_t *ctx, const table_t *t,
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

void drop_opt(mtopt_optimizer_t *opt, mtopt_tensor_list_t *list) {
  TU_OK(mtopt_optimizer_destroy(opt));
  TU_OK(mtopt_tensor_list_destroy(list));
}

/* A test's rng (seeded from the run's seed and a salt) and context. */
mtopt_context_t *begin(tu_rng_t *rng, uint64_t salt) {
  tu_rng_init(rng, tu_seed() + salt);
  return tu_context(tu_backend());
}

/* Destroys two optimizers, their tables and the context. */
void finish2(mtopt_context_t *ctx, mtopt_optimizer_t *oa, mtopt_tensor_list_t *la,
             table_t *a, mtopt_optimizer_t *ob, mtopt_tensor_list_t *lb, table_t *b) {
  drop_opt(oa, la);
  drop_opt(ob, lb);
  table_free(a);
  table_free(b);
  TU_OK(mtopt_context_destroy(ctx));
}

mtopt_optimizer_config_t kind_config(int k) {
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

const mtopt_state_t state_of_kind[4][2] = {
    {MTOPT_STATE_EXP_AVG, MTOPT_STATE_EXP_AVG_SQ},
    {MTOPT_STATE_EXP_AVG, MTOPT_STATE_EXP_AVG_SQ},
    {MTOPT_STATE_MOMENTUM, MTOPT_STATE_MOMENTUM},
    {MTOPT_STATE_EXP_AVG, MTOPT_STATE_EXP_AVG_SQ}};

int exact_run;

/* Asserts two host arrays are equal bit for bit (or, !exact_run, close). */
void same_bits(const float *a, const float *b, int64_t n, const char *what, int tensor,
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
void same_state(mtopt_optimizer_t *a, mtopt_optimizer_t *b, const table_t *t, int kind,
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


void snap_take(snap_t *sn, mtopt_optimizer_t *opt, const table_t *t, int nstate) {
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

void snap_same(const snap_t *a, const snap_t *b, const char *what) {
  for (int i = 0; i < a->n; i++)
    for (int k = 0; k < 4; k++) {
      ck_assert_int_eq(a->bytes[i][k], b->bytes[i][k]);
      if (a->bytes[i][k])
        ck_assert_msg(memcmp(a->buf[i][k], b->buf[i][k], a->bytes[i][k]) == 0,
                      "%s: tensor %d array %d differs", what, i, k);
    }
}

void snap_free(snap_t *sn) {
  for (int i = 0; i < sn->n; i++)
    for (int k = 0; k < 4; k++) free(sn->buf[i][k]);
}


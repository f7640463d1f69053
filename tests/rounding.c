/* Rounding in mixed precision through the public API (CPU backend;
 * MTOPT_TEST_BACKEND=cuda runs it on CUDA): without masters one step is the
 * fp32 step of the upcast values rounded (to nearest even, or stochastically
 * to a neighbour); stochastic rounding's bits depend on (seed, step, tensor,
 * element) alone (not on chunking or threads) and are fresh every step
 * (unbiased over steps); a checkpoint carries all of it, so a resumed run
 * rounds as the uninterrupted one; and the CUDA backend gives the CPU's bits.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dtype_rig.h"

/* Stochastic rounding's bits come from (seed, step, tensor, element) alone:
 * the same with chunks of 64 and of 4096 elements and with 1 or 3 threads;
 * another seed gives other bits. All-BF16 (params, grads, state), AdamW. */
START_TEST(test_stochastic_invariance) {
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 101);
  const mtopt_backend_t be = tu_backend();
  table_t t[4];
  table_cycles(&t[0], &rng, be, CYCLE(MTOPT__DT_BF16), CYCLE(MTOPT__DT_BF16));
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
  table_t a, f;
  table_cycles(&a, &rng, be, CYCLE(MTOPT__DT_BF16), CYCLE(MTOPT__DT_F16, MTOPT__DT_BF16));
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

/* Checkpoints carry dtypes, masters or remainders, state dtype, seed and step:
 * a run saved at step 3 and resumed in another optimizer rounds as the
 * uninterrupted run, bit for bit; an optimizer of another dtype layout
 * refuses the file and is left as it was. */
START_TEST(test_checkpoint_resume) {
  tu_rng_t rng;
  const mtopt_backend_t be = tu_backend();
  mtopt_context_t *ctx = begin(&rng, 701);
  table_t a, b, wrong;
  table_cycles(&a, &rng, be, CYCLE(MTOPT__DT_BF16, MTOPT__DT_F32, MTOPT__DT_BF16),
               CYCLE(MTOPT__DT_BF16, MTOPT__DT_F32));
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
  ck_assert_msg(strstr(mtopt_last_error(), "saved with state_dtype BF16, master_weights "
                                           "remainder, rounding stochastic; this optimizer "
                                           "has F32, remainder, stochastic") != NULL,
                "%s", mtopt_last_error());
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

/* Destroys what a CPU-against-CUDA test made: each side's snapshot, optimizer,
 * table and context. */
static void finish_pair(mtopt_context_t *ch, mtopt_optimizer_t *oh, mtopt_tensor_list_t *lh,
                        table_t *h, snap_t *sh, mtopt_context_t *cd, mtopt_optimizer_t *od,
                        mtopt_tensor_list_t *ld, table_t *d, snap_t *sd) {
  snap_free(sh);
  snap_free(sd);
  drop_opt(oh, lh);
  drop_opt(od, ld);
  table_free(h);
  table_free(d);
  TU_OK(mtopt_context_destroy(ch));
  TU_OK(mtopt_context_destroy(cd));
}

/* The CUDA backend against the CPU one on the same mixed table: bit for bit
 * for element-wise steps in every dtype combination and rounding mode (the
 * same functions of step_elem.h on both); the reductions of clipping and
 * LAMB are summed in another order, so there to a tolerance. On the CPU
 * backend this test has nothing to compare and passes. _i < 8: kind x stats,
 * fp32 masters, bf16 state, stochastic rounding, tensors of up to 5000
 * elements. _i >= 8: AdamW, Adam, SGD over tensors of up to 200,001
 * elements, whose chunks the CUDA update cuts into slices (step_kernels.cuh:
 * slices_of) in each of its mixed flavours: bf16 state, stochastic and to
 * nearest, no masters; fp32 state with fp32 masters; fp32 state, no masters,
 * stochastic; bf16 state, stochastic, with fp32 masters (sliced for AdamW
 * and Adam since perf_notes_mixed.md v22, whole chunks for SGD). */
START_TEST(test_cpu_equals_cuda) {
  if (tu_backend() != MTOPT_BACKEND_CUDA) return;
  const int large = _i >= 8;
  const int kind = large ? (_i - 8) % 3 : _i % 8;
  const int layout = large ? (_i - 8) / 3 : 0; /* 0, 1, 4: bf16 state; 2, 3: fp32 state */
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 809u * (uint64_t)_i);
  int p[MAXT], g[MAXT];
  static const int dts[3] = {MTOPT__DT_F32, MTOPT__DT_BF16, MTOPT__DT_F16};
  for (int i = 0; i < MAXT; i++) { /* layout 3: 2-byte weights only (kFlavourMixedNarrowW) */
    p[i] = layout == 3 ? dts[1 + i % 2] : dts[i % 3];
    g[i] = dts[(i / 3) % 3];
  }
  table_t h, d;
  static const int64_t big[MAXT] = {70001, 140003, 65537, 33333, 200001, 1, 98765, 131073, 17};
  table_make(&h, &rng, MTOPT_BACKEND_CPU, MAXT, p, g, large ? big : NULL);
  table_fill_w(&h, &rng);
  table_make(&d, &rng, MTOPT_BACKEND_CUDA, MAXT, p, g, h.numel);
  copy_w(&d, &h);
  mtopt_context_t *ch = tu_context(MTOPT_BACKEND_CPU), *cd = tu_context(MTOPT_BACKEND_CUDA);
  mtopt_optimizer_config_t c = kind_config(kind);
  c.master_weights = large && layout != 2 && layout != 4 ? MTOPT_MASTER_NONE : MTOPT_MASTER_F32;
  c.state_dtype = layout < 2 || layout == 4 ? MTOPT_DTYPE_BF16 : MTOPT_DTYPE_F32;
  c.rounding = layout == 1 || layout == 2 ? MTOPT_ROUNDING_NEAREST : MTOPT_ROUNDING_STOCHASTIC;
  c.seed = tu_seed();
  if (large) c.chunk_size = 0; /* the library's choice: 65536 here */
  mtopt_tensor_list_t *lh, *ld;
  mtopt_optimizer_t *oh = make_opt(ch, &h, &c, &lh), *od = make_opt(cd, &d, &c, &ld);
  if (large) { /* chunks long enough to be cut into slices (kSliceLenNarrow and kSliceLen) */
    mtopt_optimizer_info_t info = MTOPT_OPTIMIZER_INFO_INIT;
    TU_OK(mtopt_optimizer_get_info(od, &info));
    ck_assert_int_eq(info.chunk_size, 65536);
    ck_assert_int_gt(info.total_numel / info.num_chunks, 16384);
  }
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
  finish_pair(ch, oh, lh, &h, &sh, cd, od, ld, &d, &sd);
}
END_TEST

/* The CUDA vector path rounds its bf16 stores with the hardware's conversion
 * (mixed_vec.cuh: pack_bf16x8), and its bits must be dtype.h's for every
 * class of fp32 value. A step with lr 0 keeps the fp32 masters and writes
 * each parameter as its master rounded to nearest. The masters, written raw
 * into their buffer: random fp32 patterns of every exponent (a NaN in about
 * one group of 8 in 40), subnormals, exact ties and their neighbours, values
 * on both sides of the largest bf16 (from 0x7f7f8000 they round to inf),
 * infinities and zeros of both signs. The parameters, poisoned before the
 * step, must be mtopt__f32_to_bf16 of the masters, which the step leaves as
 * they were (lr 0: w + -0; a NaN may come back quieted). On the CPU backend
 * it checks the element path the same way. */
START_TEST(test_bf16_store_bits) {
  const mtopt_backend_t be = tu_backend();
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 313);
  const int64_t n = (INT64_C(1) << 18) + 13;
  float *master = malloc((size_t)n * 4), *grad = malloc((size_t)n * 4);
  uint32_t *before = malloc((size_t)n * 4);
  uint16_t *want = malloc((size_t)n * 2), *got = malloc((size_t)n * 2);
  for (int64_t i = 0; i < n; i++) {
    const uint32_t r = (uint32_t)tu_next(&rng), sign = r & 0x80000000u;
    uint32_t b = (uint32_t)tu_next(&rng);
    switch (i % 7) {
      case 0: break; /* any pattern, inf and NaN included */
      case 1: b = sign | (b & 0x007fffffu); break; /* subnormal */
      case 2: b = (b & 0xffff0000u) | 0x8000u; break; /* a tie */
      case 3: b = (b & 0xffff0000u) | ((r & 1u) ? 0x7fffu : 0x8001u); break; /* beside one */
      case 4: b = sign | 0x7f7f0000u | (b & 0xffffu); break; /* around the largest bf16 */
      case 5: b = sign | 0x7f800000u; break; /* +-inf */
      default: b = sign; break; /* +-0 */
    }
    master[i] = mtopt__bits_f32(b);
    before[i] = b;
    grad[i] = (float)tu_uniform(&rng, 0.5, 1.0); /* > 0: the update is -0, p + -0 == p */
  }
  uint16_t *w = tu_alloc(be, (size_t)n * 2);
  float *g = tu_alloc(be, (size_t)n * 4);
  tu_to_backend(be, g, grad, (size_t)n * 4);
  mtopt_context_t *ctx = tu_context(be);
  mtopt_tensor_list_t *l = NULL;
  TU_OK(mtopt_tensor_list_create(ctx, &l));
  mtopt_tensor_desc_t d = MTOPT_TENSOR_DESC_INIT;
  d.param = w;
  d.grad = g;
  d.numel = n;
  d.param_dtype = MTOPT_DTYPE_BF16;
  TU_OK(mtopt_tensor_list_add(l, &d, NULL));
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  c.lr = 0.0f;
  c.weight_decay = 0.0f;
  c.master_weights = MTOPT_MASTER_F32;
  mtopt_optimizer_t *o = NULL;
  TU_OK(mtopt_optimizer_create(ctx, l, &c, &o));
  void *mw = NULL;
  TU_OK(mtopt_optimizer_get_state(o, 0, MTOPT_STATE_MASTER, &mw));
  tu_to_backend(be, mw, master, (size_t)n * 4);
  for (int64_t i = 0; i < n; i++) got[i] = 0xA5A5u; /* poison */
  tu_to_backend(be, w, got, (size_t)n * 2);
  TU_OK(mtopt_optimizer_step(o));
  TU_OK(mtopt_context_synchronize(ctx));
  tu_to_host(be, got, w, (size_t)n * 2);
  tu_to_host(be, master, mw, (size_t)n * 4);
  int64_t nan = 0, inf = 0;
  for (int64_t i = 0; i < n; i++) {
    const uint32_t after = mtopt__f32_bits(master[i]);
    ck_assert_msg(isnan(mtopt__bits_f32(before[i])) ? isnan(master[i]) : after == before[i],
                  "element %lld: the lr-0 step changed master 0x%08x to 0x%08x", (long long)i,
                  (unsigned)before[i], (unsigned)after);
    want[i] = mtopt__f32_to_bf16(master[i]);
    nan += isnan(master[i]);
    inf += (want[i] & 0x7fffu) == 0x7f80u;
  }
  ck_assert_int_gt(nan, 100); /* the classes are there */
  ck_assert_int_gt(inf, 10000);
  for (int64_t i = 0; i < n; i++)
    ck_assert_msg(got[i] == want[i], "element %lld: master 0x%08x rounds to 0x%04x, step wrote 0x%04x",
                  (long long)i, (unsigned)mtopt__f32_bits(master[i]), want[i], got[i]);
  TU_OK(mtopt_optimizer_destroy(o));
  TU_OK(mtopt_tensor_list_destroy(l));
  TU_OK(mtopt_context_destroy(ctx));
  tu_free(be, w);
  tu_free(be, g);
  free(master);
  free(before);
  free(grad);
  free(want);
  free(got);
}
END_TEST

/* The same for stochastic rounding, where no master holds the values: bf16
 * everywhere (parameters, gradients, state), AdamW, two steps on both
 * backends from the same raw parameter bits of every class (any pattern,
 * signalling NaNs included, subnormals, around the largest bf16, infinities,
 * zeros) and gradients with an inf or a NaN in about one element of 50.
 * Every value a step writes must be the CPU's, bit for bit, in the groups
 * of 8 that hold a NaN too (their other values take dtype.h's path); a NaN
 * must be a quiet NaN on both, its payload aside (arithmetic on a NaN gives
 * the CPU's payload on the CPU and another on the GPU). */
START_TEST(test_bf16_sr_store_bits) {
  if (tu_backend() != MTOPT_BACKEND_CUDA) return;
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 4391);
  const int dt[2] = {MTOPT__DT_BF16, MTOPT__DT_BF16};
  static const int64_t numel[2] = {70001, 33339};
  table_t h, d;
  table_make(&h, &rng, MTOPT_BACKEND_CPU, 2, dt, dt, numel);
  table_make(&d, &rng, MTOPT_BACKEND_CUDA, 2, dt, dt, numel);
  for (int i = 0; i < 2; i++) {
    const int64_t n = numel[i];
    uint16_t *w = malloc((size_t)n * 2);
    float *g = malloc((size_t)n * 4);
    for (int64_t e = 0; e < n; e++) {
      const uint16_t r = (uint16_t)tu_next(&rng), sign = r & 0x8000u;
      uint16_t b = (uint16_t)tu_next(&rng);
      switch (e % 7) {
        case 0: break; /* any pattern, inf and NaN included */
        case 1: b = sign | (b & 0x007fu); break; /* subnormal */
        case 2: b = sign | 0x7f70u | (b & 0xfu); break; /* around the largest bf16 */
        case 3: b = sign | 0x7f80u; break; /* +-inf */
        case 4: b = sign; break; /* +-0 */
        default: b = sign | 0x3f00u | (b & 0x01ffu); break; /* ordinary */
      }
      w[e] = b;
      g[e] = (float)tu_uniform(&rng, -1.0, 1.0);
      if (tu_next(&rng) % 50 == 0) g[e] = (tu_next(&rng) & 1) ? INFINITY : NAN;
    }
    tu_to_backend(MTOPT_BACKEND_CPU, h.w[i], w, (size_t)n * 2);
    tu_to_backend(MTOPT_BACKEND_CUDA, d.w[i], w, (size_t)n * 2);
    put(MTOPT_BACKEND_CPU, h.g[i], MTOPT__DT_BF16, g, n);
    put(MTOPT_BACKEND_CUDA, d.g[i], MTOPT__DT_BF16, g, n);
    free(w);
    free(g);
  }
  mtopt_context_t *ch = tu_context(MTOPT_BACKEND_CPU), *cd = tu_context(MTOPT_BACKEND_CUDA);
  mtopt_optimizer_config_t c = kind_config(0);
  c.state_dtype = MTOPT_DTYPE_BF16;
  c.rounding = MTOPT_ROUNDING_STOCHASTIC;
  c.seed = tu_seed();
  c.chunk_size = 0;
  mtopt_tensor_list_t *lh, *ld;
  mtopt_optimizer_t *oh = make_opt(ch, &h, &c, &lh), *od = make_opt(cd, &d, &c, &ld);
  for (int step = 0; step < 2; step++) {
    TU_OK(mtopt_optimizer_step(oh));
    TU_OK(mtopt_optimizer_step(od));
  }
  snap_t sh, sd;
  snap_take(&sh, oh, &h, 2);
  snap_take(&sd, od, &d, 2);
  int64_t nan = 0, inf = 0;
  for (int i = 0; i < 2; i++) {
    for (int k = 0; k < 3; k++) { /* the parameter (bf16 bits), m and v (read as fp32) */
      const int wide = k > 0;
      for (int64_t e = 0; e < numel[i]; e++) {
        const uint32_t a = wide ? ((const uint32_t *)sh.buf[i][k])[e] >> 16
                                : ((const uint16_t *)sh.buf[i][k])[e];
        const uint32_t b = wide ? ((const uint32_t *)sd.buf[i][k])[e] >> 16
                                : ((const uint16_t *)sd.buf[i][k])[e];
        const int qa = (a & 0x7fffu) > 0x7f80u && (a & 0x0040u);
        const int qb = (b & 0x7fffu) > 0x7f80u && (b & 0x0040u);
        nan += qa;
        inf += (a & 0x7fffu) == 0x7f80u;
        ck_assert_msg(a == b || (qa && qb),
                      "tensor %d array %d element %lld: CPU 0x%04x, CUDA 0x%04x", i, k,
                      (long long)e, (unsigned)a, (unsigned)b);
      }
    }
  }
  ck_assert_int_gt(nan, 1000); /* the classes are there */
  ck_assert_int_gt(inf, 1000);
  finish_pair(ch, oh, lh, &h, &sh, cd, od, ld, &d, &sd);
}
END_TEST

Suite *rounding_suite(void) {
  Suite *s = suite_create("rounding");
  TCase *tc = tcase_create("rounding");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_stochastic_invariance);
  tcase_add_test(tc, test_stochastic_steps);
  tcase_add_loop_test(tc, test_no_master_one_step, 0, 8);
  tcase_add_test(tc, test_checkpoint_resume);
  tcase_add_loop_test(tc, test_cpu_equals_cuda, 0, 23);
  tcase_add_test(tc, test_bf16_store_bits);
  tcase_add_test(tc, test_bf16_sr_store_bits);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_main(rounding_suite()); }

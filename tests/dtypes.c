/* Mixed precision through the public API (CPU backend; MTOPT_TEST_BACKEND=cuda
 * runs it on CUDA): F16/BF16 parameters and gradients in any mix, fp32 master
 * weights and bf16 remainders. The references are the fp32 optimizer and the
 * formats of dtype.h (tested on their own in dtype_convert.c):
 *  - MASTER_F32: the masters step exactly as an fp32 optimizer stepping fp32
 *    copies of the parameters on the gradients converted to fp32, bit for bit,
 *    and each parameter is its master rounded to nearest even;
 *  - REMAINDER: the same masters and state as MASTER_F32, bit for bit; the
 *    parameters the same except at exact ties (rounded away from zero);
 *  - a skipped step changes nothing, masters and remainders included;
 *  - a mixed table steps each tensor as it would alone;
 *  - bad configurations are refused.
 * Rounding (stochastic, without masters), checkpoints and CPU == CUDA are in
 * rounding.c. Sizes are odd, starts misaligned, values random; outputs are
 * compared after every step. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtype_rig.h"

/* _i: kind (0..7: AdamW, Adam, SGD, LAMB, then the same with clipping) x
 * parameter dtype (BF16, F16) x gradient dtype (F32, BF16, F16). */
START_TEST(test_master_f32_is_fp32) {
  const int kind = _i % 8, pdt = (_i / 8) % 2 ? MTOPT__DT_F16 : MTOPT__DT_BF16, gsel = _i / 16;
  const int gdt = gsel == 0 ? MTOPT__DT_F32 : gsel == 1 ? MTOPT__DT_BF16 : MTOPT__DT_F16;
  tu_rng_t rng;
  const mtopt_backend_t be = tu_backend();
  mtopt_context_t *ctx = begin(&rng, 31u * (uint64_t)_i);
  table_t a, f;
  table_cycles(&a, &rng, be, CYCLE(pdt), CYCLE(gdt));
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
  table_t a, b;
  table_cycles(&a, &rng, be, CYCLE(MTOPT__DT_BF16), CYCLE(MTOPT__DT_F32, MTOPT__DT_BF16));
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
  table_t a, single;
  table_cycles(&a, &rng, be, CYCLE(MTOPT__DT_BF16, MTOPT__DT_F32, MTOPT__DT_BF16),
               CYCLE(MTOPT__DT_BF16, MTOPT__DT_F32, MTOPT__DT_BF16));
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
  tcase_add_loop_test(tc, test_skip_changes_nothing, 0, 3);
  tcase_add_test(tc, test_mixed_table);
  tcase_add_test(tc, test_bad_configs);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_main(dtypes_suite()); }

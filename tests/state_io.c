/* Moving an optimizer's state in and out through the public API (CPU backend;
 * MTOPT_TEST_BACKEND=cuda runs it on CUDA), what a front end resuming from
 * state saved elsewhere (a torch state_dict) needs:
 *  - write_state + set_step_count: an optimizer built fresh and given another
 *    one's parameters, state and masters (as read_state gives them) and its
 *    step count steps on bit for bit as the original, in every kind and
 *    dtype layout, stochastic rounding included (its keys follow the step);
 *  - set_group: multipliers set on a live optimizer act as the list's did at
 *    create, take effect at the next step, and checkpoints carry them;
 *  - bad calls are refused and change nothing. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dtype_rig.h"
#include "fuzz/ckpt_bytes.h"

/* Layouts: fp32; bf16 with fp32 masters; bf16 with remainders; bf16 params
 * and state, nearest; the same, stochastic; f16 params with fp32 masters and
 * bf16 state. Each table mixes in two fp32 tensors. */
enum { NLAYOUTS = 6 };

static mtopt_optimizer_config_t layout_config(int kind, int layout, int *pdt) {
  mtopt_optimizer_config_t c = kind_config(kind);
  static const int pd[NLAYOUTS] = {MTOPT__DT_F32,  MTOPT__DT_BF16, MTOPT__DT_BF16,
                                   MTOPT__DT_BF16, MTOPT__DT_BF16, MTOPT__DT_F16};
  static const mtopt_master_t mw[NLAYOUTS] = {MTOPT_MASTER_NONE, MTOPT_MASTER_F32,
                                              MTOPT_MASTER_REMAINDER, MTOPT_MASTER_NONE,
                                              MTOPT_MASTER_NONE, MTOPT_MASTER_F32};
  *pdt = pd[layout];
  c.master_weights = mw[layout];
  if (layout >= 3) c.state_dtype = MTOPT_DTYPE_BF16;
  if (layout == 4) c.rounding = MTOPT_ROUNDING_STOCHASTIC;
  c.seed = 0x5eedull + (uint64_t)layout;
  return c;
}

static void make_table(table_t *t, tu_rng_t *rng, mtopt_backend_t be, int pdt) {
  table_cycles(t, rng, be, CYCLE(pdt, pdt, pdt, MTOPT__DT_F32),
               CYCLE(MTOPT__DT_BF16, MTOPT__DT_F32));
}

/* Every state buffer (and master) of src's tensor i that it keeps, written
 * into dst's through the host. */
static void move_state(mtopt_optimizer_t *dst, mtopt_optimizer_t *src, const table_t *t) {
  static const mtopt_state_t all[4] = {MTOPT_STATE_EXP_AVG, MTOPT_STATE_EXP_AVG_SQ,
                                       MTOPT_STATE_MOMENTUM, MTOPT_STATE_MASTER};
  for (int i = 0; i < t->n; i++) {
    float *x = malloc((size_t)(t->numel[i] + 1) * 4);
    for (int s = 0; s < 4; s++) {
      void *p;
      if (mtopt_optimizer_get_state(src, i, all[s], &p) != MTOPT_STATUS_SUCCESS) continue;
      tu_poison(x, t->numel[i]);
      TU_OK(mtopt_optimizer_read_state(src, i, all[s], x));
      TU_OK(mtopt_optimizer_write_state(dst, i, all[s], x));
    }
    free(x);
  }
}

static int nstate_of(int kind) { return kind % 4 == 2 ? 1 : 2; }

/* Whether two snapshots' parameters differ anywhere (the control that shows a
 * test could fail). */
static int params_differ(const snap_t *a, const snap_t *b) {
  for (int i = 0; i < a->n; i++)
    if (memcmp(a->buf[i][0], b->buf[i][0], a->bytes[i][0]) != 0) return 1;
  return 0;
}

/* _i: kind (AdamW, Adam, SGD, LAMB) x layout. */
START_TEST(test_resume_from_state) {
  const int kind = _i % 4, layout = _i / 4;
  tu_rng_t rng;
  const mtopt_backend_t be = tu_backend();
  mtopt_context_t *ctx = begin(&rng, 41u * (uint64_t)_i);
  exact_run = 1; /* same tables, same backend: the same order of every sum */
  int pdt;
  const mtopt_optimizer_config_t c = layout_config(kind, layout, &pdt);
  table_t a, b, z;
  make_table(&a, &rng, be, pdt);
  table_like(&b, &a, &rng, -1, -1);
  table_like(&z, &a, &rng, -1, -1);
  mtopt_tensor_list_t *la, *lb = NULL, *lz = NULL;
  mtopt_optimizer_t *oa = make_opt(ctx, &a, &c, &la), *ob = NULL, *oz = NULL;
  table_t *abz[3] = {&a, &b, &z};
  for (int step = 1; step <= 8; step++) {
    if (step == 5) {
      /* b and z take a's parameters and state; z keeps its step count 0 */
      copy_w(&b, &a);
      copy_w(&z, &a);
      ob = make_opt(ctx, &b, &c, &lb);
      oz = make_opt(ctx, &z, &c, &lz);
      move_state(ob, oa, &a);
      move_state(oz, oa, &a);
      TU_OK(mtopt_optimizer_set_step_count(ob, 4));
    }
    set_grads(abz, 3, &rng, 1.0f);
    TU_OK(mtopt_optimizer_step(oa));
    if (step < 5) continue;
    TU_OK(mtopt_optimizer_step(ob));
    TU_OK(mtopt_optimizer_step(oz));
    snap_t sa, sb, sz;
    snap_take(&sa, oa, &a, nstate_of(kind));
    snap_take(&sb, ob, &b, nstate_of(kind));
    snap_same(&sa, &sb, "resumed from written state");
    mtopt_step_info_t info = MTOPT_STEP_INFO_INIT;
    TU_OK(mtopt_optimizer_get_step_info(ob, &info));
    ck_assert_int_eq(info.step, step);
    /* The step count matters (bias correction, the rounding keys): z, at its
     * own count, must differ, else this test could not fail. */
    if (kind != 2 || layout == 4) {
      snap_take(&sz, oz, &z, nstate_of(kind));
      ck_assert_msg(params_differ(&sa, &sz), "step %d: the step count had no effect", step);
      snap_free(&sz);
    }
    snap_free(&sa);
    snap_free(&sb);
  }
  drop_opt(oz, lz);
  table_free(&z);
  finish2(ctx, oa, la, &a, ob, lb, &b);
}
END_TEST

/* set_group on a live optimizer acts as the list's multipliers at create; a
 * change takes effect at the next step (and has an effect). _i: kind. */
START_TEST(test_set_group) {
  tu_rng_t rng;
  const mtopt_backend_t be = tu_backend();
  mtopt_context_t *ctx = begin(&rng, 43u * (uint64_t)_i);
  exact_run = 1;
  int pdt;
  const mtopt_optimizer_config_t c = layout_config(_i, 1, &pdt);
  table_t a, b, z;
  make_table(&a, &rng, be, pdt);
  table_like(&b, &a, &rng, -1, -1);
  table_like(&z, &a, &rng, -1, -1);
  mtopt_tensor_list_t *la, *lb, *lz;
  TU_OK(mtopt_tensor_list_create(ctx, &la));
  mtopt_optimizer_t *oa = NULL;
  for (int i = 0; i < a.n; i++) {
    mtopt_tensor_desc_t d = MTOPT_TENSOR_DESC_INIT;
    d.param = a.w[i], d.grad = a.g[i], d.numel = a.numel[i];
    d.param_dtype = (mtopt_dtype_t)a.pdt[i], d.grad_dtype = (mtopt_dtype_t)a.gdt[i];
    d.flags = i == 1 ? MTOPT_TENSOR_NO_WEIGHT_DECAY : 0u;
    TU_OK(mtopt_tensor_list_add(la, &d, NULL));
  }
  TU_OK(mtopt_tensor_list_set_group(la, 0, 0.5f, 3.0f));
  TU_OK(mtopt_optimizer_create(ctx, la, &c, &oa));
  mtopt_optimizer_t *ob = make_opt(ctx, &b, &c, &lb), *oz = make_opt(ctx, &z, &c, &lz);
  TU_OK(mtopt_optimizer_set_group(ob, 0, 0.5f, 3.0f));
  TU_OK(mtopt_optimizer_set_group(oz, 0, 0.5f, 3.0f));
  table_t *abz[3] = {&a, &b, &z};
  for (int step = 1; step <= 6; step++) {
    if (step == 4) { /* a schedule's change, on a and b only */
      TU_OK(mtopt_optimizer_set_group(oa, 0, 0.125f, 0.0f));
      TU_OK(mtopt_optimizer_set_group(ob, 0, 0.125f, 0.0f));
    }
    set_grads(abz, 3, &rng, 1.0f);
    TU_OK(mtopt_optimizer_step(oa));
    TU_OK(mtopt_optimizer_step(ob));
    TU_OK(mtopt_optimizer_step(oz));
    snap_t sa, sb, sz;
    snap_take(&sa, oa, &a, nstate_of(_i));
    snap_take(&sb, ob, &b, nstate_of(_i));
    snap_take(&sz, oz, &z, nstate_of(_i));
    snap_same(&sa, &sb, "set_group vs the list's multipliers");
    if (step < 4) snap_same(&sa, &sz, "before the change");
    ck_assert_msg(step < 4 || params_differ(&sa, &sz),
                  "step %d: the new multipliers had no effect", step);
    snap_free(&sa);
    snap_free(&sb);
    snap_free(&sz);
  }
  float lm, wm;
  TU_OK(mtopt_optimizer_get_group(ob, 0, &lm, &wm));
  ck_assert(lm == 0.125f && wm == 0.0f);
  TU_OK(mtopt_optimizer_get_group(ob, 63, &lm, &wm));
  ck_assert(lm == 1.0f && wm == 1.0f);
  drop_opt(oz, lz);
  table_free(&z);
  finish2(ctx, oa, la, &a, ob, lb, &b);
}
END_TEST

/* Bad calls: a clear status, and nothing written. */
START_TEST(test_bad_calls) {
  tu_rng_t rng;
  const mtopt_backend_t be = tu_backend();
  mtopt_context_t *ctx = begin(&rng, 47);
  int pdt;
  const mtopt_optimizer_config_t c = layout_config(0, 5, &pdt); /* f16 + fp32 masters */
  table_t a;
  make_table(&a, &rng, be, pdt);
  mtopt_tensor_list_t *la;
  mtopt_optimizer_t *oa = make_opt(ctx, &a, &c, &la);
  table_t *aa[1] = {&a};
  set_grads(aa, 1, &rng, 1.0f);
  TU_OK(mtopt_optimizer_step(oa));
  snap_t before, after;
  snap_take(&before, oa, &a, 2);

  const mtopt_status_t bad = MTOPT_STATUS_INVALID_ARGUMENT;
  TU_FAILS(mtopt_optimizer_set_group(NULL, 0, 1.0f, 1.0f), bad);
  TU_FAILS(mtopt_optimizer_set_group(oa, -1, 1.0f, 1.0f), bad);
  TU_FAILS(mtopt_optimizer_set_group(oa, MTOPT_MAX_GROUPS, 1.0f, 1.0f), bad);
  TU_FAILS(mtopt_optimizer_set_group(oa, 0, NAN, 1.0f), bad);
  TU_FAILS(mtopt_optimizer_set_group(oa, 0, 1.0f, -0.5f), bad);
  TU_FAILS(mtopt_optimizer_set_group(oa, 0, INFINITY, 1.0f), bad);
  ck_assert_ptr_nonnull(strstr(mtopt_last_error(), "multipliers"));
  float lm, wm;
  TU_FAILS(mtopt_optimizer_get_group(oa, 0, NULL, &wm), bad);
  TU_FAILS(mtopt_optimizer_get_group(oa, 64, &lm, &wm), bad);
  TU_FAILS(mtopt_optimizer_set_step_count(oa, -1), bad);
  TU_FAILS(mtopt_optimizer_set_step_count(oa, (INT64_C(1) << 62) + 1), bad);
  TU_FAILS(mtopt_optimizer_set_step_count(NULL, 3), bad);

  const int64_t n = a.numel[2]; /* an f16 tensor with a master */
  float *x = malloc((size_t)(n + 1) * 4);
  tu_fill(&rng, x, n, -1.0f, 1.0f);
  TU_FAILS(mtopt_optimizer_write_state(oa, 2, MTOPT_STATE_EXP_AVG, NULL), bad);
  TU_FAILS(mtopt_optimizer_write_state(oa, 2, MTOPT_STATE_MOMENTUM, x), bad); /* not SGD */
  TU_FAILS(mtopt_optimizer_write_state(oa, 3, MTOPT_STATE_MASTER, x), bad); /* fp32: none */
  TU_FAILS(mtopt_optimizer_write_state(oa, MAXT, MTOPT_STATE_EXP_AVG, x), bad);
  x[n - 1] = NAN;
  TU_FAILS(mtopt_optimizer_write_state(oa, 2, MTOPT_STATE_EXP_AVG, x), bad);
  ck_assert_ptr_nonnull(strstr(mtopt_last_error(), "not finite"));
  x[n - 1] = -1e-3f;
  TU_FAILS(mtopt_optimizer_write_state(oa, 2, MTOPT_STATE_EXP_AVG_SQ, x), bad);
  ck_assert_ptr_nonnull(strstr(mtopt_last_error(), "negative"));
  x[n - 1] = 1.0e5f; /* beyond f16's 65504: the parameter rounded from it */
  TU_FAILS(mtopt_optimizer_write_state(oa, 2, MTOPT_STATE_MASTER, x), bad);
  ck_assert_ptr_nonnull(strstr(mtopt_last_error(), "overflows"));
  free(x);

  snap_take(&after, oa, &a, 2);
  snap_same(&before, &after, "refused calls");
  mtopt_step_info_t info = MTOPT_STEP_INFO_INIT;
  TU_OK(mtopt_optimizer_get_step_info(oa, &info));
  ck_assert_int_eq(info.step, 1);
  snap_free(&before);
  snap_free(&after);
  drop_opt(oa, la);
  table_free(&a);
  TU_OK(mtopt_context_destroy(ctx));
}
END_TEST

/* Checkpoints carry the groups' multipliers (format 4); a format 3 file
 * leaves the loader's own. */
START_TEST(test_checkpoint_groups) {
  tu_rng_t rng;
  const mtopt_backend_t be = tu_backend();
  mtopt_context_t *ctx = begin(&rng, 53);
  int pdt;
  const mtopt_optimizer_config_t c = layout_config(0, 0, &pdt);
  table_t a, b;
  make_table(&a, &rng, be, pdt);
  table_like(&b, &a, &rng, -1, -1);
  mtopt_tensor_list_t *la, *lb;
  mtopt_optimizer_t *oa = make_opt(ctx, &a, &c, &la), *ob = make_opt(ctx, &b, &c, &lb);
  TU_OK(mtopt_optimizer_set_group(oa, 0, 0.25f, 4.0f));
  TU_OK(mtopt_optimizer_set_group(oa, 63, 2.0f, 0.5f));
  char path[64];
  snprintf(path, sizeof path, "/tmp/mtopt-state-io-%d.ckpt", (int)getpid());
  TU_OK(mtopt_optimizer_save(oa, path));
  TU_OK(mtopt_optimizer_load(ob, path));
  float lm, wm;
  TU_OK(mtopt_optimizer_get_group(ob, 0, &lm, &wm));
  ck_assert(lm == 0.25f && wm == 4.0f);
  TU_OK(mtopt_optimizer_get_group(ob, 63, &lm, &wm));
  ck_assert(lm == 2.0f && wm == 0.5f);
  /* the same steps from there */
  table_t *ab[2] = {&a, &b};
  copy_w(&b, &a);
  set_grads(ab, 2, &rng, 1.0f);
  TU_OK(mtopt_optimizer_step(oa));
  TU_OK(mtopt_optimizer_step(ob));
  snap_t sa, sb;
  snap_take(&sa, oa, &a, 2);
  snap_take(&sb, ob, &b, 2);
  snap_same(&sa, &sb, "after loading the groups");
  snap_free(&sa);
  snap_free(&sb);

  /* a multiplier out of range in the file (resealed) is refused */
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  fseek(f, 0, SEEK_END);
  size_t n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *bytes = malloc(n);
  ck_assert_uint_eq(fread(bytes, 1, n, f), n);
  fclose(f);
  const float neg = -1.0f;
  unsigned char *edited = malloc(n);
  memcpy(edited, bytes, n);
  memcpy(edited + CB_GROUPS + 8 * 5, &neg, 4);
  cb_reseal(edited, n);
  f = fopen(path, "wb");
  fwrite(edited, 1, n, f);
  fclose(f);
  TU_FAILS(mtopt_optimizer_load(ob, path), MTOPT_STATUS_INVALID_ARGUMENT);
  free(edited);
  /* format 3: the loader's groups stay */
  TU_OK(mtopt_optimizer_set_group(ob, 0, 0.75f, 1.0f));
  n = cb_downgrade(bytes, n, 3);
  f = fopen(path, "wb");
  fwrite(bytes, 1, n, f);
  fclose(f);
  TU_OK(mtopt_optimizer_load(ob, path));
  TU_OK(mtopt_optimizer_get_group(ob, 0, &lm, &wm));
  ck_assert(lm == 0.75f && wm == 1.0f);
  free(bytes);
  remove(path);
  finish2(ctx, oa, la, &a, ob, lb, &b);
}
END_TEST

int main(void) {
  Suite *s = suite_create("state_io");
  TCase *tc = tcase_create("state_io");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_resume_from_state, 0, 4 * NLAYOUTS);
  tcase_add_loop_test(tc, test_set_group, 0, 4);
  tcase_add_test(tc, test_bad_calls);
  tcase_add_test(tc, test_checkpoint_groups);
  suite_add_tcase(s, tc);
  return tu_main(s);
}

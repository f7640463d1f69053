#include "rig.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int64_t draw_numel(tu_rng_t *rng, const rig_opts_t *o) {
  /* Odd sizes around vector widths and chunk edges, plus random ones. */
  static const int64_t fixed[] = {1, 2, 3, 5, 7, 15, 17, 33, 63, 65, 127, 1000, 4099};
  const int64_t pick = tu_int(rng, 0, 9);
  if (o->allow_empty && pick == 0) return 0;
  if (pick <= 4) {
    const int64_t v = fixed[tu_int(rng, 0, (int64_t)(sizeof fixed / sizeof *fixed) - 1)];
    return v <= o->max_numel ? v : o->max_numel;
  }
  return tu_int(rng, 1, o->max_numel);
}

void rig_build(rig_t *r, tu_rng_t *rng, const mtopt_optimizer_config_t *cfg,
               const rig_opts_t *o) {
  memset(r, 0, sizeof *r);
  r->cfg = *cfg;
  const int64_t n = o->n_tensors;
  r->n = n;
  r->numel = calloc((size_t)n + 1, sizeof *r->numel);
  r->group = calloc((size_t)n + 1, sizeof *r->group);
  r->flags = calloc((size_t)n + 1, sizeof *r->flags);
  r->w_mem = calloc((size_t)n + 1, sizeof(float *));
  r->g_mem = calloc((size_t)n + 1, sizeof(float *));
  r->w = calloc((size_t)n + 1, sizeof(float *));
  r->g = calloc((size_t)n + 1, sizeof(float *));
  int *lib = calloc((size_t)n + 1, sizeof *lib);

  mtopt_context_config_t cc = MTOPT_CONTEXT_CONFIG_INIT;
  cc.num_threads = o->num_threads;
  TU_OK(mtopt_context_create(&cc, &r->ctx));
  TU_OK(mtopt_tensor_list_create(r->ctx, &r->list));
  for (int k = 0; k < MTOPT_MAX_GROUPS; k++) r->lr_mult[k] = r->wd_mult[k] = 1.0f;
  for (int k = 1; k < o->n_groups && k < MTOPT_MAX_GROUPS; k++) {
    r->lr_mult[k] = (float)tu_uniform(rng, 0.25, 2.0);
    r->wd_mult[k] = tu_int(rng, 0, 3) == 0 ? 0.0f : (float)tu_uniform(rng, 0.5, 3.0);
    TU_OK(mtopt_tensor_list_set_group(r->list, k, r->lr_mult[k], r->wd_mult[k]));
  }
  for (int64_t i = 0; i < n; i++) {
    r->numel[i] = draw_numel(rng, o);
    r->group[i] = o->n_groups > 1 ? (int32_t)tu_int(rng, 0, o->n_groups - 1) : 0;
    r->flags[i] = tu_int(rng, 0, 3) == 0 ? MTOPT_TENSOR_NO_WEIGHT_DECAY : 0u;
    lib[i] = o->lib_grads == 1 || (o->lib_grads == 2 && tu_int(rng, 0, 1));
    /* Odd offsets (0..3 floats) so that weights start at every residue mod 16 B. */
    const int64_t off = tu_int(rng, 0, 3);
    r->w_mem[i] = malloc((size_t)(r->numel[i] + 4) * sizeof(float));
    r->w[i] = r->w_mem[i] + off;
    tu_fill(rng, r->w[i], r->numel[i], -1.0f, 1.0f);
    if (!lib[i]) {
      const int64_t goff = tu_int(rng, 0, 3);
      r->g_mem[i] = malloc((size_t)(r->numel[i] + 4) * sizeof(float));
      r->g[i] = r->g_mem[i] + goff;
      tu_poison(r->g[i], r->numel[i]);
    }
    mtopt_tensor_desc_t d = MTOPT_TENSOR_DESC_INIT;
    d.param = r->w[i];
    d.grad = lib[i] ? NULL : r->g[i];
    d.numel = r->numel[i];
    d.flags = r->flags[i];
    d.group = r->group[i];
    char name[32];
    snprintf(name, sizeof name, "t%lld", (long long)i);
    d.name = name;
    int64_t idx = -1;
    TU_OK(mtopt_tensor_list_add(r->list, &d, &idx));
    ck_assert_int_eq(idx, i);
  }
  TU_OK(mtopt_optimizer_create(r->ctx, r->list, cfg, &r->opt));
  for (int64_t i = 0; i < n; i++) {
    void *p = NULL;
    TU_OK(mtopt_optimizer_get_grad(r->opt, i, &p));
    if (lib[i]) {
      r->g[i] = p;
      /* The library's buffer starts zeroed. */
      for (int64_t k = 0; k < r->numel[i]; k++) ck_assert(r->g[i][k] == 0.0f);
    } else {
      ck_assert_ptr_eq(p, r->g[i]);
    }
  }
  const float *const *w0 = (const float *const *)r->w;
  ref_init(&r->ref, cfg, n, r->numel, r->group, r->flags, w0);
  for (int k = 0; k < MTOPT_MAX_GROUPS; k++) {
    r->ref.lr_mult[k] = r->lr_mult[k];
    r->ref.wd_mult[k] = r->wd_mult[k];
  }
  free(lib);
}

void rig_destroy(rig_t *r) {
  TU_OK(mtopt_optimizer_destroy(r->opt));
  TU_OK(mtopt_tensor_list_destroy(r->list));
  TU_OK(mtopt_context_destroy(r->ctx));
  for (int64_t i = 0; i < r->n; i++) {
    free(r->w_mem[i]);
    free(r->g_mem[i]);
  }
  free(r->w_mem);
  free(r->g_mem);
  free(r->w);
  free(r->g);
  free(r->numel);
  free(r->group);
  free(r->flags);
  ref_free(&r->ref);
}

void rig_fill_grads(rig_t *r, tu_rng_t *rng, float scale) {
  for (int64_t i = 0; i < r->n; i++) {
    tu_fill(rng, r->g[i], r->numel[i], -1.0f, 1.0f);
    for (int64_t k = 0; k < r->numel[i]; k++) r->g[i][k] *= scale;
  }
}

void rig_step(rig_t *r) {
  TU_OK(mtopt_optimizer_step(r->opt));
  ref_step(&r->ref, (const float *const *)r->g);
}

void rig_set(rig_t *r, mtopt_hyperparam_t which, double value) {
  TU_OK(mtopt_optimizer_set_hyperparam(r->opt, which, value));
  double back = 0.0;
  TU_OK(mtopt_optimizer_get_hyperparam(r->opt, which, &back));
  ck_assert_msg(back == (double)(float)value, "get_hyperparam(%d) = %g after setting %g",
                (int)which, back, value);
  /* The library keeps fp32 scalars: the reference takes the same value. */
  const double v = (float)value;
  switch (which) {
  case MTOPT_HP_LR: r->ref.lr = v; break;
  case MTOPT_HP_BETA1: r->ref.beta1 = v; break;
  case MTOPT_HP_BETA2: r->ref.beta2 = v; break;
  case MTOPT_HP_EPS: r->ref.eps = v; break;
  case MTOPT_HP_WEIGHT_DECAY: r->ref.weight_decay = v; break;
  case MTOPT_HP_MOMENTUM: r->ref.momentum = v; break;
  case MTOPT_HP_DAMPENING: r->ref.dampening = v; break;
  case MTOPT_HP_MAX_GRAD_NORM: r->ref.max_grad_norm = v; break;
  case MTOPT_HP_LOSS_SCALE: r->ref.loss_scale = (float)v; break;
  default: ck_abort_msg("rig_set: unknown hyperparameter");
  }
}

static int keeps(const rig_t *r, mtopt_state_t s) {
  const int k = r->cfg.kind;
  if (s == MTOPT_STATE_MOMENTUM) return k == MTOPT_OPTIMIZER_SGD && r->cfg.momentum > 0.0f;
  return k != MTOPT_OPTIMIZER_SGD;
}

/* Compares one tensor's values (n of them) with the reference plus its
 * per-element bound; a failure prints the first bad element. */
static void check_values(const float *got, const double *ref, const double *err, int64_t n,
                         double atol, double rtol, const char *msg) {
  const tu_err_t e = tu_compare_bound(got, ref, err, n, atol, rtol);
  if (e.n_bad) {
    const int64_t b = e.first_bad;
    fprintf(stderr, "%s: got %.9g ref %.9g at %lld\n", msg, got[b], ref[b], (long long)b);
  }
  TU_ASSERT_CLOSE(e, msg);
}

static void check_buf(rig_t *r, int64_t i, mtopt_state_t s, const double *ref, const double *err,
                      double atol, double rtol, int step, const char *what) {
  const int64_t n = r->numel[i];
  float *got = malloc((size_t)(n + 1) * sizeof(float));
  tu_poison(got, n);
  TU_OK(mtopt_optimizer_read_state(r->opt, i, s, got));
  void *p = NULL;
  TU_OK(mtopt_optimizer_get_state(r->opt, i, s, &p));
  ck_assert_msg(n == 0 || p != NULL, "get_state gave NULL for tensor %lld", (long long)i);
  ck_assert_msg(tu_first_bit_diff(got, p, n) < 0, "read_state and get_state disagree");
  char msg[128];
  snprintf(msg, sizeof msg, "step %d tensor %lld (numel %lld) %s", step, (long long)i,
           (long long)n, what);
  check_values(got, ref, err, n, atol, rtol, msg);
  free(got);
}

/* The weights' and moments' tolerances add the reference's conditioning
 * bounds per element (reference.h: werr, merr, verr). */
void rig_check(rig_t *r, const rig_tol_t *tol, int step) {
  for (int64_t i = 0; i < r->n; i++) {
    const ref_tensor_t *t = &r->ref.t[i];
    char msg[128];
    snprintf(msg, sizeof msg, "step %d tensor %lld (numel %lld, group %d, flags %u) weights",
             step, (long long)i, (long long)r->numel[i], r->group[i], r->flags[i]);
    check_values(r->w[i], t->w, t->werr, r->numel[i], tol->w_atol, tol->w_rtol, msg);
    if (keeps(r, MTOPT_STATE_EXP_AVG)) {
      check_buf(r, i, MTOPT_STATE_EXP_AVG, t->m, t->merr, tol->s_atol, tol->s_rtol, step,
                "exp_avg");
      check_buf(r, i, MTOPT_STATE_EXP_AVG_SQ, t->v, t->verr, tol->v_atol, tol->v_rtol, step,
                "exp_avg_sq");
    }
    if (keeps(r, MTOPT_STATE_MOMENTUM))
      check_buf(r, i, MTOPT_STATE_MOMENTUM, t->buf, NULL, tol->s_atol, tol->s_rtol, step,
                "momentum_buffer");
  }
}

int64_t rig_total(const rig_t *r) {
  int64_t s = 0;
  for (int64_t i = 0; i < r->n; i++) s += r->numel[i];
  return s;
}

static int nstate(const rig_t *r) {
  return keeps(r, MTOPT_STATE_EXP_AVG) ? 2 : keeps(r, MTOPT_STATE_MOMENTUM) ? 1 : 0;
}

int64_t rig_snapshot_len(const rig_t *r) { return rig_total(r) * (1 + nstate(r)); }

void rig_snapshot(rig_t *r, float *out) {
  int64_t o = 0;
  for (int64_t i = 0; i < r->n; i++) {
    memcpy(out + o, r->w[i], (size_t)r->numel[i] * sizeof(float));
    o += r->numel[i];
  }
  static const mtopt_state_t adam[2] = {MTOPT_STATE_EXP_AVG, MTOPT_STATE_EXP_AVG_SQ};
  for (int s = 0; s < nstate(r); s++) {
    const mtopt_state_t which = keeps(r, MTOPT_STATE_EXP_AVG) ? adam[s] : MTOPT_STATE_MOMENTUM;
    for (int64_t i = 0; i < r->n; i++) {
      TU_OK(mtopt_optimizer_read_state(r->opt, i, which, out + o));
      o += r->numel[i];
    }
  }
}

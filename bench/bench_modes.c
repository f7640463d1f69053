/* mtopt_bench's modes, one function each (step_bench.c's header comment says
 * what each measures), and the bit-for-bit check between them; the two that
 * do not run the library (ref-adamw, ref-adamw-pooled, copy) are in
 * bench_ref.c. */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

/* A mode: its name, its function and, for the pooled ones, the variant. */
typedef struct bench_mode bench_mode_t;
struct bench_mode {
  const char *name;
  void (*run)(bench_t *b, const bench_mode_t *m, const bench_shape_t *s,
              shape_state_t *ss, row_t *row, int round);
  int mixed; /* loss scale and clipping; checked for skipped steps instead */
  int graph; /* one step captured in a CUDA graph, replayed */
  int packed; /* the tensors back to back, not each at its own aligned start */
};

/* ---------------------------------------------------------------- steps -- */

static int step_optimizers(bench_t *b, stepper_t *sp, row_t *row) {
  for (int64_t i = 0; i < sp->nopt; i++) {
    const mtopt_status_t st = mtopt_optimizer_step(sp->opts[i]);
    if (st != MTOPT_STATUS_SUCCESS) {
      NOTE(row, "mtopt_optimizer_step -> %s: %s", mtopt_status_name(st), mtopt_last_error());
      return -1;
    }
  }
  return 0;
}

static int step_graph(bench_t *b, stepper_t *sp, row_t *row) {
  return b->be->graph_launch(b, sp->graph, row);
}

/* ------------------------------------------------------- dtype configs -- */

/* Every config's bytes per parameter come from get_info, like fp32's. */
const precision_t bench_precisions[] = {
    {"f32", MTOPT_DTYPE_F32, MTOPT_DTYPE_F32, MTOPT_MASTER_NONE, MTOPT_DTYPE_F32,
     MTOPT_ROUNDING_NEAREST, 0},
    {"bf16-master", MTOPT_DTYPE_BF16, MTOPT_DTYPE_BF16, MTOPT_MASTER_F32, MTOPT_DTYPE_F32,
     MTOPT_ROUNDING_NEAREST, 0},
    {"bf16-remainder", MTOPT_DTYPE_BF16, MTOPT_DTYPE_BF16, MTOPT_MASTER_REMAINDER,
     MTOPT_DTYPE_F32, MTOPT_ROUNDING_NEAREST, 0},
    {"bf16-nearest", MTOPT_DTYPE_BF16, MTOPT_DTYPE_BF16, MTOPT_MASTER_NONE, MTOPT_DTYPE_F32,
     MTOPT_ROUNDING_NEAREST, 0},
    {"bf16-sr", MTOPT_DTYPE_BF16, MTOPT_DTYPE_BF16, MTOPT_MASTER_NONE, MTOPT_DTYPE_F32,
     MTOPT_ROUNDING_STOCHASTIC, 0},
    {"bf16-all", MTOPT_DTYPE_BF16, MTOPT_DTYPE_BF16, MTOPT_MASTER_NONE, MTOPT_DTYPE_BF16,
     MTOPT_ROUNDING_NEAREST, 0},
    {"bf16-all-sr", MTOPT_DTYPE_BF16, MTOPT_DTYPE_BF16, MTOPT_MASTER_NONE, MTOPT_DTYPE_BF16,
     MTOPT_ROUNDING_STOCHASTIC, 0},
    /* bf16 state, SR, beside arrays of 4 bytes */
    {"bf16-master-bf16state-sr", MTOPT_DTYPE_BF16, MTOPT_DTYPE_BF16, MTOPT_MASTER_F32,
     MTOPT_DTYPE_BF16, MTOPT_ROUNDING_STOCHASTIC, 0},
    {"f32-bf16state-sr", MTOPT_DTYPE_F32, MTOPT_DTYPE_F32, MTOPT_MASTER_NONE, MTOPT_DTYPE_BF16,
     MTOPT_ROUNDING_STOCHASTIC, 0},
    {"f32-bf16grad", MTOPT_DTYPE_F32, MTOPT_DTYPE_BF16, MTOPT_MASTER_NONE, MTOPT_DTYPE_F32,
     MTOPT_ROUNDING_NEAREST, 0},
    /* bf16 matrices with fp32 masters, fp32 vectors (under 65536 elements) */
    {"mixed-table", MTOPT_DTYPE_BF16, MTOPT_DTYPE_BF16, MTOPT_MASTER_F32, MTOPT_DTYPE_F32,
     MTOPT_ROUNDING_NEAREST, 65536},
    {NULL, MTOPT_DTYPE_F32, MTOPT_DTYPE_F32, MTOPT_MASTER_NONE, MTOPT_DTYPE_F32,
     MTOPT_ROUNDING_NEAREST, 0}};

const precision_t *bench_precision_find(const char *name) {
  for (const precision_t *p = bench_precisions; p->name; p++)
    if (strcmp(p->name, name) == 0) return p;
  return NULL;
}

void bench_tensor_dtypes(const precision_t *p, int64_t numel, mtopt_dtype_t *param,
                         mtopt_dtype_t *grad) {
  const int f32 = numel < p->f32_below;
  *param = f32 ? MTOPT_DTYPE_F32 : p->param;
  *grad = f32 ? MTOPT_DTYPE_F32 : p->grad;
}

static int dtype_size(mtopt_dtype_t d) { return d == MTOPT_DTYPE_F32 ? 4 : 2; }

/* ------------------------------------------------- one optimizer's run -- */

/* What a mode that steps optimizers holds while it runs. */
typedef struct {
  layout_t L;
  float *w, *g;
  uint8_t *wes, *ges; /* per tensor of the shape: bytes per weight, per gradient */
  int wslot, gslot;   /* bytes per layout slot of w and g (layout_t) */
  mtopt_tensor_list_t **lists;
  mtopt_optimizer_t **opts;
  int64_t nopt;
  uint64_t *h; /* per-tensor hashes for the check */
  stepper_t sp;
} run_t;

static mtopt_optimizer_config_t make_config(const opts_t *o, int mixed) {
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  c.kind = o->kind;
  c.chunk_size = o->chunk_size;
  c.master_weights = o->prec->master;
  c.state_dtype = o->prec->state;
  c.rounding = o->prec->rounding;
  c.seed = 1;
  if (o->kind == MTOPT_OPTIMIZER_SGD) {
    c.lr = 1e-2f;
    c.momentum = 0.9f; /* the common case, and a state buffer to move */
  }
  if (mixed) {
    c.max_grad_norm = 1.0f;
    c.loss_scale = 65536.0f; /* GradScaler's initial scale */
    c.dynamic_loss_scale = 1;
  }
  return c;
}

/* One optimizer over tensors [t0, t1) of the layout (slots of r->wslot and
 * r->gslot bytes). */
static mtopt_status_t make_opt(bench_t *b, const bench_shape_t *s, const layout_t *L,
                               const run_t *r, int64_t t0, int64_t t1,
                               const mtopt_optimizer_config_t *cfg, mtopt_tensor_list_t **list,
                               mtopt_optimizer_t **opt) {
  mtopt_status_t st = mtopt_tensor_list_create(b->ctx, list);
  for (int64_t t = t0; t < t1 && st == MTOPT_STATUS_SUCCESS; t++) {
    mtopt_tensor_desc_t d = MTOPT_TENSOR_DESC_INIT;
    d.param = (char *)r->w + L->off[t] * r->wslot;
    d.grad = (char *)r->g + L->off[t] * r->gslot;
    d.numel = s->numel[t];
    bench_tensor_dtypes(b->o->prec, s->numel[t], &d.param_dtype, &d.grad_dtype);
    st = mtopt_tensor_list_add(*list, &d, NULL);
  }
  if (st == MTOPT_STATUS_SUCCESS) st = mtopt_optimizer_create(b->ctx, *list, cfg, opt);
  return st;
}

/* Weights and gradients of the shape in its layout (pooled: tensors on
 * aligned starts; else back to back), filled from the patterns, and room
 * for nopt optimizers. */
static int run_alloc(bench_t *b, const bench_shape_t *s, int pooled, int64_t nopt, run_t *r,
                     row_t *row) {
  r->sp.step = step_optimizers;
  if (bench_layout_make(s, pooled, &r->L)) {
    NOTE(row, "out of host memory");
    return -1;
  }
  r->wes = malloc((size_t)(s->n ? s->n : 1));
  r->ges = malloc((size_t)(s->n ? s->n : 1));
  if (!r->wes || !r->ges) {
    NOTE(row, "out of host memory");
    return -1;
  }
  r->wslot = r->gslot = 2;
  for (int64_t t = 0; t < s->n; t++) {
    mtopt_dtype_t pd, gd;
    bench_tensor_dtypes(b->o->prec, s->numel[t], &pd, &gd);
    r->wes[t] = (uint8_t)dtype_size(pd);
    r->ges[t] = (uint8_t)dtype_size(gd);
    if (r->wes[t] > r->wslot) r->wslot = r->wes[t];
    if (r->ges[t] > r->gslot) r->gslot = r->ges[t];
  }
  /* bench_alloc counts floats */
  r->w = bench_alloc(b, (r->L.len * r->wslot + 3) / 4, row);
  if (r->w) r->g = bench_alloc(b, (r->L.len * r->gslot + 3) / 4, row);
  if (!r->g) return -1;
  if (bench_fill(b, r->w, s, &r->L, 0, r->wes, r->wslot, row) ||
      bench_fill(b, r->g, s, &r->L, 1, r->ges, r->gslot, row))
    return -1;
  r->nopt = nopt;
  r->lists = calloc((size_t)nopt, sizeof *r->lists);
  r->opts = calloc((size_t)nopt, sizeof *r->opts);
  r->h = malloc((size_t)s->n * sizeof *r->h);
  if (!r->lists || !r->opts || !r->h) {
    NOTE(row, "out of host memory");
    return -1;
  }
  return 0;
}

/* Optimizer i over tensors [i per, (i + 1) per) of shape v in layout VL (v
 * and VL may view the buffers as other tensors than the shape's); the row's
 * bytes per parameter and launches from mtopt_optimizer_get_info. */
static int run_build(bench_t *b, run_t *r, const bench_shape_t *v, const layout_t *VL,
                     int64_t per, int mixed, shape_state_t *ss, row_t *row) {
  const mtopt_optimizer_config_t cfg = make_config(b->o, mixed);
  for (int64_t i = 0; i < r->nopt; i++) {
    const mtopt_status_t st =
        make_opt(b, v, VL, r, i * per, (i + 1) * per, &cfg, &r->lists[i], &r->opts[i]);
    if (st != MTOPT_STATUS_SUCCESS) {
      NOTE(row, "building the optimizer -> %s: %s", mtopt_status_name(st), mtopt_last_error());
      return -1;
    }
  }
  r->sp.opts = r->opts;
  r->sp.nopt = r->nopt;

  mtopt_optimizer_info_t info = MTOPT_OPTIMIZER_INFO_INIT;
  const mtopt_status_t st = mtopt_optimizer_get_info(r->opts[0], &info);
  if (st != MTOPT_STATUS_SUCCESS) {
    NOTE(row, "mtopt_optimizer_get_info -> %s: %s", mtopt_status_name(st), mtopt_last_error());
    return -1;
  }
  row->bpp = info.bytes_per_param;
  row->chunk_size = info.chunk_size;
  row->update_tensors = info.update_tensors * r->nopt;
  row->launches = (int64_t)info.launches_per_step * r->nopt;
  return 0;
}

static void run_free(bench_t *b, run_t *r) {
  if (r->sp.graph) b->be->graph_destroy(r->sp.graph);
  for (int64_t i = 0; r->opts && i < r->nopt; i++) mtopt_optimizer_destroy(r->opts[i]);
  for (int64_t i = 0; r->lists && i < r->nopt; i++) mtopt_tensor_list_destroy(r->lists[i]);
  free(r->opts);
  free(r->lists);
  free(r->h);
  free(r->wes);
  free(r->ges);
  bench_free(b, r->w);
  bench_free(b, r->g);
  free(r->L.off);
}

/* ---------------------------------------------------------------- check -- */

static int compare_to_ref(shape_state_t *ss, const uint64_t *h, const bench_shape_t *s,
                          row_t *row) {
  if (!ss->from) {
    memcpy(ss->hash, h, (size_t)s->n * sizeof *h);
    ss->from = row->mode;
    row->check = "ref";
    return 0;
  }
  for (int64_t t = 0; t < s->n; t++) {
    if (h[t] != ss->hash[t]) {
      row->check = "FAIL";
      NOTE(row, "weights after one step differ from %s's, first at tensor %lld", ss->from,
           (long long)t);
      return -1;
    }
  }
  row->check = "ok";
  return 0;
}

/* With --check, in round 0: one step from the random start, its weights
 * against the reference (or made the reference). */
static int run_check(bench_t *b, const bench_shape_t *s, run_t *r, shape_state_t *ss,
                     row_t *row, int round) {
  if (round > 0 || !b->o->check) return 0;
  if (r->sp.step(b, &r->sp, row) || b->be->sync(b, row)) return -1;
  if (b->be->hash(b, r->w, s, &r->L, r->wes, r->wslot, r->h, row)) return -1;
  return compare_to_ref(ss, r->h, s, row);
}

/* Mixed modes: the gradients are finite, so no step may have been skipped. */
static int run_check_skipped(bench_t *b, run_t *r, row_t *row) {
  mtopt_step_info_t si = MTOPT_STEP_INFO_INIT;
  const mtopt_status_t st = mtopt_optimizer_get_step_info(r->opts[0], &si);
  if (st != MTOPT_STATUS_SUCCESS) {
    NOTE(row, "mtopt_optimizer_get_step_info -> %s: %s", mtopt_status_name(st),
         mtopt_last_error());
    return -1;
  }
  row->skipped = row->skipped > 0 ? row->skipped + si.skipped_steps : si.skipped_steps;
  if (si.skipped_steps != 0 || !isfinite(si.last_grad_norm)) {
    row->check = "FAIL";
    NOTE(row, "%lld steps skipped, last grad norm %g: the gradients are finite, none "
              "should be", (long long)si.skipped_steps, (double)si.last_grad_norm);
    return -1;
  }
  if (b->o->check) row->check = "ok";
  return 0;
}

/* ---------------------------------------------------------------- modes -- */

/* one-tensor: one optimizer over one tensor of the total element count, back
 * to back in one buffer. LAMB's trust ratio is per tensor and stochastic
 * rounding keys its bits on the tensor, so it computes other values there:
 * no check. */
static void run_one_tensor(bench_t *b, const bench_mode_t *m, const bench_shape_t *s,
                     shape_state_t *ss, row_t *row, int round) {
  int64_t n1 = s->total, off0 = 0;
  const bench_shape_t one = {.n = 1, .numel = &n1, .total = s->total};
  const layout_t L1 = {&off0, s->total};
  run_t r = {0};
  if (b->o->prec->f32_below > 0) { /* one tensor has one dtype */
    NOTE(row, "a mixed table has no one-tensor equivalent");
    row->check = "n/a";
    return;
  }
  if (run_alloc(b, s, 0, 1, &r, row) || run_build(b, &r, &one, &L1, 1, 0, ss, row)) goto done;
  if (b->o->kind != MTOPT_OPTIMIZER_LAMB && b->o->prec->rounding != MTOPT_ROUNDING_STOCHASTIC) {
    if (run_check(b, s, &r, ss, row, round)) goto done;
  } else if (round == 0 && b->o->check) {
    row->check = "n/a";
  }
  if (bench_time_steps(b, &r.sp, b->o->warmup, b->o->iters, row)) goto done;
  row->ok = 1;
done:
  run_free(b, &r);
}

/* loop: one optimizer per tensor, one step call each. */
static void run_loop(bench_t *b, const bench_mode_t *m, const bench_shape_t *s,
                     shape_state_t *ss, row_t *row, int round) {
  const opts_t *o = b->o;
  int warmup = o->warmup, iters = o->iters;
  if (o->loop_iters > 0) {
    if (iters > o->loop_iters) iters = o->loop_iters;
    if (warmup > 1) warmup = 1;
  } else if (s->n > 10000) {
    /* A host loop over 10^5 tensors is slow: a few samples show it. */
    if (iters > 3) iters = 3;
    if (warmup > 1) warmup = 1;
  }
  run_t r = {0};
  if (run_alloc(b, s, 1, s->n, &r, row) || run_build(b, &r, s, &r.L, 1, 0, ss, row)) goto done;
  if (b->o->prec->rounding == MTOPT_ROUNDING_STOCHASTIC || b->o->kind == MTOPT_OPTIMIZER_LAMB) {
    /* Stochastic rounding keys its bits on the tensor index (each optimizer's
     * tensor is its 0); LAMB's norms are sums whose order follows the grid
     * shape, which one small tensor alone changes (CUDA). */
    if (round == 0 && b->o->check) row->check = "n/a";
  } else if (run_check(b, s, &r, ss, row, round)) {
    goto done;
  }
  if (bench_time_steps(b, &r.sp, warmup, iters, row)) goto done;
  row->ok = 1;
done:
  run_free(b, &r);
}

/* fused, packed, mixed, packed-mixed, graph, graph-mixed: one optimizer over
 * all tensors of the pool (packed: back to back), stepped with one call or
 * replayed from a graph. */
static void run_pooled(bench_t *b, const bench_mode_t *m, const bench_shape_t *s,
                       shape_state_t *ss, row_t *row, int round) {
  const int mixed = m->mixed;
  int eager = 0; /* a step applied before the capture: the state moved */
  run_t r = {0};
  if (run_alloc(b, s, !m->packed, 1, &r, row) ||
      run_build(b, &r, s, &r.L, s->n, mixed, ss, row))
    goto done;
  if (m->graph) {
    if (!b->be->graph_capture) {
      NOTE(row, "graph modes need the CUDA backend");
      goto done;
    }
    if (b->be->graph_capture(b, r.opts[0], &r.sp.graph, &eager, row)) goto done;
    r.sp.step = step_graph;
  }
  if (!mixed && !eager && run_check(b, s, &r, ss, row, round)) goto done;
  if (bench_time_steps(b, &r.sp, b->o->warmup, b->o->iters, row)) goto done;
  if (mixed && run_check_skipped(b, &r, row)) goto done;
  row->ok = 1;
done:
  run_free(b, &r);
}

static void run_ref(bench_t *b, const bench_mode_t *m, const bench_shape_t *s,
                    shape_state_t *ss, row_t *row, int round) {
  bench_run_ref_adamw(b, s, 0, row);
}

static void run_ref_pooled(bench_t *b, const bench_mode_t *m, const bench_shape_t *s,
                           shape_state_t *ss, row_t *row, int round) {
  bench_run_ref_adamw(b, s, 1, row);
}

static void run_copy(bench_t *b, const bench_mode_t *m, const bench_shape_t *s,
                     shape_state_t *ss, row_t *row, int round) {
  bench_run_copy(b, s, ss, row, round);
}

static const bench_mode_t modes[M_COUNT] = {
    [M_ONE_TENSOR] = {"one-tensor", run_one_tensor},
    [M_FUSED] = {"fused", run_pooled},
    [M_PACKED] = {"packed", run_pooled, .packed = 1},
    [M_LOOP] = {"loop", run_loop},
    [M_MIXED] = {"mixed", run_pooled, .mixed = 1},
    [M_PACKED_MIXED] = {"packed-mixed", run_pooled, .mixed = 1, .packed = 1},
    [M_GRAPH] = {"graph", run_pooled, .graph = 1},
    [M_GRAPH_MIXED] = {"graph-mixed", run_pooled, .mixed = 1, .graph = 1},
    [M_REF_ADAMW] = {"ref-adamw", run_ref},
    [M_REF_ADAMW_POOLED] = {"ref-adamw-pooled", run_ref_pooled},
    [M_COPY] = {"copy", run_copy},
};

const char *bench_mode_name(int mode) { return modes[mode].name; }

void bench_run_mode(bench_t *b, const bench_shape_t *s, int mode, shape_state_t *ss,
                    row_t *row, int round) {
  if (round == 0) {
    memset(row, 0, sizeof *row);
    snprintf(row->shape, sizeof row->shape, "%s", s->name);
    row->mode = modes[mode].name;
    row->tensors = s->n;
    row->params = s->total;
    row->ms = row->host_us = row->gbps = row->floor_ms = row->frac = NAN;
    row->check = "-";
    row->skipped = -1;
    row->launches = -1;
  } else if (!row->ok) {
    return; /* failed in an earlier round: keep its note */
  }
  row->ok = 0;
  modes[mode].run(b, &modes[mode], s, ss, row, round);
  b->be->clear_error(b); /* a failed mode must not poison the next */
}

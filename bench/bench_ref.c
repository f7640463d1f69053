/* mtopt_bench's two modes that measure something other than the library:
 *
 *   ref-adamw  the reference AdamW of ref_adamw.h over one buffer of the
 *              shape's total size: whether the floor is reachable with real
 *              AdamW math. Before its first timing in a run it is checked
 *              against a double-precision step (a benchmark must not time a
 *              wrong kernel); a failed check fails every ref-adamw row.
 *   copy       the floor: a copy of params x B/param / 2 bytes (it reads and
 *              writes as much as a step of B/param bytes), one row for each
 *              B/param of the shape's other rows. Where the backend knows
 *              several ways to copy (the CPU), every round times each and
 *              the row keeps the fastest (lowest median over all rounds), so
 *              that the floor is the best the memory does, not one library's
 *              memcpy. */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

/* ------------------------------------------------------------- ref-adamw -- */

static int step_ref(bench_t *b, stepper_t *sp, row_t *row) {
  ref_adamw_next(&sp->ref);
  return b->be->ref_step(b, &sp->ref, row);
}

/* The library's default AdamW hyperparameters, the ones the other rows use. */
static void ref_init(ref_adamw_t *r) {
  const mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  memset(r, 0, sizeof *r);
  r->lr = c.lr;
  r->beta1 = c.beta1;
  r->beta2 = c.beta2;
  r->eps = c.eps;
  r->weight_decay = c.weight_decay;
}

static void ref_free(bench_t *b, ref_adamw_t *r) {
  bench_free(b, r->w);
  bench_free(b, r->g);
  bench_free(b, r->m);
  bench_free(b, r->v);
  r->w = r->g = r->m = r->v = NULL;
}

/* n elements of each buffer: w and g from the patterns' start, m, v zero. */
static int ref_alloc(bench_t *b, ref_adamw_t *r, int64_t n, row_t *row) {
  r->n = n;
  float **bufs[4] = {&r->w, &r->g, &r->m, &r->v};
  for (int i = 0; i < 4; i++)
    if (!(*bufs[i] = bench_alloc(b, n, row))) return -1;
  int64_t n1 = n, off0 = 0;
  const bench_shape_t one = {.n = 1, .numel = &n1, .total = n};
  const layout_t L1 = {&off0, n};
  const uint8_t es = 4;
  if (bench_fill(b, r->w, &one, &L1, 0, &es, 4, row) ||
      bench_fill(b, r->g, &one, &L1, 1, &es, 4, row))
    return -1;
  return b->be->zero(b, r->m, (size_t)n * 4, row) || b->be->zero(b, r->v, (size_t)n * 4, row)
             ? -1
             : b->be->sync(b, row);
}

/* The same steps in double from the same start: the largest error of w, m
 * and v relative to what float arithmetic allows. w: a few roundings of w per
 * step (16 ulp of |w| over the steps run, plus 1e-4 of the step size for the
 * update's own rounding); m and v: 1e-5 relative. A missing weight decay
 * (lr wd |w| = 1e-5 |w| a step) or bias correction is far outside. */
static int ref_compare(const bench_t *b, const ref_adamw_t *r, const float *w, const float *m,
                       const float *v, char *note, size_t nn) {
  double wd = 0, md = 0, vd = 0, worst = 0;
  int64_t bad = -1, at = 0;
  for (int64_t j = 0; j < r->n && bad < 0; j++) {
    const double g = b->pat[1][j];
    wd = b->pat[0][j];
    md = vd = 0;
    for (int64_t t = 1; t <= r->t; t++) {
      md = r->beta1 * md + (1 - r->beta1) * g;
      vd = r->beta2 * vd + (1 - r->beta2) * g * g;
      const double step = r->lr / (1 - pow(r->beta1, (double)t));
      const double denom = sqrt(vd) / sqrt(1 - pow(r->beta2, (double)t)) + r->eps;
      wd = wd * (1 - r->lr * r->weight_decay) - step * md / denom;
    }
    const double tw = 16 * 0x1p-24 * fabs(wd) + 1e-4 * r->lr;
    const double e[3] = {fabs(w[j] - wd) / tw, fabs(m[j] - md) / (1e-5 * fabs(md) + 1e-30),
                         fabs(v[j] - vd) / (1e-5 * fabs(vd) + 1e-30)};
    for (int k = 0; k < 3; k++) {
      if (!(e[k] <= 1.0)) bad = j; /* NaN too */
      if (e[k] > worst) {
        worst = e[k];
        at = j;
      }
    }
  }
  if (bad >= 0) {
    snprintf(note, nn, "ref-adamw differs from the double step at element %lld: w %.9g m %.9g v "
             "%.9g, expected %.9g %.9g %.9g", (long long)bad, (double)w[bad], (double)m[bad],
             (double)v[bad], wd, md, vd);
    return -1;
  }
  snprintf(note, nn, "checked: %lld elements, %lld steps, worst error %.2f of the tolerance "
           "(element %lld)", (long long)r->n, (long long)r->t, worst, (long long)at);
  return 0;
}

/* Once per run: a few steps over a small buffer (an odd size, so the tail
 * path runs), against the double reference. */
static int ref_validate(bench_t *b, row_t *row) {
  if (b->ref_valid) return b->ref_valid > 0 ? 0 : -1;
  const int64_t n = 3 * 65536 + 7;
  ref_adamw_t r;
  ref_init(&r);
  float *host = malloc((size_t)n * 3 * sizeof *host);
  int rc = host ? ref_alloc(b, &r, n, row) : -1;
  for (int t = 0; t < 3 && rc == 0; t++) {
    ref_adamw_next(&r);
    rc = b->be->ref_step(b, &r, row);
  }
  if (rc == 0) rc = b->be->sync(b, row);
  if (rc == 0) rc = b->be->get(b, host, r.w, (size_t)n * 4, row);
  if (rc == 0) rc = b->be->get(b, host + n, r.m, (size_t)n * 4, row);
  if (rc == 0) rc = b->be->get(b, host + 2 * n, r.v, (size_t)n * 4, row);
  if (rc == 0) {
    rc = ref_compare(b, &r, host, host + n, host + 2 * n, b->ref_note, sizeof b->ref_note);
  } else {
    snprintf(b->ref_note, sizeof b->ref_note, "ref-adamw check could not run: %.200s", row->note);
  }
  ref_free(b, &r);
  free(host);
  b->ref_valid = rc == 0 ? 1 : -1;
  fprintf(stderr, "# %s\n", b->ref_note);
  return rc;
}

void bench_run_ref_adamw(bench_t *b, const bench_shape_t *s, shape_state_t *ss, row_t *row,
                         int round) {
  stepper_t sp = {.step = step_ref};
  ref_init(&sp.ref);
  if (ref_validate(b, row)) {
    row->check = "FAIL";
    NOTE(row, "%s", b->ref_note);
    return;
  }
  row->bpp = REF_ADAMW_BYTES_PER_PARAM;
  row->launches = 1;
  row->check = "ok";
  if (ref_alloc(b, &sp.ref, s->total, row) == 0 &&
      bench_time_steps(b, &sp, b->o->warmup, b->o->iters, row) == 0)
    row->ok = 1;
  ref_free(b, &sp.ref);
}

/* ------------------------------------------------------------------ copy -- */

static int step_copy(bench_t *b, stepper_t *sp, row_t *row) {
  return b->be->copy_step(b, sp, row);
}

/* Every round times each variant in turn (the same conditions for all, on a
 * machine whose bandwidth drifts), pooled per variant; the row's samples are
 * those of the variant whose median is lowest so far. */
static int copy_time(bench_t *b, stepper_t *sp, row_t *row) {
  const bench_backend_t *be = b->be;
  char tried[256] = "", failed[sizeof row->note] = "";
  double best = INFINITY;
  int k = 0;
  for (int v = 0; v < be->ncopy && v < MAX_COPY_VARIANTS; v++) {
    row_t t;
    memset(&t, 0, sizeof t);
    sp->variant = v;
    if (bench_time_steps(b, sp, b->o->warmup, b->o->iters, &t) ||
        bench_pool(&row->vsamples[v], &row->nvsamples[v], t.samples, t.nsamples, &t))
      snprintf(failed, sizeof failed, "%s: %.400s", be->copy_names[v], t.note);
    free(t.samples);
    free(t.host_samples);
    const double ms = bench_median(row->vsamples[v], row->nvsamples[v]);
    if (ms < best) {
      best = ms;
      row->variant = v;
      row->k = t.k; /* steps per sample (CUDA: K back-to-back copies) */
    }
    if (k >= 0 && (size_t)k < sizeof tried)
      k += snprintf(tried + k, sizeof tried - (size_t)k, "%s%s %.4g ms", v ? ", " : "",
                    be->copy_names[v], ms);
  }
  if (!isfinite(best)) {
    NOTE(row, "no copy variant ran (%s)", failed);
    return -1;
  }
  if (be->ncopy > 1) NOTE(row, "fastest of (medians): %s", tried);
  const int v = row->variant;
  row->nsamples = 0;
  return bench_pool(&row->samples, &row->nsamples, row->vsamples[v], row->nvsamples[v], row);
}

void bench_run_copy(bench_t *b, const bench_shape_t *s, shape_state_t *ss, row_t *row,
                    int round) {
  stepper_t sp = {.step = step_copy};
  row->copy = 1;
  row->bpp = ss->copy_bpp;
  row->launches = 1;
  row->check = "-";
  sp.bytes = (size_t)s->total * (size_t)row->bpp / 2;
  const int64_t nf = (int64_t)((sp.bytes + 3) / 4);
  sp.src = bench_alloc(b, nf, row);
  if (sp.src) sp.dst = bench_alloc(b, nf, row);
  if (sp.dst && b->be->copy_prepare(b, &sp, row) == 0 && copy_time(b, &sp, row) == 0) {
    row->variant_name = b->be->copy_names[row->variant];
    row->ok = 1;
  }
  bench_free(b, sp.src);
  bench_free(b, sp.dst);
}

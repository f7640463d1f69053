/* mtopt_bench's two modes that measure something other than the library:
 *
 *   ref-adamw  the reference AdamW of ref_adamw.h over one buffer of the
 *              shape's total size, fp32 or (--dtype bf16-master) bf16
 *              parameters and gradients with fp32 masters: whether the floor
 *              is reachable with real AdamW math in that layout. Before its
 *              first timing in a run it is checked against a
 *              double-precision step (a benchmark must not time a wrong
 *              kernel); a failed check fails every ref-adamw row.
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

int bench_ref_layout(const precision_t *p) {
  if (strcmp(p->name, "f32") == 0) return REF_ADAMW_F32;
  if (strcmp(p->name, "bf16-master") == 0) return REF_ADAMW_BF16_MASTER;
  return -1;
}

/* The library's default AdamW hyperparameters, the ones the other rows use;
 * the layout of the run's dtype configuration (one it has). */
static void ref_init(const bench_t *b, ref_adamw_t *r) {
  const mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  memset(r, 0, sizeof *r);
  r->layout = bench_ref_layout(b->o->prec);
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
  bench_free(b, r->p);
  r->w = r->m = r->v = NULL;
  r->g = NULL;
  r->p = NULL;
}

/* n elements of each buffer: w (the masters) and g from the patterns' start
 * (g rounded to bf16 in the bf16 layout), m, v zero; p is written by the
 * step. */
static int ref_alloc(bench_t *b, ref_adamw_t *r, int64_t n, row_t *row) {
  r->n = n;
  const int bf16 = r->layout == REF_ADAMW_BF16_MASTER;
  const int64_t n16 = (n + 1) / 2; /* floats that hold n bf16 */
  if (!(r->w = bench_alloc(b, n, row)) || !(r->g = bench_alloc(b, bf16 ? n16 : n, row)) ||
      !(r->m = bench_alloc(b, n, row)) || !(r->v = bench_alloc(b, n, row)) ||
      (bf16 && !(r->p = (uint16_t *)bench_alloc(b, n16, row))))
    return -1;
  int64_t n1 = n, off0 = 0;
  const bench_shape_t one = {.n = 1, .numel = &n1, .total = n};
  const layout_t L1 = {&off0, n};
  const uint8_t es = 4, ges = bf16 ? 2 : 4;
  if (bench_fill(b, r->w, &one, &L1, 0, &es, 4, row) ||
      bench_fill(b, r->g, &one, &L1, 1, &ges, ges, row))
    return -1;
  return b->be->zero(b, r->m, (size_t)n * 4, row) || b->be->zero(b, r->v, (size_t)n * 4, row)
             ? -1
             : b->be->sync(b, row);
}

/* The same steps in double from the same start: the largest error of w, m
 * and v relative to what float arithmetic allows. w: a few roundings of w per
 * step (16 ulp of |w| over the steps run, plus 1e-4 of the step size for the
 * update's own rounding); m and v: 1e-5 relative. A missing weight decay
 * (lr wd |w| = 1e-5 |w| a step) or bias correction is far outside. The bf16
 * layout's gradients are the patterns' bf16 values, and each parameter must
 * be its master rounded to nearest even, exactly. */
static int ref_compare(const bench_t *b, const ref_adamw_t *r, const float *w, const float *m,
                       const float *v, const uint16_t *p, char *note, size_t nn) {
  double wd = 0, md = 0, vd = 0, worst = 0;
  int64_t bad = -1, at = 0;
  for (int64_t j = 0; j < r->n && bad < 0; j++) {
    if (p && p[j] != ref_f32_to_bf16(w[j])) {
      snprintf(note, nn, "ref-adamw's bf16 parameter %lld is 0x%04x, its master %.9g rounds to "
               "0x%04x", (long long)j, p[j], (double)w[j], ref_f32_to_bf16(w[j]));
      return -1;
    }
    const double g = p ? ref_bf16_to_f32(b->pat16[1][j]) : b->pat[1][j];
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
  ref_init(b, &r);
  float *host = malloc((size_t)n * 3 * sizeof *host);
  uint16_t *hp = r.layout == REF_ADAMW_BF16_MASTER ? malloc((size_t)n * sizeof *hp) : NULL;
  int rc = host && (hp || r.layout != REF_ADAMW_BF16_MASTER) ? ref_alloc(b, &r, n, row) : -1;
  for (int t = 0; t < 3 && rc == 0; t++) {
    ref_adamw_next(&r);
    rc = b->be->ref_step(b, &r, row);
  }
  if (rc == 0) rc = b->be->sync(b, row);
  if (rc == 0) rc = b->be->get(b, host, r.w, (size_t)n * 4, row);
  if (rc == 0) rc = b->be->get(b, host + n, r.m, (size_t)n * 4, row);
  if (rc == 0) rc = b->be->get(b, host + 2 * n, r.v, (size_t)n * 4, row);
  if (rc == 0 && hp) rc = b->be->get(b, hp, r.p, (size_t)n * 2, row);
  if (rc == 0) {
    rc = ref_compare(b, &r, host, host + n, host + 2 * n, hp, b->ref_note, sizeof b->ref_note);
  } else {
    snprintf(b->ref_note, sizeof b->ref_note, "ref-adamw check could not run: %.200s", row->note);
  }
  ref_free(b, &r);
  free(host);
  free(hp);
  b->ref_valid = rc == 0 ? 1 : -1;
  fprintf(stderr, "# %s\n", b->ref_note);
  return rc;
}

void bench_run_ref_adamw(bench_t *b, const bench_shape_t *s, shape_state_t *ss, row_t *row,
                         int round) {
  stepper_t sp = {.step = step_ref};
  if (bench_ref_layout(b->o->prec) < 0) {
    NOTE(row, "ref-adamw has the layouts of --dtype f32 and bf16-master only");
    return;
  }
  ref_init(b, &sp.ref);
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

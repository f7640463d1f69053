/* mtopt_bench's two modes that measure something other than the library:
 *
 *   ref-adamw  the reference AdamW of ref_adamw.h over one buffer of the
 *              shape's total size, fp32 or (--dtype bf16-master) bf16
 *              parameters and gradients with fp32 masters: whether the floor
 *              is reachable with real AdamW math in that layout. Before its
 *              first timing in a run it is checked against a
 *              double-precision step (a benchmark must not time a wrong
 *              kernel); a failed check fails every ref-adamw row.
 *   ref-adamw-pooled  the same over the shape's tensors pooled, each at its
 *              own 256-byte start, every array alike (checked the same way,
 *              and that the gaps are left as they were): whether the floor
 *              is reachable where the tensors do not lie back to back.
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
  bench_free(b, (void *)r->valid);
  r->w = r->m = r->v = NULL;
  r->g = NULL;
  r->p = NULL;
  r->valid = NULL;
}

/* Per group of 4 elements of the span, how many are a tensor's (ref_adamw.h). */
static uint8_t *ref_counts(const bench_shape_t *s, const layout_t *L, int64_t n) {
  uint8_t *c = calloc((size_t)(n / 4), 1);
  for (int64_t t = 0; c && t < s->n; t++)
    for (int64_t j = L->off[t]; j < L->off[t] + s->numel[t]; j += 4)
      c[j / 4] = (uint8_t)(L->off[t] + s->numel[t] - j < 4 ? L->off[t] + s->numel[t] - j : 4);
  return c;
}

/* Each array of shape s: one buffer of its total size (L NULL), or pooled
 * (L: each tensor at its offset, the span rounded up to groups of 4). w (the
 * masters) and g hold the patterns' streams (g rounded to bf16 in the bf16
 * layout); pooled, the gaps first take the patterns as one stream over the
 * span, so that a step that touched a gap would show; m, v and p zero. */
static int ref_alloc(bench_t *b, ref_adamw_t *r, const bench_shape_t *s, const layout_t *L,
                     row_t *row) {
  const int64_t n = L ? (L->len + 3) / 4 * 4 : s->total;
  r->n = n;
  const int bf16 = r->layout == REF_ADAMW_BF16_MASTER;
  const int64_t n16 = (n + 1) / 2; /* floats that hold n bf16 */
  if (!(r->w = bench_alloc(b, n, row)) || !(r->g = bench_alloc(b, bf16 ? n16 : n, row)) ||
      !(r->m = bench_alloc(b, n, row)) || !(r->v = bench_alloc(b, n, row)) ||
      (bf16 && !(r->p = (uint16_t *)bench_alloc(b, n16, row))))
    return -1;
  int64_t off0 = 0;
  const bench_shape_t one = {.n = 1, .numel = &r->n, .total = n};
  const layout_t L1 = {&off0, n};
  const uint8_t es[2] = {4, (uint8_t)(bf16 ? 2 : 4)};
  uint8_t *esize = malloc((size_t)(s->n ? s->n : 1));
  if (!esize) {
    NOTE(row, "out of host memory");
    return -1;
  }
  int rc = bench_fill(b, r->w, &one, &L1, 0, es, 4, row) ||
           bench_fill(b, r->g, &one, &L1, 1, es + 1, es[1], row);
  if (L && rc == 0) {
    memset(esize, 4, (size_t)s->n);
    rc = bench_fill(b, r->w, s, L, 0, esize, 4, row);
    memset(esize, es[1], (size_t)s->n);
    if (rc == 0) rc = bench_fill(b, r->g, s, L, 1, esize, es[1], row);
    uint8_t *c = rc == 0 ? ref_counts(s, L, n) : NULL;
    void *dc = c ? bench_alloc(b, (n / 4 + 3) / 4, row) : NULL;
    if (!c && rc == 0) NOTE(row, "out of host memory");
    rc = dc && b->be->set(b, dc, c, (size_t)(n / 4), row) == 0 ? 0 : -1;
    r->valid = dc;
    free(c);
  }
  free(esize);
  if (rc || b->be->zero(b, r->m, (size_t)n * 4, row) || b->be->zero(b, r->v, (size_t)n * 4, row) ||
      (bf16 && b->be->zero(b, r->p, (size_t)n * 2, row)))
    return -1;
  return b->be->sync(b, row);
}

/* The same steps in double from the same start: the largest error of w, m
 * and v relative to what float arithmetic allows. w: a few roundings of w per
 * step (16 ulp of |w| over the steps run, plus 1e-4 of the step size for the
 * update's own rounding); m and v: 1e-5 relative. A missing weight decay
 * (lr wd |w| = 1e-5 |w| a step) or bias correction is far outside. The bf16
 * layout's gradients are the patterns' bf16 values, and each parameter must
 * be its master rounded to nearest even, exactly. pos[j]: element j's place
 * in the patterns' stream, or -1 for a gap, which must hold what it held
 * (the stream's value in w, zero in m, v and p); NULL: j. */
static int ref_compare(const bench_t *b, const ref_adamw_t *r, const float *w, const float *m,
                       const float *v, const uint16_t *p, const int64_t *pos, char *note,
                       size_t nn) {
  double wd = 0, md = 0, vd = 0, worst = 0;
  int64_t bad = -1, at = 0, gaps = 0;
  for (int64_t j = 0; j < r->n && bad < 0; j++) {
    const int64_t k = pos ? pos[j] : j;
    if (k < 0) {
      gaps++;
      if (memcmp(&w[j], &b->pat[0][j % PATTERN_N], 4) || m[j] != 0 || v[j] != 0 || (p && p[j])) {
        snprintf(note, nn, "ref-adamw wrote element %lld, in a gap between tensors",
                 (long long)j);
        return -1;
      }
      continue;
    }
    if (p && p[j] != ref_f32_to_bf16(w[j])) {
      snprintf(note, nn, "ref-adamw's bf16 parameter %lld is 0x%04x, its master %.9g rounds to "
               "0x%04x", (long long)j, p[j], (double)w[j], ref_f32_to_bf16(w[j]));
      return -1;
    }
    const double g = p ? ref_bf16_to_f32(b->pat16[1][k % PATTERN_N]) : b->pat[1][k % PATTERN_N];
    wd = b->pat[0][k % PATTERN_N];
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
    for (int q = 0; q < 3; q++) {
      if (!(e[q] <= 1.0)) bad = j; /* NaN too */
      if (e[q] > worst) {
        worst = e[q];
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
  snprintf(note, nn, "checked: %lld elements (%lld in gaps), %lld steps, worst error %.2f of "
           "the tolerance (element %lld)", (long long)(r->n - gaps), (long long)gaps,
           (long long)r->t, worst, (long long)at);
  return 0;
}

/* The small shape each check runs on: odd sizes, so that the tail path runs
 * (flat) and groups end short before gaps of every length (pooled). */
static const int64_t kCheckNumel[] = {3 * 65536 + 7, 1, 2, 3, 4, 5, 63, 64, 65, 127, 129, 4099,
                                      70001, 7};

/* Once per run and kind (flat, pooled): a few steps over a small shape
 * against the double reference. */
static int ref_validate(bench_t *b, int pooled, row_t *row) {
  int *valid = &b->ref_valid[pooled];
  char *note = b->ref_note[pooled];
  const size_t nn = sizeof b->ref_note[pooled];
  if (*valid) return *valid > 0 ? 0 : -1;
  bench_shape_t s = {.n = pooled ? 13 : 1};
  s.numel = (int64_t *)(pooled ? kCheckNumel + 1 : kCheckNumel);
  for (int64_t t = 0; t < s.n; t++) s.total += s.numel[t];
  layout_t L = {NULL, 0};
  ref_adamw_t r;
  ref_init(b, &r);
  int rc = pooled ? bench_layout_make(&s, 1, &L) : 0;
  if (rc == 0) rc = ref_alloc(b, &r, &s, pooled ? &L : NULL, row);
  const int64_t n = r.n;
  float *host = rc == 0 ? malloc((size_t)n * 3 * sizeof *host) : NULL;
  uint16_t *hp = host ? malloc((size_t)n * sizeof *hp) : NULL;
  int64_t *pos = hp && pooled ? malloc((size_t)n * sizeof *pos) : NULL;
  if (rc == 0 && (!hp || (pooled && !pos))) {
    NOTE(row, "out of host memory");
    rc = -1;
  }
  for (int64_t j = 0; pos && j < n; j++) pos[j] = -1;
  for (int64_t t = 0, k = 0; pos && t < s.n; k += s.numel[t++])
    for (int64_t j = 0; j < s.numel[t]; j++) pos[L.off[t] + j] = k + j;
  for (int t = 0; t < 3 && rc == 0; t++) {
    ref_adamw_next(&r);
    rc = b->be->ref_step(b, &r, row);
  }
  if (rc == 0) rc = b->be->sync(b, row);
  if (rc == 0) rc = b->be->get(b, host, r.w, (size_t)n * 4, row);
  if (rc == 0) rc = b->be->get(b, host + n, r.m, (size_t)n * 4, row);
  if (rc == 0) rc = b->be->get(b, host + 2 * n, r.v, (size_t)n * 4, row);
  if (rc == 0 && r.p) rc = b->be->get(b, hp, r.p, (size_t)n * 2, row);
  if (rc == 0) {
    rc = ref_compare(b, &r, host, host + n, host + 2 * n, r.p ? hp : NULL, pos, note, nn);
  } else {
    snprintf(note, nn, "%s check could not run: %.200s", pooled ? "ref-adamw-pooled" : "ref-adamw",
             row->note);
  }
  ref_free(b, &r);
  free(L.off);
  free(host);
  free(hp);
  free(pos);
  *valid = rc == 0 ? 1 : -1;
  fprintf(stderr, "# %s%s\n", pooled ? "pooled: " : "", note);
  return rc;
}

void bench_run_ref_adamw(bench_t *b, const bench_shape_t *s, int pooled, row_t *row) {
  stepper_t sp = {.step = step_ref};
  if (bench_ref_layout(b->o->prec) < 0) {
    NOTE(row, "ref-adamw has the layouts of --dtype f32 and bf16-master only");
    return;
  }
  ref_init(b, &sp.ref);
  if (ref_validate(b, pooled, row)) {
    row->check = "FAIL";
    NOTE(row, "%s", b->ref_note[pooled]);
    return;
  }
  row->bpp = REF_ADAMW_BYTES_PER_PARAM;
  row->launches = 1;
  row->check = "ok";
  layout_t L = {NULL, 0};
  if (pooled && bench_layout_make(s, 1, &L)) {
    NOTE(row, "out of host memory");
    return;
  }
  if (ref_alloc(b, &sp.ref, s, pooled ? &L : NULL, row) == 0 &&
      bench_time_steps(b, &sp, b->o->warmup, b->o->iters, row) == 0)
    row->ok = 1;
  if (pooled && row->ok)
    NOTE(row, "tensors at 256-byte starts in every array, span %lld elements (%.1f%% gaps); "
         "also reads a byte per 4 elements", (long long)sp.ref.n,
         100.0 * (double)(sp.ref.n - s->total) / (double)sp.ref.n);
  ref_free(b, &sp.ref);
  free(L.off);
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

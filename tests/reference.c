/* The double-precision reference (reference.h states the formulas). Plain
 * loops, one tensor and one element at a time: easy to check by eye. */
#include "reference.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static double *dup_f(const float *x, int64_t n) {
  double *d = calloc((size_t)(n > 0 ? n : 1), sizeof *d);
  for (int64_t i = 0; i < n; i++) d[i] = x[i];
  return d;
}

void ref_init(ref_opt_t *r, const mtopt_optimizer_config_t *c, int64_t n,
              const int64_t *numel, const int32_t *group, const uint32_t *flags,
              const float *const *w0) {
  memset(r, 0, sizeof *r);
  r->kind = c->kind;
  r->lr = c->lr;
  r->beta1 = c->beta1;
  r->beta2 = c->beta2;
  r->eps = c->eps;
  r->weight_decay = c->weight_decay;
  r->momentum = c->momentum;
  r->dampening = c->dampening;
  r->nesterov = c->nesterov;
  /* torch's Adam/AdamW always correct the bias; LAMB makes it optional. */
  r->bias_correction = c->kind == MTOPT_OPTIMIZER_LAMB ? c->bias_correction : 1;
  r->lamb_always_adapt = c->lamb_always_adapt;
  r->max_grad_norm = c->max_grad_norm;
  r->dynamic = c->dynamic_loss_scale;
  r->loss_scale = c->loss_scale;
  r->take_stats = c->max_grad_norm > 0.0f || c->skip_nonfinite || r->dynamic ||
                  c->loss_scale != 1.0f;
  r->growth_factor = c->growth_factor;
  r->backoff_factor = c->backoff_factor;
  r->growth_interval = c->growth_interval;
  for (int k = 0; k < MTOPT_MAX_GROUPS; k++) r->lr_mult[k] = r->wd_mult[k] = 1.0;
  r->last_grad_norm = NAN;
  r->n = n;
  r->t = calloc((size_t)(n > 0 ? n : 1), sizeof *r->t);
  for (int64_t i = 0; i < n; i++) {
    ref_tensor_t *t = &r->t[i];
    t->numel = numel[i];
    t->group = group ? group[i] : 0;
    t->flags = flags ? flags[i] : 0;
    t->w = dup_f(w0[i], numel[i]);
    t->m = calloc((size_t)(numel[i] + 1), sizeof(double));
    t->v = calloc((size_t)(numel[i] + 1), sizeof(double));
    t->buf = calloc((size_t)(numel[i] + 1), sizeof(double));
    t->werr = calloc((size_t)(numel[i] + 1), sizeof(double));
    t->merr = calloc((size_t)(numel[i] + 1), sizeof(double));
    t->verr = calloc((size_t)(numel[i] + 1), sizeof(double));
  }
}

void ref_free(ref_opt_t *r) {
  for (int64_t i = 0; i < r->n; i++) {
    free(r->t[i].w);
    free(r->t[i].m);
    free(r->t[i].v);
    free(r->t[i].buf);
    free(r->t[i].werr);
    free(r->t[i].merr);
    free(r->t[i].verr);
  }
  free(r->t);
  memset(r, 0, sizeof *r);
}

double ref_clip_coef(double norm, double max_norm) {
  const double coef = max_norm / (norm + 1e-6);
  return coef < 1.0 ? coef : 1.0;
}

void ref_scaler_update(float *scale, int *tracker, int found_inf, float growth,
                       float backoff, int interval) {
  if (found_inf) {
    *scale = *scale * backoff;
    *tracker = 0;
    return;
  }
  const int successful = *tracker + 1;
  if (successful == interval) {
    const float grown = *scale * growth;
    if (isfinite(grown)) *scale = grown;
    *tracker = 0;
  } else {
    *tracker = successful;
  }
}

static void adam_tensor(const ref_opt_t *r, ref_tensor_t *t, const double *g, double lr,
                        double wd, int64_t step, int decoupled) {
  const double bc1 = 1.0 - pow(r->beta1, (double)step);
  const double bc2 = 1.0 - pow(r->beta2, (double)step);
  for (int64_t i = 0; i < t->numel; i++) {
    double gi = g[i];
    /* fp32 rounding of the g the moments see (4 ulp of its terms). */
    double dg = fabs(gi), gerr;
    if (decoupled) {
      t->w[i] *= 1.0 - lr * wd;
      gerr = 0x1p-21 * dg;
    } else {
      dg += fabs(wd * t->w[i]);
      gi += wd * t->w[i];
      gerr = 0x1p-21 * dg + fabs(wd) * t->werr[i];
    }
    t->m[i] = r->beta1 * t->m[i] + (1.0 - r->beta1) * gi;
    t->v[i] = r->beta2 * t->v[i] + (1.0 - r->beta2) * gi * gi;
    t->merr[i] = r->beta1 * t->merr[i] + (1.0 - r->beta1) * gerr;
    t->verr[i] = r->beta2 * t->verr[i] + (1.0 - r->beta2) * (2.0 * fabs(gi) + gerr) * gerr;
    const double denom = sqrt(t->v[i]) / sqrt(bc2) + r->eps;
    t->w[i] -= (lr / bc1) * t->m[i] / denom;
    t->werr[i] += (lr / bc1) * (1.0 - r->beta1) * 0x1p-21 * dg / denom;
  }
}

static void sgd_tensor(const ref_opt_t *r, ref_tensor_t *t, const double *g, double lr,
                       double wd) {
  for (int64_t i = 0; i < t->numel; i++) {
    double d = g[i] + wd * t->w[i];
    if (r->momentum != 0.0) {
      if (!t->buf_init)
        t->buf[i] = d;
      else
        t->buf[i] = r->momentum * t->buf[i] + (1.0 - r->dampening) * d;
      d = r->nesterov ? d + r->momentum * t->buf[i] : t->buf[i];
    }
    t->w[i] -= lr * d;
  }
  if (r->momentum != 0.0) t->buf_init = 1;
}

static void lamb_tensor(const ref_opt_t *r, ref_tensor_t *t, const double *g, double lr,
                        double wd, int64_t step) {
  const double bc1 = r->bias_correction ? 1.0 - pow(r->beta1, (double)step) : 1.0;
  const double bc2 = r->bias_correction ? 1.0 - pow(r->beta2, (double)step) : 1.0;
  double *u = malloc((size_t)(t->numel + 1) * sizeof *u);
  double wsq = 0.0, usq = 0.0;
  for (int64_t i = 0; i < t->numel; i++) {
    t->m[i] = r->beta1 * t->m[i] + (1.0 - r->beta1) * g[i];
    t->v[i] = r->beta2 * t->v[i] + (1.0 - r->beta2) * g[i] * g[i];
    const double denom = sqrt(t->v[i] / bc2) + r->eps;
    u[i] = (t->m[i] / bc1) / denom + wd * t->w[i];
    t->werr[i] += lr * (1.0 - r->beta1) / bc1 * 0x1p-21 * fabs(g[i]) / denom;
    wsq += t->w[i] * t->w[i];
    usq += u[i] * u[i];
  }
  const double wn = sqrt(wsq), un = sqrt(usq);
  const int adapt = r->lamb_always_adapt || wd != 0.0;
  const double ratio = (adapt && wn > 0.0 && un > 0.0) ? wn / un : 1.0;
  for (int64_t i = 0; i < t->numel; i++) t->w[i] -= lr * ratio * u[i];
  free(u);
}

void ref_step(ref_opt_t *r, const float *const *g) {
  /* Unscale and take the global norm (GradScaler.unscale_ then clip_grad_norm_). */
  double **gd = calloc((size_t)(r->n > 0 ? r->n : 1), sizeof *gd);
  const double inv = 1.0 / (double)r->loss_scale;
  double sumsq = 0.0;
  int found_inf = 0;
  for (int64_t i = 0; i < r->n; i++) {
    gd[i] = malloc((size_t)(r->t[i].numel + 1) * sizeof(double));
    for (int64_t k = 0; k < r->t[i].numel; k++) {
      const double x = r->take_stats ? (double)g[i][k] * inv : (double)g[i][k];
      gd[i][k] = x;
      if (!isfinite(x)) found_inf = 1;
      sumsq += x * x;
    }
  }
  int skip = 0;
  if (r->take_stats) {
    const double norm = sqrt(sumsq);
    r->last_grad_norm = norm;
    skip = found_inf || !isfinite(norm);
    if (!skip && r->max_grad_norm > 0.0) {
      const double coef = ref_clip_coef(norm, r->max_grad_norm);
      for (int64_t i = 0; i < r->n; i++)
        for (int64_t k = 0; k < r->t[i].numel; k++) gd[i][k] *= coef;
    }
    r->last_skipped = skip;
    if (skip) r->skipped_steps++;
    if (r->dynamic)
      ref_scaler_update(&r->loss_scale, &r->growth_tracker, skip, r->growth_factor,
                        r->backoff_factor, r->growth_interval);
  }
  if (!skip) {
    const int64_t step = r->step + 1;
    for (int64_t i = 0; i < r->n; i++) {
      ref_tensor_t *t = &r->t[i];
      const double lr = r->lr * r->lr_mult[t->group];
      const double wd = (t->flags & MTOPT_TENSOR_NO_WEIGHT_DECAY)
                            ? 0.0
                            : r->weight_decay * r->wd_mult[t->group];
      switch (r->kind) {
      case MTOPT_OPTIMIZER_ADAMW: adam_tensor(r, t, gd[i], lr, wd, step, 1); break;
      case MTOPT_OPTIMIZER_ADAM: adam_tensor(r, t, gd[i], lr, wd, step, 0); break;
      case MTOPT_OPTIMIZER_SGD: sgd_tensor(r, t, gd[i], lr, wd); break;
      case MTOPT_OPTIMIZER_LAMB: lamb_tensor(r, t, gd[i], lr, wd, step); break;
      }
    }
    r->step = step;
  }
  for (int64_t i = 0; i < r->n; i++) free(gd[i]);
  free(gd);
}

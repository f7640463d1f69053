/*
 * The per-element formulas of every optimizer, and the scalar bookkeeping of a
 * step, written once for both backends. The CPU backend (C, gcc) and the CUDA
 * backend (nvcc) include this file; the CPU backend is the executable
 * specification of the CUDA one.
 *
 * Bit-for-bit agreement between the backends rests on:
 *  - the same operation order, with every fused multiply-add written as fmaf()
 *    and no others (the build passes -ffp-contract=off to the C compiler and
 *    -fmad=false to nvcc, so neither contracts on its own);
 *  - IEEE sqrtf and division (no fast-math on either side);
 *  - scalars derived from the step count by the same double-precision code
 *    (mtopt__powi: repeated squaring, no libm pow, whose last bit differs
 *    between glibc and CUDA).
 * Reductions (norms) are the exception: their order differs between a CPU
 * loop and a GPU tree, so norms agree to a tolerance, not to the bit.
 *
 * Formula variants (docs/optimizers.md names them for users):
 *  AdamW  w = w*(1 - lr*wd); m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g*g;
 *         w -= lr/bc1 * m / (sqrt(v)/sqrt(bc2) + eps)         (torch.optim.AdamW)
 *  Adam   g += wd*w, then as AdamW without the decay of w         (torch.optim.Adam)
 *  SGD    d = g + wd*w; buf = d on the first step, else mom*buf + (1-damp)*d;
 *         d = nesterov ? d + mom*buf : buf; w -= lr*d              (torch.optim.SGD)
 *  LAMB   m, v as Adam; u = (m/bc1) / (sqrt(v/bc2) + eps) + wd*w;
 *         w -= lr * trust * u, trust = |w|/|u| per tensor     (apex FusedLAMB)
 * where bc1 = 1 - b1^t, bc2 = 1 - b2^t and t counts applied steps from 1.
 */
#ifndef MTOPT_STEP_MATH_H
#define MTOPT_STEP_MATH_H

#include <math.h>
#include <stdint.h>

#include "plan.h"

/* Per-chunk scalars, derived once per chunk from the block, the tensor's group
 * and the tensor (its flags; whether it has an SGD momentum buffer). */
typedef struct {
  float lr;     /* lr * group lr_mult */
  float wd;     /* weight_decay * group wd_mult, or 0 for NO_WEIGHT_DECAY */
  float gscale; /* factor applied to every g: clip / loss_scale */
  float b1, b2, omb1, omb2, eps;
  float step_size; /* Adam: lr / bc1 */
  float bc2_sqrt;  /* Adam: sqrt(bc2) */
  float decay;     /* AdamW: 1 - lr*wd */
  float bc1, bc2;  /* LAMB: 1 - b^t, or 1 without bias correction */
  float momentum; /* SGD: 0 where the tensor has no buffer (then the step
                     ignores momentum, as it has nowhere to keep it) */
  float omdamp;
  int32_t nesterov;
  int32_t first; /* SGD: the first applied step initialises the buffer */
} mtopt__scalars_t;

/* b^t by repeated squaring in double: the same bits on every backend. */
MTOPT_HD double mtopt__powi(double b, int64_t t) {
  double r = 1.0;
  while (t > 0) {
    if (t & 1) r *= b;
    b *= b;
    t >>= 1;
  }
  return r;
}

MTOPT_HD mtopt__scalars_t mtopt__chunk_scalars(const mtopt__hyper_t *h,
                                               const mtopt__group_rec_t *grp,
                                               const mtopt__tensor_rec_t *tensor) {
  mtopt__scalars_t s;
  const int64_t t = h->step + 1; /* the step being applied */
  s.lr = h->lr * grp->lr_mult;
  s.wd = (tensor->flags & MTOPT__FLAG_NO_WEIGHT_DECAY) ? 0.0f
                                                       : h->weight_decay * grp->wd_mult;
  s.gscale = h->grad_scale;
  s.b1 = h->beta1;
  s.b2 = h->beta2;
  s.omb1 = 1.0f - h->beta1;
  s.omb2 = 1.0f - h->beta2;
  s.eps = h->eps;
  const double bc1 = 1.0 - mtopt__powi((double)h->beta1, t);
  const double bc2 = 1.0 - mtopt__powi((double)h->beta2, t);
  s.step_size = (float)((double)s.lr / bc1);
  s.bc2_sqrt = (float)sqrt(bc2);
  s.decay = 1.0f - s.lr * s.wd;
  s.bc1 = h->bias_correction ? (float)bc1 : 1.0f;
  s.bc2 = h->bias_correction ? (float)bc2 : 1.0f;
  s.momentum = tensor->s0 ? h->momentum : 0.0f;
  s.omdamp = 1.0f - h->dampening;
  s.nesterov = h->nesterov;
  s.first = (t == 1);
  return s;
}

/* Adam (decoupled = 0) and AdamW (decoupled = 1). */
MTOPT_HD void mtopt__adam_elem(const mtopt__scalars_t *s, int decoupled, float g,
                               float *w, float *m, float *v) {
  float p = *w;
  g = g * s->gscale;
  if (decoupled)
    p = p * s->decay;
  else
    g = fmaf(s->wd, p, g);
  const float mn = fmaf(s->b1, *m, s->omb1 * g);
  const float vn = fmaf(s->b2, *v, (s->omb2 * g) * g);
  const float denom = sqrtf(vn) / s->bc2_sqrt + s->eps;
  *w = fmaf(-s->step_size, mn / denom, p);
  *m = mn;
  *v = vn;
}

/* SGD; buf is NULL-free: with s->momentum == 0 (none, or no buffer: see
 * mtopt__scalars_t) the caller passes a dummy. */
MTOPT_HD void mtopt__sgd_elem(const mtopt__scalars_t *s, float g, float *w,
                              float *buf) {
  const float p = *w;
  float d = fmaf(s->wd, p, g * s->gscale);
  if (s->momentum != 0.0f) {
    const float b = s->first ? d : fmaf(s->momentum, *buf, s->omdamp * d);
    *buf = b;
    d = s->nesterov ? fmaf(s->momentum, b, d) : b;
  }
  *w = fmaf(-s->lr, d, p);
}

/* LAMB's update direction from the new moments; both LAMB passes call it, so
 * the second recomputes exactly the u whose norm the first measured. */
MTOPT_HD float mtopt__lamb_dir(const mtopt__scalars_t *s, float w, float m,
                               float v) {
  const float denom = sqrtf(v / s->bc2) + s->eps;
  return fmaf(s->wd, w, (m / s->bc1) / denom);
}

/* LAMB pass 1: new moments; returns u for the norm. */
MTOPT_HD float mtopt__lamb_moments_elem(const mtopt__scalars_t *s, float g,
                                        float w, float *m, float *v) {
  g = g * s->gscale;
  const float mn = fmaf(s->b1, *m, s->omb1 * g);
  const float vn = fmaf(s->b2, *v, (s->omb2 * g) * g);
  *m = mn;
  *v = vn;
  return mtopt__lamb_dir(s, w, mn, vn);
}

/* LAMB's per-tensor step length lr * trust ratio, from the squared norms of w
 * and of u (apex: ratio only where decay != 0 unless NVLAMB). */
MTOPT_HD float mtopt__lamb_step(const mtopt__hyper_t *h, const mtopt__scalars_t *s,
                                mtopt__sum_t wsq, mtopt__sum_t usq) {
  /* The sums are doubles (plan.h): the ratio of the norms is taken in double
   * and rounded once, so tensors whose norms exceed float's range still get
   * a finite trust ratio. */
  const int adapt = h->lamb_always_adapt || s->wd != 0.0f;
  const float trust = (adapt && wsq > 0.0 && usq > 0.0) ? (float)(sqrt(wsq) / sqrt(usq)) : 1.0f;
  return s->lr * trust;
}

/* The gradient as the statistics pass sees it: unscaled. */
MTOPT_HD float mtopt__inv_loss_scale(const mtopt__hyper_t *h) {
  return (float)(1.0 / (double)h->loss_scale);
}

/* End of the statistics pass: from the sum of squares of the unscaled gradient
 * and the count of non-finite values, decide skip and clip, and advance the
 * dynamic loss scale (torch GradScaler.update's rule). */
MTOPT_HD void mtopt__stats_finalize(mtopt__hyper_t *h, double sumsq,
                                    uint64_t nonfinite) {
  const float inv = mtopt__inv_loss_scale(h);
  const float norm = (float)sqrt(sumsq);
  const int skip = nonfinite != 0 || !isfinite(norm);
  float clip = 1.0f;
  if (h->max_grad_norm > 0.0f) {
    clip = h->max_grad_norm / (norm + 1e-6f); /* torch clip_grad_norm_ */
    if (clip > 1.0f) clip = 1.0f;
  }
  h->grad_scale = inv * clip;
  h->skip = skip;
  h->last_grad_norm = norm;
  h->last_skipped = skip;
  if (skip) h->skipped_steps += 1;
  if (h->dynamic_loss_scale) {
    if (skip) {
      h->loss_scale *= h->backoff_factor;
      h->growth_tracker = 0;
    } else if (h->growth_tracker + 1 >= h->growth_interval) {
      const float grown = h->loss_scale * h->growth_factor;
      if (isfinite(grown)) h->loss_scale = grown;
      h->growth_tracker = 0;
    } else {
      h->growth_tracker += 1;
    }
  }
}

/* End of the step, after its last pass: count it unless skipped. */
MTOPT_HD void mtopt__step_commit(const mtopt__plan_t *p, mtopt__hyper_t *h) {
  if (!p->use_stats) h->last_skipped = 0;
  if (!h->skip) h->step += 1;
  h->skip = 0;
}

#endif /* MTOPT_STEP_MATH_H */

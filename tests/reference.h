/* A double-precision scalar reference of every optimizer mtopt implements and
 * of the fused mixed-precision bookkeeping around it, written from the formulas
 * as torch (and apex, for LAMB) document them, not from src/common/step_math.h:
 *
 *  torch.optim.AdamW  p *= 1 - lr*wd; m = b1*m + (1-b1)*g; v = b2*v + (1-b2)*g^2;
 *                     p -= (lr/bc1) * m / (sqrt(v)/sqrt(bc2) + eps)
 *  torch.optim.Adam   g += wd*p, then as AdamW without the decay of p
 *  torch.optim.SGD    d = g + wd*p; buf = d (first step) or mom*buf + (1-damp)*d;
 *                     d = nesterov ? d + mom*buf : buf; p -= lr*d
 *  apex FusedLAMB     m, v as Adam (grad averaging); u = (m/bc1)/(sqrt(v/bc2)+eps)
 *                     + wd*p; ratio = |p|/|u| per tensor where (always_adapt or
 *                     wd != 0) and both norms > 0, else 1; p -= lr*ratio*u
 *                     (bc1 = bc2 = 1 without bias correction)
 *  GradScaler         g /= scale; a step with any non-finite g is skipped (the
 *                     optimizer's step count does not advance); update(): on
 *                     inf scale *= backoff and tracker = 0, else tracker += 1 and
 *                     at growth_interval scale *= growth (kept only if finite),
 *                     tracker = 0. The scale is an fp32 tensor in torch.
 *  clip_grad_norm_    norm = |all g|_2; coef = min(max_norm/(norm+1e-6), 1);
 *                     g *= coef
 * with bc1 = 1 - b1^t, bc2 = 1 - b2^t, t counting applied steps from 1, and per
 * group lr = lr*lr_mult, wd = wd*wd_mult (0 for tensors flagged no-decay).
 */
#ifndef MTOPT_TEST_REFERENCE_H
#define MTOPT_TEST_REFERENCE_H

#include <stdint.h>

#include "mtopt/mtopt.h"

typedef struct {
  int64_t numel;
  int32_t group;
  uint32_t flags;
  double *w;   /* weights */
  double *m;   /* Adam family / LAMB first moment */
  double *v;   /* second moment */
  double *buf; /* SGD momentum buffer */
  int buf_init;
  /* Per element, a bound on how far an fp32 implementation may drift from
   * this reference for reasons of conditioning, not of formula: where Adam's
   * denominator sqrt(v_hat) + eps is tiny (g ~ 0, or g + wd*w cancelling in
   * Adam's L2 form at the first steps), the fp32 rounding of g (about 2^-23 of
   * the terms that formed it) is amplified by lr / denominator. Summed over
   * steps; zero for SGD. Tests add it to their weight tolerance. */
  double *werr;
  /* The same bound for the moments: the g they see carries its own fp32
   * rounding and, in Adam's L2 form, wd times the weight's drift (werr). */
  double *merr, *verr;
} ref_tensor_t;

typedef struct {
  /* Hyperparameters; tests may change them between steps (as set_hyperparam). */
  int kind; /* mtopt_optimizer_kind_t */
  double lr, beta1, beta2, eps, weight_decay, momentum, dampening;
  int nesterov, bias_correction, lamb_always_adapt;
  double max_grad_norm; /* 0: no clipping */
  int take_stats;       /* unscale / skip non-finite / clip */
  float loss_scale;     /* fp32, as GradScaler keeps it */
  int dynamic;
  float growth_factor, backoff_factor;
  int growth_interval;
  double lr_mult[MTOPT_MAX_GROUPS], wd_mult[MTOPT_MAX_GROUPS];

  int64_t n;
  ref_tensor_t *t;

  /* Step state. */
  int64_t step, skipped_steps;
  int growth_tracker;
  int last_skipped;
  double last_grad_norm; /* NaN when no statistics are taken */
} ref_opt_t;

/* Takes the hyperparameters from an mtopt config (the float values, widened)
 * and copies the initial weights w0[i] (numel[i] floats). group/flags may be
 * NULL (group 0, no flags). */
void ref_init(ref_opt_t *r, const mtopt_optimizer_config_t *c, int64_t n,
              const int64_t *numel, const int32_t *group, const uint32_t *flags,
              const float *const *w0);
void ref_free(ref_opt_t *r);

/* One step with gradients g[i] (numel[i] floats each) as the user hands them to
 * the library, i.e. multiplied by the current loss scale. */
void ref_step(ref_opt_t *r, const float *const *g);

/* The pieces, for tests of the bookkeeping alone. */
double ref_clip_coef(double norm, double max_norm);
void ref_scaler_update(float *scale, int *tracker, int found_inf, float growth,
                       float backoff, int interval);

#endif /* MTOPT_TEST_REFERENCE_H */

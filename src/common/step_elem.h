/*
 * One element of each pass in any dtype combination: load in fp32 (the master
 * where there is one), the formula of step_math.h, rounded stores. Both
 * backends' mixed-precision paths call these, so their results are the same
 * bits; the all-F32 fast paths call the formulas directly on floats, which
 * gives the same bits again.
 *
 * i is the element index within the tensor record. Stochastic rounding draws
 * its bits from (key, sr_elem0 + i) (dtype.h: the parameter's and first
 * moment's draw per element, the second moment's per pair; MTOPT__SR_SHIFT_*
 * say which bits go to which array).
 */
#ifndef MTOPT_COMMON_STEP_ELEM_H
#define MTOPT_COMMON_STEP_ELEM_H

#include "dtype.h"
#include "step_math.h"

/* The gradient, unscaled by the statistics pass's inv. */
MTOPT_HD float mtopt__grad_elem(const mtopt__tensor_rec_t *t, int64_t i) {
  return mtopt__ld(t->g, t->gdt, i);
}

typedef struct {
  uint32_t pm, v; /* the draws: pm's 32 bits, v's low 16 */
} mtopt__draws_t;

/* Where each array's 16 random bits sit in its draw: the weight (the
 * parameter written without a master) in pm's low half, the first moment or
 * momentum buffer in pm's high half, the second moment in v's low half. The
 * vector paths (cpu_tiles.c, mixed_vec.cuh) read these too. */
#define MTOPT__SR_SHIFT_W 0
#define MTOPT__SR_SHIFT_S0 16
#define MTOPT__SR_SHIFT_S1 0
#define MTOPT__SR_BITS(draw, shift) (((draw) >> (shift)) & 0xffffu)

MTOPT_HD mtopt__draws_t mtopt__draws(const mtopt__sr_t *sr, const mtopt__tensor_rec_t *t,
                                     int64_t i) {
  mtopt__draws_t d;
  d.pm = d.v = 0u;
  if (sr->on) {
    const int64_t e = t->sr_elem0 + i;
    d.pm = mtopt__sr_bits(sr->pm, e);
    d.v = mtopt__sr_bits_v(sr->v, e);
  }
  return d;
}

/* The UPDATE pass of every kind; LAMB adds w^2 and u^2 to *wsq, *usq. */
MTOPT_HD void mtopt__update_elem(int kind, const mtopt__scalars_t *s, const mtopt__sr_t *sr,
                                 const mtopt__tensor_rec_t *t, int64_t i, mtopt__sum_t *wsq,
                                 mtopt__sum_t *usq) {
  const float g = mtopt__grad_elem(t, i);
  float w = mtopt__ld_weight(t, i);
  const mtopt__draws_t d = mtopt__draws(sr, t, i);
  if (kind == MTOPT__KIND_ADAMW || kind == MTOPT__KIND_ADAM) {
    float m = mtopt__ld(t->s0, t->sdt, i), v = mtopt__ld(t->s1, t->sdt, i);
    mtopt__adam_elem(s, kind == MTOPT__KIND_ADAMW, g, &w, &m, &v);
    mtopt__st_weight(t, i, w, sr->on, MTOPT__SR_BITS(d.pm, MTOPT__SR_SHIFT_W));
    mtopt__st(t->s0, t->sdt, i, m, sr->on, MTOPT__SR_BITS(d.pm, MTOPT__SR_SHIFT_S0));
    mtopt__st(t->s1, t->sdt, i, v, sr->on, MTOPT__SR_BITS(d.v, MTOPT__SR_SHIFT_S1));
  } else if (kind == MTOPT__KIND_SGD) {
    float buf = s->momentum != 0.0f ? mtopt__ld(t->s0, t->sdt, i) : 0.0f;
    mtopt__sgd_elem(s, g, &w, &buf);
    mtopt__st_weight(t, i, w, sr->on, MTOPT__SR_BITS(d.pm, MTOPT__SR_SHIFT_W));
    if (s->momentum != 0.0f) mtopt__st(t->s0, t->sdt, i, buf, sr->on, MTOPT__SR_BITS(d.pm, MTOPT__SR_SHIFT_S0));
  } else { /* LAMB stage 1: moments, and the sums for the norms */
    float m = mtopt__ld(t->s0, t->sdt, i), v = mtopt__ld(t->s1, t->sdt, i);
    float u = mtopt__lamb_moments_elem(s, g, w, &m, &v);
    mtopt__st(t->s0, t->sdt, i, m, sr->on, MTOPT__SR_BITS(d.pm, MTOPT__SR_SHIFT_S0));
    mtopt__st(t->s1, t->sdt, i, v, sr->on, MTOPT__SR_BITS(d.v, MTOPT__SR_SHIFT_S1));
    /* The second pass applies u from the moments as stored: measure that u. */
    if (t->sdt != MTOPT__DT_F32)
      u = mtopt__lamb_dir(s, w, mtopt__ld(t->s0, t->sdt, i), mtopt__ld(t->s1, t->sdt, i));
    *wsq += (mtopt__sum_t)w * w; /* exact squares, summed in double (plan.h) */
    *usq += (mtopt__sum_t)u * u;
  }
}

/* LAMB's second pass: w -= step * u, u from the stored moments. */
MTOPT_HD void mtopt__lamb_apply_elem(const mtopt__scalars_t *s, const mtopt__sr_t *sr,
                                     const mtopt__tensor_rec_t *t, int64_t i, float step) {
  const float w = mtopt__ld_weight(t, i);
  const float m = mtopt__ld(t->s0, t->sdt, i), v = mtopt__ld(t->s1, t->sdt, i);
  const mtopt__draws_t d = mtopt__draws(sr, t, i);
  mtopt__st_weight(t, i, fmaf(-step, mtopt__lamb_dir(s, w, m, v), w), sr->on, MTOPT__SR_BITS(d.pm, MTOPT__SR_SHIFT_W));
}

#endif /* MTOPT_COMMON_STEP_ELEM_H */

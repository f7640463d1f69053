/*
 * The number formats of mixed precision, written out in integer arithmetic so
 * that gcc (the CPU backend) and nvcc (the kernels) produce the same bits:
 * bf16 and fp16 to fp32 (exact), fp32 to bf16 and fp16 rounded to nearest
 * even, fp32 to bf16 rounded stochastically, the split of an fp32 master into
 * a bf16 parameter and a 16-bit remainder, and the counter-based generator of
 * the stochastic rounding bits. No compiler's optional half-precision type is
 * used. (CUDA's 8-wide bf16 stores use the hardware conversion where it gives
 * these bits: backend/cuda/mixed_vec.cuh, pack_bf16x8.)
 */
#ifndef MTOPT_COMMON_DTYPE_H
#define MTOPT_COMMON_DTYPE_H

#include <stdint.h>
#include <string.h>

#include "plan.h"

/* Storage formats, as mtopt_dtype_t (core/tensor_list.c asserts that they
 * agree). */
#define MTOPT__DT_F32 0
#define MTOPT__DT_F16 1
#define MTOPT__DT_BF16 2
#define MTOPT__NUM_DTYPES 3

MTOPT_HD int mtopt__dt_size(int dt) { return dt == MTOPT__DT_F32 ? 4 : 2; }

MTOPT_HD uint32_t mtopt__f32_bits(float x) {
  uint32_t b;
  memcpy(&b, &x, sizeof b);
  return b;
}

MTOPT_HD float mtopt__bits_f32(uint32_t b) {
  float x;
  memcpy(&x, &b, sizeof x);
  return x;
}

/* ---- bf16: the top half of an fp32 ---- */

MTOPT_HD float mtopt__bf16_to_f32(uint16_t h) { return mtopt__bits_f32((uint32_t)h << 16); }

/* The two roundings of an fp32 that is not NaN, on its bits: to nearest,
 * ties to even (a carry into the exponent is the right result, up to inf),
 * and stochastic, up (in magnitude) with probability equal to the fraction of
 * the way to the next bf16, from 16 random bits, so that the expected result
 * is x (inf, whose low half is zero, stays inf). The vector loops run them
 * over a whole tile or group and take the NaN path only where one appears. */
MTOPT_HD int mtopt__f32_bits_nan(uint32_t b) { return (b & 0x7fffffffu) > 0x7f800000u; }

MTOPT_HD uint16_t mtopt__bf16_rne_bits(uint32_t b) {
  return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

MTOPT_HD uint16_t mtopt__bf16_sr_bits(uint32_t b, uint32_t rand16) {
  return (uint16_t)((b + (rand16 & 0xffffu)) >> 16);
}

/* A NaN keeps its top bits, quieted: it must not round into inf. */
MTOPT_HD uint16_t mtopt__bf16_nan_bits(uint32_t b) { return (uint16_t)((b >> 16) | 0x0040u); }

/* Round to nearest, ties to even; NaN stays a (quiet) NaN, overflow gives inf. */
MTOPT_HD uint16_t mtopt__f32_to_bf16(float x) {
  const uint32_t b = mtopt__f32_bits(x);
  return mtopt__f32_bits_nan(b) ? mtopt__bf16_nan_bits(b) : mtopt__bf16_rne_bits(b);
}

/* Stochastic rounding from rand16's low 16 bits; NaN stays NaN, inf inf.
 * mtopt__bf16_sr_bits keeps inf by itself; the explicit test is for nvcc,
 * whose bf16-state kernels spill 20 bytes more without it (ptxas -v). */
MTOPT_HD uint16_t mtopt__f32_to_bf16_sr(float x, uint32_t rand16) {
  const uint32_t b = mtopt__f32_bits(x);
  if (mtopt__f32_bits_nan(b)) return mtopt__bf16_nan_bits(b);
  if ((b & 0x7fffffffu) == 0x7f800000u) return (uint16_t)(b >> 16);
  return mtopt__bf16_sr_bits(b, rand16);
}

/* ---- fp16 (IEEE binary16) ---- */

/* Exact: every fp16 value is an fp32 value. */
MTOPT_HD float mtopt__f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1fu) return mtopt__bits_f32(sign | 0x7f800000u | (man << 13)); /* inf, NaN */
  if (exp == 0) {
    if (man == 0) return mtopt__bits_f32(sign); /* +-0 */
    /* subnormal: man * 2^-24, normalised */
    exp = 127 - 15 + 1;
    while (!(man & 0x400u)) {
      man <<= 1;
      exp--;
    }
    man &= 0x3ffu;
    return mtopt__bits_f32(sign | (exp << 23) | (man << 13));
  }
  return mtopt__bits_f32(sign | ((exp + 127 - 15) << 23) | (man << 13));
}

/* Round to nearest, ties to even, with fp16 subnormals; overflow gives inf,
 * NaN a quiet NaN. */
MTOPT_HD uint16_t mtopt__f32_to_f16(float x) {
  const uint32_t b = mtopt__f32_bits(x);
  const uint16_t sign = (uint16_t)((b >> 16) & 0x8000u);
  const uint32_t a = b & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
  if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* >= 65520: rounds to inf */
  if (a >= 0x38800000u) { /* normal fp16: 2^-14 and up */
    const uint32_t r = a - ((uint32_t)(127 - 15) << 23); /* rebias the exponent */
    return (uint16_t)(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
  }
  if (a < 0x33000000u) return sign; /* below half the smallest subnormal (2^-25) */
  /* subnormal fp16: the value in units of 2^-24, rounded to nearest even */
  const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126u - e; /* 14..24: m * 2^(e-150) / 2^-24 = m >> (126 - e) */
  const uint32_t q = m >> shift, rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  return (uint16_t)(sign | (q + (rest > half || (rest == half && (q & 1u)))));
}

/* ---- the bf16 parameter and its 16-bit remainder (MTOPT_MASTER_REMAINDER) ----
 * The master is the fp32 whose bits are (hi << 16) | rem. The parameter is the
 * master rounded to nearest with ties away from zero, hi + (rem >= 0x8000):
 * ties cannot go to even, because 16 remainder bits then could not tell which
 * way a tie went. Splitting and joining are exact inverses. */
MTOPT_HD void mtopt__split_master(float master, uint16_t *param, uint16_t *rem) {
  const uint32_t b = mtopt__f32_bits(master);
  *rem = (uint16_t)(b & 0xffffu);
  *param = (uint16_t)((b >> 16) + ((b >> 15) & 1u));
}

MTOPT_HD float mtopt__join_master(uint16_t param, uint16_t rem) {
  const uint32_t hi = (uint32_t)(uint16_t)(param - (rem >> 15));
  return mtopt__bits_f32((hi << 16) | rem);
}

/* ---- the stochastic-rounding generator ----
 * Counter-based: the bits of a rounding are a hash of (seed, step, tensor,
 * the array written, element index within the tensor), so they do not depend
 * on chunking, grid, thread count or backend, and a resumed run rounds as an
 * uninterrupted one. Each element draws one 32-bit hash for the parameter and
 * the first moment (or momentum buffer), 16 bits each; the second moment's 16
 * bits are half of a hash that serves a pair of elements (2j, 2j + 1). A hash
 * is two multiply-fold rounds (the halves of a 32 x 32 -> 64-bit product
 * xor'ed) over the key xor a Weyl sequence of the element index: two wide
 * multiplies and two xors, where the two multiply-xorshift rounds it replaced
 * took about twice the instructions (perf_notes_mixed.md, v19). Its streams
 * pass a subset of dieharder's tests along the elements, across steps and
 * over neighbours' 16-bit halves (the same notes), and tests/dtype_convert.c
 * checks the bit balance and independence the rounding needs. */

/* One multiply-fold round: the two halves of x * m, xor'ed. */
MTOPT_HD uint32_t mtopt__fold32(uint32_t x, uint32_t m) {
#ifdef __CUDA_ARCH__
  return x * m ^ __umulhi(x, m); /* nvcc makes more of the 64-bit form */
#else
  const uint64_t p = (uint64_t)x * m;
  return (uint32_t)p ^ (uint32_t)(p >> 32);
#endif
}

/* The 64-bit finaliser of splitmix64. */
MTOPT_HD uint64_t mtopt__mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Which arrays share a draw: the parameter with the first moment (or SGD's
 * momentum buffer), the second moment alone. */
#define MTOPT__SR_STREAM_PM 0
#define MTOPT__SR_STREAM_V 1

/* The key of one (seed, step, tensor, stream): once per chunk. */
MTOPT_HD uint32_t mtopt__sr_key(uint64_t seed, int64_t step, int64_t tensor, int stream) {
  const uint64_t k = mtopt__mix64(seed ^ mtopt__mix64((uint64_t)step * 0x9e3779b97f4a7c15ull +
                                                      (uint64_t)tensor * 4u + (uint64_t)stream));
  return (uint32_t)(k ^ (k >> 32));
}

/* The Weyl sequence of the element index: a step of MTOPT__SR_WEYL per
 * element, so that elements e .. e + n - 1 of one 2^32 block are weyl(e) +
 * k * MTOPT__SR_WEYL (the vector paths step it so). */
#define MTOPT__SR_WEYL 0x9e3779b9u
#define MTOPT__SR_WEYL_HI 0x85ebca6bu /* per 2^32 elements */

MTOPT_HD uint32_t mtopt__sr_weyl(int64_t elem) {
  const uint32_t lo = (uint32_t)elem, hi = (uint32_t)((uint64_t)elem >> 32);
  return lo * MTOPT__SR_WEYL + hi * MTOPT__SR_WEYL_HI;
}

/* mtopt__sr_weyl(e + k) from w0 = mtopt__sr_weyl(e) and lo0, e's low 32
 * bits: one add, and the high word's step where e + k carries into it (the
 * CPU's tiles; the CUDA vector path keeps a chunk in one 2^32 block). */
MTOPT_HD uint32_t mtopt__sr_weyl_at(uint32_t w0, uint32_t lo0, uint32_t k) {
  return w0 + k * MTOPT__SR_WEYL + (lo0 + k < lo0 ? MTOPT__SR_WEYL_HI : 0u);
}

/* The draw at Weyl value w under `key`. */
MTOPT_HD uint32_t mtopt__sr_mix(uint32_t key, uint32_t w) {
  return mtopt__fold32(mtopt__fold32(key ^ w, 0x7feb352du), 0x846ca68bu);
}

/* 32 random bits for element `elem` of the tensor under `key`. */
MTOPT_HD uint32_t mtopt__sr_bits(uint32_t key, int64_t elem) {
  return mtopt__sr_mix(key, mtopt__sr_weyl(elem));
}

/* The second moment's bits of element `elem` (elem >= 0), in the low 16 bits:
 * the pair's draw (mtopt__sr_bits at elem >> 1), the half the parity picks. */
MTOPT_HD uint32_t mtopt__sr_half_v(uint32_t pair_draw, int64_t elem) {
  return pair_draw >> (16 * (uint32_t)(elem & 1));
}

MTOPT_HD uint32_t mtopt__sr_bits_v(uint32_t key, int64_t elem) {
  return mtopt__sr_half_v(mtopt__sr_bits(key, elem >> 1), elem);
}

/* ---- one element of an array in its dtype ---- */

MTOPT_HD float mtopt__ld(const void *p, int dt, int64_t i) {
  if (dt == MTOPT__DT_F32) return ((const float *)p)[i];
  const uint16_t h = ((const uint16_t *)p)[i];
  return dt == MTOPT__DT_BF16 ? mtopt__bf16_to_f32(h) : mtopt__f16_to_f32(h);
}

/* Stores x rounded for dt: BF16 stochastically from rand16 when sr is set,
 * else (and F16 always) to nearest even. */
MTOPT_HD void mtopt__st(void *p, int dt, int64_t i, float x, int sr, uint32_t rand16) {
  if (dt == MTOPT__DT_F32)
    ((float *)p)[i] = x;
  else if (dt == MTOPT__DT_BF16)
    ((uint16_t *)p)[i] = sr ? mtopt__f32_to_bf16_sr(x, rand16) : mtopt__f32_to_bf16(x);
  else
    ((uint16_t *)p)[i] = mtopt__f32_to_f16(x);
}

/* The weight the step computes with: the master where there is one. */
MTOPT_HD float mtopt__ld_weight(const mtopt__tensor_rec_t *t, int64_t i) {
  if (t->mmode == MTOPT__MASTER_F32) return ((const float *)t->mw)[i];
  if (t->mmode == MTOPT__MASTER_REMAINDER)
    return mtopt__join_master(((const uint16_t *)t->w)[i], ((const uint16_t *)t->mw)[i]);
  return mtopt__ld(t->w, t->wdt, i);
}

/* Writes the new weight: the master and the parameter rounded to nearest from
 * it, or (no master) the parameter rounded as the plan says. */
MTOPT_HD void mtopt__st_weight(const mtopt__tensor_rec_t *t, int64_t i, float x, int sr,
                               uint32_t rand16) {
  if (t->mmode == MTOPT__MASTER_F32) {
    ((float *)t->mw)[i] = x;
    mtopt__st(t->w, t->wdt, i, x, 0, 0u);
  } else if (t->mmode == MTOPT__MASTER_REMAINDER) {
    mtopt__split_master(x, &((uint16_t *)t->w)[i], &((uint16_t *)t->mw)[i]);
  } else {
    mtopt__st(t->w, t->wdt, i, x, sr, rand16);
  }
}

/* The keys of a chunk's stochastic rounding (both streams), or zeros when the
 * plan rounds to nearest. */
typedef struct {
  uint32_t pm, v; /* MTOPT__SR_STREAM_PM, _V */
  int on;
} mtopt__sr_t;

MTOPT_HD mtopt__sr_t mtopt__sr_for(const mtopt__plan_t *p, const mtopt__hyper_t *h,
                                   const mtopt__tensor_rec_t *t) {
  mtopt__sr_t r;
  r.on = p->stochastic;
  r.pm = r.v = 0u;
  if (r.on) {
    const int64_t step = h->step + 1; /* the step being applied */
    r.pm = mtopt__sr_key(h->seed, step, t->sr_tensor, MTOPT__SR_STREAM_PM);
    r.v = mtopt__sr_key(h->seed, step, t->sr_tensor, MTOPT__SR_STREAM_V);
  }
  return r;
}

#endif /* MTOPT_COMMON_DTYPE_H */

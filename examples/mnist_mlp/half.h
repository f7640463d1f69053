/* 16-bit number formats for mnist_mlp, written once for both backends (the
 * CPU loops in mlp_cpu.c and the kernels in mlp_cuda.cu include this): bf16
 * and fp16 to fp32 (exact) and back (rounded to nearest, ties to even), in
 * integer arithmetic, so that gcc and nvcc give the same bits and no
 * compiler's optional half-precision type is needed.
 *
 * mtopt has the same conversions inside (the optimizer rounds with them), but
 * they are not part of its public API, so the example writes its own; they
 * round the same way (nearest even; overflow to inf, as an fp16 gradient must
 * for the dynamic loss scale to see it). */
#ifndef MNIST_HALF_H
#define MNIST_HALF_H

#include <stdint.h>
#include <string.h>

#include "mtopt/mtopt.h"

#ifdef __CUDACC__
#define MLP_HD __host__ __device__ __forceinline__
#else
#define MLP_HD static inline
#endif

MLP_HD uint32_t mlp_f32_bits(float x) {
  uint32_t b;
  memcpy(&b, &x, sizeof b);
  return b;
}

MLP_HD float mlp_bits_f32(uint32_t b) {
  float x;
  memcpy(&x, &b, sizeof x);
  return x;
}

/* bf16 is the top half of an fp32. */
MLP_HD float mlp_bf16_to_f32(uint16_t h) { return mlp_bits_f32((uint32_t)h << 16); }

/* Adding 0x7fff plus the lowest kept bit rounds to nearest with ties to even
 * (a carry into the exponent is the right result, up to inf). NaN must not
 * round into inf: keep its top bits and set the quiet bit. */
MLP_HD uint16_t mlp_f32_to_bf16(float x) {
  const uint32_t b = mlp_f32_bits(x);
  if ((b & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((b >> 16) | 0x0040u);
  return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

/* fp16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. Exact. */
MLP_HD float mlp_f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0x1fu) return mlp_bits_f32(sign | 0x7f800000u | (man << 13)); /* inf, NaN */
  if (exp == 0) { /* zero or subnormal: man * 2^-24, exact in fp32 */
    const float v = (float)man * 5.9604644775390625e-8f;
    return mlp_bits_f32(sign | mlp_f32_bits(v));
  }
  return mlp_bits_f32(sign | ((exp + 127u - 15u) << 23) | (man << 13));
}

/* Round to nearest even, with fp16's subnormals; 65520 and up round to inf. */
MLP_HD uint16_t mlp_f32_to_f16(float x) {
  const uint32_t b = mlp_f32_bits(x), a = b & 0x7fffffffu;
  const uint16_t sign = (uint16_t)((b >> 16) & 0x8000u);
  if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu)); /* NaN, quiet */
  if (a >= 0x47800000u) return (uint16_t)(sign | 0x7c00u); /* >= 2^16 (and inf) */
  if (a >= 0x38800000u) { /* an fp16 normal (>= 2^-14): rebias, drop 13 bits */
    const uint32_t r = a - ((127u - 15u) << 23);
    return (uint16_t)(sign | ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
  }
  /* Below 2^-14: a count of 2^-24 units. a = m 2^(e - 150) with the implicit
   * bit in m, so the count is m >> (126 - e), rounded on the bits shifted out.
   * Exponents below 102 (under 2^-25) round to zero. */
  const uint32_t e = a >> 23;
  if (e < 102u) return sign;
  const uint32_t m = (a & 0x7fffffu) | 0x800000u, shift = 126u - e; /* 14 .. 24 */
  const uint32_t q = m >> shift, rest = m & ((1u << shift) - 1u), half = 1u << (shift - 1u);
  return (uint16_t)(sign | (q + (rest > half || (rest == half && (q & 1u)))));
}

MLP_HD size_t mlp_dtype_size(mtopt_dtype_t dt) { return dt == MTOPT_DTYPE_F32 ? 4u : 2u; }

/* Element i of a buffer stored as dt, as fp32. */
MLP_HD float mlp_load(const void *p, mtopt_dtype_t dt, int64_t i) {
  if (dt == MTOPT_DTYPE_F32) return ((const float *)p)[i];
  const uint16_t h = ((const uint16_t *)p)[i];
  return dt == MTOPT_DTYPE_BF16 ? mlp_bf16_to_f32(h) : mlp_f16_to_f32(h);
}

/* Stores v as element i of a buffer of dt, rounded to nearest even. */
MLP_HD void mlp_store(void *p, mtopt_dtype_t dt, int64_t i, float v) {
  if (dt == MTOPT_DTYPE_F32)
    ((float *)p)[i] = v;
  else
    ((uint16_t *)p)[i] = dt == MTOPT_DTYPE_BF16 ? mlp_f32_to_bf16(v) : mlp_f32_to_f16(v);
}

/* v as it would be stored in dt: v itself for F32. */
MLP_HD float mlp_round(mtopt_dtype_t dt, float v) {
  if (dt == MTOPT_DTYPE_F32) return v;
  return dt == MTOPT_DTYPE_BF16 ? mlp_bf16_to_f32(mlp_f32_to_bf16(v))
                                : mlp_f16_to_f32(mlp_f32_to_f16(v));
}

#endif /* MNIST_HALF_H */

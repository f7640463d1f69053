/* What the CPU backend's chunk loops share (backend_cpu.c, cpu_mixed.c): the
 * run-time ISA dispatch and the fixed order of sums. */
#ifndef MTOPT_BACKEND_CPU_KERNELS_H
#define MTOPT_BACKEND_CPU_KERNELS_H

#include <stdint.h>

#include "../../common/error.h"
#include "../../common/plan.h"

/* ---- run-time ISA dispatch ----
 * The library is built for the baseline ISA (MTOPT_NATIVE off), where gcc
 * cannot vectorise fmaf (it calls libm's). So the element-wise loops are
 * compiled three times, for AVX-512, AVX+FMA and the baseline, and the loader
 * picks one by CPUID (an ifunc); CMake defines MTOPT_CPU_DISPATCH where the
 * compiler has target_clones. Every path gives the same bits: IEEE add, mul,
 * div and sqrt, no contraction (-ffp-contract=off), and fmaf is correctly
 * rounded both in hardware and in libm. Sums have their order written out
 * (below), never left to the vectoriser, whose lane order follows the
 * vector width. */
#if defined(MTOPT_CPU_DISPATCH) && defined(__has_attribute)
#if __has_attribute(target_clones)
#define MTOPT__CPU_CLONES __attribute__((target_clones("avx512f", "fma", "default")))
#endif
#endif
#ifndef MTOPT__CPU_CLONES
#define MTOPT__CPU_CLONES
#endif

/* ---- sums in a fixed order ----
 * A chunk's sums (squares of g; LAMB's w^2 and u^2) are kept in
 * MTOPT__CPU_LANES partial sums: element i of the chunk goes to partial sum
 * i % MTOPT__CPU_LANES, each in element order, and the partial sums are added
 * in lane order. So the fp32 loops (vectorised over the lanes), the
 * mixed-precision loops (an element at a time) and every ISA give the same
 * bits. The partial sums are doubles (mtopt__sum_t, plan.h), each square
 * taken in double: the square of a float is exact there, so one large finite
 * element (1e20, 3e38) cannot overflow the sum as it would in float. */
#define MTOPT__CPU_LANES 16

static inline mtopt__sum_t mtopt__cpu_fold(const mtopt__sum_t lanes[MTOPT__CPU_LANES]) {
  mtopt__sum_t s = 0.0;
  for (int j = 0; j < MTOPT__CPU_LANES; j++) s += lanes[j];
  return s;
}

/* The statistics of a chunk's gradient, unscaled: the squares in the lanes
 * above, and the non-finite values counted per lane (one count folded at
 * the end, not one across the vector every MTOPT__CPU_LANES elements). */
typedef struct {
  mtopt__sum_t sq[MTOPT__CPU_LANES];
  uint32_t bad[MTOPT__CPU_LANES];
} mtopt__cpu_stats_t;

/* Adds x[k] * inv for k < n, element k to lane k % MTOPT__CPU_LANES: a chunk
 * goes in pieces that start at multiples of MTOPT__CPU_LANES from its first
 * element, so that every element keeps its lane (backend_cpu.c). */
MTOPT__HIDDEN void mtopt__cpu_sumsq(const float *x, int32_t n, float inv, mtopt__cpu_stats_t *st);

/* ---- segments with gaps (plan.h: masks) ----
 * The first element in [e, end) whose mask bit is `set` (1: a tensor's, 0: a
 * gap), or end, a word of 32 bits at a time. */
static inline int64_t mtopt__cpu_mask_find(const uint32_t *mask, int64_t e, int64_t end, int set) {
  while (e < end) {
    const uint32_t w = (set ? mask[e >> 5] : ~mask[e >> 5]) >> (e & 31);
    if (w) {
      e += __builtin_ctz(w);
      return e < end ? e : end;
    }
    e = (e | 31) + 1;
  }
  return end;
}

/* The next run [*a, *b) of tensor elements in [from, end) of a record with
 * mask `mask` (NULL: no gaps, so [from, end) is one run); 0 when none is
 * left. A chunk's runs: `for (b = start; mtopt__cpu_next_run(mask, b, end,
 * &a, &b);)`. The fp32 loops then run over each run in place, found in a
 * few operations per 32 elements (an element at a time through the mask ran
 * at 0.13-0.15 of a copy). */
static inline int mtopt__cpu_next_run(const uint32_t *mask, int64_t from, int64_t end,
                                      int64_t *a, int64_t *b) {
  *a = mask ? mtopt__cpu_mask_find(mask, from, end, 1) : from;
  *b = mask ? mtopt__cpu_mask_find(mask, *a, end, 0) : end;
  return *a < end;
}

#endif /* MTOPT_BACKEND_CPU_KERNELS_H */

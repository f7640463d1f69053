/*
 * The UPDATE pass of AdamW, Adam and SGD over a chunk of one of the common
 * mixed-precision layouts, 8 elements per thread at a time with vector loads
 * and stores (step_kernels.cuh falls back to the element-at-a-time path of
 * step_elem.h for every other layout, for LAMB and for the statistics pass).
 *
 * A thread's group of 8 is two pieces of 4, at elements i and i + h. Where
 * every array is 16-bit, h is 4: the group is contiguous, one 16-byte access
 * per array, and a warp's 32 groups are 512 contiguous bytes of each. Where
 * some array is fp32 (SPLIT), a warp steps spans of 256 elements, lane l's
 * pieces at 4l and 128 + 4l (h = 128): each fp32 access of a warp is then
 * 512 contiguous bytes and each 16-bit one 256 (8-byte pieces), where 32
 * contiguous groups would touch a 1 KB span per fp32 access and use half of
 * it (perf_notes.md v13, perf_notes_mixed.md v18). The elements after the
 * chunk's last whole span go in contiguous groups (h = 4) as before.
 *
 * Layouts (template arguments): parameter W and gradient G in F32 or BF16,
 * state S in F32 or BF16, master MM none / F32 / remainders, and SR, whether
 * the plan rounds stochastically (only where some array is written in bf16
 * without a master: elsewhere the nearest path serves, with the same bits,
 * and carries no draws). The element
 * arithmetic is step_elem.h's, operation for operation (the formulas of
 * step_math.h, the rounding of dtype.h, the same stochastic-rounding draws per
 * element), so both paths give the same bits; only the memory access differs.
 *
 * A group of 8 elements needs every array 16-byte aligned at its first
 * element: the library places its arrays (state, masters, gradient buffer)
 * to reach a 16-byte boundary at the same element as the parameter
 * (core/layout.c), so i0, the parameter's first aligned element, serves all;
 * a user gradient at another phase sends the chunk down the scalar path.
 */
#ifndef MTOPT_BACKEND_CUDA_MIXED_VEC_CUH
#define MTOPT_BACKEND_CUDA_MIXED_VEC_CUH

#include "../../common/step_elem.h"

namespace mixed_vec {

/* The 8 16-bit values of a group's 16 bytes, in element order. */
__device__ __forceinline__ void unpack16(uint4 u, uint16_t (&out)[8]) {
  const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
  for (int k = 0; k < 4; k++) {
    out[2 * k] = (uint16_t)(w[k] & 0xffffu);
    out[2 * k + 1] = (uint16_t)(w[k] >> 16);
  }
}

/* The 16 bytes of the 8 16-bit values at element i (16-byte aligned). */
__device__ __forceinline__ uint4 ld16x8(const void *base, int64_t i) {
  return __ldcs(reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(base) + i));
}

/* The 8 raw 16-bit words of a group: pieces at i and i + h (16-byte
 * aligned at i; !SPLIT: h is 4, one load). */
template <bool SPLIT>
__device__ __forceinline__ void ld16(const void *base, int64_t i, int h, uint16_t (&out)[8]) {
  const uint16_t *b = static_cast<const uint16_t *>(base);
  if constexpr (SPLIT) {
    const uint2 lo = __ldcs(reinterpret_cast<const uint2 *>(b + i));
    const uint2 hi = __ldcs(reinterpret_cast<const uint2 *>(b + i + h));
    unpack16(make_uint4(lo.x, lo.y, hi.x, hi.y), out);
  } else {
    unpack16(ld16x8(base, i), out);
  }
}

/* A group's 16-byte words of every array, loaded one group ahead (the
 * pipelined loop of update_chunk: bf16 parameters, gradients and states, no
 * masters): the parameter, the gradient and the states. */
struct Ahead {
  uint4 w, g, s0, s1;
};

template <int KIND>
__device__ __forceinline__ void load_ahead(const mtopt__tensor_rec_t &t, const mtopt__scalars_t &s,
                                           int64_t i, Ahead &a) {
  a.g = ld16x8(t.g, i);
  a.w = ld16x8(t.w, i);
  if constexpr (KIND == MTOPT__KIND_ADAMW || KIND == MTOPT__KIND_ADAM) {
    a.s0 = ld16x8(t.s0, i);
    a.s1 = ld16x8(t.s1, i);
  } else if (s.momentum != 0.0f) {
    a.s0 = ld16x8(t.s0, i);
  }
}

/* ld16, from the words of a group loaded ahead (AHEAD) or from memory. */
template <bool SPLIT, bool AHEAD>
__device__ __forceinline__ void ld16a(const void *base, const uint4 &ahead, int64_t i, int h,
                                      uint16_t (&out)[8]) {
  if constexpr (AHEAD) {
    unpack16(ahead, out);
  } else {
    ld16<SPLIT>(base, i, h, out);
  }
}

/* Stores a group's 8 packed 16-bit words where ld16 reads them. */
template <bool SPLIT>
__device__ __forceinline__ void st16u(void *base, int64_t i, int h, uint4 u) {
  uint16_t *b = static_cast<uint16_t *>(base);
  if constexpr (SPLIT) {
    __stcs(reinterpret_cast<uint2 *>(b + i), make_uint2(u.x, u.y));
    __stcs(reinterpret_cast<uint2 *>(b + i + h), make_uint2(u.z, u.w));
  } else {
    __stcs(reinterpret_cast<uint4 *>(b + i), u);
  }
}

template <bool SPLIT>
__device__ __forceinline__ void st16(void *base, int64_t i, int h, const uint16_t (&x)[8]) {
  uint4 u;
  u.x = (uint32_t)x[0] | ((uint32_t)x[1] << 16);
  u.y = (uint32_t)x[2] | ((uint32_t)x[3] << 16);
  u.z = (uint32_t)x[4] | ((uint32_t)x[5] << 16);
  u.w = (uint32_t)x[6] | ((uint32_t)x[7] << 16);
  st16u<SPLIT>(base, i, h, u);
}

/* 8 floats rounded to bf16 as dtype.h rounds them, packed: to nearest even,
 * or when SR stochastically from the 16 bits of r[k] >> shift. A group with
 * no NaN (every group but a broken step's) takes two instructions a pair
 * instead of about fifteen: cvt.rn.bf16x2.f32 (sm_80 and later; dtype.h's
 * function before) rounds every non-NaN value to
 * nearest even as mtopt__f32_to_bf16 does (subnormals and the overflow to inf
 * included), and the stochastic sum (b + bits) >> 16 needs no test for inf,
 * whose low half is zero (tests/rounding.c: test_bf16_store_bits). The fast
 * words are made for every group and replaced, all four in one branch, in a
 * group with a NaN, which goes through dtype.h and is quieted as the CPU does;
 * a pair's NaN test is one unordered compare of its two values. */
template <bool SR>
__device__ __forceinline__ uint4 pack_bf16x8(const float (&x)[8], const uint32_t (&r)[8],
                                             int shift) {
  auto written_out = [&](int j) { /* pair j through dtype.h */
    uint16_t h[2];
#pragma unroll
    for (int k = 0; k < 2; k++)
      h[k] = SR ? mtopt__f32_to_bf16_sr(x[2 * j + k], MTOPT__SR_BITS(r[2 * j + k], shift))
                : mtopt__f32_to_bf16(x[2 * j + k]);
    return (uint32_t)h[0] | ((uint32_t)h[1] << 16);
  };
  uint32_t u[4];
  bool ordered = true; /* no NaN among the 8 */
#pragma unroll
  for (int j = 0; j < 4; j++) {
    const float a = x[2 * j], b = x[2 * j + 1];
    ordered = ordered && a == a && b == b;
    if constexpr (SR) {
      const uint32_t lo = __float_as_uint(a) + MTOPT__SR_BITS(r[2 * j], shift);
      const uint32_t hi = __float_as_uint(b) + MTOPT__SR_BITS(r[2 * j + 1], shift);
      u[j] = __byte_perm(lo, hi, 0x7632); /* the high halves of lo, hi */
    } else {
#if __CUDA_ARCH__ >= 800 /* the instruction's first architecture */
      asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(u[j]) : "f"(b), "f"(a));
#else
      u[j] = written_out(j);
#endif
    }
  }
  if (!ordered) {
#pragma unroll
    for (int j = 0; j < 4; j++) u[j] = written_out(j);
  }
  return make_uint4(u[0], u[1], u[2], u[3]);
}

/* The 8 elements of a group (pieces at i and i + h) of dtype DT (F32 or
 * BF16) as floats; BF16 from the words loaded ahead where AHEAD. */
template <int DT, bool SPLIT, bool AHEAD = false>
__device__ __forceinline__ void ld8(const void *base, int64_t i, int h, float (&x)[8],
                                    const uint4 &ahead = uint4{}) {
  if constexpr (DT == MTOPT__DT_F32) {
    static_assert(!AHEAD, "a group loaded ahead has 16-bit arrays only");
    const float *b = static_cast<const float *>(base);
    const float4 lo = __ldcs(reinterpret_cast<const float4 *>(b + i));
    const float4 hi = __ldcs(reinterpret_cast<const float4 *>(b + i + h));
    x[0] = lo.x, x[1] = lo.y, x[2] = lo.z, x[3] = lo.w;
    x[4] = hi.x, x[5] = hi.y, x[6] = hi.z, x[7] = hi.w;
  } else {
    uint16_t u[8];
    ld16a<SPLIT, AHEAD>(base, ahead, i, h, u);
#pragma unroll
    for (int k = 0; k < 8; k++) x[k] = mtopt__bf16_to_f32(u[k]);
  }
}

__device__ __forceinline__ void st8f(void *base, int64_t i, int h, const float (&x)[8]) {
  float *b = static_cast<float *>(base);
  __stcs(reinterpret_cast<float4 *>(b + i), make_float4(x[0], x[1], x[2], x[3]));
  __stcs(reinterpret_cast<float4 *>(b + i + h), make_float4(x[4], x[5], x[6], x[7]));
}

/* Stores a group's 8 values in DT, rounded as mtopt__st does (BF16:
 * stochastically from the 16 bits of r[k] >> shift when SR). */
template <int DT, bool SR, bool SPLIT>
__device__ __forceinline__ void st8(void *base, int64_t i, int h, const float (&x)[8],
                                    const uint32_t (&r)[8], int shift) {
  if constexpr (DT == MTOPT__DT_F32) {
    st8f(base, i, h, x);
  } else {
    st16u<SPLIT>(base, i, h, pack_bf16x8<SR>(x, r, shift));
  }
}

/* The weights of a group: the master where there is one (mtopt__ld_weight). */
template <int W, int MM, bool SPLIT, bool AHEAD>
__device__ __forceinline__ void ld_weight8(const mtopt__tensor_rec_t &t, int64_t i, int h,
                                           float (&w)[8], const Ahead &ahead) {
  if constexpr (MM == MTOPT__MASTER_F32) {
    ld8<MTOPT__DT_F32, SPLIT>(t.mw, i, h, w);
  } else if constexpr (MM == MTOPT__MASTER_REMAINDER) {
    static_assert(!AHEAD, "groups with remainders are not loaded ahead");
    uint16_t p[8], r[8];
    ld16<SPLIT>(t.w, i, h, p);
    ld16<SPLIT>(t.mw, i, h, r);
#pragma unroll
    for (int k = 0; k < 8; k++) w[k] = mtopt__join_master(p[k], r[k]);
  } else {
    ld8<W, SPLIT, AHEAD>(t.w, i, h, w, ahead.w);
  }
}

/* mtopt__st_weight for a group. */
template <int W, int MM, bool SR, bool SPLIT>
__device__ __forceinline__ void st_weight8(const mtopt__tensor_rec_t &t, int64_t i, int h,
                                           const float (&w)[8], const uint32_t (&r)[8]) {
  if constexpr (MM == MTOPT__MASTER_F32) {
    st8f(t.mw, i, h, w);
    st16u<SPLIT>(t.w, i, h, pack_bf16x8<false>(w, r, 0));
  } else if constexpr (MM == MTOPT__MASTER_REMAINDER) {
    uint16_t p[8], q[8];
#pragma unroll
    for (int k = 0; k < 8; k++) mtopt__split_master(w[k], &p[k], &q[k]);
    st16<SPLIT>(t.w, i, h, p);
    st16<SPLIT>(t.mw, i, h, q);
  } else {
    st8<W, SR, SPLIT>(t.w, i, h, w, r, MTOPT__SR_SHIFT_W);
  }
}

/* The Weyl values (dtype.h: mtopt__sr_weyl) of elements e0 .. e0 + N - 1,
 * one add each: they lie in one 2^32 block of the index, as update_chunk
 * makes sure. */
template <int N>
__device__ __forceinline__ void weyl_run(int64_t e0, uint32_t (&w)[N]) {
  const uint32_t w0 = mtopt__sr_weyl(e0);
#pragma unroll
  for (int k = 0; k < N; k++) w[k] = w0 + (uint32_t)k * MTOPT__SR_WEYL;
}

/* The draws of N contiguous elements from element e0 of the tensor into
 * entries k0.. (mtopt__draws, element by element): pm one hash each; v one
 * per pair of elements (dtype.h: mtopt__sr_bits_v), so N / 2 + 1 pair draws
 * d cover them when e0 is odd, N / 2 when it is even. The halves of
 * elements e0 + 2j and e0 + 2j + 1 are then the low 32 bits of
 * (d[j + 1]:d[j]) >> 16 * odd: one funnel shift a pair. odd is uniform over
 * a chunk, so the last draw's branch does not diverge. */
template <int N>
__device__ __forceinline__ void draws_run(const mtopt__sr_t &sr, int64_t e0, int k0,
                                          uint32_t (&pm)[8], uint32_t (&vv)[8]) {
  uint32_t w[N], wv[N / 2 + 1], d[N / 2 + 1];
  weyl_run<N>(e0, w);
#pragma unroll
  for (int k = 0; k < N; k++) pm[k0 + k] = mtopt__sr_mix(sr.pm, w[k]);
  weyl_run<N / 2 + 1>(e0 >> 1, wv);
#pragma unroll
  for (int j = 0; j < N / 2; j++) d[j] = mtopt__sr_mix(sr.v, wv[j]);
  const uint32_t odd = (uint32_t)(e0 & 1);
  d[N / 2] = 0u;
  if (odd) d[N / 2] = mtopt__sr_mix(sr.v, wv[N / 2]);
#pragma unroll
  for (int j = 0; j < N / 2; j++) {
    const uint32_t u = __funnelshift_r(d[j], d[j + 1], 16u * odd);
    vv[k0 + 2 * j] = u & 0xffffu;
    vv[k0 + 2 * j + 1] = u >> 16;
  }
}

/* The draws of a group whose pieces start at tensor elements e0 and e0 + h. */
template <bool SPLIT>
__device__ __forceinline__ void draws8(const mtopt__sr_t &sr, int64_t e0, int h,
                                       uint32_t (&pm)[8], uint32_t (&vv)[8]) {
  if constexpr (SPLIT) {
    draws_run<4>(sr, e0, 0, pm, vv);
    draws_run<4>(sr, e0 + h, 4, pm, vv);
  } else {
    draws_run<8>(sr, e0, 0, pm, vv);
  }
}

/* One group of 8, pieces of 4 at elements i and i + h of the tensor (16-byte
 * aligned in every array at i), from memory or (AHEAD) from the words loaded
 * ahead: mtopt__update_elem's arithmetic, element by element. */
template <int KIND, int W, int G, int S, int MM, bool SR, bool SPLIT, bool AHEAD>
__device__ __forceinline__ void update8(const mtopt__tensor_rec_t &t, const mtopt__scalars_t &s,
                                        const mtopt__sr_t &sr, int64_t i, int h,
                                        const Ahead &a) {
  float g[8], w[8];
  ld8<G, SPLIT, AHEAD>(t.g, i, h, g, a.g);
  ld_weight8<W, MM, SPLIT, AHEAD>(t, i, h, w, a);
  uint32_t pm[8] = {0u}, vv[8] = {0u};
  if constexpr (SR) draws8<SPLIT>(sr, t.sr_elem0 + i, h, pm, vv);
  if constexpr (KIND == MTOPT__KIND_ADAMW || KIND == MTOPT__KIND_ADAM) {
    float m[8], v[8];
    ld8<S, SPLIT, AHEAD>(t.s0, i, h, m, a.s0);
    ld8<S, SPLIT, AHEAD>(t.s1, i, h, v, a.s1);
#pragma unroll
    for (int k = 0; k < 8; k++) mtopt__adam_elem(&s, KIND == MTOPT__KIND_ADAMW, g[k], &w[k], &m[k], &v[k]);
    st_weight8<W, MM, SR, SPLIT>(t, i, h, w, pm);
    st8<S, SR, SPLIT>(t.s0, i, h, m, pm, MTOPT__SR_SHIFT_S0);
    st8<S, SR, SPLIT>(t.s1, i, h, v, vv, MTOPT__SR_SHIFT_S1);
  } else { /* SGD: momentum is 0 where the tensor has no buffer */
    float b[8];
    if (s.momentum != 0.0f) {
      ld8<S, SPLIT, AHEAD>(t.s0, i, h, b, a.s0);
    } else {
#pragma unroll
      for (int k = 0; k < 8; k++) b[k] = 0.0f;
    }
#pragma unroll
    for (int k = 0; k < 8; k++) mtopt__sgd_elem(&s, g[k], &w[k], &b[k]);
    st_weight8<W, MM, SR, SPLIT>(t, i, h, w, pm);
    if (s.momentum != 0.0f) st8<S, SR, SPLIT>(t.s0, i, h, b, pm, MTOPT__SR_SHIFT_S0);
  }
}

__device__ __forceinline__ int aligned_at(const void *p, int64_t i, int esize) {
  return p == nullptr || ((uintptr_t)p + (uintptr_t)(i * esize)) % 16u == 0;
}

/* The chunk [start, start + len) of t: a scalar prologue to the parameter's
 * 16-byte boundary, groups of 8 (in spans of 256 where SPLIT, then
 * contiguous), a scalar tail; or, where an array is at another phase, all of
 * it element by element. Every thread of the team calls it. */
template <int TEAM, int KIND, int W, int G, int S, int MM, bool SR, bool AHEAD>
__device__ __forceinline__ void update_chunk(const mtopt__tensor_rec_t &t,
                                             const mtopt__scalars_t &s, const mtopt__sr_t &sr,
                                             int64_t start, int32_t len, int lane) {
  constexpr int we = W == MTOPT__DT_F32 ? 4 : 2, ge = G == MTOPT__DT_F32 ? 4 : 2;
  constexpr int se = S == MTOPT__DT_F32 ? 4 : 2, me = MM == MTOPT__MASTER_F32 ? 4 : 2;
  const uintptr_t wa = (uintptr_t)t.w + (uintptr_t)(start * we);
  int32_t i0 = (int32_t)(((16u - wa % 16u) % 16u) / we);
  if (i0 > len) i0 = len;
  const int64_t a = start + i0;
  /* SR: the chunk's elements, and with them its pairs (whose block is the
   * elements' halved), in one 2^32 block of the index (weyl_run). */
  const int64_t e = t.sr_elem0 + start;
  const int ok = aligned_at(t.g, a, ge) && aligned_at(t.s0, a, se) && aligned_at(t.s1, a, se) &&
                 (MM == MTOPT__MASTER_NONE || aligned_at(t.mw, a, me)) &&
                 (!SR || (uint64_t)e >> 32 == (uint64_t)(e + len) >> 32);
  double unused_w = 0.0, unused_u = 0.0;
  if (!ok) {
    for (int32_t i = lane; i < len; i += TEAM)
      mtopt__update_elem(KIND, &s, &sr, &t, start + i, &unused_w, &unused_u);
    return;
  }
  if (lane < i0) mtopt__update_elem(KIND, &s, &sr, &t, start + lane, &unused_w, &unused_u);
  /* SPLIT: the first in_spans groups (32 per whole span of 256) are group
   * q = lane q % 32 of span q / 32, so a warp of consecutive q (TEAM is a
   * multiple of 32) takes one span; the groups after them, like every group
   * without SPLIT, are contiguous at 8q. */
  constexpr bool SPLIT = we == 4 || ge == 4 || se == 4 || me == 4;
  static_assert(TEAM % 32 == 0, "a warp's lanes take one span");
  const int32_t groups = (len - i0) / 8, in_spans = SPLIT ? (len - i0) / 256 * 32 : 0;
  if constexpr (AHEAD && !SPLIT && MM == MTOPT__MASTER_NONE) {
    /* Each group's loads are issued before the group before it is
     * computed, so that a thread's next loads are in flight while it
     * computes and rounds (draws and all) its current group. */
    Ahead next;
    int32_t q = lane;
    if (q < groups) load_ahead<KIND>(t, s, a + 8 * q, next);
    for (; q < groups; q += TEAM) {
      const Ahead cur = next;
      if (q + TEAM < groups) load_ahead<KIND>(t, s, a + 8 * (q + TEAM), next);
      update8<KIND, W, G, S, MM, SR, false, true>(t, s, sr, a + 8 * q, 4, cur);
    }
  } else {
    for (int32_t q = lane; q < groups; q += TEAM) {
      const bool span = q < in_spans;
      update8<KIND, W, G, S, MM, SR, SPLIT, false>(
          t, s, sr, a + (span ? 256 * (q >> 5) + 4 * (q & 31) : 8 * q), span ? 128 : 4, Ahead{});
    }
  }
  const int32_t tail = i0 + 8 * groups;
  if (lane < len - tail) mtopt__update_elem(KIND, &s, &sr, &t, start + tail + lane, &unused_w, &unused_u);
}

/* The layouts with a vector path; -1 for the others. */
__device__ __forceinline__ int layout_of(const mtopt__tensor_rec_t &t) {
  const int w = t.wdt, g = t.gdt, s = t.sdt, m = t.mmode;
  const int gs = (g == MTOPT__DT_F32 || g == MTOPT__DT_BF16) && (s == MTOPT__DT_F32 || s == MTOPT__DT_BF16);
  if (!gs) return -1;
  if (w == MTOPT__DT_BF16) return m * 8 + (g == MTOPT__DT_BF16) * 2 + (s == MTOPT__DT_BF16);
  if (w == MTOPT__DT_F32 && m == MTOPT__MASTER_NONE) return 24 + (g == MTOPT__DT_BF16) * 2 + (s == MTOPT__DT_BF16);
  return -1;
}

/* Runs the chunk on its layout's vector path; returns 0 where there is none. */
template <int TEAM, int KIND, bool AHEAD>
__device__ __forceinline__ int update(const mtopt__tensor_rec_t &t, const mtopt__scalars_t &s,
                                      const mtopt__sr_t &sr, int64_t start, int32_t len,
                                      int lane) {
  constexpr int F = MTOPT__DT_F32, B = MTOPT__DT_BF16;
  constexpr int N = MTOPT__MASTER_NONE, M = MTOPT__MASTER_F32, R = MTOPT__MASTER_REMAINDER;
  /* Stochastic rounding has something to draw for where a bf16 array is
   * written without a master. */
  switch (2 * layout_of(t) + (sr.on ? 1 : 0)) {
#define MTOPT__MV_SR(W_, S_, MM_) (((MM_) == N && (W_) == B) || (S_) == B)
#define MTOPT__MV_CASE(code, W_, G_, S_, MM_)                                            \
  case 2 * (code):                                                                     \
    update_chunk<TEAM, KIND, W_, G_, S_, MM_, false, false>(t, s, sr, start, len, lane); \
    return 1;                                                                          \
  case 2 * (code) + 1:                                                                 \
    update_chunk<TEAM, KIND, W_, G_, S_, MM_, MTOPT__MV_SR(W_, S_, MM_), AHEAD>(         \
        t, s, sr, start, len, lane);                                                   \
    return 1;
    MTOPT__MV_CASE(0, B, F, F, N)
    MTOPT__MV_CASE(1, B, F, B, N)
    MTOPT__MV_CASE(2, B, B, F, N)
    MTOPT__MV_CASE(3, B, B, B, N)
    MTOPT__MV_CASE(8, B, F, F, M)
    MTOPT__MV_CASE(9, B, F, B, M)
    MTOPT__MV_CASE(10, B, B, F, M)
    MTOPT__MV_CASE(11, B, B, B, M)
    MTOPT__MV_CASE(16, B, F, F, R)
    MTOPT__MV_CASE(17, B, F, B, R)
    MTOPT__MV_CASE(18, B, B, F, R)
    MTOPT__MV_CASE(19, B, B, B, R)
    MTOPT__MV_CASE(24, F, F, F, N)
    MTOPT__MV_CASE(25, F, F, B, N)
    MTOPT__MV_CASE(26, F, B, F, N)
    MTOPT__MV_CASE(27, F, B, B, N)
#undef MTOPT__MV_CASE
#undef MTOPT__MV_SR
  default:
    return 0;
  }
}

} /* namespace mixed_vec */

#endif /* MTOPT_BACKEND_CUDA_MIXED_VEC_CUH */

/*
 * Streaming the arrays of one chunk, for the all-F32 passes of the step
 * kernels (step_kernels.cuh), and the per-element operations they apply
 * (the formulas of step_math.h).
 *
 * Inner loop: 16-byte (float4) loads and stores in two stages of ILP float4
 * per array (8 float4 in flight per thread whatever the number of arrays):
 * the next stage's loads are issued before the current one is computed; a
 * scalar prologue up to the first 16-byte boundary and a scalar tail. The
 * host places each tensor's state at the same address residue mod 16 bytes as
 * its weights (mtopt__aligned_offset), so one prologue serves every array; a
 * user gradient with another residue sends its chunks down the scalar path.
 * Element offsets inside a chunk fit in int32 (chunk_size <= 2^30); tensor
 * offsets (chunk start) are int64.
 */
#ifndef MTOPT_BACKEND_CUDA_STREAM_CHUNK_CUH
#define MTOPT_BACKEND_CUDA_STREAM_CHUNK_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "../../common/plan.h"
#include "../../common/step_math.h"
#include "team.cuh"

namespace {

constexpr int kInFlight = 8;    /* float4 loads in flight per thread */

/* ---- streaming over one chunk ---- */

__device__ __forceinline__ float &lane_of(float4 &v, int j) {
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

/* Applies f to every element i in [0, len) of N arrays p[0..N-1] (each already
 * offset to the chunk start): f(x) receives x[k] = p[k][i], may change it, and
 * arrays whose bit is set in STORE get x[k] back. Each thread visits a fixed
 * set of elements in a fixed order, so per-thread accumulators inside f are
 * deterministic.
 *
 * MASKED (a segment with gaps, plan.h; mask NULL: none in this chunk): only
 * the elements whose bit of mask is set, element i of the chunk being element
 * e0 + i of the record, are passed to f and written; the gaps are never
 * written: a whole group is stored as one vector, a part of one element by
 * element. Read, without `whole`, are only the tensors' elements (a part of
 * a group element by element, a gap group not at all), and a thread's mask
 * words are read two stages ahead of its data, so that the test before each
 * load does not wait on memory; with `whole` (the record's arrays each lie in
 * one allocation: MTOPT__FLAG_WHOLE_GROUPS) every group is loaded as one
 * vector, gaps too, and no load waits on a mask word. */
template <int TEAM, int N, unsigned STORE, bool MASKED = false, class F>
__device__ __forceinline__ void stream_chunk(float *const (&p)[N], int32_t len, F &f,
                                             const uint32_t *mask = nullptr, int64_t e0 = 0,
                                             bool whole = false) {
  const int tid = team_lane<TEAM>();
  const unsigned r0 = (unsigned)((uintptr_t)p[0] & 15u);
  bool same = true;
#pragma unroll
  for (int k = 1; k < N; k++) same = same && (((uintptr_t)p[k] & 15u) == r0);

  auto scalar = [&](int32_t i) {
    if constexpr (MASKED)
      if (!mtopt__mask_bit(mask, e0 + i)) return;
    float x[N];
#pragma unroll
    for (int k = 0; k < N; k++) x[k] = p[k][i];
    f(x);
#pragma unroll
    for (int k = 0; k < N; k++)
      if (STORE & (1u << k)) p[k][i] = x[k];
  };

  if (!same) { /* a gradient at another residue: no common vector path */
    for (int32_t i = tid; i < len; i += TEAM) scalar(i);
    return;
  }
  int32_t pro = (int32_t)(((16u - r0) & 15u) / 4u); /* elements to the boundary */
  if (pro > len) pro = len;
  if (tid < pro) scalar(tid);

  /* Two stages of ILP float4 per array: the next stage's loads are issued
   * before the current stage is computed and stored, so a thread always has
   * loads in flight (docs/perf_notes.md, v7). The masked statistics pass of
   * a block (kBlockStats: one array, nothing stored, the team a block)
   * keeps two a stage, so that its kernel fits the registers of the 6
   * blocks an SM it runs (step_kernels.cuh: blocks_per_sm). A thread's
   * elements and their order do not depend on ILP, so neither do its sums. */
  constexpr bool kBlockStats = MASKED && STORE == 0u && TEAM == kBlock;
  constexpr int ILP = kBlockStats ? 2 : kInFlight / (2 * N) > 0 ? kInFlight / (2 * N) : 1;
  const int32_t n4 = (len - pro) >> 2;
  float4 *q[N];
#pragma unroll
  for (int k = 0; k < N; k++) q[k] = reinterpret_cast<float4 *>(p[k] + pro);
  /* The vector loads and stores carry the streaming hint (evict-first:
   * each byte is used once) but in the masked passes. The masked update
   * ran 4 points faster with plain ones (the loads 3, the stores 1, only
   * together; many-mixed fused 0.903 -> 0.947 of the copy, tiny-50k 0.870
   * -> 0.912, one H100), while the packed update lost 5 points on tiny-50k
   * without them (perf_notes_masked.md, v26). The masked statistics pass
   * reads plainly too, so that the gradients it reads last, the update's
   * first (step_kernels.cuh: block_kernel), stay in L2: its statistics
   * step +0.5 to 0.8 point on one H200 (v27). The masked warp kernel, the
   * same loop, takes them unmeasured. */
  constexpr bool kHint = !MASKED;
  auto load = [&](float4 (&r)[ILP][N], int32_t base, const unsigned (&b)[ILP]) {
#pragma unroll
    for (int u = 0; u < ILP; u++) {
      const int32_t i = base + u * TEAM;
      if (i < n4 && (!MASKED || whole || b[u] == 15u)) {
#pragma unroll
        for (int k = 0; k < N; k++) r[u][k] = kHint ? __ldcs(q[k] + i) : q[k][i];
      } else if (MASKED && b[u]) {
#pragma unroll
        for (int j = 0; j < 4; j++)
          if ((b[u] >> j) & 1u)
#pragma unroll
            for (int k = 0; k < N; k++) lane_of(r[u][k], j) = p[k][pro + 4 * i + j];
      }
    }
  };

  float4 r[ILP][N], next[ILP][N];
  /* whole: the first stage's loads go before the mask words are fetched */
  if (MASKED && whole) {
    const unsigned none[ILP] = {};
    load(r, tid, none);
  }
  /* The 4 bits of group i (15 without masks; 0 past the end); a group
   * whose first array (the gradient, in the statistics pass) lies at
   * another residue than the span's takes its bits from two words. The
   * statistics pass (nothing stored) of a block first copies its chunk's
   * words to shared memory, a few loads a thread, where they fit (the
   * chunks of automatic sizes, up to MTOPT__GAP_PLAN_CHUNK elements; one
   * array a block, so only where the team is the block, which steps one
   * chunk): its iterations are short, and each
   * stage's loads waited on a word's round trip (153 -> 136 us for
   * many-mixed's statistics kernel, perf_notes_gaps.md v25). The update
   * passes read their words from global memory two stages ahead: staged,
   * they ran no faster and executed more instructions. The warp kernels
   * (plans of short chunks) keep the global words too: staged, not
   * measured. */
  const int64_t eg = e0 + pro;
  constexpr int kStageWords = MTOPT__GAP_PLAN_CHUNK / 32 + 2;
  __shared__ uint32_t words[kBlockStats ? kStageWords : 1];
  const int32_t sh0 = (int32_t)(eg & 31);
  bool staged = false;
  if constexpr (kBlockStats) {
    const int64_t w0 = eg >> 5;
    const int32_t nw = n4 > 0 ? (int32_t)(((eg + 4 * (int64_t)n4 - 1) >> 5) - w0 + 1) : 0;
    staged = nw <= kStageWords;
    if (staged) {
      for (int32_t k = tid; k < nw; k += TEAM) words[k] = __ldg(mask + w0 + k);
      __syncthreads(); /* a block steps one chunk: the words are not reused */
    }
  }
  /* A group's 4 bits, from one mask word or two where the group straddles
   * words: fetch issues the loads of the global words and take combines
   * them, an iteration later, so that no stage's data loads wait behind a
   * word's round trip (the compiler consumes a load where it is written:
   * taken at once, the word of the stage after next held each iteration
   * until it came, before the next stage's loads; perf_notes_blocks.md
   * v33). The staged words are read at take. */
  struct Words {
    uint32_t lo, hi;
  };
  auto fetch = [&](int32_t i) -> Words {
    Words w{0u, 0u};
    if (!MASKED || i >= n4 || (kBlockStats && staged)) return w;
    const int64_t e = eg + 4 * (int64_t)i;
    w.lo = __ldg(mask + (e >> 5));
    if ((e & 31) > 28) w.hi = __ldg(mask + (e >> 5) + 1);
    return w;
  };
  auto take = [&](int32_t i, const Words &w) -> unsigned {
    if constexpr (!MASKED) return 15u;
    if (i >= n4) return 0u;
    const int32_t o = sh0 + 4 * i;
    const int sh = o & 31;
    unsigned lo = w.lo, hi = w.hi;
    if (kBlockStats && staged) {
      lo = words[o >> 5];
      if (sh > 28) hi = words[(o >> 5) + 1];
    }
    unsigned b = lo >> sh;
    if (sh > 28) b |= hi << (32 - sh);
    return b & 15u;
  };
  unsigned br[ILP], bn[ILP]; /* the bits of r and of next */
  Words wa[ILP], wn[ILP];    /* words (before the loop: of r and of next;
                              * in it, wa: of the stage after next) */
#pragma unroll
  for (int u = 0; u < ILP; u++) {
    wa[u] = fetch(tid + u * TEAM);
    wn[u] = fetch(tid + (ILP + u) * TEAM);
  }
#pragma unroll
  for (int u = 0; u < ILP; u++) {
    br[u] = take(tid + u * TEAM, wa[u]);
    bn[u] = take(tid + (ILP + u) * TEAM, wn[u]);
  }
  if (!(MASKED && whole)) load(r, tid, br);
  for (int32_t base = tid; base < n4; base += TEAM * ILP) {
    load(next, base + TEAM * ILP, bn);
#pragma unroll
    for (int u = 0; u < ILP; u++) wa[u] = fetch(base + (2 * ILP + u) * TEAM);
#pragma unroll
    for (int u = 0; u < ILP; u++) {
      const int32_t i = base + u * TEAM;
      if (i < n4) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
          if (MASKED && !((br[u] >> j) & 1u)) continue;
          float x[N];
#pragma unroll
          for (int k = 0; k < N; k++) x[k] = lane_of(r[u][k], j);
          f(x);
#pragma unroll
          for (int k = 0; k < N; k++) lane_of(r[u][k], j) = x[k];
        }
        if (!MASKED || br[u] == 15u) {
#pragma unroll
          for (int k = 0; k < N; k++)
            if (STORE & (1u << k)) {
              if (kHint)
                __stcs(q[k] + i, r[u][k]);
              else
                q[k][i] = r[u][k];
            }
        } else {
#pragma unroll
          for (int j = 0; j < 4; j++)
            if ((br[u] >> j) & 1u)
#pragma unroll
              for (int k = 0; k < N; k++)
                if (STORE & (1u << k)) p[k][pro + 4 * i + j] = lane_of(r[u][k], j);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < ILP; u++) {
      br[u] = bn[u];
      bn[u] = take(base + (2 * ILP + u) * TEAM, wa[u]);
#pragma unroll
      for (int k = 0; k < N; k++) r[u][k] = next[u][k];
    }
  }

  const int32_t t0 = pro + 4 * n4; /* 0..3 elements left */
  if (tid < len - t0) scalar(t0 + tid);
}

/* ---- the per-element operations (formulas in step_math.h) ---- */

/* Sums of squares in double (mtopt__sum_t, plan.h): the square of a float is
 * exact there and a finite gradient cannot overflow the sum (one element of
 * 1e20 overflows a float sum). The pass stays bandwidth bound: a double
 * multiply and add per 4 bytes read. */
struct StatsOp {
  float inv;
  double acc;
  uint32_t bad;
  __device__ void operator()(float (&x)[1]) {
    const float y = x[0] * inv;
    acc += (double)y * y;
    bad += !isfinite(y);
  }
};

template <int DECOUPLED>
struct AdamOp { /* x = w, g, m, v */
  mtopt__scalars_t s;
  __device__ void operator()(float (&x)[4]) {
    mtopt__adam_elem(&s, DECOUPLED, x[1], &x[0], &x[2], &x[3]);
  }
};

struct SgdBufOp { /* x = w, g, buf */
  mtopt__scalars_t s;
  __device__ void operator()(float (&x)[3]) { mtopt__sgd_elem(&s, x[1], &x[0], &x[2]); }
};

struct SgdOp { /* x = w, g; s.momentum is 0 */
  mtopt__scalars_t s;
  __device__ void operator()(float (&x)[2]) {
    float unused = 0.0f;
    mtopt__sgd_elem(&s, x[1], &x[0], &unused);
  }
};

struct LambMomentsOp { /* x = w, g, m, v */
  mtopt__scalars_t s;
  double wsq, usq; /* in double, as StatsOp */
  __device__ void operator()(float (&x)[4]) {
    const float w = x[0];
    const float u = mtopt__lamb_moments_elem(&s, x[1], w, &x[2], &x[3]);
    wsq += (double)w * w;
    usq += (double)u * u;
  }
};

struct LambApplyOp { /* x = w, m, v */
  mtopt__scalars_t s;
  float step;
  __device__ void operator()(float (&x)[3]) {
    x[0] = fmaf(-step, mtopt__lamb_dir(&s, x[0], x[1], x[2]), x[0]);
  }
};

} /* namespace */

#endif /* MTOPT_BACKEND_CUDA_STREAM_CHUNK_CUH */

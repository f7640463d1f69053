/*
 * The CUDA kernels of a step, as templates over (pass, kind, flavour). Each
 * pass_*.cu instantiates one kind's (so that the compiler builds them in
 * parallel); step_launch.cu picks one per launch (launch.h).
 *
 * Every pass is ONE launch over the plan's chunk table, which lives in device
 * memory: no per-tensor host work, no tensor lists in kernel arguments, so the
 * host cost of a step does not grow with the tensor count. The per-element
 * formulas come from src/common/step_math.h, the same inline functions the CPU
 * backend runs; with -fmad=false -prec-div=true -prec-sqrt=true (CMake) the
 * elementwise results are bit-identical to the CPU backend.
 *
 * Memory traffic per parameter and launches per step: counted once, in
 * core/optimizer_access.c (get_info), and tabled in docs/optimizers.md.
 *
 * Grid shape, large chunks (a plan whose mean chunk has >= 4096 elements):
 * one block per chunk, or per slice of one (below). Blocks let the hardware
 * scheduler balance unequal chunks (tensor tails, tiny tensors) and make the
 * last-block election count exactly one unit per block. A persistent grid
 * that fetched slices from a counter and prefetched the next one's record ran
 * at 0.97 of the copy against 0.98 (perf_notes, v7). The grid limit (2^31-1
 * blocks in x) covers every plan: the optimizer refuses plans of more than
 * 2^31-1 chunks, and slices_of keeps the product below it.
 * Small chunks (many small tensors): a block's chunk is a few hundred
 * elements, so its fixed costs dominate; there the warps of a grid of a few
 * blocks per SM (from the SM count read at init) take chunks one at a time
 * from a counter (warp_kernel below).
 *
 * Slices: for the passes that reduce nothing across a chunk (the update of
 * AdamW, Adam and SGD; SGD's not with bf16 state rounded stochastically),
 * each chunk of a large-chunk plan is cut into slices of about kSliceLen
 * (kSliceLenNarrow, kSliceLenMasked) elements, a block per slice, the slices
 * of one chunk in consecutive blocks. The blocks resident at any moment then
 * cover a few dozen chunks end to end rather than a thin piece of each of
 * hundreds: with the same arithmetic, the same bytes scattered over hundreds
 * of windows ran at 0.94 of a copy and in order at 0.99 (docs/perf_notes.md,
 * v7).
 *
 * Inner loop of the all-F32 passes: stream_chunk.cuh.
 *
 * Determinism: per-chunk partial sums (in double: mtopt__sum_t, plan.h) use
 * a fixed thread-to-element mapping and a fixed shuffle tree; cross-chunk sums
 * (statistics, LAMB norms) read the slots in a fixed strided order and reduce
 * with a fixed tree in double. The results do not depend on which block
 * finishes last.
 */
#ifndef MTOPT_BACKEND_CUDA_STEP_KERNELS_CUH
#define MTOPT_BACKEND_CUDA_STEP_KERNELS_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "../../common/step_elem.h"
#include "block_end.cuh"
#include "launch.h"
#include "mixed_vec.cuh"
#include "stream_chunk.cuh"
#include "team.cuh"

namespace {

/* The slice a block takes of a chunk (the update of AdamW, Adam and SGD on
 * large chunks): 8192 elements, 32 per thread, ran best of 2048 to 65536 on
 * GPT-2 XL and LLaMA 1.1B shapes, all-F32 (docs/perf_notes.md, v7) and mixed
 * with fp32 state (of 4096, 6144, 8192, 11264, 16384 and whole chunks:
 * docs/perf_notes_mixed.md, v14). */
constexpr int64_t kSliceLen = 8192;
/* The same for plans with bf16 state (the narrow mixed flavours, a group of
 * 8 elements a thread at a time): 16384 elements, 8 groups per thread, ran
 * best of 8192, 16384, 32768 and whole 65536-element chunks to nearest
 * (docs/perf_notes.md, v12), and of 16384, 32768 and whole chunks with
 * stochastic rounding once that flavour's loop was no longer close to
 * issue-bound (AdamW: bf16 everywhere 0.929 -> 0.938 of the copy on GPT-2
 * XL, fp32 masters with bf16 state 0.909 -> 0.929; docs/perf_notes_mixed.md,
 * v22; Adam, the same loop, sliced by the same rule, not measured). SGD with
 * stochastic rounding keeps whole chunks (sliced: -0.9% on LLaMA 1.1B, +0.6%
 * on GPT-2 XL). */
constexpr int64_t kSliceLenNarrow = 16384;
/* The same for the masked flavour's update (the pooled plans of small
 * tensors, all-F32): 4096 elements, with its blocks counting their unit at
 * their start (counts_early): AdamW +1.0 to 1.2 point of the copy on
 * many-mixed and +0.6 to 0.7 on tiny-50k, SGD +0.9 to 1.0 and 0, against
 * 8192 (one H100, docs/perf_notes_blocks.md v32). Without the early count
 * 4096 had cost SGD on tiny-50k 1.1 (perf_notes_masked.md, v29). */
constexpr int64_t kSliceLenMasked = 4096;
/* Slices start at multiples of this many elements from the chunk's start (4 KB
 * of fp32): slices of 9368 elements, whose warps' 512-byte accesses straddled
 * cache lines, ran at 0.84 of the copy against 0.96 at 8192. */
constexpr int64_t kSliceAlign = 1024;
/* Plans whose mean chunk is shorter than this many elements run a warp per
 * chunk (teams, below): 4096 elements are 16 per thread of a block, the point
 * where a block's fixed costs start to show. */
constexpr int64_t kWarpTeamBelow = 4096;
/* Warp-per-chunk grids: blocks per SM (3 are resident at 80 registers per
 * thread; one more keeps the SMs fed while the first ones finish). */
constexpr int kWarpBlocksPerSm = 4;
/* Chunks a warp claims per atomic on the shared counter: the all-F32
 * statistics pass reads 4 bytes per element, so its short chunks queue on
 * that one counter and claiming 8 wins; the update pass keeps 1, where the
 * tail imbalance of longer claims costs more than the atomics, and so does
 * the mixed-precision statistics pass, which claiming more made slower
 * (the figures: perf_notes_small.md v20). */
template <int PASS, bool MIXED>
__host__ __device__ constexpr int warp_claim() {
  return PASS == MTOPT__PASS_STATS && !MIXED ? 8 : 1;
}

/* What a block learns about its chunk, once, in thread 0. */
struct ChunkView {
  float *w, *g, *s0, *s1; /* all-F32 plans: the chunk's arrays */
  int32_t len;
  int32_t skip;
  float inv;
  int64_t first_chunk, num_chunks; /* the tensor's chunks (LAMB norms) */
  mtopt__scalars_t s;
  /* mixed-precision plans: the record, the chunk's first element in it, the
   * stochastic-rounding keys */
  mtopt__tensor_rec_t rec;
  int64_t start;
  mtopt__sr_t sr;
  const uint32_t *mask; /* MASKED kernels: the record's (a segment with gaps), or NULL */
  bool whole;           /* and its flag MTOPT__FLAG_WHOLE_GROUPS (stream_chunk) */
};

/* Slice k of `slices` of chunk c (one slice: the whole chunk). The slices are
 * ceil(chunk_size / slices) elements rounded up to kSliceAlign, from the
 * chunk's start: a chunk shorter than chunk_size leaves its last slices
 * empty. */
__device__ __forceinline__ mtopt__chunk_rec_t slice_rec(const mtopt__plan_t &p, int64_t c, int k,
                                                        int slices) {
  mtopt__chunk_rec_t ch = p.chunks[c];
  if (slices > 1) {
    const int64_t per =
        ((p.chunk_size + slices - 1) / slices + kSliceAlign - 1) / kSliceAlign * kSliceAlign;
    const int64_t lo = per * k < ch.len ? per * k : ch.len;
    const int64_t hi = lo + per < ch.len ? lo + per : ch.len;
    ch.start += lo;
    ch.len = (int32_t)(hi - lo);
  }
  return ch;
}

/* The view of that slice, by thread 0 of the team. */
template <int PASS, bool MIXED, bool MASKED>
__device__ __forceinline__ void load_view(const mtopt__plan_t &p, int64_t c, int k, int slices,
                                          ChunkView &v) {
  const mtopt__chunk_rec_t ch = slice_rec(p, c, k, slices);
  const mtopt__tensor_rec_t *t = &p.tensors[ch.tensor];
  const mtopt__hyper_t *h = p.hyper;
  v.w = t->w + ch.start;
  v.g = t->g + ch.start;
  v.s0 = t->s0 ? t->s0 + ch.start : nullptr;
  v.s1 = t->s1 ? t->s1 + ch.start : nullptr;
  v.len = ch.len;
  if constexpr (MIXED || MASKED) v.start = ch.start;
  if constexpr (MASKED) {
    v.mask = p.masks[ch.tensor];
    v.whole = (t->flags & MTOPT__FLAG_WHOLE_GROUPS) != 0u;
  }
  v.first_chunk = t->first_chunk;
  v.num_chunks = t->num_chunks;
  v.skip = PASS != MTOPT__PASS_STATS && h->skip != 0;
  if (PASS == MTOPT__PASS_STATS)
    v.inv = mtopt__inv_loss_scale(h);
  else if (!v.skip)
    v.s = mtopt__chunk_scalars(h, &p.groups[t->group], t);
  if constexpr (MIXED) {
    v.rec = *t;
    if (PASS != MTOPT__PASS_STATS && !v.skip) v.sr = mtopt__sr_for(&p, h, t);
  }
}

/* The block kernels whose warps 1 to 7 prefetch their slice (prefetch_slice)
 * while thread 0 loads the view: the masked flavour's update. */
template <int TEAM, int PASS, bool MASKED>
__host__ __device__ constexpr bool prefetches() {
  return TEAM == kBlock && PASS == MTOPT__PASS_UPDATE && MASKED;
}
constexpr int kLineFloats = 32;                    /* a 128-byte line of fp32 */
constexpr int kPrefetchLines = (kBlock - 32) / 4; /* lines of each array, a thread each */

/* The first kPrefetchLines lines of each of slice k's arrays into L2, by
 * warps 1 to 7 (a line a thread; warp 0 returns: its thread 0 loads the
 * view), where the record's arrays are whole allocations
 * (MTOPT__FLAG_WHOLE_GROUPS: a gap's address is mapped): each
 * block's first stages then meet L2, not DRAM. The masked update's blocks
 * are short (kSliceLenMasked), and before they load a byte each waits on
 * thread 0's chain of record loads: tiny-50k fused AdamW 0.912 -> 0.931 of
 * the copy, SGD 0.910 -> 0.936, their statistics steps +1.4 and +2.4 points,
 * many-mixed AdamW -0.2, SGD +0.6 (one H100); the same for the statistics
 * pass's chunks gained nothing at 28 KB a block and lost at 56
 * (docs/perf_notes_blocks.md v34). */
__device__ __forceinline__ void prefetch_slice(const mtopt__plan_t &p, int64_t c, int k,
                                               int slices) {
  const int j = (int)threadIdx.x - 32;
  if (j < 0) return;
  const int line = j % kPrefetchLines, a = j / kPrefetchLines;
  const mtopt__chunk_rec_t ch = slice_rec(p, c, k, slices);
  const mtopt__tensor_rec_t *t = &p.tensors[ch.tensor];
  if (!(t->flags & MTOPT__FLAG_WHOLE_GROUPS) || (int64_t)line * kLineFloats >= ch.len) return;
  const float *q = a == 0 ? t->w : a == 1 ? t->g : a == 2 ? t->s0 : t->s1;
  if (q) asm volatile("prefetch.global.L2 [%0];" ::"l"(q + ch.start + kLineFloats * line));
}

/* ---- the mixed-precision passes: one element at a time through
 * common/step_elem.h (the CPU backend's mixed path calls the same functions),
 * element start + i by team lane i mod TEAM, so each warp reads consecutive
 * elements. ---- */

template <int TEAM>
__device__ __forceinline__ void mixed_stats(const ChunkView &v, double &acc, unsigned &bad) {
  const mtopt__tensor_rec_t t = v.rec;
  for (int32_t i = team_lane<TEAM>(); i < v.len; i += TEAM) {
    const float x = mtopt__grad_elem(&t, v.start + i) * v.inv;
    acc += (double)x * x;
    bad += !isfinite(x);
  }
}

template <int TEAM, int KIND, bool AHEAD>
__device__ __forceinline__ void mixed_update(const ChunkView &v, double &wsq, double &usq) {
  const mtopt__tensor_rec_t t = v.rec;
  const mtopt__scalars_t s = v.s;
  const mtopt__sr_t sr = v.sr;
  /* F32/BF16 layouts of AdamW, Adam and SGD: 8 elements at a time (mixed_vec.cuh) */
  if constexpr (KIND != MTOPT__KIND_LAMB) {
    if (mixed_vec::update<TEAM, KIND, AHEAD>(t, s, sr, v.start, v.len, team_lane<TEAM>())) return;
  }
  for (int32_t i = team_lane<TEAM>(); i < v.len; i += TEAM)
    mtopt__update_elem(KIND, &s, &sr, &t, v.start + i, &wsq, &usq);
}

template <int TEAM>
__device__ __forceinline__ void mixed_lamb_apply(const ChunkView &v, float step) {
  const mtopt__tensor_rec_t t = v.rec;
  const mtopt__scalars_t s = v.s;
  const mtopt__sr_t sr = v.sr;
  for (int32_t i = team_lane<TEAM>(); i < v.len; i += TEAM)
    mtopt__lamb_apply_elem(&s, &sr, &t, v.start + i, step);
}

/* LAMB's per-tensor step from the tensor's slots, in every lane: every chunk
 * of the tensor reduces the same slots in the same order, so all of them use
 * the same step. */
template <int TEAM>
__device__ __forceinline__ float lamb_chunk_step(const mtopt__plan_t &p, const ChunkView &v) {
  double wsq = 0.0, usq = 0.0;
#pragma unroll 4
  for (int64_t k = v.first_chunk + team_lane<TEAM>(); k < v.first_chunk + v.num_chunks;
       k += TEAM) {
    wsq += p.slot_wsq[k];
    usq += p.slot_usq[k];
  }
  wsq = team_sum<TEAM>(wsq);
  usq = team_sum<TEAM>(usq);
  float step = 0.0f;
  if (team_lane<TEAM>() == 0) step = mtopt__lamb_step(p.hyper, &v.s, wsq, usq);
  if constexpr (TEAM == kBlock) {
    __shared__ float shared_step;
    if (threadIdx.x == 0) shared_step = step;
    __syncthreads();
    return shared_step;
  } else {
    return __shfl_sync(0xffffffffu, step, 0);
  }
}

/* ---- one chunk of each pass, by a team (a block or a warp) ---- */

/* The all-F32 arrays of v through stream_chunk; in MASKED kernels (plans with
 * segments with gaps) a chunk with a mask writes only its tensors' elements
 * (and reads only them, unless its arrays are whole allocations). */
template <int TEAM, int N, unsigned STORE, bool MASKED, class F>
__device__ __forceinline__ void stream_view(const ChunkView &v, float *const (&arr)[N], F &op) {
  if constexpr (MASKED) {
    if (v.mask) {
      stream_chunk<TEAM, N, STORE, true>(arr, v.len, op, v.mask, v.start, v.whole);
      return;
    }
  }
  stream_chunk<TEAM, N, STORE>(arr, v.len, op);
}

/* Every thread of the team calls it; v is the team's shared view. Slice k of
 * `slices` of chunk c (load_view); the passes with per-chunk slots (STATS,
 * LAMB) take whole chunks. before (the block kernels counts_early names, a
 * __shared__ word): the unit is counted once the view is loaded, and lane 0
 * stores there the count before it (not a register: one held over the
 * stream spilled in the kernels at their register bound). */
template <int TEAM, int PASS, int KIND, bool MIXED, bool AHEAD = false, bool MASKED = false>
__device__ __forceinline__ void do_chunk(const mtopt__plan_t &p, int64_t c, int k, int slices,
                                         ChunkView &v, unsigned *before = nullptr) {
  if (team_lane<TEAM>() == 0) load_view<PASS, MIXED, MASKED>(p, c, k, slices, v);
  if constexpr (prefetches<TEAM, PASS, MASKED>()) prefetch_slice(p, c, k, slices);
  team_sync<TEAM>();
  if (before && team_lane<TEAM>() == 0) *(volatile unsigned *)before = count_early(p);
  if constexpr (PASS == MTOPT__PASS_STATS) {
    double acc = 0.0;
    unsigned bad = 0u;
    if constexpr (!MIXED) {
      StatsOp op{v.inv, 0.0, 0u};
      float *const arr[1] = {v.g};
      stream_view<TEAM, 1, 0u, MASKED>(v, arr, op);
      acc = op.acc;
      bad = op.bad;
    } else {
      mixed_stats<TEAM>(v, acc, bad);
    }
    acc = team_sum<TEAM>(acc);
    bad = team_sum<TEAM>(bad);
    if (team_lane<TEAM>() == 0) {
      p.slot_gsq[c] = acc;
      p.slot_nonfinite[c] = bad;
    }
  } else if (v.skip) {
    /* a skipped step changes nothing; its chunks still count */
  } else if constexpr (PASS == MTOPT__PASS_UPDATE) {
    double wsq = 0.0, usq = 0.0; /* LAMB: the chunk's sums of w^2 and u^2 */
    if constexpr (MIXED) {
      mixed_update<TEAM, KIND, AHEAD>(v, wsq, usq);
    } else if constexpr (KIND == MTOPT__KIND_ADAMW || KIND == MTOPT__KIND_ADAM) {
      AdamOp<KIND == MTOPT__KIND_ADAMW> op{v.s};
      float *const arr[4] = {v.w, v.g, v.s0, v.s1};
      stream_view<TEAM, 4, 0xDu, MASKED>(v, arr, op); /* store w, m, v */
    } else if constexpr (KIND == MTOPT__KIND_SGD) {
      /* momentum is 0 where the tensor has no buffer (mtopt__chunk_scalars) */
      if (v.s.momentum != 0.0f) {
        SgdBufOp op{v.s};
        float *const arr[3] = {v.w, v.g, v.s0};
        stream_view<TEAM, 3, 0x5u, MASKED>(v, arr, op); /* store w, buf */
      } else {
        SgdOp op{v.s};
        float *const arr[2] = {v.w, v.g};
        stream_view<TEAM, 2, 0x1u, MASKED>(v, arr, op);
      }
    } else { /* LAMB stage 1: moments */
      LambMomentsOp op{v.s, 0.0, 0.0};
      float *const arr[4] = {v.w, v.g, v.s0, v.s1};
      stream_chunk<TEAM, 4, 0xCu>(arr, v.len, op); /* store m, v */
      wsq = op.wsq;
      usq = op.usq;
    }
    if constexpr (KIND == MTOPT__KIND_LAMB) {
      wsq = team_sum<TEAM>(wsq);
      usq = team_sum<TEAM>(usq);
      if (team_lane<TEAM>() == 0) {
        p.slot_wsq[c] = wsq;
        p.slot_usq[c] = usq;
      }
    }
  } else { /* LAMB_APPLY */
    const float step = lamb_chunk_step<TEAM>(p, v);
    if constexpr (MIXED) {
      mixed_lamb_apply<TEAM>(v, step);
    } else {
      LambApplyOp op{v.s, step};
      float *const arr[3] = {v.w, v.s0, v.s1};
      stream_chunk<TEAM, 3, 0x1u>(arr, v.len, op); /* store w */
    }
  }
  team_sync<TEAM>(); /* v is reused by the team's next chunk */
}

/* ---- the kernels ----
 * Large chunks: a block per chunk or per slice of one (slices_of), chunk
 * c0 + blockIdx.x / slices.
 * Small chunks: a grid of a few blocks per SM whose warps fetch chunks one at
 * a time from a counter in the hyper block, so no warp waits for a sibling
 * with a larger chunk (their sizes differ by 1000x among small tensors) and
 * the block's completion count comes once, at the end. The block that exits
 * last resets the counter for the next launch (graph replays included). */
/* Flavours of the block kernel, chosen per plan (launch below): all-F32, and
 * four of the mixed paths, compiled for the registers each kind of layout
 * wants, as resident blocks per SM (blocks_per_sm):
 * - bf16 state (8 bf16 of each array per group): 4 (64 registers), which
 *   lifted GPT-2 XL bf16 everywhere from 0.74 to 0.92 of the copy (v6);
 * - bf16 state rounded stochastically, the update of AdamW, Adam and SGD
 *   only: 3 (80 registers), where the all-bf16 layouts load each group one
 *   group ahead (mixed_vec.cuh: update_chunk): bf16 everywhere with SR
 *   0.929 / 0.948 of the copy on GPT-2 XL / LLaMA 1.1B against 0.916 /
 *   0.938 at 4 blocks without, and 0.888 / 0.904 at 3 blocks without
 *   (docs/perf_notes_mixed.md, v21); the layouts with 4-byte arrays, which
 *   do not load ahead, also ran better here than in the bf16-state flavour
 *   at 4 blocks (fp32 masters with bf16 state 0.909 against 0.902, fp32
 *   parameters 0.953 against 0.915; v22);
 * - fp32 state with 4-byte weights (fp32 masters or parameters, or bf16 with
 *   remainders): 3 (80 registers with split groups, mixed_vec.cuh), with
 *   slices of kSliceLen: GPT-2 XL bf16 + fp32 masters 0.946 of the copy at
 *   74 registers before split groups (0.957 with them, v18), against
 *   0.932 at 4 blocks and 0.925 uncapped on whole chunks (112 registers,
 *   2 blocks); capped on whole chunks it lost (0.894 at 3 blocks,
 *   docs/perf_notes_mixed.md v14; 0.85 at 64 registers, v6);
 * - fp32 state with 2-byte weights (bf16 parameters, no masters), the update
 *   pass only: 4, bf16 with fp32 state 0.957 against 0.944 at 3 (v14).
 * All-F32: SGD 4 (58 registers: 0.976-0.993 of the copy on the five large
 * models, against 0.957-0.968 at the 69 it takes uncapped, 3 blocks;
 * perf_notes.md v17); the other kinds as many as their registers allow (at
 * 4, AdamW ran no faster). */
constexpr int kFlavourF32 = 0, kFlavourMixed = 1, kFlavourNarrow = 2, kFlavourMixedNarrowW = 3,
              kFlavourNarrowSR = 4, kFlavourF32Masked = 5;

/* The all-F32 flavours: plain, and with masks (plans with segments with
 * gaps: stream_view), apart so that the plain one's code is as it was. */
__host__ __device__ constexpr bool flavour_f32(int fl) { return fl == kFlavourF32 || fl == kFlavourF32Masked; }

constexpr int blocks_per_sm(int pass, int fl, int kind) {
  /* the masked flavour's block kernel: 4 blocks for every kind (AdamW 64
   * registers; many-mixed 0.862 of the copy against 0.835 at 3, SGD 0.863
   * against 0.827: perf_notes_gaps.md v22; its warp kernel: 3, below), 6
   * for its statistics pass (40 registers, two float4 a stage:
   * stream_chunk.cuh), which cover more of each other's fixed costs around
   * their 64 KB chunks (records, mask words, the block sum): its statistics
   * step +0.2 to 0.8 point, 4 blocks at 64 registers before (one H100,
   * perf_notes_masked.md v29) */
  if (fl == kFlavourF32Masked) return pass == MTOPT__PASS_STATS ? 6 : 4;
  if (flavour_f32(fl)) return kind == MTOPT__KIND_SGD ? 4 : 1; /* 1: no cap */
  return fl == kFlavourMixed || fl == kFlavourNarrowSR ? 3 : 4;
}

/* The block kernels that count their unit at its start (count_early): the
 * masked flavour's update (AdamW, Adam, SGD; LAMB never runs it), whose
 * blocks are short (kSliceLenMasked), so that the end's barriers are a
 * larger share of a block's life: SGD +0.8 to 1.0 point on many-mixed and
 * tiny-50k, AdamW no change (one H100, docs/perf_notes_blocks.md v31).
 * With the other flavours on GPT-2 XL it cost 0.2 to 0.5 (v32; likelier the
 * count's round trip before a long block's first load than the two
 * registers those kernels took more, which cut no occupancy), so they count
 * at their end. */
__host__ __device__ constexpr bool counts_early(int pass, int fl) {
  return pass == MTOPT__PASS_UPDATE && fl == kFlavourF32Masked;
}

/* The masked statistics pass takes its chunks last to first (one a block,
 * slots per chunk: the same sums), so that the update, which starts at the
 * first, finds the gradients read last still in L2 (with plain loads:
 * stream_chunk.cuh): its statistics step +0.5 to 0.8 point on one H200
 * (perf_notes_masked.md, v27). The other flavours keep the order, not
 * measured in reverse. */
template <int PASS, int KIND, int FL>
__global__ void __launch_bounds__(kBlock, blocks_per_sm(PASS, FL, KIND))
    block_kernel(mtopt__plan_t p, int64_t c0, int slices) {
  __shared__ ChunkView v;
  __shared__ unsigned before; /* kEarly: thread 0's count (do_chunk) */
  constexpr bool kReverse = PASS == MTOPT__PASS_STATS && FL == kFlavourF32Masked;
  constexpr bool kEarly = counts_early(PASS, FL);
  const unsigned b = kReverse ? gridDim.x - 1 - blockIdx.x : blockIdx.x;
  do_chunk<kBlock, PASS, KIND, !flavour_f32(FL), FL == kFlavourNarrowSR, FL == kFlavourF32Masked>(
      p, c0 + b / slices, (int)(b % slices), slices, v, kEarly ? &before : nullptr);
  const int64_t total = p.num_chunks * slices;
  if constexpr (kEarly) {
    end_early<PASS>(p, before, total);
  } else {
    finish_block<PASS>(p, 1u, total);
  }
}

template <int PASS, int KIND, bool MIXED, bool MASKED>
__device__ __forceinline__ void warp_loop(const mtopt__plan_t &p, int64_t c0, int64_t c1) {
  __shared__ ChunkView views[kBlock / 32];
  __shared__ unsigned done;
  if (threadIdx.x == 0) done = 0;
  __syncthreads();
  ChunkView &v = views[team_index<32>()];
  const int lane = team_lane<32>();
  constexpr int claim = warp_claim<PASS, MIXED>();
  unsigned mine = 0;
  for (;;) {
    unsigned k = 0;
    if (lane == 0) k = atomicAdd(&p.hyper->chunks_fetched, (unsigned)claim);
    k = __shfl_sync(0xffffffffu, k, 0);
    if ((int64_t)k >= c1 - c0) break;
    const int64_t end = (int64_t)k + claim < c1 - c0 ? (int64_t)k + claim : c1 - c0;
#pragma unroll 1
    for (int64_t j = k; j < end; j++)
      do_chunk<32, PASS, KIND, MIXED, false, MASKED>(p, c0 + j, 0, 1, v);
    mine += (unsigned)(end - k);
  }
  if (lane == 0) atomicAdd(&done, mine);
  __syncthreads(); /* every warp has stopped fetching */
  if (threadIdx.x == 0) {
    /* atomicInc wraps the exit count to 0 itself on the last block */
    if (atomicInc(&p.hyper->blocks_exited, gridDim.x - 1) == gridDim.x - 1)
      atomicExch(&p.hyper->chunks_fetched, 0u);
  }
  finish_block<PASS>(p, done, p.num_chunks);
}

template <int PASS, int KIND, bool MIXED>
__global__ void __launch_bounds__(kBlock) warp_kernel(mtopt__plan_t p, int64_t c0, int64_t c1) {
  warp_loop<PASS, KIND, MIXED, false>(p, c0, c1);
}

/* The masked flavour, at 3 blocks per SM: its warp loop needs more registers
 * than the block kernel's 64 (at 4 blocks it spilled 280 bytes a thread;
 * 4096-element chunks of many-mixed ran at 0.654 of a copy there, 0.780 at
 * 3: one H100, perf_notes_gaps.md, v23). */
template <int PASS, int KIND>
__global__ void __launch_bounds__(kBlock, 3)
    warp_kernel_masked(mtopt__plan_t p, int64_t c0, int64_t c1) {
  warp_loop<PASS, KIND, false, true>(p, c0, c1);
}

/* ---- the grid of a pass ---- */

/* Slices per chunk of a large-chunk plan's pass (see "Slices" above), by the
 * flavour launch picked for it: about kSliceLenNarrow (bf16 state),
 * kSliceLenMasked (the masked flavour) or kSliceLen (the others) elements of
 * a mean chunk each (so that few slices are empty); 1 for the passes that
 * fill per-chunk slots, where the grid would pass 2^31-1 blocks, and for SGD
 * with bf16 state rounded stochastically (perf_notes.md v7 and v12,
 * perf_notes_mixed.md v14 and v22). */
template <int PASS, int KIND, int FL>
int slices_of(const mtopt__plan_t &p) {
  if (PASS != MTOPT__PASS_UPDATE || KIND == MTOPT__KIND_LAMB) return 1;
  if (KIND == MTOPT__KIND_SGD && FL == kFlavourNarrowSR) return 1;
  const int64_t per = FL == kFlavourNarrow || FL == kFlavourNarrowSR ? kSliceLenNarrow
                      : FL == kFlavourF32Masked                      ? kSliceLenMasked
                                                                     : kSliceLen;
  const int64_t len = p.mean_chunk_len < p.chunk_size ? p.mean_chunk_len : p.chunk_size;
  const int64_t s = (len + per - 1) / per;
  return s > 1 && p.num_chunks * s <= INT32_MAX ? (int)s : 1;
}

/* FL: the plan's flavour. The all-F32 kernels are instantiated apart, so that
 * the registers of the mixed-precision paths do not cut their occupancy; the
 * small-chunk kernel has one mixed flavour. */
template <int PASS, int KIND, int FL>
void launch(const mtopt__plan_t &p, int sm_count, int64_t c0, int64_t c1, cudaStream_t stream) {
  const int64_t n = c1 - c0;
  if (p.mean_chunk_len >= kWarpTeamBelow) {
    const int slices = slices_of<PASS, KIND, FL>(p);
    block_kernel<PASS, KIND, FL><<<(unsigned)(n * slices), kBlock, 0, stream>>>(p, c0, slices);
    return;
  }
  /* Enough blocks to fill the SMs (a few resident per SM), no more than the
   * chunks need. */
  const int64_t want = (n + kBlock / 32 - 1) / (kBlock / 32);
  const int64_t fill = (int64_t)sm_count * kWarpBlocksPerSm;
  const unsigned grid = (unsigned)(want < fill ? want : fill);
  if constexpr (FL == kFlavourF32Masked)
    warp_kernel_masked<PASS, KIND><<<grid, kBlock, 0, stream>>>(p, c0, c1);
  else
    warp_kernel<PASS, KIND, !flavour_f32(FL)><<<grid, kBlock, 0, stream>>>(p, c0, c1);
}

template <int PASS, int KIND>
void launch(const mtopt__plan_t &p, int sm_count, int64_t c0, int64_t c1, cudaStream_t stream) {
  /* the 2-byte-weight flavour is built for the update of AdamW, Adam and SGD
   * only; the other passes of such plans run the mixed one */
  constexpr int kNarrowW =
      PASS == MTOPT__PASS_UPDATE && KIND != MTOPT__KIND_LAMB ? kFlavourMixedNarrowW : kFlavourMixed;
  constexpr int kNarrowSR =
      PASS == MTOPT__PASS_UPDATE && KIND != MTOPT__KIND_LAMB ? kFlavourNarrowSR : kFlavourNarrow;
  /* LAMB keeps its tensors (core/segments.c): no masks, no masked kernels */
  constexpr int kF32Masked = KIND == MTOPT__KIND_LAMB ? kFlavourF32 : kFlavourF32Masked;
  if (p.all_f32 && p.masks)
    launch<PASS, KIND, kF32Masked>(p, sm_count, c0, c1, stream);
  else if (p.all_f32)
    launch<PASS, KIND, kFlavourF32>(p, sm_count, c0, c1, stream);
  else if (p.bf16_state && p.stochastic)
    launch<PASS, KIND, kNarrowSR>(p, sm_count, c0, c1, stream);
  else if (p.bf16_state)
    launch<PASS, KIND, kFlavourNarrow>(p, sm_count, c0, c1, stream);
  else if (p.narrow_weights)
    launch<PASS, KIND, kNarrowW>(p, sm_count, c0, c1, stream);
  else
    launch<PASS, KIND, kFlavourMixed>(p, sm_count, c0, c1, stream);
}

} /* namespace */

/* The launcher step_launch.cu calls (launch.h), defined here for the
 * instantiations of a pass_*.cu. */
template <int PASS, int KIND>
cudaError_t mtopt__launch_of(const mtopt__plan_t &p, int sm_count, int64_t c0, int64_t c1,
                             cudaStream_t stream) {
  launch<PASS, KIND>(p, sm_count, c0, c1, stream);
  return cudaGetLastError();
}

#endif /* MTOPT_BACKEND_CUDA_STEP_KERNELS_CUH */

/*
 * How a block of the step kernels (step_kernels.cuh) ends: it counts the units
 * it did in the plan's hyper block, and the block that counts a pass's last
 * unit finalises the pass (the statistics' sums, the step's commit). Most
 * blocks count at their end (finish_block); the block kernels counts_early
 * names count at their start (count_early, end_early).
 */
#ifndef MTOPT_BACKEND_CUDA_BLOCK_END_CUH
#define MTOPT_BACKEND_CUDA_BLOCK_END_CUH

#include <cuda/atomic>
#include <cuda_runtime.h>
#include <stdint.h>

#include "../../common/step_math.h"
#include "team.cuh"

namespace {

/* What the block that counts a pass's last unit does last, in one thread:
 * every other block of the pass has counted, so none reads the hyper block
 * again. */
template <int PASS>
__device__ __forceinline__ void end_pass(const mtopt__plan_t &p) {
  mtopt__hyper_t *h = p.hyper;
  h->chunks_done = 0;
  if (mtopt__pass_ends_step(&p, PASS)) mtopt__step_commit(&p, h);
}

/* The update of AdamW, Adam and SGD fills no slots: its finaliser only needs
 * every block to have read the hyper block (load_view), not to have done its
 * elements. So a block kernel of that pass may count its unit as soon as its
 * view is loaded (count_early, release: the reads come first); then only the
 * block that counted last, when its own elements are done, ends the pass
 * (acquire: a fence), and the other blocks end with their last store,
 * without finish_block's barriers, fence and atomic round trip. Which
 * kernels do: counts_early, by the flavours. */
__device__ __forceinline__ unsigned count_early(const mtopt__plan_t &p) {
  return cuda::atomic_ref<uint32_t, cuda::thread_scope_device>(p.hyper->chunks_done)
      .fetch_add(1u, cuda::memory_order_release);
}

/* Every block calls it once, with all threads, counting the units it did
 * (chunks, or slices of chunks) out of the pass's total. The block that
 * completes the last unit of the pass (over all launches of the pass: the
 * distributed layer may run a pass in several ranges) finalises it. Release: each block's slot
 * writes are made visible (__threadfence) before its atomic; acquire: the last
 * block fences again after seeing the full count and reads the slots from L2
 * (__ldcg), never from a possibly stale L1 line. */
template <int PASS>
__device__ void finish_block(const mtopt__plan_t &p, unsigned units, int64_t total) {
  __shared__ int last;
  __syncthreads(); /* the whole block's work, including its slot writes */
  if (threadIdx.x == 0) {
    __threadfence();
    const unsigned prev = atomicAdd(&p.hyper->chunks_done, units);
    /* A block that got no chunk never finalises: it may arrive after the
     * count is complete. */
    last = units > 0 && (int64_t)prev + units == total;
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  mtopt__hyper_t *h = p.hyper;
  if constexpr (PASS == MTOPT__PASS_STATS) {
    /* All slots, a fixed order: the same norm on every run. */
    double sumsq = 0.0;
    unsigned long long bad = 0;
    /* Unrolled so that several slot loads are in flight (the sum order per
     * thread stays sequential); this loop is on the step's critical path. */
#pragma unroll 8
    for (int64_t k = threadIdx.x; k < p.num_chunks; k += kBlock) {
      sumsq += __ldcg(&p.slot_gsq[k]);
      bad += __ldcg(&p.slot_nonfinite[k]);
    }
    sumsq = block_sum(sumsq);
    bad = block_sum(bad);
    if (threadIdx.x == 0) {
      if (p.defer_stats) { /* the caller adds the other ranks' sums (plan.h) */
        p.stats_sum[0] = sumsq;
        p.stats_sum[1] = (double)bad;
      } else {
        mtopt__stats_finalize(h, sumsq, (uint64_t)bad);
      }
    }
  }
  if (threadIdx.x == 0) end_pass<PASS>(p);
}

/* The end of a block that counted its unit at its start (count_early, its
 * result in the block's shared word before): thread 0 of the block that
 * counted the pass's last unit ends the pass once its own elements are done
 * (acquire: a fence); every other block just returns. */
template <int PASS>
__device__ __forceinline__ void end_early(const mtopt__plan_t &p, const unsigned &before,
                                          int64_t total) {
  const volatile unsigned &counted = before; /* thread 0's own store */
  if (threadIdx.x == 0 && (int64_t)counted + 1 == total) {
    __threadfence();
    end_pass<PASS>(p);
  }
}

} /* namespace */

#endif /* MTOPT_BACKEND_CUDA_BLOCK_END_CUH */

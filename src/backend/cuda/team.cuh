/*
 * Teams and their sums for the step kernels (step_kernels.cuh): the threads
 * that share one chunk, a block (kBlock threads) or a warp, and reductions
 * over them in a fixed order (the same total on every run).
 */
#ifndef MTOPT_BACKEND_CUDA_TEAM_CUH
#define MTOPT_BACKEND_CUDA_TEAM_CUH

#include <cuda_runtime.h>

namespace {

constexpr int kBlock = 256; /* threads per block */

/* ---- reductions (fixed order: deterministic) ---- */

template <class T>
__device__ __forceinline__ T warp_sum(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
}

/* The block's total, valid in thread 0. Every thread must call it. */
template <class T>
__device__ __forceinline__ T block_sum(T v) {
  __shared__ T part[kBlock / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads(); /* an earlier call may still be reading part[] */
  if (lane == 0) part[warp] = v;
  __syncthreads();
  T r = T(0);
  if (warp == 0) {
    r = lane < kBlock / 32 ? part[lane] : T(0);
    r = warp_sum(r);
  }
  return r;
}

/* ---- teams: the threads that share one chunk ----
 * TEAM == kBlock: a block per chunk (large chunks). TEAM == 32: a warp per
 * chunk, for plans of small chunks (many small tensors), where a block's fixed
 * costs (the chunk/tensor/scalar prologue, the completion count) would
 * otherwise outweigh its few hundred elements. */
template <int TEAM>
__device__ __forceinline__ int team_lane() {
  return TEAM == kBlock ? (int)threadIdx.x : (int)(threadIdx.x & (TEAM - 1));
}

template <int TEAM>
__device__ __forceinline__ int team_index() {
  return TEAM == kBlock ? 0 : (int)(threadIdx.x / TEAM);
}

template <int TEAM>
__device__ __forceinline__ void team_sync() {
  if constexpr (TEAM == kBlock)
    __syncthreads();
  else
    __syncwarp();
}

/* The team's total, valid in its lane 0. Every thread of the team calls it. */
template <int TEAM, class T>
__device__ __forceinline__ T team_sum(T v) {
  if constexpr (TEAM == kBlock)
    return block_sum(v);
  else
    return warp_sum(v);
}

} /* namespace */

#endif /* MTOPT_BACKEND_CUDA_TEAM_CUH */

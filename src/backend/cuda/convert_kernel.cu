/* The fp32 widening of 16-bit gradients (launch.h: mtopt__launch_widen), for
 * the distributed layer's fp32 reduction of BF16/F16 buckets. The conversion
 * is dtype.h's (mtopt__ld), the one the CPU backend runs, so both give the
 * same bits. Bandwidth-bound (2 bytes read, 4 written per element): a
 * grid-stride loop of 64-bit indices, at most kMaxBlocks blocks. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "../../common/dtype.h"
#include "launch.h"

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 4096;

template <int DT>
__global__ void widen_kernel(float *__restrict__ dst, const uint16_t *__restrict__ src,
                             int64_t n) {
  const int64_t stride = (int64_t)gridDim.x * blockDim.x;
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride)
    dst[i] = mtopt__ld(src, DT, i);
}

} /* namespace */

extern "C" cudaError_t mtopt__launch_widen(float *dst, const void *src, int dt, int64_t n,
                                           cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  if (dt != MTOPT__DT_BF16 && dt != MTOPT__DT_F16) return cudaErrorInvalidValue;
  const int64_t want = (n + kThreads - 1) / kThreads;
  const unsigned blocks = (unsigned)(want < kMaxBlocks ? want : kMaxBlocks);
  const uint16_t *s = static_cast<const uint16_t *>(src);
  if (dt == MTOPT__DT_BF16)
    widen_kernel<MTOPT__DT_BF16><<<blocks, kThreads, 0, stream>>>(dst, s, n);
  else
    widen_kernel<MTOPT__DT_F16><<<blocks, kThreads, 0, stream>>>(dst, s, n);
  return cudaGetLastError();
}

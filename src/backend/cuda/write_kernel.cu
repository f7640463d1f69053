/* The setters' ordered small writes (launch.h: mtopt__launch_write): the bytes
 * travel as kernel arguments, so the caller's buffer may be reused at once
 * and the write is capturable in a CUDA graph. */
#include <cuda_runtime.h>
#include <string.h>

#include "launch.h"

namespace {

constexpr int kWriteBytes = 64;
struct WriteArgs {
  unsigned char b[kWriteBytes];
};

__global__ void write_kernel(unsigned char *dst, WriteArgs src, int n) {
  if ((int)threadIdx.x < n) dst[threadIdx.x] = src.b[threadIdx.x];
}

} /* namespace */

extern "C" cudaError_t mtopt__launch_write(void *dst, const void *src, size_t bytes,
                                           cudaStream_t stream) {
  unsigned char *d = static_cast<unsigned char *>(dst);
  const unsigned char *s = static_cast<const unsigned char *>(src);
  while (bytes > 0) {
    const int n = bytes < (size_t)kWriteBytes ? (int)bytes : kWriteBytes;
    WriteArgs a;
    memset(&a, 0, sizeof a);
    memcpy(a.b, s, (size_t)n);
    write_kernel<<<1, kWriteBytes, 0, stream>>>(d, a, n);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
    d += n;
    s += n;
    bytes -= (size_t)n;
  }
  return cudaSuccess;
}

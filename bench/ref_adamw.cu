/* The reference AdamW kernel (ref_adamw.h says what it is for): one float4 of
 * each of w, g, m, v per thread, a grid that covers every element (the last
 * n % 4 elements one per thread after the float4s), plain loads and stores. */
#include <cuda_runtime.h>
#include <limits.h>

#include "ref_adamw.h"

static __global__ void ref_adamw_kernel(float *w, const float *g, float *m, float *v,
                                        int64_t n4, int rem, ref_adamw_hp_t hp) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n4) {
    float4 W = reinterpret_cast<float4 *>(w)[i];
    const float4 G = reinterpret_cast<const float4 *>(g)[i];
    float4 M = reinterpret_cast<float4 *>(m)[i];
    float4 V = reinterpret_cast<float4 *>(v)[i];
    ref_adamw_elem(&W.x, G.x, &M.x, &V.x, &hp);
    ref_adamw_elem(&W.y, G.y, &M.y, &V.y, &hp);
    ref_adamw_elem(&W.z, G.z, &M.z, &V.z, &hp);
    ref_adamw_elem(&W.w, G.w, &M.w, &V.w, &hp);
    reinterpret_cast<float4 *>(w)[i] = W;
    reinterpret_cast<float4 *>(m)[i] = M;
    reinterpret_cast<float4 *>(v)[i] = V;
  } else if (i - n4 < rem) {
    const int64_t j = 4 * n4 + (i - n4);
    ref_adamw_elem(&w[j], g[j], &m[j], &v[j], &hp);
  }
}

extern "C" int ref_adamw_cuda_step(const ref_adamw_t *r, void *stream) {
  const int threads = 256;
  const int64_t n4 = r->n / 4, rem = r->n % 4;
  const int64_t blocks = (n4 + rem + threads - 1) / threads;
  /* float4 loads need 16-byte aligned buffers (cudaMalloc gives 256). */
  if (blocks < 1 || blocks > INT_MAX ||
      ((uintptr_t)r->w | (uintptr_t)r->g | (uintptr_t)r->m | (uintptr_t)r->v) % 16)
    return (int)cudaErrorInvalidValue;
  ref_adamw_kernel<<<(unsigned)blocks, threads, 0, (cudaStream_t)stream>>>(
      r->w, r->g, r->m, r->v, n4, (int)rem, r->hp);
  return (int)cudaGetLastError();
}

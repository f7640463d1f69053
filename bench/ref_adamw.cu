/* The reference AdamW kernels (ref_adamw.h says what they are for): a thread
 * per 4 elements, one 16-byte load of each fp32 array (8 bytes of each bf16
 * one), a grid that covers every element (the last n % 4 elements one per
 * thread after the groups), plain loads and stores; pooled, a group that is
 * partly or wholly a gap stores only its tensor's elements. */
#include <cuda_runtime.h>
#include <limits.h>

#include "ref_adamw.h"

/* The gradients of 4 elements as one load brings them, and element k. */
__device__ __forceinline__ float grad_of(const float4 &g, int k) {
  return k == 0 ? g.x : k == 1 ? g.y : k == 2 ? g.z : g.w;
}
__device__ __forceinline__ float grad_of(const uint2 &g, int k) {
  const uint32_t word = k < 2 ? g.x : g.y;
  return ref_bf16_to_f32((uint16_t)(k & 1 ? word >> 16 : word & 0xffffu));
}
__device__ __forceinline__ float grad_of(float g) { return g; }
__device__ __forceinline__ float grad_of(uint16_t g) { return ref_bf16_to_f32(g); }

/* Element k of a group, to store it alone. */
__device__ __forceinline__ float &lane(float4 &x, int k) {
  return k == 0 ? x.x : k == 1 ? x.y : k == 2 ? x.z : x.w;
}

/* LAYOUT REF_ADAMW_F32: G float, gradients float4; BF16_MASTER: G uint16_t,
 * gradients uint2, and p written as each master rounded. Pooled, every
 * group is loaded whole (the span is one allocation) and only its tensor's
 * elements are stored, so that the count's load does not delay the data's. */
template <int LAYOUT, class G, class G4>
static __global__ void ref_kernel(float *w, const G *g, float *m, float *v, uint16_t *p,
                                  const uint8_t *valid, int64_t n4, int rem,
                                  ref_adamw_hp_t hp) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n4) {
    const int k = valid ? valid[i] : 4;
    float4 W = reinterpret_cast<float4 *>(w)[i];
    const G4 g4 = reinterpret_cast<const G4 *>(g)[i];
    float4 M = reinterpret_cast<float4 *>(m)[i];
    float4 V = reinterpret_cast<float4 *>(v)[i];
    ref_adamw_elem(&W.x, grad_of(g4, 0), &M.x, &V.x, &hp);
    ref_adamw_elem(&W.y, grad_of(g4, 1), &M.y, &V.y, &hp);
    ref_adamw_elem(&W.z, grad_of(g4, 2), &M.z, &V.z, &hp);
    ref_adamw_elem(&W.w, grad_of(g4, 3), &M.w, &V.w, &hp);
    if (k == 4) {
      reinterpret_cast<float4 *>(w)[i] = W;
      reinterpret_cast<float4 *>(m)[i] = M;
      reinterpret_cast<float4 *>(v)[i] = V;
      if constexpr (LAYOUT == REF_ADAMW_BF16_MASTER)
        reinterpret_cast<uint2 *>(p)[i] =
            make_uint2(ref_f32_to_bf16(W.x) | ((uint32_t)ref_f32_to_bf16(W.y) << 16),
                       ref_f32_to_bf16(W.z) | ((uint32_t)ref_f32_to_bf16(W.w) << 16));
      return;
    }
    for (int e = 0; e < k; e++) {
      w[4 * i + e] = lane(W, e);
      m[4 * i + e] = lane(M, e);
      v[4 * i + e] = lane(V, e);
      if constexpr (LAYOUT == REF_ADAMW_BF16_MASTER) p[4 * i + e] = ref_f32_to_bf16(lane(W, e));
    }
  } else if (i - n4 < rem) {
    const int64_t j = 4 * n4 + (i - n4);
    ref_adamw_elem(&w[j], grad_of(g[j]), &m[j], &v[j], &hp);
    if constexpr (LAYOUT == REF_ADAMW_BF16_MASTER) p[j] = ref_f32_to_bf16(w[j]);
  }
}

extern "C" int ref_adamw_cuda_step(const ref_adamw_t *r, void *stream) {
  const int threads = 256;
  const int64_t n4 = r->n / 4, rem = r->n % 4;
  const int64_t blocks = (n4 + rem + threads - 1) / threads;
  /* Vector loads need 16-byte aligned buffers (cudaMalloc gives 256). */
  const uintptr_t any = (uintptr_t)r->w | (uintptr_t)r->g | (uintptr_t)r->m | (uintptr_t)r->v |
                        (uintptr_t)r->p;
  if (blocks < 1 || blocks > INT_MAX || any % 16 || (r->valid && rem))
    return (int)cudaErrorInvalidValue;
  cudaStream_t s = (cudaStream_t)stream;
  if (r->layout == REF_ADAMW_BF16_MASTER)
    ref_kernel<REF_ADAMW_BF16_MASTER, uint16_t, uint2><<<(unsigned)blocks, threads, 0, s>>>(
        r->w, (const uint16_t *)r->g, r->m, r->v, r->p, r->valid, n4, (int)rem, r->hp);
  else
    ref_kernel<REF_ADAMW_F32, float, float4><<<(unsigned)blocks, threads, 0, s>>>(
        r->w, (const float *)r->g, r->m, r->v, r->p, r->valid, n4, (int)rem, r->hp);
  return (int)cudaGetLastError();
}

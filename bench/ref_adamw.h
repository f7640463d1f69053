/* A reference AdamW step for the benchmark, written from scratch and sharing
 * nothing with the library: PyTorch's AdamW (decoupled weight decay) in fp32
 * over one flat buffer of each of w, g, m, v, the simplest code that runs it
 * (ref_adamw.cu: one float4 of each array per thread, a grid that covers all
 * elements, no streaming hints; bench_cpu.c: one OpenMP loop). It shows that
 * the floor, a copy of the same bytes, is reachable with real AdamW math.
 * bench_ref.c checks it against a double-precision step before timing it.
 *
 * Two layouts: fp32 (w, g, m, v), and that of mtopt_bench's bf16-master
 * configuration: bf16 parameters p and gradients g, the fp32 masters in w,
 * fp32 m and v; the step updates the master and writes p, the master
 * rounded to nearest even. Both move 28 bytes per parameter.
 *
 * Pooled (`valid` set: the mode ref-adamw-pooled): every array holds the
 * shape's tensors as the benchmark's pool does, each at its own 256-byte
 * start, the same offsets in every array, and the step walks the whole span
 * in address order, skipping the gaps: what a step over a caller's pooled
 * tensors could reach if the state mirrored the pool (one more byte read
 * per 4 elements, the group's count).
 *
 * The element formula below is read by both compilers (C and nvcc), so the
 * CPU loop and the CUDA kernel compute the same thing. */
#ifndef MTOPT_BENCH_REF_ADAMW_H
#define MTOPT_BENCH_REF_ADAMW_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define REF_ADAMW_FN __host__ __device__ __forceinline__
#else
#define REF_ADAMW_FN static inline
#endif

/* Bytes one step moves per element: reads w, g, m, v; writes w, m, v. */
#define REF_ADAMW_BYTES_PER_PARAM (4 * 4 + 3 * 4)

/* The scalars of one step t (counted from 1). */
typedef struct {
  float beta1, beta2, eps;
  float decay;        /* 1 - lr * weight_decay */
  float step_size;    /* lr / (1 - beta1^t) */
  float sqrt_bc2;     /* sqrt(1 - beta2^t) */
} ref_adamw_hp_t;

#define REF_ADAMW_F32 0
#define REF_ADAMW_BF16_MASTER 1

/* The buffers, the hyperparameters and the steps taken. */
typedef struct {
  int layout;       /* REF_ADAMW_* */
  float *w, *m, *v; /* w: the weights, or (BF16_MASTER) the fp32 masters */
  void *g;          /* float, or (BF16_MASTER) uint16_t bf16 */
  uint16_t *p;      /* BF16_MASTER: the bf16 parameters */
  int64_t n;        /* elements of each array (pooled: the span, a multiple of 4) */
  /* Pooled: per group of 4 elements, how many from its start are a
   * tensor's (0: a gap); tensors start on group boundaries. NULL: all n. */
  const uint8_t *valid;
  double lr, beta1, beta2, eps, weight_decay;
  int64_t t;         /* steps taken */
  ref_adamw_hp_t hp; /* of step t, set by ref_adamw_next */
} ref_adamw_t;

/* The scalars of the next step, in double on the host, as PyTorch does. */
static inline void ref_adamw_next(ref_adamw_t *r) {
  r->t++;
  r->hp.beta1 = (float)r->beta1;
  r->hp.beta2 = (float)r->beta2;
  r->hp.eps = (float)r->eps;
  r->hp.decay = (float)(1.0 - r->lr * r->weight_decay);
  r->hp.step_size = (float)(r->lr / (1.0 - pow(r->beta1, (double)r->t)));
  r->hp.sqrt_bc2 = (float)sqrt(1.0 - pow(r->beta2, (double)r->t));
}

/* bf16 <-> fp32: the upper half of the bits; to nearest even (finite x). */
REF_ADAMW_FN float ref_bf16_to_f32(uint16_t h) {
  const uint32_t b = (uint32_t)h << 16;
  float x;
  memcpy(&x, &b, 4);
  return x;
}

REF_ADAMW_FN uint16_t ref_f32_to_bf16(float x) {
  uint32_t b;
  memcpy(&b, &x, 4);
  return (uint16_t)((b + 0x7fffu + ((b >> 16) & 1u)) >> 16);
}

/* One element: torch.optim.AdamW's update (w *= 1 - lr wd; m, v moving
 * averages; w -= step_size m / (sqrt(v) / sqrt_bc2 + eps)). */
REF_ADAMW_FN void ref_adamw_elem(float *w, float g, float *m, float *v,
                                 const ref_adamw_hp_t *hp) {
  const float m1 = hp->beta1 * *m + (1.0f - hp->beta1) * g;
  const float v1 = hp->beta2 * *v + (1.0f - hp->beta2) * g * g;
  const float denom = sqrtf(v1) / hp->sqrt_bc2 + hp->eps;
  *w = *w * hp->decay - hp->step_size * m1 / denom;
  *m = m1;
  *v = v1;
}

#ifdef __cplusplus
extern "C" {
#endif
/* ref_adamw.cu: queues step r->hp over r's buffers (device memory) on the
 * stream (a cudaStream_t); returns a cudaError_t (0: queued). */
int ref_adamw_cuda_step(const ref_adamw_t *r, void *stream);
#ifdef __cplusplus
}
#endif

#endif /* MTOPT_BENCH_REF_ADAMW_H */

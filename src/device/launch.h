/* The launchers of the CUDA kernels (src/device/step_kernels.cu), for the CUDA
 * backend glue (src/host/backend_cuda.c). Plain C: pointers and sizes only. */
#ifndef MTOPT_DEVICE_LAUNCH_H
#define MTOPT_DEVICE_LAUNCH_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "../common/step_math.h"

#ifdef __cplusplus
extern "C" {
#endif

/* What the kernels of a pass read: the plan's device tables, passed by value
 * (a fixed-size argument whatever the number of tensors). */
typedef struct {
  const mtopt__tensor_rec_t *tensors;
  const mtopt__chunk_rec_t *chunks;
  const mtopt__group_rec_t *groups;
  mtopt__hyper_t *hyper;
  float *slot_gsq;
  uint32_t *slot_nonfinite;
  float *slot_wsq;
  float *slot_usq;
  double *stats_sum;  /* defer_stats: where the end of STATS leaves its sums */
  int64_t num_chunks; /* all chunks of the plan: the last-block election */
  int64_t mean_chunk_len; /* elements per chunk on average: picks the kernel */
  int32_t sm_count;       /* multiprocessors: sizes the small-chunk grid */
  int32_t reserved;
  int32_t kind;       /* MTOPT__KIND_* */
  int32_t defer_stats; /* ZeRO-1: leave the sums, do not finalise (internal.h) */
} mtopt__dev_plan_t;

/* Enqueues pass `pass` (mtopt__pass_t) over chunks [c0, c1) on `stream`: one
 * launch, nothing else (capturable). Returns the launch error, if any. */
cudaError_t mtopt__launch_pass(const mtopt__dev_plan_t *plan, int pass, int64_t c0,
                               int64_t c1, cudaStream_t stream);

/* Enqueues mtopt__stats_finalize(hyper, stats_sum[0], (uint64_t)stats_sum[1])
 * as a one-thread kernel: the deferred end of a STATS pass. */
cudaError_t mtopt__launch_finish_stats(mtopt__hyper_t *hyper, const double *stats_sum,
                                       cudaStream_t stream);

/* Enqueues a kernel that stores `bytes` bytes of `src` at device address `dst`.
 * The bytes travel as kernel arguments, so `src` may be reused (or be a stack
 * variable) as soon as this returns. */
cudaError_t mtopt__launch_write(void *dst, const void *src, size_t bytes,
                                cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* MTOPT_DEVICE_LAUNCH_H */

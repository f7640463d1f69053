/* The launchers of the CUDA kernels (step_kernels.cuh, write_kernel.cu,
 * convert_kernel.cu), for the CUDA backend glue (backend_cuda.c). Plain C:
 * pointers and sizes only. */
#ifndef MTOPT_DEVICE_LAUNCH_H
#define MTOPT_DEVICE_LAUNCH_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "../../common/plan.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Enqueues pass `pass` (mtopt__pass_t) over chunks [c0, c1) on `stream`: one
 * launch, nothing else (capturable). The kernels take the plan by value (a
 * fixed-size argument whatever the number of tensors); sm_count (the device's
 * multiprocessors) sizes the small-chunk grid. Returns the launch error. */
cudaError_t mtopt__launch_pass(const mtopt__plan_t *plan, int sm_count, int pass, int64_t c0,
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

/* Enqueues dst[i] = src[i] widened exactly to fp32 for i in [0, n): src of
 * dtype dt (MTOPT__DT_BF16 or _F16), by dtype.h's conversions
 * (convert_kernel.cu). */
cudaError_t mtopt__launch_widen(float *dst, const void *src, int dt, int64_t n,
                                cudaStream_t stream);

#ifdef __cplusplus
}

/* One pass's kernels (step_kernels.cuh), instantiated in pass_*.cu. */
template <int PASS, int KIND>
cudaError_t mtopt__launch_of(const mtopt__plan_t &p, int sm_count, int64_t c0, int64_t c1,
                             cudaStream_t stream);
#endif

#endif /* MTOPT_DEVICE_LAUNCH_H */

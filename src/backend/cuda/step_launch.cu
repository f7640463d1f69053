/* The extern "C" launchers of launch.h: which instantiation of the step
 * kernels (step_kernels.cuh, built in pass_*.cu) runs a pass, and the
 * one-thread kernels that end a pass without chunks or a deferred statistics
 * pass. */
#include <cuda_runtime.h>
#include <stdint.h>

#include "../../common/step_elem.h"
#include "launch.h"

namespace {

/* A pass over a plan with no chunks (an empty model, or a ZeRO-1 rank that
 * owns no elements) still ends: the same finalisation, by one thread. */
__global__ void empty_pass_kernel(mtopt__plan_t p, int pass) {
  if (pass == MTOPT__PASS_STATS) {
    if (p.defer_stats) {
      p.stats_sum[0] = 0.0;
      p.stats_sum[1] = 0.0;
    } else {
      mtopt__stats_finalize(p.hyper, 0.0, 0u);
    }
  } else if (mtopt__pass_ends_step(&p, pass)) {
    mtopt__step_commit(&p, p.hyper);
  }
}

__global__ void finish_stats_kernel(mtopt__hyper_t *h, const double *sum) {
  mtopt__stats_finalize(h, sum[0], (uint64_t)sum[1]);
}

} /* namespace */


extern "C" cudaError_t mtopt__launch_pass(const mtopt__plan_t *plan, int sm_count, int pass,
                                          int64_t c0, int64_t c1, cudaStream_t stream) {
  if (plan->num_chunks == 0) {
    empty_pass_kernel<<<1, 1, 0, stream>>>(*plan, pass);
    return cudaGetLastError();
  }
  if (c1 <= c0) return cudaSuccess;
  if (pass < MTOPT__PASS_STATS || pass > MTOPT__PASS_LAMB_APPLY ||
      plan->kind < MTOPT__KIND_ADAMW || plan->kind > MTOPT__KIND_LAMB)
    return cudaErrorInvalidValue;
  /* The statistics pass is the same for every kind, and LAMB_APPLY is LAMB's:
   * one instantiation each. */
  if (pass == MTOPT__PASS_STATS)
    return mtopt__launch_of<MTOPT__PASS_STATS, MTOPT__KIND_ADAMW>(*plan, sm_count, c0, c1, stream);
  if (pass == MTOPT__PASS_LAMB_APPLY)
    return mtopt__launch_of<MTOPT__PASS_LAMB_APPLY, MTOPT__KIND_LAMB>(*plan, sm_count, c0, c1,
                                                                      stream);
  switch (plan->kind) {
  case MTOPT__KIND_ADAMW:
    return mtopt__launch_of<MTOPT__PASS_UPDATE, MTOPT__KIND_ADAMW>(*plan, sm_count, c0, c1, stream);
  case MTOPT__KIND_ADAM:
    return mtopt__launch_of<MTOPT__PASS_UPDATE, MTOPT__KIND_ADAM>(*plan, sm_count, c0, c1, stream);
  case MTOPT__KIND_SGD:
    return mtopt__launch_of<MTOPT__PASS_UPDATE, MTOPT__KIND_SGD>(*plan, sm_count, c0, c1, stream);
  default:
    return mtopt__launch_of<MTOPT__PASS_UPDATE, MTOPT__KIND_LAMB>(*plan, sm_count, c0, c1, stream);
  }
}

extern "C" cudaError_t mtopt__launch_finish_stats(mtopt__hyper_t *hyper,
                                                  const double *stats_sum,
                                                  cudaStream_t stream) {
  finish_stats_kernel<<<1, 1, 0, stream>>>(hyper, stats_sum);
  return cudaGetLastError();
}

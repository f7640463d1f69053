/* The step kernels of LAMB's two passes (step_kernels.cuh). */
#include "step_kernels.cuh"

template cudaError_t mtopt__launch_of<MTOPT__PASS_UPDATE, MTOPT__KIND_LAMB>(
    const mtopt__plan_t &, int, int64_t, int64_t, cudaStream_t);
template cudaError_t mtopt__launch_of<MTOPT__PASS_LAMB_APPLY, MTOPT__KIND_LAMB>(
    const mtopt__plan_t &, int, int64_t, int64_t, cudaStream_t);

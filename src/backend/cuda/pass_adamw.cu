/* The step kernels of AdamW's update pass (step_kernels.cuh). */
#include "step_kernels.cuh"

template cudaError_t mtopt__launch_of<MTOPT__PASS_UPDATE, MTOPT__KIND_ADAMW>(
    const mtopt__plan_t &, int, int64_t, int64_t, cudaStream_t);

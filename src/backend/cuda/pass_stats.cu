/* The step kernels of the statistics pass (one for every kind) (step_kernels.cuh). */
#include "step_kernels.cuh"

template cudaError_t mtopt__launch_of<MTOPT__PASS_STATS, MTOPT__KIND_ADAMW>(
    const mtopt__plan_t &, int, int64_t, int64_t, cudaStream_t);

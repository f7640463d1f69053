/* What the host files that talk to the CUDA runtime share (backend_cuda.c,
 * which defines these, and the distributed layer's NCCL transport and SM
 * partition): the error mapping, the device guard and the driver lookup.
 * Exported from libmtopt (MTOPT__INTERNAL) for libmtopt_dist. Only files
 * built with CUDA include it. */
#ifndef MTOPT_CUDA_GLUE_H
#define MTOPT_CUDA_GLUE_H

#include <cuda_runtime_api.h>

#include "../../common/error.h"

/* Reports a CUDA failure on ctx: OUT_OF_MEMORY for a failed allocation,
 * CUDA_ERROR otherwise, with "<what>: <error name>: <error string>". Clears
 * the runtime's last-error slot so a later launch check does not report the
 * same failure again. */
MTOPT__INTERNAL mtopt_status_t mtopt__cuda_fail(mtopt_context_t *ctx, cudaError_t e,
                                              const char *what);

/* The runtime's current device is per host thread and the user may change it:
 * mtopt__device_enter makes the context's device current for the duration of
 * a call (one cudaGetDevice when it already is), mtopt__device_leave puts the
 * caller's back. */
typedef struct {
  int prev;
  int switched;
} mtopt__device_guard_t;

MTOPT__INTERNAL mtopt_status_t mtopt__device_enter(mtopt_context_t *ctx,
                                                 mtopt__device_guard_t *g);
MTOPT__INTERNAL void mtopt__device_leave(const mtopt__device_guard_t *g);

/* The driver function `name` at the version of the cuda.h we compile
 * against, looked up through the runtime (cudaGetDriverEntryPointByVersion,
 * CUDA 12.5+), so that the library does not link libcuda; NULL where the
 * runtime or the driver lacks it. */
MTOPT__INTERNAL void *mtopt__driver_fn(const char *name);

#endif /* MTOPT_CUDA_GLUE_H */

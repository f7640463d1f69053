/* Two streams on disjoint sets of a device's SMs (CUDA green contexts), for
 * the distributed layer: its collectives on a few SMs, its bucket steps on the
 * rest, so that the two overlap without sharing an SM (transport_nccl.c says why).
 * Only files built with CUDA include it. */
#ifndef MTOPT_SM_PARTITION_H
#define MTOPT_SM_PARTITION_H

#include <cuda_runtime_api.h>

#include "../common/error.h"
#include "../core/internal_api.h"

typedef struct mtopt__sm_partition mtopt__sm_partition_t;

/* Splits ctx's device into a group of at least `sms` SMs (rounded up to the
 * device's granularity) and the rest, each with its own non-blocking stream.
 * required == 0 (the automatic choice): *out is left NULL, with SUCCESS, where
 * the runtime or driver has no green contexts, the device has fewer than 3 *
 * sms SMs, or the split fails. required == 1: those cases are errors
 * (NOT_SUPPORTED, INVALID_ARGUMENT when sms leaves no SM for the rest,
 * CUDA_ERROR). */
MTOPT__HIDDEN mtopt_status_t mtopt__sm_partition_create(mtopt_context_t *ctx, int sms,
                                                        int required,
                                                        mtopt__sm_partition_t **out);
/* Destroys the streams (at once; their work completes) and the contexts. */
MTOPT__HIDDEN void mtopt__sm_partition_destroy(mtopt__sm_partition_t *p);
/* part 0: the group of `sms`; part 1: the rest. */
MTOPT__HIDDEN cudaStream_t mtopt__sm_partition_stream(const mtopt__sm_partition_t *p, int part);
MTOPT__HIDDEN int mtopt__sm_partition_sms(const mtopt__sm_partition_t *p, int part);

#endif /* MTOPT_SM_PARTITION_H */

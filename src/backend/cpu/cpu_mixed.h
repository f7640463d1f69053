/* The CPU backend's mixed-precision chunk passes (cpu_mixed.c), for
 * backend_cpu.c. s: the chunk's scalars (mtopt__chunk_scalars). */
#ifndef MTOPT_BACKEND_CPU_MIXED_H
#define MTOPT_BACKEND_CPU_MIXED_H

#include "../../common/error.h"
#include "../../common/step_math.h"
#include "cpu_kernels.h"

MTOPT__HIDDEN void mtopt__cpu_update_mixed(const mtopt__plan_t *p, const mtopt__hyper_t *h,
                                           const mtopt__scalars_t *s, int64_t c);
/* cpu_tiles.c: the UPDATE pass of AdamW, Adam and SGD, and the statistics
 * pass of every kind, in tiles. */
MTOPT__HIDDEN void mtopt__cpu_update_tiles(const mtopt__plan_t *p, const mtopt__hyper_t *h,
                                           const mtopt__scalars_t *s, int64_t c);
MTOPT__HIDDEN void mtopt__cpu_stats_tiles(const mtopt__plan_t *p, int64_t c, float inv,
                                          mtopt__cpu_stats_t *st);
MTOPT__HIDDEN void mtopt__cpu_lamb_apply_mixed(const mtopt__plan_t *p, const mtopt__hyper_t *h,
                                               const mtopt__scalars_t *s, int64_t c,
                                               float step);

#endif /* MTOPT_BACKEND_CPU_MIXED_H */

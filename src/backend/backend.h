/* The backend interface: memory and the passes of a step, one vtable per
 * backend (cpu/backend_cpu.c, cuda/backend_cuda.c). The core calls it; a
 * backend sees the context only through the accessors below and reports
 * failures through mtopt__error(ctx, ...). Host code only. */
#ifndef MTOPT_BACKEND_H
#define MTOPT_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "../common/error.h"
#include "../common/plan.h"

typedef struct mtopt__backend_ops {
  const char *name;
  /* 1 if run_pass serves every dtype combination (plan.h: !all_f32). */
  int mixed_precision;
  mtopt_status_t (*init)(mtopt_context_t *ctx);
  void (*fini)(mtopt_context_t *ctx);
  /* Zeroed memory, 256-byte aligned. */
  mtopt_status_t (*alloc)(mtopt_context_t *ctx, size_t bytes, void **out);
  void (*release)(mtopt_context_t *ctx, void *ptr);
  /* Set-up copies: complete when they return. */
  mtopt_status_t (*upload)(mtopt_context_t *ctx, void *dst, const void *src, size_t bytes);
  /* Waits for earlier work on the stream, then copies to the host. */
  mtopt_status_t (*download)(mtopt_context_t *ctx, void *dst, const void *src, size_t bytes);
  /* A small write ordered after earlier work on the stream (setters). */
  mtopt_status_t (*write_ordered)(mtopt_context_t *ctx, void *dst, const void *src,
                                  size_t bytes);
  mtopt_status_t (*zero_ordered)(mtopt_context_t *ctx, void *dst, size_t bytes);
  /* Checks that [ptr, ptr+bytes) is memory this backend's kernels can use. */
  mtopt_status_t (*check_pointer)(mtopt_context_t *ctx, const void *ptr, size_t bytes,
                                  const char *what, int64_t tensor);
  /* 1 if [ptr, ptr+bytes) lies in one allocation, so that a kernel may read
   * any byte of it (core/segments.c: MTOPT__FLAG_WHOLE_GROUPS); 0 if not, or
   * if the backend cannot tell. NULL: the backend's kernels never read gaps
   * (the CPU's masked loops go element by element). */
  int (*one_allocation)(mtopt_context_t *ctx, const void *ptr, size_t bytes);
  /* Enqueues (CUDA) or runs (CPU) one pass over chunks [c0, c1) of the plan.
   * A step is the passes mtopt__step_passes lists, each over all chunks,
   * possibly in several ranges (the distributed layer runs a pass per
   * bucket). hyper->chunks_done counts the chunks a pass has done (the
   * CUDA update's masked block kernels: the chunks that have read the hyper
   * block, as the update has nothing of its own to finalise;
   * step_kernels.cuh, counts_early); whoever counts the last finalises: the
   * end of STATS runs
   * mtopt__stats_finalize over all slots in chunk order (or, with
   * plan->defer_stats, leaves the sums in plan->stats_sum), the end of the
   * last pass runs mtopt__step_commit. UPDATE and LAMB_APPLY do nothing when
   * hyper->skip is set. stream: NULL for the context's stream, else it points
   * at the cudaStream_t to enqueue on (the distributed layer's bucket steps;
   * the CPU ignores it). */
  mtopt_status_t (*run_pass)(mtopt_context_t *ctx, const mtopt__plan_t *plan,
                             mtopt__pass_t pass, int64_t c0, int64_t c1, void *const *stream);
  mtopt_status_t (*synchronize)(mtopt_context_t *ctx);
  /* Enqueues (CUDA) or runs (CPU) dst[i] = src[i] for i in [0, n): src of
   * dtype dt (MTOPT__DT_BF16 or _F16) widened to fp32 exactly, by dtype.h's
   * conversions (NaN and inf kept). The distributed layer's fp32 reduction of
   * 16-bit gradient buckets. stream: as run_pass's (the communication
   * stream, so that the collective reading dst is ordered after it). */
  mtopt_status_t (*widen)(mtopt_context_t *ctx, float *dst, const void *src, int dt, int64_t n,
                          void *const *stream);
  /* In stream order: mtopt__stats_finalize(plan->hyper, plan->stats_sum[0],
   * (uint64_t)plan->stats_sum[1]), the deferred end of a STATS pass. */
  mtopt_status_t (*finish_stats)(mtopt_context_t *ctx, const mtopt__plan_t *plan);
} mtopt__backend_ops_t;

MTOPT__HIDDEN extern const mtopt__backend_ops_t mtopt__cpu_ops;
/* NULL in builds without CUDA. */
MTOPT__HIDDEN const mtopt__backend_ops_t *mtopt__cuda_ops(void);

/* What a backend may read of its context (core/context.c; the CUDA device:
 * core/internal_api.h). */
MTOPT__HIDDEN void *mtopt__context_backend_state(const mtopt_context_t *ctx);
MTOPT__HIDDEN void mtopt__context_set_backend_state(mtopt_context_t *ctx, void *state);
MTOPT__HIDDEN int mtopt__context_num_threads(const mtopt_context_t *ctx);

#endif /* MTOPT_BACKEND_H */

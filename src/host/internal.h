/* Internal host-side definitions shared by the API, the planner and the
 * backends. Not installed. */
#ifndef MTOPT_INTERNAL_H
#define MTOPT_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "mtopt/mtopt.h"
#include "../common/step_math.h"

#define MTOPT__HIDDEN __attribute__((visibility("hidden")))
#define MTOPT__ERRLEN 1024

/* Carry a failure up. */
#define CHECK(expr)                                                            \
  do {                                                                         \
    mtopt_status_t check_st_ = (expr);                                         \
    if (check_st_ != MTOPT_STATUS_SUCCESS) return check_st_;                   \
  } while (0)
#define CHECK_GOTO(expr, st, label)                                            \
  do {                                                                         \
    (st) = (expr);                                                             \
    if ((st) != MTOPT_STATUS_SUCCESS) goto label;                              \
  } while (0)

/* Everything a pass needs, in the backend's memory (host memory on the CPU,
 * device memory on CUDA). Built once per optimizer. */
typedef struct {
  const mtopt__tensor_rec_t *tensors;
  const mtopt__chunk_rec_t *chunks;
  const mtopt__group_rec_t *groups;
  mtopt__hyper_t *hyper;
  float *slot_gsq;          /* per chunk: sum of squares of the unscaled g */
  uint32_t *slot_nonfinite; /* per chunk: count of inf/NaN in g */
  float *slot_wsq;          /* LAMB, per chunk: sum of w^2 */
  float *slot_usq;          /* LAMB, per chunk: sum of u^2 */
  int64_t num_tensors;
  int64_t num_chunks;
  int64_t num_elements; /* over all tensors */
  int64_t chunk_size;
  int32_t kind;
  int32_t use_stats;
  /* ZeRO-1 (src/host/comm.c): each rank holds a shard, so the global norm
   * needs every rank's partial sum. When set, the end of STATS writes
   * stats_sum[0] = sum of squares and stats_sum[1] = non-finite count (as a
   * double) instead of calling mtopt__stats_finalize; the distributed layer
   * all-reduces them and calls ops->finish_stats. 0 in every plan that
   * optimizer.c builds. */
  int32_t defer_stats;
  double *stats_sum; /* 2 doubles in the backend's memory, or NULL */
} mtopt__plan_t;

typedef struct mtopt__backend_ops mtopt__backend_ops_t;


struct mtopt_context {
  mtopt_backend_t backend;
  int device;
  int num_threads;
  const mtopt__backend_ops_t *ops;
  void *backend_state; /* e.g. the CUDA stream and launch facts */
  int64_t live_objects; /* tensor lists and optimizers not yet destroyed */
  char last_error[MTOPT__ERRLEN];
};

/* A backend: memory and the step. Every function reports failures through
 * mtopt__error(ctx, ...). */
struct mtopt__backend_ops {
  const char *name;
  mtopt_status_t (*init)(mtopt_context_t *ctx);
  void (*fini)(mtopt_context_t *ctx);
  /* Zeroed memory, 256-byte aligned. */
  mtopt_status_t (*alloc)(mtopt_context_t *ctx, size_t bytes, void **out);
  void (*release)(mtopt_context_t *ctx, void *ptr);
  /* Set-up copies: complete when they return. */
  mtopt_status_t (*upload)(mtopt_context_t *ctx, void *dst, const void *src,
                           size_t bytes);
  /* Waits for earlier work on the stream, then copies to the host. */
  mtopt_status_t (*download)(mtopt_context_t *ctx, void *dst, const void *src,
                             size_t bytes);
  /* A small write ordered after earlier work on the stream (setters). */
  mtopt_status_t (*write_ordered)(mtopt_context_t *ctx, void *dst,
                                  const void *src, size_t bytes);
  mtopt_status_t (*zero_ordered)(mtopt_context_t *ctx, void *dst, size_t bytes);
  /* Checks that [ptr, ptr+bytes) is memory this backend's kernels can use. */
  mtopt_status_t (*check_pointer)(mtopt_context_t *ctx, const void *ptr,
                                  size_t bytes, const char *what, int64_t tensor);
  /* Enqueues (CUDA) or runs (CPU) one pass over chunks [c0, c1) of the plan.
   * A step is STATS (if plan->use_stats), UPDATE, and LAMB_APPLY (LAMB), each
   * over all chunks, possibly in several ranges (the distributed layer runs a
   * pass per bucket). hyper->blocks_done counts the chunks a pass has done;
   * whoever completes the last chunk finalises: the end of STATS runs
   * mtopt__stats_finalize over all slots in chunk order, the end of the last
   * pass runs mtopt__step_commit. UPDATE and LAMB_APPLY do nothing when
   * hyper->skip is set. stream: NULL for the context's stream, else it points
   * at the cudaStream_t to enqueue on (the distributed layer's bucket steps;
   * the CPU ignores it). */
  mtopt_status_t (*run_pass)(mtopt_context_t *ctx, const mtopt__plan_t *plan,
                             mtopt__pass_t pass, int64_t c0, int64_t c1,
                             void *const *stream);
  mtopt_status_t (*synchronize)(mtopt_context_t *ctx);
  /* Distributed layer. In stream order: mtopt__stats_finalize(plan->hyper,
   * plan->stats_sum[0], (uint64_t)plan->stats_sum[1]) (the deferred end of a
   * STATS pass, see mtopt__plan_t.defer_stats). NULL if not provided. */
  mtopt_status_t (*finish_stats)(mtopt_context_t *ctx, const mtopt__plan_t *plan);
};

MTOPT__HIDDEN extern const mtopt__backend_ops_t mtopt__cpu_ops;
/* NULL in builds without CUDA. */
MTOPT__HIDDEN const mtopt__backend_ops_t *mtopt__cuda_ops(void);

typedef struct {
  mtopt_tensor_desc_t desc;
  char *name; /* owned copy of desc.name, or NULL */
} mtopt__tensor_entry_t;

struct mtopt_tensor_list {
  mtopt_context_t *ctx;
  mtopt__tensor_entry_t *items;
  int64_t count, capacity;
  mtopt__group_rec_t groups[MTOPT_MAX_GROUPS];
  int64_t users; /* optimizers built from it: adding is refused while > 0 */
};

struct mtopt_optimizer {
  mtopt_context_t *ctx;
  mtopt_tensor_list_t *list; /* to unfreeze on destroy */
  mtopt_optimizer_config_t config;
  mtopt__hyper_t hyper_host; /* host mirror of the hyperparameters */
  mtopt__plan_t plan;        /* pointers into dev_mem */
  mtopt__tensor_rec_t *tensors_host;
  int64_t total_numel;
  int64_t state_bytes;
  /* Backend allocations, released on destroy. */
  void *dev_tables; /* tensors, chunks, groups, hyper, slots */
  void *dev_state;  /* the state slab */
  void *dev_grads;  /* the contiguous gradient buffer, or NULL */
  int64_t grad_buffer_numel;
};

/* Error reporting: formats the detail into ctx (if any) and the calling
 * thread's buffer, and returns status. */
MTOPT__HIDDEN mtopt_status_t mtopt__error(mtopt_context_t *ctx,
                                          mtopt_status_t status,
                                          const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* The chunk planner: tensors of numel[i] elements cut into chunks of at most
 * chunk_size. Writes first_chunk/num_chunks per tensor and the chunk records
 * (chunks may be NULL to only count). Returns the chunk count, or -1 if it
 * would overflow. Pure, so tests can plan tensors of 2^31+ elements without
 * allocating them. */
MTOPT__HIDDEN int64_t mtopt__plan_chunks(const int64_t *numel, int64_t n,
                                         int64_t chunk_size,
                                         int64_t *first_chunk,
                                         int64_t *num_chunks,
                                         mtopt__chunk_rec_t *chunks);

/* Every pass of one step over all chunks. */
MTOPT__HIDDEN mtopt_status_t mtopt__run_step(mtopt_context_t *ctx,
                                             const mtopt__plan_t *plan);

/* Rounds state and gradient-buffer offsets so that each tensor's state has the
 * same address residue mod 16 bytes as its weights (one vector path covers
 * w, g and state). Returns the padded offset for a tensor starting at or after
 * `offset` floats whose weights are at `w`. */
MTOPT__HIDDEN int64_t mtopt__aligned_offset(int64_t offset, const void *w);

#endif /* MTOPT_INTERNAL_H */

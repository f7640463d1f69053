/* The core's interface to the layer above it (src/dist) and to the tests:
 * what another layer may do with a context, a tensor list and an optimizer
 * without reading their fields. Exported from libmtopt as MTOPT__INTERNAL
 * (common/error.h says why); not installed, not API. */
#ifndef MTOPT_CORE_INTERNAL_API_H
#define MTOPT_CORE_INTERNAL_API_H

#include <stddef.h>
#include <stdint.h>

#include "mtopt/mtopt.h"
#include "../common/error.h"
#include "../common/plan.h"

/* ---- context ---- */

/* The CUDA device ordinal of the context (config.device). */
MTOPT__INTERNAL int mtopt__context_device(const mtopt_context_t *ctx);
/* Backend memory: zeroed, 256-byte aligned; released with _free. */
MTOPT__INTERNAL mtopt_status_t mtopt__context_alloc(mtopt_context_t *ctx, size_t bytes,
                                                    void **out);
MTOPT__INTERNAL void mtopt__context_free(mtopt_context_t *ctx, void *ptr);
/* Zeroes backend memory in stream order. */
MTOPT__INTERNAL mtopt_status_t mtopt__context_zero(mtopt_context_t *ctx, void *dst,
                                                   size_t bytes);
/* dst[0, n) = src[0, n) of dtype dt (MTOPT__DT_BF16/_F16) widened exactly to
 * fp32, in the order of `stream` (backend.h's widen: NULL the context's
 * stream, else a pointer to the cudaStream_t; the CPU runs it at once). */
MTOPT__INTERNAL mtopt_status_t mtopt__context_widen(mtopt_context_t *ctx, float *dst,
                                                    const void *src, int dt, int64_t n,
                                                    void *const *stream);
/* Objects made from the context (the communicator counts as one): the context
 * refuses to be destroyed while any is alive. */
MTOPT__INTERNAL void mtopt__context_hold(mtopt_context_t *ctx);
MTOPT__INTERNAL void mtopt__context_unhold(mtopt_context_t *ctx);

/* ---- tensor list ---- */

MTOPT__INTERNAL mtopt_context_t *mtopt__tensor_list_context(const mtopt_tensor_list_t *list);
MTOPT__INTERNAL int64_t mtopt__tensor_list_size(const mtopt_tensor_list_t *list);
/* Tensor i's descriptor as added (its name is the list's own copy). */
MTOPT__INTERNAL const mtopt_tensor_desc_t *mtopt__tensor_list_desc(const mtopt_tensor_list_t *list,
                                                                   int64_t i);
/* Whether an optimizer was built from it (it is then frozen). */
MTOPT__INTERNAL int mtopt__tensor_list_in_use(const mtopt_tensor_list_t *list);
/* Freezes the list for an object other than an optimizer (the ZeRO-1
 * distributed optimizer, which steps copies of its tensors); _unfreeze undoes
 * one _freeze. */
MTOPT__INTERNAL void mtopt__tensor_list_freeze(mtopt_tensor_list_t *list);
MTOPT__INTERNAL void mtopt__tensor_list_unfreeze(mtopt_tensor_list_t *list);
/* Gives dst (not yet frozen) the group multipliers of src. */
MTOPT__INTERNAL void mtopt__tensor_list_copy_groups(mtopt_tensor_list_t *dst,
                                                    const mtopt_tensor_list_t *src);

/* ---- optimizer ---- */

/* The one check of an optimizer config's struct_size and kind, for every
 * call that takes one; out receives the config at this library's size. */
MTOPT__INTERNAL mtopt_status_t mtopt__optimizer_config_read(mtopt_context_t *ctx, const char *fn,
                                                            const mtopt_optimizer_config_t *in,
                                                            mtopt_optimizer_config_t *out);

/* How another layer builds an optimizer. */
typedef struct {
  /* The plan defers the end of the statistics pass (mtopt__plan_t.defer_stats):
   * the caller sums stats_sum over ranks, then calls
   * mtopt__optimizer_finish_stats. mtopt_optimizer_step on such an optimizer
   * finishes its statistics locally. */
  int defer_stats;
  /* The order of the chunk table and of the library's buffers: a
   * permutation of the list's indices, or NULL for registration order. The
   * distributed layer makes each bucket a contiguous range of chunks with it.
   * Tensor indices (every accessor, the checkpoint) stay the list's.
   * Segments (core/segments.c) follow index order, not this one: the
   * distributed layer, whose chunk ranges in this order are its buckets,
   * also sets keep_tensors. */
  const int64_t *order;
  /* Stochastic rounding keys (plan.h, sr_tensor / sr_elem0) per tensor, or
   * NULL for (index, 0): ZeRO-1's pieces round as the tensors they are
   * part of, so that sharding does not change the bits. */
  const int32_t *sr_tensor;
  const int64_t *sr_elem0;
  /* The plan steps the tensors as they are, never merged into segments
   * (core/segments.c): the distributed layer runs chunk ranges that are its
   * buckets, and its builders set it. */
  int keep_tensors;
} mtopt__optimizer_options_t;

MTOPT__INTERNAL mtopt_status_t mtopt__optimizer_create(mtopt_context_t *ctx,
                                                       mtopt_tensor_list_t *list,
                                                       const mtopt_optimizer_config_t *config,
                                                       const mtopt__optimizer_options_t *options,
                                                       mtopt_optimizer_t **out);
MTOPT__INTERNAL mtopt_context_t *mtopt__optimizer_context(const mtopt_optimizer_t *opt);
/* The plan, as built at create (host copy of the struct; its pointers are
 * backend memory). */
MTOPT__INTERNAL const mtopt__plan_t *mtopt__optimizer_plan(const mtopt_optimizer_t *opt);
/* Tensor i's record (host copy; w, g, s0, s1 are backend addresses). */
MTOPT__INTERNAL const mtopt__tensor_rec_t *mtopt__optimizer_tensor(const mtopt_optimizer_t *opt,
                                                                   int64_t i);
/* One pass over chunks [c0, c1) of the step's plan (backend.h's run_pass):
 * the segment plan where tensors merge (core/segments.c), which the
 * distributed layer's optimizers never do, so their ranges are always of
 * mtopt__optimizer_plan's chunks. */
MTOPT__INTERNAL mtopt_status_t mtopt__optimizer_run_pass(mtopt_optimizer_t *opt,
                                                         mtopt__pass_t pass, int64_t c0,
                                                         int64_t c1, void *const *stream);
/* The deferred end of the statistics pass, in stream order, from
 * plan->stats_sum. */
MTOPT__INTERNAL mtopt_status_t mtopt__optimizer_finish_stats(mtopt_optimizer_t *opt);
/* After a step that failed part-way (a collective between passes): resets the
 * pass counter in stream order, so that later passes count from zero. */
MTOPT__INTERNAL mtopt_status_t mtopt__optimizer_reset_pass(mtopt_optimizer_t *opt);
/* Gives up the gradient buffer: destroy then leaves it allocated (for memory
 * that a collective which never finished may still write). */
MTOPT__INTERNAL void mtopt__optimizer_detach_grads(mtopt_optimizer_t *opt);

/* mtopt_optimizer_load with a say from other processes: after the file is
 * read and verified (nothing written yet), agree(arg, st, step) is called
 * exactly once with the local status and the file's step count (-1 on
 * failure; it is called then too, and may be collective), and returns the
 * status to go on with; the file is applied only if that is SUCCESS. fn
 * names the caller in messages. agree NULL: the plain load. */
typedef mtopt_status_t (*mtopt__agree_fn)(void *arg, mtopt_status_t local, int64_t step);
MTOPT__INTERNAL mtopt_status_t mtopt__optimizer_load_agreed(mtopt_optimizer_t *opt,
                                                            const char *fn, const char *path,
                                                            mtopt__agree_fn agree, void *arg);

/* Layout rule of the state slab and of every gradient buffer: a tensor's
 * state (and gradient view) has the same address residue mod 16 bytes as its
 * weights, so that one vector path covers w, g and state. Returns the padded
 * offset, in floats, for a tensor starting at or after `offset` whose
 * weights are at `w`. */
MTOPT__INTERNAL int64_t mtopt__aligned_offset(int64_t offset, const void *w);
/* The same rule for any element sizes: the byte offset at or after `off` for
 * an array of elsize-byte elements beside a parameter at `param` of
 * param_elsize-byte elements, such that both reach a 16-byte boundary at the
 * same element index. */
MTOPT__INTERNAL int64_t mtopt__place(int64_t off, int elsize, const void *param,
                                     int param_elsize);

#endif /* MTOPT_CORE_INTERNAL_API_H */

/* The core's private definitions: the objects' fields, for the files of
 * src/core only. Other layers use core/internal_api.h. Not installed. */
#ifndef MTOPT_CORE_H
#define MTOPT_CORE_H

#include <stddef.h>
#include <stdint.h>

#include "mtopt/mtopt.h"
#include "../backend/backend.h"
#include "../common/error.h"
#include "../common/dtype.h"
#include "../common/step_math.h"
#include "internal_api.h"

struct mtopt_context {
  mtopt_backend_t backend;
  int device;
  int num_threads;
  const mtopt__backend_ops_t *ops;
  void *backend_state;  /* e.g. the CUDA stream and launch facts */
  int64_t live_objects; /* tensor lists, optimizers, communicators not yet destroyed */
  char last_error[MTOPT__ERRLEN];
};

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
  mtopt__group_rec_t groups_host[MTOPT_MAX_GROUPS]; /* host mirror of plan.groups */
  mtopt__plan_t plan;        /* pointers into dev_tables */
  /* The plan every pass of a step runs over: &plan, or &segment_plan where
   * tensors merge into segments (core/segments.c). */
  const mtopt__plan_t *step_plan;
  mtopt__plan_t segment_plan; /* pointers into dev_segments */
  /* Its records with gaps, and of those the ones the kernels may read whole
   * (MTOPT__FLAG_WHOLE_GROUPS): planning facts for tests. */
  int64_t gap_segments, whole_segments;
  mtopt__tensor_rec_t *tensors_host;
  int64_t total_numel;
  int64_t state_bytes;
  int num_state; /* state buffers per tensor */
  /* Backend allocations, released on destroy. */
  void *dev_tables; /* tensors, chunks, groups, hyper, slots, stats_sum */
  void *dev_state;  /* the state slab: moments, momentum buffers, masters */
  void *dev_segments; /* the segment plan's tensors, chunks and slots, or NULL */
  /* The contiguous gradient buffers, one per gradient dtype (MTOPT__DT_*), or
   * NULL; their lengths in bytes. */
  void *dev_grads[MTOPT__NUM_DTYPES];
  int64_t grad_bytes[MTOPT__NUM_DTYPES];
  int all_f32; /* plan.all_f32, on the host */
};

#define MTOPT__ALIGN_UP(x, a) (((x) + (a) - 1) / (a) * (a))

/* Bytes of the library's buffers (core/layout.c). */
typedef struct {
  int64_t slab;
  int64_t grads[MTOPT__NUM_DTYPES];
} mtopt__layout_t;

/* Lays out the state slab and the gradient buffers for the list's tensors,
 * taken in `order` (a permutation of their indices; NULL: registration
 * order), the order of the chunk table. runs (MTOPT__RUNS_*): the optimizer
 * may step segments (core/segments.c), so runs of tensors that may form one
 * (with gaps: MTOPT__RUNS_GAPS) get
 * their state array by array; else every tensor's state lies side by side.
 * With slab/grads NULL it only counts (size); with them it also writes the
 * records' pointers, dtypes and keys into recs (whose first_chunk/num_chunks
 * are already set). */
MTOPT__HIDDEN void mtopt__layout(const mtopt_tensor_list_t *list,
                                 const mtopt_optimizer_config_t *c, int nstate,
                                 const int64_t *order, int runs, char *slab,
                                 char *const grads[MTOPT__NUM_DTYPES],
                                 mtopt__tensor_rec_t *recs, mtopt__layout_t *size);
/* The master mode of a tensor of this param dtype (F32 params: none). */
MTOPT__HIDDEN int mtopt__master_mode(const mtopt_optimizer_config_t *c,
                                     mtopt_dtype_t param_dtype);

/* The chunk table: tensors of numel[i] elements cut into chunks of at most
 * chunk_size, tensor order[0] first (NULL: index order). Writes first_chunk/num_chunks per tensor and the chunk records
 * (chunks may be NULL to only count). Returns the chunk count, or -1 if it
 * would overflow. Pure, so tests can plan tensors of 2^31+ elements without
 * allocating them. */
MTOPT__HIDDEN int64_t mtopt__chunk_table(const int64_t *numel, int64_t n,
                                         const int64_t *order, int64_t chunk_size,
                                         int64_t *first_chunk, int64_t *num_chunks,
                                         mtopt__chunk_rec_t *chunks);

/* As mtopt__chunk_table, with tensor i placed at element phase[i] (0 <=
 * phase < chunk_size; NULL: 0) of a grid of chunk_size cells: its first
 * chunk ends at the first cell boundary, the others lie on cells. */
MTOPT__HIDDEN int64_t mtopt__chunk_table_at(const int64_t *numel, int64_t n,
                                            const int64_t *order, const int64_t *phase,
                                            int64_t chunk_size, int64_t *first_chunk,
                                            int64_t *num_chunks, mtopt__chunk_rec_t *chunks);

/* Segments (core/segments.c, where the rule is): the records of the
 * segments of recs[0..n-1] into segs (NULL: only count), each the record of
 * its first tensor with the segment's span as numel (its tensors' elements
 * and the gaps between them), and the index of each one's first tensor into
 * first (NULL: not wanted); returns their count. Empty tensors are in none.
 * Pure, for the tests. */
#define MTOPT__SEGMENT_TENSOR_MAX 65536
/* The widest gap a segment spans between two of its tensors, in elements:
 * 512 bytes, the granule PyTorch's caching allocator rounds tensors to. */
#define MTOPT__SEGMENT_GAP_MAX 128
MTOPT__HIDDEN int64_t mtopt__segments(const mtopt__tensor_rec_t *recs, int64_t n, int gaps,
                                      mtopt__tensor_rec_t *segs, int64_t *first);
/* The rule, which the slab's layout (core/layout.c) follows too: t may be a
 * segment's member (non-empty, under MTOPT__SEGMENT_TENSOR_MAX elements,
 * every array F32, no masters), and t continues segment s (its first
 * tensor's record with the segment's span as numel) if it has s's group
 * and flags and starts the same gap (0 <= gap < MTOPT__SEGMENT_GAP_MAX
 * elements) after s's span in every array (NULL arrays stay NULL; where
 * both gradients are NULL the library's buffer mirrors the parameters),
 * and, if the gap is not 0, s starts on a 16-byte boundary of its
 * parameters; gaps 0 admits back to back tensors only (0 gaps). Returns
 * the gap, or -1 where t does not continue s. Gaps are admitted only among
 * small tensors (mtopt__small_tensors: MTOPT__RUNS_GAPS): a model of large
 * tensors gains nothing from merging its biases across gaps, and its large
 * tensors would then run the kernels built to read masks (GPT-2 XL 0.971
 * of a copy with them, 0.972 without: docs/perf_notes_gaps.md, v21, v22). */
#define MTOPT__RUNS_NONE 0
#define MTOPT__RUNS_BACK_TO_BACK 1
#define MTOPT__RUNS_GAPS 2
MTOPT__HIDDEN int mtopt__segment_member(const mtopt__tensor_rec_t *t);
MTOPT__HIDDEN int64_t mtopt__segment_gap(const mtopt__tensor_rec_t *s,
                                         const mtopt__tensor_rec_t *t, int gaps);
/* Sets opt->step_plan: the segment plan (its tables and statistics slots
 * allocated in dev_segments) where any tensors merge, else &opt->plan.
 * chunk_size: the config's (0: chosen for the segments as for tensors). Only
 * for plans whose layout had runs (mtopt__layout). */
MTOPT__HIDDEN mtopt_status_t mtopt__build_step_plan(mtopt_optimizer_t *opt, int64_t chunk_size,
                                                    int gaps);

/* Whether the non-empty tensors of numel[0..n-1] average under 4096 elements:
 * the many-small-tensors regime, where chunk_size 0 means 4096 and
 * segments may span gaps (core/chunk_table.c, core/segments.c). */
MTOPT__HIDDEN int mtopt__small_tensors(const int64_t *numel, int64_t n);
/* The chunk size of chunk_size 0 for tensors of numel[0..n-1] elements:
 * 65536, or 4096 where they are small (mtopt__small_tensors). */
MTOPT__HIDDEN int64_t mtopt__auto_chunk_size(const int64_t *numel, int64_t n);

/* The range checks of every scalar (core/hyperparams.c), shared by create,
 * the setters and load. */
MTOPT__HIDDEN mtopt_status_t mtopt__check_hyperparam(mtopt_context_t *ctx, const char *fn,
                                                     mtopt_hyperparam_t which, double x);
/* Load's checks of a block read from a checkpoint against this config: the
 * ranges and the setters' rules, the step counts, the growth tracker. */
MTOPT__HIDDEN mtopt_status_t mtopt__check_loaded_hyper(mtopt_context_t *ctx, const char *fn,
                                                       const mtopt_optimizer_config_t *c,
                                                       const mtopt__hyper_t *h);
/* Refuses a config struct made for a newer major version (its api_version). */
MTOPT__HIDDEN mtopt_status_t mtopt__check_api_version(mtopt_context_t *ctx, const char *fn,
                                                      uint32_t api_version);
/* The value checks of a config (struct size aside: mtopt__optimizer_config_read). */
MTOPT__HIDDEN mtopt_status_t mtopt__check_config(mtopt_context_t *ctx, const char *fn,
                                                 const mtopt_optimizer_config_t *c);
/* The rules of a group's multipliers (core/tensor_list.c), shared by the
 * list's and the optimizer's setters and load. */
MTOPT__HIDDEN mtopt_status_t mtopt__check_group(mtopt_context_t *ctx, const char *fn,
                                                int32_t group, float lr_mult, float wd_mult);
MTOPT__HIDDEN void mtopt__init_hyper(mtopt__hyper_t *h, const mtopt_optimizer_config_t *c);
MTOPT__HIDDEN mtopt_status_t mtopt__check_opt(const mtopt_optimizer_t *opt, const char *fn);
MTOPT__HIDDEN int mtopt__uses_loss_scale(const mtopt_optimizer_config_t *c);
MTOPT__HIDDEN int mtopt__is_adam_family(int kind);

/* Checkpoint files (core/checkpoint_file.c). The temporary of a save is
 * MTOPT__CKPT_TMP_PREFIX + 8 hex digits (the CRC-32 of the target's file name)
 * + "-" + 6 random characters, MTOPT__CKPT_TMP_LEN in all, in the target's
 * directory (dfd). */
#define MTOPT__CKPT_TMP_PREFIX ".mtopt-"
#define MTOPT__CKPT_TMP_LEN 22
/* Creates and locks a fresh temporary named tag_prefix + 6 characters into
 * name; the fd, or -1 with errno (name then ""). */
MTOPT__HIDDEN int mtopt__ckpt_create_temp(int dfd, const char *tag_prefix,
                                          char name[MTOPT__CKPT_TMP_LEN + 1]);
/* Removes temporaries of tag_prefix that no save holds locked. */
MTOPT__HIDDEN void mtopt__ckpt_remove_stale(int dfd, const char *tag_prefix);
/* Opens path's directory (*dfd) and finds its last component (*base);
 * refuses a target that exists and is not a regular file. */
MTOPT__HIDDEN mtopt_status_t mtopt__ckpt_open_target(mtopt_context_t *ctx, const char *fn,
                                                     const char *path, int *dfd,
                                                     const char **base);

#endif /* MTOPT_CORE_H */

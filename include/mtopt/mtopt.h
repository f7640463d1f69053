/*
 * mtopt: fused multi-tensor optimizer steps for C training loops.
 *
 * Core API. This header names no CUDA or MPI type: stream-taking calls live in
 * mtopt_cuda.h, the distributed layer in mtopt_dist.h.
 *
 * Model of use
 *   1. Create a context (backend CPU or CUDA).
 *   2. Describe the parameter tensors in a tensor list.
 *   3. Create an optimizer from the context, the list and a config. This packs
 *      every tensor into a chunk table once, allocates the optimizer state in
 *      one zeroed slab and (for tensors added without a gradient pointer) a
 *      contiguous gradient buffer. The list is frozen from then on.
 *   4. Each iteration: write gradients, call mtopt_optimizer_step(). One call
 *      steps every tensor, with one or a few launches and no host work per
 *      tensor.
 *
 * Errors: every call returns mtopt_status_t. Arguments are checked before
 * anything is written or enqueued; a failed call changes nothing. The detail of
 * the last failure is kept per context (mtopt_context_last_error) and per
 * calling thread (mtopt_last_error).
 *
 * Threads: a context and every object made from it may be used by one thread
 * at a time. Distinct contexts are independent.
 *
 * Memory: on the CUDA backend every tensor pointer (parameters, gradients) is a
 * device pointer, and pointers handed out by the library (state, gradient
 * views) are device pointers. On the CPU backend they are host pointers.
 */
#ifndef MTOPT_MTOPT_H
#define MTOPT_MTOPT_H

#include <stddef.h>
#include <stdint.h>

#include "mtopt/mtopt_version.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The public symbols: exported while the library itself is built (CMake
 * defines MTOPT_BUILDING for its objects), imported by its users on Windows;
 * elsewhere default visibility (the library is built with hidden visibility). */
#if defined(_WIN32)
#if defined(MTOPT_BUILDING)
#define MTOPT_API __declspec(dllexport)
#else
#define MTOPT_API __declspec(dllimport)
#endif
#else
#define MTOPT_API __attribute__((visibility("default")))
#endif

/* ---------------------------------------------------------------- status -- */

/* One list: it generates the enum, mtopt_status_name and mtopt_status_string. */
#define MTOPT_STATUS_LIST(X)                                                   \
  X(SUCCESS, 0, "success")                                                     \
  X(INVALID_ARGUMENT, 1, "invalid argument")                                   \
  X(INVALID_USAGE, 2, "invalid usage: call out of order or object in use")    \
  X(OUT_OF_MEMORY, 3, "out of memory")                                         \
  X(NOT_SUPPORTED, 4, "not supported by this build or backend")                \
  X(CUDA_ERROR, 5, "CUDA error")                                               \
  X(COMM_ERROR, 6, "communication error")                                      \
  X(IO_ERROR, 7, "I/O error")                                                  \
  X(INTERNAL, 8, "internal error")

typedef enum {
#define MTOPT_STATUS_ENUM_(name, code, text) MTOPT_STATUS_##name = code,
  MTOPT_STATUS_LIST(MTOPT_STATUS_ENUM_)
#undef MTOPT_STATUS_ENUM_
} mtopt_status_t;

/* "MTOPT_STATUS_INVALID_ARGUMENT" etc.; "MTOPT_STATUS_UNKNOWN" otherwise. */
MTOPT_API const char *mtopt_status_name(mtopt_status_t status);
/* A short human-readable sentence for the code. Never NULL. */
MTOPT_API const char *mtopt_status_string(mtopt_status_t status);

/* ---------------------------------------------------------------- version -- */

/* MTOPT_VERSION_CODE of the library that is linked (may differ from the
 * header's MTOPT_VERSION_CODE). The same major version keeps the ABI. */
MTOPT_API int mtopt_version(void);
MTOPT_API const char *mtopt_version_string(void);

/* ---------------------------------------------------------------- enums ---- */

typedef enum {
  MTOPT_BACKEND_CPU = 0,
  MTOPT_BACKEND_CUDA = 1,
} mtopt_backend_t;

/* Storage formats of parameters, gradients and optimizer state. The math is
 * fp32 whatever the storage. */
typedef enum {
  MTOPT_DTYPE_F32 = 0,
  MTOPT_DTYPE_F16 = 1, /* IEEE binary16 */
  MTOPT_DTYPE_BF16 = 2, /* bfloat16: the top half of an fp32 */
  /* Raw 16-bit words: only ever reported, for the remainders of
   * MTOPT_MASTER_REMAINDER (mtopt_optimizer_get_state_dtype). */
  MTOPT_DTYPE_U16 = 3
} mtopt_dtype_t;

/* Master weights of F16/BF16 parameters (mtopt_optimizer_config_t.master_weights).
 * F32 parameters never have one. */
typedef enum {
  /* The parameter is updated in place: read, computed in fp32, rounded on
   * write (config.rounding). */
  MTOPT_MASTER_NONE = 0,
  /* The optimizer keeps an fp32 copy of every F16/BF16 parameter (initialised
   * from the parameters at create); a step updates the copy and writes the
   * parameter rounded to nearest even. */
  MTOPT_MASTER_F32 = 1,
  /* BF16 parameters only: the optimizer keeps the low 16 bits of the fp32
   * master beside each parameter, so that parameter and remainder together are
   * the exact master (2 bytes instead of 4). The parameter is the master
   * rounded to nearest, ties away from zero (a tie's direction cannot be kept
   * in 16 bits otherwise). Masters equal MTOPT_MASTER_F32's bit for bit. */
  MTOPT_MASTER_REMAINDER = 2,
} mtopt_master_t;

/* How values written in low precision without a master are rounded:
 * parameters under MTOPT_MASTER_NONE and BF16 optimizer state. */
typedef enum {
  MTOPT_ROUNDING_NEAREST = 0, /* to nearest, ties to even */
  /* BF16: up or down with probability by distance, from a counter-based
   * generator keyed by (config.seed, step, tensor, element): no state, the
   * same bits on every backend and chunking, and a resumed run rounds as an
   * uninterrupted one. F16 values are always rounded to nearest. */
  MTOPT_ROUNDING_STOCHASTIC = 1,
} mtopt_rounding_t;

typedef enum {
  MTOPT_OPTIMIZER_ADAMW = 0, /* Adam with decoupled weight decay (torch AdamW) */
  MTOPT_OPTIMIZER_ADAM = 1,  /* Adam with L2 decay added to g (torch Adam) */
  MTOPT_OPTIMIZER_SGD = 2,   /* momentum, dampening, Nesterov (torch SGD) */
  MTOPT_OPTIMIZER_LAMB = 3,  /* NVIDIA's LAMB (apex FusedLAMB, decoupled) */
} mtopt_optimizer_kind_t;

/* Tensor flags (mtopt_tensor_desc_t.flags). */
#define MTOPT_TENSOR_NO_WEIGHT_DECAY 0x1u

/* Which optimizer state buffer (mtopt_optimizer_get_state). */
typedef enum {
  MTOPT_STATE_EXP_AVG = 0,    /* Adam/AdamW/LAMB first moment m */
  MTOPT_STATE_EXP_AVG_SQ = 1, /* Adam/AdamW/LAMB second moment v */
  MTOPT_STATE_MOMENTUM = 2,   /* SGD momentum buffer */
  MTOPT_STATE_MASTER = 3,     /* the fp32 master of an F16/BF16 parameter (with
                                 MTOPT_MASTER_F32: fp32; REMAINDER: the int16
                                 remainders, read_state gives the fp32 master) */
} mtopt_state_t;

/* Scalars settable between steps (mtopt_optimizer_set_hyperparam). */
typedef enum {
  MTOPT_HP_LR = 0,
  MTOPT_HP_BETA1 = 1,
  MTOPT_HP_BETA2 = 2,
  MTOPT_HP_EPS = 3,
  MTOPT_HP_WEIGHT_DECAY = 4,
  MTOPT_HP_MOMENTUM = 5,
  MTOPT_HP_DAMPENING = 6,
  MTOPT_HP_MAX_GRAD_NORM = 7, /* only when the optimizer was made with clipping */
  MTOPT_HP_LOSS_SCALE = 8,    /* only when made with loss scaling */
  MTOPT_HP_COUNT_ = 9
} mtopt_hyperparam_t;

/* --------------------------------------------------------------- context -- */

typedef struct mtopt_context mtopt_context_t;

typedef struct {
  size_t struct_size;   /* sizeof(mtopt_context_config_t) */
  uint32_t api_version; /* MTOPT_VERSION_CODE the caller was built with */
  mtopt_backend_t backend;
  int device;      /* CUDA device ordinal; ignored on the CPU */
  int num_threads; /* CPU worker threads; 0 = OpenMP's default */
} mtopt_context_config_t;

#define MTOPT_CONTEXT_CONFIG_INIT                                              \
  {sizeof(mtopt_context_config_t), MTOPT_VERSION_CODE, MTOPT_BACKEND_CPU, 0, 0}

/* Creates a context. On CUDA it selects the device and uses the legacy default
 * stream until mtopt_cuda_context_set_stream() names another, so steps are
 * ordered after the user's own default-stream work. On the CPU it starts the
 * OpenMP threads of num_threads, so that steps allocate nothing (if the
 * OpenMP runtime cannot make them, it ends the process, here).
 * Errors: INVALID_ARGUMENT (NULL out/config, bad struct_size, bad backend or
 * thread count), NOT_SUPPORTED (CUDA backend in a build without CUDA),
 * CUDA_ERROR (no such device, no driver), OUT_OF_MEMORY. */
MTOPT_API mtopt_status_t mtopt_context_create(const mtopt_context_config_t *config,
                                              mtopt_context_t **out);
/* Destroys a context. INVALID_USAGE while tensor lists or optimizers made from
 * it are alive (destroy them first). NULL is a no-op returning SUCCESS. */
MTOPT_API mtopt_status_t mtopt_context_destroy(mtopt_context_t *ctx);
/* Waits until all work the context enqueued has finished; CUDA errors raised by
 * that work are reported here. A no-op on the CPU (steps are synchronous). */
MTOPT_API mtopt_status_t mtopt_context_synchronize(mtopt_context_t *ctx);
MTOPT_API mtopt_status_t mtopt_context_get_backend(const mtopt_context_t *ctx,
                                                   mtopt_backend_t *out);
/* Whether a backend is compiled in and usable (CUDA: a device is present). */
MTOPT_API int mtopt_backend_available(mtopt_backend_t backend);

/* Detail of the last failed call on this context ("" if none). Valid until the
 * next failing call on the context. NULL ctx gives mtopt_last_error(). */
MTOPT_API const char *mtopt_context_last_error(const mtopt_context_t *ctx);
/* Detail of the last failed call made by the calling thread ("" if none). */
MTOPT_API const char *mtopt_last_error(void);

/* ----------------------------------------------------------- tensor list -- */

typedef struct mtopt_tensor_list mtopt_tensor_list_t;

typedef struct {
  size_t struct_size; /* sizeof(mtopt_tensor_desc_t) */
  void *param;        /* the weights: numel elements of param_dtype, in the
                         context's memory, aligned to the dtype's size */
  /* The gradient. NULL: the optimizer owns it, in its contiguous gradient
   * buffer (mtopt_optimizer_get_grad hands out the view). */
  void *grad;
  int64_t numel; /* element count, >= 0 (0: an empty tensor, allowed) */
  mtopt_dtype_t param_dtype;
  mtopt_dtype_t grad_dtype;
  uint32_t flags;   /* MTOPT_TENSOR_* */
  int32_t group;    /* parameter group, 0 <= group < MTOPT_MAX_GROUPS */
  const char *name; /* optional, copied; used in error messages */
} mtopt_tensor_desc_t;

#define MTOPT_TENSOR_DESC_INIT                                                 \
  {sizeof(mtopt_tensor_desc_t), NULL, NULL, 0, MTOPT_DTYPE_F32,               \
   MTOPT_DTYPE_F32, 0u, 0, NULL}

#define MTOPT_MAX_GROUPS 64

MTOPT_API mtopt_status_t mtopt_tensor_list_create(mtopt_context_t *ctx,
                                                  mtopt_tensor_list_t **out);
MTOPT_API mtopt_status_t mtopt_tensor_list_destroy(mtopt_tensor_list_t *list);
/* Appends a tensor; *index_out (may be NULL) receives its index, the order of
 * registration. The descriptor is copied. Overlap between tensors is checked
 * when the optimizer is created.
 * Errors: INVALID_ARGUMENT (NULL param with numel > 0, negative numel, a byte
 * size that overflows, bad group, an unknown dtype, a pointer not aligned to
 * its dtype's size), INVALID_USAGE (the list is frozen: an optimizer was built
 * from it). Whether the backend can step the dtypes is checked at create. */
MTOPT_API mtopt_status_t mtopt_tensor_list_add(mtopt_tensor_list_t *list,
                                               const mtopt_tensor_desc_t *desc,
                                               int64_t *index_out);
/* Shorthand for an F32 tensor in group 0. */
MTOPT_API mtopt_status_t mtopt_tensor_list_add_f32(mtopt_tensor_list_t *list,
                                                   float *param, float *grad,
                                                   int64_t numel, uint32_t flags,
                                                   int64_t *index_out);
/* Per-group multipliers of lr and weight decay (default 1, 1). */
MTOPT_API mtopt_status_t mtopt_tensor_list_set_group(mtopt_tensor_list_t *list,
                                                     int32_t group, float lr_mult,
                                                     float weight_decay_mult);
MTOPT_API mtopt_status_t mtopt_tensor_list_count(const mtopt_tensor_list_t *list,
                                                 int64_t *count);

/* -------------------------------------------------------------- optimizer -- */

typedef struct mtopt_optimizer mtopt_optimizer_t;

typedef struct {
  size_t struct_size;   /* sizeof(mtopt_optimizer_config_t) */
  uint32_t api_version; /* MTOPT_VERSION_CODE */
  mtopt_optimizer_kind_t kind;
  float lr;           /* >= 0 */
  float beta1, beta2; /* Adam/AdamW/LAMB, in [0, 1) */
  float eps;          /* > 0 */
  float weight_decay; /* >= 0 */
  float momentum;     /* SGD, >= 0 */
  float dampening;    /* SGD, in [0, 1] */
  int nesterov;       /* SGD; needs momentum > 0 and dampening == 0 */
  int bias_correction; /* LAMB only (Adam/AdamW always correct, as torch) */
  int lamb_always_adapt; /* LAMB: trust ratio on every tensor (NVLAMB); else
                            only where the effective weight decay is non-zero */
  /* Global-norm clipping of the (unscaled) gradient, torch clip_grad_norm_'s
   * formula; 0 disables it. */
  float max_grad_norm;
  /* Loss scaling (GradScaler semantics). loss_scale == 1 with no dynamic
   * scaling disables it. */
  float loss_scale;
  int dynamic_loss_scale;
  float growth_factor;     /* > 1 */
  float backoff_factor;    /* in (0, 1) */
  int32_t growth_interval; /* >= 1 */
  /* Check gradients for inf/NaN and skip the step if any. Implied by loss
   * scaling; with clipping, a non-finite norm always skips the step. */
  int skip_nonfinite;
  /* Elements per chunk, the unit of work: a multiple of 4 in [4, 2^30], or 0
   * (the default) for the library's choice, mtopt_optimizer_get_info reports
   * which: 65536, or 4096 where the non-empty tensors average under 4096 elements
   * (many small tensors: docs/optimizers.md). */
  int64_t chunk_size;
  /* Mixed precision (fields since 0.2; a smaller struct_size gets the
   * defaults). */
  mtopt_master_t master_weights; /* for F16/BF16 parameters */
  mtopt_dtype_t state_dtype;     /* m, v, momentum buffer: F32 or BF16 */
  mtopt_rounding_t rounding;     /* low-precision writes without a master */
  uint64_t seed;                 /* stochastic rounding's generator */
} mtopt_optimizer_config_t;

/* torch defaults: AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, wd=1e-2). */
#define MTOPT_OPTIMIZER_CONFIG_INIT                                            \
  {sizeof(mtopt_optimizer_config_t), MTOPT_VERSION_CODE, MTOPT_OPTIMIZER_ADAMW, \
   1e-3f, 0.9f, 0.999f, 1e-8f, 1e-2f, 0.0f, 0.0f, 0, 1, 0, 0.0f, 1.0f, 0,     \
   2.0f, 0.5f, 2000, 0, 0, MTOPT_MASTER_NONE, MTOPT_DTYPE_F32,             \
   MTOPT_ROUNDING_NEAREST, 0u}

/* Builds the optimizer: validates the config and every tensor (overlaps
 * between parameters and gradients are rejected), builds the chunk table, and
 * allocates the zeroed state slab, the gradient buffer for tensors added with
 * grad == NULL (zeroed), and the hyperparameter block, all in the context's
 * memory. Freezes the list. Cost O(n log n) in the tensor count, once.
 * Errors: INVALID_ARGUMENT (config out of range, overlapping tensors, list of
 * another context), INVALID_USAGE (the list already serves an optimizer),
 * NOT_SUPPORTED (a config of a newer major version), OUT_OF_MEMORY,
 * CUDA_ERROR. */
MTOPT_API mtopt_status_t mtopt_optimizer_create(mtopt_context_t *ctx,
                                                mtopt_tensor_list_t *list,
                                                const mtopt_optimizer_config_t *config,
                                                mtopt_optimizer_t **out);
/* Waits for the optimizer's steps in flight, then frees it whatever the wait
 * returned: a non-SUCCESS status (CUDA_ERROR) reports a failure of that earlier
 * work, and the handle is invalid either way. NULL is a no-op. */
MTOPT_API mtopt_status_t mtopt_optimizer_destroy(mtopt_optimizer_t *opt);

/* Applies one step to every tensor: (optionally) unscale, non-finite check,
 * global-norm clip, then the update. Host cost is O(1) in the tensor count.
 * CPU: runs to completion before returning. CUDA: enqueues one launch (two with
 * a statistics pass; LAMB one more) on the context's stream and returns at once;
 * it never synchronises. A step skipped for non-finite gradients leaves weights
 * and state bit-for-bit unchanged and does not advance the step count. */
MTOPT_API mtopt_status_t mtopt_optimizer_step(mtopt_optimizer_t *opt);

/* Writes a scalar for the following steps, in stream order on CUDA (safe while
 * earlier steps are in flight; a captured CUDA graph sees the new value).
 * INVALID_ARGUMENT for a value out of range or a scalar this optimizer was not
 * made to use. The range is checked on the float that is stored: a double
 * that rounds onto a bound (beta1 = 0.99999999 is 1.0f) or a non-zero one that
 * underflows to 0 (1e-46) is refused. A scalar of a feature made off at create
 * (clipping, loss scaling, SGD's momentum buffer) accepts only its neutral
 * value (0, 1, 0). */
MTOPT_API mtopt_status_t mtopt_optimizer_set_hyperparam(mtopt_optimizer_t *opt,
                                                        mtopt_hyperparam_t which,
                                                        double value);
MTOPT_API mtopt_status_t mtopt_optimizer_get_hyperparam(const mtopt_optimizer_t *opt,
                                                        mtopt_hyperparam_t which,
                                                        double *value);
MTOPT_API mtopt_status_t mtopt_optimizer_set_lr(mtopt_optimizer_t *opt, float lr);
/* A parameter group's multipliers of lr and weight decay (as
 * mtopt_tensor_list_set_group, which gives their values at create) for the
 * following steps, in stream order on CUDA like set_hyperparam: a captured
 * graph sees them. Checkpoints carry them. INVALID_ARGUMENT for a group out
 * of [0, MTOPT_MAX_GROUPS) or a multiplier not finite and >= 0. */
MTOPT_API mtopt_status_t mtopt_optimizer_set_group(mtopt_optimizer_t *opt, int32_t group,
                                                   float lr_mult, float weight_decay_mult);
MTOPT_API mtopt_status_t mtopt_optimizer_get_group(const mtopt_optimizer_t *opt,
                                                   int32_t group, float *lr_mult,
                                                   float *weight_decay_mult);
/* Sets the count of applied steps, in stream order: the next step is number
 * step + 1 (Adam's and LAMB's bias corrections and stochastic rounding's
 * generator read it). For resuming from state saved elsewhere (a torch
 * state_dict). INVALID_ARGUMENT outside [0, 2^62]. */
MTOPT_API mtopt_status_t mtopt_optimizer_set_step_count(mtopt_optimizer_t *opt, int64_t step);

/* What the steps so far left behind. On CUDA this synchronises the stream. */
typedef struct {
  size_t struct_size;    /* sizeof(mtopt_step_info_t), set by the caller */
  int64_t step;          /* steps applied (skipped ones not counted) */
  int64_t skipped_steps; /* steps skipped for non-finite gradients */
  int last_skipped;      /* 1 if the last step call was skipped */
  float last_grad_norm;  /* global norm of the unscaled gradient of the last
                            step (NaN when the optimizer takes no statistics) */
  float loss_scale;      /* the scale to multiply the next loss by */
  int32_t growth_tracker;
} mtopt_step_info_t;

#define MTOPT_STEP_INFO_INIT {sizeof(mtopt_step_info_t), 0, 0, 0, 0.0f, 1.0f, 0}

MTOPT_API mtopt_status_t mtopt_optimizer_get_step_info(mtopt_optimizer_t *opt,
                                                       mtopt_step_info_t *info);

/* A tensor's state buffer in the context's memory (numel elements of the
 * dtype mtopt_optimizer_get_state_dtype reports); owned by the optimizer.
 * INVALID_ARGUMENT for a buffer this optimizer does not keep for the tensor. */
MTOPT_API mtopt_status_t mtopt_optimizer_get_state(mtopt_optimizer_t *opt,
                                                   int64_t tensor,
                                                   mtopt_state_t which, void **ptr);
/* The storage dtype of a tensor's state buffer: config.state_dtype for the
 * moments and the momentum buffer; for MTOPT_STATE_MASTER, MTOPT_DTYPE_F32
 * (MTOPT_MASTER_F32) or MTOPT_DTYPE_U16 (the remainders). */
MTOPT_API mtopt_status_t mtopt_optimizer_get_state_dtype(const mtopt_optimizer_t *opt,
                                                         int64_t tensor,
                                                         mtopt_state_t which,
                                                         mtopt_dtype_t *dtype);
/* Copies a tensor's state buffer into host memory as numel floats, whatever
 * its storage (MTOPT_STATE_MASTER with remainders: the fp32 masters). CUDA:
 * waits for the stream. */
MTOPT_API mtopt_status_t mtopt_optimizer_read_state(mtopt_optimizer_t *opt,
                                                    int64_t tensor,
                                                    mtopt_state_t which,
                                                    float *host_dst);
/* The inverse of read_state: writes a tensor's state buffer from numel host
 * floats, each rounded to nearest (even) into the storage dtype. For
 * MTOPT_STATE_MASTER the parameter is rewritten too, as the master rounded to
 * nearest, as a step leaves it (with remainders the pair then holds the
 * master exactly). CUDA: waits for the stream, then copies. INVALID_ARGUMENT for NULL, a buffer the tensor lacks,
 * a value that is not finite or an EXP_AVG_SQ value < 0, or one beyond the
 * storage dtype's range; then nothing is written. */
MTOPT_API mtopt_status_t mtopt_optimizer_write_state(mtopt_optimizer_t *opt, int64_t tensor,
                                                     mtopt_state_t which,
                                                     const float *host_src);
/* The gradient a tensor's step reads: the user's pointer, or the view into the
 * optimizer's contiguous buffer for tensors added with grad == NULL. */
MTOPT_API mtopt_status_t mtopt_optimizer_get_grad(mtopt_optimizer_t *opt,
                                                  int64_t tensor, void **ptr);
/* The contiguous gradient buffer (NULL and 0 when no tensor uses it). Each
 * view has its parameter's address residue mod 16 bytes (so it is 16-byte
 * aligned exactly when the parameter is); the length counts that padding, at
 * most 3 elements per tensor, and where runs of small tensors lie pooled
 * with gaps (docs/optimizers.md, "Segments") the parameters' gaps, under
 * 128 elements per tensor. */
MTOPT_API mtopt_status_t mtopt_optimizer_get_grad_buffer(mtopt_optimizer_t *opt,
                                                         void **ptr,
                                                         int64_t *numel);
/* The library owns one contiguous gradient buffer per gradient dtype (views in
 * registration order); numel counts elements of that dtype. With gradients of
 * several dtypes, mtopt_optimizer_get_grad_buffer is INVALID_USAGE: use this. */
MTOPT_API mtopt_status_t mtopt_optimizer_get_grad_buffer_dtype(mtopt_optimizer_t *opt,
                                                               mtopt_dtype_t dtype,
                                                               void **ptr, int64_t *numel);
/* Zeroes every gradient the step reads: the contiguous gradient buffer and
 * each gradient the user registered with its own pointer (stream-ordered on
 * CUDA; one operation for the buffer, one per user gradient). */
MTOPT_API mtopt_status_t mtopt_optimizer_zero_grad(mtopt_optimizer_t *opt);

/* Checkpoints. save writes the parameters (in their dtypes), master weights or
 * remainders, every state buffer (in the state dtype) and the step scalars
 * (step count, loss scale and its growth tracker, skipped steps, the
 * hyperparameters, the groups' multipliers, the stochastic-rounding seed) and
 * the optimizer's features
 * (loss scaling static or dynamic, clipping, skip_nonfinite) to `path`: a
 * versioned (format 4), CRC-32-checksummed little-endian file. It is written
 * to a temporary file in the same directory, named ".mtopt-" + 8 hex digits
 * (the CRC-32 of the target's file name) + "-" + 6 characters of [A-Za-z0-9],
 * then fsynced, renamed onto `path`, and the directory fsynced, so an
 * existing checkpoint is replaced only by a complete one and the new one
 * survives a power loss. A failing save removes its temporary; a successful
 * one also removes the temporaries of the same target that no save holds
 * (each save holds an flock on its own), i.e. those of killed saves. The
 * target must be a regular file or not exist: a symbolic link (even to a
 * regular file), a directory, a device or a FIFO is refused with
 * INVALID_ARGUMENT and left alone. The new file has mode 0666 & ~umask, as
 * fopen's; it is a new file, so the old one's mode and owner are not kept.
 * Any name the system accepts for the target works (the temporary's name has
 * a fixed length of 22). CUDA: waits for the stream. Errors:
 * INVALID_ARGUMENT (NULL, a target that is not a regular file, a path ending
 * in '/'), IO_ERROR (with the system's reason; a failing directory fsync is
 * IO_ERROR though the new checkpoint is then in place), OUT_OF_MEMORY.
 * load restores all of it into an optimizer built from the same tensor list
 * shape (same kind, tensor count, sizes, parameter dtypes, master weights,
 * state dtype and rounding) and the same features; files of formats 1 (the
 * fp32-only 0.1, into fp32 optimizers), 2 and 3 (0.2) load too (they record
 * no group multipliers: the optimizer keeps its own); formats 1 and 2 record
 * no features, so what their scalars imply is checked (a loss scale != 1 needs
 * loss scaling, max_grad_norm != 0 clipping, a growth tracker != 0 a dynamic
 * scale). The file is read and verified completely before anything is
 * written, and integrity first: a file shorter than a header or failing its
 * checksum is IO_ERROR whatever its fields say; only then are they judged.
 * The scalars must pass the checks of create and the setters (as floats:
 * lr, betas, eps, ...; a scalar of a feature the optimizer lacks must be its
 * neutral value), step and skipped_steps in [0, 2^62], reserved fields 0. A
 * missing, truncated, corrupt or mismatched file changes nothing. Errors:
 * IO_ERROR (unreadable, truncated, bad checksum, not a checkpoint),
 * INVALID_ARGUMENT (saved by a different optimizer or with other features,
 * a scalar out of range), NOT_SUPPORTED (a newer format), OUT_OF_MEMORY. */
MTOPT_API mtopt_status_t mtopt_optimizer_save(mtopt_optimizer_t *opt, const char *path);
MTOPT_API mtopt_status_t mtopt_optimizer_load(mtopt_optimizer_t *opt, const char *path);

/* Planning facts, for tests and tools. */
typedef struct {
  size_t struct_size;
  int64_t num_tensors;
  int64_t num_chunks;
  int64_t chunk_size; /* in use: the library's choice for a config's 0 */
  int64_t total_numel;
  int64_t state_bytes;
  int launches_per_step;
  int bytes_per_param; /* memory traffic of one step, fp32, counted in docs/ */
  /* Tensor records the statistics and update passes step: num_tensors, or
   * fewer where runs of small tensors that lie back to back or pooled with
   * small gaps step as one
   * (docs/optimizers.md, "Segments"). Since 0.4. */
  int64_t update_tensors;
} mtopt_optimizer_info_t;

#define MTOPT_OPTIMIZER_INFO_INIT {sizeof(mtopt_optimizer_info_t), 0, 0, 0, 0, 0, 0, 0, 0}

MTOPT_API mtopt_status_t mtopt_optimizer_get_info(const mtopt_optimizer_t *opt,
                                                  mtopt_optimizer_info_t *info);

#ifdef __cplusplus
}
#endif

#endif /* MTOPT_MTOPT_H */

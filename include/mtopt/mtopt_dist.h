/*
 * mtopt distributed data parallel: gradient all-reduce (or ZeRO-1
 * reduce-scatter / all-gather) fused with the optimizer step, bucket by bucket.
 *
 * Needs a build with MPI (MTOPT_HAVE_MPI; CMake option MTOPT_WITH_MPI). GPU
 * collectives need NCCL (MTOPT_HAVE_NCCL; MTOPT_WITH_NCCL). This header names
 * MPI_Comm but no CUDA or NCCL type: an existing NCCL communicator is passed
 * as a void * (see mtopt_comm_create_nccl).
 *
 * The library never calls MPI_Init or MPI_Finalize: initialise MPI first
 * (MPI_Init_thread with at least MPI_THREAD_FUNNELED if other threads exist)
 * and finalise it after destroying every communicator.
 *
 * Model of use (every rank runs the same calls in the same order):
 *   1. mtopt_comm_local_rank(MPI_COMM_WORLD, &local) and, on CUDA, create the
 *      context on device `local` (or on the one device CUDA_VISIBLE_DEVICES
 *      leaves each rank).
 *   2. mtopt_comm_create_mpi(ctx, MPI_COMM_WORLD, &cfg, &comm).
 *   3. Describe the tensors with grad == NULL (the library owns the gradient
 *      buffers, so that buckets are contiguous), in any dtypes the backend
 *      steps (mtopt.h: F32, F16, BF16 parameters and gradients, masters or
 *      remainders, F32 or BF16 state, any mix), and call
 *      mtopt_dist_optimizer_create(comm, list, &opt_cfg, &dopt).
 *   4. Each iteration: zero the gradients (mtopt_dist_optimizer_zero_grad),
 *      run backward writing into the views of mtopt_dist_optimizer_get_grad;
 *      optionally call mtopt_dist_bucket_ready(dopt, b) as soon as bucket b's
 *      gradients are written (backward produces the last tensors first, and
 *      bucket 0 holds the last tensors), then mtopt_dist_step(dopt).
 *
 * Buckets. A bucket holds tensors of one class: one gradient dtype and one
 * parameter dtype (a collective reduces one dtype, and ZeRO-1 all-gathers
 * one parameter size). Each class's tensors are taken in reverse
 * registration order (the order backward produces gradients) and grouped:
 * the class's first bucket holds about first_bucket_bytes of gradient, the
 * others about bucket_bytes (a bucket is closed once it reaches the size; a
 * tensor is never split). Buckets are then numbered in the order backward
 * completes them: by their lowest tensor index, highest first. In a table of
 * one class (every tensor F32, or every one BF16) that is the plain reverse
 * grouping. A bucket is a contiguous range of the gradient buffer of its
 * dtype covering whole tensors, so that its step is a contiguous range of the
 * chunk table (the inner optimizer orders its chunks bucket by bucket). Each
 * bucket's reduction starts as soon as it is marked ready and every
 * lower-numbered bucket has started (collectives must be issued in the same
 * order on every rank, so bucket b waits for b-1).
 *
 * Reduction in 16 bits. BF16 and F16 buckets are reduced in their dtype, half
 * the bytes of F32: NCCL with ncclAvg (each rank's value times 1/world, then
 * summed); MPI, which has no 16-bit float, as 16-bit words under a sum that
 * adds in float and rounds to nearest even after each addition, then the sum
 * times (float)(1 / world), rounded (F16: each rank's values times
 * (float)(1 / world), rounded, before the sum, as ncclAvg: a sum of ranks'
 * finite loss-scaled F16 gradients can overflow where their mean does not).
 * Rounding the sum at every addition costs about log2(world) bf16 ulps
 * against a sum in fp32. Where that matters, set reduce_f32 in the
 * communicator's config: each 16-bit bucket is then widened to fp32 (exact),
 * reduced and averaged in fp32 as an F32 bucket is, and stepped from the
 * fp32 average; or register F32 gradients for those tensors (any parameter
 * dtype; backward then accumulates in fp32 too). The statistics (global
 * norm, non-finite count) are taken from the averaged gradient the step
 * reads (in its dtype, or fp32 with reduce_f32), the same on every rank, so
 * clipping, skipping and the dynamic loss scale agree everywhere.
 *
 * The epilogue. zero_stage 0: each bucket is all-reduced and averaged (sum,
 * then times 1/world); without clipping, loss scaling or skip_nonfinite, its
 * update runs as soon as its reduction lands, overlapping the following
 * buckets' communication. With them, each bucket's statistics pass runs as it
 * lands and the update follows the last bucket. LAMB's second pass (apply the
 * trust ratio) runs over all tensors after the last bucket.
 * zero_stage 1: each bucket is reduce-scattered (each rank receives the
 * averaged gradient of its 1/world slice), each rank steps only the parameters
 * of its slices (it keeps optimizer state for about 1/world of the elements),
 * then the weights are all-gathered in the parameters' dtype (16-bit weights:
 * half the bytes of F32). Each rank keeps the master weights (or remainders)
 * and the state of its slices only. Without statistics, each bucket's
 * all-gather starts as soon as its update is enqueued (CPU: done), so it
 * overlaps the next buckets' reductions and updates; with them (clipping,
 * loss scaling, skip_nonfinite: the global norm is the all-reduced sum of the
 * ranks' partial sums, so no update can start before every reduction has
 * landed), the updates run bucket by bucket after the statistics, each
 * bucket's all-gather behind its update. Stochastic rounding draws as one
 * process would (keyed on the tensor as registered and the element within
 * it), so ZeRO-1 rounds to the same bits at any world size. LAMB is
 * NOT_SUPPORTED with ZeRO-1: its trust ratio needs each tensor's weight and
 * update norms between its two passes, and a tensor's elements are spread
 * over ranks, so every step would need one more all-reduce of two sums per
 * tensor between the passes (not built; use zero_stage 0).
 *
 * Faults. Every collective is checked; one that fails or does not finish
 * within timeout_ms returns COMM_ERROR with the MPI or NCCL text, and the
 * optimizer is then unusable (every later call returns COMM_ERROR; destroy it).
 * Weights are left unchanged by a failed step when the step takes statistics
 * (clipping, loss scaling, skip_nonfinite: updates wait for the last bucket)
 * or when no reduction completed; without statistics, buckets whose reduction
 * landed before the failure have been stepped (the price of the overlap: set
 * skip_nonfinite = 1 to make a step all-or-nothing). A rank whose bucket plan
 * differs from the others' is reported at set-up, on every rank. After the
 * first failure nothing waits again: the calls that follow, destroy included,
 * return within one timeout in total; destroy leaks the buffers of
 * collectives that never finished and returns COMM_ERROR. A rank late beyond
 * the timeout may still complete the step its peers abandoned: treat
 * COMM_ERROR on any rank as fatal for the job (docs/distributed.md,
 * "Failures").
 *
 * Segments. With zero_stage 0, a bucket of at least twice its size (it holds
 * a large tensor, e.g. an embedding) is reduced in floor(bucket / size)
 * collectives of about equal size, cut at chunk boundaries, each stepped as
 * soon as it lands; so the step left after the last collective is small. For
 * this the size counts as at least 256 chunks (64 MB at 65536-element
 * chunks), so that each segment's step still fills a GPU.
 *
 * CUDA with NCCL: collectives run on a communication stream of the
 * communicator, ordered after the context's stream with events; the bucket
 * steps run on a stream of the communicator too (ordered after the context's
 * stream at the start of mtopt_dist_step), and the context's stream waits for
 * them before the step's remaining passes, so it is ordered after the whole
 * step; mtopt_dist_step never synchronises. A hang or asynchronous NCCL error
 * is detected by mtopt_dist_synchronize (and destroy), which waits at most
 * timeout_ms and aborts the NCCL communicator on expiry.
 *
 * SM partition (CUDA). Overlapped with a bucket step, which streams at full
 * memory bandwidth from every SM, NCCL's kernels slow down sharply when they
 * share SMs with it (GPT-2 XL on 2 H200s: the overlap hid almost nothing).
 * So by default, with 2 or more ranks, the communicator splits the device's
 * SMs with CUDA green contexts: the collectives run on comm_sm_count SMs (and
 * a communicator it creates asks NCCL 2.17+ for that many CTAs, at most 32), the
 * bucket steps on the rest. A bandwidth-bound step loses little on the
 * smaller share. Work the caller enqueues elsewhere is not confined.
 *
 * Threads: as for the core API, one thread at a time per object.
 */
#ifndef MTOPT_MTOPT_DIST_H
#define MTOPT_MTOPT_DIST_H

#include <mpi.h>

#include "mtopt/mtopt.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mtopt_comm mtopt_comm_t;
typedef struct mtopt_dist_optimizer mtopt_dist_optimizer_t;

typedef struct {
  size_t struct_size;        /* sizeof(mtopt_comm_config_t) */
  uint32_t api_version;      /* MTOPT_VERSION_CODE */
  size_t bucket_bytes;       /* gradient bytes per bucket, > 0 (25 MiB) */
  size_t first_bucket_bytes; /* the first bucket's, > 0 (1 MiB): communication
                                starts early in backward */
  int timeout_ms;            /* a collective not done by then fails with
                                COMM_ERROR; 0 waits forever (300000) */
  int zero_stage;            /* 0: all-reduce; 1: ZeRO-1 (sharded state) */
  /* CUDA: multiprocessors kept for the collectives while buckets are stepped
   * (see "SM partition" above). 0: automatic (MTOPT_COMM_AUTO_SMS where there
   * are 2 or more ranks, the device has at least 3 times as many SMs and the
   * driver has green contexts; else none); -1: none, the collectives and the
   * steps share every SM; > 0: that many (also at one rank), rounded up to
   * the device's granularity; mtopt_comm_create_* then return NOT_SUPPORTED
   * where the driver has no green contexts, INVALID_ARGUMENT where no SM is
   * left for the steps, CUDA_ERROR if the split fails. Ignored on the CPU. */
  int comm_sm_count;
  /* 16-bit gradient buckets (BF16, F16; see "Reduction in 16 bits" above).
   * 0: reduced in their dtype; 1: each bucket is widened (exactly) into an
   * fp32 buffer of the library's and reduced (averaged) in fp32, and the
   * optimizer steps on the fp32 average (statistics too): backward still
   * writes 16-bit gradients into the views of mtopt_dist_optimizer_get_grad,
   * which then keep this rank's gradients through the step (zero_stage 0
   * without it: the 16-bit average). Costs 4 bytes of fp32 buffer per 16-bit
   * gradient element (grad_bytes of mtopt_dist_memory_t; with ZeRO-1 the
   * reduced slice is fp32 too, shard_bytes) and twice the bytes on the wire.
   * F32 buckets are reduced in fp32 either way. Other values:
   * INVALID_ARGUMENT. A struct_size that ends before this field gets 0. */
  int reduce_f32;
} mtopt_comm_config_t;

/* The automatic SM partition's share for the collectives: on 2 H200s (132
 * SMs), NCCL with 32 CTAs on 32 SMs ran the bucket all-reduce as fast as with
 * its default channels on all SMs. */
#define MTOPT_COMM_AUTO_SMS 32

#define MTOPT_COMM_CONFIG_INIT                                                 \
  {sizeof(mtopt_comm_config_t), MTOPT_VERSION_CODE, (size_t)25 << 20,          \
   (size_t)1 << 20, 300000, 0, 0, 0}

/* The rank of the calling process among the ranks of `comm` that share its
 * node (MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)): the CUDA device a rank
 * should use when every rank sees all the node's GPUs. Collective over comm.
 * Errors: INVALID_ARGUMENT (NULL out, MPI not initialised), COMM_ERROR. */
MTOPT_API mtopt_status_t mtopt_comm_local_rank(MPI_Comm comm, int *local_rank);

/* Creates a communicator over the ranks of `comm` (duplicated: the library's
 * collectives never mix with the caller's). Collective over comm.
 * CPU context: MPI's non-blocking collectives. CUDA context: NCCL; rank 0
 * makes the unique id and broadcasts it over comm, and the NCCL communicator
 * uses the context's device (which should be the node-local rank, see
 * mtopt_comm_local_rank). config may be NULL for the defaults.
 * Errors: INVALID_ARGUMENT (NULL ctx/out, bad config, MPI not initialised),
 * NOT_SUPPORTED (CUDA context in a build without NCCL), COMM_ERROR. */
MTOPT_API mtopt_status_t mtopt_comm_create_mpi(mtopt_context_t *ctx, MPI_Comm comm,
                                               const mtopt_comm_config_t *config,
                                               mtopt_comm_t **out);

/* Wraps an existing NCCL communicator, passed as a void * holding the
 * ncclComm_t (the header stays free of NCCL types). The caller keeps ownership
 * and destroys it after mtopt_comm_destroy. Needs a CUDA context on the
 * communicator's device. Errors: INVALID_ARGUMENT, NOT_SUPPORTED (build
 * without NCCL, or a CPU context), COMM_ERROR. */
MTOPT_API mtopt_status_t mtopt_comm_create_nccl(mtopt_context_t *ctx, void *nccl_comm,
                                                const mtopt_comm_config_t *config,
                                                mtopt_comm_t **out);

/* INVALID_USAGE while distributed optimizers made from it are alive. NULL is a
 * no-op. Local (not collective). */
MTOPT_API mtopt_status_t mtopt_comm_destroy(mtopt_comm_t *comm);
MTOPT_API mtopt_status_t mtopt_comm_get_rank(const mtopt_comm_t *comm, int *rank);
MTOPT_API mtopt_status_t mtopt_comm_get_size(const mtopt_comm_t *comm, int *size);
/* The SM partition in force: the SMs of the collectives and of the bucket
 * steps; both 0 where there is none (CPU, comm_sm_count -1, or the automatic
 * choice with one rank, a small device or no green contexts). Local.
 * Errors: INVALID_ARGUMENT (NULL argument). */
MTOPT_API mtopt_status_t mtopt_comm_get_sm_split(const mtopt_comm_t *comm, int *comm_sms,
                                                 int *step_sms);

/* Builds the data-parallel optimizer: the inner optimizer (over every tensor
 * with zero_stage 0, over this rank's slices with zero_stage 1), the gradient
 * buffer and the bucket plan, then checks that every rank built the same plan.
 * Every tensor of the list must have been added with grad == NULL. Collective
 * over the communicator. Freezes the list.
 * Errors: INVALID_ARGUMENT (a tensor with its own gradient, bad config, plan
 * differs between ranks: every rank returns it, and the message names the first
 * difference), NOT_SUPPORTED (LAMB with zero_stage 1; dtypes the backend does
 * not step), OUT_OF_MEMORY,
 * COMM_ERROR (a rank did not join within timeout_ms), as
 * mtopt_optimizer_create otherwise. */
MTOPT_API mtopt_status_t mtopt_dist_optimizer_create(mtopt_comm_t *comm,
                                                     mtopt_tensor_list_t *list,
                                                     const mtopt_optimizer_config_t *config,
                                                     mtopt_dist_optimizer_t **out);

MTOPT_API mtopt_status_t mtopt_dist_optimizer_destroy(mtopt_dist_optimizer_t *dopt);

/* The inner optimizer, owned by dopt: use it for hyperparameters
 * (mtopt_optimizer_set_lr ...), step info and, with zero_stage 0, state and
 * gradient views (it indexes the list's tensors; with reduce_f32 the views
 * of 16-bit gradients are the fp32 averages the step reads, F32). With
 * zero_stage 1 its tensors are this rank's pieces, not the list's. Never call
 * mtopt_optimizer_step on it: step with mtopt_dist_step. */
MTOPT_API mtopt_status_t mtopt_dist_optimizer_get_optimizer(mtopt_dist_optimizer_t *dopt,
                                                            mtopt_optimizer_t **opt);
/* A list tensor's gradient view (numel elements of its grad_dtype in the
 * context's memory), for both stages. */
MTOPT_API mtopt_status_t mtopt_dist_optimizer_get_grad(mtopt_dist_optimizer_t *dopt,
                                                       int64_t tensor, void **ptr);
/* The whole gradient buffer of one dtype (the offsets of that dtype's
 * buckets index it; NULL and 0 where no tensor has gradients of it). With
 * zero_stage 1 it is also the all-gather staging area: after mtopt_dist_step
 * its contents are undefined, so zero it before accumulating the next
 * gradients. Errors: INVALID_ARGUMENT (NULL pointer, not F32/F16/BF16). */
MTOPT_API mtopt_status_t mtopt_dist_optimizer_get_grad_buffer_dtype(mtopt_dist_optimizer_t *dopt,
                                                                    mtopt_dtype_t dtype,
                                                                    void **ptr, int64_t *numel);
/* The same where the gradients have one dtype; INVALID_USAGE where they
 * have several (use _dtype). */
MTOPT_API mtopt_status_t mtopt_dist_optimizer_get_grad_buffer(mtopt_dist_optimizer_t *dopt,
                                                              void **ptr, int64_t *numel);
MTOPT_API mtopt_status_t mtopt_dist_optimizer_zero_grad(mtopt_dist_optimizer_t *dopt);

/* The bucket plan. Bucket b holds the tensors of its class (see "Buckets")
 * among list tensors [first_tensor, first_tensor + num_tensors)
 * (registration indices; bucket 0 holds the last tensors) and covers
 * elements [offset, offset + numel) of the gradient buffer of its gradient
 * dtype (numel counts alignment padding, and with zero_stage 1 the padding
 * that makes it a multiple of 8 times the world size). */
MTOPT_API mtopt_status_t mtopt_dist_get_bucket_count(const mtopt_dist_optimizer_t *dopt,
                                                     int *count);
MTOPT_API mtopt_status_t mtopt_dist_get_bucket(const mtopt_dist_optimizer_t *dopt, int bucket,
                                               int64_t *first_tensor, int64_t *num_tensors,
                                               int64_t *offset, int64_t *numel);
/* Bucket b's class: the dtypes of its tensors' gradients and parameters
 * (either pointer may be NULL). */
MTOPT_API mtopt_status_t mtopt_dist_get_bucket_dtype(const mtopt_dist_optimizer_t *dopt,
                                                     int bucket, mtopt_dtype_t *grad_dtype,
                                                     mtopt_dtype_t *param_dtype);
/* The bucket holding a list tensor. */
MTOPT_API mtopt_status_t mtopt_dist_get_tensor_bucket(const mtopt_dist_optimizer_t *dopt,
                                                      int64_t tensor, int *bucket);

/* Marks bucket b's gradients written on every rank's side: its reduction
 * starts once buckets 0..b-1 have started. CPU: also completes and steps the
 * buckets whose reductions have landed (never blocks). CUDA: enqueues the
 * collective after the work already on the context's stream.
 * Errors: INVALID_ARGUMENT (bad index), INVALID_USAGE (bucket already marked
 * in this step), COMM_ERROR. */
MTOPT_API mtopt_status_t mtopt_dist_bucket_ready(mtopt_dist_optimizer_t *dopt, int bucket);

/* Marks the remaining buckets, completes every reduction (CPU: waits, at most
 * timeout_ms per collective, and stops at the first that fails), steps, and (zero_stage 1) all-gathers the
 * weights. Collective. CPU: returns when the step is done. CUDA: enqueues and
 * returns; the context's stream is ordered after the whole step. */
MTOPT_API mtopt_status_t mtopt_dist_step(mtopt_dist_optimizer_t *dopt);

/* Waits for the communication and the step (CUDA), at most timeout_ms, and
 * reports asynchronous NCCL errors. A no-op on the CPU. */
MTOPT_API mtopt_status_t mtopt_dist_synchronize(mtopt_dist_optimizer_t *dopt);

/* Checkpoints (the core's format, mtopt_optimizer_save). zero_stage 0: every
 * rank holds the same state; rank 0 writes `path`, and a load reads `path`
 * on every rank (a file system every rank sees). zero_stage 1: each rank
 * writes its shard (its slices' weights, masters and state, the step
 * scalars) to "<path>.rank<r>-of-<world>", and a load, on the same world
 * size, bucket sizes and tensors, reads each rank's own file, then
 * all-gathers the weights. Collective, between steps (after
 * mtopt_dist_synchronize on CUDA for save to see the last step). Every rank
 * returns the same verdict: a rank whose own call failed returns its error,
 * the others the same status naming that rank. Load writes nothing on any
 * rank unless every rank's file verified (checksum, layout, scalars) and all
 * are of the same step. A save that fails on some rank leaves an incomplete
 * set (each file is written atomically, but not the set): keep the previous
 * checkpoint under another path until save returns SUCCESS.
 * Errors: INVALID_ARGUMENT (NULL argument; a file of another layout or of
 * another step than its peers), IO_ERROR, NOT_SUPPORTED, OUT_OF_MEMORY, as
 * mtopt_optimizer_save / _load; COMM_ERROR. */
MTOPT_API mtopt_status_t mtopt_dist_optimizer_save(mtopt_dist_optimizer_t *dopt, const char *path);
MTOPT_API mtopt_status_t mtopt_dist_optimizer_load(mtopt_dist_optimizer_t *dopt, const char *path);

/* Memory a distributed optimizer owns on this rank, in bytes, for the model
 * of `params` elements: the inner optimizer's state and master weights (with
 * ZeRO-1 about 1/world of plain data parallel's), the gradient buffers (with
 * reduce_f32 also the fp32 buffers the 16-bit buckets are widened into), and
 * (ZeRO-1) the shard of reduced gradients (fp32 slices for widened buckets)
 * and the staging of weights wider than their gradients. Local. Errors:
 * INVALID_ARGUMENT (NULL, or a struct_size too small). */
typedef struct {
  size_t struct_size;  /* sizeof(mtopt_dist_memory_t) */
  int64_t params;      /* elements of the list's tensors */
  int64_t state_bytes; /* moments (or momentum buffers) and master weights */
  int64_t grad_bytes;  /* the gradient buffers (reduce_f32: and their fp32 copies) */
  int64_t shard_bytes; /* ZeRO-1: reduced slices and wide staging */
} mtopt_dist_memory_t;

#define MTOPT_DIST_MEMORY_INIT {sizeof(mtopt_dist_memory_t), 0, 0, 0, 0}

MTOPT_API mtopt_status_t mtopt_dist_optimizer_get_memory(const mtopt_dist_optimizer_t *dopt,
                                                         mtopt_dist_memory_t *mem);

#ifdef __cplusplus
}
#endif

#endif /* MTOPT_MTOPT_DIST_H */

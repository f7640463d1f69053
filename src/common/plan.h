/*
 * The plan: what a step reads, built once when the optimizer is created and
 * handed to the backends as it is (the CUDA kernels take it by value). Both
 * compilers read this file (gcc for the core and the CPU backend, nvcc for
 * the kernels); it names no CUDA or MPI type.
 *
 * Words: the chunk table is the list of chunk records (core/chunk_table.c);
 * the plan is this struct, which points at the chunk table, the tensor
 * records, the group records, the hyperparameter block and the per-chunk
 * slots, all in the backend's memory. (The distributed layer's "bucket
 * layout" and "rank agreement check" are its own, in src/dist/.)
 */
#ifndef MTOPT_COMMON_PLAN_H
#define MTOPT_COMMON_PLAN_H

#include <stdint.h>

#ifdef __CUDACC__
#define MTOPT_HD __host__ __device__ __forceinline__
#else
#define MTOPT_HD static inline
#endif

/* Optimizer kinds, as mtopt_optimizer_kind_t, and tensor flags, as
 * MTOPT_TENSOR_*: numeric here so that device code need not include the
 * public header; core/optimizer.c asserts that they agree. */
#define MTOPT__KIND_ADAMW 0
#define MTOPT__KIND_ADAM 1
#define MTOPT__KIND_SGD 2
#define MTOPT__KIND_LAMB 3

#define MTOPT__FLAG_NO_WEIGHT_DECAY 0x1u
/* Library-set, on a segment plan's records with gaps (core/segments.c): each
 * array's span lies in one allocation, so the kernels may read its gaps (a
 * 16-byte group loaded whole); without it they read only the tensors'
 * elements. No pass ever writes a gap. */
#define MTOPT__FLAG_WHOLE_GROUPS 0x2u

/* The passes a step may have (mtopt__step_passes lists a plan's, in order). */
typedef enum {
  MTOPT__PASS_STATS = 0,      /* unscaled sum of squares, non-finite count */
  MTOPT__PASS_UPDATE = 1,     /* the update; LAMB: new moments and norms */
  MTOPT__PASS_LAMB_APPLY = 2, /* LAMB: w -= lr * trust * u */
} mtopt__pass_t;
#define MTOPT__MAX_PASSES 3

/* Master weights of a tensor (mtopt_master_t; F32 parameters have none). */
#define MTOPT__MASTER_NONE 0
#define MTOPT__MASTER_F32 1
#define MTOPT__MASTER_REMAINDER 2

/* One registered tensor. s0/s1 are its state in the slab: m and v for the Adam
 * family and LAMB, the momentum buffer (s0) for SGD. Each array is stored in
 * its dtype (MTOPT__DT_*, common/dtype.h); the all-F32 case keeps float
 * pointers for the fast paths. */
typedef struct {
  float *w;  /* param, in wdt */
  float *g;  /* grad, in gdt */
  float *s0; /* state, in sdt */
  float *s1;
  void *mw;  /* master weights: float[numel] (F32) or the uint16 remainders */
  int64_t numel;
  int64_t first_chunk; /* its chunks are [first_chunk, first_chunk+num_chunks) */
  int64_t num_chunks;
  /* Stochastic rounding keys on (tensor, element) of the tensor as the user
   * registered it: sr_tensor, and sr_elem0 + the element index here. */
  int64_t sr_elem0;
  int32_t sr_tensor;
  int32_t group;
  uint32_t flags;
  uint8_t wdt, gdt, sdt; /* dtypes of param, grad, state */
  uint8_t mmode;         /* MTOPT__MASTER_* */
} mtopt__tensor_rec_t;

/* One piece of a tensor: never spans two tensors. */
typedef struct {
  int64_t start; /* first element within the tensor */
  int32_t tensor;
  int32_t len; /* 1..chunk_size */
} mtopt__chunk_rec_t;

typedef struct {
  float lr_mult;
  float wd_mult;
} mtopt__group_rec_t;

/* The hyperparameter and step-state block. It lives in the backend's memory:
 * host setters write the first part in stream order, the step writes the rest,
 * so a captured CUDA graph reads current values at every replay. */
typedef struct {
  /* written by the host */
  float lr, beta1, beta2, eps, weight_decay, momentum, dampening;
  float max_grad_norm; /* 0: no clipping */
  float growth_factor, backoff_factor;
  uint64_t seed; /* stochastic rounding */
  int32_t growth_interval;
  int32_t nesterov;
  int32_t bias_correction;
  int32_t lamb_always_adapt;
  int32_t dynamic_loss_scale;
  /* written by the step */
  int64_t step;          /* applied steps */
  int64_t skipped_steps; /* steps skipped for non-finite gradients */
  float loss_scale;
  int32_t growth_tracker;
  float last_grad_norm;
  int32_t last_skipped;
  /* carried from the statistics pass to the update pass of one step */
  float grad_scale; /* clip / loss_scale, applied to g by the update */
  int32_t skip;     /* this step is skipped */
  uint32_t chunks_done;    /* chunks a pass has finished: elects the finaliser */
  uint32_t chunks_fetched; /* CUDA, small chunks: the next chunk a warp takes */
  uint32_t blocks_exited;  /* CUDA, small chunks: blocks done with a launch */
} mtopt__hyper_t;

/* A sum of squares of fp32 values (the per-chunk slots, and the partial sums
 * that fill them): double, so that finite values always give a finite sum.
 * One float squared overflows a float from |x| > 1.8e19, and 10^6 squares of
 * 1e16 overflow a float sum; in double, x*x of a float is exact and a sum of
 * up to 2^62 of them (each < 1.2e77) stays far below 1.8e308. */
typedef double mtopt__sum_t;

/* The plan. Pointers are into the backend's memory (host memory on the CPU,
 * device memory on CUDA). */
typedef struct {
  const mtopt__tensor_rec_t *tensors;
  const mtopt__chunk_rec_t *chunks;
  const mtopt__group_rec_t *groups;
  mtopt__hyper_t *hyper;
  mtopt__sum_t *slot_gsq;   /* per chunk: sum of squares of the unscaled g */
  uint32_t *slot_nonfinite; /* per chunk: count of inf/NaN in g */
  mtopt__sum_t *slot_wsq;   /* LAMB, per chunk: sum of w^2 */
  mtopt__sum_t *slot_usq;   /* LAMB, per chunk: sum of u^2 */
  /* defer_stats (ZeRO-1, where each rank holds a shard and the global norm
   * needs every rank's partial sums): the end of STATS writes stats_sum[0] =
   * sum of squares, stats_sum[1] = non-finite count (as a double) instead of
   * finalising; whoever runs the step then calls the backend's finish_stats
   * (core/optimizer.c alone, src/dist after summing over ranks). */
  double *stats_sum; /* 2 doubles, or NULL without defer_stats */
  int64_t num_tensors;
  int64_t num_chunks;   /* all chunks: the count that elects the finaliser */
  int64_t num_elements; /* over all tensors */
  int64_t chunk_size;
  int64_t mean_chunk_len; /* num_elements / num_chunks (0 if none): CUDA grid shape */
  int32_t kind;           /* MTOPT__KIND_* */
  int32_t use_stats;      /* a statistics pass runs before the update */
  int32_t defer_stats;
  int32_t all_f32;  /* every tensor F32 with F32 state: the fast paths */
  int32_t stochastic; /* mtopt_rounding_t: low-precision writes without a master */
  int32_t bf16_state; /* state_dtype BF16: CUDA runs the mixed kernels built for
                         narrow layouts (step_kernels.cuh: kernel flavours) */
  int32_t narrow_weights; /* every weight held in 2 bytes (F16/BF16 parameters, no
                             masters or remainders): another CUDA flavour */
  /* Segment plans with gaps (core/segments.c): per tensor record its mask,
   * or NULL where it has no gaps; element e of record k is a tensor's where
   * bit e % 32 of masks[k][e / 32] is set, and a gap, which no pass reads or
   * writes, where it is clear. NULL: no record has gaps (the CUDA kernels
   * built to read masks run only where it is set). */
  const uint32_t *const *masks;
} mtopt__plan_t;

/* The largest automatic chunk of a segment plan whose segments may span gaps
 * (core/segments.c); the CUDA statistics pass stages a chunk's mask words up
 * to this length in shared memory (stream_chunk.cuh). */
#define MTOPT__GAP_PLAN_CHUNK 16384

/* Record k's mask (plan.h: masks), or NULL. */
MTOPT_HD const uint32_t *mtopt__mask_of(const mtopt__plan_t *p, int64_t k) {
  return p->masks ? p->masks[k] : 0;
}

/* Whether element e of a record with a mask is a tensor's (not a gap). */
MTOPT_HD int mtopt__mask_bit(const uint32_t *mask, int64_t e) {
  return (int)((mask[e >> 5] >> (e & 31)) & 1u);
}

/* The passes of one step, in order, into out[]; returns how many. STATS when
 * the step takes statistics, UPDATE always, LAMB_APPLY for LAMB. Every user
 * (the step, the launch count of get_info, the distributed epilogue and the
 * kernels' end-of-step test) reads this one list. */
MTOPT_HD int mtopt__step_passes(const mtopt__plan_t *p, mtopt__pass_t out[MTOPT__MAX_PASSES]) {
  int n = 0;
  if (p->use_stats) out[n++] = MTOPT__PASS_STATS;
  out[n++] = MTOPT__PASS_UPDATE;
  if (p->kind == MTOPT__KIND_LAMB) out[n++] = MTOPT__PASS_LAMB_APPLY;
  return n;
}

/* Whether finishing this pass finishes the step: it is the last of the list. */
MTOPT_HD int mtopt__pass_ends_step(const mtopt__plan_t *p, int pass) {
  mtopt__pass_t passes[MTOPT__MAX_PASSES];
  const int n = mtopt__step_passes(p, passes);
  return pass == (int)passes[n - 1];
}

#endif /* MTOPT_COMMON_PLAN_H */

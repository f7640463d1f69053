/* Internal interface of the distributed layer: the communicator and the
 * distributed optimizer as the files of src/dist share them (comm.c,
 * dist_optimizer.c, rank_check.c, epilogue.c), and the hooks of the tests
 * and the benchmark. Names no CUDA or NCCL type. Not installed. */
#ifndef MTOPT_DIST_INTERNAL_H
#define MTOPT_DIST_INTERNAL_H

#include "../common/error.h"
#include "../core/internal_api.h"
#include "bucket_layout.h"
#include "mtopt/mtopt_dist.h"
#include "transport.h"

struct mtopt_comm {
  mtopt_context_t *ctx;
  mtopt_comm_config_t cfg;
  int rank, world;
  MPI_Comm mpi; /* our duplicate, or MPI_COMM_NULL for a wrapped NCCL comm */
  const mtopt__transport_ops_t *ops; /* chosen once, at create */
  mtopt__transport_t *tr;
  int64_t users; /* distributed optimizers alive */
};

struct mtopt_dist_optimizer {
  mtopt_comm_t *comm;
  mtopt_context_t *ctx;
  const mtopt__transport_ops_t *ops; /* the communicator's */
  mtopt__transport_t *tr;
  mtopt_tensor_list_t *list;       /* the user's; frozen while we live */
  /* The inner optimizer's tensors where the layer owns the gradient buffers
   * (lay.own), or NULL: ZeRO-1's pieces, or (zero_stage 0) copies of the
   * list's tensors reading their gradients where the reduction leaves them. */
  mtopt_tensor_list_t *inner_list;
  mtopt_optimizer_t *opt;          /* the inner optimizer */
  const mtopt__plan_t *plan;       /* the inner optimizer's */
  mtopt_optimizer_config_t config; /* as read at create */
  int zero;
  mtopt__bucket_layout_t lay; /* buckets, offsets, segments, pieces */
  char **param;               /* per list tensor */
  /* The gradient buffers, one per gradient dtype (MTOPT__DT_*; NULL where
   * no tensor has it): ours where lay.own, else the inner optimizer's. */
  char *gbuf[MTOPT__NUM_DTYPES];
  /* Their fp32 copies, element for element, where lay.f32_copy (reduce_f32:
   * the 16-bit buckets are widened into them and reduced there); else NULL. */
  char *gf32[MTOPT__NUM_DTYPES];
  char *shard; /* ZeRO-1: this rank's reduced slices */
  char *wide;  /* ZeRO-1: staging of weights wider than their gradients */
  /* one step */
  unsigned char *marked;
  int next_start; /* buckets [0, next_start) issued */
  int next_done;  /* segments [0, next_done) stepped */
  int next_back;   /* ZeRO-1: buckets [0, next_back) copied back */
  /* Slots [0, lay.ns): the segments' reductions; [lay.ns, lay.ns + lay.nb):
   * the buckets' all-gathers (ZeRO-1). */
  mtopt__transport_slots_t *slots;
  int broken;
};

/* Element e of the gradient buffer of dtype dt. */
static inline char *mtopt__dist_grad_at(const mtopt_dist_optimizer_t *d, int dt, int64_t e) {
  return d->gbuf[dt] + e * mtopt__dt_size(dt);
}

/* Element e of bucket k's reduction buffer, the one its collective reduces
 * and its step reads (zero_stage 0): the gradient buffer of its dtype, or its
 * fp32 copy where the bucket is reduced in fp32. */
static inline char *mtopt__dist_reduced_at(const mtopt_dist_optimizer_t *d, int k, int64_t e) {
  const mtopt__bucket_t *b = &d->lay.b[k];
  if (b->rdt == b->gdt) return mtopt__dist_grad_at(d, b->gdt, e);
  return d->gf32[b->gdt] + e * mtopt__dt_size(b->rdt);
}

/* INVALID_ARGUMENT for a NULL dopt. */
MTOPT__HIDDEN mtopt_status_t mtopt__dist_check(const mtopt_dist_optimizer_t *d, const char *fn);
/* INVALID_ARGUMENT for a bucket index out of range. */
MTOPT__HIDDEN mtopt_status_t mtopt__dist_check_bucket(const mtopt_dist_optimizer_t *d,
                                                      const char *fn, int bucket);

/* The rank agreement check (rank_check.c): every rank must have built the
 * same bucket layout, or the collectives would mix unrelated ranges (or hang
 * on different counts). Collective over the communicator; INVALID_ARGUMENT
 * on every rank, naming the first difference, where they disagree. */
MTOPT__HIDDEN mtopt_status_t mtopt__dist_rank_agreement(mtopt_dist_optimizer_t *d,
                                                        const char *fn);

/* ZeRO-1: every rank's pieces of the weights to every rank (epilogue.c), as
 * after a step: load's last act. */
MTOPT__HIDDEN mtopt_status_t mtopt__dist_gather_weights(mtopt_dist_optimizer_t *d);

/* ---- hooks of the tests and the benchmark ---- */

/* CPU: elements stepped between two progress pokes of the collectives in
 * flight (2^20; tests lower it so that buckets are stepped in slices). */
MTOPT__HIDDEN extern int64_t mtopt__dist_slice_elems;

/* The fewest chunks a segment is cut to (256: a pass of fewer blocks than
 * about two per SM leaves a GPU idle; at 64 K-element chunks, 64 MB); tests
 * lower it so that their small buckets are cut. */
MTOPT__HIDDEN extern int64_t mtopt__dist_min_segment_chunks;

/* Benchmark hook: the collectives of one step over every bucket (all-reduce,
 * or reduce-scatter then all-gather), with no optimizer work, completed
 * (CPU) or enqueued (CUDA; call mtopt_dist_synchronize). */
MTOPT__HIDDEN mtopt_status_t mtopt__dist_comm_only(mtopt_dist_optimizer_t *dopt);

/* Tests and benchmark: the segments (one collective each) of the layout. */
MTOPT__HIDDEN int mtopt__dist_segment_count(const mtopt_dist_optimizer_t *dopt);
MTOPT__HIDDEN void mtopt__dist_segment(const mtopt_dist_optimizer_t *dopt, int s, int *bucket,
                                       int64_t *offset, int64_t *numel, int64_t *c0,
                                       int64_t *c1);

#endif /* MTOPT_DIST_INTERNAL_H */

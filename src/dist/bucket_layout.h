/* The bucket layout of a distributed optimizer: which tensors each bucket
 * holds, where each tensor's gradient lies in the gradient buffer, the ZeRO-1
 * slices and this rank's pieces, and the segments (one collective each).
 *
 * Pure: host arithmetic on tensor sizes and dtypes, parameter addresses (only
 * their residue mod 16 bytes counts) and chunk facts, with no MPI, no backend memory
 * and no optimizer object, so that tests can lay out any model at any world
 * size and rank (tests/bucket_plan.c). It is built in steps because the chunk
 * facts come from the inner optimizer, and with ZeRO-1 that optimizer is made
 * over the pieces of the first step:
 *   1. mtopt__bucket_layout_create: the buckets; where the layer owns the
 *      gradient buffers (`own`: ZeRO-1, or 16-bit buckets reduced in fp32),
 *      the gradient offsets; ZeRO-1: the slices and this rank's pieces.
 *   2. otherwise: mtopt__bucket_layout_set_grads, the offsets of the core's
 *      gradient buffer (the inner optimizer lays it out).
 *   3. mtopt__bucket_layout_segments: each bucket's chunk range, and the
 *      segments.
 * Not installed; single-threaded like its owner. */
#ifndef MTOPT_DIST_BUCKET_LAYOUT_H
#define MTOPT_DIST_BUCKET_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#include "../common/dtype.h"
#include "../common/error.h"
#include "mtopt/mtopt.h"

/* A bucket holds tensors of one class: one gradient dtype and one parameter
 * dtype (a collective reduces one dtype; ZeRO-1's weight all-gather stages
 * one parameter size). Its tensors are those of its class among list
 * indices [first_tensor, first_tensor + num_tensors); in a table of one
 * class, every tensor of the range. */
typedef struct {
  int64_t first_tensor, num_tensors; /* the span of list indices */
  int gdt, pdt;                      /* its class (MTOPT__DT_*) */
  int rdt;                           /* the dtype it is reduced in: gdt, or F32
                                        (reduce_f32: a 16-bit bucket is widened
                                        into the fp32 copy of its buffer) */
  int first_of_class;                /* closed at first_bucket_bytes */
  int64_t offset, numel;             /* elements of the gradient buffer of gdt */
  int64_t c0, c1;                    /* chunk range of the inner optimizer */
  int64_t slice;                     /* ZeRO-1: elements per rank */
  int64_t shard_off;                 /* ZeRO-1: bytes, this rank's slice (of rdt) in the
                                        shard buffer */
  /* ZeRO-1: where the new weights are staged for the all-gather, rank r's
   * slice at stage_off + r * slice * pdt's size bytes: in the gradient buffer
   * of gdt (stage_wide 0, at the bucket's own bytes: the parameter is no
   * wider than the gradient) or in the wide staging buffer (1). */
  int64_t stage_off;
  int stage_wide;
  int64_t p0, p1; /* ZeRO-1: this rank's pieces (inner tensors) */
  int s0, s1;     /* its segments */
} mtopt__bucket_t;

/* One collective and the pass behind it. zero_stage 0: a bucket of at least
 * twice its size (and of 2 * min_segment_chunks chunks) is cut at chunk
 * boundaries into segments of about equal size, so that the last collective
 * of a step leaves little step behind it (a 321 MB GPT-2 XL embedding in one
 * all-reduce left 0.8 ms of step after the end of the communication).
 * zero_stage 1: the bucket. */
typedef struct {
  int bucket;
  int64_t offset, numel; /* range of the bucket's gradient buffer, in elements */
  int64_t c0, c1;        /* chunk range of the inner optimizer */
} mtopt__segment_t;

/* ZeRO-1: a piece of a list tensor stepped by this rank (an inner tensor):
 * elements [start, start + len) of the tensor, whose reduced gradient is at
 * byte shard_pos of the shard buffer. */
typedef struct {
  int64_t tensor, start, len;
  int64_t shard_pos;
} mtopt__piece_t;

/* What a layout is made from. */
typedef struct {
  int64_t num_tensors;
  const int64_t *numel;     /* per list tensor */
  const void *const *param; /* per list tensor: its weights (ZeRO-1: their residue) */
  const int *gdt, *pdt;     /* per list tensor: gradient and parameter dtypes
                               (MTOPT__DT_*); NULL: every one F32 */
  size_t first_bucket_bytes, bucket_bytes; /* > 0 */
  int zero_stage;           /* 0 or 1 */
  int world, rank;          /* world >= 1, 0 <= rank < world */
  int reduce_f32;           /* 16-bit buckets reduced in fp32 (mtopt_comm_config_t) */
} mtopt__bucket_layout_args_t;

typedef struct {
  int zero, world, rank;
  /* The layer owns the gradient buffers and lays them out (step 1): with
   * ZeRO-1, or where a bucket is reduced in fp32 (the inner optimizer then
   * reads the fp32 copy, not the core's buffer); else the core does (step 2). */
  int own;
  size_t first_bucket_bytes, bucket_bytes;
  int64_t nt;        /* list tensors */
  int64_t *numel;    /* per list tensor (a copy) */
  int *gdt, *pdt;    /* per list tensor (copies) */
  int64_t *goff;     /* per list tensor: its gradient's offset in the buffer of
                        its dtype (an empty tensor: the end of the non-empty
                        one before it in that buffer, 0 if none; ZeRO-1: before
                        it in its bucket, else the bucket's start) */
  int *tbucket;      /* per list tensor: its bucket */
  int64_t *order;    /* the list's tensors bucket by bucket, last bucket first,
                        each in index order: the inner optimizer's chunk order
                        (zero_stage 0); the identity where there is one class */
  int nb;
  mtopt__bucket_t *b;
  int ns;
  mtopt__segment_t *seg;
  int64_t gbuf_numel[MTOPT__NUM_DTYPES]; /* the gradient buffers' elements */
  /* Per 16-bit dtype: its buffer has an fp32 copy, element for element
   * (gbuf_numel floats), that its buckets are widened into and reduced in. */
  int f32_copy[MTOPT__NUM_DTYPES];
  int64_t shard_bytes;                   /* ZeRO-1: this rank's slices, one after another,
                                            each of its bucket's rdt */
  int64_t wide_bytes;                    /* ZeRO-1: the wide staging buffer */
  mtopt__piece_t *pieces; /* ZeRO-1, bucket by bucket */
  int64_t npieces;
} mtopt__bucket_layout_t;

/* Groups list tensors [0, n) into buckets, class by class (gdt, pdt: NULL
 * for all F32): each class's tensors in reverse order (the order backward
 * produces gradients), its first bucket closing once it reaches first_bytes
 * of gradient, the others bytes, a tensor never split, the last ending at
 * the class's lowest index; then every bucket in the order its last tensor
 * comes in backward (first_tensor descending). Writes the buckets' spans and
 * classes into b (NULL: only count); returns the count. */
MTOPT__HIDDEN int mtopt__bucket_group(const int64_t *numel, const int *gdt, const int *pdt,
                                      int64_t n, size_t first_bytes, size_t bytes,
                                      mtopt__bucket_t *b);

/* Step 1. The buckets, their reduction dtypes and the chunk order; where
 * the layer owns the buffers: per gradient dtype, buckets one after another
 * in bucket order (ZeRO-1: each padded to a multiple of 8 * world elements,
 * so that every rank's slice is the same size and 16-byte aligned in any
 * dtype), tensors inside at offsets with their weights' residue mod 16 bytes
 * (mtopt__place, as the core's buffers), so that w, g and state share one
 * vector path (an fp32 copy at the same element offsets keeps it: a 16-byte
 * boundary of 2-byte elements is one of 4-byte elements); ZeRO-1: then this
 * rank's pieces, in bucket order (so that each bucket's pieces, and chunks,
 * are contiguous in the inner optimizer). *L is zeroed first; on failure (OUT_OF_MEMORY; ctx may be NULL)
 * it may hold allocations: free it either way. */
MTOPT__HIDDEN mtopt_status_t mtopt__bucket_layout_create(mtopt_context_t *ctx, const char *fn,
                                                         const mtopt__bucket_layout_args_t *a,
                                                         mtopt__bucket_layout_t *L);

/* Step 2, where the core owns the buffers (!own): grad_off[i] is tensor i's
 * offset in the core's gradient buffer of its dtype, of buffer_numel[dtype]
 * elements (read only where numel[i] > 0). Sets every offset, and each
 * bucket's range: from its first non-empty tensor's gradient to its last
 * one's end (empty for a bucket of empty tensors). */
MTOPT__HIDDEN void mtopt__bucket_layout_set_grads(mtopt__bucket_layout_t *L,
                                                  const int64_t *grad_off,
                                                  const int64_t *buffer_numel);
/* Step 3. first_chunk[i], num_chunks[i]: the chunks of inner tensor i (the
 * list tensor i with zero_stage 0, piece i with 1) in the inner optimizer's
 * table of total_chunks chunks of chunk_size elements. A segment of bucket k
 * is at least (k == 0 ? first_bucket_bytes : bucket_bytes) of floats and
 * min_segment_chunks chunks; each cut is the first chunk start at or past
 * its target. Errors: OUT_OF_MEMORY. */
MTOPT__HIDDEN mtopt_status_t mtopt__bucket_layout_segments(mtopt_context_t *ctx, const char *fn,
                                                           mtopt__bucket_layout_t *L,
                                                           const int64_t *first_chunk,
                                                           const int64_t *num_chunks,
                                                           int64_t total_chunks,
                                                           int64_t chunk_size,
                                                           int64_t min_segment_chunks);

/* Frees what the layout allocated (a zeroed one too), and zeroes it. */
MTOPT__HIDDEN void mtopt__bucket_layout_free(mtopt__bucket_layout_t *L);

#endif /* MTOPT_DIST_BUCKET_LAYOUT_H */

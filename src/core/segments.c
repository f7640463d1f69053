/* Segments: a run of consecutive small tensors that lie back to back in every
 * array (parameter, gradient, each state array), or with the same gaps of
 * under MTOPT__SEGMENT_GAP_MAX elements between them in every array (as an
 * allocator's pool holds tensors, each at its own 256- or 512-byte start;
 * the library's state slab and gradient buffer then mirror the parameters'
 * gaps: core/layout.c), and share group and flags, is stepped, in the
 * statistics and update passes of AdamW, Adam and SGD, as one tensor of its
 * span, a mask telling the gaps (plan.h), which no pass writes or sums
 * (the CUDA kernels read them, loading 16-byte groups whole, where each
 * array's span lies in one allocation: MTOPT__FLAG_WHOLE_GROUPS). The updates
 * are elementwise, with scalars that depend only on the hyperparameters, the
 * group and the flags, so every bit is the same; what changes is the chunk
 * table: long contiguous chunks where there were one or a few short ones per
 * tensor. DRAM serves those at the large-tensor rate (docs/perf_notes_small.md,
 * v10: the same bytes ran at 0.79 of a copy as 100,000 mixed-size tensors,
 * 0.94 as flat runs; perf_notes_gaps.md, v21: a reference AdamW over the
 * pool's gaps at 0.955). The
 * statistics pass sums the squares per chunk of this table, in double, so
 * its norm equals the same tensors' apart up to the rounding of those double
 * sums: the float norm (and with it the clip factor) the same but for a
 * double sum that rounds across a float's half-ulp (tests/segments.c).
 *
 * The rest keeps the registered tensors: LAMB (its trust ratio is per tensor),
 * tables with F16/BF16 arrays or master weights (stochastic rounding keys its
 * bits on the tensor; the mixed kernels read per-tensor dtypes), and the
 * distributed layer's optimizers (their chunk ranges are buckets). Tensors of
 * MTOPT__SEGMENT_TENSOR_MAX elements or more stay alone: they already run at
 * the large-tensor rate, and one tensor of a whole model's elements ran
 * slower than the model's own table (ViT-H: 0.924 of a copy against 0.974;
 * docs/perf_notes_small.md, v11). */
#include <stdlib.h>
#include <string.h>

#include "core.h"

int mtopt__segment_member(const mtopt__tensor_rec_t *t) {
  return t->numel > 0 && t->numel < MTOPT__SEGMENT_TENSOR_MAX && t->wdt == MTOPT__DT_F32 &&
         t->gdt == MTOPT__DT_F32 && t->sdt == MTOPT__DT_F32 && t->mmode == MTOPT__MASTER_NONE;
}

/* How many elements after a's last, at a + n, b starts (equal pointers
 * arithmetic on addresses, since the arrays may be separate allocations);
 * -1 if b lies before it or off the element grid. Both NULL: the library
 * places them (core/layout.c mirrors the parameters). */
static int64_t gap_to(const float *a, int64_t n, const float *b, int64_t wgap) {
  if (!a || !b) return !a && !b ? wgap : -1;
  const uintptr_t end = (uintptr_t)a + (uintptr_t)n * sizeof(float), at = (uintptr_t)b;
  if (at < end || (at - end) % sizeof(float)) return -1;
  return (int64_t)((at - end) / sizeof(float));
}

int64_t mtopt__segment_gap(const mtopt__tensor_rec_t *s, const mtopt__tensor_rec_t *t, int gaps) {
  if (!mtopt__segment_member(t) || t->group != s->group || t->flags != s->flags) return -1;
  const int64_t gap = gap_to(s->w, s->numel, t->w, 0);
  if (gap < 0 || gap >= (gaps ? MTOPT__SEGMENT_GAP_MAX : 1)) return -1;
  /* A span with gaps starts on a 16-byte boundary, so that its 16-byte
   * groups are the pool's (the kernels index mask bits by element and
   * would serve any start; none was measured). */
  if (gap > 0 && (uintptr_t)s->w % 16u) return -1;
  if (gap_to(s->g, s->numel, t->g, gap) != gap || gap_to(s->s0, s->numel, t->s0, gap) != gap ||
      gap_to(s->s1, s->numel, t->s1, gap) != gap)
    return -1;
  return gap;
}

int64_t mtopt__segments(const mtopt__tensor_rec_t *recs, int64_t n, int gaps,
                        mtopt__tensor_rec_t *segs, int64_t *first) {
  int64_t k = 0;
  mtopt__tensor_rec_t cur;
  int open = 0, joinable = 0; /* a segment is open; small tensors may join it */
  for (int64_t i = 0; i < n; i++) {
    const mtopt__tensor_rec_t *t = &recs[i];
    if (t->numel == 0) continue; /* no chunks, no elements: in no segment */
    const int64_t gap = open && joinable ? mtopt__segment_gap(&cur, t, gaps) : -1;
    if (gap >= 0) {
      cur.numel += gap + t->numel; /* the span */
      continue;
    }
    if (open && segs) segs[k] = cur;
    k += open;
    if (first) first[k] = i;
    cur = *t;
    open = 1;
    joinable = mtopt__segment_member(t);
  }
  if (open && segs) segs[k] = cur;
  return k + open;
}

/* Bits [lo, hi) of m set. */
static void set_bits(uint32_t *m, int64_t lo, int64_t hi) {
  for (; lo < hi && lo % 32; lo++) m[lo / 32] |= 1u << (lo % 32);
  for (; lo + 32 <= hi; lo += 32) m[lo / 32] = 0xffffffffu;
  for (; lo < hi; lo++) m[lo / 32] |= 1u << (lo % 32);
}

/* The masks of the segments with gaps, into words (NULL: only count): for
 * each, ceil(span / 32) words, a tensor's elements set, the gaps clear, and
 * ptr[k] = dev + its first word (NULL for a segment without gaps). Returns
 * the words. */
static int64_t segment_masks(const mtopt__tensor_rec_t *recs, const mtopt__tensor_rec_t *segs,
                             const int64_t *first, int64_t nseg, int64_t n, uint32_t *words,
                             const uint32_t *dev, const uint32_t **ptr) {
  int64_t nw = 0;
  for (int64_t k = 0; k < nseg; k++) {
    const int64_t end = k + 1 < nseg ? first[k + 1] : n;
    int64_t sum = 0;
    for (int64_t i = first[k]; i < end; i++) sum += recs[i].numel;
    if (ptr) ptr[k] = NULL;
    if (sum == segs[k].numel) continue; /* back to back: no mask */
    const int64_t len = (segs[k].numel + 31) / 32;
    if (words) {
      ptr[k] = dev + nw;
      uint32_t *m = words + nw;
      memset(m, 0, (size_t)len * sizeof *m);
      for (int64_t i = first[k]; i < end; i++) {
        const int64_t at = (int64_t)(((uintptr_t)recs[i].w - (uintptr_t)segs[k].w) / sizeof(float));
        set_bits(m, at, at + recs[i].numel);
      }
    }
    nw += len;
  }
  return nw;
}

/* Whether each array's span of segment s lies in one allocation (plan.h:
 * MTOPT__FLAG_WHOLE_GROUPS). The kernels' 16-byte groups lie inside the
 * span: its ends go element by element (stream_chunk.cuh). */
static int whole_groups(mtopt_context_t *ctx, const mtopt__tensor_rec_t *s) {
  if (!ctx->ops->one_allocation) return 0;
  const float *const arr[4] = {s->w, s->g, s->s0, s->s1};
  for (int k = 0; k < 4; k++)
    if (arr[k] && !ctx->ops->one_allocation(ctx, arr[k], (size_t)s->numel * sizeof(float)))
      return 0;
  return 1;
}

/* Backend memory of the segment plan: its tensor records, its chunk records,
 * its statistics slots (a sum of squares and a non-finite count per chunk),
 * then, where some segment has gaps, a mask pointer per segment and the
 * masks' words, each 256-byte aligned; offsets in at[0..4], the size
 * returned. */
static size_t segment_tables(int64_t nseg, int64_t nchunks, int64_t nwords, size_t at[5]) {
  at[0] = MTOPT__ALIGN_UP((size_t)nseg * sizeof(mtopt__tensor_rec_t), (size_t)256);
  at[1] = MTOPT__ALIGN_UP(at[0] + (size_t)nchunks * sizeof(mtopt__chunk_rec_t), (size_t)256);
  at[2] = MTOPT__ALIGN_UP(at[1] + (size_t)nchunks * sizeof(mtopt__sum_t), (size_t)256);
  at[3] = MTOPT__ALIGN_UP(at[2] + (size_t)nchunks * sizeof(uint32_t), (size_t)256);
  const size_t nptr = nwords ? (size_t)nseg : 0;
  at[4] = MTOPT__ALIGN_UP(at[3] + nptr * sizeof(uint32_t *), (size_t)256);
  return at[4] + (size_t)nwords * sizeof(uint32_t);
}

mtopt_status_t mtopt__build_step_plan(mtopt_optimizer_t *opt, int64_t chunk_size, int gaps) {
  static const char fn[] = "mtopt_optimizer_create";
  mtopt_context_t *ctx = opt->ctx;
  const mtopt__plan_t *p = &opt->plan;
  opt->step_plan = &opt->plan;
  if (p->num_tensors < 2) return MTOPT_STATUS_SUCCESS;
  const int64_t n = p->num_tensors;
  const int64_t nseg = mtopt__segments(opt->tensors_host, n, gaps, NULL, NULL);
  int64_t nonempty = 0;
  for (int64_t i = 0; i < n; i++) nonempty += opt->tensors_host[i].numel > 0;
  if (nseg == nonempty) return MTOPT_STATUS_SUCCESS; /* nothing to merge */

  mtopt_status_t st = MTOPT_STATUS_SUCCESS;
  mtopt__tensor_rec_t *segs = malloc((size_t)nseg * sizeof *segs);
  int64_t *numel = calloc((size_t)nseg, sizeof *numel); /* calloc: gcc 12 cannot see the fill */
  int64_t *phase = malloc((size_t)nseg * sizeof *phase);
  int64_t *first = malloc((size_t)nseg * sizeof *first);
  int64_t *nch = malloc((size_t)nseg * sizeof *nch);
  int64_t *member0 = malloc((size_t)nseg * sizeof *member0);
  mtopt__chunk_rec_t *chunks = NULL;
  uint32_t *words = NULL;
  const uint32_t **ptrs = NULL;
  if (!segs || !numel || !phase || !first || !nch || !member0) {
    st = mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: host allocation failed", fn);
    goto done;
  }
  mtopt__segments(opt->tensors_host, n, gaps, segs, member0);
  for (int64_t k = 0; k < nseg; k++) numel[k] = segs[k].numel;
  /* chunk_size 0 over the segments: as over tensors, but at most 16384
   * elements where they span gaps (small tensors pooled): tiny-50k 0.809 of
   * the copy in 65536-element chunks, 0.825 in 8192 to 32768, many-mixed
   * 0.86 in all (one H200; docs/perf_notes_gaps.md, v22). */
  if (chunk_size == 0) {
    chunk_size = mtopt__auto_chunk_size(numel, nseg);
    if (gaps && chunk_size > MTOPT__GAP_PLAN_CHUNK) chunk_size = MTOPT__GAP_PLAN_CHUNK;
  }
  /* Chunks on the grid of chunk_size elements of the weights' addresses, so
   * that the blocks' slices (CUDA) start on aligned stretches: 100 runs of
   * tiny-50k's tensors cut from their own starts ran at 0.81 of a copy, on
   * the grid at 0.92 (docs/perf_notes_small.md, v11). A table too large for the
   * kernels' grid keeps the tensors. */
  for (int64_t k = 0; k < nseg; k++)
    phase[k] = (int64_t)((uintptr_t)segs[k].w / sizeof(float) % (uintptr_t)chunk_size);
  const int64_t nchunks =
      mtopt__chunk_table_at(numel, nseg, NULL, phase, chunk_size, first, nch, NULL);
  if (nchunks < 0 || nchunks > INT32_MAX) goto done;
  const int64_t nwords =
      segment_masks(opt->tensors_host, segs, member0, nseg, n, NULL, NULL, NULL);
  chunks = malloc((size_t)nchunks * sizeof *chunks);
  words = malloc((size_t)(nwords ? nwords : 1) * sizeof *words);
  ptrs = malloc((size_t)nseg * sizeof *ptrs);
  if (!chunks || !words || !ptrs) {
    st = mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: host allocation failed", fn);
    goto done;
  }
  mtopt__chunk_table_at(numel, nseg, NULL, phase, chunk_size, first, nch, chunks);
  for (int64_t k = 0; k < nseg; k++) {
    segs[k].first_chunk = first[k];
    segs[k].num_chunks = nch[k];
  }
  size_t at[5];
  CHECK_GOTO(ctx->ops->alloc(ctx, segment_tables(nseg, nchunks, nwords, at), &opt->dev_segments),
             st, done);
  char *base = opt->dev_segments;
  segment_masks(opt->tensors_host, segs, member0, nseg, n, words,
                (const uint32_t *)(base + at[4]), ptrs);
  for (int64_t k = 0; k < nseg; k++) {
    if (!ptrs[k]) continue;
    opt->gap_segments++;
    if (whole_groups(ctx, &segs[k])) {
      segs[k].flags |= MTOPT__FLAG_WHOLE_GROUPS;
      opt->whole_segments++;
    }
  }
  CHECK_GOTO(ctx->ops->upload(ctx, base, segs, (size_t)nseg * sizeof *segs), st, done);
  CHECK_GOTO(ctx->ops->upload(ctx, base + at[0], chunks, (size_t)nchunks * sizeof *chunks), st,
             done);
  if (nwords) {
    CHECK_GOTO(ctx->ops->upload(ctx, base + at[3], ptrs, (size_t)nseg * sizeof *ptrs), st, done);
    CHECK_GOTO(ctx->ops->upload(ctx, base + at[4], words, (size_t)nwords * sizeof *words), st,
               done);
  }
  mtopt__plan_t *s = &opt->segment_plan;
  *s = opt->plan; /* the same hyperparameters and groups */
  s->tensors = (const mtopt__tensor_rec_t *)base;
  s->chunks = (const mtopt__chunk_rec_t *)(base + at[0]);
  s->slot_gsq = (mtopt__sum_t *)(base + at[1]);
  s->slot_nonfinite = (uint32_t *)(base + at[2]);
  s->num_tensors = nseg;
  s->num_chunks = nchunks;
  s->chunk_size = chunk_size;
  s->mean_chunk_len = p->num_elements / nchunks;
  s->masks = nwords ? (const uint32_t *const *)(base + at[3]) : NULL;
  opt->step_plan = s;
done:
  free(segs);
  free(numel);
  free(phase);
  free(first);
  free(nch);
  free(member0);
  free(chunks);
  free(words);
  free(ptrs);
  return st;
}

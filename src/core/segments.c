/* Segments: a run of consecutive small tensors that lie back to back in every
 * array (parameter, gradient, each state array) and share group and flags is
 * stepped, in the statistics and update passes of AdamW, Adam and SGD, as one
 * tensor of their total length. The updates are elementwise, with scalars
 * that depend only on the hyperparameters, the group and the flags, so every
 * bit is the same; what changes is the chunk table: long contiguous chunks
 * where there were one or a few short ones per tensor. DRAM serves those at
 * the large-tensor rate (docs/perf_notes_small.md, v10: the same bytes ran at
 * 0.79 of a copy as 100,000 mixed-size tensors, 0.94 as flat runs). The
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

/* The element after a segment's last in one of its arrays (NULL stays NULL). */
static const float *past(const float *a, int64_t n) { return a ? a + n : NULL; }

int mtopt__segment_continues(const mtopt__tensor_rec_t *s, const mtopt__tensor_rec_t *t) {
  return mtopt__segment_member(t) && t->group == s->group && t->flags == s->flags &&
         t->w == past(s->w, s->numel) && t->g == past(s->g, s->numel) &&
         t->s0 == past(s->s0, s->numel) && t->s1 == past(s->s1, s->numel);
}

int64_t mtopt__segments(const mtopt__tensor_rec_t *recs, int64_t n, mtopt__tensor_rec_t *segs) {
  int64_t k = 0;
  mtopt__tensor_rec_t cur;
  int open = 0, joinable = 0; /* a segment is open; small tensors may join it */
  for (int64_t i = 0; i < n; i++) {
    const mtopt__tensor_rec_t *t = &recs[i];
    if (t->numel == 0) continue; /* no chunks, no elements: in no segment */
    if (open && joinable && mtopt__segment_continues(&cur, t)) {
      cur.numel += t->numel;
      continue;
    }
    if (open && segs) segs[k] = cur;
    k += open;
    cur = *t;
    open = 1;
    joinable = mtopt__segment_member(t);
  }
  if (open && segs) segs[k] = cur;
  return k + open;
}

/* Backend memory of the segment plan: its tensor records, its chunk records,
 * then its statistics slots (a sum of squares and a non-finite count per
 * chunk), each 256-byte aligned; offsets in at[0..2], the size returned. */
static size_t segment_tables(int64_t nseg, int64_t nchunks, size_t at[3]) {
  at[0] = MTOPT__ALIGN_UP((size_t)nseg * sizeof(mtopt__tensor_rec_t), (size_t)256);
  at[1] = MTOPT__ALIGN_UP(at[0] + (size_t)nchunks * sizeof(mtopt__chunk_rec_t), (size_t)256);
  at[2] = MTOPT__ALIGN_UP(at[1] + (size_t)nchunks * sizeof(mtopt__sum_t), (size_t)256);
  return at[2] + (size_t)nchunks * sizeof(uint32_t);
}

mtopt_status_t mtopt__build_step_plan(mtopt_optimizer_t *opt, int64_t chunk_size) {
  static const char fn[] = "mtopt_optimizer_create";
  mtopt_context_t *ctx = opt->ctx;
  const mtopt__plan_t *p = &opt->plan;
  opt->step_plan = &opt->plan;
  if (p->num_tensors < 2) return MTOPT_STATUS_SUCCESS;
  const int64_t n = p->num_tensors;
  const int64_t nseg = mtopt__segments(opt->tensors_host, n, NULL);
  int64_t nonempty = 0;
  for (int64_t i = 0; i < n; i++) nonempty += opt->tensors_host[i].numel > 0;
  if (nseg == nonempty) return MTOPT_STATUS_SUCCESS; /* nothing to merge */

  mtopt_status_t st = MTOPT_STATUS_SUCCESS;
  mtopt__tensor_rec_t *segs = malloc((size_t)nseg * sizeof *segs);
  int64_t *numel = calloc((size_t)nseg, sizeof *numel); /* calloc: gcc 12 cannot see the fill */
  int64_t *phase = malloc((size_t)nseg * sizeof *phase);
  int64_t *first = malloc((size_t)nseg * sizeof *first);
  int64_t *nch = malloc((size_t)nseg * sizeof *nch);
  mtopt__chunk_rec_t *chunks = NULL;
  if (!segs || !numel || !phase || !first || !nch) {
    st = mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: host allocation failed", fn);
    goto done;
  }
  mtopt__segments(opt->tensors_host, n, segs);
  for (int64_t k = 0; k < nseg; k++) numel[k] = segs[k].numel;
  if (chunk_size == 0) chunk_size = mtopt__auto_chunk_size(numel, nseg);
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
  chunks = malloc((size_t)nchunks * sizeof *chunks);
  if (!chunks) {
    st = mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: host allocation failed", fn);
    goto done;
  }
  mtopt__chunk_table_at(numel, nseg, NULL, phase, chunk_size, first, nch, chunks);
  for (int64_t k = 0; k < nseg; k++) {
    segs[k].first_chunk = first[k];
    segs[k].num_chunks = nch[k];
  }
  size_t at[3];
  CHECK_GOTO(ctx->ops->alloc(ctx, segment_tables(nseg, nchunks, at), &opt->dev_segments), st,
             done);
  char *base = opt->dev_segments;
  CHECK_GOTO(ctx->ops->upload(ctx, base, segs, (size_t)nseg * sizeof *segs), st, done);
  CHECK_GOTO(ctx->ops->upload(ctx, base + at[0], chunks, (size_t)nchunks * sizeof *chunks), st,
             done);
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
  opt->step_plan = s;
done:
  free(segs);
  free(numel);
  free(phase);
  free(first);
  free(nch);
  free(chunks);
  return st;
}

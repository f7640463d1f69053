/* The bucket_plan suite's rig (bucket_plan.c): a model to lay out (tensor
 * sizes, classes, weights at chosen residues mod 16 bytes), steps 1-3 of
 * src/dist/bucket_layout.h for one rank as the distributed optimizer runs
 * them, and the checks of every invariant of the layout at every rank.
 * Static, for the one suite that includes it. */
#ifndef MTOPT_TEST_BUCKET_PLAN_RIG_H
#define MTOPT_TEST_BUCKET_PLAN_RIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "core/core.h"
#include "dist/bucket_layout.h"
#include "test_util.h"

/* Weights at any residue mod 16 bytes: F32 ones at arena + r (r in 0..3
 * floats), 16-bit ones at arena16 + r (r in 0..7 halves). */
_Alignas(16) static float arena[8];
_Alignas(16) static uint16_t arena16[16];

/* Context of a failure: the case being checked. */
static char g_case[200];
#define EXPECT(cond, ...)                                                      \
  do {                                                                         \
    if (!(cond)) {                                                             \
      char m_[256];                                                            \
      snprintf(m_, sizeof m_, __VA_ARGS__);                                    \
      ck_abort_msg("%s: %s", g_case, m_);                                      \
    }                                                                          \
  } while (0)

/* A model to lay out, and what the inner optimizer would report. */
typedef struct {
  int64_t n;
  int64_t *numel;
  const void **param;
  const int *gdt, *pdt; /* per tensor, MTOPT__DT_*; NULL: every one F32 */
  size_t first_bytes, bytes;
  int zero, world;
  int64_t cs, min_chunks; /* the chunk size; min_segment_chunks */
} model_t;

#define NCLS (MTOPT__NUM_DTYPES * MTOPT__NUM_DTYPES)
#define LL(x) ((long long)(x))

static int gdt_of(const model_t *m, int64_t i) { return m->gdt ? m->gdt[i] : MTOPT__DT_F32; }
static int pdt_of(const model_t *m, int64_t i) { return m->pdt ? m->pdt[i] : MTOPT__DT_F32; }
static int ge_of(const model_t *m, int64_t i) { return mtopt__dt_size(gdt_of(m, i)); }
static int cls_of(const model_t *m, int64_t i) {
  return gdt_of(m, i) * MTOPT__NUM_DTYPES + pdt_of(m, i);
}
static int bcls(const mtopt__bucket_t *b) { return b->gdt * MTOPT__NUM_DTYPES + b->pdt; }
static int64_t chunks(int64_t numel, int64_t cs) { return (numel + cs - 1) / cs; }

/* The element at or past `at` of its gradient buffer where the core puts
 * tensor i's gradient (mtopt__place: its weights' residue mod 16 bytes). */
static int64_t place(const model_t *m, int64_t i, int64_t at) {
  const int ge = ge_of(m, i);
  return mtopt__place(at * ge, ge, m->param[i], mtopt__dt_size(pdt_of(m, i))) / ge;
}

/* Steps 1-3 for one rank: the chunk facts of the inner tensors (the list's
 * in L->order, or the rank's pieces) from mtopt__chunk_table; with
 * zero_stage 0 the gradient offsets as the core lays its buffers out
 * (per gradient dtype, mtopt__place in L->order). Returns the inner
 * tensors' first chunks (the caller frees them) and *total the chunk count. */
static int64_t *bp_lay_out(const model_t *m, int rank, mtopt__bucket_layout_t *L, int64_t *total) {
  const mtopt__bucket_layout_args_t a = {
      .num_tensors = m->n, .numel = m->numel, .param = (const void *const *)m->param,
      .gdt = m->gdt, .pdt = m->pdt, .first_bucket_bytes = m->first_bytes,
      .bucket_bytes = m->bytes, .zero_stage = m->zero, .world = m->world, .rank = rank};
  TU_OK(mtopt__bucket_layout_create(NULL, "test", &a, L));
  /* L->order indexes everything below: a permutation first. */
  char *seen = calloc((size_t)m->n + 1, 1);
  for (int64_t j = 0; j < m->n; j++) {
    const int64_t i = L->order[j];
    EXPECT(i >= 0 && i < m->n && !seen[i], "order[%lld] = %lld: not a permutation", LL(j), LL(i));
    seen[i] = 1;
  }
  free(seen);
  const int64_t ni = m->zero ? L->npieces : m->n;
  int64_t *len = malloc((size_t)(ni + 1) * sizeof *len);
  int64_t *first = malloc((size_t)(ni + 1) * sizeof *first);
  int64_t *count = malloc((size_t)(ni + 1) * sizeof *count);
  for (int64_t i = 0; i < ni; i++) len[i] = m->zero ? L->pieces[i].len : m->numel[i];
  /* The inner optimizer's table: zero_stage 0 in the layout's order. */
  *total = mtopt__chunk_table(len, ni, m->zero ? NULL : L->order, m->cs, first, count, NULL);
  ck_assert_int_ge(*total, 0);
  if (!m->zero) { /* the core: a buffer per gradient dtype, filled in L->order */
    int64_t *off = malloc((size_t)(m->n + 1) * sizeof *off), at[MTOPT__NUM_DTYPES] = {0, 0, 0};
    for (int64_t j = 0; j < m->n; j++) {
      const int64_t i = L->order[j];
      off[i] = -1; /* never read for an empty tensor */
      if (m->numel[i] == 0) continue;
      int64_t *g = &at[gdt_of(m, i)];
      off[i] = *g = place(m, i, *g);
      *g += m->numel[i];
    }
    mtopt__bucket_layout_set_grads(L, off, at);
    free(off);
  }
  TU_OK(mtopt__bucket_layout_segments(NULL, "test", L, first, count, *total, m->cs,
                                      m->min_chunks));
  free(len);
  free(count);
  return first;
}

/* Buckets: sorted by first tensor, descending; each of one class, its
 * tensors exactly those of its class in its span; per class, the buckets
 * tile the class's tensors backward, each closing once it reaches its size
 * in gradient bytes (the class's first: first_bytes), not before, the last
 * at the class's lowest index. */
static void check_buckets(const model_t *m, const mtopt__bucket_layout_t *L) {
  EXPECT(L->nt == m->n, "nt %lld", LL(L->nt));
  EXPECT((L->nb > 0) == (m->n > 0), "%d buckets for %lld tensors", L->nb, LL(m->n));
  EXPECT(mtopt__bucket_group(m->numel, m->gdt, m->pdt, m->n, m->first_bytes, m->bytes, NULL) ==
             L->nb,
         "the count differs from the layout's");
  for (int k = 0; k < L->nb; k++) {
    const mtopt__bucket_t *b = &L->b[k];
    const int64_t lo = b->first_tensor, hi = lo + b->num_tensors;
    EXPECT(b->num_tensors >= 1 && lo >= 0 && hi <= m->n, "bucket %d spans [%lld, %lld)", k, LL(lo),
           LL(hi));
    EXPECT(k == 0 || lo < L->b[k - 1].first_tensor, "bucket %d at %lld, bucket %d at %lld", k,
           LL(lo), k - 1, LL(L->b[k - 1].first_tensor));
    EXPECT(b->gdt >= 0 && b->gdt < MTOPT__NUM_DTYPES && b->pdt >= 0 && b->pdt < MTOPT__NUM_DTYPES,
           "bucket %d of dtypes %d/%d", k, b->gdt, b->pdt);
    EXPECT(cls_of(m, lo) == bcls(b) && cls_of(m, hi - 1) == bcls(b),
           "bucket %d (class %d) spans [%lld, %lld) of classes %d .. %d", k, bcls(b), LL(lo),
           LL(hi), cls_of(m, lo), cls_of(m, hi - 1));
    for (int64_t i = lo; i < hi; i++)
      EXPECT((L->tbucket[i] == k) == (cls_of(m, i) == bcls(b)),
             "tensor %lld (class %d) in bucket %d; bucket %d (class %d) spans it", LL(i),
             cls_of(m, i), L->tbucket[i], k, bcls(b));
  }
  for (int64_t i = 0; i < m->n; i++) {
    const int k = L->tbucket[i];
    EXPECT(k >= 0 && k < L->nb && i >= L->b[k].first_tensor &&
               i < L->b[k].first_tensor + L->b[k].num_tensors,
           "tensor %lld in bucket %d, outside its span", LL(i), k);
  }
  for (int c = 0; c < NCLS; c++) {
    int64_t cursor = m->n; /* the class's tensors below it are not grouped yet */
    int first = 1;
    for (int k = 0; k < L->nb; k++) {
      const mtopt__bucket_t *b = &L->b[k];
      if (bcls(b) != c) continue;
      int64_t top = cursor - 1, bytes = 0, below = 0;
      while (top >= 0 && cls_of(m, top) != c) top--;
      EXPECT(b->first_tensor + b->num_tensors - 1 == top,
             "bucket %d of class %d ends at %lld, not %lld", k, c,
             LL(b->first_tensor + b->num_tensors - 1), LL(top));
      for (int64_t i = b->first_tensor; i <= top; i++)
        if (cls_of(m, i) == c) bytes += m->numel[i] * ge_of(m, i);
      for (int64_t i = 0; i < b->first_tensor; i++) below += cls_of(m, i) == c;
      const int64_t cap = (int64_t)(first ? m->first_bytes : m->bytes);
      EXPECT(bytes >= cap || !below, "bucket %d closed at %lld bytes < %lld", k, LL(bytes),
             LL(cap));
      EXPECT(bytes - m->numel[b->first_tensor] * ge_of(m, b->first_tensor) < cap,
             "bucket %d reached %lld bytes before its first tensor", k, LL(cap));
      cursor = b->first_tensor;
      first = 0;
    }
    for (int64_t i = 0; i < cursor; i++)
      EXPECT(cls_of(m, i) != c, "tensor %lld of class %d below its class's last bucket", LL(i), c);
  }
}

/* The order: bucket by bucket from the last to bucket 0, each bucket's
 * tensors in index order (the identity where there is one class). */
static void check_order(const model_t *m, const mtopt__bucket_layout_t *L) {
  int64_t j = 0;
  for (int k = L->nb - 1; k >= 0; k--)
    for (int64_t i = L->b[k].first_tensor; i < L->b[k].first_tensor + L->b[k].num_tensors; i++) {
      if (L->tbucket[i] != k) continue;
      EXPECT(j < m->n && L->order[j] == i, "order[%lld] = %lld, not %lld (bucket %d)", LL(j),
             LL(j < m->n ? L->order[j] : -1), LL(i), k);
      j++;
    }
  EXPECT(j == m->n, "the buckets hold %lld tensors of %lld", LL(j), LL(m->n));
}

/* Bucket k's tensors: each non-empty one at its weights' residue (where
 * mtopt__place leaves it), inside the bucket, after the one before it with
 * less than 16 bytes of padding (from prev_end if >= 0); empty ones
 * (ZeRO-1) at the end of the one before, else the bucket's start. Returns
 * the first non-empty one's offset (-1 if none) and *end, the last one's
 * end. */
static int64_t check_tensors(const model_t *m, const mtopt__bucket_layout_t *L, int k,
                             int64_t prev_end, int64_t *end) {
  const mtopt__bucket_t *b = &L->b[k];
  int64_t start = -1;
  *end = b->offset;
  for (int64_t i = b->first_tensor; i < b->first_tensor + b->num_tensors; i++) {
    if (L->tbucket[i] != k) continue;
    const int64_t g = L->goff[i];
    if (m->numel[i] == 0) {
      if (m->zero)
        EXPECT(g == *end, "empty tensor %lld at %lld, not %lld", LL(i), LL(g), LL(*end));
      continue;
    }
    EXPECT(place(m, i, g) == g, "tensor %lld at %lld, weights at byte residue %d", LL(i), LL(g),
           (int)((uintptr_t)m->param[i] % 16));
    EXPECT(g >= b->offset && g + m->numel[i] <= b->offset + b->numel,
           "tensor %lld [%lld, +%lld) outside bucket %d [%lld, +%lld)", LL(i), LL(g),
           LL(m->numel[i]), k, LL(b->offset), LL(b->numel));
    if (prev_end >= 0)
      EXPECT(g >= prev_end && (g - prev_end) * ge_of(m, i) < 16,
             "tensor %lld at %lld after an end at %lld", LL(i), LL(g), LL(prev_end));
    if (start < 0) start = g;
    prev_end = *end = g + m->numel[i];
  }
  return start;
}

/* zero_stage 0: the offsets given (the core's); empty tensors at the end of
 * the non-empty one before them in their buffer in the chunk order (0 if
 * none); each bucket from its first tensor's gradient to its last one's end,
 * inside its dtype's buffer, after the buckets before it there (the buffers
 * follow the order: the last bucket first). */
static void check_grads0(const model_t *m, const mtopt__bucket_layout_t *L) {
  int64_t end[MTOPT__NUM_DTYPES] = {0, 0, 0}, last[MTOPT__NUM_DTYPES] = {0, 0, 0};
  for (int64_t j = 0; j < m->n; j++) {
    const int64_t i = L->order[j];
    if (m->numel[i] > 0)
      end[gdt_of(m, i)] = L->goff[i] + m->numel[i];
    else
      EXPECT(L->goff[i] == end[gdt_of(m, i)], "empty tensor %lld at %lld, not %lld", LL(i),
             LL(L->goff[i]), LL(end[gdt_of(m, i)]));
  }
  for (int k = L->nb - 1; k >= 0; k--) {
    const mtopt__bucket_t *b = &L->b[k];
    const int d = b->gdt;
    EXPECT(b->offset >= last[d] && b->numel >= 0 && b->offset + b->numel <= L->gbuf_numel[d],
           "bucket %d [%lld, +%lld) in buffer %d of %lld, after %lld", k, LL(b->offset),
           LL(b->numel), d, LL(L->gbuf_numel[d]), LL(last[d]));
    last[d] = b->offset + b->numel;
    int64_t used_end;
    const int64_t start = check_tensors(m, L, k, -1, &used_end);
    const int64_t want = start < 0 ? L->goff[b->first_tensor] : start;
    EXPECT(b->offset == want && b->numel == (start < 0 ? 0 : used_end - start),
           "bucket %d [%lld, +%lld), tensors [%lld, %lld)", k, LL(b->offset), LL(b->numel),
           LL(want), LL(start < 0 ? want : used_end));
  }
}

/* ZeRO-1: per gradient dtype, buckets one after another in bucket order;
 * slices the smallest multiples of 8 elements that hold the bucket's tensors
 * at `world` ranks; the shard (bytes) slice after slice; the new weights
 * staged in place (the bucket's own bytes, which hold them: the parameter
 * is no wider) or, for a wider parameter, one after another in the wide
 * buffer. One after another, so inside their buffers and never overlapping;
 * every rank's slice and staging 16-byte aligned. */
static void check_zero1(const model_t *m, const mtopt__bucket_layout_t *L) {
  int64_t next[MTOPT__NUM_DTYPES] = {0, 0, 0}, soff = 0, woff = 0;
  for (int k = 0; k < L->nb; k++) {
    const mtopt__bucket_t *b = &L->b[k];
    const int d = b->gdt, ge = mtopt__dt_size(b->gdt), pe = mtopt__dt_size(b->pdt);
    EXPECT(b->offset == next[d], "bucket %d at %lld of buffer %d, not %lld", k, LL(b->offset), d,
           LL(next[d]));
    next[d] += b->numel;
    EXPECT(b->shard_off == soff, "bucket %d's slice at byte %lld of the shard, not %lld", k,
           LL(b->shard_off), LL(soff));
    soff += b->slice * ge;
    EXPECT(b->stage_wide == (pe > ge), "bucket %d (%d/%d bytes): stage_wide %d", k, ge, pe,
           b->stage_wide);
    const int64_t want_stage = b->stage_wide ? woff : b->offset * ge;
    EXPECT(b->stage_off == want_stage, "bucket %d staged at %lld, not %lld", k, LL(b->stage_off),
           LL(want_stage));
    if (b->stage_wide) woff += b->numel * pe;
    EXPECT(b->offset * ge % 16 == 0 && b->shard_off % 16 == 0 && b->stage_off % 16 == 0 &&
               b->slice * pe % 16 == 0,
           "bucket %d: offset %lld, shard %lld, stage %lld, slice %lld: not 16-byte aligned", k,
           LL(b->offset), LL(b->shard_off), LL(b->stage_off), LL(b->slice));
    int64_t used_end;
    check_tensors(m, L, k, b->offset, &used_end);
    const int64_t used = used_end - b->offset;
    EXPECT(b->slice % 8 == 0 && b->numel == b->slice * m->world,
           "bucket %d: slice %lld, numel %lld", k, LL(b->slice), LL(b->numel));
    EXPECT(b->numel >= used && (b->slice == 0 || (b->slice - 8) * m->world < used),
           "bucket %d: slice %lld for %lld elements at %d ranks", k, LL(b->slice), LL(used),
           m->world);
  }
  for (int d = 0; d < MTOPT__NUM_DTYPES; d++)
    EXPECT(L->gbuf_numel[d] == next[d], "buffer %d: %lld, buckets %lld", d, LL(L->gbuf_numel[d]),
           LL(next[d]));
  EXPECT(L->shard_bytes == soff, "shard %lld bytes, slices %lld", LL(L->shard_bytes), LL(soff));
  EXPECT(L->wide_bytes == woff, "wide %lld bytes, staging %lld", LL(L->wide_bytes), LL(woff));
}

/* One rank's ZeRO-1 pieces: bucket by bucket, each a tensor of the bucket
 * inside the rank's slice, its shard position (bytes) where the slice puts
 * it; count[dtype][element] gains 1 per element covered. */
static void check_pieces(const mtopt__bucket_layout_t *L, int rank, int *const *count) {
  int64_t next = 0;
  for (int k = 0; k < L->nb; k++) {
    const mtopt__bucket_t *b = &L->b[k];
    const int64_t ge = mtopt__dt_size(b->gdt);
    EXPECT(b->p0 == next && b->p1 >= b->p0, "bucket %d: pieces [%lld, %lld) after %lld", k,
           LL(b->p0), LL(b->p1), LL(next));
    next = b->p1;
    const int64_t s0 = b->offset + (int64_t)rank * b->slice;
    int64_t prev = -1;
    for (int64_t p = b->p0; p < b->p1; p++) {
      const mtopt__piece_t *q = &L->pieces[p];
      EXPECT(q->tensor > prev && q->tensor < L->nt && L->tbucket[q->tensor] == k,
             "rank %d: piece %lld of tensor %lld in bucket %d", rank, LL(p), LL(q->tensor), k);
      prev = q->tensor;
      EXPECT(q->start >= 0 && q->len >= 1 && q->start + q->len <= L->numel[q->tensor],
             "rank %d: piece %lld [%lld, +%lld) of a tensor of %lld", rank, LL(p), LL(q->start),
             LL(q->len), LL(L->numel[q->tensor]));
      const int64_t at = L->goff[q->tensor] + q->start;
      EXPECT(at >= s0 && at + q->len <= s0 + b->slice, "rank %d: piece %lld outside its slice",
             rank, LL(p));
      EXPECT(q->shard_pos == b->shard_off + (at - s0) * ge, "rank %d: piece %lld at shard %lld",
             rank, LL(p), LL(q->shard_pos));
      for (int64_t j = 0; j < q->len; j++) count[b->gdt][at + j]++;
    }
  }
  EXPECT(next == L->npieces, "%lld pieces, %lld in buckets", LL(L->npieces), LL(next));
}

/* Segments: each bucket's chunk range (its inner tensors' chunks, one run)
 * and element range tiled in order, cuts at chunk starts; zero_stage 0:
 * floor(numel / size) segments of about equal size (size: the bucket's
 * bytes in gradient elements, at least min_chunks chunks); ZeRO-1: the
 * bucket. */
static void check_segments(const model_t *m, const mtopt__bucket_layout_t *L,
                           const int64_t *first_chunk, int64_t total_chunks) {
  const int64_t cs = m->cs;
  int s = 0;
  for (int k = 0; k < L->nb; k++) {
    const mtopt__bucket_t *b = &L->b[k];
    const int64_t lo = b->first_tensor, hi = lo + b->num_tensors;
    /* The table follows the inner tensors: zero_stage 0, L->order (bucket 0
     * last); ZeRO-1, the pieces in bucket order. */
    const int adjacent = m->zero ? b->c0 == (k == 0 ? 0 : L->b[k - 1].c1)
                                 : b->c1 == (k == 0 ? total_chunks : L->b[k - 1].c0);
    EXPECT(adjacent && b->c1 >= b->c0, "bucket %d: chunks [%lld, %lld)", k, LL(b->c0), LL(b->c1));
    /* From its first tensor's first chunk (ZeRO-1: its first piece's), as
     * many as its inner tensors have. */
    const int64_t want_c0 = !m->zero             ? first_chunk[lo]
                            : b->p0 < L->npieces ? first_chunk[b->p0]
                                                 : total_chunks;
    int64_t nc = 0;
    if (m->zero)
      for (int64_t p = b->p0; p < b->p1; p++) nc += chunks(L->pieces[p].len, cs);
    else
      for (int64_t i = lo; i < hi; i++)
        if (L->tbucket[i] == k) nc += chunks(m->numel[i], cs);
    EXPECT(b->c0 == want_c0 && b->c1 - b->c0 == nc,
           "bucket %d: chunks [%lld, %lld), not %lld + %lld", k, LL(b->c0), LL(b->c1),
           LL(want_c0), LL(nc));
    EXPECT(b->s0 == s && b->s1 > b->s0, "bucket %d: segments [%d, %d) after %d", k, b->s0, b->s1,
           s);
    s = b->s1;
    if (m->zero) {
      const mtopt__segment_t *g = &L->seg[b->s0];
      EXPECT(b->s1 == b->s0 + 1 && g->bucket == k && g->offset == b->offset &&
                 g->numel == b->numel && g->c0 == b->c0 && g->c1 == b->c1,
             "bucket %d's segment is not the bucket", k);
      continue;
    }
    /* The bucket's chunk starts in its buffer, and the widest gap between
     * two (or from the last to the end). */
    int64_t gap = 0, last = b->offset;
    for (int64_t i = lo; i < hi; i++)
      for (int64_t j = 0; L->tbucket[i] == k && j * cs < m->numel[i]; j++) {
        const int64_t at = L->goff[i] + j * cs;
        if (at - last > gap) gap = at - last;
        last = at;
      }
    if (b->offset + b->numel - last > gap) gap = b->offset + b->numel - last;
    /* Its class's first bucket was closed at first_bytes: cut at that size. */
    int first_of_class = 1;
    for (int j = 0; j < k; j++)
      if (L->b[j].gdt == b->gdt && L->b[j].pdt == b->pdt) first_of_class = 0;
    const int64_t bytes = (int64_t)(first_of_class ? m->first_bytes : m->bytes);
    const int64_t ge = mtopt__dt_size(b->gdt);
    int64_t size = bytes / ge > 0 ? bytes / ge : 1;
    if (size < m->min_chunks * cs) size = m->min_chunks * cs;
    const int64_t pieces = b->numel / size > 1 ? b->numel / size : 1;
    const int64_t q = b->numel / pieces, count = b->s1 - b->s0;
    EXPECT(count <= pieces, "bucket %d: %lld segments, at most %lld", k, LL(count), LL(pieces));
    /* Enough chunk starts between two targets: every cut is made. */
    if (q >= gap)
      EXPECT(count == pieces, "bucket %d (%lld elements, size %lld, gap %lld): %lld segments", k,
             LL(b->numel), LL(size), LL(gap), LL(count));
    int64_t off = b->offset, c = b->c0;
    for (int j = b->s0; j < b->s1; j++) {
      const mtopt__segment_t *g = &L->seg[j];
      EXPECT(g->bucket == k && g->offset == off && g->c0 == c, "segment %d does not follow on", j);
      EXPECT(g->numel >= (b->numel > 0) && g->c1 >= g->c0, "segment %d: %lld elements", j,
             LL(g->numel));
      if (count == pieces && count > 1)
        EXPECT(g->numel > q - gap && g->numel < q + 1 + gap,
               "segment %d: %lld elements, %lld +- %lld expected", j, LL(g->numel), LL(q), LL(gap));
      if (j > b->s0) { /* a cut: the start of a chunk of one of the bucket's tensors */
        int found = 0;
        for (int64_t i = lo; i < hi && !found; i++) {
          const int64_t rel = g->offset - L->goff[i];
          if (L->tbucket[i] == k && m->numel[i] > 0 && rel >= 0 && rel < m->numel[i] &&
              rel % cs == 0)
            found = g->c0 == first_chunk[i] + rel / cs;
        }
        EXPECT(found, "segment %d cut at %lld, chunk %lld: not a chunk start", j, LL(g->offset),
               LL(g->c0));
      }
      off += g->numel;
      c = g->c1;
    }
    EXPECT(off == b->offset + b->numel && c == b->c1,
           "bucket %d's segments end at %lld, chunk %lld", k, LL(off), LL(c));
  }
  EXPECT(s == L->ns, "%d segments, %d in buckets", L->ns, s);
  if (L->nb > 0) {
    const mtopt__bucket_t *z = &L->b[L->nb - 1];
    EXPECT(m->zero ? z->c1 == total_chunks : z->c0 == 0, "the last bucket's chunks: [%lld, %lld)",
           LL(z->c0), LL(z->c1));
  }
}

/* What every rank must agree on: the buckets, their places and the order. */
static void check_agree(const model_t *m, const mtopt__bucket_layout_t *L,
                        const mtopt__bucket_layout_t *L0, int r) {
  EXPECT(L->nb == L0->nb && L->shard_bytes == L0->shard_bytes && L->wide_bytes == L0->wide_bytes &&
             !memcmp(L->gbuf_numel, L0->gbuf_numel, sizeof L->gbuf_numel),
         "rank %d differs", r);
  for (int k = 0; k < L->nb; k++) {
    const mtopt__bucket_t *a = &L->b[k], *b = &L0->b[k];
    EXPECT(a->first_tensor == b->first_tensor && a->num_tensors == b->num_tensors &&
               a->gdt == b->gdt && a->pdt == b->pdt && a->offset == b->offset &&
               a->numel == b->numel && a->slice == b->slice && a->shard_off == b->shard_off &&
               a->stage_off == b->stage_off && a->stage_wide == b->stage_wide,
           "rank %d: bucket %d differs", r, k);
  }
  for (int64_t i = 0; i < m->n; i++)
    EXPECT(L->goff[i] == L0->goff[i] && L->order[i] == L0->order[i] &&
               L->tbucket[i] == L0->tbucket[i],
           "rank %d: tensor %lld differs", r, LL(i));
}

/* Lays the model out at every rank and checks each rank's layout (buckets,
 * order, offsets, slices, staging, pieces, segments), the ranks' agreement,
 * and that their pieces cover every tensor element exactly once. */
static void bp_check_model(const model_t *m) {
  mtopt__bucket_layout_t *L = calloc((size_t)m->world, sizeof *L);
  int *count[MTOPT__NUM_DTYPES] = {NULL, NULL, NULL};
  for (int r = 0; r < m->world; r++) {
    int64_t total = 0;
    int64_t *first = bp_lay_out(m, r, &L[r], &total);
    check_buckets(m, &L[r]);
    check_order(m, &L[r]);
    if (m->zero)
      check_zero1(m, &L[r]);
    else
      check_grads0(m, &L[r]);
    check_segments(m, &L[r], first, total);
    free(first);
    if (m->zero) {
      if (!count[0])
        for (int d = 0; d < MTOPT__NUM_DTYPES; d++)
          count[d] = calloc((size_t)L[0].gbuf_numel[d] + 1, sizeof *count[d]);
      check_pieces(&L[r], r, count);
    }
    check_agree(m, &L[r], &L[0], r);
  }
  if (m->zero) {
    /* Once per tensor element over all ranks, never on padding. */
    int64_t covered = 0, elements = 0;
    for (int64_t i = 0; i < m->n; i++) {
      const int *c = count[gdt_of(m, i)] + L[0].goff[i];
      elements += m->numel[i];
      for (int64_t j = 0; j < m->numel[i]; j++)
        EXPECT(c[j] == 1, "tensor %lld element %lld in %d pieces", LL(i), LL(j), c[j]);
    }
    for (int d = 0; d < MTOPT__NUM_DTYPES; d++)
      for (int64_t e = 0; e < L[0].gbuf_numel[d]; e++) covered += count[d][e];
    EXPECT(covered == elements, "the pieces cover %lld elements of %lld", LL(covered),
           LL(elements));
  }
  for (int r = 0; r < m->world; r++) mtopt__bucket_layout_free(&L[r]);
  free(L);
  for (int d = 0; d < MTOPT__NUM_DTYPES; d++) free(count[d]);
}
#endif /* MTOPT_TEST_BUCKET_PLAN_RIG_H */

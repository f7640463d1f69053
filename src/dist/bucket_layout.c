/* The bucket layout (bucket_layout.h): pure arithmetic over the tensor
 * sizes and dtypes, the weights' residues mod 16 bytes and the inner
 * optimizer's chunk facts. */
#include <stdlib.h>
#include <string.h>

#include "../core/internal_api.h"
#include "bucket_layout.h"

#define F32 MTOPT__DT_F32

static int cls_of(const int *gdt, const int *pdt, int64_t i) {
  return (gdt ? gdt[i] : F32) * MTOPT__NUM_DTYPES + (pdt ? pdt[i] : F32);
}

static int by_first_desc(const void *a, const void *b) {
  const int64_t x = ((const mtopt__bucket_t *)a)->first_tensor;
  const int64_t y = ((const mtopt__bucket_t *)b)->first_tensor;
  return (x < y) - (x > y);
}

int mtopt__bucket_group(const int64_t *numel, const int *gdt, const int *pdt, int64_t n,
                        size_t first_bytes, size_t bytes, mtopt__bucket_t *b) {
  int nb = 0;
  for (int c = 0; c < MTOPT__NUM_DTYPES * MTOPT__NUM_DTYPES; c++) {
    int64_t lowest = -1; /* the class's lowest index: its last bucket ends there */
    for (int64_t i = 0; i < n && lowest < 0; i++)
      if (cls_of(gdt, pdt, i) == c) lowest = i;
    if (lowest < 0) continue;
    const int64_t es = mtopt__dt_size(c / MTOPT__NUM_DTYPES);
    int64_t top = -1, acc = 0;
    int first = 1;
    for (int64_t i = n - 1; i >= lowest; i--) {
      if (cls_of(gdt, pdt, i) != c) continue;
      if (top < 0) top = i;
      acc += numel[i] * es;
      const size_t cap = first ? first_bytes : bytes;
      if ((size_t)acc < cap && i != lowest) continue;
      if (b) {
        b[nb].first_tensor = i;
        b[nb].num_tensors = top - i + 1;
        b[nb].gdt = c / MTOPT__NUM_DTYPES;
        b[nb].pdt = c % MTOPT__NUM_DTYPES;
        b[nb].first_of_class = first;
      }
      nb++;
      first = 0;
      top = -1;
      acc = 0;
    }
  }
  if (b) qsort(b, (size_t)nb, sizeof *b, by_first_desc);
  return nb;
}

static int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

static mtopt_status_t oom(mtopt_context_t *ctx, const char *fn) {
  return mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: malloc failed", fn);
}

/* The tensors of bucket k, in index order: i from bucket_begin while
 * i < bucket_end, skipping those of other buckets. */
static int64_t bucket_begin(const mtopt__bucket_layout_t *L, int k) { return L->b[k].first_tensor; }
static int64_t bucket_end(const mtopt__bucket_layout_t *L, int k) {
  return L->b[k].first_tensor + L->b[k].num_tensors;
}
#define FOR_BUCKET_TENSOR(L, k, i)                                             \
  for (int64_t i = bucket_begin(L, k); i < bucket_end(L, k); i++)             \
    if ((L)->tbucket[i] == (k))

/* The offsets of the buffers the layer owns (bucket_layout.h, step 1), and
 * ZeRO-1's slices, shard and staging. */
static void own_offsets(mtopt__bucket_layout_t *L, const void *const *param) {
  const int W = L->world;
  const int64_t pad = L->zero ? 8 * (int64_t)W : 1;
  int64_t off[MTOPT__NUM_DTYPES] = {0, 0, 0}, soff = 0, woff = 0;
  for (int k = 0; k < L->nb; k++) {
    mtopt__bucket_t *b = &L->b[k];
    const int ge = mtopt__dt_size(b->gdt), pe = mtopt__dt_size(b->pdt);
    b->offset = off[b->gdt];
    int64_t end = b->offset;
    FOR_BUCKET_TENSOR(L, k, i) {
      if (L->numel[i] == 0) {
        L->goff[i] = end;
        continue;
      }
      L->goff[i] = mtopt__place(end * ge, ge, param[i], pe) / ge;
      end = L->goff[i] + L->numel[i];
    }
    b->numel = round_up(end - b->offset, pad);
    off[b->gdt] += b->numel;
    if (!L->zero) continue;
    b->slice = b->numel / W;
    b->shard_off = soff;
    b->stage_wide = pe > ge;
    b->stage_off = b->stage_wide ? woff : b->offset * ge;
    if (b->stage_wide) woff += b->numel * pe;
    soff += b->slice * mtopt__dt_size(b->rdt);
  }
  for (int d = 0; d < MTOPT__NUM_DTYPES; d++) L->gbuf_numel[d] = off[d];
  L->shard_bytes = soff;
  L->wide_bytes = woff;
}

/* This rank's pieces: each tensor's part inside the rank's slice of its
 * bucket. */
static void zero1_pieces(mtopt__bucket_layout_t *L) {
  int64_t np = 0;
  for (int k = 0; k < L->nb; k++) {
    mtopt__bucket_t *b = &L->b[k];
    const int64_t s0 = b->offset + (int64_t)L->rank * b->slice, s1 = s0 + b->slice;
    const int64_t re = mtopt__dt_size(b->rdt);
    b->p0 = np;
    FOR_BUCKET_TENSOR(L, k, i) {
      const int64_t lo = L->goff[i] > s0 ? L->goff[i] : s0;
      const int64_t hi = L->goff[i] + L->numel[i] < s1 ? L->goff[i] + L->numel[i] : s1;
      if (hi <= lo) continue;
      L->pieces[np++] =
          (mtopt__piece_t){i, lo - L->goff[i], hi - lo, b->shard_off + (lo - s0) * re};
    }
    b->p1 = np;
  }
  L->npieces = np;
}

mtopt_status_t mtopt__bucket_layout_create(mtopt_context_t *ctx, const char *fn,
                                           const mtopt__bucket_layout_args_t *a,
                                           mtopt__bucket_layout_t *L) {
  memset(L, 0, sizeof *L);
  L->zero = a->zero_stage;
  L->world = a->world;
  L->rank = a->rank;
  L->first_bucket_bytes = a->first_bucket_bytes;
  L->bucket_bytes = a->bucket_bytes;
  L->nt = a->num_tensors;
  const size_t nt1 = (size_t)(L->nt > 0 ? L->nt : 1);
  L->numel = calloc(nt1, sizeof *L->numel);
  L->gdt = calloc(nt1, sizeof *L->gdt);
  L->pdt = calloc(nt1, sizeof *L->pdt);
  L->goff = calloc(nt1, sizeof *L->goff);
  L->tbucket = calloc(nt1, sizeof *L->tbucket);
  L->order = calloc(nt1, sizeof *L->order);
  if (!L->numel || !L->gdt || !L->pdt || !L->goff || !L->tbucket || !L->order)
    return oom(ctx, fn);
  for (int64_t i = 0; i < L->nt; i++) {
    L->numel[i] = a->numel[i];
    L->gdt[i] = a->gdt ? a->gdt[i] : F32;
    L->pdt[i] = a->pdt ? a->pdt[i] : F32;
  }
  L->nb = mtopt__bucket_group(L->numel, L->gdt, L->pdt, L->nt, L->first_bucket_bytes,
                              L->bucket_bytes, NULL);
  L->b = calloc((size_t)(L->nb > 0 ? L->nb : 1), sizeof *L->b);
  if (!L->b) return oom(ctx, fn);
  mtopt__bucket_group(L->numel, L->gdt, L->pdt, L->nt, L->first_bucket_bytes, L->bucket_bytes,
                      L->b);
  for (int k = 0; k < L->nb; k++)
    for (int64_t i = bucket_begin(L, k); i < bucket_end(L, k); i++)
      if (cls_of(L->gdt, L->pdt, i) == cls_of(&L->b[k].gdt, &L->b[k].pdt, 0)) L->tbucket[i] = k;
  int64_t j = 0;
  for (int k = L->nb - 1; k >= 0; k--) FOR_BUCKET_TENSOR(L, k, i) L->order[j++] = i;
  L->own = L->zero;
  for (int k = 0; k < L->nb; k++) {
    mtopt__bucket_t *b = &L->b[k];
    b->rdt = a->reduce_f32 ? F32 : b->gdt;
    if (b->rdt != b->gdt) {
      L->own = 1;
      L->f32_copy[b->gdt] = 1;
    }
  }
  if (!L->own) return MTOPT_STATUS_SUCCESS;
  own_offsets(L, a->param);
  if (!L->zero) return MTOPT_STATUS_SUCCESS;
  /* At most one piece per tensor and bucket boundary. */
  L->pieces = malloc((size_t)(L->nt + L->nb + 1) * sizeof *L->pieces);
  if (!L->pieces) return oom(ctx, fn);
  zero1_pieces(L);
  return MTOPT_STATUS_SUCCESS;
}

void mtopt__bucket_layout_set_grads(mtopt__bucket_layout_t *L, const int64_t *grad_off,
                                    const int64_t *buffer_numel) {
  for (int d = 0; d < MTOPT__NUM_DTYPES; d++) L->gbuf_numel[d] = buffer_numel[d];
  /* The offset of the next non-empty tensor in each buffer, for empty ones:
   * in the chunk order, which the core's buffers follow. */
  int64_t next[MTOPT__NUM_DTYPES] = {0, 0, 0};
  for (int64_t j = 0; j < L->nt; j++) {
    const int64_t i = L->order[j];
    if (L->numel[i] > 0) {
      L->goff[i] = grad_off[i];
      next[L->gdt[i]] = L->goff[i] + L->numel[i];
    } else {
      L->goff[i] = next[L->gdt[i]];
    }
  }
  for (int k = 0; k < L->nb; k++) {
    mtopt__bucket_t *b = &L->b[k];
    int64_t s = -1, e = -1;
    FOR_BUCKET_TENSOR(L, k, i) {
      if (L->numel[i] == 0) continue;
      if (s < 0) s = L->goff[i];
      e = L->goff[i] + L->numel[i];
    }
    b->offset = s < 0 ? L->goff[b->first_tensor] : s;
    b->numel = s < 0 ? 0 : e - s;
  }
}

static int push_segment(mtopt__bucket_layout_t *L, int *cap, mtopt__segment_t s) {
  if (L->ns == *cap) {
    const int grown = *cap * 2;
    mtopt__segment_t *p = grown > *cap ? realloc(L->seg, (size_t)grown * sizeof *p) : NULL;
    if (!p) return 0;
    L->seg = p;
    *cap = grown;
  }
  L->seg[L->ns++] = s;
  return 1;
}

mtopt_status_t mtopt__bucket_layout_segments(mtopt_context_t *ctx, const char *fn,
                                             mtopt__bucket_layout_t *L,
                                             const int64_t *first_chunk,
                                             const int64_t *num_chunks, int64_t total_chunks,
                                             int64_t chunk_size, int64_t min_segment_chunks) {
  /* Each bucket's chunk range: zero_stage 0, its tensors' chunks; 1, its
   * pieces'. */
  for (int k = 0; k < L->nb; k++) {
    mtopt__bucket_t *b = &L->b[k];
    if (L->zero) {
      b->c0 = b->p0 < L->npieces ? first_chunk[b->p0] : total_chunks;
      b->c1 = b->p1 < L->npieces ? first_chunk[b->p1] : total_chunks;
    } else { /* its tensors' chunks, one run in the chunk order */
      b->c0 = b->c1 = -1;
      FOR_BUCKET_TENSOR(L, k, i) {
        if (b->c0 < 0) b->c0 = first_chunk[i];
        b->c1 = first_chunk[i] + num_chunks[i];
      }
    }
  }
  int cap = L->nb > 0 ? L->nb : 1;
  L->seg = malloc((size_t)cap * sizeof *L->seg);
  if (!L->seg) return oom(ctx, fn);
  const int64_t cs = chunk_size;
  for (int k = 0; k < L->nb; k++) {
    mtopt__bucket_t *b = &L->b[k];
    b->s0 = L->ns;
    int64_t off = b->offset, c = b->c0;
    /* floor(numel / size) pieces of about equal size: a bucket just over its
     * size (they all close past it) stays whole; one at k times its size is
     * cut in k. The size is at least min_segment_chunks chunks: a 4 MB piece
     * is 16 blocks of a block-per-chunk pass, too few to fill a GPU, so its
     * step would fall behind the collectives. Each cut is the first chunk
     * start at or past its target. */
    /* The size the grouping closed it at. */
    const size_t bytes = b->first_of_class ? L->first_bucket_bytes : L->bucket_bytes;
    const size_t es = (size_t)mtopt__dt_size(b->gdt);
    int64_t size = bytes / es > 0 ? (int64_t)(bytes / es) : 1;
    if (size < min_segment_chunks * cs) size = min_segment_chunks * cs;
    const int64_t pieces = L->zero ? 1 : b->numel / size;
    int64_t cut = 1;
    FOR_BUCKET_TENSOR(L, k, i) {
      if (pieces <= 1) break;
      for (int64_t j = 0; j < num_chunks[i] && cut < pieces; j++) {
        const int64_t at = L->goff[i] + j * cs; /* chunk j's start in the buffer */
        const int64_t target =
            b->offset + b->numel / pieces * cut + b->numel % pieces * cut / pieces;
        if (at < target || at <= off) continue;
        if (!push_segment(L, &cap, (mtopt__segment_t){k, off, at - off, c, first_chunk[i] + j}))
          return mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: realloc failed", fn);
        off = at;
        c = first_chunk[i] + j;
        cut++;
      }
    }
    if (!push_segment(L, &cap, (mtopt__segment_t){k, off, b->offset + b->numel - off, c, b->c1}))
      return mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: realloc failed", fn);
    b->s1 = L->ns;
  }
  return MTOPT_STATUS_SUCCESS;
}

void mtopt__bucket_layout_free(mtopt__bucket_layout_t *L) {
  free(L->numel);
  free(L->gdt);
  free(L->pdt);
  free(L->order);
  free(L->goff);
  free(L->tbucket);
  free(L->b);
  free(L->seg);
  free(L->pieces);
  memset(L, 0, sizeof *L);
}

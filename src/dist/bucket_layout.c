/* The bucket layout (bucket_layout.h): pure arithmetic over the tensor
 * sizes, the weights' residues mod 16 bytes and the inner optimizer's chunk
 * facts. */
#include <stdlib.h>
#include <string.h>

#include "../core/internal_api.h"
#include "bucket_layout.h"

int mtopt__bucket_group(const int64_t *numel, int64_t n, size_t first_bytes, size_t bytes,
                        mtopt__bucket_t *b) {
  int nb = 0;
  int64_t hi = n, acc = 0;
  for (int64_t i = n - 1; i >= 0; i--) {
    acc += numel[i] * (int64_t)sizeof(float);
    const size_t cap = nb == 0 ? first_bytes : bytes;
    if ((size_t)acc >= cap || i == 0) {
      if (b) {
        b[nb].first_tensor = i;
        b[nb].num_tensors = hi - i;
      }
      nb++;
      hi = i;
      acc = 0;
    }
  }
  return nb;
}

static int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

static mtopt_status_t oom(mtopt_context_t *ctx, const char *fn) {
  return mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: malloc failed", fn);
}

/* ZeRO-1 offsets and slices (bucket_layout.h, step 1). */
static void zero1_offsets(mtopt__bucket_layout_t *L, const void *const *param) {
  const int W = L->world;
  int64_t off = 0, soff = 0;
  for (int k = 0; k < L->nb; k++) {
    mtopt__bucket_t *b = &L->b[k];
    b->offset = off;
    int64_t end = off;
    for (int64_t i = b->first_tensor; i < b->first_tensor + b->num_tensors; i++) {
      if (L->numel[i] == 0) {
        L->goff[i] = end;
        continue;
      }
      L->goff[i] = mtopt__aligned_offset(end, param[i]);
      end = L->goff[i] + L->numel[i];
    }
    b->slice = round_up((end - off + W - 1) / W, 4);
    b->numel = b->slice * W;
    b->shard_off = soff;
    off += b->numel;
    soff += b->slice;
  }
  L->gbuf_numel = off;
  L->shard_numel = soff;
}

/* This rank's pieces: each tensor's part inside the rank's slice of its
 * bucket. */
static void zero1_pieces(mtopt__bucket_layout_t *L) {
  int64_t np = 0;
  for (int k = 0; k < L->nb; k++) {
    mtopt__bucket_t *b = &L->b[k];
    const int64_t s0 = b->offset + (int64_t)L->rank * b->slice, s1 = s0 + b->slice;
    b->p0 = np;
    for (int64_t i = b->first_tensor; i < b->first_tensor + b->num_tensors; i++) {
      const int64_t lo = L->goff[i] > s0 ? L->goff[i] : s0;
      const int64_t hi = L->goff[i] + L->numel[i] < s1 ? L->goff[i] + L->numel[i] : s1;
      if (hi <= lo) continue;
      L->pieces[np++] = (mtopt__piece_t){i, lo - L->goff[i], hi - lo, b->shard_off + (lo - s0)};
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
  L->goff = calloc(nt1, sizeof *L->goff);
  L->tbucket = calloc(nt1, sizeof *L->tbucket);
  if (!L->numel || !L->goff || !L->tbucket) return oom(ctx, fn);
  for (int64_t i = 0; i < L->nt; i++) L->numel[i] = a->numel[i];
  L->nb = mtopt__bucket_group(L->numel, L->nt, L->first_bucket_bytes, L->bucket_bytes, NULL);
  L->b = calloc((size_t)(L->nb > 0 ? L->nb : 1), sizeof *L->b);
  if (!L->b) return oom(ctx, fn);
  mtopt__bucket_group(L->numel, L->nt, L->first_bucket_bytes, L->bucket_bytes, L->b);
  for (int k = 0; k < L->nb; k++)
    for (int64_t i = L->b[k].first_tensor; i < L->b[k].first_tensor + L->b[k].num_tensors; i++)
      L->tbucket[i] = k;
  if (!L->zero) return MTOPT_STATUS_SUCCESS;
  zero1_offsets(L, a->param);
  /* At most one piece per tensor and bucket boundary. */
  L->pieces = malloc((size_t)(L->nt + L->nb + 1) * sizeof *L->pieces);
  if (!L->pieces) return oom(ctx, fn);
  zero1_pieces(L);
  return MTOPT_STATUS_SUCCESS;
}

void mtopt__bucket_layout_set_grads(mtopt__bucket_layout_t *L, const int64_t *grad_off,
                                    int64_t buffer_numel) {
  L->gbuf_numel = buffer_numel;
  int64_t next = 0; /* offset of the next non-empty tensor, for empty ones */
  for (int64_t i = 0; i < L->nt; i++) {
    if (L->numel[i] > 0) {
      L->goff[i] = grad_off[i];
      next = L->goff[i] + L->numel[i];
    } else {
      L->goff[i] = next;
    }
  }
  for (int k = 0; k < L->nb; k++) {
    mtopt__bucket_t *b = &L->b[k];
    const int64_t lo = b->first_tensor, hi = lo + b->num_tensors;
    int64_t s = -1, e = -1;
    for (int64_t i = lo; i < hi; i++) {
      if (L->numel[i] == 0) continue;
      if (s < 0) s = L->goff[i];
      e = L->goff[i] + L->numel[i];
    }
    b->offset = s < 0 ? L->goff[lo] : s;
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
    } else {
      const int64_t hi = b->first_tensor + b->num_tensors;
      b->c0 = first_chunk[b->first_tensor];
      b->c1 = hi < L->nt ? first_chunk[hi] : total_chunks;
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
    const size_t bytes = k == 0 ? L->first_bucket_bytes : L->bucket_bytes;
    int64_t size = bytes / sizeof(float) > 0 ? (int64_t)(bytes / sizeof(float)) : 1;
    if (size < min_segment_chunks * cs) size = min_segment_chunks * cs;
    const int64_t pieces = L->zero ? 1 : b->numel / size;
    for (int64_t i = b->first_tensor, cut = 1; pieces > 1 && i < b->first_tensor + b->num_tensors;
         i++) {
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
  free(L->goff);
  free(L->tbucket);
  free(L->b);
  free(L->seg);
  free(L->pieces);
  memset(L, 0, sizeof *L);
}

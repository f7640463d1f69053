/* The distributed optimizer's bucket layout (src/dist/bucket_layout.h), as
 * pure code: random tensor lists (odd sizes, empty tensors, weights at every
 * residue mod 16 bytes) laid out at 1-8 ranks, every rank's layout checked
 * against the invariants, plus cases computed by hand. No MPI, no optimizer:
 * the chunk facts come from the core's chunk planner, the zero_stage 0
 * gradient offsets from the core's layout rule (mtopt__aligned_offset in
 * registration order). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "dist/bucket_layout.h"
#include "test_util.h"

/* Weights at residue r (floats) mod 16 bytes: arena + r. */
_Alignas(16) static float arena[8];

static int residue(const void *p) { return (int)(((uintptr_t)p / sizeof(float)) & 3u); }

/* Context of a failure: the case being checked. */
static char g_case[160];
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
  size_t first_bytes, bytes;
  int zero, world;
  int64_t cs, min_chunks;
} model_t;

/* Steps 1-3 of bucket_layout.h for one rank, with the chunk facts of the
 * inner tensors (the list's, or the rank's pieces) from mtopt__chunk_table
 * and, with zero_stage 0, the core's gradient offsets. Returns the inner
 * tensors' first chunks (the caller frees them) and *total the chunk count. */
static int64_t *lay_out(const model_t *m, int rank, mtopt__bucket_layout_t *L, int64_t *total) {
  const mtopt__bucket_layout_args_t a = {m->n, m->numel, m->param, m->first_bytes, m->bytes,
                                         m->zero, m->world, rank};
  TU_OK(mtopt__bucket_layout_create(NULL, "test", &a, L));
  const int64_t ni = m->zero ? L->npieces : m->n;
  int64_t *len = malloc((size_t)(ni + 1) * sizeof *len);
  int64_t *first = malloc((size_t)(ni + 1) * sizeof *first);
  int64_t *count = malloc((size_t)(ni + 1) * sizeof *count);
  for (int64_t i = 0; i < ni; i++) len[i] = m->zero ? L->pieces[i].len : m->numel[i];
  *total = mtopt__chunk_table(len, ni, m->cs, first, count, NULL);
  ck_assert_int_ge(*total, 0);
  if (!m->zero) {
    int64_t *off = malloc((size_t)(m->n + 1) * sizeof *off), at = 0;
    for (int64_t i = 0; i < m->n; i++) {
      off[i] = -1; /* never read for an empty tensor */
      if (m->numel[i] == 0) continue;
      off[i] = mtopt__aligned_offset(at, m->param[i]);
      at = off[i] + m->numel[i];
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

/* Buckets: every tensor exactly once, in reverse order; a bucket closes once
 * it reaches its size, and not before. */
static void check_buckets(const model_t *m, const mtopt__bucket_layout_t *L) {
  EXPECT(L->nt == m->n, "nt %lld", (long long)L->nt);
  EXPECT((L->nb > 0) == (m->n > 0), "%d buckets for %lld tensors", L->nb, (long long)m->n);
  EXPECT(mtopt__bucket_group(m->numel, m->n, m->first_bytes, m->bytes, NULL) == L->nb,
         "the count differs from the layout's");
  int64_t expect_end = m->n;
  for (int k = 0; k < L->nb; k++) {
    const mtopt__bucket_t *b = &L->b[k];
    EXPECT(b->num_tensors >= 1, "bucket %d is empty", k);
    EXPECT(b->first_tensor + b->num_tensors == expect_end, "bucket %d ends at %lld, not %lld", k,
           (long long)(b->first_tensor + b->num_tensors), (long long)expect_end);
    expect_end = b->first_tensor;
    int64_t bytes = 0;
    for (int64_t i = b->first_tensor; i < b->first_tensor + b->num_tensors; i++) {
      bytes += 4 * m->numel[i];
      EXPECT(L->tbucket[i] == k, "tensor %lld in bucket %d, not %d", (long long)i, L->tbucket[i],
             k);
    }
    const int64_t cap = (int64_t)(k == 0 ? m->first_bytes : m->bytes);
    EXPECT(bytes >= cap || b->first_tensor == 0, "bucket %d closed at %lld bytes < %lld", k,
           (long long)bytes, (long long)cap);
    EXPECT(bytes - 4 * m->numel[b->first_tensor] < cap, "bucket %d reached %lld bytes earlier", k,
           (long long)cap);
  }
  EXPECT(expect_end == 0, "the buckets stop at tensor %lld", (long long)expect_end);
}

/* Gradient offsets: the weights' residue mod 16 bytes, inside their bucket's
 * range, no overlap, at most 3 elements of padding before each; buckets in
 * the buffer without overlap (ZeRO-1: one after another, in bucket order). */
static void check_offsets(const model_t *m, const mtopt__bucket_layout_t *L) {
  int64_t zero1_next = 0, shard_next = 0;
  for (int k = 0; k < L->nb; k++) {
    const mtopt__bucket_t *b = &L->b[k];
    EXPECT(b->offset >= 0 && b->numel >= 0 && b->offset + b->numel <= L->gbuf_numel,
           "bucket %d [%lld, +%lld) outside the buffer of %lld", k, (long long)b->offset,
           (long long)b->numel, (long long)L->gbuf_numel);
    if (m->zero) {
      EXPECT(b->offset == zero1_next, "bucket %d at %lld, not %lld", k, (long long)b->offset,
             (long long)zero1_next);
      zero1_next += b->numel;
      EXPECT(b->shard_off == shard_next, "bucket %d's slice at %lld in the shard", k,
             (long long)b->shard_off);
      shard_next += b->slice;
    } else if (k > 0) { /* registration order: bucket k lies before k - 1 */
      EXPECT(b->offset + b->numel <= L->b[k - 1].offset, "buckets %d and %d overlap", k, k - 1);
    }
    int64_t prev_end = m->zero ? b->offset : -1, used_end = b->offset;
    for (int64_t i = b->first_tensor; i < b->first_tensor + b->num_tensors; i++) {
      if (m->numel[i] == 0) {
        /* The end of the non-empty tensor before it (zero_stage 0: in the
         * buffer, 0 if none; ZeRO-1: in its bucket, else the bucket's start). */
        int64_t want = m->zero ? b->offset : 0;
        for (int64_t j = i - 1; j >= (m->zero ? b->first_tensor : 0); j--)
          if (m->numel[j] > 0) {
            want = L->goff[j] + m->numel[j];
            break;
          }
        EXPECT(L->goff[i] == want, "empty tensor %lld at %lld, not %lld", (long long)i,
               (long long)L->goff[i], (long long)want);
        continue;
      }
      const int64_t g = L->goff[i];
      EXPECT((g & 3) == residue(m->param[i]), "tensor %lld at %lld, weights at residue %d",
             (long long)i, (long long)g, residue(m->param[i]));
      EXPECT(g >= b->offset && g + m->numel[i] <= b->offset + b->numel,
             "tensor %lld [%lld, +%lld) outside bucket %d [%lld, +%lld)", (long long)i,
             (long long)g, (long long)m->numel[i], k, (long long)b->offset, (long long)b->numel);
      if (prev_end >= 0)
        EXPECT(g >= prev_end && g - prev_end <= 3, "tensor %lld at %lld after an end at %lld",
               (long long)i, (long long)g, (long long)prev_end);
      prev_end = used_end = g + m->numel[i];
    }
    if (m->zero) {
      /* Equal slices, multiples of 4 elements, the smallest that hold the
       * bucket's tensors. */
      const int64_t used = used_end - b->offset;
      EXPECT(b->slice % 4 == 0 && b->numel == b->slice * m->world,
             "bucket %d: slice %lld, numel %lld", k, (long long)b->slice, (long long)b->numel);
      EXPECT(b->numel >= used && (b->slice == 0 || (b->slice - 4) * m->world < used),
             "bucket %d: slice %lld for %lld elements at %d ranks", k, (long long)b->slice,
             (long long)used, m->world);
    } else {
      EXPECT(b->numel == (used_end - b->offset), "bucket %d: %lld elements, tensors end at +%lld",
             k, (long long)b->numel, (long long)(used_end - b->offset));
    }
  }
  if (m->zero) {
    EXPECT(L->gbuf_numel == zero1_next, "buffer %lld, buckets %lld", (long long)L->gbuf_numel,
           (long long)zero1_next);
    EXPECT(L->shard_numel == shard_next, "shard %lld, slices %lld", (long long)L->shard_numel,
           (long long)shard_next);
  }
}

/* One rank's ZeRO-1 pieces: bucket by bucket, each inside the rank's slice
 * of its bucket, its shard position where the slice puts it; *count gains 1
 * per element covered. */
static void check_pieces(const mtopt__bucket_layout_t *L, int rank, int *count) {
  int64_t next = 0;
  for (int k = 0; k < L->nb; k++) {
    const mtopt__bucket_t *b = &L->b[k];
    EXPECT(b->p0 == next && b->p1 >= b->p0, "bucket %d: pieces [%lld, %lld) after %lld", k,
           (long long)b->p0, (long long)b->p1, (long long)next);
    next = b->p1;
    const int64_t s0 = b->offset + (int64_t)rank * b->slice;
    int64_t prev = -1;
    for (int64_t p = b->p0; p < b->p1; p++) {
      const mtopt__piece_t *q = &L->pieces[p];
      EXPECT(q->tensor >= b->first_tensor && q->tensor < b->first_tensor + b->num_tensors &&
                 q->tensor > prev,
             "rank %d: piece %lld of tensor %lld in bucket %d", rank, (long long)p,
             (long long)q->tensor, k);
      prev = q->tensor;
      EXPECT(q->start >= 0 && q->len >= 1 && q->start + q->len <= L->numel[q->tensor],
             "rank %d: piece %lld [%lld, +%lld) of a tensor of %lld", rank, (long long)p,
             (long long)q->start, (long long)q->len, (long long)L->numel[q->tensor]);
      const int64_t at = L->goff[q->tensor] + q->start;
      EXPECT(at >= s0 && at + q->len <= s0 + b->slice, "rank %d: piece %lld outside its slice",
             rank, (long long)p);
      EXPECT(q->shard_pos == b->shard_off + (at - s0), "rank %d: piece %lld at shard %lld", rank,
             (long long)p, (long long)q->shard_pos);
      for (int64_t j = 0; j < q->len; j++) count[at + j]++;
    }
  }
  EXPECT(next == L->npieces, "%lld pieces, %lld in buckets", (long long)L->npieces,
         (long long)next);
}

/* Segments: each bucket's chunk range and element range tiled in order,
 * cuts at chunk starts; zero_stage 0: floor(numel / size) segments of about
 * equal size (size: the bucket's bytes in floats, at least min_chunks
 * chunks); ZeRO-1: the bucket. */
static void check_segments(const model_t *m, const mtopt__bucket_layout_t *L,
                           const int64_t *first_chunk, int64_t total_chunks) {
  const int64_t cs = m->cs;
  int s = 0;
  for (int k = 0; k < L->nb; k++) {
    const mtopt__bucket_t *b = &L->b[k];
    /* The table follows the inner tensors: zero_stage 0, registration order
     * (bucket 0 last); ZeRO-1, the pieces in bucket order. */
    const int adjacent = m->zero ? b->c0 == (k == 0 ? 0 : L->b[k - 1].c1)
                                 : b->c1 == (k == 0 ? total_chunks : L->b[k - 1].c0);
    EXPECT(adjacent && b->c1 >= b->c0, "bucket %d: chunks [%lld, %lld)", k, (long long)b->c0,
           (long long)b->c1);
    /* Its first tensor's first chunk (ZeRO-1: its first piece's). */
    const int64_t want_c0 = !m->zero             ? first_chunk[b->first_tensor]
                            : b->p0 < L->npieces ? first_chunk[b->p0]
                                                 : total_chunks;
    EXPECT(b->c0 == want_c0, "bucket %d starts at chunk %lld, not %lld", k, (long long)b->c0,
           (long long)want_c0);
    EXPECT(b->s0 == s && b->s1 > b->s0, "bucket %d: segments [%d, %d) after %d", k, b->s0,
           b->s1, s);
    s = b->s1;
    if (m->zero) {
      const mtopt__segment_t *g = &L->seg[b->s0];
      EXPECT(b->s1 == b->s0 + 1 && g->bucket == k && g->offset == b->offset &&
                 g->numel == b->numel && g->c0 == b->c0 && g->c1 == b->c1,
             "bucket %d's segment is not the bucket", k);
      continue;
    }
    /* The bucket's chunk starts in the buffer, and the widest gap between
     * two (or from the last to the end). */
    int64_t gap = 0, last = b->offset;
    for (int64_t i = b->first_tensor; i < b->first_tensor + b->num_tensors; i++)
      for (int64_t j = 0; j * cs < m->numel[i]; j++) {
        const int64_t at = L->goff[i] + j * cs;
        if (at - last > gap) gap = at - last;
        last = at;
      }
    if (b->offset + b->numel - last > gap) gap = b->offset + b->numel - last;
    const int64_t bytes = (int64_t)(k == 0 ? m->first_bytes : m->bytes);
    int64_t size = bytes / 4 > 0 ? bytes / 4 : 1;
    if (size < m->min_chunks * cs) size = m->min_chunks * cs;
    const int64_t pieces = b->numel / size > 1 ? b->numel / size : 1;
    const int64_t q = b->numel / pieces, count = b->s1 - b->s0;
    EXPECT(count <= pieces, "bucket %d: %lld segments, at most %lld", k, (long long)count,
           (long long)pieces);
    /* Enough chunk starts between two targets: every cut is made. */
    if (q >= gap)
      EXPECT(count == pieces, "bucket %d (%lld elements, size %lld, gap %lld): %lld segments", k,
             (long long)b->numel, (long long)size, (long long)gap, (long long)count);
    int64_t off = b->offset, c = b->c0;
    for (int j = b->s0; j < b->s1; j++) {
      const mtopt__segment_t *g = &L->seg[j];
      EXPECT(g->bucket == k && g->offset == off && g->c0 == c, "segment %d does not follow on", j);
      EXPECT(g->numel >= (b->numel > 0) && g->c1 >= g->c0, "segment %d: %lld elements", j,
             (long long)g->numel);
      if (count == pieces && count > 1)
        EXPECT(g->numel > q - gap && g->numel < q + 1 + gap,
               "segment %d: %lld elements, %lld +- %lld expected", j, (long long)g->numel,
               (long long)q, (long long)gap);
      if (j > b->s0) { /* a cut: the start of a chunk of one of the bucket's tensors */
        int found = 0;
        for (int64_t i = b->first_tensor; i < b->first_tensor + b->num_tensors && !found; i++) {
          const int64_t rel = g->offset - L->goff[i];
          if (m->numel[i] > 0 && rel >= 0 && rel < m->numel[i] && rel % cs == 0)
            found = g->c0 == first_chunk[i] + rel / cs;
        }
        EXPECT(found, "segment %d cut at %lld, chunk %lld: not a chunk start", j,
               (long long)g->offset, (long long)g->c0);
      }
      off += g->numel;
      c = g->c1;
    }
    EXPECT(off == b->offset + b->numel && c == b->c1,
           "bucket %d's segments end at %lld, chunk %lld", k, (long long)off, (long long)c);
  }
  EXPECT(s == L->ns, "%d segments, %d in buckets", L->ns, s);
  if (L->nb > 0) {
    const mtopt__bucket_t *z = &L->b[L->nb - 1];
    EXPECT(m->zero ? z->c1 == total_chunks : z->c0 == 0, "the last bucket's chunks: [%lld, %lld)",
           (long long)z->c0, (long long)z->c1);
  }
}

/* Lays the model out at every rank and checks each rank's layout, the ranks'
 * agreement, and that their pieces tile every bucket's tensors exactly. */
static void check_model(const model_t *m) {
  mtopt__bucket_layout_t *L = calloc((size_t)m->world, sizeof *L);
  int *count = NULL;
  for (int r = 0; r < m->world; r++) {
    int64_t total = 0;
    int64_t *first = lay_out(m, r, &L[r], &total);
    check_buckets(m, &L[r]);
    check_offsets(m, &L[r]);
    check_segments(m, &L[r], first, total);
    free(first);
    if (m->zero) {
      if (!count) count = calloc((size_t)(L[0].gbuf_numel + 1), sizeof *count);
      check_pieces(&L[r], r, count);
    }
    /* Every rank has the same buckets and offsets (rank agreement). */
    EXPECT(L[r].nb == L[0].nb && L[r].gbuf_numel == L[0].gbuf_numel, "rank %d differs", r);
    for (int k = 0; k < L[r].nb; k++)
      EXPECT(L[r].b[k].offset == L[0].b[k].offset && L[r].b[k].numel == L[0].b[k].numel,
             "rank %d: bucket %d differs", r, k);
    for (int64_t i = 0; i < m->n; i++)
      EXPECT(L[r].goff[i] == L[0].goff[i], "rank %d: tensor %lld's offset differs", r,
             (long long)i);
  }
  if (m->zero) {
    /* Once per tensor element, never on padding. */
    int64_t covered = 0, elements = 0;
    for (int64_t i = 0; i < m->n; i++) {
      elements += m->numel[i];
      for (int64_t j = 0; j < m->numel[i]; j++)
        EXPECT(count[L[0].goff[i] + j] == 1, "tensor %lld element %lld in %d pieces",
               (long long)i, (long long)j, count[L[0].goff[i] + j]);
    }
    for (int64_t e = 0; e < L[0].gbuf_numel; e++) covered += count[e];
    EXPECT(covered == elements, "the pieces cover %lld elements of %lld", (long long)covered,
           (long long)elements);
  }
  for (int r = 0; r < m->world; r++) mtopt__bucket_layout_free(&L[r]);
  free(L);
  free(count);
}

START_TEST(test_random_layouts) {
  tu_rng_t rng;
  const uint64_t seed = tu_seed() + 7919u * (uint64_t)_i;
  tu_rng_init(&rng, seed);
  model_t m;
  m.n = tu_int(&rng, 1, _i % 3 ? 60 : 400);
  m.cs = 4 * tu_int(&rng, 1, 16);
  m.numel = malloc((size_t)m.n * sizeof *m.numel);
  m.param = malloc((size_t)m.n * sizeof *m.param);
  int64_t total = 0;
  for (int64_t i = 0; i < m.n; i++) {
    switch (tu_int(&rng, 0, 7)) {
    case 0: m.numel[i] = 0; break;
    case 1: m.numel[i] = tu_int(&rng, 1, 3); break;
    case 2: m.numel[i] = m.cs + tu_int(&rng, -1, 1); break;
    case 3: m.numel[i] = tu_int(&rng, 10, 40) * m.cs + tu_int(&rng, 0, m.cs); break;
    default: m.numel[i] = tu_int(&rng, 1, 3 * m.cs + 7); break;
    }
    m.param[i] = arena + tu_int(&rng, 0, 3);
    total += m.numel[i];
  }
  /* Buckets from a few tensors' worth to the whole model; segments of one to
   * a few chunks, so that large buckets are cut. */
  m.bytes = (size_t)(4 * tu_int(&rng, 1, total / 3 + 2));
  m.first_bytes = (size_t)(tu_int(&rng, 0, 3) == 0 ? 1 : 4 * tu_int(&rng, 1, total / 5 + 2));
  m.zero = _i % 2;
  m.world = (int)tu_int(&rng, 1, 8);
  m.min_chunks = tu_int(&rng, 1, 4);
  snprintf(g_case, sizeof g_case,
           "seed %llu: %lld tensors, chunk %lld, buckets %zu / %zu bytes, zero %d, world %d, "
           "min %lld chunks",
           (unsigned long long)seed, (long long)m.n, (long long)m.cs, m.first_bytes, m.bytes,
           m.zero, m.world, (long long)m.min_chunks);
  check_model(&m);
  free(m.numel);
  free(m.param);
}
END_TEST

/* Buckets by hand: mtopt__bucket_group's buckets are want[k] = {first
 * tensor, count}. */
static void expect_buckets(const int64_t *numel, int64_t n, size_t first_bytes, size_t bytes,
                           const int64_t (*want)[2], int nb) {
  mtopt__bucket_t b[8];
  ck_assert_int_eq(mtopt__bucket_group(numel, n, first_bytes, bytes, b), nb);
  for (int k = 0; k < nb; k++) {
    ck_assert_int_eq(b[k].first_tensor, want[k][0]);
    ck_assert_int_eq(b[k].num_tensors, want[k][1]);
  }
}

START_TEST(test_hand_buckets) {
  snprintf(g_case, sizeof g_case, "hand buckets");
  /* Sizes 10, 20, 30, 40 floats, the first bucket closing at 100 bytes, the
   * others at 200: 160 >= 100: {3}; 120, then 200 >= 200: {1, 2}; the rest:
   * {0}. */
  const int64_t numel[] = {10, 20, 30, 40};
  expect_buckets(numel, 4, 100, 200, (const int64_t[][2]){{3, 1}, {1, 2}, {0, 1}}, 3);
  /* A bucket that reaches its size exactly closes. */
  const int64_t exact[] = {1, 25};
  expect_buckets(exact, 2, 100, 1000, (const int64_t[][2]){{1, 1}, {0, 1}}, 2);
  /* Empty tensors: {1, 2} closes at tensor 1's 20 bytes; tensor 0 alone,
   * empty, is the last bucket. */
  const int64_t empty[] = {0, 5, 0};
  expect_buckets(empty, 3, 4, 4, (const int64_t[][2]){{1, 2}, {0, 1}}, 2);
  ck_assert_int_eq(mtopt__bucket_group(NULL, 0, 4, 4, NULL), 0);
}
END_TEST

/* ZeRO-1 by hand, 2 ranks, the model above with weights at residues 0, 2, 3, 1
 * (floats mod 4): offsets, slices and rank 1's pieces. */
START_TEST(test_hand_zero1) {
  snprintf(g_case, sizeof g_case, "hand zero1");
  int64_t numel[] = {10, 20, 30, 40};
  const void *param[] = {arena + 0, arena + 2, arena + 3, arena + 1};
  const mtopt__bucket_layout_args_t a = {4, numel, param, 100, 200, 1, 2, 1};
  mtopt__bucket_layout_t L;
  TU_OK(mtopt__bucket_layout_create(NULL, "test", &a, &L));
  ck_assert_int_eq(L.nb, 3);
  /* Bucket 0 {3}: tensor 3 at 1 (residue 1), ends at 41: slice
   * round_up(ceil(41 / 2), 4) = 24, bucket [0, 48). */
  ck_assert_int_eq(L.goff[3], 1);
  ck_assert_int_eq(L.b[0].slice, 24);
  ck_assert_int_eq(L.b[0].numel, 48);
  /* Bucket 1 {1, 2} at 48: tensor 1 at 50 (residue 2) to 70, tensor 2 at 71
   * (residue 3) to 101: 53 elements, slice 28, [48, 104). */
  ck_assert_int_eq(L.b[1].offset, 48);
  ck_assert_int_eq(L.goff[1], 50);
  ck_assert_int_eq(L.goff[2], 71);
  ck_assert_int_eq(L.b[1].slice, 28);
  /* Bucket 2 {0} at 104: 10 elements, slice 8, [104, 120). */
  ck_assert_int_eq(L.goff[0], 104);
  ck_assert_int_eq(L.b[2].slice, 8);
  ck_assert_int_eq(L.gbuf_numel, 120);
  ck_assert_int_eq(L.shard_numel, 24 + 28 + 8);
  /* Rank 1's slices: [24, 48), [76, 104), [112, 120). */
  const mtopt__piece_t want[] = {{3, 23, 17, 0}, {2, 5, 25, 24}, {0, 8, 2, 52}};
  ck_assert_int_eq(L.npieces, 3);
  for (int p = 0; p < 3; p++) {
    ck_assert_int_eq(L.pieces[p].tensor, want[p].tensor);
    ck_assert_int_eq(L.pieces[p].start, want[p].start);
    ck_assert_int_eq(L.pieces[p].len, want[p].len);
    ck_assert_int_eq(L.pieces[p].shard_pos, want[p].shard_pos);
  }
  ck_assert_int_eq(L.b[1].p0, 1);
  ck_assert_int_eq(L.b[1].p1, 2);
  mtopt__bucket_layout_free(&L);
  /* The same model through every check, at 1-5 ranks. */
  model_t m = {4, numel, param, 100, 200, 1, 1, 8, 1};
  for (m.world = 1; m.world <= 5; m.world++) check_model(&m);
}
END_TEST

/* Segments by hand (zero_stage 0, weights at residue 0). */
START_TEST(test_hand_segments) {
  snprintf(g_case, sizeof g_case, "hand segments");
  const void *param[] = {arena, arena};
  struct {
    int64_t n, numel[2];
    size_t bytes;
    int64_t cs, min_chunks;
    int ns;
    int64_t offset[4], c0[4];
  } const cases[] = {
      /* 1000 elements at size 250: 4 segments, targets 250, 500, 750, cut at
       * the chunk starts at or past them. */
      {1, {1000, 0}, 1000, 100, 1, 4, {0, 300, 500, 800}, {0, 3, 5, 8}},
      /* At least 3 chunks: size 300, 3 segments, targets 333, 666. */
      {1, {1000, 0}, 1000, 100, 3, 3, {0, 400, 700}, {0, 4, 7}},
      /* The remainder spread over the cuts: 902 = 3 * 300 + 2 at size 300,
       * targets 300 and 600 + 4 / 3 = 601, chunks of 4. */
      {1, {902, 0}, 1200, 4, 1, 3, {0, 300, 604}, {0, 75, 151}},
      /* Under twice the size: whole. */
      {1, {499, 0}, 1000, 100, 1, 1, {0}, {0}},
      /* Two tensors of 150 (the second at 152, residue 0) in one bucket of
       * 302 elements, size 151: the cut is tensor 1's first chunk. */
      {2, {150, 150}, 604, 100, 1, 2, {0, 152}, {0, 2}},
  };
  for (size_t t = 0; t < sizeof cases / sizeof *cases; t++) {
    int64_t numel[2] = {cases[t].numel[0], cases[t].numel[1]};
    const mtopt__bucket_layout_args_t a = {cases[t].n, numel, param, cases[t].bytes,
                                           cases[t].bytes, 0, 1, 0};
    mtopt__bucket_layout_t L;
    TU_OK(mtopt__bucket_layout_create(NULL, "test", &a, &L));
    ck_assert_int_eq(L.nb, 1);
    const int64_t off[2] = {0, 152};
    mtopt__bucket_layout_set_grads(&L, off, cases[t].n == 1 ? numel[0] : 302);
    int64_t first[2], count[2];
    const int64_t cs = cases[t].cs;
    const int64_t total = mtopt__chunk_table(numel, cases[t].n, cs, first, count, NULL);
    TU_OK(mtopt__bucket_layout_segments(NULL, "test", &L, first, count, total, cs,
                                        cases[t].min_chunks));
    ck_assert_int_eq(L.ns, cases[t].ns);
    for (int s = 0; s < L.ns; s++) {
      ck_assert_int_eq(L.seg[s].offset, cases[t].offset[s]);
      ck_assert_int_eq(L.seg[s].c0, cases[t].c0[s]);
    }
    ck_assert_int_eq(L.seg[L.ns - 1].offset + L.seg[L.ns - 1].numel, L.b[0].numel);
    ck_assert_int_eq(L.seg[L.ns - 1].c1, total);
    mtopt__bucket_layout_free(&L);
  }
}
END_TEST

Suite *bucket_plan_suite(void) {
  Suite *s = suite_create("bucket_plan");
  TCase *tc = tcase_create("core");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_hand_buckets);
  tcase_add_test(tc, test_hand_zero1);
  tcase_add_test(tc, test_hand_segments);
  tcase_add_loop_test(tc, test_random_layouts, 0, 40);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(bucket_plan_suite(), 0); }

/* The distributed optimizer's bucket layout (src/dist/bucket_layout.h), as
 * pure code: random tensor lists (odd sizes, empty tensors, weights at every
 * residue mod 16 bytes, one class or several: gradient and parameter dtypes
 * of F32, F16 and BF16) laid out at 1-8 ranks, every rank's layout checked
 * against the invariants (bucket_plan_rig.h), plus cases computed by hand.
 * No MPI, no optimizer: the chunk facts come from the core's chunk planner,
 * the zero_stage 0 gradient offsets from the core's layout rule
 * (mtopt__place per gradient dtype in the layout's order). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bucket_plan_rig.h"
#include "common/dtype.h"
#include "core/core.h"

enum { F32 = MTOPT__DT_F32, F16 = MTOPT__DT_F16, BF16 = MTOPT__DT_BF16 };
#define CLS(g, p) ((g) * MTOPT__NUM_DTYPES + (p))

/* The classes a random model draws from, by mode: 0 all F32 (dtypes NULL
 * or F32 arrays), 1 all BF16, 2 two to five of the nine classes, 3 the four
 * of F32 and BF16: F32 weights of BF16 gradients (staged wide) and BF16
 * weights of F32 gradients among them. */
static int palette(tu_rng_t *rng, int mode, int *cls) {
  static const int fb[] = {CLS(F32, F32), CLS(BF16, BF16), CLS(BF16, F32), CLS(F32, BF16)};
  switch (mode) {
  case 0: cls[0] = CLS(F32, F32); return 1;
  case 1: cls[0] = CLS(BF16, BF16); return 1;
  case 2: {
    const int n = (int)tu_int(rng, 2, 5);
    for (int j = 0; j < n; j++) cls[j] = (int)tu_int(rng, 0, CLS(BF16, BF16));
    return n;
  }
  default: memcpy(cls, fb, sizeof fb); return 4;
  }
}

START_TEST(test_random_layouts) {
  tu_rng_t rng;
  const uint64_t seed = tu_seed() + 7919u * (uint64_t)_i;
  tu_rng_init(&rng, seed);
  const int mode = (_i / 2) % 4;
  int cls[5];
  const int ncls = palette(&rng, mode, cls);
  model_t m = {0};
  m.n = tu_int(&rng, 1, _i % 3 ? 60 : 400);
  m.cs = 4 * tu_int(&rng, 1, 16);
  m.numel = malloc((size_t)m.n * sizeof *m.numel);
  m.param = malloc((size_t)m.n * sizeof *m.param);
  int *gdt = malloc((size_t)m.n * sizeof *gdt), *pdt = malloc((size_t)m.n * sizeof *pdt);
  int64_t gbytes = 0;
  for (int64_t i = 0; i < m.n; i++) {
    switch (tu_int(&rng, 0, 7)) {
    case 0: m.numel[i] = 0; break;
    case 1: m.numel[i] = tu_int(&rng, 1, 3); break;
    case 2: m.numel[i] = m.cs + tu_int(&rng, -1, 1); break;
    case 3: m.numel[i] = tu_int(&rng, 10, 40) * m.cs + tu_int(&rng, 0, m.cs); break;
    default: m.numel[i] = tu_int(&rng, 1, 3 * m.cs + 7); break;
    }
    const int c = cls[tu_int(&rng, 0, ncls - 1)];
    gdt[i] = c / MTOPT__NUM_DTYPES;
    pdt[i] = c % MTOPT__NUM_DTYPES;
    m.param[i] = pdt[i] == F32 ? (const void *)(arena + tu_int(&rng, 0, 3))
                               : (const void *)(arena16 + tu_int(&rng, 0, 7));
    gbytes += m.numel[i] * mtopt__dt_size(gdt[i]);
  }
  const int null_dtypes = mode == 0 && tu_int(&rng, 0, 1);
  m.gdt = null_dtypes ? NULL : gdt;
  m.pdt = null_dtypes ? NULL : pdt;
  /* Buckets from a few tensors' worth to the whole model (any byte count);
   * segments of one to a few chunks, so that large buckets are cut. */
  m.bytes = (size_t)tu_int(&rng, 1, gbytes / 3 + 8);
  m.first_bytes = (size_t)(tu_int(&rng, 0, 3) == 0 ? 1 : tu_int(&rng, 1, gbytes / 5 + 8));
  m.zero = _i % 2;
  m.world = (int)tu_int(&rng, 1, 8);
  m.min_chunks = tu_int(&rng, 1, 4);
  snprintf(g_case, sizeof g_case,
           "seed %llu: %lld tensors, classes mode %d (%d%s), chunk %lld, buckets %zu / %zu "
           "bytes, zero %d, world %d, min %lld chunks",
           (unsigned long long)seed, (long long)m.n, mode, ncls, null_dtypes ? ", NULL" : "",
           (long long)m.cs, m.first_bytes, m.bytes, m.zero, m.world, (long long)m.min_chunks);
  bp_check_model(&m);
  free(m.numel);
  free(m.param);
  free(gdt);
  free(pdt);
}
END_TEST

/* Buckets by hand: mtopt__bucket_group's buckets are want[k] = {first
 * tensor, count, gradient dtype}. */
static void expect_buckets(const int64_t *numel, const int *dt, int64_t n, size_t first_bytes,
                           size_t bytes, const int64_t (*want)[3], int nb) {
  mtopt__bucket_t b[8];
  ck_assert_int_eq(mtopt__bucket_group(numel, dt, dt, n, first_bytes, bytes, b), nb);
  for (int k = 0; k < nb; k++) {
    ck_assert_int_eq(b[k].first_tensor, want[k][0]);
    ck_assert_int_eq(b[k].num_tensors, want[k][1]);
    ck_assert_int_eq(b[k].gdt, want[k][2]);
    ck_assert_int_eq(b[k].pdt, want[k][2]);
  }
}

START_TEST(test_hand_buckets) {
  snprintf(g_case, sizeof g_case, "hand buckets");
  /* Sizes 10, 20, 30, 40 floats, the first bucket closing at 100 bytes, the
   * others at 200: 160 >= 100: {3}; 120, then 200 >= 200: {1, 2}; the rest:
   * {0}. */
  const int64_t numel[] = {10, 20, 30, 40};
  expect_buckets(numel, NULL, 4, 100, 200, (const int64_t[][3]){{3, 1}, {1, 2}, {0, 1}}, 3);
  /* A bucket that reaches its size exactly closes. */
  const int64_t exact[] = {1, 25};
  expect_buckets(exact, NULL, 2, 100, 1000, (const int64_t[][3]){{1, 1}, {0, 1}}, 2);
  /* Empty tensors: {1, 2} closes at tensor 1's 20 bytes; tensor 0 alone,
   * empty, is the last bucket. */
  const int64_t empty[] = {0, 5, 0};
  expect_buckets(empty, NULL, 3, 4, 4, (const int64_t[][3]){{1, 2}, {0, 1}}, 2);
  ck_assert_int_eq(mtopt__bucket_group(NULL, NULL, NULL, 0, 4, 4, NULL), 0);
  /* Two classes, F32 (tensors 0, 2) and BF16 (1, 3), sizes in gradient
   * bytes: F32 40, BF16 40, F32 120, BF16 80. At 100 / 100: F32 closes at
   * tensor 2 (120), then tensor 0, its lowest; BF16 has 80 < 100 at tensor
   * 3 (it would have 160 at 4 bytes an element) and closes at tensor 1, its
   * lowest, with 120: a span [1, 4) over F32 tensor 2. By first tensor:
   * {2}, {1, 3}, {0}. */
  const int dt[] = {F32, BF16, F32, BF16};
  expect_buckets(numel, dt, 4, 100, 100,
                 (const int64_t[][3]){{2, 1, F32}, {1, 3, BF16}, {0, 1, F32}}, 3);
  /* At 80 / 1000 each class's first bucket closes at 80 bytes: BF16 at
   * tensor 3 (exactly 80), F32 at tensor 2; each class's rest after. */
  expect_buckets(numel, dt, 4, 80, 1000,
                 (const int64_t[][3]){{3, 1, BF16}, {2, 1, F32}, {1, 1, BF16}, {0, 1, F32}}, 4);
}
END_TEST

/* ZeRO-1 by hand, 2 ranks, the F32 model above with weights at residues 0,
 * 2, 3, 1 (floats mod 4): offsets, slices and rank 1's pieces. */
START_TEST(test_hand_zero1) {
  snprintf(g_case, sizeof g_case, "hand zero1");
  int64_t numel[] = {10, 20, 30, 40};
  const void *param[] = {arena + 0, arena + 2, arena + 3, arena + 1};
  const mtopt__bucket_layout_args_t a = {4, numel, param, NULL, NULL, 100, 200, 1, 2, 1, 0};
  mtopt__bucket_layout_t L;
  TU_OK(mtopt__bucket_layout_create(NULL, "test", &a, &L));
  ck_assert_int_eq(L.nb, 3);
  /* Bucket 0 {3}: tensor 3 at 1 (residue 1), ends at 41: slice
   * round_up(ceil(41 / 2), 8) = 24, bucket [0, 48). */
  ck_assert_int_eq(L.goff[3], 1);
  ck_assert_int_eq(L.b[0].slice, 24);
  ck_assert_int_eq(L.b[0].numel, 48);
  /* Bucket 1 {1, 2} at 48: tensor 1 at 50 (residue 2) to 70, tensor 2 at 71
   * (residue 3) to 101: 53 elements, slice round_up(27, 8) = 32, [48, 112). */
  ck_assert_int_eq(L.b[1].offset, 48);
  ck_assert_int_eq(L.goff[1], 50);
  ck_assert_int_eq(L.goff[2], 71);
  ck_assert_int_eq(L.b[1].slice, 32);
  /* Bucket 2 {0} at 112: 10 elements, slice 8, [112, 128). */
  ck_assert_int_eq(L.goff[0], 112);
  ck_assert_int_eq(L.b[2].slice, 8);
  ck_assert_int_eq(L.gbuf_numel[F32], 128);
  ck_assert_int_eq(L.gbuf_numel[F16] + L.gbuf_numel[BF16], 0);
  /* The shard in bytes: slices of 24, 32 and 8 floats at 0, 96 and 224. */
  ck_assert_int_eq(L.shard_bytes, 4 * (24 + 32 + 8));
  ck_assert_int_eq(L.b[1].shard_off, 96);
  ck_assert_int_eq(L.b[2].shard_off, 224);
  /* Staged in place (F32 weights of F32 gradients), at the buckets' bytes. */
  ck_assert_int_eq(L.wide_bytes, 0);
  ck_assert(!L.b[0].stage_wide && !L.b[1].stage_wide && !L.b[2].stage_wide);
  ck_assert_int_eq(L.b[1].stage_off, 48 * 4);
  ck_assert_int_eq(L.b[2].stage_off, 112 * 4);
  /* Rank 1's slices: [24, 48), [80, 112), [120, 128): tensor 3's [23, 40)
   * at shard byte 0, tensor 2's [9, 30) (80 - 71) at 96 (tensor 1, [50,
   * 70), is all rank 0's), tensor 0's [8, 10) at 224. */
  const mtopt__piece_t want[] = {{3, 23, 17, 0}, {2, 9, 21, 96}, {0, 8, 2, 224}};
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
  model_t m = {.n = 4, .numel = numel, .param = param, .first_bytes = 100, .bytes = 200,
               .zero = 1, .cs = 8, .min_chunks = 1};
  for (m.world = 1; m.world <= 5; m.world++) bp_check_model(&m);
}
END_TEST
/* Pieces by hand: want[p] = {tensor, start, len, shard byte}. */
static void expect_pieces(const mtopt__bucket_layout_t *L, const mtopt__piece_t *want, int np) {
  ck_assert_int_eq(L->npieces, np);
  for (int p = 0; p < np; p++) {
    ck_assert_int_eq(L->pieces[p].tensor, want[p].tensor);
    ck_assert_int_eq(L->pieces[p].start, want[p].start);
    ck_assert_int_eq(L->pieces[p].len, want[p].len);
    ck_assert_int_eq(L->pieces[p].shard_pos, want[p].shard_pos);
  }
}

/* Two classes by hand: tensors of 10, 20, 30, 40 elements, F32/F32, BF16/BF16,
 * F32/F32, BF16/BF16 (gradient/weights), weights at F32 residue 0, BF16
 * residue 3 (byte 6), F32 residue 1 (byte 4), BF16 residue 5 (byte 10);
 * buckets at 100 / 100 bytes: {2} F32, {1, 3} BF16 (span [1, 4)), {0} F32
 * (test_hand_buckets), so tbucket = {2, 1, 0, 1} and the order, bucket 2
 * first, is 0 | 1, 3 | 2. */
static int64_t mixed_numel[] = {10, 20, 30, 40};
static const int mixed_dt[] = {F32, BF16, F32, BF16};
static const void *mixed_param[] = {arena + 0, arena16 + 3, arena + 1, arena16 + 5};

/* That model at zero_stage 0, rank 1 of 2. */
static mtopt__bucket_layout_args_t mixed_args(int reduce_f32) {
  return (mtopt__bucket_layout_args_t){
      4, mixed_numel, mixed_param, mixed_dt, mixed_dt, 100, 100, 0, 2, 1, reduce_f32};
}

START_TEST(test_hand_mixed) {
  snprintf(g_case, sizeof g_case, "hand mixed");
  mtopt__bucket_layout_args_t a = mixed_args(0);
  mtopt__bucket_layout_t L;
  TU_OK(mtopt__bucket_layout_create(NULL, "test", &a, &L));
  ck_assert_int_eq(L.nb, 3);
  const int64_t span[3][2] = {{2, 1}, {1, 3}, {0, 1}}, order[4] = {0, 1, 3, 2};
  const int tb[4] = {2, 1, 0, 1};
  for (int k = 0; k < 3; k++) {
    ck_assert_int_eq(L.b[k].first_tensor, span[k][0]);
    ck_assert_int_eq(L.b[k].num_tensors, span[k][1]);
  }
  for (int i = 0; i < 4; i++) {
    ck_assert_int_eq(L.order[i], order[i]);
    ck_assert_int_eq(L.tbucket[i], tb[i]);
  }
  /* zero_stage 0, the core's buffers in that order. F32: tensor 0 at 0 to
   * 10, tensor 2 at 13 (residue 1 mod 4) to 43. BF16: tensor 1 at 3 (its
   * byte 6 residue: element 5 is 16-byte aligned in both) to 23, tensor 3
   * at 29 (residue 5 mod 8) to 69. Bucket 1 [3, 69) of BF16 takes the 6
   * elements of padding before tensor 3. */
  const int64_t off[4] = {0, 3, 13, 29}, bufs[MTOPT__NUM_DTYPES] = {43, 0, 69};
  mtopt__bucket_layout_set_grads(&L, off, bufs);
  const int64_t range[3][2] = {{13, 30}, {3, 66}, {0, 10}};
  for (int k = 0; k < 3; k++) {
    ck_assert_int_eq(L.b[k].offset, range[k][0]);
    ck_assert_int_eq(L.b[k].numel, range[k][1]);
  }
  /* Chunks of 8 in that order: tensor 0 [0, 2), 1 [2, 5), 3 [5, 10), 2
   * [10, 14): buckets [10, 14), [2, 10), [0, 2). */
  int64_t first[4], count[4];
  ck_assert_int_eq(mtopt__chunk_table(mixed_numel, 4, L.order, 8, first, count, NULL), 14);
  TU_OK(mtopt__bucket_layout_segments(NULL, "test", &L, first, count, 14, 8, 1));
  const int64_t cr[3][2] = {{10, 14}, {2, 10}, {0, 2}};
  for (int k = 0; k < 3; k++) {
    ck_assert_int_eq(L.b[k].c0, cr[k][0]);
    ck_assert_int_eq(L.b[k].c1, cr[k][1]);
  }
  mtopt__bucket_layout_free(&L);
  /* ZeRO-1 at 2 ranks, per gradient dtype bucket after bucket. Bucket 0
   * (F32) at 0: tensor 2 at 1 to 31, slice round_up(16, 8) = 16, [0, 32).
   * Bucket 1 (BF16) at 0: tensors 1 at 3 and 3 at 29 as above, to 69: slice
   * round_up(35, 8) = 40, [0, 80). Bucket 2 (F32) at 32: tensor 0 at 32 to
   * 42, slice 8, [32, 48). The shard, bytes: 16 * 4 at 0, 40 * 2 at 64, 8 *
   * 4 at 144, 176 in all; staged in place at 0, 0 (BF16's buffer), 128. */
  a.zero_stage = 1;
  a.rank = 0;
  TU_OK(mtopt__bucket_layout_create(NULL, "test", &a, &L));
  const int64_t goff[4] = {32, 3, 1, 29};
  for (int i = 0; i < 4; i++) ck_assert_int_eq(L.goff[i], goff[i]);
  const int64_t z1[3][4] = {/* offset, slice, shard_off, stage_off */
                            {0, 16, 0, 0}, {0, 40, 64, 0}, {32, 8, 144, 128}};
  for (int k = 0; k < 3; k++) {
    ck_assert_int_eq(L.b[k].offset, z1[k][0]);
    ck_assert_int_eq(L.b[k].slice, z1[k][1]);
    ck_assert_int_eq(L.b[k].numel, 2 * z1[k][1]);
    ck_assert_int_eq(L.b[k].shard_off, z1[k][2]);
    ck_assert_int_eq(L.b[k].stage_off, z1[k][3]);
    ck_assert_int_eq(L.b[k].stage_wide, 0);
  }
  ck_assert_int_eq(L.gbuf_numel[F32], 48);
  ck_assert_int_eq(L.gbuf_numel[F16], 0);
  ck_assert_int_eq(L.gbuf_numel[BF16], 80);
  ck_assert_int_eq(L.shard_bytes, 176);
  ck_assert_int_eq(L.wide_bytes, 0);
  /* Rank 0's slices [0, 16), [0, 40), [32, 40): tensor 2's [0, 15) at byte
   * 0 + 1 * 4; tensor 1's all at 64 + 3 * 2, tensor 3's [0, 11) at 64 + 29
   * * 2; tensor 0's [0, 8) at 144. */
  expect_pieces(&L, (const mtopt__piece_t[]){{2, 0, 15, 4}, {1, 0, 20, 70}, {3, 0, 11, 122},
                                             {0, 0, 8, 144}}, 4);
  mtopt__bucket_layout_free(&L);
  /* Rank 1's [16, 32), [40, 80), [40, 48): the rest of tensors 2, 3, 0. */
  a.rank = 1;
  TU_OK(mtopt__bucket_layout_create(NULL, "test", &a, &L));
  expect_pieces(&L, (const mtopt__piece_t[]){{2, 15, 15, 0}, {3, 11, 29, 64}, {0, 8, 2, 144}}, 3);
  mtopt__bucket_layout_free(&L);
  model_t m = {.n = 4, .numel = mixed_numel, .param = mixed_param, .gdt = mixed_dt,
               .pdt = mixed_dt, .first_bytes = 100, .bytes = 100, .cs = 8, .min_chunks = 1};
  for (m.zero = 0; m.zero <= 1; m.zero++)
    for (m.world = 1; m.world <= 5; m.world++) bp_check_model(&m);
}
END_TEST

/* reduce_f32 by hand, test_hand_mixed's model at 2 ranks: every bucket is
 * reduced in F32; the BF16 buffer gets an fp32 copy; the layer lays the
 * buffers out at zero_stage 0 too (bucket 0 first, no padding), and ZeRO-1's
 * shard holds the BF16 bucket's slice in fp32. An F32 table is unchanged. */
START_TEST(test_hand_reduce_f32) {
  snprintf(g_case, sizeof g_case, "hand reduce_f32");
  mtopt__bucket_layout_args_t a = mixed_args(1);
  mtopt__bucket_layout_t L;
  TU_OK(mtopt__bucket_layout_create(NULL, "test", &a, &L));
  ck_assert(L.own && L.f32_copy[BF16] && !L.f32_copy[F32] && !L.f32_copy[F16]);
  for (int k = 0; k < 3; k++) ck_assert_int_eq(L.b[k].rdt, F32);
  /* F32: bucket 0, tensor 2 at 1 (residue 1) to 31; bucket 2 at 31, tensor
   * 0 at 32 to 42. BF16: bucket 1 at 0, tensors 1 at 3 and 3 at 29 to 69. */
  const int64_t goff[4] = {32, 3, 1, 29}, range[3][2] = {{0, 31}, {0, 69}, {31, 11}};
  for (int i = 0; i < 4; i++) ck_assert_int_eq(L.goff[i], goff[i]);
  for (int k = 0; k < 3; k++) {
    ck_assert_int_eq(L.b[k].offset, range[k][0]);
    ck_assert_int_eq(L.b[k].numel, range[k][1]);
  }
  ck_assert_int_eq(L.gbuf_numel[F32], 42);
  ck_assert_int_eq(L.gbuf_numel[BF16], 69);
  ck_assert_int_eq(L.shard_bytes, 0);
  mtopt__bucket_layout_free(&L);
  /* ZeRO-1, rank 1: slices 16, 40, 8 as in test_hand_mixed, all of 4 bytes
   * in the shard (at 0, 64, 224); tensor 3's [11, 40) at 64. */
  a.zero_stage = 1;
  TU_OK(mtopt__bucket_layout_create(NULL, "test", &a, &L));
  ck_assert_int_eq(L.b[1].slice, 40);
  ck_assert_int_eq(L.b[2].shard_off, 224);
  ck_assert_int_eq(L.shard_bytes, 256);
  expect_pieces(&L, (const mtopt__piece_t[]){{2, 15, 15, 0}, {3, 11, 29, 64}, {0, 8, 2, 224}}, 3);
  mtopt__bucket_layout_free(&L);
  /* Rank 0: tensor 1 whole at 64 + 3 * 4, tensor 3's [0, 11) at 64 + 29 * 4. */
  a.rank = 0;
  TU_OK(mtopt__bucket_layout_create(NULL, "test", &a, &L));
  expect_pieces(&L, (const mtopt__piece_t[]){{2, 0, 15, 4}, {1, 0, 20, 76}, {3, 0, 11, 180},
                                             {0, 0, 8, 224}}, 4);
  mtopt__bucket_layout_free(&L);
  /* All F32: nothing to widen, the core's buffers as without the switch. */
  a.gdt = a.pdt = NULL;
  a.zero_stage = 0;
  TU_OK(mtopt__bucket_layout_create(NULL, "test", &a, &L));
  ck_assert(!L.own && !L.f32_copy[F16] && !L.f32_copy[BF16]);
  mtopt__bucket_layout_free(&L);
}
END_TEST

/* Staging by hand, ZeRO-1 at 2 ranks, a bucket per tensor: tensor 0 of 20
 * BF16 gradients with F32 weights (residue 1, byte 4), tensor 1 of 12 F32
 * gradients with BF16 weights (residue 1, byte 2). Buckets {1}, {0}. */
START_TEST(test_hand_staging) {
  snprintf(g_case, sizeof g_case, "hand staging");
  int64_t numel[] = {20, 12};
  const int gdt[] = {BF16, F32}, pdt[] = {F32, BF16};
  const void *param[] = {arena + 1, arena16 + 1};
  const mtopt__bucket_layout_args_t a = {2, numel, param, gdt, pdt, 1, 1, 1, 2, 0, 0};
  mtopt__bucket_layout_t L;
  TU_OK(mtopt__bucket_layout_create(NULL, "test", &a, &L));
  ck_assert_int_eq(L.nb, 2);
  ck_assert_int_eq(L.b[0].first_tensor, 1);
  ck_assert_int_eq(L.b[1].first_tensor, 0);
  /* Bucket 0, F32 at 0: tensor 1 at 1 (weights' element 7 at byte 16, its
   * gradient's at 4 + 28 = 32) to 13, slice round_up(7, 8) = 8, [0, 16);
   * its slice at shard 0; BF16 weights no wider: staged in place at 0. */
  ck_assert_int_eq(L.goff[1], 1);
  ck_assert_int_eq(L.b[0].slice, 8);
  ck_assert_int_eq(L.b[0].stage_wide, 0);
  ck_assert_int_eq(L.b[0].stage_off, 0);
  /* Bucket 1, BF16 at 0: tensor 0 at 5 (weights' element 3 at byte 16, its
   * gradient's at 10 + 6 = 16) to 25, slice round_up(13, 8) = 16, [0, 32);
   * its slice at shard 8 * 4 = 32; F32 weights wider: staged at 0 of the
   * wide buffer, 32 * 4 = 128 bytes. */
  ck_assert_int_eq(L.goff[0], 5);
  ck_assert_int_eq(L.b[1].slice, 16);
  ck_assert_int_eq(L.b[1].shard_off, 32);
  ck_assert_int_eq(L.b[1].stage_wide, 1);
  ck_assert_int_eq(L.b[1].stage_off, 0);
  ck_assert_int_eq(L.gbuf_numel[F32], 16);
  ck_assert_int_eq(L.gbuf_numel[BF16], 32);
  ck_assert_int_eq(L.shard_bytes, 64);
  ck_assert_int_eq(L.wide_bytes, 128);
  /* Rank 0: tensor 1's [0, 7) at 0 + 1 * 4, tensor 0's [0, 11) at 32 + 5 * 2. */
  expect_pieces(&L, (const mtopt__piece_t[]){{1, 0, 7, 4}, {0, 0, 11, 42}}, 2);
  mtopt__bucket_layout_free(&L);
  model_t m = {.n = 2, .numel = numel, .param = param, .gdt = gdt, .pdt = pdt,
               .first_bytes = 1, .bytes = 1, .cs = 4, .min_chunks = 1};
  for (m.zero = 0; m.zero <= 1; m.zero++)
    for (m.world = 1; m.world <= 8; m.world++) bp_check_model(&m);
}
END_TEST

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
    const mtopt__bucket_layout_args_t a = {cases[t].n, numel,          param, NULL, NULL,
                                           cases[t].bytes, cases[t].bytes, 0, 1, 0, 0};
    mtopt__bucket_layout_t L;
    TU_OK(mtopt__bucket_layout_create(NULL, "test", &a, &L));
    ck_assert_int_eq(L.nb, 1);
    const int64_t off[2] = {0, 152};
    const int64_t bufs[MTOPT__NUM_DTYPES] = {cases[t].n == 1 ? numel[0] : 302, 0, 0};
    mtopt__bucket_layout_set_grads(&L, off, bufs);
    int64_t first[2], count[2];
    const int64_t cs = cases[t].cs;
    const int64_t total = mtopt__chunk_table(numel, cases[t].n, NULL, cs, first, count, NULL);
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
  tcase_add_test(tc, test_hand_mixed);
  tcase_add_test(tc, test_hand_reduce_f32);
  tcase_add_test(tc, test_hand_staging);
  tcase_add_test(tc, test_hand_segments);
  tcase_add_loop_test(tc, test_random_layouts, 0, 48);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(bucket_plan_suite(), 0); }

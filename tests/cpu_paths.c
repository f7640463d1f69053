/* The CPU backend's vector paths against its element path, bit for bit,
 * without a GPU: the tiles of cpu_tiles.c (the update of AdamW, Adam and SGD
 * in every dtype layout, both roundings, and the statistics of 16-bit
 * gradients; the statistics of segments with gaps, summed run by run in
 * place) against common/step_elem.h, the functions the CUDA backend's
 * scalar heads and tails call (rounding.c's CPU == CUDA cases then tie the
 * CUDA vector path to the same bits on a GPU). The plan is built by hand:
 * one tensor of odd length in chunks with odd starts, its stochastic-rounding
 * index starting just below a 2^32 boundary and odd, so that tiles cross the
 * boundary, begin on both halves of a second-moment pair and end short. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_mixed.h"
#include "common/step_elem.h"
#include "test_util.h"

enum { N = 5003, NCH = 5 };
/* Chunk boundaries: odd starts, a chunk of one element, chunks over a tile. */
static const int32_t kBounds[NCH + 1] = {0, 7, 1508, 1509, 2600, N};

typedef struct {
  int kind, wdt, gdt, sdt, mmode, sr, momentum;
} layout_t;

/* Each case: an optimizer kind and a dtype layout the tiles serve. */
static const layout_t kCases[] = {
    {MTOPT__KIND_ADAMW, MTOPT__DT_BF16, MTOPT__DT_BF16, MTOPT__DT_BF16, MTOPT__MASTER_NONE, 1, 0},
    {MTOPT__KIND_ADAMW, MTOPT__DT_BF16, MTOPT__DT_BF16, MTOPT__DT_BF16, MTOPT__MASTER_NONE, 0, 0},
    {MTOPT__KIND_ADAM, MTOPT__DT_BF16, MTOPT__DT_F16, MTOPT__DT_F32, MTOPT__MASTER_NONE, 1, 0},
    {MTOPT__KIND_ADAMW, MTOPT__DT_BF16, MTOPT__DT_BF16, MTOPT__DT_BF16, MTOPT__MASTER_F32, 1, 0},
    {MTOPT__KIND_ADAMW, MTOPT__DT_BF16, MTOPT__DT_BF16, MTOPT__DT_F32, MTOPT__MASTER_REMAINDER, 0, 0},
    {MTOPT__KIND_ADAMW, MTOPT__DT_F16, MTOPT__DT_F32, MTOPT__DT_F32, MTOPT__MASTER_NONE, 0, 0},
    {MTOPT__KIND_ADAMW, MTOPT__DT_F32, MTOPT__DT_BF16, MTOPT__DT_BF16, MTOPT__MASTER_NONE, 1, 0},
    {MTOPT__KIND_SGD, MTOPT__DT_BF16, MTOPT__DT_BF16, MTOPT__DT_BF16, MTOPT__MASTER_NONE, 1, 1},
    {MTOPT__KIND_SGD, MTOPT__DT_BF16, MTOPT__DT_F32, MTOPT__DT_BF16, MTOPT__MASTER_NONE, 0, 1},
    {MTOPT__KIND_SGD, MTOPT__DT_BF16, MTOPT__DT_BF16, MTOPT__DT_F32, MTOPT__MASTER_NONE, 1, 0},
};

static size_t dt_size(int dt) { return dt == MTOPT__DT_F32 ? 4 : 2; }

/* n values of dtype dt from x (16-bit: rounded to nearest). */
static void *make_array(int dt, const float *x) {
  void *p = malloc(N * dt_size(dt));
  for (int64_t i = 0; i < N; i++) {
    if (dt == MTOPT__DT_F32) ((float *)p)[i] = x[i];
    else if (dt == MTOPT__DT_BF16) ((uint16_t *)p)[i] = mtopt__f32_to_bf16(x[i]);
    else ((uint16_t *)p)[i] = mtopt__f32_to_f16(x[i]);
  }
  return p;
}

static void *dup_array(const void *p, size_t bytes) {
  void *q = malloc(bytes);
  memcpy(q, p, bytes);
  return q;
}

/* Gradients of both signs and magnitudes, an inf or a NaN in about one
 * element of 40 (their tiles take the NaN-aware store). */
static void fill_grads(tu_rng_t *rng, float *x) {
  for (int64_t i = 0; i < N; i++) {
    x[i] = (float)tu_uniform(rng, -1.0, 1.0) * ldexpf(1.0f, (int)tu_int(rng, -12, 6));
    if (tu_int(rng, 0, 39) == 0) x[i] = tu_int(rng, 0, 1) ? -INFINITY : NAN;
  }
}

static void check_same(const void *a, const void *b, int dt, const char *what) {
  const size_t sz = dt_size(dt);
  for (int64_t i = 0; i < N; i++)
    ck_assert_msg(!memcmp((const char *)a + i * sz, (const char *)b + i * sz, sz),
                  "%s: element %lld differs between the tiles and the element path", what,
                  (long long)i);
}

/* A plan over tensor t alone in the chunks of kBounds (filled into ch). */
static mtopt__plan_t one_tensor_plan(const mtopt__tensor_rec_t *t, mtopt__chunk_rec_t *ch) {
  for (int c = 0; c < NCH; c++) {
    ch[c].tensor = 0;
    ch[c].start = kBounds[c];
    ch[c].len = kBounds[c + 1] - kBounds[c];
  }
  mtopt__plan_t p;
  memset(&p, 0, sizeof p);
  p.tensors = t;
  p.chunks = ch;
  p.num_tensors = 1;
  p.num_chunks = NCH;
  p.num_elements = N;
  return p;
}

START_TEST(test_update_tiles_equal_elements) {
  const layout_t L = kCases[_i];
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 7919u * (uint64_t)_i);
  float *x = malloc(N * sizeof(float));
  float *master = malloc(N * sizeof(float));
  for (int64_t i = 0; i < N; i++) master[i] = (float)tu_uniform(&rng, -0.25, 0.25);

  mtopt__tensor_rec_t t;
  memset(&t, 0, sizeof t);
  t.numel = N;
  t.num_chunks = NCH;
  t.sr_elem0 = (INT64_C(5) << 32) - 1201; /* odd; element 1201 starts a 2^32 block */
  t.sr_tensor = 3;
  t.wdt = (uint8_t)L.wdt;
  t.gdt = (uint8_t)L.gdt;
  t.sdt = (uint8_t)L.sdt;
  t.mmode = (uint8_t)L.mmode;
  t.w = make_array(L.wdt, master);
  if (L.mmode == MTOPT__MASTER_F32) {
    t.mw = dup_array(master, N * sizeof(float));
  } else if (L.mmode == MTOPT__MASTER_REMAINDER) {
    uint16_t *r = malloc(N * 2);
    for (int64_t i = 0; i < N; i++) mtopt__split_master(master[i], &((uint16_t *)t.w)[i], &r[i]);
    t.mw = r;
  }
  fill_grads(&rng, x);
  t.g = make_array(L.gdt, x);
  const int adam = L.kind != MTOPT__KIND_SGD;
  if (adam || L.momentum) {
    for (int64_t i = 0; i < N; i++) x[i] = (float)tu_uniform(&rng, -0.1, 0.1);
    t.s0 = make_array(L.sdt, x);
  }
  if (adam) {
    for (int64_t i = 0; i < N; i++) x[i] = (float)tu_uniform(&rng, 1e-6, 1e-2);
    t.s1 = make_array(L.sdt, x);
  }

  mtopt__chunk_rec_t ch[NCH];
  mtopt__plan_t p = one_tensor_plan(&t, ch);
  mtopt__group_rec_t grp = {1.0f, 1.0f};
  mtopt__hyper_t h;
  memset(&h, 0, sizeof h);
  h.lr = 0.02f; /* updates larger than a bf16 ulp of the weights */
  h.beta1 = 0.9f;
  h.beta2 = 0.999f;
  h.eps = 1e-8f;
  h.weight_decay = 0.01f;
  h.momentum = 0.9f;
  h.dampening = 0.1f;
  h.nesterov = 1;
  h.bias_correction = 1;
  h.seed = tu_seed() ^ 0x5eedu;
  h.step = 4;
  h.grad_scale = 0.5f;
  p.groups = &grp;
  p.hyper = &h;
  p.kind = L.kind;
  p.stochastic = L.sr;

  /* The element path on copies of every array; t0 keeps the weights. */
  mtopt__tensor_rec_t e = t, t0 = t;
  const size_t wb = N * dt_size(L.wdt), sb = N * dt_size(L.sdt);
  const size_t mb = L.mmode == MTOPT__MASTER_F32 ? N * 4 : N * 2;
  e.w = dup_array(t.w, wb);
  e.s0 = t.s0 ? dup_array(t.s0, sb) : NULL;
  e.s1 = t.s1 ? dup_array(t.s1, sb) : NULL;
  e.mw = t.mw ? dup_array(t.mw, mb) : NULL;
  t0.w = dup_array(t.w, wb);
  t0.mw = t.mw ? dup_array(t.mw, mb) : NULL;
  const mtopt__scalars_t s = mtopt__chunk_scalars(&h, &grp, &t);
  const mtopt__sr_t sr = mtopt__sr_for(&p, &h, &t);
  ck_assert_int_eq(sr.on, L.sr);
  mtopt__sum_t unused = 0.0;
  for (int64_t i = 0; i < N; i++) mtopt__update_elem(L.kind, &s, &sr, &e, i, &unused, &unused);

  for (int c = 0; c < NCH; c++) mtopt__cpu_update_tiles(&p, &h, &s, c);

  check_same(t.w, e.w, L.wdt, "parameter");
  if (t.mw) check_same(t.mw, e.mw, L.mmode == MTOPT__MASTER_F32 ? MTOPT__DT_F32 : MTOPT__DT_BF16,
                       "master");
  if (t.s0) check_same(t.s0, e.s0, L.sdt, "first state");
  if (t.s1) check_same(t.s1, e.s1, L.sdt, "second state");
  /* The step moved the weights (the case is not vacuous). */
  int64_t moved = 0;
  for (int64_t i = 0; i < N; i++) moved += mtopt__ld_weight(&t, i) != mtopt__ld_weight(&t0, i);
  ck_assert_int_gt(moved, N / 4);

  free(t.w), free(t.g), free(t.s0), free(t.s1), free(t.mw);
  free(e.w), free(e.s0), free(e.s1), free(e.mw);
  free(t0.w), free(t0.mw);
  free(x);
  free(master);
}
END_TEST

/* The statistics of a chunk of 16-bit gradients (widened in tiles, then
 * summed as fp32 ones are) against the rule of cpu_kernels.h written out:
 * element i of the chunk squared into lane i % MTOPT__CPU_LANES, in element
 * order; non-finite values counted. Chunks with odd starts and lengths. */
START_TEST(test_stats_tiles_equal_lanes) {
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 104729u * (uint64_t)_i);
  const int gdt = _i ? MTOPT__DT_F16 : MTOPT__DT_BF16;
  float *x = malloc(N * sizeof(float));
  fill_grads(&rng, x);
  for (int64_t i = 0; i < N; i += 97) x[i] = 60000.0f; /* fp16's largest values, squared past fp32 */
  mtopt__tensor_rec_t t;
  memset(&t, 0, sizeof t);
  t.numel = N;
  t.gdt = (uint8_t)gdt;
  t.g = make_array(gdt, x);
  mtopt__chunk_rec_t ch[NCH];
  mtopt__plan_t p = one_tensor_plan(&t, ch);
  const float inv = 1.0f / 3.0f;
  for (int c = 0; c < NCH; c++) {
    mtopt__cpu_stats_t st;
    memset(&st, 0, sizeof st);
    st.sq[1] = 0.25; /* a carried partial sum: the tiles add to it */
    mtopt__cpu_stats_tiles(&p, c, inv, &st);
    mtopt__sum_t sq[MTOPT__CPU_LANES] = {0.0};
    uint32_t bad[MTOPT__CPU_LANES] = {0};
    sq[1] = 0.25;
    for (int32_t i = 0; i < ch[c].len; i++) {
      const float y = mtopt__grad_elem(&t, ch[c].start + i) * inv;
      sq[i % MTOPT__CPU_LANES] += (mtopt__sum_t)y * y;
      bad[i % MTOPT__CPU_LANES] += !isfinite(y);
    }
    for (int j = 0; j < MTOPT__CPU_LANES; j++) {
      ck_assert_msg(st.sq[j] == sq[j] || (isnan(st.sq[j]) && isnan(sq[j])),
                    "chunk %d lane %d: %.17g, want %.17g", c, j, st.sq[j], sq[j]);
      ck_assert_uint_eq(st.bad[j], bad[j]);
    }
  }
  free(t.g);
  free(x);
}
END_TEST

/* The statistics of a segment with gaps (plan.h: masks), all-F32, which
 * backend_cpu.c sums in place run by run: the same lanes as the rule above
 * with the gaps skipped (a gap would add 0), and no gap read: the gaps hold
 * NaN, so a gap summed would show. Runs of 1 to 70 elements at every lane
 * and word offset, gaps of 1 to 40; chunks with odd starts, one of a single
 * element, and one inside a gap. */
START_TEST(test_stats_runs_equal_lanes) {
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 7919u);
  float *g = malloc(N * sizeof(float));
  uint32_t mask[(N + 31) / 32];
  memset(mask, 0, sizeof mask);
  fill_grads(&rng, g);
  for (int64_t e = 0; e < N; e++) /* finite, so that every slot is a sum */
    if (!isfinite(g[e])) g[e] = 0.75f;
  for (int64_t e = 0; e < N;) {
    const int64_t run = tu_int(&rng, 1, 70), gap = tu_int(&rng, 1, 40);
    for (int64_t k = e; k < e + run && k < N; k++) mask[k >> 5] |= 1u << (k & 31);
    for (int64_t k = e + run; k < e + run + gap && k < N; k++) g[k] = NAN;
    e += run + gap;
  }
  g[1508] = NAN; /* the one-element chunk 1508 is a gap: a slot of 0 */
  mask[1508 >> 5] &= ~(1u << (1508 & 31));
  g[1] = INFINITY; /* a tensor's non-finite value counts (chunk 0 alone) */
  mask[0] |= 2u;
  const uint32_t *masks[1] = {mask};
  mtopt__tensor_rec_t t;
  memset(&t, 0, sizeof t);
  t.numel = N;
  t.g = g;
  mtopt__chunk_rec_t ch[NCH];
  mtopt__plan_t p = one_tensor_plan(&t, ch);
  mtopt__sum_t slot[NCH];
  uint32_t nonfinite[NCH];
  for (int c = 0; c < NCH; c++) {
    slot[c] = NAN;
    nonfinite[c] = 99u;
  }
  mtopt__hyper_t h;
  memset(&h, 0, sizeof h);
  h.loss_scale = 3.0f;
  p.hyper = &h;
  p.slot_gsq = slot;
  p.slot_nonfinite = nonfinite;
  p.masks = masks;
  p.all_f32 = 1;
  mtopt_context_t *ctx = tu_cpu_context();
  TU_OK(mtopt__cpu_ops.run_pass(ctx, &p, MTOPT__PASS_STATS, 0, NCH, NULL));
  const float inv = mtopt__inv_loss_scale(&h);
  for (int c = 0; c < NCH; c++) {
    mtopt__sum_t sq[MTOPT__CPU_LANES] = {0.0};
    uint32_t bad = 0;
    for (int32_t i = 0; i < ch[c].len; i++) {
      const int64_t e = ch[c].start + i;
      if (!mtopt__mask_bit(mask, e)) continue;
      const float y = g[e] * inv;
      sq[i % MTOPT__CPU_LANES] += (mtopt__sum_t)y * y;
      bad += !isfinite(y);
    }
    const mtopt__sum_t want = mtopt__cpu_fold(sq);
    ck_assert_msg(slot[c] == want || (isnan(slot[c]) && isnan(want)),
                  "chunk %d: %.17g, want %.17g", c, slot[c], want);
    ck_assert_uint_eq(nonfinite[c], bad);
  }
  ck_assert_uint_eq(nonfinite[0], 1u);
  ck_assert(slot[2] == 0.0 && isfinite(slot[1]) && isfinite(slot[3]) && isfinite(slot[4]));
  mtopt_context_destroy(ctx);
  free(g);
}
END_TEST

Suite *cpu_paths_suite(void) {
  Suite *s = suite_create("cpu_paths");
  TCase *tc = tcase_create("tiles");
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_update_tiles_equal_elements, 0,
                      (int)(sizeof kCases / sizeof kCases[0]));
  tcase_add_loop_test(tc, test_stats_tiles_equal_lanes, 0, 2);
  tcase_add_test(tc, test_stats_runs_equal_lanes);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_main(cpu_paths_suite()); }

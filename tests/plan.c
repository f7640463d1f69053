/* The chunk table (mtopt__chunk_table, mtopt__chunk_table_at) and the state alignment helper
 * (mtopt__aligned_offset), on random tensor lists and on tensors of 2^31+
 * elements that are planned without being allocated; and get_info's traffic
 * figures against the table users read in docs/optimizers.md. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "test_util.h"

/* Checks a full plan: every element of every tensor covered exactly once, in
 * order, by chunks that never span tensors, of length in [1, chunk_size];
 * first_chunk/num_chunks consistent with the chunk records. */
static void check_plan(const int64_t *numel, int64_t n, int64_t cs) {
  const int64_t total = mtopt__chunk_table(numel, n, NULL, cs, NULL, NULL, NULL);
  ck_assert_int_ge(total, 0);
  int64_t *first = malloc((size_t)(n + 1) * sizeof *first);
  int64_t *nch = malloc((size_t)(n + 1) * sizeof *nch);
  mtopt__chunk_rec_t *ch = malloc((size_t)(total + 1) * sizeof *ch);
  for (int64_t i = 0; i < n; i++) first[i] = nch[i] = -7;
  memset(ch, 0xA5, (size_t)(total + 1) * sizeof *ch); /* poison */
  ck_assert_int_eq(mtopt__chunk_table(numel, n, NULL, cs, first, nch, ch), total);
  int64_t expect_first = 0;
  for (int64_t i = 0; i < n; i++) {
    ck_assert_int_eq(first[i], expect_first);
    ck_assert_int_eq(nch[i], (numel[i] + cs - 1) / cs);
    int64_t covered = 0;
    for (int64_t c = first[i]; c < first[i] + nch[i]; c++) {
      ck_assert_int_eq(ch[c].tensor, i);
      ck_assert_int_eq(ch[c].start, covered); /* contiguous: no gap, no overlap */
      ck_assert_int_ge(ch[c].len, 1);
      ck_assert_int_le(ch[c].len, cs);
      /* Only the last chunk of a tensor may be short. */
      if (c + 1 < first[i] + nch[i]) ck_assert_int_eq(ch[c].len, cs);
      covered += ch[c].len;
    }
    ck_assert_int_eq(covered, numel[i]);
    expect_first += nch[i];
  }
  ck_assert_int_eq(expect_first, total);
  free(first);
  free(nch);
  free(ch);
}

START_TEST(test_edges) {
  /* Sizes at the chunk edges, empty tensors first, last and in between. */
  const int64_t cs_list[] = {4, 8, 12, 64, 1024, 65536};
  for (size_t k = 0; k < sizeof cs_list / sizeof *cs_list; k++) {
    const int64_t cs = cs_list[k];
    const int64_t numel[] = {0, 1, cs - 1, cs, cs + 1, 0, 2 * cs, 2 * cs + 1, 3, 0};
    check_plan(numel, 10, cs);
    /* Counts by hand. */
    int64_t nch[10];
    ck_assert_int_eq(mtopt__chunk_table(numel, 10, NULL, cs, NULL, nch, NULL),
                     0 + 1 + 1 + 1 + 2 + 0 + 2 + 3 + 1 + 0);
    ck_assert_int_eq(nch[0], 0);
    ck_assert_int_eq(nch[4], 2);
    ck_assert_int_eq(nch[7], 3);
  }
  /* No tensors at all. */
  ck_assert_int_eq(mtopt__chunk_table(NULL, 0, NULL, 64, NULL, NULL, NULL), 0);
}
END_TEST

/* Tensors placed on the grid (mtopt__chunk_table_at): the first chunk ends
 * at the first cell boundary, the others lie on cells, the last may be
 * short; every element once, in order. Random lists and phases, and by hand. */
START_TEST(test_phase) {
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() ^ 0x9a5eu);
  enum { N = 40 };
  int64_t numel[N], phase[N], first[N], nch[N];
  mtopt__chunk_rec_t ch[4 * N + 400];
  for (int round = 0; round < 50; round++) {
    const int64_t cs = tu_int(&rng, 1, 64);
    for (int i = 0; i < N; i++) {
      numel[i] = i % 7 == 3 ? 0 : tu_int(&rng, 1, 3 * cs + 2);
      phase[i] = tu_int(&rng, 0, cs - 1);
    }
    const int64_t total = mtopt__chunk_table_at(numel, N, NULL, phase, cs, NULL, NULL, NULL);
    ck_assert_int_le(total, (int64_t)(sizeof ch / sizeof *ch));
    memset(ch, 0xA5, sizeof ch);
    ck_assert_int_eq(mtopt__chunk_table_at(numel, N, NULL, phase, cs, first, nch, ch), total);
    int64_t at = 0;
    for (int i = 0; i < N; i++) {
      ck_assert_int_eq(first[i], at);
      int64_t covered = 0;
      for (int64_t c = first[i]; c < first[i] + nch[i]; c++) {
        ck_assert_int_eq(ch[c].tensor, i);
        ck_assert_int_eq(ch[c].start, covered);
        ck_assert_int_ge(ch[c].len, 1);
        /* every chunk ends on a cell boundary, or at the tensor's end */
        const int64_t end = phase[i] + ch[c].start + ch[c].len;
        ck_assert(end % cs == 0 || ch[c].start + ch[c].len == numel[i]);
        ck_assert_int_le(ch[c].len, cs);
        covered += ch[c].len;
      }
      ck_assert_int_eq(covered, numel[i]);
      at += nch[i];
    }
    ck_assert_int_eq(at, total);
  }
  /* 10 elements at phase 3 of cells of 4: [0,1) [1,5) [5,9) [9,10) */
  const int64_t n10 = 10, p3 = 3, p0 = 0, p4 = 4;
  ck_assert_int_eq(mtopt__chunk_table_at(&n10, 1, NULL, &p3, 4, first, nch, ch), 4);
  ck_assert_int_eq(ch[1].start, 1);
  ck_assert_int_eq(ch[1].len, 4);
  ck_assert_int_eq(ch[3].len, 1);
  ck_assert_int_eq(mtopt__chunk_table_at(&n10, 1, NULL, &p0, 4, NULL, NULL, NULL), 3);
  ck_assert_int_eq(mtopt__chunk_table_at(&n10, 1, NULL, &p4, 4, NULL, NULL, NULL), -1);
}
END_TEST

START_TEST(test_random_lists) {
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 17u * (uint64_t)_i);
  const int64_t n = _i < 5 ? tu_int(&rng, 1, 50) : tu_int(&rng, 2000, 5000);
  const int64_t cs = 4 * tu_int(&rng, 1, _i % 2 ? 16 : 4096);
  int64_t *numel = malloc((size_t)n * sizeof *numel);
  for (int64_t i = 0; i < n; i++) {
    switch (tu_int(&rng, 0, 5)) {
    case 0: numel[i] = 0; break;
    case 1: numel[i] = 1; break;
    case 2: numel[i] = cs + tu_int(&rng, -1, 1); break;
    default: numel[i] = tu_int(&rng, 1, 3 * cs + 7); break;
    }
  }
  check_plan(numel, n, cs);
  free(numel);
}
END_TEST

/* Tensors of 2^31 elements and more: chunk counts and the last chunk's start
 * and length are exact in int64; nothing is allocated. */
START_TEST(test_huge_tensors) {
  const int64_t numel[] = {INT64_C(3000000000), INT64_C(1) << 31, (INT64_C(1) << 31) - 1,
                           (INT64_C(1) << 33) + 5, 7};
  const int64_t n = 5;
  const int64_t sizes[] = {65536, 4, 1 << 20, INT64_C(1) << 30};
  for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
    const int64_t cs = sizes[k];
    int64_t first[5], nch[5];
    const int64_t total = mtopt__chunk_table(numel, n, NULL, cs, first, nch, NULL);
    int64_t expect = 0;
    for (int64_t i = 0; i < n; i++) {
      const int64_t want = numel[i] / cs + (numel[i] % cs != 0);
      ck_assert_int_eq(nch[i], want);
      ck_assert_int_eq(first[i], expect);
      expect += want;
    }
    ck_assert_int_eq(total, expect);
    if (total > 50000000) continue; /* chunk records for cs = 4: too many to build */
    mtopt__chunk_rec_t *ch = malloc((size_t)total * sizeof *ch);
    ck_assert_int_eq(mtopt__chunk_table(numel, n, NULL, cs, first, nch, ch), total);
    for (int64_t i = 0; i < n; i++) {
      const mtopt__chunk_rec_t *last = &ch[first[i] + nch[i] - 1];
      const int64_t rem = numel[i] % cs;
      ck_assert_int_eq(last->tensor, i);
      ck_assert_int_eq(last->start, numel[i] - (rem ? rem : cs));
      ck_assert_int_eq(last->len, rem ? rem : cs);
      ck_assert_int_eq(last->start + last->len, numel[i]);
      /* A chunk past 2^31 elements keeps its int64 start. */
      if (numel[i] > (INT64_C(1) << 31)) ck_assert_int_gt(last->start, INT32_MAX);
      const mtopt__chunk_rec_t *f = &ch[first[i]];
      ck_assert_int_eq(f->start, 0);
    }
    free(ch);
  }
  /* By hand: 3e9 in chunks of 65536 is 45777 chunks, the last (45776) of 24064 at
   * element 2999975936. */
  int64_t nch[1];
  const int64_t three_g[1] = {INT64_C(3000000000)};
  ck_assert_int_eq(mtopt__chunk_table(three_g, 1, NULL, 65536, NULL, nch, NULL), 45777);
  mtopt__chunk_rec_t *ch = malloc(45777 * sizeof *ch);
  mtopt__chunk_table(three_g, 1, NULL, 65536, NULL, NULL, ch);
  ck_assert_int_eq(ch[45776].start, INT64_C(2999975936));
  ck_assert_int_eq(ch[45776].len, 3000000000 - 2999975936);
  free(ch);
}
END_TEST

START_TEST(test_overflow_and_bad_args) {
  const int64_t big[] = {INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX, INT64_MAX};
  ck_assert_int_eq(mtopt__chunk_table(big, 5, NULL, 4, NULL, NULL, NULL), -1);
  const int64_t neg[] = {5, -1};
  ck_assert_int_eq(mtopt__chunk_table(neg, 2, NULL, 4, NULL, NULL, NULL), -1);
  const int64_t ok[] = {5};
  ck_assert_int_eq(mtopt__chunk_table(ok, 1, NULL, 0, NULL, NULL, NULL), -1);
  ck_assert_int_eq(mtopt__chunk_table(ok, 1, NULL, -4, NULL, NULL, NULL), -1);
  ck_assert_int_eq(mtopt__chunk_table(ok, 1, NULL, (INT64_C(1) << 31), NULL, NULL, NULL), -1);
  ck_assert_int_eq(mtopt__chunk_table(ok, -1, NULL, 4, NULL, NULL, NULL), -1);
  /* One INT64_MAX alone fits. */
  ck_assert_int_eq(mtopt__chunk_table(big, 1, NULL, 4, NULL, NULL, NULL), INT64_MAX / 4 + 1);
}
END_TEST

START_TEST(test_aligned_offset) {
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 3);
  static float arena[64];
  for (int k = 0; k < 2000; k++) {
    const int64_t off = tu_int(&rng, 0, INT64_C(1) << 40);
    const float *w = arena + tu_int(&rng, 0, 31);
    const int64_t r = mtopt__aligned_offset(off, w);
    ck_assert_int_ge(r, off);
    ck_assert_int_le(r, off + 3);
    ck_assert_int_eq((r & 3), (int64_t)(((uintptr_t)w / 4) & 3));
    /* Idempotent. */
    ck_assert_int_eq(mtopt__aligned_offset(r, w), r);
  }
}
END_TEST

/* Through the public API: get_info's chunk count equals the planner's count of
 * the same list, for random lists and chunk sizes. */
START_TEST(test_info_counts) {
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 101u * (uint64_t)_i);
  mtopt_context_t *ctx = tu_cpu_context();
  mtopt_tensor_list_t *list = NULL;
  TU_OK(mtopt_tensor_list_create(ctx, &list));
  const int64_t n = tu_int(&rng, 1, 300);
  const int64_t cs = 4 * tu_int(&rng, 1, 64);
  int64_t *numel = malloc((size_t)n * sizeof *numel);
  float **w = malloc((size_t)n * sizeof *w);
  int64_t total = 0;
  for (int64_t i = 0; i < n; i++) {
    numel[i] = tu_int(&rng, 0, 4) == 0 ? 0 : tu_int(&rng, 1, 3 * cs + 5);
    w[i] = malloc((size_t)(numel[i] + 1) * sizeof(float));
    TU_OK(mtopt_tensor_list_add_f32(list, w[i], NULL, numel[i], 0, NULL));
    total += numel[i];
  }
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  c.chunk_size = cs;
  c.kind = (mtopt_optimizer_kind_t)(_i % 4);
  mtopt_optimizer_t *opt = NULL;
  TU_OK(mtopt_optimizer_create(ctx, list, &c, &opt));
  mtopt_optimizer_info_t info = MTOPT_OPTIMIZER_INFO_INIT;
  TU_OK(mtopt_optimizer_get_info(opt, &info));
  ck_assert_int_eq(info.num_tensors, n);
  ck_assert_int_eq(info.chunk_size, cs);
  ck_assert_int_eq(info.total_numel, total);
  int64_t expect = 0;
  for (int64_t i = 0; i < n; i++) expect += (numel[i] + cs - 1) / cs;
  ck_assert_int_eq(info.num_chunks, expect);
  ck_assert_int_eq(info.num_chunks, mtopt__chunk_table(numel, n, NULL, cs, NULL, NULL, NULL));
  ck_assert_int_eq(info.launches_per_step, c.kind == MTOPT_OPTIMIZER_LAMB ? 2 : 1);
  TU_OK(mtopt_optimizer_destroy(opt));
  TU_OK(mtopt_tensor_list_destroy(list));
  TU_OK(mtopt_context_destroy(ctx));
  for (int64_t i = 0; i < n; i++) free(w[i]);
  free(w);
  free(numel);
}
END_TEST

/* The chunk size an optimizer of tensors param[i] (gradients grad[i], or
 * NULL: the library's buffer) uses with chunk_size cs, after `steps` steps. */
static int64_t auto_chunk_of(mtopt_context_t *ctx, const int64_t *numel, int64_t n,
                             float **param, float **grad, int64_t cs, int steps) {
  mtopt_tensor_list_t *list = NULL;
  TU_OK(mtopt_tensor_list_create(ctx, &list));
  for (int64_t i = 0; i < n; i++)
    TU_OK(mtopt_tensor_list_add_f32(list, param[i], grad ? grad[i] : NULL, numel[i], 0, NULL));
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  ck_assert_int_eq(c.chunk_size, 0); /* the default */
  c.chunk_size = cs;
  mtopt_optimizer_t *opt = NULL;
  TU_OK(mtopt_optimizer_create(ctx, list, &c, &opt));
  mtopt_optimizer_info_t info = MTOPT_OPTIMIZER_INFO_INIT;
  TU_OK(mtopt_optimizer_get_info(opt, &info));
  for (int k = 0; k < steps; k++) TU_OK(mtopt_optimizer_step(opt));
  TU_OK(mtopt_optimizer_destroy(opt));
  TU_OK(mtopt_tensor_list_destroy(list));
  return info.chunk_size;
}

/* chunk_size 0: the library picks 65536, or 4096 where the tensors average
 * under 4096 elements (get_info reports it), and the elementwise step gives
 * the same bits as with an explicit chunk size. */
START_TEST(test_auto_chunk_size) {
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 77);
  mtopt_context_t *ctx = tu_cpu_context();
  enum { N = 400 };
  int64_t numel[N];
  float *w[2][N], *g[N];
  /* Mostly tiny tensors and two large ones: a mean under 4096. */
  int64_t total = 0;
  for (int64_t i = 0; i < N; i++) {
    numel[i] = i == 7 || i == 300 ? tu_int(&rng, 60000, 70000) : tu_int(&rng, 1, 200);
    total += numel[i];
    g[i] = malloc((size_t)numel[i] * sizeof(float));
    tu_fill(&rng, g[i], numel[i], -1.0f, 1.0f);
    for (int k = 0; k < 2; k++) w[k][i] = malloc((size_t)numel[i] * sizeof(float));
    tu_fill(&rng, w[0][i], numel[i], -2.0f, 2.0f);
    memcpy(w[1][i], w[0][i], (size_t)numel[i] * sizeof(float));
  }
  ck_assert_int_lt(total / N, 4096);
  ck_assert_int_eq(auto_chunk_of(ctx, numel, N, w[0], g, 0, 3), 4096);
  ck_assert_int_eq(auto_chunk_of(ctx, numel, N, w[1], g, 65536, 3), 65536);
  for (int64_t i = 0; i < N; i++)
    ck_assert_int_eq(memcmp(w[0][i], w[1][i], (size_t)numel[i] * sizeof(float)), 0);
  /* The boundary: a mean of exactly 4096 keeps 65536, one element less picks
   * 4096; the mean, not the smallest tensor, decides (4095 and 8193: 65536);
   * an empty list, 65536. */
  int64_t edge[3] = {4096, 4095, 8193};
  float *buf = malloc(16384 * sizeof(float));
  float *bufs[2] = {buf, buf + 4096};
  ck_assert_int_eq(auto_chunk_of(ctx, edge, 1, bufs, NULL, 0, 0), 65536);
  ck_assert_int_eq(auto_chunk_of(ctx, edge + 1, 1, bufs, NULL, 0, 0), 4096);
  ck_assert_int_eq(auto_chunk_of(ctx, edge + 1, 2, bufs, NULL, 0, 0), 65536);
  free(buf);
  ck_assert_int_eq(mtopt__auto_chunk_size(edge, 0), 65536);
  /* Empty tensors have no chunks and do not pull the mean down: one tensor of
   * 8193 among 99 empty ones is a large-tensor table, 4095 a small one; all
   * empty, 65536. */
  int64_t sparse[100] = {0};
  sparse[42] = 8193;
  ck_assert_int_eq(mtopt__auto_chunk_size(sparse, 100), 65536);
  ck_assert_int_eq(mtopt__small_tensors(sparse, 100), 0);
  sparse[42] = 4095;
  ck_assert_int_eq(mtopt__auto_chunk_size(sparse, 100), 4096);
  sparse[42] = 0;
  ck_assert_int_eq(mtopt__small_tensors(sparse, 100), 0);
  for (int64_t i = 0; i < N; i++) {
    free(g[i]);
    for (int k = 0; k < 2; k++) free(w[k][i]);
  }
  TU_OK(mtopt_context_destroy(ctx));
}
END_TEST

/* docs/optimizers.md's table of bytes per parameter and launches per step is
 * the users' copy of what get_info counts: read the table and check every row
 * against optimizers of each configuration, with and without statistics. */
/* The number that opens a table cell: "28 (read ...)" or "+ 4 (...)". */
static int cell_int(const char *cell, int *out) {
  while (*cell == ' ' || *cell == '+') cell++;
  char *end = NULL;
  const long v = strtol(cell, &end, 10);
  if (end == cell) return 0;
  *out = (int)v;
  return 1;
}

/* The numbers that open the 2nd and 3rd cells of the row whose first cell is
 * `name` ("| AdamW, Adam | 28 (read ...) | 1 | update |"). */
static void docs_row(const char *text, const char *name, int *bytes, int *launches) {
  char key[96];
  snprintf(key, sizeof key, "| %s |", name);
  const char *at = strstr(text, key);
  ck_assert_msg(at != NULL, "docs/optimizers.md has no table row '%s'", name);
  at += strlen(key);
  const char *cell3 = strchr(at, '|');
  ck_assert_msg(cell3 && cell_int(at, bytes) && cell_int(cell3 + 1, launches),
                "docs/optimizers.md row '%s': no byte or launch count", name);
}

static char *read_docs(const char *name) {
  const char *d = getenv("MTOPT_TEST_DATA"); /* tests/data */
  ck_assert_msg(d && d[0], "MTOPT_TEST_DATA is not set (tests/CMakeLists.txt sets it)");
  char path[4096];
  snprintf(path, sizeof path, "%s/../../docs/%s", d, name);
  FILE *f = fopen(path, "rb");
  ck_assert_msg(f != NULL, "cannot open %s", path);
  char *buf = calloc(1, 1 << 20);
  const size_t n = fread(buf, 1, (1 << 20) - 1, f);
  fclose(f);
  ck_assert_int_gt((int64_t)n, 0);
  return buf;
}

/* One row of a table in docs/optimizers.md and the optimizer it describes:
 * one tensor of the given dtypes (the gradient's in the library's buffer). */
typedef struct {
  const char *row;
  mtopt_optimizer_kind_t kind;
  float momentum;
  mtopt_dtype_t param, grad, state;
  mtopt_master_t master;
} docs_row_t;

static void check_docs_row(mtopt_context_t *ctx, const char *docs, const docs_row_t *r,
                           const char *stats_row) {
  int bytes = 0, launches = 0, stats_bytes = 0, stats_launches = 0;
  docs_row(docs, r->row, &bytes, &launches);
  docs_row(docs, stats_row, &stats_bytes, &stats_launches);
  ck_assert_int_gt(stats_bytes, 0);
  ck_assert_int_gt(stats_launches, 0);
  float w[8] = {0.5f, -1.0f, 2.0f, 0.25f, 3.0f, -0.5f, 1.5f, 1.0f};
  for (int stats = 0; stats < 2; stats++) {
    mtopt_tensor_list_t *list = NULL;
    TU_OK(mtopt_tensor_list_create(ctx, &list));
    mtopt_tensor_desc_t d = MTOPT_TENSOR_DESC_INIT;
    d.param = w;
    d.numel = 7;
    d.param_dtype = r->param;
    d.grad_dtype = r->grad;
    TU_OK(mtopt_tensor_list_add(list, &d, NULL));
    mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
    c.kind = r->kind;
    c.momentum = r->momentum;
    c.state_dtype = r->state;
    c.master_weights = r->master;
    c.max_grad_norm = stats ? 1.0f : 0.0f;
    mtopt_optimizer_t *opt = NULL;
    TU_OK(mtopt_optimizer_create(ctx, list, &c, &opt));
    mtopt_optimizer_info_t info = MTOPT_OPTIMIZER_INFO_INIT;
    TU_OK(mtopt_optimizer_get_info(opt, &info));
    const int want_b = bytes + stats * stats_bytes, want_l = launches + stats * stats_launches;
    ck_assert_msg(info.bytes_per_param == want_b && info.launches_per_step == want_l,
                  "docs row '%s'%s: %d B, %d launches; get_info: %d B, %d launches", r->row,
                  stats ? " with statistics" : "", want_b, want_l, info.bytes_per_param,
                  info.launches_per_step);
    TU_OK(mtopt_optimizer_destroy(opt));
    TU_OK(mtopt_tensor_list_destroy(list));
  }
}

START_TEST(test_docs_traffic_table) {
  const mtopt_dtype_t F = MTOPT_DTYPE_F32, B = MTOPT_DTYPE_BF16;
  static const char fp32_stats[] = "any, with statistics", bf16_stats[] =
      "BF16 gradients, with statistics";
  const docs_row_t fp32[] = {
      {"AdamW, Adam", MTOPT_OPTIMIZER_ADAMW, 0.0f, F, F, F, MTOPT_MASTER_NONE},
      {"AdamW, Adam", MTOPT_OPTIMIZER_ADAM, 0.0f, F, F, F, MTOPT_MASTER_NONE},
      {"SGD with momentum", MTOPT_OPTIMIZER_SGD, 0.9f, F, F, F, MTOPT_MASTER_NONE},
      {"SGD without momentum", MTOPT_OPTIMIZER_SGD, 0.0f, F, F, F, MTOPT_MASTER_NONE},
      {"LAMB", MTOPT_OPTIMIZER_LAMB, 0.0f, F, F, F, MTOPT_MASTER_NONE}};
  const docs_row_t bf16[] = {
      {"AdamW, BF16 param and grad, F32 master, F32 state", MTOPT_OPTIMIZER_ADAMW, 0.0f, B, B, F,
       MTOPT_MASTER_F32},
      {"AdamW, BF16 param and grad, remainders, F32 state", MTOPT_OPTIMIZER_ADAMW, 0.0f, B, B, F,
       MTOPT_MASTER_REMAINDER},
      {"AdamW, BF16 param and grad, no master, F32 state", MTOPT_OPTIMIZER_ADAMW, 0.0f, B, B, F,
       MTOPT_MASTER_NONE},
      {"AdamW, BF16 param, grad and state, no master", MTOPT_OPTIMIZER_ADAMW, 0.0f, B, B, B,
       MTOPT_MASTER_NONE},
      {"AdamW, F32 param, BF16 grad, F32 state", MTOPT_OPTIMIZER_ADAMW, 0.0f, F, B, F,
       MTOPT_MASTER_NONE},
      {"SGD with momentum, BF16 param, grad and state", MTOPT_OPTIMIZER_SGD, 0.9f, B, B, B,
       MTOPT_MASTER_NONE},
      {"LAMB, BF16 param and grad, F32 master, F32 state", MTOPT_OPTIMIZER_LAMB, 0.0f, B, B, F,
       MTOPT_MASTER_F32}};
  char *docs = read_docs("optimizers.md");
  mtopt_context_t *ctx = tu_cpu_context();
  for (size_t r = 0; r < sizeof fp32 / sizeof fp32[0]; r++)
    check_docs_row(ctx, docs, &fp32[r], fp32_stats);
  for (size_t r = 0; r < sizeof bf16 / sizeof bf16[0]; r++)
    check_docs_row(ctx, docs, &bf16[r], bf16_stats);
  TU_OK(mtopt_context_destroy(ctx));
  free(docs);
}
END_TEST

Suite *plan_suite(void) {
  Suite *s = suite_create("plan");
  TCase *tc = tcase_create("planner");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_edges);
  tcase_add_loop_test(tc, test_random_lists, 0, 10);
  tcase_add_test(tc, test_phase);
  tcase_add_test(tc, test_huge_tensors);
  tcase_add_test(tc, test_overflow_and_bad_args);
  tcase_add_test(tc, test_aligned_offset);
  tcase_add_loop_test(tc, test_info_counts, 0, 8);
  tcase_add_test(tc, test_auto_chunk_size);
  tcase_add_test(tc, test_docs_traffic_table);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(plan_suite(), 0); }

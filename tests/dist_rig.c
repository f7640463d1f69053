/* The rig of the suites run under mpirun: dist_rig.h says what each does. */
#include "dist_rig.h"

#include <dirent.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifdef MTOPT_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include "common/dtype.h"
#include "core/internal_api.h"
#include "dist/dist_internal.h"
#include "dist_util.h"

int g_rank, g_world;
uint64_t g_seed;
mtopt_backend_t g_backend = MTOPT_BACKEND_CPU;
int g_device;

mtopt_context_t *test_context(void) {
  if (g_backend == MTOPT_BACKEND_CPU) return tu_cpu_context();
  mtopt_context_config_t cc = MTOPT_CONTEXT_CONFIG_INIT;
  cc.backend = g_backend;
  cc.device = g_device;
  mtopt_context_t *ctx = NULL;
  TU_OK(mtopt_context_create(&cc, &ctx));
  return ctx;
}

/* ---- the backend's memory ---- */

#ifdef MTOPT_HAVE_CUDA
#define CU(call)                                                               \
  do {                                                                         \
    cudaError_t cu_e_ = (call);                                                \
    ck_assert_msg(cu_e_ == cudaSuccess, "rank %d: %s: %s", g_rank, #call,     \
                  cudaGetErrorString(cu_e_));                                  \
  } while (0)
#endif

void *mem_alloc(size_t bytes) {
  if (bytes == 0) bytes = 1;
#ifdef MTOPT_HAVE_CUDA
  if (g_backend == MTOPT_BACKEND_CUDA) {
    void *p = NULL;
    CU(cudaMalloc(&p, bytes));
    return p;
  }
#endif
  void *p = aligned_alloc(256, (bytes + 255) / 256 * 256);
  ck_assert_ptr_nonnull(p);
  return p;
}

void mem_free(void *p) {
#ifdef MTOPT_HAVE_CUDA
  if (g_backend == MTOPT_BACKEND_CUDA) {
    if (p) CU(cudaFree(p));
    return;
  }
#endif
  free(p);
}

void mem_put(void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return;
#ifdef MTOPT_HAVE_CUDA
  if (g_backend == MTOPT_BACKEND_CUDA) {
    CU(cudaMemcpy(dst, src, bytes, cudaMemcpyHostToDevice));
    return;
  }
#endif
  memcpy(dst, src, bytes);
}

void mem_get(void *dst, const void *src, size_t bytes) {
  if (bytes == 0) return;
#ifdef MTOPT_HAVE_CUDA
  if (g_backend == MTOPT_BACKEND_CUDA) {
    CU(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
    return;
  }
#endif
  memcpy(dst, src, bytes);
}

void mem_put_as(void *dst, int dt, const float *x, int64_t n) {
  if (n <= 0) return;
  const size_t es = (size_t)mtopt__dt_size(dt);
  void *h = malloc((size_t)n * es);
  ck_assert_ptr_nonnull(h);
  for (int64_t i = 0; i < n; i++) mtopt__st(h, dt, i, x[i], 0, 0u);
  mem_put(dst, h, (size_t)n * es);
  free(h);
}

void mem_get_as(float *x, const void *src, int dt, int64_t n) {
  if (n <= 0) return;
  const size_t es = (size_t)mtopt__dt_size(dt);
  void *h = malloc((size_t)n * es);
  ck_assert_ptr_nonnull(h);
  memset(h, 0xff, (size_t)n * es); /* NaN in every dtype: an unwritten copy shows */
  mem_get(h, src, (size_t)n * es);
  for (int64_t i = 0; i < n; i++) x[i] = mtopt__ld(h, dt, i);
  free(h);
}

int average_is_exact(void) {
  return g_backend == MTOPT_BACKEND_CPU || (g_world & (g_world - 1)) == 0;
}

int average_is_exact_for(int gdt) {
  return gdt == MTOPT__DT_F16 ? (g_world & (g_world - 1)) == 0 : average_is_exact();
}

static float round_f16(float x) { return mtopt__f16_to_f32(mtopt__f32_to_f16(x)); }

/* ---- models ---- */

static size_t esz(int dt) { return (size_t)mtopt__dt_size(dt); }

void model_init(model_t *m, int n, const int64_t *numel, const int *pdt, const int *gdt,
                int ncls, int skew, uint64_t salt) {
  tu_rng_t r;
  tu_rng_init(&r, g_seed ^ salt);
  memset(m, 0, sizeof *m);
  m->n = n;
  for (int i = 0; i < n; i++) {
    m->numel[i] = numel ? numel[i] : i == 4 ? 0 : i == 0 ? 1 : tu_int(&r, 1, 449) * 2 + 1;
    ck_assert(m->numel[i] <= DR_MAXN);
    m->pdt[i] = pdt[i % ncls];
    m->gdt[i] = gdt[i % ncls];
    const int at = skew ? (int)tu_int(&r, 0, 7) : 0;
    tu_fill(&r, m->init[i], m->numel[i], -1.0f, 1.0f);
    for (int64_t e = 0; e < m->numel[i]; e++) { /* as the dtype holds it */
      uint32_t h = 0;
      mtopt__st(&h, m->pdt[i], 0, m->init[i][e], 0, 0u);
      m->init[i][e] = mtopt__ld(&h, m->pdt[i], 0);
    }
    for (int k = 0; k < 2; k++) {
      const int e0 = skew ? (at + 3 * k) % 8 : 0; /* the reference: another residue */
      m->mem[k][i] = mem_alloc((size_t)(m->numel[i] + 8) * esz(m->pdt[i]));
      m->w[k][i] = (char *)m->mem[k][i] + (size_t)e0 * esz(m->pdt[i]);
      mem_put_as(m->w[k][i], m->pdt[i], m->init[i], m->numel[i]);
    }
  }
}

void model_free(model_t *m) {
  for (int k = 0; k < 2; k++)
    for (int i = 0; i < m->n; i++) mem_free(m->mem[k][i]);
}

mtopt_tensor_list_t *model_list(mtopt_context_t *ctx, const model_t *m, int k, int swap,
                                void *w, int64_t numel, rec_t *rec) {
  mtopt_tensor_list_t *l = NULL;
  EXPECT_OK(rec, mtopt_tensor_list_create(ctx, &l));
  if (!l) return NULL;
  EXPECT_OK(rec, mtopt_tensor_list_set_group(l, 1, 0.5f, 0.25f));
  for (int i = 0; i < m->n; i++) {
    mtopt_tensor_desc_t d = MTOPT_TENSOR_DESC_INIT;
    d.param = i == swap ? w : m->numel[i] ? m->w[k][i] : NULL;
    d.numel = i == swap ? numel : m->numel[i];
    d.param_dtype = (mtopt_dtype_t)m->pdt[i];
    d.grad_dtype = (mtopt_dtype_t)m->gdt[i];
    d.flags = i == 2 ? MTOPT_TENSOR_NO_WEIGHT_DECAY : 0u;
    d.group = (i == 5 || i == 6) ? 1 : 0;
    char name[16];
    snprintf(name, sizeof name, "t%d", i);
    d.name = name;
    EXPECT_OK(rec, mtopt_tensor_list_add(l, &d, NULL));
  }
  return l;
}

/* ---- gradients and buckets ---- */

static float grad_value(tu_rng_t *r) {
  const float v = (float)tu_int(r, 1, 6);
  return (tu_next(r) & 1) ? v : -v;
}

void rank_grad(int s, int q, int t, int64_t n, float *g) {
  tu_rng_t r;
  tu_rng_init(&r, g_seed + 1000003u * (uint64_t)s + 7919u * (uint64_t)q + 31u * (uint64_t)t);
  for (int64_t i = 0; i < n; i++) g[i] = grad_value(&r);
}

static void int_grad(int s, int q, int t, int dt, int64_t n, float *g) {
  (void)dt;
  rank_grad(s, q, t, n, g);
}

void write_grads(const model_t *m, mtopt_dist_optimizer_t *d, mtopt_optimizer_t *ref, int s,
                 float scale, int inf_tensor, rec_t *rec) {
  write_grads_of(m, d, ref, s, scale, inf_tensor, int_grad, 0, rec);
}

void write_grads_of(const model_t *m, mtopt_dist_optimizer_t *d, mtopt_optimizer_t *ref, int s,
                    float scale, int inf_tensor, grad_gen_t gen, int f32, rec_t *rec) {
  static float mine[DR_MAXN], sum[DR_MAXN], tmp[DR_MAXN];
  const float inv = (float)(1.0 / (double)g_world);
  EXPECT_OK(rec, mtopt_dist_optimizer_zero_grad(d));
  for (int i = 0; i < m->n; i++) {
    const int64_t n = m->numel[i];
    void *dg = NULL, *rg = NULL;
    if (!n) continue;
    EXPECT_OK(rec, mtopt_dist_optimizer_get_grad(d, i, &dg));
    if (ref) EXPECT_OK(rec, mtopt_optimizer_get_grad(ref, i, &rg));
    if (!dg || (ref && !rg)) continue;
    gen(s, g_rank, i, m->gdt[i], n, mine);
    for (int64_t e = 0; e < n; e++) {
      mine[e] *= scale;
      sum[e] = 0.0f;
    }
    /* F16: each rank's value times 1/world, rounded, then summed with a
     * rounding after each addition (in rank order: exact at a power-of-two
     * world, see average_is_exact_for); else the sum times 1/world. */
    const int f16 = !f32 && m->gdt[i] == MTOPT__DT_F16;
    for (int q = 0; q < g_world; q++) {
      gen(s, q, i, m->gdt[i], n, tmp);
      for (int64_t e = 0; e < n; e++)
        sum[e] = f16 ? round_f16(sum[e] + round_f16(round_f16(tmp[e] * scale) * inv))
                     : sum[e] + tmp[e] * scale;
    }
    if (!f16)
      for (int64_t e = 0; e < n; e++) sum[e] *= inv; /* mem_put_as rounds it */
    if (i == inf_tensor) {
      if (g_rank == g_world - 1) mine[0] = INFINITY;
      sum[0] = INFINITY;
    }
    mem_put_as(dg, m->gdt[i], mine, n);
    if (ref) mem_put_as(rg, f32 ? MTOPT__DT_F32 : m->gdt[i], sum, n);
  }
}

void step_both(const model_t *m, mtopt_dist_optimizer_t *d, mtopt_optimizer_t *ref, int s,
               float scale, int inf_tensor, rec_t *rec) {
  write_grads(m, d, ref, s, scale, inf_tensor, rec);
  step_written(d, ref, s, rec);
}

void step_written(mtopt_dist_optimizer_t *d, mtopt_optimizer_t *ref, int s, rec_t *rec) {
  int nb = 0;
  EXPECT_OK(rec, mtopt_dist_get_bucket_count(d, &nb));
  mark_random(d, nb, s, rec);
  EXPECT_OK(rec, mtopt_dist_step(d));
  if (ref) EXPECT_OK(rec, mtopt_optimizer_step(ref));
  /* CUDA: the step only enqueued; wait (bounded) and surface NCCL errors. */
  EXPECT_OK(rec, mtopt_dist_synchronize(d));
}

mtopt_comm_config_t small_buckets(int zero) {
  mtopt_comm_config_t c = MTOPT_COMM_CONFIG_INIT;
  c.first_bucket_bytes = 512;
  c.bucket_bytes = 2048;
  c.timeout_ms = 30000;
  c.zero_stage = zero;
  return c;
}

void mark_random(mtopt_dist_optimizer_t *d, int nb, int step, rec_t *rec) {
  tu_rng_t r;
  tu_rng_init(&r, g_seed * 3 + (uint64_t)(g_rank * 17 + step));
  int perm[64];
  if (nb > 64) nb = 64;
  for (int k = 0; k < nb; k++) perm[k] = k;
  for (int k = nb - 1; k > 0; k--) {
    const int j = (int)tu_int(&r, 0, k), x = perm[k];
    perm[k] = perm[j];
    perm[j] = x;
  }
  const int nmark = (int)tu_int(&r, 0, nb);
  for (int k = 0; k < nmark; k++) EXPECT_OK(rec, mtopt_dist_bucket_ready(d, perm[k]));
}

/* ---- comparisons ---- */

int64_t differs(const float *a, const float *b, int64_t n, int dt, int tol, double atol) {
  if (!tol) return tu_first_bit_diff(a, b, n);
  const double rtol = dt == MTOPT__DT_BF16 ? 0x1p-6 : dt == MTOPT__DT_F16 ? 0x1p-9 : 1e-5;
  return tu_compare_f(a, b, n, atol, rtol).first_bad;
}

void same_state(const model_t *m, int zero, mtopt_optimizer_kind_t kind, mtopt_master_t master,
                mtopt_optimizer_t *inner, mtopt_optimizer_t *ref, rec_t *rec) {
  static float a[DR_MAXN], b[DR_MAXN];
  mtopt_optimizer_info_t info = MTOPT_OPTIMIZER_INFO_INIT;
  EXPECT_OK(rec, mtopt_optimizer_get_info(inner, &info));
  int64_t covered = 0, total = 0;
  for (int64_t p = 0; p < info.num_tensors; p++) {
    const mtopt__tensor_rec_t *r = mtopt__optimizer_tensor(inner, p);
    if (!r->numel) continue;
    int i = 0;
    while (i < m->n && !(m->numel[i] && (char *)r->w >= (char *)m->w[0][i] &&
                         (char *)r->w < (char *)m->w[0][i] + m->numel[i] * esz(m->pdt[i])))
      i++;
    if (i == m->n) {
      EXPECT(rec, 0, "rank %d: inner tensor %lld lies in no list tensor", g_rank, (long long)p);
      continue;
    }
    const int64_t at = ((char *)r->w - (char *)m->w[0][i]) / (int64_t)esz(m->pdt[i]);
    covered += r->numel;
    mtopt_state_t which[3];
    int nw = 0;
    if (kind == MTOPT_OPTIMIZER_SGD) {
      which[nw++] = MTOPT_STATE_MOMENTUM;
    } else {
      which[nw++] = MTOPT_STATE_EXP_AVG;
      which[nw++] = MTOPT_STATE_EXP_AVG_SQ;
    }
    if (m->pdt[i] != MTOPT__DT_F32 && master != MTOPT_MASTER_NONE)
      which[nw++] = MTOPT_STATE_MASTER;
    for (int w = 0; w < nw; w++) {
      tu_poison(a, r->numel);
      tu_poison(b, m->numel[i]);
      EXPECT_OK(rec, mtopt_optimizer_read_state(inner, p, which[w], a));
      EXPECT_OK(rec, mtopt_optimizer_read_state(ref, i, which[w], b));
      const int64_t j = tu_first_bit_diff(a, b + at, r->numel);
      EXPECT(rec, j < 0, "rank %d/%d: tensor %d state %d differs at %lld: %.9g vs %.9g", g_rank,
             g_world, i, (int)which[w], (long long)(at + j), j < 0 ? 0.0 : a[j],
             j < 0 ? 0.0 : b[at + j]);
    }
  }
  for (int i = 0; i < m->n; i++) total += m->numel[i];
  int64_t all = 0;
  MPI_Allreduce(&covered, &all, 1, MPI_INT64_T, MPI_SUM, MPI_COMM_WORLD);
  EXPECT(rec, all == (zero ? total : total * g_world),
         "the ranks' inner tensors hold %lld elements of %lld", (long long)all, (long long)total);
}

/* ---- a directory every rank sees ---- */

void dir_make(char dir[64]) {
  memset(dir, 0, 64);
  if (g_rank == 0) {
    snprintf(dir, 64, "/tmp/mtopt_dist_XXXXXX");
    if (!mkdtemp(dir)) dir[0] = '\0';
  }
  MPI_Bcast(dir, 64, MPI_CHAR, 0, MPI_COMM_WORLD);
}

void dir_remove(const char *dir) {
  MPI_Barrier(MPI_COMM_WORLD); /* every rank is done with its files */
  if (g_rank == 0 && dir[0]) {
    DIR *dp = opendir(dir);
    for (struct dirent *e; dp && (e = readdir(dp));) {
      char p[512];
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
      if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) unlink(p);
    }
    if (dp) closedir(dp);
    rmdir(dir);
  }
}

void ck_file(char out[320], const char *path, int zero, int rank) {
  if (zero)
    snprintf(out, 320, "%s.rank%d-of-%d", path, rank, g_world);
  else
    snprintf(out, 320, "%s", path);
}

char *slurp(const char *path, long *len) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *b = NULL;
  if (fseek(f, 0, SEEK_END) == 0 && (*len = ftell(f)) >= 0 && fseek(f, 0, SEEK_SET) == 0)
    b = malloc((size_t)*len + 1);
  if (b && fread(b, 1, (size_t)*len, f) != (size_t)*len) {
    free(b);
    b = NULL;
  }
  fclose(f);
  return b;
}

void same_files(const char *p, const char *q, int zero, rec_t *rec) {
  char a[320], b[320];
  ck_file(a, p, zero, g_rank);
  ck_file(b, q, zero, g_rank);
  long la = -1, lb = -2;
  char *x = slurp(a, &la), *y = slurp(b, &lb);
  EXPECT(rec, x && y && la == lb && !memcmp(x, y, (size_t)la), "rank %d: %s and %s differ",
         g_rank, a, b);
  free(x);
  free(y);
}

/* ---- main ---- */

/* --backend cpu|cuda, else MTOPT_TEST_BACKEND, else cpu. -1 on a bad name. */
static int pick_backend(int argc, char **argv) {
  const char *name = getenv("MTOPT_TEST_BACKEND");
  for (int i = 1; i + 1 < argc; i++)
    if (!strcmp(argv[i], "--backend")) name = argv[i + 1];
  if (!name || !*name || !strcmp(name, "cpu")) {
    g_backend = MTOPT_BACKEND_CPU;
    return 0;
  }
  if (!strcmp(name, "cuda")) {
    g_backend = MTOPT_BACKEND_CUDA;
    return 0;
  }
  return -1;
}

/* CUDA: every rank needs a GPU of its own (NCCL refuses two ranks on one
 * device) and the build needs NCCL. Picks this rank's device: its node-local
 * rank when every rank sees all the node's GPUs, else device 0 when the
 * launcher gives each rank its own GPU through CUDA_VISIBLE_DEVICES.
 * Collective: 1 on every rank if all can run, else 0 on every rank, with the
 * reason (printed by the ranks that lack a GPU) in *why. */
static int cuda_ready(const char **why) {
  int ok = mtopt_backend_available(MTOPT_BACKEND_CUDA);
  *why = ok ? "" : "no CUDA device (or a build without CUDA)";
#ifndef MTOPT_HAVE_NCCL
  if (ok) {
    ok = 0;
    *why = "this build has no NCCL (configure with -DMTOPT_WITH_NCCL=ON)";
  }
#endif
#ifdef MTOPT_HAVE_CUDA
  if (ok) {
    MPI_Comm node;
    int local = 0, nlocal = 1, count = 0;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &local);
    MPI_Comm_size(node, &nlocal);
    MPI_Comm_free(&node);
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    if (count >= nlocal) {
      g_device = local;
    } else if (count >= 1 && getenv("CUDA_VISIBLE_DEVICES")) {
      g_device = 0;
    } else {
      ok = 0;
      *why = "fewer CUDA devices than ranks on this node";
    }
    /* The test's own cudaMalloc calls must land on this rank's device: the
     * library rejects memory of another device. */
    if (ok && cudaSetDevice(g_device) != cudaSuccess) {
      ok = 0;
      *why = "cudaSetDevice failed";
    }
  }
#endif
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return all;
}

int dist_main(int argc, char **argv, const char *name, Suite *(*suite)(void)) {
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_world);
  if (pick_backend(argc, argv) != 0) {
    if (g_rank == 0) fprintf(stderr, "%s: unknown backend (--backend cpu|cuda)\n", name);
    MPI_Finalize();
    return 2;
  }
  /* CUDA is touched only from here on: after MPI_Init, and Check never forks
   * these suites. */
  if (g_backend == MTOPT_BACKEND_CUDA) {
    const char *why = "";
    if (!cuda_ready(&why)) {
      if (g_rank == 0 || *why)
        printf("%s (cuda): rank %d: skipped: %s\n", name, g_rank,
               *why ? why : "another rank cannot run it");
      MPI_Finalize();
      return 77;
    }
  }
  unsigned long long seed = 0;
  if (g_rank == 0) seed = tu_seed(); /* printed once, by rank 0 */
  MPI_Bcast(&seed, 1, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  g_seed = seed;
  mtopt__dist_slice_elems = 128;      /* step buckets in slices of 2 chunks */
  mtopt__dist_min_segment_chunks = 1; /* cut the models' small buckets too */

  SRunner *sr = srunner_create(suite());
  srunner_set_fork_status(sr, CK_NOFORK); /* MPI processes cannot fork */
  srunner_run_all(sr, g_rank == 0 ? CK_NORMAL : CK_SILENT);
  int failed = dist_rank_failures(sr, g_rank);
  int total = 0;
  MPI_Allreduce(&failed, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (g_rank == 0)
    printf("%s (%s): %d ranks, %d failed checks over all ranks\n", name,
           g_backend == MTOPT_BACKEND_CUDA ? "cuda" : "cpu", g_world, total);
  srunner_free(sr);
  MPI_Finalize();
  return total ? 1 : 0;
}

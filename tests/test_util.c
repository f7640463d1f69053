#include "test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

uint64_t tu_seed(void) {
  static uint64_t seed;
  static int done;
  if (!done) {
    const char *e = getenv("MTOPT_TEST_SEED");
    seed = e ? strtoull(e, NULL, 0) : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    fprintf(stderr, "MTOPT_TEST_SEED=%llu\n", (unsigned long long)seed);
    done = 1;
  }
  return seed;
}

void tu_rng_init(tu_rng_t *r, uint64_t seed) { r->s = seed; }

uint64_t tu_next(tu_rng_t *r) {
  uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

double tu_uniform(tu_rng_t *r, double lo, double hi) {
  return lo + (hi - lo) * ((double)(tu_next(r) >> 11) * 0x1.0p-53);
}

int64_t tu_int(tu_rng_t *r, int64_t lo, int64_t hi) {
  return lo + (int64_t)(tu_next(r) % (uint64_t)(hi - lo + 1));
}

void tu_fill(tu_rng_t *r, float *x, int64_t n, float lo, float hi) {
  for (int64_t i = 0; i < n; i++) {
    float v;
    do v = (float)tu_uniform(r, lo, hi);
    while (v == 0.0f);
    x[i] = v;
  }
}

void tu_poison(float *x, int64_t n) {
  for (int64_t i = 0; i < n; i++) x[i] = NAN;
}

static void account(tu_err_t *e, int64_t i, double got, double ref, double atol, double rtol) {
  const double d = fabs(got - ref);
  const double rel = d / fmax(fabs(ref), 1e-30);
  const int bad = (isfinite(ref) && !isfinite(got)) || (isnan(got) != isnan(ref)) ||
                  d > atol + rtol * fabs(ref);
  if (d > e->max_abs || isnan(d)) e->max_abs = d;
  if (rel > e->max_rel || isnan(rel)) {
    e->max_rel = rel;
    e->worst = i;
  }
  if (bad) {
    if (e->first_bad < 0) e->first_bad = i;
    e->n_bad++;
  }
}

tu_err_t tu_compare(const float *got, const double *ref, int64_t n, double atol, double rtol) {
  return tu_compare_bound(got, ref, NULL, n, atol, rtol);
}

tu_err_t tu_compare_bound(const float *got, const double *ref, const double *err, int64_t n,
                          double atol, double rtol) {
  tu_err_t e = {0, 0, -1, -1, 0};
  for (int64_t i = 0; i < n; i++)
    account(&e, i, got[i], ref[i], atol + (err ? err[i] : 0.0), rtol);
  return e;
}

tu_err_t tu_compare_f(const float *got, const float *ref, int64_t n, double atol, double rtol) {
  tu_err_t e = {0, 0, -1, -1, 0};
  for (int64_t i = 0; i < n; i++) account(&e, i, got[i], ref[i], atol, rtol);
  return e;
}

int64_t tu_first_bit_diff(const float *a, const float *b, int64_t n) {
  for (int64_t i = 0; i < n; i++)
    if (memcmp(&a[i], &b[i], sizeof(float)) != 0) return i;
  return -1;
}

mtopt_context_t *tu_cpu_context(void) {
  mtopt_context_config_t cc = MTOPT_CONTEXT_CONFIG_INIT;
  mtopt_context_t *ctx = NULL;
  TU_OK(mtopt_context_create(&cc, &ctx));
  return ctx;
}

int tu_run(Suite *s, int nofork) {
  (void)tu_seed();
  SRunner *sr = srunner_create(s);
  if (nofork) srunner_set_fork_status(sr, CK_NOFORK);
  srunner_run_all(sr, CK_NORMAL);
  const int failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed == 0 ? 0 : 1;
}

mtopt_backend_t tu_backend(void) {
  const char *e = getenv("MTOPT_TEST_BACKEND");
  return e && !strcmp(e, "cuda") ? MTOPT_BACKEND_CUDA : MTOPT_BACKEND_CPU;
}

mtopt_context_t *tu_context(mtopt_backend_t backend) {
  mtopt_context_config_t cc = MTOPT_CONTEXT_CONFIG_INIT;
  cc.backend = backend;
  mtopt_context_t *ctx = NULL;
  TU_OK(mtopt_context_create(&cc, &ctx));
  return ctx;
}

void *tu_alloc(mtopt_backend_t backend, size_t bytes) {
  void *p = NULL;
  if (backend == MTOPT_BACKEND_CPU) {
    /* 256-byte aligned, as cudaMalloc: the same address residues, so both
     * backends take the same vector path over the same data. */
    p = aligned_alloc(256, (bytes + 255) / 256 * 256 + (bytes == 0) * 256);
  } else {
#ifdef MTOPT_HAVE_CUDA
    TU_CUDA(cudaMalloc(&p, bytes ? bytes : 1));
#endif
  }
  ck_assert_ptr_nonnull(p);
  return p;
}

void tu_free(mtopt_backend_t backend, void *p) {
  if (backend == MTOPT_BACKEND_CPU) {
    free(p);
    return;
  }
#ifdef MTOPT_HAVE_CUDA
  TU_CUDA(cudaFree(p));
#endif
}

static void tu_copy(mtopt_backend_t backend, void *dst, const void *src, size_t bytes) {
  if (backend == MTOPT_BACKEND_CPU) {
    memcpy(dst, src, bytes);
    return;
  }
#ifdef MTOPT_HAVE_CUDA
  /* cudaMemcpy waits for the legacy default stream, where the library's
   * contexts enqueue by default. */
  TU_CUDA(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault));
#endif
}

void tu_to_backend(mtopt_backend_t backend, void *dst, const void *src, size_t bytes) {
  tu_copy(backend, dst, src, bytes);
}

void tu_to_host(mtopt_backend_t backend, void *dst, const void *src, size_t bytes) {
  tu_copy(backend, dst, src, bytes);
}

int tu_main(Suite *s) {
  const mtopt_backend_t b = tu_backend();
  if (b == MTOPT_BACKEND_CUDA && !mtopt_backend_available(MTOPT_BACKEND_CUDA)) {
    fprintf(stderr, "no usable CUDA device: skipped\n");
    return 77;
  }
  return tu_run(s, b == MTOPT_BACKEND_CUDA);
}

#ifdef MTOPT_HAVE_CUDA
void tu_capture_step(cudaStream_t stream, enum cudaStreamCaptureMode mode, mtopt_optimizer_t *opt,
                     cudaGraph_t *graph, cudaGraphExec_t *exec) {
  TU_CUDA(cudaStreamBeginCapture(stream, mode));
  TU_OK(mtopt_optimizer_step(opt));
  TU_CUDA(cudaStreamEndCapture(stream, graph));
  TU_CUDA(cudaGraphInstantiate(exec, *graph, 0));
}
#endif

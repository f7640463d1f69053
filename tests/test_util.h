/* Shared test helpers: seeded random tensors, poisoning, error reports, and
 * the suite runner. */
#ifndef MTOPT_TEST_UTIL_H
#define MTOPT_TEST_UTIL_H

#include <check.h>
#include <stdint.h>

#include "mtopt/mtopt.h"

/* Asserts a call succeeded, printing the library's detail if not. */
#define TU_OK(expr)                                                            \
  do {                                                                         \
    mtopt_status_t tu_st_ = (expr);                                            \
    ck_assert_msg(tu_st_ == MTOPT_STATUS_SUCCESS, "%s -> %s", #expr,           \
                  mtopt_last_error());                                         \
  } while (0)

/* Asserts a call failed with the given status and left a message. */
#define TU_FAILS(expr, status)                                                 \
  do {                                                                         \
    mtopt_status_t tu_st_ = (expr);                                            \
    ck_assert_msg(tu_st_ == (status), "%s -> %s, expected %s", #expr,          \
                  mtopt_status_name(tu_st_), mtopt_status_name(status));       \
    ck_assert_msg(mtopt_last_error()[0] != '\0', "%s left no message", #expr); \
  } while (0)

/* splitmix64: small, fast, reproducible from the seed. */
typedef struct {
  uint64_t s;
} tu_rng_t;

/* The run's seed: MTOPT_TEST_SEED if set, else from the clock. Printed once,
 * so a failing run can be replayed. */
uint64_t tu_seed(void);
void tu_rng_init(tu_rng_t *r, uint64_t seed);
uint64_t tu_next(tu_rng_t *r);
/* Uniform in [lo, hi). */
double tu_uniform(tu_rng_t *r, double lo, double hi);
/* Uniform integer in [lo, hi]. */
int64_t tu_int(tu_rng_t *r, int64_t lo, int64_t hi);
/* Fills x with uniform values in [lo, hi), no exact zeros. */
void tu_fill(tu_rng_t *r, float *x, int64_t n, float lo, float hi);
/* Fills x with NaN, so unwritten outputs show. */
void tu_poison(float *x, int64_t n);

/* Comparison against a reference: a failure names the worst element and the
 * first bad one. */
typedef struct {
  double max_abs;  /* max |got - ref| */
  double max_rel;  /* max |got - ref| / max(|ref|, tiny) */
  int64_t worst;   /* index of max_rel */
  int64_t first_bad; /* first index over tolerance, or -1 */
  int64_t n_bad;
} tu_err_t;

/* Element i is bad when |got-ref| > atol + rtol*|ref|, or got is not finite
 * where ref is. */
tu_err_t tu_compare(const float *got, const double *ref, int64_t n, double atol,
                    double rtol);
tu_err_t tu_compare_f(const float *got, const float *ref, int64_t n, double atol,
                      double rtol);
/* As tu_compare, with element i's atol raised by err[i] (a per-element
 * conditioning bound; err may be NULL). */
tu_err_t tu_compare_bound(const float *got, const double *ref, const double *err, int64_t n,
                          double atol, double rtol);
/* Bit-for-bit equality; returns the first differing index or -1. */
int64_t tu_first_bit_diff(const float *a, const float *b, int64_t n);

/* Asserts a comparison passed, printing where it did not. */
#define TU_ASSERT_CLOSE(e, what)                                               \
  ck_assert_msg((e).n_bad == 0,                                                \
                "%s: %lld bad, first at %lld, worst rel %.3g at %lld (abs %.3g)", \
                (what), (long long)(e).n_bad, (long long)(e).first_bad,        \
                (e).max_rel, (long long)(e).worst, (e).max_abs)

/* A CPU context with the default config. */
mtopt_context_t *tu_cpu_context(void);

/* The backend a suite that runs on either is asked to use:
 * MTOPT_TEST_BACKEND=cuda selects CUDA, anything else (or unset) the CPU. */
mtopt_backend_t tu_backend(void);
/* A context of that backend (device 0 on CUDA). */
mtopt_context_t *tu_context(mtopt_backend_t backend);
/* Memory the backend's kernels can use (cudaMalloc on CUDA; 256-byte aligned
 * on both), and copies to and from host memory; they assert on failure. */
void *tu_alloc(mtopt_backend_t backend, size_t bytes);
void tu_free(mtopt_backend_t backend, void *p);
void tu_to_backend(mtopt_backend_t backend, void *dst, const void *src, size_t bytes);
void tu_to_host(mtopt_backend_t backend, void *dst, const void *src, size_t bytes);
/* main() of a suite that runs on either backend: 77 (skipped) when the
 * backend is CUDA and no GPU is present; CUDA suites run without forking. */
int tu_main(Suite *s);

/* Runs a suite and returns the process exit code (0 if all passed). nofork:
 * run in-process (CUDA suites: CUDA must not be touched before a fork). */
int tu_run(Suite *s, int nofork);

#ifdef MTOPT_HAVE_CUDA
#include <cuda_runtime_api.h>
/* A CUDA runtime call that must succeed (else the test fails with its error). */
#define TU_CUDA(expr)                                                          \
  do {                                                                         \
    cudaError_t tu_e_ = (expr);                                                \
    ck_assert_msg(tu_e_ == cudaSuccess, "%s: %s", #expr, cudaGetErrorString(tu_e_)); \
  } while (0)
/* One mtopt_optimizer_step of opt captured on stream (capture mode mode)
 * into *graph, instantiated into *exec. */
void tu_capture_step(cudaStream_t stream, enum cudaStreamCaptureMode mode, mtopt_optimizer_t *opt,
                     cudaGraph_t *graph, cudaGraphExec_t *exec);
#endif

#endif /* MTOPT_TEST_UTIL_H */

/* mtopt_bench: the random patterns, buffer layouts, fills and hashes of the
 * weights, and the timing loop; what differs between CPU and CUDA goes
 * through b->be (bench_cpu.c, bench_cuda.c). */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"

/* Tensors in a pool start on 256-byte boundaries, as a caching allocator
 * would place them. */
#define POOL_ALIGN 64

/* ------------------------------------------------------------- samples -- */

double bench_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int dcmp(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double bench_median(double *x, int n) {
  if (n <= 0) return NAN;
  qsort(x, (size_t)n, sizeof *x, dcmp);
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

/* Appends n values to a pooled sample array. */
int bench_pool(double **dst, int *nd, const double *x, int n, row_t *row) {
  double *p = realloc(*dst, (size_t)(*nd + n) * sizeof *p);
  if (!p) {
    NOTE(row, "out of host memory");
    return -1;
  }
  memcpy(p + *nd, x, (size_t)n * sizeof *x);
  *dst = p;
  *nd += n;
  return 0;
}

/* ---------------------------------------------------- patterns, hashing -- */

static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* Uniform magnitude in [lo, 1), random sign: never zero. */
static void make_pattern(float *x, int64_t n, uint64_t seed, float lo) {
  for (int64_t i = 0; i < n; i++) {
    const uint64_t r = splitmix(&seed);
    const float u = (float)((double)(r >> 40) * 0x1.0p-24); /* [0, 1) */
    const float mag = lo + (1.0f - lo) * u;
    x[i] = (r & 1) ? -mag : mag;
  }
}

int bench_patterns_make(float *pat[2], uint16_t *pat16[2]) {
  for (int i = 0; i < 2; i++) {
    pat[i] = malloc((size_t)PATTERN_N * sizeof(float));
    pat16[i] = malloc((size_t)PATTERN_N * sizeof(uint16_t));
    if (!pat[i] || !pat16[i]) return -1;
  }
  /* Weights in ±[0.1, 1), gradients in ±[0.01, 1): never zero. */
  make_pattern(pat[0], PATTERN_N, 0x5EED0001ull, 0.1f);
  make_pattern(pat[1], PATTERN_N, 0x5EED0002ull, 0.01f);
  for (int i = 0; i < 2; i++)
    for (int64_t j = 0; j < PATTERN_N; j++) pat16[i][j] = ref_f32_to_bf16(pat[i][j]); /* finite */
  return 0;
}

/* Order-free hash of one tensor's bits (n elements of esize bytes): any
 * changed element changes it with overwhelming probability, and pieces can
 * be summed in any order. */
uint64_t bench_hash_bytes(const void *x, int64_t n, int esize, int64_t base) {
  uint64_t h = 0;
#pragma omp parallel for reduction(+ : h) schedule(static) if (n > 262144)
  for (int64_t j = 0; j < n; j++) {
    uint32_t bits = 0;
    memcpy(&bits, (const char *)x + j * esize, (size_t)esize);
    uint64_t z = (uint64_t)bits + (uint64_t)(base + j + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    h += z ^ (z >> 31);
  }
  return h;
}

/* ------------------------------------------------------ memory, layouts -- */

int bench_layout_make(const bench_shape_t *s, int pooled, layout_t *L) {
  L->off = malloc((size_t)(s->n ? s->n : 1) * sizeof *L->off);
  if (!L->off) return -1;
  int64_t at = 0;
  for (int64_t t = 0; t < s->n; t++) {
    if (pooled) at = (at + POOL_ALIGN - 1) / POOL_ALIGN * POOL_ALIGN;
    L->off[t] = at;
    at += s->numel[t];
  }
  L->len = at;
  return 0;
}

float *bench_alloc(bench_t *b, int64_t n, row_t *row) {
  return b->be->alloc(b, (size_t)(n > 0 ? n : 1) * sizeof(float), row);
}

void bench_free(bench_t *b, void *p) {
  if (p) b->be->release(b, p);
}

/* Writes the pattern stream `which` into every tensor of the layout. */
int bench_fill(bench_t *b, void *buf, const bench_shape_t *s, const layout_t *L, int which,
               const uint8_t *esize, int slot, row_t *row) {
  int64_t ps = 0; /* position in the stream */
  for (int64_t t = 0; t < s->n; t++) {
    int64_t k = ps % PATTERN_N, rem = s->numel[t];
    char *dst = (char *)buf + L->off[t] * slot;
    while (rem > 0) {
      const int64_t len = rem < PATTERN_N - k ? rem : PATTERN_N - k;
      if (b->be->put(b, dst, which, k, len, esize[t], row)) return -1;
      dst += len * esize[t];
      rem -= len;
      k = 0;
    }
    ps += s->numel[t];
  }
  return b->be->fill_wait(b, row);
}

/* ------------------------------------------------------------- timing -- */

/* Median time per step, after warmup untimed steps; how a sample is taken
 * is the backend's (b->be->time). */
int bench_time_steps(bench_t *b, stepper_t *sp, int warmup, int iters, row_t *row) {
  double *x = malloc((size_t)iters * sizeof *x);
  if (!x) {
    NOTE(row, "out of host memory");
    return -1;
  }
  int rc = -1;
  for (int i = 0; i < warmup; i++)
    if (sp->step(b, sp, row)) goto out;
  if (b->be->sync(b, row)) goto out;
  row->k = 1;
  rc = b->be->time(b, sp, iters, x, row);
out:
  free(x);
  return rc;
}

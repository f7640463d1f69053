/* mtopt_bench's CPU backend: host memory, wall-clock timing around each
 * step, a threaded memcpy as the ceiling; no graphs. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "bench.h"

static int cpu_setup(bench_t *b) { return 0; }

static void cpu_teardown(bench_t *b) {}

static void cpu_device_name(const bench_t *b, char *out, size_t n) {
  snprintf(out, n, "unknown");
  FILE *f = fopen("/proc/cpuinfo", "r");
  if (!f) return;
  char line[512];
  while (fgets(line, sizeof line, f)) {
    if (strncmp(line, "model name", 10) == 0) {
      const char *c = strchr(line, ':');
      if (c) {
        c++;
        while (*c == ' ') c++;
        snprintf(out, n, "%s", c);
        out[strcspn(out, "\r\n")] = '\0';
      }
      break;
    }
  }
  fclose(f);
}

static void *cpu_alloc(bench_t *b, size_t bytes, row_t *row) {
  void *p = aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!p) NOTE(row, "cannot allocate %zu bytes of host memory", bytes);
  return p;
}

static void cpu_release(bench_t *b, void *p) { free(p); }

static int cpu_put(bench_t *b, void *dst, int which, int64_t k, int64_t len, int esize,
                   row_t *row) {
  if (esize == 4)
    memcpy(dst, b->pat[which] + k, (size_t)len * 4);
  else
    memcpy(dst, b->pat16[which] + k, (size_t)len * 2);
  return 0;
}

/* Nothing is queued on the CPU: every call has finished when it returns. */
static int cpu_sync(bench_t *b, row_t *row) { return 0; }

static int cpu_hash(bench_t *b, const void *buf, const bench_shape_t *s, const layout_t *L,
                    const uint8_t *esize, int slot, uint64_t *out, row_t *row) {
  for (int64_t t = 0; t < s->n; t++)
    out[t] = bench_hash_bytes((const char *)buf + L->off[t] * slot, s->numel[t], esize[t], 0);
  return 0;
}

static int cpu_copy_prepare(bench_t *b, stepper_t *sp, row_t *row) {
  memset(sp->src, 0x3f, sp->bytes);
  memset(sp->dst, 0, sp->bytes);
  return 0;
}

/* One slice per thread: a single-threaded memcpy would not be the machine's
 * ceiling. */
static int cpu_copy_step(bench_t *b, stepper_t *sp, row_t *row) {
  const size_t bytes = sp->bytes;
  char *d = sp->dst;
  const char *s = sp->src;
#pragma omp parallel num_threads(b->nthreads)
  {
#ifdef _OPENMP
    const size_t id = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
#else
    const size_t id = 0, nt = 1;
#endif
    const size_t lo = bytes / nt * id / 64 * 64;
    const size_t hi = id + 1 == nt ? bytes : bytes / nt * (id + 1) / 64 * 64;
    memcpy(d + lo, s + lo, hi - lo);
  }
  return 0;
}

/* Wall clock around each step. */
static int cpu_time(bench_t *b, stepper_t *sp, int iters, double *x, row_t *row) {
  for (int i = 0; i < iters; i++) {
    const double t0 = bench_now_s();
    if (sp->step(b, sp, row)) return -1;
    x[i] = (bench_now_s() - t0) * 1e3;
  }
  return bench_pool(&row->samples, &row->nsamples, x, iters, row);
}

static void cpu_clear_error(bench_t *b) {}

const bench_backend_t bench_backend_cpu = {
    .name = "cpu",
    .backend = MTOPT_BACKEND_CPU,
    .setup = cpu_setup,
    .teardown = cpu_teardown,
    .device_name = cpu_device_name,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .put = cpu_put,
    .fill_wait = cpu_sync,
    .hash = cpu_hash,
    .sync = cpu_sync,
    .copy_prepare = cpu_copy_prepare,
    .copy_step = cpu_copy_step,
    .time = cpu_time,
    .graph_capture = NULL, /* no graphs on the CPU */
    .graph_launch = NULL,
    .graph_destroy = NULL,
    .clear_error = cpu_clear_error,
};

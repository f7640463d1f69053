/* mtopt_bench's CPU backend: host memory, wall-clock timing around each
 * step, three threaded copies for the floor (the fastest counts), the
 * reference AdamW as one OpenMP loop; no graphs. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__SSE2__)
#include <emmintrin.h>
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

/* Large buffers on 2 MiB boundaries, so that the copies' per-thread slices
 * (whole 2 MiB pieces) start on page boundaries. Transparent huge pages are
 * not asked for: on the VM this was written on, madvise(MADV_HUGEPAGE) made
 * the first touch of 3.5 GB take 7 s instead of 1 and no copy faster. */
#define HUGE_PAGE ((size_t)2 << 20)

static void *cpu_alloc(bench_t *b, size_t bytes, row_t *row) {
  const size_t align = bytes >= HUGE_PAGE ? HUGE_PAGE : 256;
  void *p = aligned_alloc(align, (bytes + align - 1) / align * align);
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

static int cpu_get(bench_t *b, void *host, const void *src, size_t bytes, row_t *row) {
  memcpy(host, src, bytes);
  return 0;
}

static int cpu_set(bench_t *b, void *dst, const void *host, size_t bytes, row_t *row) {
  memcpy(dst, host, bytes);
  return 0;
}

static int cpu_zero(bench_t *b, void *p, size_t bytes, row_t *row) {
  memset(p, 0, bytes);
  return 0;
}

/* ---------------------------------------------------------------- copies -- */

/* The copies split the bytes into one slice per thread, on 2 MiB boundaries
 * (whole huge pages), and the same threads write both buffers first, so that
 * each page is where its thread runs (first touch). */
static void slice(size_t bytes, size_t *lo, size_t *hi) {
#ifdef _OPENMP
  const size_t id = (size_t)omp_get_thread_num(), nt = (size_t)omp_get_num_threads();
#else
  const size_t id = 0, nt = 1;
#endif
  const size_t pages = (bytes + HUGE_PAGE - 1) / HUGE_PAGE;
  *lo = pages * id / nt * HUGE_PAGE;
  *hi = pages * (id + 1) / nt * HUGE_PAGE;
  if (*lo > bytes) *lo = bytes;
  if (*hi > bytes) *hi = bytes;
}

static int cpu_copy_prepare(bench_t *b, stepper_t *sp, row_t *row) {
  char *d = sp->dst, *s = sp->src;
#pragma omp parallel num_threads(b->nthreads)
  {
    size_t lo, hi;
    slice(sp->bytes, &lo, &hi);
    memset(s + lo, 0x3f, hi - lo);
    memset(d + lo, 0, hi - lo);
  }
  return 0;
}

/* Non-temporal 16-byte stores (SSE2): the written lines are not read first
 * and do not evict the source from the caches. Head and tail by memcpy. */
static void copy_stream(char *d, const char *s, size_t n) {
#if defined(__SSE2__)
  size_t head = (16 - ((uintptr_t)d & 15)) & 15;
  if (head > n) head = n;
  memcpy(d, s, head);
  size_t i = head;
  for (; i + 64 <= n; i += 64) {
    const __m128i *x = (const __m128i *)(s + i);
    __m128i *y = (__m128i *)(d + i);
    const __m128i a = _mm_loadu_si128(x), c = _mm_loadu_si128(x + 1),
                  e = _mm_loadu_si128(x + 2), f = _mm_loadu_si128(x + 3);
    _mm_stream_si128(y, a);
    _mm_stream_si128(y + 1, c);
    _mm_stream_si128(y + 2, e);
    _mm_stream_si128(y + 3, f);
  }
  memcpy(d + i, s + i, n - i);
  _mm_sfence();
#else
  memcpy(d, s, n);
#endif
}

/* In place: read each 8-byte word of dst and write it back changed, in four
 * interleaved streams (the slice cut in four, a 64-byte line of each in
 * turn). The traffic of an update (every written line was just read, so no
 * line is fetched for the write), over the same bytes; four streams because
 * a step runs several (AdamW: w, m, v written, g read), and on the 2-core VM
 * this was written on one core's lone stream leaves bandwidth unused (four
 * ran 5-25% faster than one and than glibc's memcpy; eight no faster than
 * four, sixteen slower; four non-temporal streams 4x slower). */
static void copy_in_place(char *d, size_t n) {
  const size_t part = n / 4 / 64 * 64;
  for (size_t i = 0; i < part; i += 64) {
    for (int k = 0; k < 4; k++) {
      uint64_t *x = (uint64_t *)(d + (size_t)k * part + i);
      for (int j = 0; j < 8; j++) x[j] = ~x[j];
    }
  }
  uint64_t *x = (uint64_t *)(d + 4 * part);
  for (size_t i = 0; i < (n - 4 * part) / 8; i++) x[i] = ~x[i];
}

static const char *const cpu_copy_names[] = {"memcpy", "nt-store", "in-place-x4"};

static int cpu_copy_step(bench_t *b, stepper_t *sp, row_t *row) {
  char *d = sp->dst;
  const char *s = sp->src;
  const int v = sp->variant;
#pragma omp parallel num_threads(b->nthreads)
  {
    size_t lo, hi;
    slice(sp->bytes, &lo, &hi);
    if (v == 0)
      memcpy(d + lo, s + lo, hi - lo);
    else if (v == 1)
      copy_stream(d + lo, s + lo, hi - lo);
    else
      copy_in_place(d + lo, hi - lo);
  }
  return 0;
}

/* ------------------------------------------------------------- ref-adamw -- */

/* The reference AdamW on the CPU: one static OpenMP loop over the elements,
 * vectorised by the compiler (the buffers do not overlap); pooled, element i
 * only where its group's count (ref_adamw.h) covers it. */
static int cpu_ref_step(bench_t *b, ref_adamw_t *r, row_t *row) {
  float *restrict w = r->w, *restrict m = r->m, *restrict v = r->v;
  const ref_adamw_hp_t hp = r->hp;
  const int64_t n = r->n;
  const uint8_t *valid = r->valid;
  const int bf16 = r->layout == REF_ADAMW_BF16_MASTER;
  const float *restrict g = r->g;
  const uint16_t *restrict g16 = r->g;
  uint16_t *restrict p = r->p;
  if (!valid && !bf16) {
#pragma omp parallel for simd schedule(static) num_threads(b->nthreads)
    for (int64_t i = 0; i < n; i++) ref_adamw_elem(&w[i], g[i], &m[i], &v[i], &hp);
    return 0;
  }
#pragma omp parallel for schedule(static) num_threads(b->nthreads)
  for (int64_t i = 0; i < n; i++) {
    if (valid && valid[i / 4] <= i % 4) continue;
    ref_adamw_elem(&w[i], bf16 ? ref_bf16_to_f32(g16[i]) : g[i], &m[i], &v[i], &hp);
    if (bf16) p[i] = ref_f32_to_bf16(w[i]);
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
    .get = cpu_get,
    .set = cpu_set,
    .zero = cpu_zero,
    .sync = cpu_sync,
    .ncopy = sizeof cpu_copy_names / sizeof cpu_copy_names[0],
    .copy_names = cpu_copy_names,
    .copy_prepare = cpu_copy_prepare,
    .copy_step = cpu_copy_step,
    .ref_step = cpu_ref_step,
    .time = cpu_time,
    .graph_capture = NULL, /* no graphs on the CPU */
    .graph_launch = NULL,
    .graph_destroy = NULL,
    .clear_error = cpu_clear_error,
};

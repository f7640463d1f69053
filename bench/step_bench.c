/*
 * mtopt_bench: times one optimizer step over a model's parameter list, in the
 * manner of nccl-tests (one binary, the same flags everywhere, each figure
 * printed with its definition).
 *
 * Modes, all on the same shapes in one run, each with its own allocations
 * (freed before the next mode, so the peak is one mode's memory):
 *   flat         one optimizer over one tensor of the total element count: one
 *                contiguous buffer, the floor a fused step can reach
 *   fused        one optimizer over all tensors, one mtopt_optimizer_step
 *   loop         one optimizer per tensor, one step call per tensor: how users
 *                step a model with a per-tensor kernel today
 *   mixed        the full mixed-precision step: dynamic loss scale, global-norm
 *                clipping (max_grad_norm 1), then the update
 *   graph        CUDA: one fused step captured in a CUDA graph, graph replays
 *   graph-mixed  CUDA: the mixed step captured the same way
 *   memcpy       the reference ceiling: a copy that moves the same bytes per
 *                parameter as the step (device-to-device cudaMemcpy on CUDA,
 *                a threaded memcpy on the CPU)
 *
 * With --check 1 (default), before timing, every mode that computes the plain
 * step (flat, fused, loop, graph) applies one step from the same random start
 * and its weights must equal, bit for bit, those of the first such mode
 * (flat's for AdamW/Adam/SGD, where one buffer computes the same elements; for
 * LAMB, whose trust ratio is per tensor, the reference is fused). The mixed
 * modes must not skip a step.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "mtopt/mtopt.h"
#include "shapes.h"

#ifdef MTOPT_HAVE_CUDA
#include <cuda_runtime.h>
#if defined(__has_include)
#if __has_include("mtopt/mtopt_cuda.h")
#include "mtopt/mtopt_cuda.h"
#define BENCH_HAVE_SET_STREAM 1
#endif
#endif
#endif

#ifndef MTOPT_GIT_COMMIT
#define MTOPT_GIT_COMMIT ""
#endif
#ifndef MTOPT_SOURCE_DIR
#define MTOPT_SOURCE_DIR "."
#endif

/* Values come from two fixed random patterns (weights, gradients) of an odd
 * length, read as one stream over the tensors in registration order, so that
 * every layout (pooled, flat) holds the same values per tensor: that is what
 * makes the bit-for-bit check between modes possible. */
#define PATTERN_N ((int64_t)(1 << 22) + 15)
/* Tensors in a pool start on 256-byte boundaries, as a caching allocator
 * would place them. */
#define POOL_ALIGN 64
#define MAX_ITERS 100000

enum {
  M_FLAT,
  M_FUSED,
  M_LOOP,
  M_MIXED,
  M_GRAPH,
  M_GRAPH_MIXED,
  M_MEMCPY,
  M_COUNT
};
static const char *const mode_names[M_COUNT] = {"flat",  "fused",       "loop",  "mixed",
                                                "graph", "graph-mixed", "memcpy"};

typedef struct {
  int cuda, device, threads;
  char **shapes;
  int nshapes;
  mtopt_optimizer_kind_t kind;
  int iters, warmup, loop_iters, check, graph, repeat;
  int modes[M_COUNT];
  const char *json, *csv;
  int64_t chunk_size;
} opts_t;

typedef struct {
  const opts_t *o;
  mtopt_context_t *ctx;
  float *pat[2];  /* host patterns: weights, gradients */
  float *dpat[2]; /* the same on the device (CUDA) */
  int nthreads;   /* effective CPU threads */
#ifdef MTOPT_HAVE_CUDA
  cudaStream_t stream;
  float *staging; /* pinned, STAGING_N floats */
#endif
} bench_t;
#define STAGING_N ((int64_t)1 << 24)

typedef struct {
  char shape[256];
  const char *mode;
  int64_t tensors, params, launches;
  int bpp, iters, k;
  double ms, host_us, gbps, frac;
  const char *check; /* "ok", "ref", "FAIL", "-" */
  int64_t skipped;   /* mixed modes: steps skipped (must be 0) */
  int ok;
  char note[512];
  /* Samples pooled over --repeat rounds; ms and host_us are their medians. */
  double *samples, *host_samples;
  int nsamples, nhost;
} row_t;

/* ------------------------------------------------------------- helpers -- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int dcmp(const void *a, const void *b) {
  const double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *x, int n) {
  if (n <= 0) return NAN;
  qsort(x, (size_t)n, sizeof *x, dcmp);
  return n % 2 ? x[n / 2] : 0.5 * (x[n / 2 - 1] + x[n / 2]);
}

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

/* Order-free hash of one tensor's bits: any changed element changes it with
 * overwhelming probability, and pieces can be summed in any order. */
static uint64_t hash_range(const float *x, int64_t n, int64_t base) {
  uint64_t h = 0;
#pragma omp parallel for reduction(+ : h) schedule(static) if (n > 262144)
  for (int64_t j = 0; j < n; j++) {
    uint32_t bits;
    memcpy(&bits, &x[j], 4);
    uint64_t z = (uint64_t)bits + (uint64_t)(base + j + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    h += z ^ (z >> 31);
  }
  return h;
}

/* ------------------------------------------------------ memory, layouts -- */

typedef struct {
  int64_t *off; /* start of each tensor in the buffer, in floats */
  int64_t len;  /* buffer length in floats */
} layout_t;

static int layout_make(const bench_shape_t *s, int pooled, layout_t *L) {
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

static float *buf_alloc(bench_t *b, int64_t n, char *note, size_t nl) {
  const size_t bytes = (size_t)(n > 0 ? n : 1) * sizeof(float);
  void *p = NULL;
  if (b->o->cuda) {
#ifdef MTOPT_HAVE_CUDA
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      snprintf(note, nl, "cudaMalloc(%zu bytes): %s", bytes, cudaGetErrorString(e));
      return NULL;
    }
#endif
  } else {
    p = aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (!p) snprintf(note, nl, "cannot allocate %zu bytes of host memory", bytes);
  }
  return p;
}

static void buf_free(bench_t *b, void *p) {
  if (!p) return;
#ifdef MTOPT_HAVE_CUDA
  if (b->o->cuda) {
    cudaFree(p);
    return;
  }
#endif
  free(p);
}

/* Writes the pattern stream `which` into every tensor of the layout. */
static int fill(bench_t *b, float *buf, const bench_shape_t *s, const layout_t *L, int which,
                char *note, size_t nl) {
  int64_t ps = 0; /* position in the stream */
  for (int64_t t = 0; t < s->n; t++) {
    int64_t k = ps % PATTERN_N, rem = s->numel[t];
    float *dst = buf + L->off[t];
    while (rem > 0) {
      const int64_t len = rem < PATTERN_N - k ? rem : PATTERN_N - k;
      if (b->o->cuda) {
#ifdef MTOPT_HAVE_CUDA
        const cudaError_t e = cudaMemcpyAsync(dst, b->dpat[which] + k, (size_t)len * 4,
                                              cudaMemcpyDeviceToDevice, b->stream);
        if (e != cudaSuccess) {
          snprintf(note, nl, "fill: cudaMemcpyAsync: %s", cudaGetErrorString(e));
          return -1;
        }
#endif
      } else {
        memcpy(dst, b->pat[which] + k, (size_t)len * 4);
      }
      dst += len;
      rem -= len;
      k = 0;
    }
    ps += s->numel[t];
  }
#ifdef MTOPT_HAVE_CUDA
  if (b->o->cuda) {
    const cudaError_t e = cudaStreamSynchronize(b->stream);
    if (e != cudaSuccess) {
      snprintf(note, nl, "fill: %s", cudaGetErrorString(e));
      return -1;
    }
  }
#endif
  return 0;
}

/* Per-tensor hashes of the weights in a layout (offsets increase with t). */
static int hash_layout(bench_t *b, const float *buf, const bench_shape_t *s, const layout_t *L,
                       uint64_t *out, char *note, size_t nl) {
  if (!b->o->cuda) {
    for (int64_t t = 0; t < s->n; t++) out[t] = hash_range(buf + L->off[t], s->numel[t], 0);
    return 0;
  }
#ifdef MTOPT_HAVE_CUDA
  /* Through the pinned staging buffer: runs of small tensors in one copy,
   * big tensors in pieces. */
  cudaError_t e = cudaSuccess;
  int64_t t = 0;
  while (t < s->n && e == cudaSuccess) {
    if (s->numel[t] > STAGING_N / 2) {
      out[t] = 0;
      for (int64_t j = 0; j < s->numel[t] && e == cudaSuccess; j += STAGING_N) {
        const int64_t len = s->numel[t] - j < STAGING_N ? s->numel[t] - j : STAGING_N;
        e = cudaMemcpy(b->staging, buf + L->off[t] + j, (size_t)len * 4,
                       cudaMemcpyDeviceToHost);
        if (e == cudaSuccess) out[t] += hash_range(b->staging, len, j);
      }
      t++;
      continue;
    }
    int64_t u = t;
    while (u < s->n && s->numel[u] <= STAGING_N / 2 &&
           L->off[u] + s->numel[u] - L->off[t] <= STAGING_N)
      u++;
    e = cudaMemcpy(b->staging, buf + L->off[t],
                   (size_t)(L->off[u - 1] + s->numel[u - 1] - L->off[t]) * 4,
                   cudaMemcpyDeviceToHost);
    for (int64_t i = t; i < u && e == cudaSuccess; i++)
      out[i] = hash_range(b->staging + (L->off[i] - L->off[t]), s->numel[i], 0);
    t = u;
  }
  if (e != cudaSuccess) {
    snprintf(note, nl, "check: copying weights to the host: %s", cudaGetErrorString(e));
    return -1;
  }
#endif
  return 0;
}

/* --------------------------------------------------------------- steps -- */

typedef struct {
  int mode;
  mtopt_optimizer_t **opts;
  int64_t nopt;
  void *src, *dst; /* memcpy */
  size_t bytes;
#ifdef MTOPT_HAVE_CUDA
  cudaGraphExec_t exec;
#endif
} stepper_t;

#define NOTE(row, ...) snprintf((row)->note, sizeof (row)->note, __VA_ARGS__)

static int do_step(bench_t *b, stepper_t *sp, row_t *row) {
  switch (sp->mode) {
  case M_MEMCPY:
    if (b->o->cuda) {
#ifdef MTOPT_HAVE_CUDA
      const cudaError_t e = cudaMemcpyAsync(sp->dst, sp->src, sp->bytes,
                                            cudaMemcpyDeviceToDevice, b->stream);
      if (e != cudaSuccess) {
        NOTE(row, "cudaMemcpyAsync: %s", cudaGetErrorString(e));
        return -1;
      }
#endif
    } else {
      /* One slice per thread: a single-threaded memcpy would not be the
       * machine's ceiling. */
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
    }
    return 0;
  case M_GRAPH:
  case M_GRAPH_MIXED: {
#ifdef MTOPT_HAVE_CUDA
    const cudaError_t e = cudaGraphLaunch(sp->exec, b->stream);
    if (e != cudaSuccess) {
      NOTE(row, "cudaGraphLaunch: %s", cudaGetErrorString(e));
      return -1;
    }
#endif
    return 0;
  }
  default:
    for (int64_t i = 0; i < sp->nopt; i++) {
      const mtopt_status_t st = mtopt_optimizer_step(sp->opts[i]);
      if (st != MTOPT_STATUS_SUCCESS) {
        NOTE(row, "mtopt_optimizer_step -> %s: %s", mtopt_status_name(st), mtopt_last_error());
        return -1;
      }
    }
    return 0;
  }
}

static int sync_all(bench_t *b, row_t *row) {
  if (!b->o->cuda) return 0;
#ifdef MTOPT_HAVE_CUDA
  const cudaError_t e = cudaStreamSynchronize(b->stream);
  if (e != cudaSuccess) {
    NOTE(row, "cudaStreamSynchronize: %s", cudaGetErrorString(e));
    return -1;
  }
#endif
  return 0;
}

/* Median time per step. CPU: wall clock around each step. CUDA: events
 * between samples of K back-to-back steps (K > 1 only for steps under
 * 0.25 ms, so the event resolution and launch gaps do not dominate), and
 * separately the host time to return from one step call on an idle stream. */
/* Appends n values to a pooled sample array. */
static int pool(double **dst, int *nd, const double *x, int n) {
  double *p = realloc(*dst, (size_t)(*nd + n) * sizeof *p);
  if (!p) return -1;
  memcpy(p + *nd, x, (size_t)n * sizeof *x);
  *dst = p;
  *nd += n;
  return 0;
}

static int time_steps(bench_t *b, stepper_t *sp, int warmup, int iters, row_t *row) {
  double *x = malloc((size_t)iters * sizeof *x);
  if (!x) {
    NOTE(row, "out of host memory");
    return -1;
  }
  int rc = -1;
  for (int i = 0; i < warmup; i++)
    if (do_step(b, sp, row)) goto out;
  if (sync_all(b, row)) goto out;
  row->k = 1;
  if (!b->o->cuda) {
    for (int i = 0; i < iters; i++) {
      const double t0 = now_s();
      if (do_step(b, sp, row)) goto out;
      x[i] = (now_s() - t0) * 1e3;
    }
    if (pool(&row->samples, &row->nsamples, x, iters)) {
      NOTE(row, "out of host memory");
      goto out;
    }
    rc = 0;
    goto out;
  }
#ifdef MTOPT_HAVE_CUDA
  {
    cudaEvent_t *ev = calloc((size_t)iters + 1, sizeof *ev);
    int nev = 0;
    cudaError_t e = ev ? cudaSuccess : cudaErrorMemoryAllocation;
    for (; nev <= iters && e == cudaSuccess; nev++) e = cudaEventCreate(&ev[nev]);
    if (e != cudaSuccess) {
      NOTE(row, "cudaEventCreate: %s", cudaGetErrorString(e));
      goto cuda_out;
    }
    /* Probe one step to choose K. */
    float ms = 0.0f;
    cudaEventRecord(ev[0], b->stream);
    if (do_step(b, sp, row)) goto cuda_out;
    cudaEventRecord(ev[1], b->stream);
    e = cudaEventSynchronize(ev[1]);
    if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, ev[0], ev[1]);
    if (e != cudaSuccess) {
      NOTE(row, "timing: %s", cudaGetErrorString(e));
      goto cuda_out;
    }
    int K = 1;
    if (ms < 0.25f) K = (int)ceil(0.25 / (ms > 0.002f ? ms : 0.002f));
    if (K > 64) K = 64;
    row->k = K;
    cudaEventRecord(ev[0], b->stream);
    for (int i = 0; i < iters; i++) {
      for (int k = 0; k < K; k++)
        if (do_step(b, sp, row)) goto cuda_out;
      cudaEventRecord(ev[i + 1], b->stream);
    }
    e = cudaEventSynchronize(ev[iters]);
    for (int i = 0; i < iters && e == cudaSuccess; i++) {
      e = cudaEventElapsedTime(&ms, ev[i], ev[i + 1]);
      x[i] = (double)ms / K;
    }
    if (e != cudaSuccess) {
      NOTE(row, "timing: %s", cudaGetErrorString(e));
      goto cuda_out;
    }
    if (pool(&row->samples, &row->nsamples, x, iters)) {
      NOTE(row, "out of host memory");
      goto cuda_out;
    }
    /* Host time of one call, the stream idle each time. */
    const int H = iters < 20 ? iters : 20;
    for (int i = 0; i < H; i++) {
      if (sync_all(b, row)) goto cuda_out;
      const double t0 = now_s();
      if (do_step(b, sp, row)) goto cuda_out;
      x[i] = (now_s() - t0) * 1e6;
    }
    if (sync_all(b, row)) goto cuda_out;
    if (pool(&row->host_samples, &row->nhost, x, H)) {
      NOTE(row, "out of host memory");
      goto cuda_out;
    }
    rc = 0;
  cuda_out:
    for (int i = 0; i < nev; i++) cudaEventDestroy(ev[i]);
    free(ev);
  }
#endif
out:
  free(x);
  return rc;
}

/* ---------------------------------------------------------------- modes -- */

static mtopt_optimizer_config_t make_config(const opts_t *o, int mixed) {
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  c.kind = o->kind;
  c.chunk_size = o->chunk_size;
  if (o->kind == MTOPT_OPTIMIZER_SGD) {
    c.lr = 1e-2f;
    c.momentum = 0.9f; /* the common case, and a state buffer to move */
  }
  if (mixed) {
    c.max_grad_norm = 1.0f;
    c.loss_scale = 65536.0f; /* GradScaler's initial scale */
    c.dynamic_loss_scale = 1;
  }
  return c;
}

/* One optimizer over tensors [t0, t1) of the layout. */
static mtopt_status_t make_opt(bench_t *b, const bench_shape_t *s, const layout_t *L, float *w,
                               float *g, int64_t t0, int64_t t1,
                               const mtopt_optimizer_config_t *cfg, mtopt_tensor_list_t **list,
                               mtopt_optimizer_t **opt) {
  mtopt_status_t st = mtopt_tensor_list_create(b->ctx, list);
  for (int64_t t = t0; t < t1 && st == MTOPT_STATUS_SUCCESS; t++)
    st = mtopt_tensor_list_add_f32(*list, w + L->off[t], g + L->off[t], s->numel[t], 0u, NULL);
  if (st == MTOPT_STATUS_SUCCESS) st = mtopt_optimizer_create(b->ctx, *list, cfg, opt);
  return st;
}

typedef struct {
  uint64_t *hash; /* reference per-tensor hashes */
  const char *from; /* the mode that produced them, or NULL */
  int bpp;          /* bytes per param of the plain step, for memcpy */
} shape_state_t;

static int compare_to_ref(shape_state_t *ss, const uint64_t *h, const bench_shape_t *s,
                          row_t *row) {
  if (!ss->from) {
    memcpy(ss->hash, h, (size_t)s->n * sizeof *h);
    ss->from = row->mode;
    row->check = "ref";
    return 0;
  }
  for (int64_t t = 0; t < s->n; t++) {
    if (h[t] != ss->hash[t]) {
      row->check = "FAIL";
      NOTE(row, "weights after one step differ from %s's, first at tensor %lld", ss->from,
           (long long)t);
      return -1;
    }
  }
  row->check = "ok";
  return 0;
}

/* One round of one mode: allocate, fill, build, (round 0: check), time,
 * free. Later rounds add samples to the same row. */
static void run_mode(bench_t *b, const bench_shape_t *s, int mode, shape_state_t *ss,
                     row_t *row, int round) {
  const opts_t *o = b->o;
  if (round == 0) {
    memset(row, 0, sizeof *row);
    snprintf(row->shape, sizeof row->shape, "%s", s->name);
    row->mode = mode_names[mode];
    row->tensors = s->n;
    row->params = s->total;
    row->ms = row->host_us = row->gbps = row->frac = NAN;
    row->check = "-";
    row->skipped = -1;
    row->launches = -1;
  } else if (!row->ok) {
    return; /* failed in an earlier round: keep its note */
  }
  row->ok = 0;

  const int mixed = mode == M_MIXED || mode == M_GRAPH_MIXED;
  const int graph = mode == M_GRAPH || mode == M_GRAPH_MIXED;
  const int lamb = o->kind == MTOPT_OPTIMIZER_LAMB;
  int warmup = o->warmup, iters = o->iters;
  layout_t L = {0};
  float *w = NULL, *g = NULL;
  mtopt_tensor_list_t **lists = NULL;
  mtopt_optimizer_t **opts = NULL;
  int64_t nopt = 0;
  uint64_t *h = NULL;
  stepper_t sp = {.mode = mode};
#ifdef MTOPT_HAVE_CUDA
  cudaGraph_t cg = NULL;
#endif

  if (mode == M_MEMCPY) {
    /* The copy reads and writes bpp/2 bytes per parameter: the step's
     * traffic. */
    const int bpp = ss->bpp ? ss->bpp : 28;
    sp.bytes = (size_t)s->total * (size_t)bpp / 2;
    const int64_t nf = (int64_t)((sp.bytes + 3) / 4);
    sp.src = buf_alloc(b, nf, row->note, sizeof row->note);
    if (sp.src) sp.dst = buf_alloc(b, nf, row->note, sizeof row->note);
    if (!sp.dst) goto done;
    if (o->cuda) {
#ifdef MTOPT_HAVE_CUDA
      /* cudaMemset runs on the legacy stream, which a non-blocking stream
       * does not wait for: finish it before the copies start. */
      if (cudaMemset(sp.src, 0x3f, sp.bytes) != cudaSuccess ||
          cudaMemset(sp.dst, 0, sp.bytes) != cudaSuccess ||
          cudaDeviceSynchronize() != cudaSuccess) {
        NOTE(row, "cudaMemset failed");
        goto done;
      }
#endif
    } else {
      memset(sp.src, 0x3f, sp.bytes);
      memset(sp.dst, 0, sp.bytes);
    }
    row->bpp = bpp;
    row->launches = 1;
    row->check = "-";
    if (time_steps(b, &sp, warmup, iters, row)) goto done;
    row->ok = 1;
    goto done;
  }

  if (layout_make(s, mode != M_FLAT, &L)) {
    NOTE(row, "out of host memory");
    goto done;
  }
  w = buf_alloc(b, L.len, row->note, sizeof row->note);
  if (w) g = buf_alloc(b, L.len, row->note, sizeof row->note);
  if (!g) goto done;
  if (fill(b, w, s, &L, 0, row->note, sizeof row->note) ||
      fill(b, g, s, &L, 1, row->note, sizeof row->note))
    goto done;

  const mtopt_optimizer_config_t cfg = make_config(o, mixed);
  nopt = mode == M_LOOP ? s->n : 1;
  lists = calloc((size_t)nopt, sizeof *lists);
  opts = calloc((size_t)nopt, sizeof *opts);
  h = malloc((size_t)s->n * sizeof *h);
  if (!lists || !opts || !h) {
    NOTE(row, "out of host memory");
    goto done;
  }
  for (int64_t i = 0; i < nopt; i++) {
    mtopt_status_t st;
    if (mode == M_LOOP)
      st = make_opt(b, s, &L, w, g, i, i + 1, &cfg, &lists[i], &opts[i]);
    else if (mode == M_FLAT) {
      /* One tensor over the whole buffer. */
      bench_shape_t one = {.n = 1, .total = s->total};
      int64_t n1 = s->total, off0 = 0;
      layout_t L1 = {&off0, s->total};
      one.numel = &n1;
      st = make_opt(b, &one, &L1, w, g, 0, 1, &cfg, &lists[i], &opts[i]);
    } else
      st = make_opt(b, s, &L, w, g, 0, s->n, &cfg, &lists[i], &opts[i]);
    if (st != MTOPT_STATUS_SUCCESS) {
      NOTE(row, "building the optimizer -> %s: %s", mtopt_status_name(st), mtopt_last_error());
      goto done;
    }
  }
  sp.opts = opts;
  sp.nopt = nopt;

  mtopt_optimizer_info_t info = MTOPT_OPTIMIZER_INFO_INIT;
  mtopt_status_t st = mtopt_optimizer_get_info(opts[0], &info);
  if (st != MTOPT_STATUS_SUCCESS) {
    NOTE(row, "mtopt_optimizer_get_info -> %s: %s", mtopt_status_name(st), mtopt_last_error());
    goto done;
  }
  row->bpp = info.bytes_per_param;
  row->launches = (int64_t)info.launches_per_step * nopt;
  if (!mixed) ss->bpp = info.bytes_per_param;

  int checked_step = 0; /* a step already applied by the check */
  if (graph) {
#ifdef MTOPT_HAVE_CUDA
    /* Capture from a fresh optimizer, so that one replay is the first step
     * and the check compares it with the other modes. If the backend needs
     * an eager first step (lazy set-up) the capture is retried after one. */
    for (int attempt = 0; attempt < 2 && !sp.exec; attempt++) {
      if (attempt == 1) {
        (void)cudaGetLastError();
        st = mtopt_optimizer_step(opts[0]);
        if (st != MTOPT_STATUS_SUCCESS || cudaStreamSynchronize(b->stream) != cudaSuccess) {
          NOTE(row, "eager step before capture failed: %s", mtopt_last_error());
          goto done;
        }
      }
      cudaError_t e = cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal);
      if (e != cudaSuccess) {
        NOTE(row, "cudaStreamBeginCapture: %s", cudaGetErrorString(e));
        goto done;
      }
      st = mtopt_optimizer_step(opts[0]);
      e = cudaStreamEndCapture(b->stream, &cg);
      if (st != MTOPT_STATUS_SUCCESS || e != cudaSuccess) {
        NOTE(row, "capturing mtopt_optimizer_step: %s / %s", mtopt_status_name(st),
             e != cudaSuccess ? cudaGetErrorString(e) : mtopt_last_error());
        if (cg) cudaGraphDestroy(cg);
        cg = NULL;
        continue;
      }
      e = cudaGraphInstantiate(&sp.exec, cg, 0);
      if (e != cudaSuccess) {
        NOTE(row, "cudaGraphInstantiate: %s", cudaGetErrorString(e));
        sp.exec = NULL;
        goto done;
      }
      if (attempt == 1) {
        checked_step = 1; /* the state moved: no bit-for-bit check */
        NOTE(row, "captured after one eager step");
      } else {
        row->note[0] = '\0';
      }
    }
    if (!sp.exec) goto done;
#else
    NOTE(row, "graph modes need the CUDA backend");
    goto done;
#endif
  }

  if (round > 0) {
    /* checked in round 0 */
  } else if (o->check && !mixed && !checked_step && !(mode == M_FLAT && lamb)) {
    if (do_step(b, &sp, row) || sync_all(b, row)) goto done;
    const layout_t *HL = &L;
    if (hash_layout(b, w, s, HL, h, row->note, sizeof row->note)) goto done;
    if (compare_to_ref(ss, h, s, row)) goto done;
  } else if (o->check && mode == M_FLAT && lamb) {
    row->check = "n/a";
  }

  if (mode == M_LOOP && o->loop_iters > 0) {
    if (iters > o->loop_iters) iters = o->loop_iters;
    if (warmup > 1) warmup = 1;
  } else if (mode == M_LOOP && o->loop_iters == 0 && s->n > 10000) {
    /* A host loop over 10^5 tensors is slow: a few samples show it. */
    if (iters > 3) iters = 3;
    if (warmup > 1) warmup = 1;
  }
  if (time_steps(b, &sp, warmup, iters, row)) goto done;

  if (mixed) {
    mtopt_step_info_t si = MTOPT_STEP_INFO_INIT;
    st = mtopt_optimizer_get_step_info(opts[0], &si);
    if (st != MTOPT_STATUS_SUCCESS) {
      NOTE(row, "mtopt_optimizer_get_step_info -> %s: %s", mtopt_status_name(st),
           mtopt_last_error());
      goto done;
    }
    row->skipped = row->skipped > 0 ? row->skipped + si.skipped_steps : si.skipped_steps;
    if (si.skipped_steps != 0 || !isfinite(si.last_grad_norm)) {
      row->check = "FAIL";
      NOTE(row, "%lld steps skipped, last grad norm %g: the gradients are finite, none "
                "should be", (long long)si.skipped_steps, (double)si.last_grad_norm);
      goto done;
    }
    if (o->check) row->check = "ok";
  }
  row->ok = 1;

done:
#ifdef MTOPT_HAVE_CUDA
  if (sp.exec) cudaGraphExecDestroy(sp.exec);
  if (cg) cudaGraphDestroy(cg);
#endif
  for (int64_t i = 0; opts && i < nopt; i++) mtopt_optimizer_destroy(opts[i]);
  for (int64_t i = 0; lists && i < nopt; i++) mtopt_tensor_list_destroy(lists[i]);
  free(opts);
  free(lists);
  free(h);
  buf_free(b, w);
  buf_free(b, g);
  buf_free(b, sp.src);
  buf_free(b, sp.dst);
  free(L.off);
  if (o->cuda) {
#ifdef MTOPT_HAVE_CUDA
    (void)cudaGetLastError(); /* a failed mode must not poison the next */
#endif
  }
}

/* Medians of the pooled samples, bandwidth and the fraction of the floor. */
static void finish_row(row_t *row, double flat_ms) {
  if (!row->ok) return;
  row->ms = median(row->samples, row->nsamples);
  row->host_us = row->nhost ? median(row->host_samples, row->nhost) : NAN;
  row->iters = row->nsamples; /* samples behind the median, all rounds */
  row->gbps = (double)row->params * row->bpp / (row->ms * 1e-3) / 1e9;
  row->frac = flat_ms > 0 ? flat_ms / row->ms : NAN;
}

/* ------------------------------------------------------------ reporting -- */

/* The commit: $MTOPT_GIT_COMMIT, else git at run time (the tree may have
 * moved since the build), else the one recorded when the build was
 * configured. */
static void meta_commit(char *out, size_t n) {
  const char *env = getenv("MTOPT_GIT_COMMIT");
  out[0] = '\0';
  if (env && env[0]) {
    snprintf(out, n, "%s", env);
    return;
  }
  FILE *p = popen("git -C '" MTOPT_SOURCE_DIR "' rev-parse HEAD 2>/dev/null", "r");
  if (p) {
    if (!fgets(out, (int)n, p)) out[0] = '\0';
    pclose(p);
    out[strcspn(out, "\r\n")] = '\0';
  }
  if (!out[0]) snprintf(out, n, "%s", MTOPT_GIT_COMMIT);
}

static void meta_device(const opts_t *o, char *out, size_t n) {
  snprintf(out, n, "unknown");
  if (o->cuda) {
#ifdef MTOPT_HAVE_CUDA
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, o->device) == cudaSuccess)
      snprintf(out, n, "%.200s (%.1f GiB)", prop.name, (double)prop.totalGlobalMem / (1 << 30));
#endif
    return;
  }
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

static void json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      fprintf(f, "\\%c", *s);
    else if ((unsigned char)*s < 0x20)
      fprintf(f, "\\u%04x", *s);
    else
      fputc(*s, f);
  }
  fputc('"', f);
}

static void json_num(FILE *f, double x, const char *fmt) {
  if (isfinite(x))
    fprintf(f, fmt, x);
  else
    fputs("null", f);
}

static const char *kind_name(mtopt_optimizer_kind_t k) {
  switch (k) {
  case MTOPT_OPTIMIZER_ADAMW: return "adamw";
  case MTOPT_OPTIMIZER_ADAM: return "adam";
  case MTOPT_OPTIMIZER_SGD: return "sgd";
  case MTOPT_OPTIMIZER_LAMB: return "lamb";
  }
  return "?";
}

typedef struct {
  char date[64], commit[128], device[256];
  char load_start[64], load_end[64]; /* /proc/loadavg: how busy the host was */
} meta_t;

static void meta_load(char *out, size_t n) {
  snprintf(out, n, "unknown");
  FILE *f = fopen("/proc/loadavg", "r");
  if (!f) return;
  double a, b, c;
  if (fscanf(f, "%lf %lf %lf", &a, &b, &c) == 3) snprintf(out, n, "%.2f %.2f %.2f", a, b, c);
  fclose(f);
}

static int write_json(const opts_t *o, const meta_t *m, int nthreads, const row_t *rows,
                      int nrows) {
  FILE *f = fopen(o->json, "w");
  if (!f) {
    fprintf(stderr, "mtopt_bench: cannot write %s: %s\n", o->json, strerror(errno));
    return -1;
  }
  fprintf(f, "{\n  \"meta\": {\"tool\": \"mtopt_bench\", \"date\": ");
  json_str(f, m->date);
  fprintf(f, ", \"git_commit\": ");
  json_str(f, m->commit);
  fprintf(f, ", \"mtopt_version\": ");
  json_str(f, mtopt_version_string());
  fprintf(f, ", \"backend\": \"%s\", \"device\": ", o->cuda ? "cuda" : "cpu");
  json_str(f, m->device);
  fprintf(f, ", \"loadavg_start\": ");
  json_str(f, m->load_start);
  fprintf(f, ", \"loadavg_end\": ");
  json_str(f, m->load_end);
  fprintf(f,
          ", \"threads\": %d, \"optimizer\": \"%s\", \"iters\": %d, \"warmup\": %d, "
          "\"check\": %d, \"graph\": %d, \"repeat\": %d, \"chunk_size\": %lld},\n"
          "  \"rows\": [\n",
          nthreads, kind_name(o->kind), o->iters, o->warmup, o->check, o->graph, o->repeat,
          (long long)o->chunk_size);
  for (int i = 0; i < nrows; i++) {
    const row_t *r = &rows[i];
    fprintf(f, "    {\"shape\": ");
    json_str(f, r->shape);
    fprintf(f, ", \"mode\": \"%s\", \"impl\": \"mtopt\", \"tensors\": %lld, \"params\": %lld, "
               "\"ms\": ",
            r->mode, (long long)r->tensors, (long long)r->params);
    json_num(f, r->ms, "%.6g");
    fprintf(f, ", \"launches_per_step\": ");
    if (r->launches >= 0)
      fprintf(f, "%lld", (long long)r->launches);
    else
      fputs("null", f);
    fprintf(f, ", \"bytes_per_param\": %d, \"gbps\": ", r->bpp);
    json_num(f, r->gbps, "%.6g");
    fprintf(f, ", \"frac_of_flat\": ");
    json_num(f, r->frac, "%.4f");
    fprintf(f, ", \"host_us\": ");
    json_num(f, r->host_us, "%.4g");
    fprintf(f, ", \"iters\": %d, \"steps_per_sample\": %d, \"check\": \"%s\", \"skipped\": ",
            r->iters, r->k, r->check);
    if (r->skipped >= 0)
      fprintf(f, "%lld", (long long)r->skipped);
    else
      fputs("null", f);
    fprintf(f, ", \"ok\": %s, \"note\": ", r->ok ? "true" : "false");
    json_str(f, r->note);
    fprintf(f, "}%s\n", i + 1 < nrows ? "," : "");
  }
  fprintf(f, "  ]\n}\n");
  return fclose(f) ? -1 : 0;
}

static int write_csv(const opts_t *o, const row_t *rows, int nrows) {
  FILE *f = fopen(o->csv, "w");
  if (!f) {
    fprintf(stderr, "mtopt_bench: cannot write %s: %s\n", o->csv, strerror(errno));
    return -1;
  }
  fprintf(f, "shape,mode,tensors,params,ms,launches_per_step,bytes_per_param,gbps,"
             "frac_of_flat,host_us,iters,steps_per_sample,check,ok\n");
  for (int i = 0; i < nrows; i++) {
    const row_t *r = &rows[i];
    fprintf(f, "%s,%s,%lld,%lld,%.6g,%lld,%d,%.6g,%.4f,%.4g,%d,%d,%s,%d\n", r->shape, r->mode,
            (long long)r->tensors, (long long)r->params, r->ms, (long long)r->launches, r->bpp,
            r->gbps, r->frac, r->host_us, r->iters, r->k, r->check, r->ok);
  }
  return fclose(f) ? -1 : 0;
}

static void print_header(const opts_t *o, const meta_t *m, int nthreads) {
  printf("# mtopt_bench %s  commit %s  %s\n", mtopt_version_string(),
         m->commit[0] ? m->commit : "unknown", m->date);
  printf("# backend %s  device %s  threads %d  optimizer %s  iters %d  warmup %d  "
         "check %d  graph %d  repeat %d\n",
         o->cuda ? "cuda" : "cpu", m->device, nthreads, kind_name(o->kind), o->iters,
         o->warmup, o->check, o->graph, o->repeat);
  printf("#\n"
         "# ms/step   median over all samples of the time of one step (CPU: wall clock around the\n"
         "#           call; CUDA: cudaEvents around K back-to-back steps, divided by K)\n"
         "# launches  kernel launches one step makes (mtopt_optimizer_get_info); loop mode:\n"
         "#           tensors x that; graph modes: the kernels inside one graph launch\n"
         "# B/param   bytes one step moves per parameter (fp32), counted as: read w, g and\n"
         "#           each state buffer, write w and each state buffer (AdamW: 16 + 12 = 28),\n"
         "#           +4 for the statistics pass that reads g again (mixed: 32)\n"
         "# GB/s      params x B/param / time (1 GB = 1e9 B): effective bandwidth\n"
         "# floor     flat ms / this ms: the fraction of the flat single-buffer step's speed\n"
         "#           (1.00 = as fast as one contiguous buffer)\n"
         "# host_us   CUDA: median host time to return from one step call (the whole loop\n"
         "#           for the loop mode; cudaGraphLaunch for graph modes), stream idle\n"
         "# memcpy    a copy of params x B/param / 2 bytes (reads and writes as much as the\n"
         "#           step): the memory system's ceiling\n"
         "# samps     timed samples behind the median (iters x repeat; loop mode capped)\n"
         "# check     ref/ok: weights after one step equal bit for bit those of the reference\n"
         "#           mode; mixed modes: ok = no step was skipped\n"
         "#\n");
  printf("%-12s %-12s %8s %12s %10s %9s %7s %9s %6s %9s %6s %5s\n", "shape", "mode",
         "tensors", "params", "ms/step", "launches", "B/param", "GB/s", "floor", "host_us",
         "samps", "check");
  fflush(stdout);
}

static void print_row(const row_t *r) {
  if (!r->ok) {
    printf("%-12s %-12s %8lld %12lld   FAILED: %s\n", r->shape, r->mode, (long long)r->tensors,
           (long long)r->params, r->note);
    fflush(stdout);
    return;
  }
  char fr[16] = "-", hu[16] = "-", la[24] = "-";
  if (isfinite(r->frac)) snprintf(fr, sizeof fr, "%.3f", r->frac);
  if (isfinite(r->host_us)) snprintf(hu, sizeof hu, "%.1f", r->host_us);
  if (r->launches >= 0) snprintf(la, sizeof la, "%lld", (long long)r->launches);
  printf("%-12s %-12s %8lld %12lld %10.4f %9s %7d %9.2f %6s %9s %6d %5s%s%s\n", r->shape,
         r->mode, (long long)r->tensors, (long long)r->params, r->ms, la, r->bpp, r->gbps, fr,
         hu, r->iters, r->check, r->note[0] ? "  # " : "", r->note);
  fflush(stdout);
}

/* ---------------------------------------------------------------- main -- */

static void usage(FILE *f) {
  fprintf(f,
          "usage: mtopt_bench [options]\n"
          "  --backend cpu|cuda      (default cpu)\n"
          "  --shapes LIST           gpt2, gpt2-xl, llama-1.1b, many-4096, many-mixed,\n"
          "                          file:PATH; comma list or repeated (default: cpu\n"
          "                          gpt2,many-4096; cuda all five)\n"
          "  --optimizer adamw|adam|sgd|lamb   (default adamw)\n"
          "  --modes LIST            fused,loop,flat,mixed,graph,memcpy (default all;\n"
          "                          graph = graph and graph-mixed, CUDA only)\n"
          "  --iters N               timed steps (default 20)\n"
          "  --warmup N              untimed steps first (default 5 cuda, 3 cpu)\n"
          "  --loop-iters N          cap for the loop mode (default: 3 above 10000 tensors)\n"
          "  --check 0|1             bit-for-bit check of one step between modes (default 1)\n"
          "  --graph 0|1             CUDA-graph replay modes (default 1)\n"
          "  --threads N             CPU threads (default: OpenMP's)\n"
          "  --device N              CUDA device (default 0)\n"
          "  --chunk-size N          elements per chunk (default the library's)\n"
          "  --repeat R              run the modes R times, interleaved, and take the\n"
          "                          median over all samples (noisy machines; default 1)\n"
          "  --json FILE, --csv FILE write the rows\n");
}

static int add_shapes(opts_t *o, const char *arg) {
  char *copy = strdup(arg);
  if (!copy) return -1;
  /* file:PATH takes the rest of the argument (paths may hold commas). */
  char *p = copy;
  while (p && *p) {
    char *next = NULL;
    if (strncmp(p, "file:", 5) != 0) {
      next = strchr(p, ',');
      if (next) *next++ = '\0';
    }
    if (*p) {
      char **s = realloc(o->shapes, (size_t)(o->nshapes + 1) * sizeof *s);
      if (!s) {
        free(copy);
        return -1;
      }
      o->shapes = s;
      o->shapes[o->nshapes++] = strdup(p);
    }
    p = next;
  }
  free(copy);
  return 0;
}

static int parse_int(const char *s, int lo, int hi, int *out) {
  char *end;
  errno = 0;
  const long v = strtol(s, &end, 10);
  if (errno || *end || v < lo || v > hi) return -1;
  *out = (int)v;
  return 0;
}

int main(int argc, char **argv) {
  opts_t o = {0};
  o.kind = MTOPT_OPTIMIZER_ADAMW;
  o.iters = 20;
  o.warmup = -1;
  o.check = 1;
  o.graph = 1;
  o.loop_iters = 0;
  o.repeat = 1;
  {
    const mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
    o.chunk_size = c.chunk_size;
  }
  int modes_given = 0;
  enum { O_BACKEND = 256, O_SHAPES, O_OPT, O_ITERS, O_WARMUP, O_CHECK, O_GRAPH, O_JSON,
         O_CSV, O_THREADS, O_MODES, O_LOOPITERS, O_DEVICE, O_CHUNK, O_REPEAT, O_HELP };
  static const struct option longopts[] = {
      {"backend", required_argument, 0, O_BACKEND}, {"shapes", required_argument, 0, O_SHAPES},
      {"optimizer", required_argument, 0, O_OPT},   {"iters", required_argument, 0, O_ITERS},
      {"warmup", required_argument, 0, O_WARMUP},   {"check", required_argument, 0, O_CHECK},
      {"graph", required_argument, 0, O_GRAPH},     {"json", required_argument, 0, O_JSON},
      {"csv", required_argument, 0, O_CSV},         {"threads", required_argument, 0, O_THREADS},
      {"modes", required_argument, 0, O_MODES},
      {"loop-iters", required_argument, 0, O_LOOPITERS},
      {"device", required_argument, 0, O_DEVICE},
      {"chunk-size", required_argument, 0, O_CHUNK},
      {"repeat", required_argument, 0, O_REPEAT},
      {"help", no_argument, 0, O_HELP},             {0, 0, 0, 0}};
  int c, bad = 0;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (c) {
    case O_BACKEND:
      if (strcmp(optarg, "cpu") == 0) o.cuda = 0;
      else if (strcmp(optarg, "cuda") == 0) o.cuda = 1;
      else bad = 1;
      break;
    case O_SHAPES:
      if (add_shapes(&o, optarg)) bad = 1;
      break;
    case O_OPT:
      if (strcmp(optarg, "adamw") == 0) o.kind = MTOPT_OPTIMIZER_ADAMW;
      else if (strcmp(optarg, "adam") == 0) o.kind = MTOPT_OPTIMIZER_ADAM;
      else if (strcmp(optarg, "sgd") == 0) o.kind = MTOPT_OPTIMIZER_SGD;
      else if (strcmp(optarg, "lamb") == 0) o.kind = MTOPT_OPTIMIZER_LAMB;
      else bad = 1;
      break;
    case O_ITERS: bad |= parse_int(optarg, 1, MAX_ITERS, &o.iters) != 0; break;
    case O_WARMUP: bad |= parse_int(optarg, 0, MAX_ITERS, &o.warmup) != 0; break;
    case O_REPEAT: bad |= parse_int(optarg, 1, 1000, &o.repeat) != 0; break;
    case O_LOOPITERS: bad |= parse_int(optarg, 1, MAX_ITERS, &o.loop_iters) != 0; break;
    case O_CHECK: bad |= parse_int(optarg, 0, 1, &o.check) != 0; break;
    case O_GRAPH: bad |= parse_int(optarg, 0, 1, &o.graph) != 0; break;
    case O_THREADS: bad |= parse_int(optarg, 0, 4096, &o.threads) != 0; break;
    case O_DEVICE: bad |= parse_int(optarg, 0, 1024, &o.device) != 0; break;
    case O_CHUNK: {
      int v;
      bad |= parse_int(optarg, 4, 1 << 30, &v) != 0;
      o.chunk_size = v;
      break;
    }
    case O_JSON: o.json = optarg; break;
    case O_CSV: o.csv = optarg; break;
    case O_MODES: {
      modes_given = 1;
      char *copy = strdup(optarg), *save = NULL;
      for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int found = 0;
        for (int m = 0; m < M_COUNT; m++)
          if (strcmp(t, mode_names[m]) == 0) o.modes[m] = found = 1;
        if (strcmp(t, "graph") == 0) o.modes[M_GRAPH_MIXED] = 1;
        if (!found) {
          fprintf(stderr, "mtopt_bench: unknown mode '%s'\n", t);
          bad = 1;
        }
      }
      free(copy);
      break;
    }
    case O_HELP:
    case 'h': usage(stdout); return 0;
    default: bad = 1;
    }
  }
  if (bad || optind < argc) {
    usage(stderr);
    return 2;
  }
  if (o.warmup < 0) o.warmup = o.cuda ? 5 : 3;
  if (!modes_given)
    for (int m = 0; m < M_COUNT; m++) o.modes[m] = 1;
  if (!o.cuda || !o.graph) o.modes[M_GRAPH] = o.modes[M_GRAPH_MIXED] = 0;
  if (o.nshapes == 0)
    add_shapes(&o, o.cuda ? "gpt2,gpt2-xl,llama-1.1b,many-4096,many-mixed" : "gpt2,many-4096");

#ifndef MTOPT_HAVE_CUDA
  if (o.cuda) {
    fprintf(stderr, "mtopt_bench: this build has no CUDA backend\n");
    return 2;
  }
#endif
#ifndef BENCH_HAVE_SET_STREAM
  if (o.cuda && (o.modes[M_GRAPH] || o.modes[M_GRAPH_MIXED])) {
    fprintf(stderr, "mtopt_bench: built without mtopt_cuda.h: no graph modes\n");
    o.modes[M_GRAPH] = o.modes[M_GRAPH_MIXED] = 0;
  }
#endif

  bench_t b = {.o = &o};
#ifdef _OPENMP
  if (o.threads > 0) omp_set_num_threads(o.threads);
  b.nthreads = omp_get_max_threads();
#else
  b.nthreads = 1;
#endif
  mtopt_context_config_t cc = MTOPT_CONTEXT_CONFIG_INIT;
  cc.backend = o.cuda ? MTOPT_BACKEND_CUDA : MTOPT_BACKEND_CPU;
  cc.device = o.device;
  cc.num_threads = o.threads;
  mtopt_status_t st = mtopt_context_create(&cc, &b.ctx);
  if (st != MTOPT_STATUS_SUCCESS) {
    fprintf(stderr, "mtopt_bench: mtopt_context_create -> %s: %s\n", mtopt_status_name(st),
            mtopt_last_error());
    return 1;
  }
  for (int i = 0; i < 2; i++) {
    b.pat[i] = malloc((size_t)PATTERN_N * sizeof(float));
    if (!b.pat[i]) {
      fprintf(stderr, "mtopt_bench: out of host memory\n");
      return 1;
    }
  }
  /* Weights in ±[0.1, 1), gradients in ±[0.01, 1): never zero. */
  make_pattern(b.pat[0], PATTERN_N, 0x5EED0001ull, 0.1f);
  make_pattern(b.pat[1], PATTERN_N, 0x5EED0002ull, 0.01f);
#ifdef MTOPT_HAVE_CUDA
  if (o.cuda) {
    cudaError_t e = cudaSetDevice(o.device);
#ifdef BENCH_HAVE_SET_STREAM
    if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&b.stream, cudaStreamNonBlocking);
    if (e == cudaSuccess) {
      st = mtopt_cuda_context_set_stream(b.ctx, b.stream);
      if (st != MTOPT_STATUS_SUCCESS) {
        fprintf(stderr, "mtopt_bench: mtopt_cuda_context_set_stream -> %s: %s\n",
                mtopt_status_name(st), mtopt_last_error());
        return 1;
      }
    }
#endif
    for (int i = 0; i < 2 && e == cudaSuccess; i++) {
      e = cudaMalloc((void **)&b.dpat[i], (size_t)PATTERN_N * sizeof(float));
      if (e == cudaSuccess)
        e = cudaMemcpy(b.dpat[i], b.pat[i], (size_t)PATTERN_N * sizeof(float),
                       cudaMemcpyHostToDevice);
    }
    if (e == cudaSuccess) e = cudaMallocHost((void **)&b.staging, (size_t)STAGING_N * 4);
    if (e != cudaSuccess) {
      fprintf(stderr, "mtopt_bench: CUDA set-up: %s\n", cudaGetErrorString(e));
      return 1;
    }
  }
#endif

  meta_t m;
  {
    const time_t t = time(NULL);
    struct tm tmv;
    gmtime_r(&t, &tmv);
    strftime(m.date, sizeof m.date, "%Y-%m-%dT%H:%M:%SZ", &tmv);
  }
  meta_commit(m.commit, sizeof m.commit);
  meta_device(&o, m.device, sizeof m.device);
  meta_load(m.load_start, sizeof m.load_start);
  print_header(&o, &m, b.nthreads);

  row_t *rows = calloc((size_t)o.nshapes * M_COUNT, sizeof *rows);
  int nrows = 0, failures = 0;
  if (!rows) return 1;
  /* Flat first, so every later row can print its fraction of the floor. */
  static const int order[M_COUNT] = {M_FLAT,  M_FUSED,       M_LOOP,  M_MIXED,
                                     M_GRAPH, M_GRAPH_MIXED, M_MEMCPY};
  for (int si = 0; si < o.nshapes; si++) {
    bench_shape_t s;
    char err[512];
    if (bench_shape_make(o.shapes[si], &s, err, sizeof err)) {
      fprintf(stderr, "mtopt_bench: %s\n", err);
      failures++;
      continue;
    }
    shape_state_t ss = {0};
    ss.hash = malloc((size_t)s.n * sizeof *ss.hash);
    if (!ss.hash) {
      fprintf(stderr, "mtopt_bench: out of host memory\n");
      return 1;
    }
    /* Rounds interleave the modes, so that drift on a shared machine
     * spreads over all of them instead of favouring one. */
    const int first = nrows;
    for (int round = 0; round < o.repeat; round++) {
      int r = first;
      for (int k = 0; k < M_COUNT; k++) {
        const int mode = order[k];
        if (!o.modes[mode]) continue;
        run_mode(&b, &s, mode, &ss, &rows[r], round);
        if (round == 0 && o.repeat > 1) {
          fprintf(stderr, "# %s %s: round 1 of %d done%s%s\n", s.name, mode_names[mode],
                  o.repeat, rows[r].ok ? "" : ", FAILED: ", rows[r].ok ? "" : rows[r].note);
        }
        r++;
      }
      nrows = r;
    }
    double flat_ms = NAN;
    for (int r = first; r < nrows; r++)
      if (rows[r].ok && strcmp(rows[r].mode, "flat") == 0)
        flat_ms = median(rows[r].samples, rows[r].nsamples);
    for (int r = first; r < nrows; r++) {
      finish_row(&rows[r], flat_ms);
      print_row(&rows[r]);
      if (!rows[r].ok) failures++;
    }
    free(ss.hash);
    bench_shape_free(&s);
  }
  meta_load(m.load_end, sizeof m.load_end);
  printf("# %d rows, %d failed; load average %s at the start, %s at the end\n", nrows,
         failures, m.load_start, m.load_end);

  if (o.json && write_json(&o, &m, b.nthreads, rows, nrows)) failures++;
  if (o.csv && write_csv(&o, rows, nrows)) failures++;

#ifdef MTOPT_HAVE_CUDA
  if (o.cuda) {
    cudaFree(b.dpat[0]);
    cudaFree(b.dpat[1]);
    cudaFreeHost(b.staging);
  }
#endif
  free(b.pat[0]);
  free(b.pat[1]);
  mtopt_context_destroy(b.ctx);
#ifdef MTOPT_HAVE_CUDA
  if (o.cuda && b.stream) cudaStreamDestroy(b.stream);
#endif
  for (int i = 0; i < nrows; i++) {
    free(rows[i].samples);
    free(rows[i].host_samples);
  }
  for (int i = 0; i < o.nshapes; i++) free(o.shapes[i]);
  free(o.shapes);
  free(rows);
  return failures ? 1 : 0;
}

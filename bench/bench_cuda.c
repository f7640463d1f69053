/* mtopt_bench's CUDA backend: device memory, one non-blocking stream set on
 * the context, cudaEvent timing, a device-to-device cudaMemcpyAsync as the
 * floor, the reference AdamW kernel (ref_adamw.cu), and CUDA-graph capture
 * of one step. Built only with CUDA (bench/CMakeLists.txt). */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime.h>

#include "bench.h"
#include "mtopt/mtopt_cuda.h"

#define STAGING_N ((int64_t)1 << 24)

typedef struct {
  cudaStream_t stream;
  float *dpat[2];      /* the patterns on the device */
  uint16_t *dpat16[2]; /* and in bf16 */
  float *staging; /* pinned, STAGING_N floats: the way weights come back */
} cuda_state_t;

typedef struct {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
} cuda_graph_t;

/* ------------------------------------------------------- set-up, memory -- */

static int cuda_setup(bench_t *b) {
  cuda_state_t *c = calloc(1, sizeof *c);
  if (!c) {
    fprintf(stderr, "mtopt_bench: out of host memory\n");
    return -1;
  }
  b->dev = c;
  cudaError_t e = cudaSetDevice(b->o->device);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) {
    const mtopt_status_t st = mtopt_cuda_context_set_stream(b->ctx, c->stream);
    if (st != MTOPT_STATUS_SUCCESS) {
      fprintf(stderr, "mtopt_bench: mtopt_cuda_context_set_stream -> %s: %s\n",
              mtopt_status_name(st), mtopt_last_error());
      return -1;
    }
  }
  for (int i = 0; i < 2 && e == cudaSuccess; i++) {
    e = cudaMalloc((void **)&c->dpat[i], (size_t)PATTERN_N * sizeof(float));
    if (e == cudaSuccess)
      e = cudaMemcpy(c->dpat[i], b->pat[i], (size_t)PATTERN_N * sizeof(float),
                     cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMalloc((void **)&c->dpat16[i], (size_t)PATTERN_N * 2);
    if (e == cudaSuccess)
      e = cudaMemcpy(c->dpat16[i], b->pat16[i], (size_t)PATTERN_N * 2, cudaMemcpyHostToDevice);
  }
  if (e == cudaSuccess) e = cudaMallocHost((void **)&c->staging, (size_t)STAGING_N * 4);
  if (e != cudaSuccess) {
    fprintf(stderr, "mtopt_bench: CUDA set-up: %s\n", cudaGetErrorString(e));
    return -1;
  }
  return 0;
}

static void cuda_teardown(bench_t *b) {
  cuda_state_t *c = b->dev;
  if (!c) return;
  for (int i = 0; i < 2; i++) {
    cudaFree(c->dpat[i]);
    cudaFree(c->dpat16[i]);
  }
  cudaFreeHost(c->staging);
  if (c->stream) cudaStreamDestroy(c->stream);
  free(c);
  b->dev = NULL;
}

static void cuda_device_name(const bench_t *b, char *out, size_t n) {
  snprintf(out, n, "unknown");
  struct cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, b->o->device) == cudaSuccess)
    snprintf(out, n, "%.200s (%.1f GiB)", prop.name, (double)prop.totalGlobalMem / (1 << 30));
}

static void *cuda_alloc(bench_t *b, size_t bytes, row_t *row) {
  void *p = NULL;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    NOTE(row, "cudaMalloc(%zu bytes): %s", bytes, cudaGetErrorString(e));
    return NULL;
  }
  return p;
}

static void cuda_release(bench_t *b, void *p) { cudaFree(p); }

static int cuda_put(bench_t *b, void *dst, int which, int64_t k, int64_t len, int esize,
                    row_t *row) {
  const cuda_state_t *c = b->dev;
  const void *src = esize == 4 ? (const void *)(c->dpat[which] + k)
                               : (const void *)(c->dpat16[which] + k);
  const cudaError_t e = cudaMemcpyAsync(dst, src, (size_t)(len * esize),
                                        cudaMemcpyDeviceToDevice, c->stream);
  if (e != cudaSuccess) {
    NOTE(row, "fill: cudaMemcpyAsync: %s", cudaGetErrorString(e));
    return -1;
  }
  return 0;
}

/* Waits for the stream; on failure the note is "<what>: <error>". */
static int stream_sync(bench_t *b, const char *what, row_t *row) {
  const cuda_state_t *c = b->dev;
  const cudaError_t e = cudaStreamSynchronize(c->stream);
  if (e != cudaSuccess) {
    NOTE(row, "%s: %s", what, cudaGetErrorString(e));
    return -1;
  }
  return 0;
}

static int cuda_fill_wait(bench_t *b, row_t *row) { return stream_sync(b, "fill", row); }

static int cuda_sync(bench_t *b, row_t *row) {
  return stream_sync(b, "cudaStreamSynchronize", row);
}

/* Through the pinned staging buffer: runs of small tensors in one copy, big
 * tensors in pieces. */
static int cuda_hash(bench_t *b, const void *buf, const bench_shape_t *s, const layout_t *L,
                     const uint8_t *esize, int slot, uint64_t *out, row_t *row) {
  const cuda_state_t *c = b->dev;
  const char *base = buf;
  const char *stage = (const char *)c->staging;
  cudaError_t e = cudaSuccess;
  int64_t t = 0;
  while (t < s->n && e == cudaSuccess) {
    if (s->numel[t] > STAGING_N / 2) {
      out[t] = 0;
      for (int64_t j = 0; j < s->numel[t] && e == cudaSuccess; j += STAGING_N) {
        const int64_t len = s->numel[t] - j < STAGING_N ? s->numel[t] - j : STAGING_N;
        e = cudaMemcpy(c->staging, base + L->off[t] * slot + j * esize[t],
                       (size_t)(len * esize[t]), cudaMemcpyDeviceToHost);
        if (e == cudaSuccess) out[t] += bench_hash_bytes(c->staging, len, esize[t], j);
      }
      t++;
      continue;
    }
    int64_t u = t;
    while (u < s->n && s->numel[u] <= STAGING_N / 2 &&
           L->off[u] + s->numel[u] - L->off[t] <= STAGING_N)
      u++;
    e = cudaMemcpy(c->staging, base + L->off[t] * slot,
                   (size_t)((L->off[u - 1] + s->numel[u - 1] - L->off[t]) * slot),
                   cudaMemcpyDeviceToHost);
    for (int64_t i = t; i < u && e == cudaSuccess; i++)
      out[i] = bench_hash_bytes(stage + (L->off[i] - L->off[t]) * slot, s->numel[i], esize[i], 0);
    t = u;
  }
  if (e != cudaSuccess) {
    NOTE(row, "check: copying weights to the host: %s", cudaGetErrorString(e));
    return -1;
  }
  return 0;
}

/* A copy between the host and the device, waited for. */
static int copy_sync(bench_t *b, void *dst, const void *src, size_t bytes, enum cudaMemcpyKind k,
                     row_t *row) {
  const cuda_state_t *c = b->dev;
  cudaError_t e = cudaMemcpyAsync(dst, src, bytes, k, c->stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(c->stream);
  if (e != cudaSuccess) {
    NOTE(row, "copying to the %s: %s", k == cudaMemcpyDeviceToHost ? "host" : "device",
         cudaGetErrorString(e));
    return -1;
  }
  return 0;
}

static int cuda_get(bench_t *b, void *host, const void *src, size_t bytes, row_t *row) {
  return copy_sync(b, host, src, bytes, cudaMemcpyDeviceToHost, row);
}

static int cuda_set(bench_t *b, void *dst, const void *host, size_t bytes, row_t *row) {
  return copy_sync(b, dst, host, bytes, cudaMemcpyHostToDevice, row);
}

static int cuda_zero(bench_t *b, void *p, size_t bytes, row_t *row) {
  const cuda_state_t *c = b->dev;
  const cudaError_t e = cudaMemsetAsync(p, 0, bytes, c->stream);
  if (e != cudaSuccess) {
    NOTE(row, "cudaMemsetAsync: %s", cudaGetErrorString(e));
    return -1;
  }
  return 0;
}

static int cuda_ref_step(bench_t *b, ref_adamw_t *r, row_t *row) {
  const cuda_state_t *c = b->dev;
  const cudaError_t e = (cudaError_t)ref_adamw_cuda_step(r, c->stream);
  if (e != cudaSuccess) {
    NOTE(row, "ref-adamw kernel: %s", cudaGetErrorString(e));
    return -1;
  }
  return 0;
}

/* ------------------------------------------------------------------ copy -- */

/* cudaMemset runs on the legacy stream, which a non-blocking stream does not
 * wait for: finish it before the copies start. */
static int cuda_copy_prepare(bench_t *b, stepper_t *sp, row_t *row) {
  if (cudaMemset(sp->src, 0x3f, sp->bytes) != cudaSuccess ||
      cudaMemset(sp->dst, 0, sp->bytes) != cudaSuccess ||
      cudaDeviceSynchronize() != cudaSuccess) {
    NOTE(row, "cudaMemset failed");
    return -1;
  }
  return 0;
}

static const char *const cuda_copy_names[] = {"cudaMemcpyAsync-d2d"};

static int cuda_copy_step(bench_t *b, stepper_t *sp, row_t *row) {
  const cuda_state_t *c = b->dev;
  const cudaError_t e =
      cudaMemcpyAsync(sp->dst, sp->src, sp->bytes, cudaMemcpyDeviceToDevice, c->stream);
  if (e != cudaSuccess) {
    NOTE(row, "cudaMemcpyAsync: %s", cudaGetErrorString(e));
    return -1;
  }
  return 0;
}

/* ---------------------------------------------------------------- timing -- */

/* Events between samples of K back-to-back steps: K > 1 only for steps under
 * 0.25 ms, so the event resolution and launch gaps do not dominate. */
static int time_device(bench_t *b, stepper_t *sp, cudaEvent_t *ev, int iters, double *x,
                       row_t *row) {
  const cuda_state_t *c = b->dev;
  /* Probe one step to choose K. */
  float ms = 0.0f;
  cudaEventRecord(ev[0], c->stream);
  if (sp->step(b, sp, row)) return -1;
  cudaEventRecord(ev[1], c->stream);
  cudaError_t e = cudaEventSynchronize(ev[1]);
  if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, ev[0], ev[1]);
  if (e != cudaSuccess) {
    NOTE(row, "timing: %s", cudaGetErrorString(e));
    return -1;
  }
  int K = 1;
  if (ms < 0.25f) K = (int)ceil(0.25 / (ms > 0.002f ? ms : 0.002f));
  if (K > 64) K = 64;
  row->k = K;
  cudaEventRecord(ev[0], c->stream);
  for (int i = 0; i < iters; i++) {
    for (int k = 0; k < K; k++)
      if (sp->step(b, sp, row)) return -1;
    cudaEventRecord(ev[i + 1], c->stream);
  }
  e = cudaEventSynchronize(ev[iters]);
  for (int i = 0; i < iters && e == cudaSuccess; i++) {
    e = cudaEventElapsedTime(&ms, ev[i], ev[i + 1]);
    x[i] = (double)ms / K;
  }
  if (e != cudaSuccess) {
    NOTE(row, "timing: %s", cudaGetErrorString(e));
    return -1;
  }
  return bench_pool(&row->samples, &row->nsamples, x, iters, row);
}

/* Host time of one call, the stream idle each time. */
static int time_host(bench_t *b, stepper_t *sp, int iters, double *x, row_t *row) {
  const int H = iters < 20 ? iters : 20;
  for (int i = 0; i < H; i++) {
    if (cuda_sync(b, row)) return -1;
    const double t0 = bench_now_s();
    if (sp->step(b, sp, row)) return -1;
    x[i] = (bench_now_s() - t0) * 1e6;
  }
  if (cuda_sync(b, row)) return -1;
  return bench_pool(&row->host_samples, &row->nhost, x, H, row);
}

static int cuda_time(bench_t *b, stepper_t *sp, int iters, double *x, row_t *row) {
  cudaEvent_t *ev = calloc((size_t)iters + 1, sizeof *ev);
  int nev = 0, rc = -1;
  cudaError_t e = ev ? cudaSuccess : cudaErrorMemoryAllocation;
  for (; nev <= iters && e == cudaSuccess; nev++) e = cudaEventCreate(&ev[nev]);
  if (e != cudaSuccess)
    NOTE(row, "cudaEventCreate: %s", cudaGetErrorString(e));
  else if (!time_device(b, sp, ev, iters, x, row) && !time_host(b, sp, iters, x, row))
    rc = 0;
  for (int i = 0; i < nev; i++) cudaEventDestroy(ev[i]);
  free(ev);
  return rc;
}

/* ---------------------------------------------------------------- graphs -- */

/* One capture of one step into g: 0 when captured, 1 when the step or the
 * capture failed (worth a retry after an eager step), -1 otherwise. */
static int capture_once(bench_t *b, mtopt_optimizer_t *opt, cuda_graph_t *g, row_t *row) {
  const cuda_state_t *c = b->dev;
  cudaError_t e = cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal);
  if (e != cudaSuccess) {
    NOTE(row, "cudaStreamBeginCapture: %s", cudaGetErrorString(e));
    return -1;
  }
  const mtopt_status_t st = mtopt_optimizer_step(opt);
  e = cudaStreamEndCapture(c->stream, &g->graph);
  if (st != MTOPT_STATUS_SUCCESS || e != cudaSuccess) {
    NOTE(row, "capturing mtopt_optimizer_step: %s / %s", mtopt_status_name(st),
         e != cudaSuccess ? cudaGetErrorString(e) : mtopt_last_error());
    if (g->graph) cudaGraphDestroy(g->graph);
    g->graph = NULL;
    return 1;
  }
  e = cudaGraphInstantiate(&g->exec, g->graph, 0);
  if (e != cudaSuccess) {
    NOTE(row, "cudaGraphInstantiate: %s", cudaGetErrorString(e));
    g->exec = NULL;
    return -1;
  }
  return 0;
}

/* Captures from a fresh optimizer, so that one replay is the first step and
 * the check compares it with the other modes. If the backend needs an eager
 * first step (lazy set-up) the capture is retried after one. */
static int cuda_graph_capture(bench_t *b, mtopt_optimizer_t *opt, void **graph, int *eager,
                              row_t *row) {
  const cuda_state_t *c = b->dev;
  cuda_graph_t *g = calloc(1, sizeof *g);
  if (!g) {
    NOTE(row, "out of host memory");
    return -1;
  }
  *graph = g;
  for (int attempt = 0; attempt < 2 && !g->exec; attempt++) {
    if (attempt == 1) {
      (void)cudaGetLastError();
      const mtopt_status_t st = mtopt_optimizer_step(opt);
      if (st != MTOPT_STATUS_SUCCESS || cudaStreamSynchronize(c->stream) != cudaSuccess) {
        NOTE(row, "eager step before capture failed: %s", mtopt_last_error());
        return -1;
      }
    }
    const int rc = capture_once(b, opt, g, row);
    if (rc < 0) return -1;
    if (rc > 0) continue;
    if (attempt == 1) {
      *eager = 1; /* the state moved: no bit-for-bit check */
      NOTE(row, "captured after one eager step");
    } else {
      row->note[0] = '\0';
    }
  }
  return g->exec ? 0 : -1;
}

static int cuda_graph_launch(bench_t *b, void *graph, row_t *row) {
  const cuda_state_t *c = b->dev;
  const cuda_graph_t *g = graph;
  const cudaError_t e = cudaGraphLaunch(g->exec, c->stream);
  if (e != cudaSuccess) {
    NOTE(row, "cudaGraphLaunch: %s", cudaGetErrorString(e));
    return -1;
  }
  return 0;
}

static void cuda_graph_destroy(void *graph) {
  cuda_graph_t *g = graph;
  if (g->exec) cudaGraphExecDestroy(g->exec);
  if (g->graph) cudaGraphDestroy(g->graph);
  free(g);
}

static void cuda_clear_error(bench_t *b) { (void)cudaGetLastError(); }

const bench_backend_t bench_backend_cuda = {
    .name = "cuda",
    .backend = MTOPT_BACKEND_CUDA,
    .setup = cuda_setup,
    .teardown = cuda_teardown,
    .device_name = cuda_device_name,
    .alloc = cuda_alloc,
    .release = cuda_release,
    .put = cuda_put,
    .fill_wait = cuda_fill_wait,
    .hash = cuda_hash,
    .get = cuda_get,
    .set = cuda_set,
    .zero = cuda_zero,
    .sync = cuda_sync,
    .ncopy = 1,
    .copy_names = cuda_copy_names,
    .copy_prepare = cuda_copy_prepare,
    .copy_step = cuda_copy_step,
    .ref_step = cuda_ref_step,
    .time = cuda_time,
    .graph_capture = cuda_graph_capture,
    .graph_launch = cuda_graph_launch,
    .graph_destroy = cuda_graph_destroy,
    .clear_error = cuda_clear_error,
};

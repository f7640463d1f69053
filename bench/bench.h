/* Internal header of mtopt_bench (step_bench.c): the options, the result
 * rows, the modes and the backend the benchmark runs on.
 *
 *   step_bench.c    options, main: the loop over shapes, rounds and modes,
 *                   the copy rows and each row's floor
 *   bench_modes.c   one function per mode (one-tensor, fused, loop, ...), the
 *                   check
 *   bench_ref.c     the ref-adamw and copy modes (measured against, not the
 *                   library)
 *   ref_adamw.h     the reference AdamW written from scratch: its element
 *                   formula (CPU and CUDA), the CPU loop; ref_adamw.cu the
 *                   CUDA kernel
 *   bench_mem.c     patterns, layouts, fills, hashing, timing, sample pools
 *   bench_report.c  figures of a row, text, CSV and JSON output
 *   bench_cpu.c     the CPU backend (bench_backend_cpu)
 *   bench_cuda.c    the CUDA backend (bench_backend_cuda), built with CUDA
 *
 * Nothing here is CUDA: what differs between the CPU and CUDA runs lives
 * behind bench_backend_t, one file per backend. */
#ifndef MTOPT_BENCH_H
#define MTOPT_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "mtopt/mtopt.h"
#include "ref_adamw.h"
#include "shapes.h"

/* Values come from two fixed random patterns (weights, gradients) of an odd
 * length, read as one stream over the tensors in registration order, so that
 * every layout (pooled, back to back) holds the same values per tensor: that is what
 * makes the bit-for-bit check between modes possible. */
#define PATTERN_N ((int64_t)(1 << 22) + 15)

/* The modes, in the order they run for each shape: one-tensor first (the
 * reference of the bit-for-bit check), copy last: it makes one row for each
 * bytes-per-parameter figure of the rows before it, and every row's floor is
 * the copy row of its own bytes. */
enum {
  M_ONE_TENSOR,
  M_FUSED,
  M_PACKED,
  M_LOOP,
  M_MIXED,
  M_PACKED_MIXED,
  M_GRAPH,
  M_GRAPH_MIXED,
  M_REF_ADAMW,
  M_REF_ADAMW_POOLED,
  M_COPY,
  M_COUNT
};
const char *bench_mode_name(int mode); /* as --modes spells it */
/* Most copy rows of one shape (distinct B/param figures among its rows), and
 * most ways a backend copies. */
#define MAX_COPY_ROWS M_COUNT
#define MAX_COPY_VARIANTS 4

/* A dtype configuration (--dtype): the dtypes of each tensor and the
 * optimizer's master weights, state dtype and rounding. */
typedef struct {
  const char *name;
  mtopt_dtype_t param, grad;
  mtopt_master_t master;
  mtopt_dtype_t state;
  mtopt_rounding_t rounding;
  /* A mixed table: tensors of fewer elements (biases, norms) stay F32, as
   * models register them; 0: every tensor in param/grad. */
  int64_t f32_below;
} precision_t;

/* The configurations --dtype knows (NULL-terminated by name), and the one of
 * a name (NULL if none). */
extern const precision_t bench_precisions[];
const precision_t *bench_precision_find(const char *name);
/* Tensor t's parameter and gradient dtypes under p. */
void bench_tensor_dtypes(const precision_t *p, int64_t numel, mtopt_dtype_t *param,
                         mtopt_dtype_t *grad);

typedef struct {
  const precision_t *prec;
  int cuda, device, threads;
  char **shapes;
  int nshapes;
  mtopt_optimizer_kind_t kind;
  int iters, warmup, loop_iters, check, graph, repeat, print_shapes;
  int modes[M_COUNT];
  const char *json, *csv;
  int64_t chunk_size;
} opts_t;

typedef struct {
  char shape[256];
  const char *mode;
  int64_t tensors, params, launches;
  int64_t chunk_size; /* the optimizer's, from get_info (0: a copy row) */
  int64_t update_tensors; /* get_info's: the update's records (segments), 0: none */
  int bpp, iters, k;
  double ms, host_us, gbps;
  double floor_ms; /* the copy row of the same bpp, shape and run (NAN if none) */
  double frac;     /* floor_ms / ms */
  int copy;        /* a copy row: its fastest variant so far, and that one's name */
  int variant;
  const char *variant_name;
  const char *check; /* "ok", "ref", "FAIL", "-" */
  int64_t skipped;   /* mixed modes: steps skipped (must be 0) */
  int ok;
  char note[512];
  /* Samples pooled over --repeat rounds; ms and host_us are their medians. */
  double *samples, *host_samples;
  int nsamples, nhost;
  /* Copy rows: the samples of each variant, pooled over rounds; samples is
   * a copy of the fastest one's. */
  double *vsamples[MAX_COPY_VARIANTS];
  int nvsamples[MAX_COPY_VARIANTS];
} row_t;

#define NOTE(row, ...) snprintf((row)->note, sizeof (row)->note, __VA_ARGS__)

/* Where each tensor sits: tensor t at element off[t] of a buffer of len
 * elements. An array's elements are `slot` bytes (its largest dtype): a 16-bit
 * tensor among fp32 ones (a mixed table) fills half its slots. */
typedef struct {
  int64_t *off; /* start of each tensor, in slots */
  int64_t len;  /* buffer length, in slots */
} layout_t;

typedef struct bench_backend bench_backend_t;

typedef struct {
  const opts_t *o;
  const bench_backend_t *be;
  mtopt_context_t *ctx;
  float *pat[2];     /* host patterns: weights, gradients */
  uint16_t *pat16[2]; /* the same, rounded to bf16 */
  int nthreads;  /* effective CPU threads */
  void *dev;     /* the backend's own state (CUDA: stream, patterns, staging) */
  /* ref-adamw [0] and ref-adamw-pooled [1] checked against the double
   * reference: 0 not yet, 1 passed, -1 failed (ref_note says how) */
  int ref_valid[2];
  char ref_note[2][256];
} bench_t;

/* What one timed step does: a mode's step function and what it works on. */
typedef struct stepper stepper_t;
struct stepper {
  int (*step)(bench_t *b, stepper_t *sp, row_t *row);
  mtopt_optimizer_t **opts;
  int64_t nopt;
  void *src, *dst; /* copy: bytes from src to dst (the backend's variant) */
  size_t bytes;
  int variant;
  ref_adamw_t ref; /* ref-adamw */
  void *graph; /* graph modes: the backend's captured step */
};

/* What differs between a CPU and a CUDA run. Every call that can fail
 * returns 0 or -1 and, on failure, writes the reason to row->note; "the
 * stream" is the bench's (CUDA: a non-blocking stream set on the context). */
struct bench_backend {
  const char *name; /* as --backend spells it */
  mtopt_backend_t backend;
  /* After the context is made and the host patterns filled; prints its own
   * errors. teardown runs after the context is destroyed. */
  int (*setup)(bench_t *b);
  void (*teardown)(bench_t *b);
  void (*device_name)(const bench_t *b, char *out, size_t n);
  void *(*alloc)(bench_t *b, size_t bytes, row_t *row);
  void (*release)(bench_t *b, void *p);
  /* Copies len values of pattern `which` from position k to dst, maybe
   * queued: fp32 (esize 4) or bf16 (esize 2); fill_wait waits for the queued
   * copies. */
  int (*put)(bench_t *b, void *dst, int which, int64_t k, int64_t len, int esize, row_t *row);
  int (*fill_wait)(bench_t *b, row_t *row);
  /* Per-tensor hashes (bench_hash_bytes) of the weights in a layout: tensor t
   * of esize[t]-byte elements at byte slot * L->off[t]. */
  int (*hash)(bench_t *b, const void *buf, const bench_shape_t *s, const layout_t *L,
              const uint8_t *esize, int slot, uint64_t *out, row_t *row);
  /* Copies bytes from the backend's memory to the host, waiting for it;
   * zero clears bytes of the backend's memory, maybe queued. */
  int (*get)(bench_t *b, void *host, const void *src, size_t bytes, row_t *row);
  /* Copies bytes from the host to the backend's memory, waiting for it. */
  int (*set)(bench_t *b, void *dst, const void *host, size_t bytes, row_t *row);
  int (*zero)(bench_t *b, void *p, size_t bytes, row_t *row);
  int (*sync)(bench_t *b, row_t *row);
  /* copy mode: ways to move sp->bytes (ncopy <= MAX_COPY_VARIANTS of them,
   * named; the row keeps the fastest, so that the floor is the best this
   * memory does); prepare
   * writes both buffers (the CPU: each page by the thread that copies it),
   * step runs variant sp->variant once. */
  int ncopy;
  const char *const *copy_names;
  int (*copy_prepare)(bench_t *b, stepper_t *sp, row_t *row);
  int (*copy_step)(bench_t *b, stepper_t *sp, row_t *row);
  /* ref-adamw mode: one step of the reference AdamW over sp->ref, queued. */
  int (*ref_step)(bench_t *b, ref_adamw_t *r, row_t *row);
  /* iters timed samples of sp's step into row->samples (ms, pooled) and
   * row->k; x is scratch room for iters values. */
  int (*time)(bench_t *b, stepper_t *sp, int iters, double *x, row_t *row);
  /* Graph modes (NULL where the backend has none): capture one step of opt
   * into *graph; *eager is set when a step had to run first. */
  int (*graph_capture)(bench_t *b, mtopt_optimizer_t *opt, void **graph, int *eager,
                       row_t *row);
  int (*graph_launch)(bench_t *b, void *graph, row_t *row);
  void (*graph_destroy)(void *graph);
  /* Clears a sticky error, so that a failed mode does not poison the next. */
  void (*clear_error)(bench_t *b);
};

extern const bench_backend_t bench_backend_cpu;
extern const bench_backend_t bench_backend_cuda; /* only in CUDA builds */

/* Per shape: the reference of the check, shared by its modes. */
typedef struct {
  uint64_t *hash;   /* reference per-tensor hashes */
  const char *from; /* the mode that produced them, or NULL */
  int copy_bpp;     /* the bytes per param the next copy row moves */
} shape_state_t;

/* bench_modes.c: one round of one mode: allocate, fill, build, (round 0:
 * check), time, free. Later rounds add samples to the same row. */
void bench_run_mode(bench_t *b, const bench_shape_t *s, int mode, shape_state_t *ss,
                    row_t *row, int round);

/* bench_ref.c: the ref-adamw, ref-adamw-pooled and copy modes (bench_run_mode calls them). */
/* The reference's layout for a dtype configuration (REF_ADAMW_*), or -1
 * where it has none. */
int bench_ref_layout(const precision_t *p);
/* pooled: ref-adamw-pooled, the tensors at their pool offsets in every array. */
void bench_run_ref_adamw(bench_t *b, const bench_shape_t *s, int pooled, row_t *row);
void bench_run_copy(bench_t *b, const bench_shape_t *s, shape_state_t *ss, row_t *row,
                    int round);

/* bench_mem.c */
double bench_now_s(void);
double bench_median(double *x, int n);
int bench_pool(double **dst, int *nd, const double *x, int n, row_t *row);
int bench_patterns_make(float *pat[2], uint16_t *pat16[2]);
uint64_t bench_hash_bytes(const void *x, int64_t n, int esize, int64_t base);
int bench_layout_make(const bench_shape_t *s, int pooled, layout_t *L);
float *bench_alloc(bench_t *b, int64_t n, row_t *row);
void bench_free(bench_t *b, void *p);
int bench_fill(bench_t *b, void *buf, const bench_shape_t *s, const layout_t *L, int which,
               const uint8_t *esize, int slot, row_t *row);
int bench_time_steps(bench_t *b, stepper_t *sp, int warmup, int iters, row_t *row);

/* bench_report.c */
typedef struct {
  char date[64], commit[128], device[256];
  char load_start[64], load_end[64]; /* /proc/loadavg: how busy the host was */
} meta_t;

void bench_meta_start(const bench_t *b, meta_t *m);
void bench_meta_end(meta_t *m);
void bench_row_finish(row_t *row);
void bench_row_set_floor(row_t *row, double floor_ms);
void bench_print_header(const opts_t *o, const meta_t *m, int nthreads);
void bench_print_row(const row_t *r);
void bench_print_footer(const meta_t *m, int nrows, int failures);
int bench_write_json(const opts_t *o, const meta_t *m, int nthreads, const row_t *rows,
                     int nrows);
int bench_write_csv(const opts_t *o, const row_t *rows, int nrows);

#endif /* MTOPT_BENCH_H */

/*
 * mtopt_bench: times one optimizer step over a model's parameter list, in the
 * manner of nccl-tests (one binary, the same flags everywhere, each figure
 * printed with its definition).
 *
 * Modes, all on the same shapes in one run, each with its own allocations
 * (freed before the next mode, so the peak is one mode's memory):
 *   one-tensor   one optimizer over one tensor of the total element count: the
 *                library's kernel on one contiguous buffer
 *   fused        one optimizer over all tensors, one mtopt_optimizer_step; each
 *                tensor at its own 256-byte-aligned start, as an allocator
 *                places separate tensors
 *   packed       fused over the same tensors back to back in one buffer of
 *                weights and one of gradients (llm.c's layout, and that of
 *                the flat buffers of Megatron and DeepSpeed), where runs of
 *                small tensors step as one (docs/optimizers.md, "Segments")
 *   loop         one optimizer per tensor, one step call per tensor: how users
 *                step a model with a per-tensor kernel today
 *   mixed        the full mixed-precision step: dynamic loss scale, global-norm
 *                clipping (max_grad_norm 1), then the update
 *   packed-mixed the mixed step over the tensors packed: both passes over
 *                the segments (all-F32 tables: docs/optimizers.md,
 *                "Segments")
 *   graph        CUDA: one fused step captured in a CUDA graph, graph replays
 *   graph-mixed  CUDA: the mixed step captured the same way
 *   ref-adamw    a reference AdamW written from scratch (ref_adamw.h, not the
 *                library's code) over one buffer of the total size, fp32 or
 *                (--dtype bf16-master) bf16 with fp32 masters, checked
 *                against a double step first: the floor is reachable
 *   ref-adamw-pooled  the same over the tensors as the pool holds them, each
 *                at its own 256-byte start, in every array: whether the floor
 *                is reachable where they do not lie back to back
 *   copy         the floor: a copy of params x B/param / 2 bytes (it reads and
 *                writes as much as a step), one row for each B/param of the
 *                rows before it; cudaMemcpyAsync device to device on CUDA, the
 *                fastest of several threaded copies on the CPU (bench_cpu.c)
 *
 * Each row's "floor" is time(copy of its own B/param, same shape, same run)
 * / time(row): 1.00 = as fast as the memory moves those bytes.
 *
 * With --check 1 (default), before timing, every mode that computes the plain
 * step (one-tensor, fused, packed, loop, graph) applies one step from the same random
 * start and its weights must equal, bit for bit, those of the first such mode
 * (one-tensor's for AdamW/Adam/SGD, where one buffer computes the same
 * elements; for LAMB, whose trust ratio is per tensor, the reference is
 * fused). The mixed modes must not skip a step.
 *
 * This file holds the options and main (the loop over shapes, rounds and
 * modes, the copy rows and each row's floor); bench.h says where the rest
 * lives.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "bench.h"

#define MAX_ITERS 100000

/* The backends this build has (bench_cuda.c is built only with CUDA). */
static const bench_backend_t *const backends[] = {
    &bench_backend_cpu,
#ifdef MTOPT_HAVE_CUDA
    &bench_backend_cuda,
#endif
};

static const bench_backend_t *find_backend(const char *name) {
  for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++)
    if (strcmp(backends[i]->name, name) == 0) return backends[i];
  return NULL;
}

/* ------------------------------------------------------------- options -- */

static void usage(FILE *f) {
  fprintf(f,
          "usage: mtopt_bench [options]\n"
          "  --backend cpu|cuda      (default cpu)\n"
          "  --shapes LIST           comma list or repeated, of:\n"
          "                         ");
  for (int i = 0; i < bench_shape_count(); i++) fprintf(f, " %s", bench_shape_name(i));
  fprintf(f,
          " file:PATH\n"
          "                          (default: cpu gpt2,many-4096; cuda all built-in)\n"
          "  --print-shapes          print each shape (--shapes, default all built-in):\n"
          "                          name, tensors, params, hash, ...; then exit\n"
          "  --optimizer adamw|adam|sgd|lamb   (default adamw)\n"
          "  --dtype NAME            one of (the first the default; docs/benchmarks.md):\n"
          "                         ");
  for (const precision_t *p = bench_precisions; p->name; p++) fprintf(f, " %s", p->name);
  fprintf(f,
          "\n"
          "  --list-dtypes           print those names, one a line; then exit\n"
          "  --modes LIST            one-tensor,fused,packed,loop,mixed,packed-mixed,graph,\n"
          "                          ref-adamw,ref-adamw-pooled,copy\n"
          "                          (default all; graph = graph and graph-mixed, CUDA\n"
          "                          only; the ref-adamw modes by default only for AdamW\n"
          "                          in f32 and bf16-master, one-tensor not for\n"
          "                          mixed-table)\n"
          "  --iters N               timed steps (default 20)\n"
          "  --warmup N              untimed steps first (default 5 cuda, 3 cpu)\n"
          "  --loop-iters N          cap for the loop mode (default: 3 above 10000 tensors)\n"
          "  --check 0|1             bit-for-bit check of one step between modes (default 1)\n"
          "  --graph 0|1             CUDA-graph replay modes (default 1)\n"
          "  --threads N             CPU threads (default: OpenMP's)\n"
          "  --device N              CUDA device (default 0)\n"
          "  --chunk-size N          elements per chunk (default 0: the library's)\n"
          "  --repeat R              run the modes R times, interleaved, and take the\n"
          "                          median over all samples (noisy machines; default 1)\n"
          "  --json FILE, --csv FILE write the rows\n"
          "exit status: 0, 1 if a row failed, 2 on bad arguments, 77 if the backend\n"
          "has no usable device (ctest's skip)\n");
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

static int parse_kind(const char *s, mtopt_optimizer_kind_t *out) {
  if (strcmp(s, "adamw") == 0) *out = MTOPT_OPTIMIZER_ADAMW;
  else if (strcmp(s, "adam") == 0) *out = MTOPT_OPTIMIZER_ADAM;
  else if (strcmp(s, "sgd") == 0) *out = MTOPT_OPTIMIZER_SGD;
  else if (strcmp(s, "lamb") == 0) *out = MTOPT_OPTIMIZER_LAMB;
  else return -1;
  return 0;
}

/* A comma list of mode names; "graph" is both graph modes. */
static int parse_modes(const char *arg, opts_t *o) {
  int bad = 0;
  char *copy = strdup(arg), *save = NULL;
  for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    int found = 0;
    for (int m = 0; m < M_COUNT; m++)
      if (strcmp(t, bench_mode_name(m)) == 0) o->modes[m] = found = 1;
    if (strcmp(t, "graph") == 0) o->modes[M_GRAPH_MIXED] = 1;
    if (!found) {
      fprintf(stderr, "mtopt_bench: unknown mode '%s'\n", t);
      bad = 1;
    }
  }
  free(copy);
  return bad ? -1 : 0;
}

enum { O_BACKEND = 256, O_SHAPES, O_OPT, O_DTYPE, O_ITERS, O_WARMUP, O_CHECK, O_GRAPH, O_JSON,
       O_CSV, O_THREADS, O_MODES, O_LOOPITERS, O_DEVICE, O_CHUNK, O_REPEAT, O_PRINT,
       O_LIST_DTYPES, O_HELP };

static const struct option longopts[] = {
    {"backend", required_argument, 0, O_BACKEND}, {"shapes", required_argument, 0, O_SHAPES},
    {"optimizer", required_argument, 0, O_OPT},   {"iters", required_argument, 0, O_ITERS},
    {"dtype", required_argument, 0, O_DTYPE},
    {"warmup", required_argument, 0, O_WARMUP},   {"check", required_argument, 0, O_CHECK},
    {"graph", required_argument, 0, O_GRAPH},     {"json", required_argument, 0, O_JSON},
    {"csv", required_argument, 0, O_CSV},         {"threads", required_argument, 0, O_THREADS},
    {"modes", required_argument, 0, O_MODES},
    {"loop-iters", required_argument, 0, O_LOOPITERS},
    {"device", required_argument, 0, O_DEVICE},
    {"chunk-size", required_argument, 0, O_CHUNK},
    {"repeat", required_argument, 0, O_REPEAT},
    {"print-shapes", no_argument, 0, O_PRINT},
    {"list-dtypes", no_argument, 0, O_LIST_DTYPES},
    {"help", no_argument, 0, O_HELP},             {0, 0, 0, 0}};

/* One option; 0, or -1 where its argument is bad. */
static int parse_opt(int c, const char *arg, opts_t *o, int *modes_given) {
  switch (c) {
  case O_BACKEND:
    if (strcmp(arg, "cpu") == 0) o->cuda = 0;
    else if (strcmp(arg, "cuda") == 0) o->cuda = 1;
    else return -1;
    return 0;
  case O_SHAPES: return add_shapes(o, arg);
  case O_OPT: return parse_kind(arg, &o->kind);
  case O_DTYPE: o->prec = bench_precision_find(arg); return o->prec ? 0 : -1;
  case O_ITERS: return parse_int(arg, 1, MAX_ITERS, &o->iters);
  case O_WARMUP: return parse_int(arg, 0, MAX_ITERS, &o->warmup);
  case O_REPEAT: return parse_int(arg, 1, 1000, &o->repeat);
  case O_LOOPITERS: return parse_int(arg, 1, MAX_ITERS, &o->loop_iters);
  case O_CHECK: return parse_int(arg, 0, 1, &o->check);
  case O_GRAPH: return parse_int(arg, 0, 1, &o->graph);
  case O_THREADS: return parse_int(arg, 0, 4096, &o->threads);
  case O_DEVICE: return parse_int(arg, 0, 1024, &o->device);
  case O_CHUNK: {
    int v;
    if (parse_int(arg, 0, 1 << 30, &v) || (v > 0 && v < 4)) return -1;
    o->chunk_size = v; /* 0: the library's choice */
    return 0;
  }
  case O_JSON: o->json = arg; return 0;
  case O_CSV: o->csv = arg; return 0;
  case O_MODES: *modes_given = 1; return parse_modes(arg, o);
  case O_PRINT: o->print_shapes = 1; return 0;
  default: return -1;
  }
}

/* The options and their defaults: 0, 1 after --help, -1 on a bad one. */
static int parse_args(int argc, char **argv, opts_t *o) {
  const mtopt_optimizer_config_t cfg = MTOPT_OPTIMIZER_CONFIG_INIT;
  *o = (opts_t){.prec = &bench_precisions[0], .kind = MTOPT_OPTIMIZER_ADAMW, .iters = 20, .warmup = -1, .check = 1,
                .graph = 1, .loop_iters = 0, .repeat = 1, .chunk_size = cfg.chunk_size};
  int c, bad = 0, modes_given = 0;
  while ((c = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    if (c == O_HELP || c == 'h') {
      usage(stdout);
      return 1;
    }
    if (c == O_LIST_DTYPES) {
      for (const precision_t *p = bench_precisions; p->name; p++) printf("%s\n", p->name);
      return 1;
    }
    bad |= parse_opt(c, optarg, o, &modes_given) != 0;
  }
  if (bad || optind < argc) {
    usage(stderr);
    return -1;
  }
  if (o->warmup < 0) o->warmup = o->cuda ? 5 : 3;
  if (!modes_given) {
    for (int m = 0; m < M_COUNT; m++) o->modes[m] = 1;
    /* The reference is AdamW in fp32 or bf16-master's layout (ref_adamw.h):
     * beside another optimizer or dtype it would add rows (and a copy row of
     * its own bytes) that compare nothing. */
    if (o->kind != MTOPT_OPTIMIZER_ADAMW || bench_ref_layout(o->prec) < 0)
      o->modes[M_REF_ADAMW] = o->modes[M_REF_ADAMW_POOLED] = 0;
    /* one tensor has one dtype: a mixed table has no such row to compare */
    if (o->prec->f32_below > 0) o->modes[M_ONE_TENSOR] = 0;
  }
  if (!o->cuda || !o->graph) o->modes[M_GRAPH] = o->modes[M_GRAPH_MIXED] = 0;
  if (o->nshapes == 0 && (o->cuda || o->print_shapes)) {
    for (int i = 0; i < bench_shape_count(); i++) add_shapes(o, bench_shape_name(i));
  } else if (o->nshapes == 0) {
    add_shapes(o, "gpt2,many-4096");
  }
  return 0;
}

/* ---------------------------------------------------------------- main -- */

/* Threads, the context, the patterns and the backend's set-up; prints its
 * own errors. */
static int bench_open(bench_t *b) {
#ifdef _OPENMP
  if (b->o->threads > 0) omp_set_num_threads(b->o->threads);
  b->nthreads = omp_get_max_threads();
#else
  b->nthreads = 1;
#endif
  mtopt_context_config_t cc = MTOPT_CONTEXT_CONFIG_INIT;
  cc.backend = b->be->backend;
  cc.device = b->o->device;
  cc.num_threads = b->o->threads;
  const mtopt_status_t st = mtopt_context_create(&cc, &b->ctx);
  if (st != MTOPT_STATUS_SUCCESS) {
    fprintf(stderr, "mtopt_bench: mtopt_context_create -> %s: %s\n", mtopt_status_name(st),
            mtopt_last_error());
    return -1;
  }
  if (bench_patterns_make(b->pat, b->pat16)) {
    fprintf(stderr, "mtopt_bench: out of host memory\n");
    return -1;
  }
  return b->be->setup(b);
}

static void bench_close(bench_t *b) {
  for (int i = 0; i < 2; i++) {
    free(b->pat[i]);
    free(b->pat16[i]);
  }
  mtopt_context_destroy(b->ctx);
  b->be->teardown(b);
}

/* The distinct bytes-per-parameter figures of n rows, in order: one copy row
 * each. None (only copy asked for): AdamW fp32's 28. */
static int copy_bpps(const row_t *rows, int n, int *bpp) {
  int k = 0;
  for (int r = 0; r < n; r++) {
    int seen = rows[r].bpp <= 0;
    for (int i = 0; i < k && !seen; i++) seen = bpp[i] == rows[r].bpp;
    if (!seen && k < MAX_COPY_ROWS) bpp[k++] = rows[r].bpp;
  }
  if (k == 0) bpp[k++] = REF_ADAMW_BYTES_PER_PARAM;
  return k;
}

/* Medians, then each row's floor: the copy row of the same bytes. */
static void finish_rows(row_t *rows, int n) {
  for (int r = 0; r < n; r++) bench_row_finish(&rows[r]);
  for (int r = 0; r < n; r++) {
    double floor_ms = NAN;
    for (int c = 0; c < n; c++)
      if (rows[c].copy && rows[c].ok && rows[c].bpp == rows[r].bpp) floor_ms = rows[c].ms;
    bench_row_set_floor(&rows[r], floor_ms);
  }
}

/* Every round of every chosen mode on one shape, the copy rows last, then
 * the rows printed; the rows go to rows[*nrows...]. -1 when out of memory,
 * else the rows (or the shape) that failed. */
static int run_shape(bench_t *b, const char *name, row_t *rows, int *nrows) {
  const opts_t *o = b->o;
  bench_shape_t s;
  char err[512];
  if (bench_shape_make(name, &s, err, sizeof err)) {
    fprintf(stderr, "mtopt_bench: %s\n", err);
    return 1;
  }
  shape_state_t ss = {0};
  ss.hash = malloc((size_t)s.n * sizeof *ss.hash);
  if (!ss.hash) {
    fprintf(stderr, "mtopt_bench: out of host memory\n");
    return -1;
  }
  /* Rounds interleave the modes, so that drift on a shared machine spreads
   * over all of them instead of favouring one. */
  const int first = *nrows;
  int bpp[MAX_COPY_ROWS], ncopy = 0;
  for (int round = 0; round < o->repeat; round++) {
    int r = first;
    for (int mode = 0; mode < M_COUNT; mode++) {
      if (!o->modes[mode]) continue;
      if (mode == M_COPY && round == 0) ncopy = copy_bpps(rows + first, r - first, bpp);
      for (int i = 0; i < (mode == M_COPY ? ncopy : 1); i++) {
        ss.copy_bpp = mode == M_COPY ? bpp[i] : 0;
        bench_run_mode(b, &s, mode, &ss, &rows[r], round);
        if (round == 0 && o->repeat > 1) {
          fprintf(stderr, "# %s %s: round 1 of %d done%s%s\n", s.name, bench_mode_name(mode),
                  o->repeat, rows[r].ok ? "" : ", FAILED: ", rows[r].ok ? "" : rows[r].note);
        }
        r++;
      }
    }
    *nrows = r;
  }
  finish_rows(rows + first, *nrows - first);
  int failures = 0;
  for (int r = first; r < *nrows; r++) {
    bench_print_row(&rows[r]);
    if (!rows[r].ok) failures++;
  }
  free(ss.hash);
  bench_shape_free(&s);
  return failures;
}

int main(int argc, char **argv) {
  opts_t o;
  const int pa = parse_args(argc, argv, &o);
  if (pa) return pa > 0 ? 0 : 2;
  if (o.print_shapes) {
    int bad = 0;
    for (int i = 0; i < o.nshapes; i++) bad |= bench_shape_print(stdout, o.shapes[i]) != 0;
    return bad ? 1 : 0;
  }
  bench_t b = {.o = &o, .be = find_backend(o.cuda ? "cuda" : "cpu")};
  if (!b.be) {
    fprintf(stderr, "mtopt_bench: this build has no CUDA backend\n");
    return 2;
  }
  if (!mtopt_backend_available(b.be->backend)) { /* ctest's skip code (bench/CMakeLists.txt) */
    fprintf(stderr, "mtopt_bench: no usable %s device: skipped\n", o.cuda ? "CUDA" : "CPU");
    return 77;
  }
  if (bench_open(&b)) return 1;

  meta_t m;
  bench_meta_start(&b, &m);
  bench_print_header(&o, &m, b.nthreads);

  row_t *rows = calloc((size_t)o.nshapes * (M_COUNT + MAX_COPY_ROWS), sizeof *rows);
  int nrows = 0, failures = 0;
  if (!rows) return 1;
  for (int si = 0; si < o.nshapes; si++) {
    const int f = run_shape(&b, o.shapes[si], rows, &nrows);
    if (f < 0) return 1;
    failures += f;
  }
  bench_meta_end(&m);
  bench_print_footer(&m, nrows, failures);

  if (o.json && bench_write_json(&o, &m, b.nthreads, rows, nrows)) failures++;
  if (o.csv && bench_write_csv(&o, rows, nrows)) failures++;

  bench_close(&b);
  for (int i = 0; i < nrows; i++) {
    free(rows[i].samples);
    free(rows[i].host_samples);
    for (int v = 0; v < MAX_COPY_VARIANTS; v++) free(rows[i].vsamples[v]);
  }
  for (int i = 0; i < o.nshapes; i++) free(o.shapes[i]);
  free(o.shapes);
  free(rows);
  return failures ? 1 : 0;
}

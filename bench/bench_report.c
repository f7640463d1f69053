/* mtopt_bench's output: the figures of a row, the text table with the
 * definition of each figure, CSV and JSON. */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench.h"

#ifndef MTOPT_GIT_COMMIT
#define MTOPT_GIT_COMMIT ""
#endif
#ifndef MTOPT_SOURCE_DIR
#define MTOPT_SOURCE_DIR "."
#endif

/* ------------------------------------------------------------- figures -- */

/* Medians of the pooled samples and bandwidth. */
void bench_row_finish(row_t *row) {
  if (!row->ok) return;
  row->ms = bench_median(row->samples, row->nsamples);
  row->host_us = row->nhost ? bench_median(row->host_samples, row->nhost) : NAN;
  row->iters = row->nsamples; /* samples behind the median, all rounds */
  row->gbps = (double)row->params * row->bpp / (row->ms * 1e-3) / 1e9;
}

/* The floor: the copy of the row's own bytes, in the same run. */
void bench_row_set_floor(row_t *row, double floor_ms) {
  row->floor_ms = floor_ms;
  row->frac = row->ok && floor_ms > 0 ? floor_ms / row->ms : NAN;
}

/* ---------------------------------------------------------------- meta -- */

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

static void meta_load(char *out, size_t n) {
  snprintf(out, n, "unknown");
  FILE *f = fopen("/proc/loadavg", "r");
  if (!f) return;
  double a, b, c;
  if (fscanf(f, "%lf %lf %lf", &a, &b, &c) == 3) snprintf(out, n, "%.2f %.2f %.2f", a, b, c);
  fclose(f);
}

void bench_meta_start(const bench_t *b, meta_t *m) {
  const time_t t = time(NULL);
  struct tm tmv;
  gmtime_r(&t, &tmv);
  strftime(m->date, sizeof m->date, "%Y-%m-%dT%H:%M:%SZ", &tmv);
  meta_commit(m->commit, sizeof m->commit);
  b->be->device_name(b, m->device, sizeof m->device);
  meta_load(m->load_start, sizeof m->load_start);
}

void bench_meta_end(meta_t *m) { meta_load(m->load_end, sizeof m->load_end); }

static const char *kind_name(mtopt_optimizer_kind_t k) {
  switch (k) {
  case MTOPT_OPTIMIZER_ADAMW: return "adamw";
  case MTOPT_OPTIMIZER_ADAM: return "adam";
  case MTOPT_OPTIMIZER_SGD: return "sgd";
  case MTOPT_OPTIMIZER_LAMB: return "lamb";
  }
  return "?";
}

/* ---------------------------------------------------------------- text -- */

void bench_print_header(const opts_t *o, const meta_t *m, int nthreads) {
  printf("# mtopt_bench %s  commit %s  %s\n", mtopt_version_string(),
         m->commit[0] ? m->commit : "unknown", m->date);
  printf("# backend %s  device %s  threads %d  optimizer %s  dtype %s  iters %d  warmup %d  "
         "check %d  graph %d  repeat %d\n",
         o->cuda ? "cuda" : "cpu", m->device, nthreads, kind_name(o->kind), o->prec->name,
         o->iters, o->warmup, o->check, o->graph, o->repeat);
  printf("#\n"
         "# ms/step   median over all samples of the time of one step (CPU: wall clock around the\n"
         "#           call; CUDA: cudaEvents around K back-to-back steps, divided by K)\n"
         "# launches  kernel launches one step makes (mtopt_optimizer_get_info); loop mode:\n"
         "#           tensors x that; graph modes: the kernels inside one graph launch\n"
         "# B/param   bytes one step moves per parameter (fp32), counted as: read w, g and\n"
         "#           each state buffer, write w and each state buffer (AdamW: 16 + 12 = 28),\n"
         "#           +4 for the statistics pass that reads g again (mixed: 32)\n"
         "# GB/s      params x B/param / time (1 GB = 1e9 B): effective bandwidth\n"
         "# floor     copy ms / this ms, copy = the copy row of this row's B/param, same\n"
         "#           shape, same run (1.00 = as fast as the memory moves these bytes)\n"
         "# copy      a copy of params x B/param / 2 bytes (reads and writes as much as a\n"
         "#           step): CUDA cudaMemcpyAsync device to device; CPU the fastest of the\n"
         "#           threaded copies in its note (each timed every round; lowest median)\n"
         "# ref-adamw a plain AdamW kernel written outside the library (bench/ref_adamw.h),\n"
         "#           one buffer of the total size, fp32 or bf16-master's layout; checked\n"
         "#           against a double step first\n"
         "# host_us   CUDA: median host time to return from one step call (the whole loop\n"
         "#           for the loop mode; cudaGraphLaunch for graph modes), stream idle\n"
         "# samps     timed samples behind the median (iters x repeat; loop mode capped)\n"
         "# check     ref/ok: weights after one step equal bit for bit those of the reference\n"
         "#           mode; mixed modes: ok = no step was skipped\n"
         "#\n");
  printf("%-13s %-12s %8s %12s %10s %9s %7s %9s %6s %9s %6s %5s\n", "shape", "mode",
         "tensors", "params", "ms/step", "launches", "B/param", "GB/s", "floor", "host_us",
         "samps", "check");
  fflush(stdout);
}

void bench_print_row(const row_t *r) {
  if (!r->ok) {
    printf("%-13s %-12s %8lld %12lld   FAILED: %s\n", r->shape, r->mode, (long long)r->tensors,
           (long long)r->params, r->note);
    fflush(stdout);
    return;
  }
  char fr[16] = "-", hu[16] = "-", la[24] = "-";
  if (isfinite(r->frac)) snprintf(fr, sizeof fr, "%.3f", r->frac);
  if (isfinite(r->host_us)) snprintf(hu, sizeof hu, "%.1f", r->host_us);
  if (r->launches >= 0) snprintf(la, sizeof la, "%lld", (long long)r->launches);
  printf("%-13s %-12s %8lld %12lld %10.4f %9s %7d %9.2f %6s %9s %6d %5s%s%s\n", r->shape,
         r->mode, (long long)r->tensors, (long long)r->params, r->ms, la, r->bpp, r->gbps, fr,
         hu, r->iters, r->check, r->note[0] ? "  # " : "", r->note);
  fflush(stdout);
}

void bench_print_footer(const meta_t *m, int nrows, int failures) {
  printf("# %d rows, %d failed; load average %s at the start, %s at the end\n", nrows,
         failures, m->load_start, m->load_end);
}

/* ----------------------------------------------------------------- CSV -- */

int bench_write_csv(const opts_t *o, const row_t *rows, int nrows) {
  FILE *f = fopen(o->csv, "w");
  if (!f) {
    fprintf(stderr, "mtopt_bench: cannot write %s: %s\n", o->csv, strerror(errno));
    return -1;
  }
  fprintf(f, "shape,mode,tensors,params,ms,launches_per_step,bytes_per_param,gbps,"
             "floor_ms,frac_of_floor,copy_variant,host_us,iters,steps_per_sample,check,ok\n");
  for (int i = 0; i < nrows; i++) {
    const row_t *r = &rows[i];
    fprintf(f, "%s,%s,%lld,%lld,%.6g,%lld,%d,%.6g,%.6g,%.4f,%s,%.4g,%d,%d,%s,%d\n", r->shape,
            r->mode, (long long)r->tensors, (long long)r->params, r->ms, (long long)r->launches,
            r->bpp, r->gbps, r->floor_ms, r->frac, r->variant_name ? r->variant_name : "",
            r->host_us, r->iters, r->k, r->check, r->ok);
  }
  return fclose(f) ? -1 : 0;
}

/* ---------------------------------------------------------------- JSON -- */

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

/* A count, or null where it is negative (not known). */
static void json_count(FILE *f, int64_t x) {
  if (x >= 0)
    fprintf(f, "%lld", (long long)x);
  else
    fputs("null", f);
}

static void json_meta(FILE *f, const opts_t *o, const meta_t *m, int nthreads) {
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
          ", \"threads\": %d, \"optimizer\": \"%s\", \"dtype\": \"%s\", \"iters\": %d, "
          "\"warmup\": %d, \"check\": %d, \"graph\": %d, \"repeat\": %d, "
          "\"chunk_size\": %lld, \"floor\": \"copy ms / ms: the copy row of the row's "
          "bytes_per_param (params x B/param / 2 bytes), same shape, same run\"},\n",
          nthreads, kind_name(o->kind), o->prec->name, o->iters, o->warmup, o->check, o->graph,
          o->repeat, (long long)o->chunk_size);
}

static void json_row(FILE *f, const row_t *r) {
  fprintf(f, "    {\"shape\": ");
  json_str(f, r->shape);
  fprintf(f, ", \"mode\": \"%s\", \"impl\": \"mtopt\", \"tensors\": %lld, \"params\": %lld, "
             "\"ms\": ",
          r->mode, (long long)r->tensors, (long long)r->params);
  json_num(f, r->ms, "%.6g");
  fprintf(f, ", \"launches_per_step\": ");
  json_count(f, r->launches);
  fprintf(f, ", \"bytes_per_param\": %d, \"gbps\": ", r->bpp);
  json_num(f, r->gbps, "%.6g");
  fprintf(f, ", \"floor_ms\": ");
  json_num(f, r->floor_ms, "%.6g");
  fprintf(f, ", \"frac_of_floor\": ");
  json_num(f, r->frac, "%.4f");
  fprintf(f, ", \"copy_variant\": ");
  if (r->variant_name)
    json_str(f, r->variant_name);
  else
    fputs("null", f);
  fprintf(f, ", \"host_us\": ");
  json_num(f, r->host_us, "%.4g");
  fprintf(f, ", \"chunk_size\": %lld, \"update_tensors\": %lld, \"iters\": %d, "
             "\"steps_per_sample\": %d, \"check\": \"%s\", \"skipped\": ",
          (long long)r->chunk_size, (long long)r->update_tensors, r->iters, r->k, r->check);
  json_count(f, r->skipped);
  fprintf(f, ", \"ok\": %s, \"note\": ", r->ok ? "true" : "false");
  json_str(f, r->note);
  fputc('}', f);
}

int bench_write_json(const opts_t *o, const meta_t *m, int nthreads, const row_t *rows,
                     int nrows) {
  FILE *f = fopen(o->json, "w");
  if (!f) {
    fprintf(stderr, "mtopt_bench: cannot write %s: %s\n", o->json, strerror(errno));
    return -1;
  }
  json_meta(f, o, m, nthreads);
  fprintf(f, "  \"rows\": [\n");
  for (int i = 0; i < nrows; i++) {
    json_row(f, &rows[i]);
    fprintf(f, "%s\n", i + 1 < nrows ? "," : "");
  }
  fprintf(f, "  ]\n}\n");
  return fclose(f) ? -1 : 0;
}

/* Parameter-list shapes of the step benchmark: the element count of every
 * tensor of a model, in registration order. bench/shapes.py builds the same
 * lists for torch_bench.py (the same generators for the synthetic sets), so
 * both benchmarks time the same shapes; `shapes.py --check BIN` compares the
 * two builders' lines. */
#ifndef MTOPT_BENCH_SHAPES_H
#define MTOPT_BENCH_SHAPES_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct {
  char name[256];
  int64_t n;      /* tensors */
  int64_t *numel; /* n element counts (malloc'd) */
  int64_t total;  /* sum of numel */
} bench_shape_t;

/* Builds a shape by name (a built-in one, or file:PATH: one element count per
 * line, '#' starts a comment). Returns 0 on success; on failure writes a
 * message to err and returns -1. */
int bench_shape_make(const char *name, bench_shape_t *out, char *err, size_t errlen);
void bench_shape_free(bench_shape_t *s);

/* The built-in shapes: their count and the name of the i-th (NULL past the
 * end), in the order --print-shapes lists them. */
int bench_shape_count(void);
const char *bench_shape_name(int i);

/* A 64-bit hash of the ordered element counts (FNV-1a over 64-bit words). */
uint64_t bench_shape_hash(const bench_shape_t *s);
/* One line: name, tensors, params, hash (16 hex digits), then the counts of
 * tensors under 64 and under 4096 elements and the largest; the format
 * bench/shapes.py --print writes. 0, or -1 (message on stderr). */
int bench_shape_print(FILE *f, const char *name);

#endif /* MTOPT_BENCH_SHAPES_H */

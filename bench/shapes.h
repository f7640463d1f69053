/* Parameter-list shapes of the step benchmark: the element count of every
 * tensor of a model, in registration order. bench/torch_bench.py builds the
 * same lists (the same generator for many-mixed), so both benchmarks time
 * the same shapes; compare.py checks the tensor and parameter counts. */
#ifndef MTOPT_BENCH_SHAPES_H
#define MTOPT_BENCH_SHAPES_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
  char name[256];
  int64_t n;      /* tensors */
  int64_t *numel; /* n element counts (malloc'd) */
  int64_t total;  /* sum of numel */
} bench_shape_t;

/* Builds a shape by name: gpt2, gpt2-xl, llama-1.1b, many-4096, many-mixed,
 * or file:PATH (one element count per line, '#' starts a comment). Returns 0
 * on success; on failure writes a message to err and returns -1. */
int bench_shape_make(const char *name, bench_shape_t *out, char *err, size_t errlen);
void bench_shape_free(bench_shape_t *s);

#endif /* MTOPT_BENCH_SHAPES_H */

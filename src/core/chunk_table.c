/* The chunk table: cuts every tensor into chunks of at most chunk_size
 * elements. A chunk never spans tensors; empty tensors get no chunk. The table
 * is built once per optimizer, so a step needs no host work per tensor. The
 * tensors' chunks follow `order` (the distributed layer's buckets: each one a
 * contiguous chunk range), registration order without one. */
#include "core.h"

int64_t mtopt__chunk_table_at(const int64_t *numel, int64_t n, const int64_t *order,
                              const int64_t *phase, int64_t chunk_size, int64_t *first_chunk,
                              int64_t *num_chunks, mtopt__chunk_rec_t *chunks) {
  if (chunk_size <= 0 || chunk_size > INT32_MAX || n < 0) return -1;
  int64_t total = 0;
  for (int64_t j = 0; j < n; j++) {
    const int64_t i = order ? order[j] : j;
    const int64_t ph = phase ? phase[i] : 0;
    if (numel[i] < 0 || ph < 0 || ph >= chunk_size) return -1;
    /* The first chunk runs to the first cell boundary, the others are whole
     * cells; ceil division without overflow of numel + chunk_size. */
    const int64_t head = chunk_size - ph < numel[i] ? chunk_size - ph : numel[i];
    const int64_t rest = numel[i] - head;
    const int64_t k = (head > 0) + rest / chunk_size + (rest % chunk_size != 0);
    if (first_chunk) first_chunk[i] = total;
    if (num_chunks) num_chunks[i] = k;
    if (chunks) {
      for (int64_t c = 0; c < k; c++) {
        const int64_t start = c == 0 ? 0 : head + (c - 1) * chunk_size;
        const int64_t len = c == 0 ? head
                            : numel[i] - start < chunk_size ? numel[i] - start
                                                            : chunk_size;
        chunks[total + c].start = start;
        chunks[total + c].tensor = (int32_t)i;
        chunks[total + c].len = (int32_t)len;
      }
    }
    if (k > INT64_MAX - total) return -1;
    total += k;
  }
  return total;
}

int64_t mtopt__chunk_table(const int64_t *numel, int64_t n, const int64_t *order,
                           int64_t chunk_size, int64_t *first_chunk, int64_t *num_chunks,
                           mtopt__chunk_rec_t *chunks) {
  return mtopt__chunk_table_at(numel, n, order, NULL, chunk_size, first_chunk, num_chunks,
                               chunks);
}

/* A warp takes a chunk at a time on CUDA where chunks average under 4096
 * elements (many small tensors); there a 65536-element chunk of one of the
 * few large tensors kept one warp busy long after the others had finished:
 * 50,000 tensors of mostly under 4096 elements ran at 0.63 of a copy with
 * 65536-element chunks, 0.81 with 4096 (docs/perf_notes.md, v8). */
int mtopt__small_tensors(const int64_t *numel, int64_t n) {
  /* mean over the non-empty tensors < 4096 (empty ones have no chunks: a
   * large model with many of them is not in this regime), summing no
   * further than 4096 m (no overflow) */
  int64_t m = 0, total = 0;
  for (int64_t i = 0; i < n; i++) m += numel[i] > 0;
  for (int64_t i = 0; i < n; i++) {
    if (numel[i] >= 4096 * m - total) return 0;
    total += numel[i];
  }
  return m > 0;
}

int64_t mtopt__auto_chunk_size(const int64_t *numel, int64_t n) {
  return mtopt__small_tensors(numel, n) ? 4096 : 65536;
}

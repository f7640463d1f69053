/* Reading MNIST-style IDX files (http://yann.lecun.com/exdb/mnist/), gzipped
 * or plain. */
#ifndef MNIST_IDX_H
#define MNIST_IDX_H

#include <stdint.h>

/* One split of a data set: count images of rows x cols bytes, one label each. */
typedef struct {
  int64_t count;
  int rows, cols;
  uint8_t *pixels; /* count * rows * cols, row-major, 0 = background */
  uint8_t *labels; /* count, each in [0, 10) */
} idx_set_t;

/* Loads DIR/IMAGES and DIR/LABELS, each from NAME.gz if that exists, else from
 * NAME. Checks the magic numbers, the dimensions (rows x cols must be 28 x 28,
 * the model's input) and that both files hold the same number of items and all
 * of their bytes. On failure prints a message naming the file to stderr and
 * returns -1 (nothing to free); on success returns 0. */
int idx_load_set(const char *dir, const char *images, const char *labels, idx_set_t *out);

/* Keeps only the first n items (n < count). */
void idx_truncate(idx_set_t *set, int64_t n);

void idx_free(idx_set_t *set);

#endif /* MNIST_IDX_H */

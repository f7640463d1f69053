/* IDX reader. zlib's gzread reads gzip and plain files alike, so one code path
 * serves both; we still look for NAME.gz first, as the data sets ship it. */
#include "idx.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#define IDX_MAGIC_LABELS 0x00000801u /* unsigned bytes, 1 dimension */
#define IDX_MAGIC_IMAGES 0x00000803u /* unsigned bytes, 3 dimensions */
#define IDX_MAX_ITEMS 100000000      /* guards the allocation against junk */

typedef struct {
  gzFile gz;
  char path[4096];
} idx_file_t;

static int idx_open(const char *dir, const char *name, idx_file_t *f) {
  snprintf(f->path, sizeof f->path, "%s/%s.gz", dir, name);
  FILE *probe = fopen(f->path, "rb");
  if (!probe) snprintf(f->path, sizeof f->path, "%s/%s", dir, name);
  else fclose(probe);
  f->gz = gzopen(f->path, "rb");
  if (!f->gz) {
    fprintf(stderr, "error: cannot open %s (or %s/%s.gz): %s\n", f->path, dir, name,
            strerror(errno));
    return -1;
  }
  gzbuffer(f->gz, 1 << 20);
  return 0;
}

/* Reads exactly n bytes (gzread takes an unsigned count, so go in pieces). */
static int idx_read(idx_file_t *f, void *dst, int64_t n, const char *what) {
  uint8_t *p = dst;
  while (n > 0) {
    unsigned piece = n > (1 << 30) ? (1u << 30) : (unsigned)n;
    int got = gzread(f->gz, p, piece);
    if (got <= 0) {
      int zerr = 0;
      const char *msg = gzerror(f->gz, &zerr);
      fprintf(stderr, "error: %s: %s while reading %s\n", f->path,
              got < 0 ? msg : "file is truncated", what);
      return -1;
    }
    p += got;
    n -= got;
  }
  return 0;
}

static int idx_read_u32(idx_file_t *f, uint32_t *v, const char *what) {
  uint8_t b[4];
  if (idx_read(f, b, 4, what)) return -1;
  *v = (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
  return 0;
}

static int idx_load_labels(const char *dir, const char *name, idx_set_t *out, char *path) {
  idx_file_t f;
  if (idx_open(dir, name, &f)) return -1;
  snprintf(path, sizeof f.path, "%s", f.path);
  uint32_t magic = 0, count = 0;
  int rc = -1;
  if (idx_read_u32(&f, &magic, "the header") || idx_read_u32(&f, &count, "the header"))
    goto done;
  if (magic != IDX_MAGIC_LABELS) {
    fprintf(stderr, "error: %s: bad magic 0x%08x, expected 0x%08x (an IDX label file)\n",
            f.path, magic, IDX_MAGIC_LABELS);
    goto done;
  }
  if (count == 0 || count > IDX_MAX_ITEMS) {
    fprintf(stderr, "error: %s: implausible label count %u\n", f.path, count);
    goto done;
  }
  out->labels = malloc(count);
  if (!out->labels) {
    fprintf(stderr, "error: %s: out of memory for %u labels\n", f.path, count);
    goto done;
  }
  if (idx_read(&f, out->labels, count, "the labels")) goto done;
  for (uint32_t i = 0; i < count; i++) {
    if (out->labels[i] >= 10) {
      fprintf(stderr, "error: %s: label %u of item %u is not a class in [0, 10)\n", f.path,
              out->labels[i], i);
      goto done;
    }
  }
  out->count = count;
  rc = 0;
done:
  gzclose(f.gz);
  return rc;
}

static int idx_load_images(const char *dir, const char *name, idx_set_t *out, char *path) {
  idx_file_t f;
  if (idx_open(dir, name, &f)) return -1;
  snprintf(path, sizeof f.path, "%s", f.path);
  uint32_t magic = 0, count = 0, rows = 0, cols = 0;
  int rc = -1;
  if (idx_read_u32(&f, &magic, "the header") || idx_read_u32(&f, &count, "the header") ||
      idx_read_u32(&f, &rows, "the header") || idx_read_u32(&f, &cols, "the header"))
    goto done;
  if (magic != IDX_MAGIC_IMAGES) {
    fprintf(stderr, "error: %s: bad magic 0x%08x, expected 0x%08x (an IDX image file)\n",
            f.path, magic, IDX_MAGIC_IMAGES);
    goto done;
  }
  if (rows != 28 || cols != 28) {
    fprintf(stderr, "error: %s: images are %ux%u, the model takes 28x28\n", f.path, rows,
            cols);
    goto done;
  }
  if (count == 0 || count > IDX_MAX_ITEMS) {
    fprintf(stderr, "error: %s: implausible image count %u\n", f.path, count);
    goto done;
  }
  const int64_t bytes = (int64_t)count * rows * cols;
  out->pixels = malloc((size_t)bytes);
  if (!out->pixels) {
    fprintf(stderr, "error: %s: out of memory for %u images\n", f.path, count);
    goto done;
  }
  if (idx_read(&f, out->pixels, bytes, "the images")) goto done;
  out->count = count;
  out->rows = (int)rows;
  out->cols = (int)cols;
  rc = 0;
done:
  gzclose(f.gz);
  return rc;
}

int idx_load_set(const char *dir, const char *images, const char *labels, idx_set_t *out) {
  idx_set_t img = {0}, lab = {0};
  char img_path[4096], lab_path[4096];
  if (idx_load_images(dir, images, &img, img_path) ||
      idx_load_labels(dir, labels, &lab, lab_path)) {
    idx_free(&img);
    idx_free(&lab);
    return -1;
  }
  if (img.count != lab.count) {
    fprintf(stderr, "error: %s holds %lld images but %s holds %lld labels\n", img_path,
            (long long)img.count, lab_path, (long long)lab.count);
    idx_free(&img);
    idx_free(&lab);
    return -1;
  }
  *out = img;
  out->labels = lab.labels;
  return 0;
}

void idx_truncate(idx_set_t *set, int64_t n) {
  if (n > 0 && n < set->count) set->count = n;
}

void idx_free(idx_set_t *set) {
  free(set->pixels);
  free(set->labels);
  set->pixels = NULL;
  set->labels = NULL;
  set->count = 0;
}

/* Writes the loader fuzz target's seed corpus (tests/fuzz/corpus): for each
 * configuration of fuzz_load.h, its valid checkpoint in formats 3, 2 and 1,
 * edited copies with the checksum recomputed (scalars out of range, step
 * counts near overflow, reserved fields, format, kind, features), truncated
 * and bit-flipped copies, and files of one configuration fed to another.
 * Each file is the configuration's byte followed by the file.
 *   build/tests/make_corpus tests/fuzz/corpus   (deterministic: commit it) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt_bytes.h"
#include "fuzz_load.h"

static const char *out_dir;

static void emit(int k, const char *name, const unsigned char *b, size_t n) {
  char path[4096];
  snprintf(path, sizeof path, "%s/k%d-%s", out_dir, k, name);
  FILE *f = fopen(path, "wb");
  const unsigned char key = (unsigned char)k;
  if (!f || fwrite(&key, 1, 1, f) != 1 || fwrite(b, 1, n, f) != n || fclose(f) != 0) {
    fprintf(stderr, "make_corpus: cannot write %s\n", path);
    exit(1);
  }
}

/* An edit of 4 or 8 bytes at an offset, resealed. */
typedef struct {
  const char *name;
  int at, len;
  double value;
  int is_float;
} edit_t;

static void emit_edit(int k, const unsigned char *src, size_t n, const edit_t *e) {
  unsigned char *b = malloc(n);
  memcpy(b, src, n);
  if (e->is_float) {
    const float x = (float)e->value;
    memcpy(b + e->at, &x, 4);
  } else if (e->len == 8) {
    const int64_t x = (int64_t)e->value;
    memcpy(b + e->at, &x, 8);
  } else {
    const int32_t x = (int32_t)e->value;
    memcpy(b + e->at, &x, 4);
  }
  cb_reseal(b, n);
  emit(k, e->name, b, n);
  free(b);
}

static unsigned char *saved(int k, size_t *n) {
  char path[4096];
  snprintf(path, sizeof path, "%s/.make_corpus.tmp", out_dir);
  if (mtopt_optimizer_save(fuzz_optimizer(k), path) != MTOPT_STATUS_SUCCESS) exit(1);
  FILE *f = fopen(path, "rb");
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc(*n);
  if (fread(b, 1, *n, f) != *n) exit(1);
  fclose(f);
  remove(path);
  return b;
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: make_corpus <dir>\n");
    return 2;
  }
  out_dir = argv[1];
  const edit_t edits[] = {
      {"lr-nan", CB_LR, 4, NAN, 1},          {"lr-neg", CB_LR, 4, -1, 1},
      {"beta1-one", CB_BETA1, 4, 1, 1},      {"beta2-big", CB_BETA2, 4, 1.5, 1},
      {"eps-zero", CB_EPS, 4, 0, 1},         {"wd-neg", CB_WD, 4, -5, 1},
      {"momentum-neg", CB_MOM, 4, -1, 1},    {"dampening-big", CB_DAMP, 4, 2, 1},
      {"clip-on", CB_MGN, 4, 0.01, 1},       {"clip-nan", CB_MGN, 4, NAN, 1},
      {"scale-zero", CB_LS, 4, 0, 1},        {"scale-inf", CB_LS, 4, INFINITY, 1},
      {"scale-big", CB_LS, 4, 65536, 1},     {"step-neg", CB_STEP, 8, -5, 0},
      {"step-max", CB_STEP, 8, 9.2e18, 0},   {"step-2p62", CB_STEP, 8, 0x1p62, 0},
      {"skipped-neg", CB_SKIP, 8, -1, 0},    {"growth-neg", CB_GT, 4, -1, 0},
      {"growth-max", CB_GT, 4, 2147483647.0, 0}, {"reserved", CB_RES, 4, 7, 0},
      {"format-9", CB_FORMAT, 4, 9, 0},      {"format-0", CB_FORMAT, 4, 0, 0},
      {"kind-sgd", CB_KIND, 4, 2, 0},        {"kind-big", CB_KIND, 4, 99, 0},
      {"tensors-2", CB_NT, 8, 2, 0},         {"tensors-huge", CB_NT, 8, 1e18, 0},
      {"state-0", CB_NS, 4, 0, 0},           {"features-0", CB_FEATURES, 4, 0, 0},
      {"features-dyn", CB_FEATURES, 4, 2, 0}, {"features-clip", CB_FEATURES, 4, 4, 0},
      {"features-skip", CB_FEATURES, 4, 8, 0}, {"features-unknown", CB_FEATURES, 4, 1 << 20, 0},
      {"state-dtype", CB_HDR, 4, 2, 0},      {"master", CB_HDR + 4, 4, 1, 0},
      {"numel", CB_RECS, 8, 6, 0},           {"param-dtype", CB_RECS + 8, 4, 2, 0},
      {"group-lr-neg", CB_GROUPS, 4, -1, 1}, {"group-wd-nan", CB_GROUPS + 8 * 63 + 4, 4, NAN, 1},
  };
  for (int k = 0; k < FUZZ_CONFIGS; k++) {
    size_t n;
    unsigned char *b = saved(k, &n);
    emit(k, "valid-f4", b, n);
    for (size_t i = 0; i < sizeof edits / sizeof *edits; i++) emit_edit(k, b, n, &edits[i]);
    const size_t cuts[] = {0, 8, CB_HDR, CB_HDR + CB_EXT + 4, CB_RECS + 4, n / 2, n - 1};
    char name[64];
    for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
      snprintf(name, sizeof name, "cut-%zu", cuts[i]);
      emit(k, name, b, cuts[i]);
    }
    unsigned char *c = malloc(n + 1);
    const size_t flips[] = {CB_FORMAT, CB_KIND, CB_NT + 7, CB_LR + 3, CB_HDR + 1, n / 2, n - 2};
    for (size_t i = 0; i < sizeof flips / sizeof *flips; i++) {
      memcpy(c, b, n);
      c[flips[i]] ^= 0x10;
      snprintf(name, sizeof name, "flip-%zu", flips[i]);
      emit(k, name, c, n);
    }
    memcpy(c, b, n);
    c[n] = 0;
    emit(k, "trailing", c, n + 1);
    for (uint32_t f = 3; f >= 1; f--) {
      memcpy(c, b, n);
      const size_t m = cb_downgrade(c, n, f);
      snprintf(name, sizeof name, "valid-f%u", f);
      emit(k, name, c, m);
      const edit_t lr = {"", CB_LR, 4, NAN, 1};
      snprintf(name, sizeof name, "f%u-lr-nan", f);
      edit_t e = lr;
      e.name = name;
      emit_edit(k, c, m, &e);
    }
    /* this configuration's file fed to the next one */
    snprintf(name, sizeof name, "from-k%d", k);
    emit((k + 1) % FUZZ_CONFIGS, name, b, n);
    free(c);
    free(b);
  }
  return 0;
}

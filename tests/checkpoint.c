/* Checkpoints: resume is bit-exact from every format; bad files are refused
 * and change nothing (out-of-range scalars, other features, corruption, each
 * with its status); a save that fails leaves no file; names as long as the
 * system allows; the target's kind and the file's mode. */
#define _GNU_SOURCE /* RTLD_NEXT */
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fuzz/ckpt_bytes.h"
#include "test_util.h"

#define NT 5
static const int64_t sizes[NT] = {7, 1, 4099, 0, 333};

typedef struct {
  mtopt_context_t *ctx;
  mtopt_tensor_list_t *list;
  mtopt_optimizer_t *opt;
  float *w[NT], *g[NT];
} model_t;

/* The suite's default: dynamic loss scaling, no clipping. */
static mtopt_optimizer_config_t base_config(mtopt_optimizer_kind_t kind) {
  mtopt_optimizer_config_t oc = MTOPT_OPTIMIZER_CONFIG_INIT;
  oc.kind = kind;
  oc.momentum = kind == MTOPT_OPTIMIZER_SGD ? 0.9f : 0.0f;
  oc.lr = 1e-2f;
  oc.dynamic_loss_scale = 1;
  oc.loss_scale = 1024.0f;
  oc.growth_interval = 2;
  oc.chunk_size = 64;
  return oc;
}

static void model_make_cfg(model_t *m, const mtopt_optimizer_config_t *oc, uint64_t seed,
                           int extra) {
  tu_rng_t r;
  tu_rng_init(&r, seed);
  m->ctx = tu_cpu_context();
  TU_OK(mtopt_tensor_list_create(m->ctx, &m->list));
  for (int i = 0; i < NT; i++) {
    const int64_t n = sizes[i] + (i == 2 ? extra : 0);
    m->w[i] = malloc((size_t)(n + 1) * sizeof(float));
    m->g[i] = malloc((size_t)(n + 1) * sizeof(float));
    tu_fill(&r, m->w[i], n, -1, 1);
    TU_OK(mtopt_tensor_list_add_f32(m->list, m->w[i], m->g[i], n, 0, NULL));
  }
  TU_OK(mtopt_optimizer_create(m->ctx, m->list, oc, &m->opt));
}

static void model_make(model_t *m, mtopt_optimizer_kind_t kind, uint64_t seed, int extra) {
  const mtopt_optimizer_config_t oc = base_config(kind);
  model_make_cfg(m, &oc, seed, extra);
}

static void model_free(model_t *m) {
  TU_OK(mtopt_optimizer_destroy(m->opt));
  TU_OK(mtopt_tensor_list_destroy(m->list));
  TU_OK(mtopt_context_destroy(m->ctx));
  for (int i = 0; i < NT; i++) free(m->w[i]), free(m->g[i]);
}

/* Step with gradients drawn from (seed, step), the same for any model. */
static void model_steps(model_t *m, int from, int count) {
  for (int t = from; t < from + count; t++) {
    tu_rng_t r;
    tu_rng_init(&r, 1000 + (uint64_t)t);
    for (int i = 0; i < NT; i++) tu_fill(&r, m->g[i], sizes[i], -512, 512);
    TU_OK(mtopt_optimizer_step(m->opt));
  }
}

static void assert_same(model_t *a, model_t *b, mtopt_optimizer_kind_t kind) {
  const mtopt_state_t which =
      kind == MTOPT_OPTIMIZER_SGD ? MTOPT_STATE_MOMENTUM : MTOPT_STATE_EXP_AVG_SQ;
  for (int i = 0; i < NT; i++) {
    ck_assert_msg(tu_first_bit_diff(a->w[i], b->w[i], sizes[i]) < 0, "tensor %d weights", i);
    if (sizes[i] == 0) continue;
    float *sa = malloc((size_t)sizes[i] * sizeof(float)), *sb = malloc((size_t)sizes[i] * sizeof(float));
    tu_poison(sa, sizes[i]);
    tu_poison(sb, sizes[i]);
    TU_OK(mtopt_optimizer_read_state(a->opt, i, which, sa));
    TU_OK(mtopt_optimizer_read_state(b->opt, i, which, sb));
    ck_assert_msg(tu_first_bit_diff(sa, sb, sizes[i]) < 0, "tensor %d state", i);
    free(sa), free(sb);
  }
  mtopt_step_info_t ia = MTOPT_STEP_INFO_INIT, ib = MTOPT_STEP_INFO_INIT;
  TU_OK(mtopt_optimizer_get_step_info(a->opt, &ia));
  TU_OK(mtopt_optimizer_get_step_info(b->opt, &ib));
  ck_assert_int_eq(ia.step, ib.step);
  ck_assert_float_eq(ia.loss_scale, ib.loss_scale);
  ck_assert_int_eq(ia.growth_tracker, ib.growth_tracker);
}

/* Ends a test of refusals: b, offered only bad files, still steps as its
 * twin c that was never offered any; frees a, b and c. */
static void twins_end(model_t *a, model_t *b, model_t *c, mtopt_optimizer_kind_t kind,
                      int from) {
  model_steps(b, from, 2);
  model_steps(c, from, 2);
  assert_same(b, c, kind);
  model_free(a);
  model_free(b);
  model_free(c);
}

static char dir[64];

static void make_dir(void) {
  snprintf(dir, sizeof dir, "/tmp/mtopt_ckpt_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void remove_dir(void) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char p[1024];
  while (d && (e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name), remove(p);
  if (d) closedir(d);
  rmdir(dir);
}

static int count_files(void) {
  DIR *d = opendir(dir);
  struct dirent *e;
  int n = 0;
  while (d && (e = readdir(d))) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  if (d) closedir(d);
  return n;
}

/* ------------------------------------------------- the file, byte by byte -- */

static unsigned char *file_read(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  ck_assert_ptr_nonnull(f);
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc(*n + 64);
  ck_assert_int_eq(fread(b, 1, *n, f), *n);
  fclose(f);
  return b;
}

static void file_write(const char *path, const unsigned char *b, size_t n) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(fwrite(b, 1, n, f), n);
  fclose(f);
}

/* Copies src to dst with bytes [at, at+len) replaced, resealed or not. */
static void edit_copy(const unsigned char *src, size_t n, const char *dst, size_t at,
                      const void *bytes, size_t len, int seal) {
  unsigned char *b = malloc(n);
  memcpy(b, src, n);
  memcpy(b + at, bytes, len);
  if (seal) cb_reseal(b, n);
  file_write(dst, b, n);
  free(b);
}

static void path_in_dir(char *out, size_t cap, const char *name) {
  snprintf(out, cap, "%s/%s", dir, name);
}

/* Resumes bit-exactly from a file of each format this library reads (4 as
 * written, 3, 2 and 1 rewritten from it): kind _i % 3, format 4 - _i / 3. */
START_TEST(test_resume_bit_exact) {
  const mtopt_optimizer_kind_t kinds[] = {MTOPT_OPTIMIZER_ADAMW, MTOPT_OPTIMIZER_SGD,
                                          MTOPT_OPTIMIZER_LAMB};
  const mtopt_optimizer_kind_t kind = kinds[_i % 3];
  const uint32_t format = 4 - (uint32_t)(_i / 3);
  char path[600];
  path_in_dir(path, sizeof path, "ck.bin");
  const uint64_t seed = tu_seed() + (uint64_t)_i;
  model_t a, b;
  model_make(&a, kind, seed, 0);
  model_steps(&a, 0, 5);
  TU_OK(mtopt_optimizer_save(a.opt, path));
  ck_assert_int_eq(count_files(), 1); /* no temporary left behind */
  size_t n;
  unsigned char *bytes = file_read(path, &n);
  n = cb_downgrade(bytes, n, format);
  file_write(path, bytes, n);
  free(bytes);
  model_steps(&a, 5, 4);

  model_make(&b, kind, seed + 99, 0); /* different start: load must overwrite it */
  TU_OK(mtopt_optimizer_load(b.opt, path));
  model_steps(&b, 5, 4);
  assert_same(&a, &b, kind);
  model_free(&a);
  model_free(&b);
}
END_TEST

static void corrupt(const char *path, long at, int truncate_to) {
  FILE *f = fopen(path, "r+b");
  ck_assert_ptr_nonnull(f);
  if (truncate_to >= 0) {
    ck_assert_int_eq(ftruncate(fileno(f), truncate_to), 0);
  } else {
    fseek(f, at, SEEK_SET);
    int c = fgetc(f);
    fseek(f, at, SEEK_SET);
    fputc(c ^ 0x10, f);
  }
  fclose(f);
}

START_TEST(test_bad_files_change_nothing) {
  char path[600], other[600];
  path_in_dir(path, sizeof path, "ck.bin");
  path_in_dir(other, sizeof other, "other.bin");
  model_t a, b, c;
  model_make(&a, MTOPT_OPTIMIZER_ADAMW, tu_seed(), 0);
  model_steps(&a, 0, 3);
  TU_OK(mtopt_optimizer_save(a.opt, path));
  model_make(&b, MTOPT_OPTIMIZER_ADAMW, tu_seed() + 7, 0);
  model_steps(&b, 0, 2);
  model_make(&c, MTOPT_OPTIMIZER_ADAMW, tu_seed() + 7, 0); /* b's twin, never loaded */
  model_steps(&c, 0, 2);

  TU_FAILS(mtopt_optimizer_load(b.opt, "/nonexistent/dir/ck.bin"), MTOPT_STATUS_IO_ERROR);
  ck_assert_ptr_nonnull(strstr(mtopt_last_error(), "/nonexistent/dir/ck.bin"));
  TU_FAILS(mtopt_optimizer_save(b.opt, "/nonexistent/dir/ck.bin"), MTOPT_STATUS_IO_ERROR);
  TU_FAILS(mtopt_optimizer_load(NULL, path), MTOPT_STATUS_INVALID_ARGUMENT);
  TU_FAILS(mtopt_optimizer_load(b.opt, NULL), MTOPT_STATUS_INVALID_ARGUMENT);

  /* a flipped bit in the middle of the state */
  FILE *f = fopen(path, "rb");
  fseek(f, 0, SEEK_END);
  const long size = ftell(f);
  fclose(f);
  corrupt(path, size / 2, -1);
  TU_FAILS(mtopt_optimizer_load(b.opt, path), MTOPT_STATUS_IO_ERROR);
  ck_assert_ptr_nonnull(strstr(mtopt_last_error(), "checksum"));
  /* truncated */
  corrupt(path, 0, (int)(size - 9));
  TU_FAILS(mtopt_optimizer_load(b.opt, path), MTOPT_STATUS_IO_ERROR);
  /* not a checkpoint at all */
  f = fopen(other, "wb");
  fputs("hello, not a checkpoint, but long enough to read a header from it..........", f);
  fclose(f);
  TU_FAILS(mtopt_optimizer_load(b.opt, other), MTOPT_STATUS_IO_ERROR);
  /* saved by an optimizer of another shape, or another kind */
  model_t d;
  model_make(&d, MTOPT_OPTIMIZER_ADAMW, tu_seed(), 4);
  TU_OK(mtopt_optimizer_save(d.opt, other));
  TU_FAILS(mtopt_optimizer_load(b.opt, other), MTOPT_STATUS_INVALID_ARGUMENT);
  model_free(&d);
  model_make(&d, MTOPT_OPTIMIZER_SGD, tu_seed(), 0);
  TU_OK(mtopt_optimizer_save(d.opt, other));
  TU_FAILS(mtopt_optimizer_load(b.opt, other), MTOPT_STATUS_INVALID_ARGUMENT);
  model_free(&d);

  twins_end(&a, &b, &c, MTOPT_OPTIMIZER_ADAMW, 2); /* after every refusal */
}
END_TEST

/* ---------------------------------------------------- load judges scalars -- */

typedef struct {
  int at;
  int is_int64, is_int32;
  double value;
} edit_t;

/* Loads each edited copy of path (resealed) into b, expecting status; b must
 * end as it began (its twin c). */
static void expect_edits(model_t *b, const char *path, const edit_t *e, int count,
                         mtopt_status_t status) {
  char bad[600];
  path_in_dir(bad, sizeof bad, "edited.bin");
  size_t n;
  unsigned char *src = file_read(path, &n);
  for (int i = 0; i < count; i++) {
    unsigned char v[8];
    size_t len = 4;
    if (e[i].is_int64) {
      const int64_t x = (int64_t)e[i].value;
      memcpy(v, &x, len = 8);
    } else if (e[i].is_int32) {
      const int32_t x = (int32_t)e[i].value;
      memcpy(v, &x, 4);
    } else {
      const float x = (float)e[i].value;
      memcpy(v, &x, 4);
    }
    edit_copy(src, n, bad, (size_t)e[i].at, v, len, 1);
    const mtopt_status_t st = mtopt_optimizer_load(b->opt, bad);
    ck_assert_msg(st == status, "edit %d (offset %d = %g): %s, expected %s (%s)", i, e[i].at,
                  e[i].value, mtopt_status_name(st), mtopt_status_name(status),
                  mtopt_last_error());
  }
  free(src);
}

#define F(at, v) {at, 0, 0, v}
#define I64(at, v) {at, 1, 0, v}
#define I32(at, v) {at, 0, 1, v}

/* Issue 12 item 1: a resealed file with a scalar out of the range of create
 * and the setters, a step count near overflow or a reserved field set is
 * refused, and the optimizer is unchanged. */
START_TEST(test_load_refuses_out_of_range) {
  char path[600];
  path_in_dir(path, sizeof path, "ck.bin");
  const mtopt_optimizer_kind_t kind = _i ? MTOPT_OPTIMIZER_SGD : MTOPT_OPTIMIZER_ADAMW;
  model_t a, b, c;
  model_make(&a, kind, tu_seed(), 0);
  model_steps(&a, 0, 3);
  TU_OK(mtopt_optimizer_save(a.opt, path));
  model_make(&b, kind, tu_seed() + 7, 0);
  model_make(&c, kind, tu_seed() + 7, 0);
  model_steps(&b, 0, 2);
  model_steps(&c, 0, 2);
  const edit_t common[] = {
      F(CB_LR, NAN), F(CB_LR, INFINITY), F(CB_LR, -1), F(CB_WD, -5), F(CB_WD, NAN),
      F(CB_BETA1, NAN), F(CB_BETA2, 1.5), F(CB_EPS, -1), F(CB_MGN, 0.01), F(CB_MGN, NAN),
      F(CB_LS, 0), F(CB_LS, -1), F(CB_LS, INFINITY), F(CB_LS, NAN), I64(CB_STEP, -5),
      I64(CB_STEP, (double)INT64_MAX), I64(CB_STEP, 0x1p62 + 1024), I64(CB_SKIP, -1),
      I64(CB_SKIP, 0x1p62 + 1024), I32(CB_GT, -1), I32(CB_GT, 2147483647.0), I32(CB_RES, 7)};
  expect_edits(&b, path, common, (int)(sizeof common / sizeof *common),
               MTOPT_STATUS_INVALID_ARGUMENT);
  const edit_t adam[] = {F(CB_BETA1, 1), F(CB_BETA2, 1), F(CB_EPS, 0), F(CB_MOM, NAN)};
  const edit_t sgd[] = {F(CB_MOM, -1), F(CB_MOM, NAN), F(CB_DAMP, 2), F(CB_DAMP, -0.1)};
  expect_edits(&b, path, _i ? sgd : adam, 4, MTOPT_STATUS_INVALID_ARGUMENT);
  /* the bounds themselves load: 2^62 steps, the largest float below 1 */
  const edit_t fine[] = {I64(CB_STEP, 0x1p62), I64(CB_SKIP, 0x1p62), F(CB_BETA1, 0.99999994)};
  model_t d;
  model_make(&d, kind, tu_seed(), 0);
  expect_edits(&d, path, fine, 3, MTOPT_STATUS_SUCCESS);
  model_free(&d);

  twins_end(&a, &b, &c, kind, 2);
}
END_TEST

/* Issue 12 item 2: a checkpoint of an optimizer with other features (loss
 * scaling, clipping, skip_nonfinite) is refused: by the recorded features in
 * formats 3 and 4, by what its scalars imply in formats 1 and 2. */
START_TEST(test_load_refuses_other_features) {
  char path[600], old[600];
  path_in_dir(path, sizeof path, "ck.bin");
  path_in_dir(old, sizeof old, "old.bin");
  mtopt_optimizer_config_t scaled = base_config(MTOPT_OPTIMIZER_ADAMW);
  scaled.max_grad_norm = 0.01f;
  scaled.loss_scale = 65536.0f;
  mtopt_optimizer_config_t plain = base_config(MTOPT_OPTIMIZER_ADAMW);
  plain.dynamic_loss_scale = 0;
  plain.loss_scale = 1.0f;
  model_t a, b, c;
  model_make_cfg(&a, &scaled, tu_seed(), 0);
  model_steps(&a, 0, 3);
  TU_OK(mtopt_optimizer_save(a.opt, path));
  model_make_cfg(&b, &plain, tu_seed() + 7, 0);
  model_make_cfg(&c, &plain, tu_seed() + 7, 0);
  TU_FAILS(mtopt_optimizer_load(b.opt, path), MTOPT_STATUS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(mtopt_last_error(), "loss scale") != NULL, "%s", mtopt_last_error());
  for (uint32_t format = 2; format >= 1; format--) {
    size_t n;
    unsigned char *bytes = file_read(path, &n);
    n = cb_downgrade(bytes, n, format);
    file_write(old, bytes, n);
    free(bytes);
    TU_FAILS(mtopt_optimizer_load(b.opt, old), MTOPT_STATUS_INVALID_ARGUMENT);
  }
  /* format 4 tells static from dynamic scaling, and skip_nonfinite */
  mtopt_optimizer_config_t other[3] = {scaled, scaled, plain};
  other[0].dynamic_loss_scale = 0;
  other[1].skip_nonfinite = 1;
  other[2].skip_nonfinite = 1;
  for (int k = 0; k < 3; k++) {
    model_t d;
    model_make_cfg(&d, &other[k], tu_seed(), 0);
    TU_FAILS(mtopt_optimizer_load(d.opt, k == 2 ? old : path), MTOPT_STATUS_INVALID_ARGUMENT);
    if (k == 2) {
      /* old (format 1) of a plain optimizer: nothing contradicts, it loads */
      model_t e;
      model_make_cfg(&e, &plain, tu_seed(), 0);
      TU_OK(mtopt_optimizer_save(e.opt, old));
      model_free(&e);
      size_t n;
      unsigned char *bytes = file_read(old, &n);
      TU_FAILS(mtopt_optimizer_load(d.opt, old), MTOPT_STATUS_INVALID_ARGUMENT);
      n = cb_downgrade(bytes, n, 1);
      file_write(old, bytes, n);
      free(bytes);
      TU_OK(mtopt_optimizer_load(d.opt, old));
    }
    model_free(&d);
  }
  /* a format 4 file with a feature this library does not know */
  size_t n;
  unsigned char *bytes = file_read(path, &n);
  ck_assert_uint_eq(cb_format(bytes), 4);
  {
    uint32_t feat;
    memcpy(&feat, bytes + CB_FEATURES, 4);
    feat |= 1u << 20;
    edit_copy(bytes, n, old, CB_FEATURES, &feat, 4, 1);
    TU_FAILS(mtopt_optimizer_load(a.opt, old), MTOPT_STATUS_INVALID_ARGUMENT);
    /* format 2 with its reserved word set */
    cb_downgrade(bytes, n, 2);
    edit_copy(bytes, n, old, CB_FEATURES, &feat, 4, 1);
    TU_FAILS(mtopt_optimizer_load(a.opt, old), MTOPT_STATUS_INVALID_ARGUMENT);
  }
  free(bytes);
  twins_end(&a, &b, &c, MTOPT_OPTIMIZER_ADAMW, 0);
}
END_TEST

/* Issue 12 item 3: the setters check the float they store: a double that
 * rounds to a bound (1.0 for the betas) or underflows to 0 is refused. */
START_TEST(test_setters_check_stored_float) {
  mtopt_optimizer_config_t oc = base_config(MTOPT_OPTIMIZER_ADAMW);
  oc.max_grad_norm = 1.0f;
  model_t a;
  model_make_cfg(&a, &oc, tu_seed(), 0);
  const struct {
    mtopt_hyperparam_t which;
    double value;
  } bad[] = {{MTOPT_HP_BETA1, 0.99999999}, {MTOPT_HP_BETA2, 0.99999999},
             {MTOPT_HP_EPS, 1e-46},        {MTOPT_HP_LOSS_SCALE, 1e-46},
             {MTOPT_HP_MAX_GRAD_NORM, 1e-46}, {MTOPT_HP_LR, 1e-46},
             {MTOPT_HP_EPS, -1e-46},       {MTOPT_HP_LOSS_SCALE, 3.5e38}};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    double before, after;
    TU_OK(mtopt_optimizer_get_hyperparam(a.opt, bad[i].which, &before));
    TU_FAILS(mtopt_optimizer_set_hyperparam(a.opt, bad[i].which, bad[i].value),
             MTOPT_STATUS_INVALID_ARGUMENT);
    TU_OK(mtopt_optimizer_get_hyperparam(a.opt, bad[i].which, &after));
    ck_assert(before == after);
  }
  /* the largest float below 1 is a valid beta; 0 a valid max_grad_norm */
  TU_OK(mtopt_optimizer_set_hyperparam(a.opt, MTOPT_HP_BETA2, 0.99999994));
  TU_OK(mtopt_optimizer_set_hyperparam(a.opt, MTOPT_HP_MAX_GRAD_NORM, 0.0));
  model_free(&a);
  /* create sees the float already: (float)0.99999999 is 1 */
  oc.beta1 = (float)0.99999999;
  mtopt_context_t *ctx = tu_cpu_context();
  mtopt_tensor_list_t *list;
  mtopt_optimizer_t *opt;
  float w[4] = {0}, g[4] = {0};
  TU_OK(mtopt_tensor_list_create(ctx, &list));
  TU_OK(mtopt_tensor_list_add_f32(list, w, g, 4, 0, NULL));
  TU_FAILS(mtopt_optimizer_create(ctx, list, &oc, &opt), MTOPT_STATUS_INVALID_ARGUMENT);
  TU_OK(mtopt_tensor_list_destroy(list));
  TU_OK(mtopt_context_destroy(ctx));
}
END_TEST

/* Issue 12 item 8: integrity before interpretation. Any single-bit flip of the
 * header, ext and records is IO_ERROR; the same edits resealed get the status
 * of their content. */
START_TEST(test_corrupt_is_io_error) {
  char path[600], bad[600];
  path_in_dir(path, sizeof path, "ck.bin");
  path_in_dir(bad, sizeof bad, "bad.bin");
  model_t a;
  model_make(&a, MTOPT_OPTIMIZER_ADAMW, tu_seed(), 0);
  model_steps(&a, 0, 2);
  TU_OK(mtopt_optimizer_save(a.opt, path));
  size_t n;
  unsigned char *b = file_read(path, &n);
  uint32_t crc;
  memcpy(&crc, b + n - 4, 4);
  ck_assert_uint_eq(crc, cb_crc32(b, n - 4)); /* the library's table is CRC-32 */
  const size_t span = CB_RECS + CB_REC * NT < n ? CB_RECS + CB_REC * NT : n;
  for (size_t bit = 0; bit < span * 8; bit++) {
    const unsigned char v = b[bit / 8] ^ (unsigned char)(1u << (bit % 8));
    edit_copy(b, n, bad, bit / 8, &v, 1, 0);
    const mtopt_status_t st = mtopt_optimizer_load(a.opt, bad);
    ck_assert_msg(st == MTOPT_STATUS_IO_ERROR, "bit %zu: %s (%s)", bit, mtopt_status_name(st),
                  mtopt_last_error());
  }
  const size_t cuts[] = {0, 7, 8, 50, CB_HDR, CB_HDR + 3, CB_HDR + 4, n / 2, n - 1};
  for (size_t i = 0; i < sizeof cuts / sizeof *cuts; i++) {
    file_write(bad, b, cuts[i]);
    TU_FAILS(mtopt_optimizer_load(a.opt, bad), MTOPT_STATUS_IO_ERROR);
  }
  b[n] = 0;
  file_write(bad, b, n + 1); /* trailing data */
  TU_FAILS(mtopt_optimizer_load(a.opt, bad), MTOPT_STATUS_IO_ERROR);
  /* resealed: the content decides */
  const uint32_t format9 = 9, kind = 2;
  const int64_t nt = 4;
  edit_copy(b, n, bad, CB_FORMAT, &format9, 4, 1);
  TU_FAILS(mtopt_optimizer_load(a.opt, bad), MTOPT_STATUS_NOT_SUPPORTED);
  edit_copy(b, n, bad, CB_KIND, &kind, 4, 1);
  TU_FAILS(mtopt_optimizer_load(a.opt, bad), MTOPT_STATUS_INVALID_ARGUMENT);
  edit_copy(b, n, bad, CB_NT, &nt, 8, 1);
  TU_FAILS(mtopt_optimizer_load(a.opt, bad), MTOPT_STATUS_INVALID_ARGUMENT);
  /* a resealed file cut short of its payload */
  unsigned char *cut = malloc(n);
  memcpy(cut, b, n - 40);
  cb_reseal(cut, n - 36);
  file_write(bad, cut, n - 36);
  TU_FAILS(mtopt_optimizer_load(a.opt, bad), MTOPT_STATUS_INVALID_ARGUMENT);
  free(cut);
  free(b);
  model_free(&a);
}
END_TEST

/* ------------------------------------------------------------ save fails -- */

/* fdopen, interposed: fails while fail_fdopen is set (as on ENOMEM). */
static int fail_fdopen;

FILE *fdopen(int fd, const char *mode) {
  static FILE *(*real)(int, const char *);
  if (fail_fdopen) {
    errno = ENOMEM;
    return NULL;
  }
  if (!real) *(void **)&real = dlsym(RTLD_NEXT, "fdopen");
  return real(fd, mode);
}

/* The temporary name's tag for a target file name: ".mtopt-<crc32 hex>-". */
static void temp_name(char *out, size_t cap, const char *base, const char *suffix) {
  snprintf(out, cap, "%s/.mtopt-%08x-%s", dir,
           (unsigned)cb_crc32((const unsigned char *)base, strlen(base)), suffix);
}

/* Issue 12 item 5: a save that fails leaves no temporary (fdopen failing, a
 * write failing), and the old checkpoint as it was; a save killed mid-write
 * leaves one, which the next successful save of that target removes (not one
 * another save holds, nor one of another target). */
START_TEST(test_failed_save_leaves_nothing) {
  char path[600];
  path_in_dir(path, sizeof path, "ck.bin");
  model_t a;
  model_make(&a, MTOPT_OPTIMIZER_ADAMW, tu_seed(), 0);
  fail_fdopen = 1;
  TU_FAILS(mtopt_optimizer_save(a.opt, path), MTOPT_STATUS_IO_ERROR);
  fail_fdopen = 0;
  ck_assert_int_eq(count_files(), 0);
  TU_OK(mtopt_optimizer_save(a.opt, path));
  size_t n0, n1;
  unsigned char *before = file_read(path, &n0);
  model_steps(&a, 0, 1);
  /* a write past the file size limit fails (EFBIG, SIGXFSZ ignored); with
   * the signal's default action the save is killed mid-write. In children:
   * the limit would stop this process's test harness too. */
  for (int killed = 0; killed < 2; killed++) {
    const pid_t pid = fork();
    if (pid == 0) {
      struct rlimit core = {0, 0}, lim = {1000, 1000};
      setrlimit(RLIMIT_CORE, &core);
      signal(SIGXFSZ, killed ? SIG_DFL : SIG_IGN);
      setrlimit(RLIMIT_FSIZE, &lim);
      _exit(mtopt_optimizer_save(a.opt, path) == MTOPT_STATUS_IO_ERROR ? 0 : 1);
    }
    int status;
    ck_assert_int_eq(waitpid(pid, &status, 0), pid);
    if (killed)
      ck_assert_msg(WIFSIGNALED(status) && WTERMSIG(status) == SIGXFSZ, "status %d", status);
    else
      ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "status %d", status);
    if (!killed) ck_assert_int_eq(count_files(), 1);
  }
  unsigned char *after = file_read(path, &n1);
  ck_assert(n0 == n1 && memcmp(before, after, n0) == 0);
  free(before);
  free(after);
  ck_assert_int_eq(count_files(), 2); /* the checkpoint and the killed save's temporary */
  /* another save in progress (its temporary locked), a near miss of the
   * pattern, a temporary of another target */
  char busy[600], near[600], other[600];
  temp_name(busy, sizeof busy, "ck.bin", "Busy00");
  temp_name(near, sizeof near, "ck.bin", "abc");
  temp_name(other, sizeof other, "ck2.bin", "Other0");
  const int busy_fd = open(busy, O_CREAT | O_WRONLY, 0600);
  ck_assert_int_ge(busy_fd, 0);
  ck_assert_int_eq(flock(busy_fd, LOCK_EX), 0);
  close(open(near, O_CREAT | O_WRONLY, 0600));
  close(open(other, O_CREAT | O_WRONLY, 0600));
  TU_OK(mtopt_optimizer_save(a.opt, path));
  ck_assert_int_eq(count_files(), 4); /* the killed save's temporary is gone */
  ck_assert_int_eq(access(busy, F_OK), 0);
  ck_assert_int_eq(access(near, F_OK), 0);
  ck_assert_int_eq(access(other, F_OK), 0);
  close(busy_fd);
  model_free(&a);
}
END_TEST

/* Issue 12 item 6: names as long as the system allows save and load: a
 * 255-character file name, a path of 4,090 characters; a longer name is
 * refused with the system's reason. */
START_TEST(test_long_names_save) {
  model_t a, b;
  model_make(&a, MTOPT_OPTIMIZER_SGD, tu_seed(), 0);
  model_make(&b, MTOPT_OPTIMIZER_SGD, tu_seed() + 1, 0);
  model_steps(&a, 0, 2);
  char name[300], path[4200];
  memset(name, 'n', 255);
  name[255] = '\0';
  path_in_dir(path, sizeof path, name);
  TU_OK(mtopt_optimizer_save(a.opt, path));
  TU_OK(mtopt_optimizer_load(b.opt, path));
  ck_assert_int_eq(count_files(), 1);
  remove(path);
  name[255] = 'n', name[256] = '\0';
  path_in_dir(path, sizeof path, name);
  TU_FAILS(mtopt_optimizer_save(a.opt, path), MTOPT_STATUS_IO_ERROR);
  ck_assert_int_eq(count_files(), 0);
  /* nested directories of 200 characters up to a 4,090-character path */
  size_t len = strlen(dir);
  memcpy(path, dir, len + 1);
  int depth = 0;
  while (len + 201 + 20 < 4090) {
    path[len++] = '/';
    memset(path + len, 'd', 200);
    len += 200;
    path[len] = '\0';
    ck_assert_int_eq(mkdir(path, 0700), 0);
    depth++;
  }
  path[len++] = '/';
  memset(path + len, 'f', 4090 - len);
  path[4090] = '\0';
  ck_assert_int_eq(strlen(path), 4090);
  TU_OK(mtopt_optimizer_save(a.opt, path));
  model_steps(&a, 2, 1);
  TU_OK(mtopt_optimizer_load(a.opt, path));
  TU_OK(mtopt_optimizer_load(b.opt, path));
  remove(path);
  for (; depth > 0; depth--) {
    *strrchr(path, '/') = '\0';
    ck_assert_int_eq(rmdir(path), 0);
  }
  model_free(&a);
  model_free(&b);
}
END_TEST

/* Save replaces only a regular file or creates one: a symbolic link (to a
 * file or dangling), a FIFO, a directory are refused and left as they are.
 * The file's mode is 0666 less the umask, as fopen's. */
START_TEST(test_save_target_kinds) {
  model_t a;
  model_make(&a, MTOPT_OPTIMIZER_ADAMW, tu_seed(), 0);
  char file[600], link[600], dangling[600], fifo[600], sub[600], slash[700];
  path_in_dir(file, sizeof file, "file.bin");
  path_in_dir(link, sizeof link, "link.bin");
  path_in_dir(dangling, sizeof dangling, "dangling.bin");
  path_in_dir(fifo, sizeof fifo, "fifo.bin");
  path_in_dir(sub, sizeof sub, "sub");
  snprintf(slash, sizeof slash, "%s/", file);
  file_write(file, (const unsigned char *)"keep", 4);
  ck_assert_int_eq(symlink(file, link), 0);
  ck_assert_int_eq(symlink("/nonexistent/target", dangling), 0);
  ck_assert_int_eq(mkfifo(fifo, 0600), 0);
  ck_assert_int_eq(mkdir(sub, 0700), 0);
  const char *refused[] = {link, dangling, fifo, sub, slash};
  for (int i = 0; i < 5; i++)
    TU_FAILS(mtopt_optimizer_save(a.opt, refused[i]), MTOPT_STATUS_INVALID_ARGUMENT);
  struct stat st;
  ck_assert_int_eq(lstat(link, &st), 0);
  ck_assert(S_ISLNK(st.st_mode));
  ck_assert_int_eq(lstat(dangling, &st), 0);
  ck_assert(S_ISLNK(st.st_mode));
  ck_assert_int_eq(lstat(fifo, &st), 0);
  ck_assert(S_ISFIFO(st.st_mode));
  size_t n;
  unsigned char *keep = file_read(file, &n);
  ck_assert(n == 4 && memcmp(keep, "keep", 4) == 0);
  free(keep);
  ck_assert_int_eq(count_files(), 5);
  rmdir(sub);
  /* the mode: 0666 less the umask, for a new file and a replaced one */
  const mode_t masks[] = {022, 027, 0};
  for (int i = 0; i < 3; i++) {
    const mode_t old = umask(masks[i]);
    TU_OK(mtopt_optimizer_save(a.opt, file));
    umask(old);
    ck_assert_int_eq(stat(file, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0666 & ~masks[i]);
  }
  /* a relative name saves in the working directory */
  ck_assert_int_eq(chdir(dir), 0);
  TU_OK(mtopt_optimizer_save(a.opt, "relative.bin"));
  TU_OK(mtopt_optimizer_load(a.opt, "relative.bin"));
  ck_assert_int_eq(chdir("/"), 0);
  model_free(&a);
}
END_TEST

Suite *checkpoint_suite(void) {
  Suite *s = suite_create("checkpoint");
  TCase *tc = tcase_create("checkpoint");
  tcase_add_checked_fixture(tc, make_dir, remove_dir);
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_resume_bit_exact, 0, 12);
  tcase_add_test(tc, test_bad_files_change_nothing);
  tcase_add_loop_test(tc, test_load_refuses_out_of_range, 0, 2);
  tcase_add_test(tc, test_load_refuses_other_features);
  tcase_add_test(tc, test_setters_check_stored_float);
  tcase_add_test(tc, test_corrupt_is_io_error);
  tcase_add_test(tc, test_failed_save_leaves_nothing);
  tcase_add_test(tc, test_long_names_save);
  tcase_add_test(tc, test_save_target_kinds);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(checkpoint_suite(), 0); }

/* Checkpoints: resume is bit-exact from every format; bad files are refused
 * and change nothing (out-of-range scalars, other features, corruption, each
 * with its status). Saves that fail, long names and the target's kind:
 * checkpoint_save.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint_rig.h"
#include "fuzz/ckpt_bytes.h"

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
  checkpoint_add_save_tests(tc);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(checkpoint_suite(), 0); }

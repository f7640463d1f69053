/* Checkpoints: resume is bit-exact; bad files are refused and change nothing. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

#define NT 5
static const int64_t sizes[NT] = {7, 1, 4099, 0, 333};

typedef struct {
  mtopt_context_t *ctx;
  mtopt_tensor_list_t *list;
  mtopt_optimizer_t *opt;
  float *w[NT], *g[NT];
} model_t;

static void model_make(model_t *m, mtopt_optimizer_kind_t kind, uint64_t seed, int extra) {
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
  mtopt_optimizer_config_t oc = MTOPT_OPTIMIZER_CONFIG_INIT;
  oc.kind = kind;
  oc.momentum = kind == MTOPT_OPTIMIZER_SGD ? 0.9f : 0.0f;
  oc.lr = 1e-2f;
  oc.dynamic_loss_scale = 1;
  oc.loss_scale = 1024.0f;
  oc.growth_interval = 2;
  oc.chunk_size = 64;
  TU_OK(mtopt_optimizer_create(m->ctx, m->list, &oc, &m->opt));
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

static char dir[64];

static void make_dir(void) {
  snprintf(dir, sizeof dir, "/tmp/mtopt_ckpt_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
}

static void remove_dir(void) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char p[512];
  while (d && (e = readdir(d)))
    if (e->d_name[0] != '.') snprintf(p, sizeof p, "%s/%s", dir, e->d_name), remove(p);
  if (d) closedir(d);
  rmdir(dir);
}

static int count_files(void) {
  DIR *d = opendir(dir);
  struct dirent *e;
  int n = 0;
  while (d && (e = readdir(d))) n += e->d_name[0] != '.';
  if (d) closedir(d);
  return n;
}

START_TEST(test_resume_bit_exact) {
  const mtopt_optimizer_kind_t kinds[] = {MTOPT_OPTIMIZER_ADAMW, MTOPT_OPTIMIZER_SGD,
                                          MTOPT_OPTIMIZER_LAMB};
  const mtopt_optimizer_kind_t kind = kinds[_i];
  char path[128];
  snprintf(path, sizeof path, "%s/ck.bin", dir);
  const uint64_t seed = tu_seed() + (uint64_t)_i;
  model_t a, b;
  model_make(&a, kind, seed, 0);
  model_steps(&a, 0, 5);
  TU_OK(mtopt_optimizer_save(a.opt, path));
  ck_assert_int_eq(count_files(), 1); /* no temporary left behind */
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
  char path[128], other[128];
  snprintf(path, sizeof path, "%s/ck.bin", dir);
  snprintf(other, sizeof other, "%s/other.bin", dir);
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

  /* after every refusal b is still c's twin */
  model_steps(&b, 2, 2);
  model_steps(&c, 2, 2);
  assert_same(&b, &c, MTOPT_OPTIMIZER_ADAMW);
  model_free(&a);
  model_free(&b);
  model_free(&c);
}
END_TEST

Suite *checkpoint_suite(void) {
  Suite *s = suite_create("checkpoint");
  TCase *tc = tcase_create("checkpoint");
  tcase_add_checked_fixture(tc, make_dir, remove_dir);
  tcase_set_timeout(tc, 60);
  tcase_add_loop_test(tc, test_resume_bit_exact, 0, 3);
  tcase_add_test(tc, test_bad_files_change_nothing);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(checkpoint_suite(), 0); }

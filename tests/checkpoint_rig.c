/* The checkpoint suite's model, directory and file helpers (checkpoint_rig.h). */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "checkpoint_rig.h"
#include "fuzz/ckpt_bytes.h"

static const int64_t sizes[NT] = {7, 1, 4099, 0, 333};

/* The suite's default: dynamic loss scaling, no clipping. */
mtopt_optimizer_config_t base_config(mtopt_optimizer_kind_t kind) {
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

void model_make_cfg(model_t *m, const mtopt_optimizer_config_t *oc, uint64_t seed,
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

void model_make(model_t *m, mtopt_optimizer_kind_t kind, uint64_t seed, int extra) {
  const mtopt_optimizer_config_t oc = base_config(kind);
  model_make_cfg(m, &oc, seed, extra);
}

void model_free(model_t *m) {
  TU_OK(mtopt_optimizer_destroy(m->opt));
  TU_OK(mtopt_tensor_list_destroy(m->list));
  TU_OK(mtopt_context_destroy(m->ctx));
  for (int i = 0; i < NT; i++) free(m->w[i]), free(m->g[i]);
}

/* Step with gradients drawn from (seed, step), the same for any model. */
void model_steps(model_t *m, int from, int count) {
  for (int t = from; t < from + count; t++) {
    tu_rng_t r;
    tu_rng_init(&r, 1000 + (uint64_t)t);
    for (int i = 0; i < NT; i++) tu_fill(&r, m->g[i], sizes[i], -512, 512);
    TU_OK(mtopt_optimizer_step(m->opt));
  }
}

void assert_same(model_t *a, model_t *b, mtopt_optimizer_kind_t kind) {
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
void twins_end(model_t *a, model_t *b, model_t *c, mtopt_optimizer_kind_t kind,
                      int from) {
  model_steps(b, from, 2);
  model_steps(c, from, 2);
  assert_same(b, c, kind);
  model_free(a);
  model_free(b);
  model_free(c);
}

char dir[64];

void make_dir(void) {
  snprintf(dir, sizeof dir, "/tmp/mtopt_ckpt_XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
}

void remove_dir(void) {
  DIR *d = opendir(dir);
  struct dirent *e;
  char p[1024];
  while (d && (e = readdir(d)))
    if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
      snprintf(p, sizeof p, "%s/%s", dir, e->d_name), remove(p);
  if (d) closedir(d);
  rmdir(dir);
}

int count_files(void) {
  DIR *d = opendir(dir);
  struct dirent *e;
  int n = 0;
  while (d && (e = readdir(d))) n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
  if (d) closedir(d);
  return n;
}

/* ------------------------------------------------- the file, byte by byte -- */

unsigned char *file_read(const char *path, size_t *n) {
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

void file_write(const char *path, const unsigned char *b, size_t n) {
  FILE *f = fopen(path, "wb");
  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(fwrite(b, 1, n, f), n);
  fclose(f);
}

/* Copies src to dst with bytes [at, at+len) replaced, resealed or not. */
void edit_copy(const unsigned char *src, size_t n, const char *dst, size_t at,
                      const void *bytes, size_t len, int seal) {
  unsigned char *b = malloc(n);
  memcpy(b, src, n);
  memcpy(b + at, bytes, len);
  if (seal) cb_reseal(b, n);
  file_write(dst, b, n);
  free(b);
}

void path_in_dir(char *out, size_t cap, const char *name) {
  snprintf(out, cap, "%s/%s", dir, name);
}

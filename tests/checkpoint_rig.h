/* The checkpoint suite's shared pieces (checkpoint.c, checkpoint_save.c): a
 * small model of NT tensors (one empty) and its optimizer, twins that must
 * step alike, the per-test directory, and whole-file reads and edits. */
#ifndef MTOPT_TEST_CHECKPOINT_RIG_H
#define MTOPT_TEST_CHECKPOINT_RIG_H

#include <stddef.h>
#include <stdint.h>

#include "test_util.h"

#define NT 5

typedef struct {
  mtopt_context_t *ctx;
  mtopt_tensor_list_t *list;
  mtopt_optimizer_t *opt;
  float *w[NT], *g[NT];
} model_t;

/* The suite's default: dynamic loss scaling, no clipping. */
mtopt_optimizer_config_t base_config(mtopt_optimizer_kind_t kind);
void model_make_cfg(model_t *m, const mtopt_optimizer_config_t *oc, uint64_t seed, int extra);
void model_make(model_t *m, mtopt_optimizer_kind_t kind, uint64_t seed, int extra);
void model_free(model_t *m);
void model_steps(model_t *m, int from, int count);
/* Weights and state of a and b equal bit for bit. */
void assert_same(model_t *a, model_t *b, mtopt_optimizer_kind_t kind);
/* Ends a test of refusals: b, offered only bad files, still steps as its
 * twin c that was never offered any; frees a, b and c. */
void twins_end(model_t *a, model_t *b, model_t *c, mtopt_optimizer_kind_t kind, int from);

/* The test's directory (the fixture makes and removes it), its file count. */
extern char dir[64];
void make_dir(void);
void remove_dir(void);
int count_files(void);
void path_in_dir(char *out, size_t cap, const char *name);

unsigned char *file_read(const char *path, size_t *n);
void file_write(const char *path, const unsigned char *b, size_t n);
/* Copies src to dst with bytes [at, at+len) replaced, resealed or not. */
void edit_copy(const unsigned char *src, size_t n, const char *dst, size_t at,
               const void *bytes, size_t len, int seal);

/* checkpoint_save.c's tests, into the suite's test case. */
void checkpoint_add_save_tests(TCase *tc);

#endif

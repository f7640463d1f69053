/* Several host threads, each on its own context (issue 12): the header
 * promises that distinct contexts are independent. Six threads step, save,
 * load, read step info and provoke errors at once, two on each of three
 * configurations (AdamW with statistics, LAMB, SGD with BF16 mixed
 * precision), and the two threads of a configuration must end with the same
 * bits. tools/test.sh builds this suite under ThreadSanitizer, which reports
 * any data race between them (the CRC table of checkpoint.c was one: saves on
 * two contexts at once).
 *
 * The contexts use one OpenMP thread: libgomp is not built with TSan, whose
 * reports of its barriers would be false positives; with num_threads = 1 the
 * CPU backend enters no parallel region at all (backend_cpu.c). ctest and
 * tools/test.sh also set OMP_NUM_THREADS=1. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

enum { NTHREADS = 6, NCONF = 3, NT = 3, ITERS = 12 };
static const int64_t kNumel[NT] = {513, 2048, 17};

typedef struct {
  int id, conf;
  char path[128];
  float *w[NT];       /* F32 weights (conf 2: tensor 1 holds bf16) */
  uint16_t *wb;       /* conf 2: tensor 1's bf16 weights */
  float *g[NT];
  int failed;         /* set by the thread; the main thread asserts */
  char why[256];
} worker_t;

static char g_dir[64];

#define WCHECK(w, cond, ...)                                                   \
  do {                                                                         \
    if (!(cond) && !(w)->failed) {                                             \
      (w)->failed = 1;                                                         \
      snprintf((w)->why, sizeof (w)->why, __VA_ARGS__);                        \
    }                                                                          \
  } while (0)
#define WOK(w, expr)                                                           \
  do {                                                                         \
    mtopt_status_t st_ = (expr);                                               \
    WCHECK(w, st_ == MTOPT_STATUS_SUCCESS, "thread %d: %s -> %s", (w)->id, #expr, \
           mtopt_last_error());                                                \
  } while (0)

static mtopt_optimizer_config_t conf_config(int conf) {
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  c.chunk_size = 256;
  if (conf == 0) {
    c.max_grad_norm = 0.5f;
    c.dynamic_loss_scale = 1;
    c.loss_scale = 256.0f;
  } else if (conf == 1) {
    c.kind = MTOPT_OPTIMIZER_LAMB;
  } else {
    c.kind = MTOPT_OPTIMIZER_SGD;
    c.momentum = 0.9f;
    c.master_weights = MTOPT_MASTER_F32;
    c.skip_nonfinite = 1;
  }
  return c;
}

/* Gradients of step k, the same for both threads of a configuration. */
static void fill_grads(worker_t *w, int k) {
  tu_rng_t rng;
  tu_rng_init(&rng, 1000u * (uint64_t)w->conf + (uint64_t)k);
  const float scale = w->conf == 0 ? 256.0f : 1.0f; /* the loss scale */
  for (int i = 0; i < NT; i++) tu_fill(&rng, w->g[i], kNumel[i], -scale, scale);
}

static void *worker(void *arg) {
  worker_t *w = arg;
  mtopt_context_config_t cc = MTOPT_CONTEXT_CONFIG_INIT;
  cc.num_threads = 1;
  mtopt_context_t *ctx = NULL;
  mtopt_tensor_list_t *list = NULL;
  mtopt_optimizer_t *opt = NULL;
  WOK(w, mtopt_context_create(&cc, &ctx));
  if (w->failed) return NULL;
  WOK(w, mtopt_tensor_list_create(ctx, &list));
  for (int i = 0; i < NT && !w->failed; i++) {
    mtopt_tensor_desc_t d = MTOPT_TENSOR_DESC_INIT;
    d.param = w->conf == 2 && i == 1 ? (void *)w->wb : (void *)w->w[i];
    d.param_dtype = w->conf == 2 && i == 1 ? MTOPT_DTYPE_BF16 : MTOPT_DTYPE_F32;
    d.grad = w->g[i];
    d.numel = kNumel[i];
    d.name = "t";
    WOK(w, mtopt_tensor_list_add(list, &d, NULL));
  }
  const mtopt_optimizer_config_t c = conf_config(w->conf);
  WOK(w, mtopt_optimizer_create(ctx, list, &c, &opt));
  for (int k = 0; k < ITERS && !w->failed; k++) {
    fill_grads(w, k);
    WOK(w, mtopt_optimizer_step(opt));
    mtopt_step_info_t info = MTOPT_STEP_INFO_INIT;
    WOK(w, mtopt_optimizer_get_step_info(opt, &info));
    WCHECK(w, info.step + info.skipped_steps == k + 1, "thread %d: step %lld + %lld at %d",
           w->id, (long long)info.step, (long long)info.skipped_steps, k);
    /* An error of this thread: its message is its own (thread-local). */
    mtopt_status_t st = mtopt_optimizer_set_hyperparam(opt, MTOPT_HP_LR, -1.0 - w->id);
    WCHECK(w, st == MTOPT_STATUS_INVALID_ARGUMENT, "thread %d: a negative lr -> %s", w->id,
           mtopt_status_name(st));
    char neg[32];
    snprintf(neg, sizeof neg, "%d", -1 - w->id);
    WCHECK(w, strstr(mtopt_last_error(), neg) != NULL,
           "thread %d: the message '%s' is not about its own lr %s", w->id, mtopt_last_error(),
           neg);
    /* Save, and every other step load it back: the same state. */
    WOK(w, mtopt_optimizer_save(opt, w->path));
    if (k % 2) WOK(w, mtopt_optimizer_load(opt, w->path));
    mtopt_step_info_t again = MTOPT_STEP_INFO_INIT;
    WOK(w, mtopt_optimizer_get_step_info(opt, &again));
    WCHECK(w, again.step == info.step && again.loss_scale == info.loss_scale,
           "thread %d: load changed the step state", w->id);
  }
  WOK(w, mtopt_optimizer_destroy(opt));
  WOK(w, mtopt_tensor_list_destroy(list));
  WOK(w, mtopt_context_destroy(ctx));
  return NULL;
}

START_TEST(test_contexts_in_threads) {
  strcpy(g_dir, "/tmp/mtopt_threads_XXXXXX");
  ck_assert(mkdtemp(g_dir) != NULL);
  worker_t ws[NTHREADS];
  memset(ws, 0, sizeof ws);
  tu_rng_t rng;
  tu_rng_init(&rng, 7u);
  for (int t = 0; t < NTHREADS; t++) {
    worker_t *w = &ws[t];
    w->id = t;
    w->conf = t % NCONF;
    snprintf(w->path, sizeof w->path, "%s/opt%d.ckpt", g_dir, t);
    for (int i = 0; i < NT; i++) {
      w->w[i] = malloc((size_t)kNumel[i] * sizeof(float));
      w->g[i] = malloc((size_t)kNumel[i] * sizeof(float));
      tu_rng_t r = rng; /* the same weights for every thread */
      tu_fill(&r, w->w[i], kNumel[i], -1.0f, 1.0f);
    }
    w->wb = malloc((size_t)kNumel[1] * sizeof(uint16_t));
    for (int64_t j = 0; j < kNumel[1]; j++) {
      uint32_t u;
      memcpy(&u, &w->w[1][j], 4);
      w->wb[j] = (uint16_t)(u >> 16); /* truncated: any bf16 value will do */
    }
  }
  pthread_t th[NTHREADS];
  for (int t = 0; t < NTHREADS; t++)
    ck_assert_int_eq(pthread_create(&th[t], NULL, worker, &ws[t]), 0);
  for (int t = 0; t < NTHREADS; t++) ck_assert_int_eq(pthread_join(th[t], NULL), 0);
  for (int t = 0; t < NTHREADS; t++) ck_assert_msg(!ws[t].failed, "%s", ws[t].why);
  /* The two threads of a configuration: the same bits. */
  for (int t = NCONF; t < NTHREADS; t++) {
    const worker_t *a = &ws[t - NCONF], *b = &ws[t];
    for (int i = 0; i < NT; i++)
      ck_assert_msg(tu_first_bit_diff(a->w[i], b->w[i], kNumel[i]) == -1,
                    "threads %d and %d: tensor %d differs", a->id, b->id, i);
    ck_assert(memcmp(a->wb, b->wb, (size_t)kNumel[1] * 2) == 0);
  }
  for (int t = 0; t < NTHREADS; t++) {
    for (int i = 0; i < NT; i++) free(ws[t].w[i]), free(ws[t].g[i]);
    free(ws[t].wb);
    unlink(ws[t].path);
  }
  rmdir(g_dir);
}
END_TEST

static Suite *threads_suite(void) {
  Suite *s = suite_create("threads");
  TCase *tc = tcase_create("contexts");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_contexts_in_threads);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(threads_suite(), 0); }

/* Allocation failure over the whole life cycle (issue 12), CPU backend.
 *
 * Every allocation the library makes goes through the wrappers below (the
 * executable links the static mtopt_internal with -Wl,--wrap for malloc,
 * calloc, realloc, free, aligned_alloc, posix_memalign, strdup, and for fopen and
 * fdopen, whose FILE is an allocation too). For each configuration a scripted
 * life cycle (context, list, adds, group, optimizer create, steps, setters,
 * zero_grad, reads, save, load, destroys) runs once per N with the N-th
 * counted call failing, for every N up to the count of a clean run. Required:
 *  - the failing call returns OUT_OF_MEMORY (IO_ERROR where fopen/fdopen
 *    failed) with a message, and the object it was called on is unchanged
 *    (weights, step info, the learning rate);
 *  - the same call retried without injection succeeds, and the life cycle
 *    finishes and destroys everything;
 *  - no leak: every block the library allocated is freed by the end of the
 *    run (the wrappers track them), and LeakSanitizer finds nothing after
 *    each run in the ASan build (tools/test.sh);
 *  - a failed save leaves no temporary file beside the checkpoint.
 * Only calls made while a library function runs are counted (the test's own
 * allocations are not).
 *
 * And (issue 12 item 10): after mtopt_context_create, steps, setters,
 * zero_grad and get_step_info allocate nothing, at 1 and at 4 threads. In
 * builds without a sanitizer this counts every allocation of the process
 * (malloc and friends are interposed here), libgomp's included; under ASan,
 * the library's own calls only. */
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "test_util.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif
#ifndef SANITIZED
#define SANITIZED 0
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/lsan_interface.h>
#define HAVE_LSAN 1
#else
#define HAVE_LSAN 0
#endif

/* ---------------------------------------------------------- injection -- */

static long g_armed;     /* count (and maybe fail) the library's calls */
static long g_calls;     /* calls counted while armed */
static long g_fail_at;   /* the call to fail (0-based), -1: none */
static int g_fired;      /* the failure was injected */
static int g_fired_file; /* ... in fopen/fdopen */

static int inject(int file) {
  if (!__atomic_load_n(&g_armed, __ATOMIC_RELAXED)) return 0;
  const long n = __atomic_fetch_add(&g_calls, 1, __ATOMIC_RELAXED);
  if (n != g_fail_at) return 0;
  g_fired = 1;
  g_fired_file = file;
  errno = ENOMEM;
  return 1;
}

void *__real_malloc(size_t);
void *__real_calloc(size_t, size_t);
void *__real_realloc(void *, size_t);
void *__real_aligned_alloc(size_t, size_t);
int __real_posix_memalign(void **, size_t, size_t);
char *__real_strdup(const char *);
FILE *__real_fopen(const char *, const char *);
FILE *__real_fdopen(int, const char *);

/* The library's live blocks: what it allocated inside a call (g_in_lib) and
 * has not freed. A run that ends with all objects destroyed must leave none
 * (a leak check that needs no sanitizer). Steps allocate nothing, so the
 * OpenMP workers never come here; no lock. */
enum { MAX_LIVE = 1024 };
static int g_in_lib;
static void *g_live[MAX_LIVE];
static int g_nlive;

static int g_live_overflow;

/* No check assertion here: check allocates (it is linked in, so wrapped). */
static void *track(void *p) {
  if (p && g_in_lib) {
    if (g_nlive < MAX_LIVE)
      g_live[g_nlive++] = p;
    else
      g_live_overflow = 1;
  }
  return p;
}

static void untrack(void *p) {
  for (int i = 0; p && i < g_nlive; i++)
    if (g_live[i] == p) {
      g_live[i] = g_live[--g_nlive];
      return;
    }
}

void __real_free(void *);
void __wrap_free(void *p) {
  untrack(p);
  __real_free(p);
}
void *__wrap_malloc(size_t n) { return inject(0) ? NULL : track(__real_malloc(n)); }
void *__wrap_calloc(size_t k, size_t n) { return inject(0) ? NULL : track(__real_calloc(k, n)); }
void *__wrap_realloc(void *p, size_t n) {
  if (inject(0)) return NULL;
  void *q = __real_realloc(p, n);
  if (q || n == 0) untrack(p);
  return track(q);
}
void *__wrap_aligned_alloc(size_t a, size_t n) {
  return inject(0) ? NULL : track(__real_aligned_alloc(a, n));
}
int __wrap_posix_memalign(void **p, size_t a, size_t n) {
  if (inject(0)) return ENOMEM;
  const int r = __real_posix_memalign(p, a, n);
  if (r == 0) track(*p);
  return r;
}
char *__wrap_strdup(const char *s) { return inject(0) ? NULL : track(__real_strdup(s)); }
FILE *__wrap_fopen(const char *p, const char *m) { return inject(1) ? NULL : __real_fopen(p, m); }
FILE *__wrap_fdopen(int fd, const char *m) { return inject(1) ? NULL : __real_fdopen(fd, m); }

#if !SANITIZED
/* Every allocation of the process (libc's and libgomp's own included), on
 * glibc's heap: counted, never failed. */
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
static long g_process_allocs;
static void count_alloc(void) { __atomic_fetch_add(&g_process_allocs, 1, __ATOMIC_RELAXED); }
/* Exported (the tests build with hidden visibility), so that the shared
 * libraries' calls resolve here. */
#define EXPORT __attribute__((visibility("default")))
EXPORT void *malloc(size_t n) { return count_alloc(), __libc_malloc(n); }
EXPORT void *calloc(size_t k, size_t n) { return count_alloc(), __libc_calloc(k, n); }
EXPORT void *realloc(void *p, size_t n) { return count_alloc(), __libc_realloc(p, n); }
EXPORT void *memalign(size_t a, size_t n) { return count_alloc(), __libc_memalign(a, n); }
EXPORT void *aligned_alloc(size_t a, size_t n) { return count_alloc(), __libc_memalign(a, n); }
EXPORT int posix_memalign(void **p, size_t a, size_t n) {
  count_alloc();
  if (a < sizeof(void *) || (a & (a - 1)) != 0) return EINVAL;
  void *q = __libc_memalign(a, n);
  if (!q) return ENOMEM;
  *p = q;
  return 0;
}
#endif

/* Runs one library call, its allocations tracked; ARMED: counted and maybe
 * failed too. */
#define LIB(expr, armed)                                                       \
  ({                                                                           \
    g_in_lib = 1;                                                              \
    __atomic_store_n(&g_armed, (armed), __ATOMIC_RELAXED);                     \
    mtopt_status_t st_ = (expr);                                               \
    __atomic_store_n(&g_armed, 0, __ATOMIC_RELAXED);                           \
    g_in_lib = 0;                                                              \
    st_;                                                                       \
  })
#define ARMED(expr) LIB(expr, 1)

/* -------------------------------------------------------- the configs -- */

typedef struct {
  const char *name;
  mtopt_optimizer_kind_t kind;
  mtopt_dtype_t pdt, gdt; /* of tensors 1 and 2 (tensor 0 is F32) */
  mtopt_master_t master;
  mtopt_dtype_t state;
  mtopt_rounding_t rounding;
  int stats; /* clipping and a dynamic loss scale */
  int threads;
} life_cfg_t;

static const life_cfg_t kCfgs[] = {
    {"adamw f32, stats", MTOPT_OPTIMIZER_ADAMW, MTOPT_DTYPE_F32, MTOPT_DTYPE_F32,
     MTOPT_MASTER_NONE, MTOPT_DTYPE_F32, MTOPT_ROUNDING_NEAREST, 1, 2},
    {"lamb f32, clipping", MTOPT_OPTIMIZER_LAMB, MTOPT_DTYPE_F32, MTOPT_DTYPE_F32,
     MTOPT_MASTER_NONE, MTOPT_DTYPE_F32, MTOPT_ROUNDING_NEAREST, 1, 1},
    {"sgd momentum f32", MTOPT_OPTIMIZER_SGD, MTOPT_DTYPE_F32, MTOPT_DTYPE_F32,
     MTOPT_MASTER_NONE, MTOPT_DTYPE_F32, MTOPT_ROUNDING_NEAREST, 0, 2},
    {"adamw bf16, f32 masters, stats", MTOPT_OPTIMIZER_ADAMW, MTOPT_DTYPE_BF16,
     MTOPT_DTYPE_BF16, MTOPT_MASTER_F32, MTOPT_DTYPE_F32, MTOPT_ROUNDING_NEAREST, 1, 2},
    {"adam bf16, remainders", MTOPT_OPTIMIZER_ADAM, MTOPT_DTYPE_BF16, MTOPT_DTYPE_F32,
     MTOPT_MASTER_REMAINDER, MTOPT_DTYPE_F32, MTOPT_ROUNDING_NEAREST, 0, 1},
    {"sgd bf16 state, stochastic", MTOPT_OPTIMIZER_SGD, MTOPT_DTYPE_BF16, MTOPT_DTYPE_BF16,
     MTOPT_MASTER_NONE, MTOPT_DTYPE_BF16, MTOPT_ROUNDING_STOCHASTIC, 1, 2},
    {"lamb bf16, f32 masters, bf16 state", MTOPT_OPTIMIZER_LAMB, MTOPT_DTYPE_BF16,
     MTOPT_DTYPE_BF16, MTOPT_MASTER_F32, MTOPT_DTYPE_BF16, MTOPT_ROUNDING_NEAREST, 0, 1},
    {"adamw f16, f32 masters, loss scale", MTOPT_OPTIMIZER_ADAMW, MTOPT_DTYPE_F16,
     MTOPT_DTYPE_F16, MTOPT_MASTER_F32, MTOPT_DTYPE_F32, MTOPT_ROUNDING_NEAREST, 1, 2},
};
enum { NCFG = sizeof kCfgs / sizeof kCfgs[0] };

enum { NT = 3 };
static const int64_t kNumel[NT] = {300, 1000, 37};

static size_t dt_bytes(mtopt_dtype_t d) { return d == MTOPT_DTYPE_F32 ? 4 : 2; }

static mtopt_optimizer_config_t opt_config(const life_cfg_t *lc) {
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  c.kind = lc->kind;
  c.momentum = lc->kind == MTOPT_OPTIMIZER_SGD ? 0.9f : 0.0f;
  c.master_weights = lc->master;
  c.state_dtype = lc->state;
  c.rounding = lc->rounding;
  c.chunk_size = 128;
  if (lc->stats) {
    c.max_grad_norm = 1.0f;
    c.dynamic_loss_scale = 1;
    c.loss_scale = 1024.0f;
  }
  return c;
}

/* ------------------------------------------------------- the life cycle -- */

typedef enum {
  OP_CONTEXT, OP_LIST, OP_ADD0, OP_ADD1, OP_ADD2, OP_GROUP, OP_CREATE, OP_STEP, OP_SET_LR,
  OP_SET_HP, OP_ZERO_GRAD, OP_INFO, OP_READ_STATE, OP_SAVE, OP_LOAD, OP_STEP_AGAIN,
  OP_SAVE_AGAIN, OP_DESTROY_OPT, OP_DESTROY_LIST, OP_DESTROY_CONTEXT, OP_COUNT_
} op_t;

typedef struct {
  const life_cfg_t *lc;
  mtopt_context_t *ctx;
  mtopt_tensor_list_t *list;
  mtopt_optimizer_t *opt;
  void *w[NT], *g[NT]; /* host memory (CPU context); g[1] unused: library-owned */
  float *state;        /* read_state's output */
  char dir[64], path[96];
} life_t;

/* What a failed call must leave as it was. */
typedef struct {
  int have;
  mtopt_step_info_t info;
  double lr;
  unsigned char *w[NT];
} print_t;

static void print_take(const life_t *l, print_t *p) {
  memset(p, 0, sizeof *p);
  if (!l->opt) return;
  p->have = 1;
  p->info = (mtopt_step_info_t)MTOPT_STEP_INFO_INIT;
  TU_OK(mtopt_optimizer_get_step_info(l->opt, &p->info));
  TU_OK(mtopt_optimizer_get_hyperparam(l->opt, MTOPT_HP_LR, &p->lr));
  for (int i = 0; i < NT; i++) {
    const size_t b = (size_t)kNumel[i] * dt_bytes(i ? l->lc->pdt : MTOPT_DTYPE_F32);
    p->w[i] = malloc(b);
    memcpy(p->w[i], l->w[i], b);
  }
}

static void print_check(const life_t *l, const print_t *p, const char *what) {
  if (!p->have) return;
  mtopt_step_info_t info = MTOPT_STEP_INFO_INIT;
  TU_OK(mtopt_optimizer_get_step_info(l->opt, &info));
  double lr;
  TU_OK(mtopt_optimizer_get_hyperparam(l->opt, MTOPT_HP_LR, &lr));
  ck_assert_msg(info.step == p->info.step && info.skipped_steps == p->info.skipped_steps &&
                    info.loss_scale == p->info.loss_scale && lr == p->lr,
                "%s: a failed call changed the step state", what);
  for (int i = 0; i < NT; i++) {
    const size_t b = (size_t)kNumel[i] * dt_bytes(i ? l->lc->pdt : MTOPT_DTYPE_F32);
    ck_assert_msg(memcmp(p->w[i], l->w[i], b) == 0, "%s: a failed call changed tensor %d",
                  what, i);
  }
}

static void print_free(print_t *p) {
  for (int i = 0; i < NT; i++) free(p->w[i]);
}

/* Small gradients in each tensor's dtype (1/64: exact in every format). */
static void fill_grad(void *g, mtopt_dtype_t dt, int64_t n) {
  for (int64_t i = 0; i < n; i++) {
    if (dt == MTOPT_DTYPE_F32)
      ((float *)g)[i] = 0.015625f;
    else
      ((uint16_t *)g)[i] = dt == MTOPT_DTYPE_BF16 ? 0x3c80u : 0x2400u;
  }
}

static void life_setup(life_t *l, const life_cfg_t *lc) {
  memset(l, 0, sizeof *l);
  l->lc = lc;
  strcpy(l->dir, "/tmp/mtopt_alloc_fail_XXXXXX");
  ck_assert(mkdtemp(l->dir) != NULL);
  snprintf(l->path, sizeof l->path, "%s/opt.ckpt", l->dir);
  for (int i = 0; i < NT; i++) {
    const mtopt_dtype_t pd = i ? lc->pdt : MTOPT_DTYPE_F32, gd = i ? lc->gdt : MTOPT_DTYPE_F32;
    l->w[i] = aligned_alloc(256, 256 * (size_t)((kNumel[i] * 4 + 255) / 256));
    l->g[i] = aligned_alloc(256, 256 * (size_t)((kNumel[i] * 4 + 255) / 256));
    fill_grad(l->w[i], pd, kNumel[i]); /* any finite weights */
    fill_grad(l->g[i], gd, kNumel[i]);
  }
  l->state = malloc((size_t)kNumel[1] * sizeof(float));
}

static void life_teardown(life_t *l) {
  for (int i = 0; i < NT; i++) free(l->w[i]), free(l->g[i]);
  free(l->state);
  /* Nothing but the checkpoint: a failed save removes its temporary file. */
  DIR *d = opendir(l->dir);
  ck_assert(d != NULL);
  for (struct dirent *e; (e = readdir(d)) != NULL;) {
    if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
    ck_assert_msg(!strcmp(e->d_name, "opt.ckpt"), "left behind: %s/%s", l->dir, e->d_name);
    char p[sizeof l->dir + 256];
    snprintf(p, sizeof p, "%s/%s", l->dir, e->d_name);
    unlink(p);
  }
  closedir(d);
  rmdir(l->dir);
}

static mtopt_status_t add_tensor(life_t *l, int i) {
  mtopt_tensor_desc_t d = MTOPT_TENSOR_DESC_INIT;
  d.param = l->w[i];
  d.grad = i == 1 ? NULL : l->g[i]; /* tensor 1: the library's gradient buffer */
  d.numel = kNumel[i];
  d.param_dtype = i ? l->lc->pdt : MTOPT_DTYPE_F32;
  d.grad_dtype = i ? l->lc->gdt : MTOPT_DTYPE_F32;
  d.group = i == 1;
  d.name = i == 2 ? NULL : i == 0 ? "embedding" : "block.0.attn.weight";
  return mtopt_tensor_list_add(l->list, &d, NULL);
}

static mtopt_status_t run_op(life_t *l, op_t op) {
  const mtopt_optimizer_config_t c = opt_config(l->lc);
  switch (op) {
  case OP_CONTEXT: {
    mtopt_context_config_t cc = MTOPT_CONTEXT_CONFIG_INIT;
    cc.num_threads = l->lc->threads;
    return mtopt_context_create(&cc, &l->ctx);
  }
  case OP_LIST: return mtopt_tensor_list_create(l->ctx, &l->list);
  case OP_ADD0: return add_tensor(l, 0);
  case OP_ADD1: return add_tensor(l, 1);
  case OP_ADD2: return add_tensor(l, 2);
  case OP_GROUP: return mtopt_tensor_list_set_group(l->list, 1, 0.5f, 0.0f);
  case OP_CREATE: return mtopt_optimizer_create(l->ctx, l->list, &c, &l->opt);
  case OP_STEP:
  case OP_STEP_AGAIN: {
    void *g1;
    mtopt_status_t st = mtopt_optimizer_get_grad(l->opt, 1, &g1);
    if (st == MTOPT_STATUS_SUCCESS) fill_grad(g1, l->lc->gdt, kNumel[1]);
    return st != MTOPT_STATUS_SUCCESS ? st : mtopt_optimizer_step(l->opt);
  }
  case OP_SET_LR: return mtopt_optimizer_set_lr(l->opt, 2e-3f);
  case OP_SET_HP:
    return mtopt_optimizer_set_hyperparam(l->opt, MTOPT_HP_WEIGHT_DECAY, 0.05);
  case OP_ZERO_GRAD: return mtopt_optimizer_zero_grad(l->opt);
  case OP_INFO: {
    mtopt_step_info_t si = MTOPT_STEP_INFO_INIT;
    mtopt_optimizer_info_t oi = MTOPT_OPTIMIZER_INFO_INIT;
    mtopt_status_t st = mtopt_optimizer_get_step_info(l->opt, &si);
    return st != MTOPT_STATUS_SUCCESS ? st : mtopt_optimizer_get_info(l->opt, &oi);
  }
  case OP_READ_STATE:
    return mtopt_optimizer_read_state(
        l->opt, 1,
        l->lc->master != MTOPT_MASTER_NONE ? MTOPT_STATE_MASTER
        : l->lc->kind == MTOPT_OPTIMIZER_SGD ? MTOPT_STATE_MOMENTUM
                                              : MTOPT_STATE_EXP_AVG,
        l->state);
  case OP_SAVE:
  case OP_SAVE_AGAIN: return mtopt_optimizer_save(l->opt, l->path);
  case OP_LOAD: return mtopt_optimizer_load(l->opt, l->path);
  case OP_DESTROY_OPT: {
    mtopt_status_t st = mtopt_optimizer_destroy(l->opt);
    if (st == MTOPT_STATUS_SUCCESS) l->opt = NULL;
    return st;
  }
  case OP_DESTROY_LIST: {
    mtopt_status_t st = mtopt_tensor_list_destroy(l->list);
    if (st == MTOPT_STATUS_SUCCESS) l->list = NULL;
    return st;
  }
  case OP_DESTROY_CONTEXT: {
    mtopt_status_t st = mtopt_context_destroy(l->ctx);
    if (st == MTOPT_STATUS_SUCCESS) l->ctx = NULL;
    return st;
  }
  case OP_COUNT_: break;
  }
  return MTOPT_STATUS_INTERNAL;
}

static const char *op_name(op_t op) {
  static const char *const names[OP_COUNT_] = {
      "context_create", "list_create", "add 0", "add 1", "add 2", "set_group",
      "optimizer_create", "step", "set_lr", "set_hyperparam", "zero_grad", "get_info",
      "read_state", "save", "load", "step again", "save again", "optimizer_destroy",
      "list_destroy", "context_destroy"};
  return names[op];
}

/* Steps, setters, zero_grad and the infos allocate nothing (item 10). */
static int must_not_allocate(op_t op) {
  return op == OP_STEP || op == OP_STEP_AGAIN || op == OP_SET_LR || op == OP_SET_HP ||
         op == OP_ZERO_GRAD || op == OP_INFO;
}

/* One life cycle failing the fail_at-th counted call (-1: none). Returns
 * whether the failure was injected. */
static int life_run(const life_cfg_t *lc, long fail_at, long *calls_out) {
  life_t l;
  life_setup(&l, lc);
  g_calls = 0;
  g_fail_at = fail_at;
  g_fired = 0;
  int fired_at_op = -1;
  for (int op = 0; op < OP_COUNT_; op++) {
    print_t before;
    print_take(&l, &before);
    const int was_fired = g_fired;
    const long calls0 = g_calls;
    const mtopt_status_t st = ARMED(run_op(&l, (op_t)op));
    if (must_not_allocate((op_t)op))
      ck_assert_msg(g_calls == calls0, "[%s] %s allocated %ld times", lc->name,
                    op_name((op_t)op), g_calls - calls0);
    if (st != MTOPT_STATUS_SUCCESS) {
      ck_assert_msg(g_fired && !was_fired, "[%s] N=%ld: %s failed without injection: %s",
                    lc->name, fail_at, op_name((op_t)op), mtopt_last_error());
      const mtopt_status_t want =
          g_fired_file ? MTOPT_STATUS_IO_ERROR : MTOPT_STATUS_OUT_OF_MEMORY;
      ck_assert_msg(st == want, "[%s] N=%ld: %s -> %s (%s), expected %s", lc->name, fail_at,
                    op_name((op_t)op), mtopt_status_name(st), mtopt_last_error(),
                    mtopt_status_name(want));
      ck_assert_msg(mtopt_last_error()[0] != '\0', "[%s] %s left no message", lc->name,
                    op_name((op_t)op));
      print_check(&l, &before, op_name((op_t)op));
      /* Retried without injection: the object is usable. */
      fired_at_op = op;
      TU_OK(LIB(run_op(&l, (op_t)op), 0));
    }
    print_free(&before);
  }
  ck_assert(!l.opt && !l.list && !l.ctx);
  ck_assert(!g_live_overflow);
  ck_assert_msg(g_nlive == 0, "[%s] N=%ld (failed in %s): %d blocks the library allocated "
                "are not freed", lc->name, fail_at,
                fired_at_op >= 0 ? op_name((op_t)fired_at_op) : "no call", g_nlive);
  life_teardown(&l);
  if (calls_out) *calls_out = g_calls;
  return g_fired;
}

/* Fail the N-th call for every N. */
START_TEST(test_life_cycle) {
  const life_cfg_t *lc = &kCfgs[_i];
  long total = 0;
  life_run(lc, -1, &total); /* the count, and libgomp's pool made once */
  ck_assert_msg(total > 10, "[%s] only %ld allocations counted: is --wrap in effect?",
                lc->name, total);
  long n = 0;
  for (; life_run(lc, n, NULL); n++) {
#if HAVE_LSAN
    ck_assert_msg(__lsan_do_recoverable_leak_check() == 0, "[%s] N=%ld: leaks (above)",
                  lc->name, n);
#endif
  }
  ck_assert_msg(n == total, "[%s] %ld injection points, %ld calls in a clean run", lc->name,
                n, total);
}
END_TEST

/* Item 10: after context_create, a step allocates nothing anywhere in the
 * process (libgomp's team is made at create and reused), at 1 and 4 threads. */
START_TEST(test_step_allocates_nothing) {
  const int threads = _i == 0 ? 1 : 4;
  const life_cfg_t lc = {"step", _i == 2 ? MTOPT_OPTIMIZER_LAMB : MTOPT_OPTIMIZER_ADAMW,
                         MTOPT_DTYPE_BF16, MTOPT_DTYPE_BF16, MTOPT_MASTER_F32,
                         MTOPT_DTYPE_F32, MTOPT_ROUNDING_NEAREST, 1, threads};
  life_t l;
  life_setup(&l, &lc);
  for (int op = OP_CONTEXT; op <= OP_CREATE; op++) TU_OK(run_op(&l, (op_t)op));
#if !SANITIZED
  const long before = __atomic_load_n(&g_process_allocs, __ATOMIC_RELAXED);
#endif
  g_calls = 0;
  g_fail_at = -1;
  /* No check assertion inside the window: in fork mode each one sends a
   * message to the parent, which allocates. */
  static const op_t ops[] = {OP_STEP, OP_SET_LR, OP_ZERO_GRAD, OP_INFO};
  mtopt_status_t st[3][4];
  for (int k = 0; k < 3; k++)
    for (int j = 0; j < 4; j++) st[k][j] = ARMED(run_op(&l, ops[j]));
#if !SANITIZED
  const long after = __atomic_load_n(&g_process_allocs, __ATOMIC_RELAXED);
#endif
  for (int k = 0; k < 3; k++)
    for (int j = 0; j < 4; j++)
      ck_assert_msg(st[k][j] == MTOPT_STATUS_SUCCESS, "%s -> %s", op_name(ops[j]),
                    mtopt_status_name(st[k][j]));
  ck_assert_msg(g_calls == 0, "the library allocated %ld times", g_calls);
#if !SANITIZED
  ck_assert_msg(after == before, "%d threads: %ld allocations in the process during steps",
                threads, after - before);
#endif
  for (int op = OP_DESTROY_OPT; op <= OP_DESTROY_CONTEXT; op++) TU_OK(run_op(&l, (op_t)op));
  life_teardown(&l);
}
END_TEST

static Suite *alloc_fail_suite(void) {
  Suite *s = suite_create("alloc_fail");
  TCase *tc = tcase_create("life cycle");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_life_cycle, 0, NCFG);
  tcase_add_loop_test(tc, test_step_allocates_nothing, 0, 3);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(alloc_fail_suite(), 0); }

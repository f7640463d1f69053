/* Loader fuzz target: the bytes after the first are written to a file and
 * loaded into the optimizer the first byte selects. After a refusal the
 * optimizer must be unchanged (its own checkpoint, byte for byte, and its
 * step info); after a success it must step, and is then put back. Built as a
 * libFuzzer binary with clang, and with replay.c as a corpus replayer. */
#include "fuzz_load.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define NT 3
static const int64_t sizes[NT] = {5, 0, 19};

typedef struct {
  mtopt_context_t *ctx;
  mtopt_optimizer_t *opt;
  void *w[NT], *g[NT];
  int bf16;
} fz_model_t;

static fz_model_t models[FUZZ_CONFIGS];
static char dir[64];
static char input_path[128], snap_path[128], pristine_path[FUZZ_CONFIGS][128];

static void die(const char *what) {
  fprintf(stderr, "fuzz_load: %s: %s\n", what, mtopt_last_error());
  abort();
}

#define OK(expr)                                                               \
  do {                                                                         \
    if ((expr) != MTOPT_STATUS_SUCCESS) die(#expr);                            \
  } while (0)

static void remove_dir(void) {
  remove(input_path);
  remove(snap_path);
  for (int k = 0; k < FUZZ_CONFIGS; k++)
    if (pristine_path[k][0]) remove(pristine_path[k]);
  rmdir(dir);
}

static void setup_dir(void) {
  if (dir[0]) return;
  snprintf(dir, sizeof dir, "/tmp/mtopt_fuzz_XXXXXX");
  if (!mkdtemp(dir)) die("mkdtemp");
  snprintf(input_path, sizeof input_path, "%s/input.bin", dir);
  snprintf(snap_path, sizeof snap_path, "%s/snap.bin", dir);
  atexit(remove_dir);
}

static uint16_t bf16_of(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return (uint16_t)(u >> 16);
}

static void fill_grads(fz_model_t *m) {
  for (int i = 0; i < NT; i++)
    for (int64_t j = 0; j < sizes[i]; j++) {
      const float v = 0.01f * (float)((j * 7 + i * 3) % 11) - 0.05f;
      if (m->bf16) ((uint16_t *)m->g[i])[j] = bf16_of(v);
      else ((float *)m->g[i])[j] = v;
    }
}

mtopt_optimizer_t *fuzz_optimizer(int k) {
  fz_model_t *m = &models[k];
  if (m->opt) return m->opt;
  setup_dir();
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  c.chunk_size = 8;
  if (k == 1) c.kind = MTOPT_OPTIMIZER_SGD, c.momentum = 0.9f, c.lr = 0.1f;
  if (k == 2) c.dynamic_loss_scale = 1, c.loss_scale = 256.0f, c.max_grad_norm = 0.5f;
  if (k == 3) c.master_weights = MTOPT_MASTER_F32;
  m->bf16 = k == 3;
  mtopt_context_config_t cc = MTOPT_CONTEXT_CONFIG_INIT;
  cc.num_threads = 1;
  OK(mtopt_context_create(&cc, &m->ctx));
  mtopt_tensor_list_t *list;
  OK(mtopt_tensor_list_create(m->ctx, &list));
  const size_t es = m->bf16 ? 2 : 4;
  for (int i = 0; i < NT; i++) {
    m->w[i] = calloc((size_t)sizes[i] + 1, es);
    m->g[i] = calloc((size_t)sizes[i] + 1, es);
    for (int64_t j = 0; j < sizes[i]; j++) {
      const float v = 0.1f * (float)(j % 5) - 0.2f + 0.01f * (float)i;
      if (m->bf16) ((uint16_t *)m->w[i])[j] = bf16_of(v);
      else ((float *)m->w[i])[j] = v;
    }
    mtopt_tensor_desc_t d = MTOPT_TENSOR_DESC_INIT;
    d.param = m->w[i], d.grad = m->g[i], d.numel = sizes[i];
    d.param_dtype = d.grad_dtype = m->bf16 ? MTOPT_DTYPE_BF16 : MTOPT_DTYPE_F32;
    OK(mtopt_tensor_list_add(list, &d, NULL));
  }
  OK(mtopt_optimizer_create(m->ctx, list, &c, &m->opt));
  OK(fuzz_step(k));
  OK(fuzz_step(k));
  snprintf(pristine_path[k], sizeof pristine_path[k], "%s/pristine%d.bin", dir, k);
  OK(mtopt_optimizer_save(m->opt, pristine_path[k]));
  return m->opt;
}

mtopt_status_t fuzz_step(int k) {
  fill_grads(&models[k]);
  return mtopt_optimizer_step(models[k].opt);
}

static unsigned char *read_file(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) die(path);
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  unsigned char *b = malloc(*n + 1);
  if (!b || fread(b, 1, *n, f) != *n) die("read");
  fclose(f);
  return b;
}

/* What a refused load must leave as it was: the optimizer's own checkpoint
 * (parameters, masters, state, scalars, seed) and its step info. */
typedef struct {
  unsigned char *bytes;
  size_t n;
  mtopt_step_info_t info;
} fz_snap_t;

static void snap(mtopt_optimizer_t *opt, fz_snap_t *s) {
  OK(mtopt_optimizer_save(opt, snap_path));
  s->bytes = read_file(snap_path, &s->n);
  s->info = (mtopt_step_info_t)MTOPT_STEP_INFO_INIT;
  OK(mtopt_optimizer_get_step_info(opt, &s->info));
}

static int same_info(const mtopt_step_info_t *a, const mtopt_step_info_t *b) {
  return a->step == b->step && a->skipped_steps == b->skipped_steps &&
         a->last_skipped == b->last_skipped && a->growth_tracker == b->growth_tracker &&
         memcmp(&a->loss_scale, &b->loss_scale, sizeof a->loss_scale) == 0 &&
         memcmp(&a->last_grad_norm, &b->last_grad_norm, sizeof a->last_grad_norm) == 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const int k = data[0] % FUZZ_CONFIGS;
  mtopt_optimizer_t *opt = fuzz_optimizer(k);
  FILE *f = fopen(input_path, "wb");
  if (!f || fwrite(data + 1, 1, size - 1, f) != size - 1 || fclose(f) != 0) die("write input");
  fz_snap_t before, after;
  snap(opt, &before);
  const mtopt_status_t st = mtopt_optimizer_load(opt, input_path);
  if (getenv("MTOPT_FUZZ_VERBOSE")) /* what each input got, to keep a corpus */
    fprintf(stderr, "config %d: %s %s\n", k, mtopt_status_name(st),
            st ? mtopt_last_error() : "");
  if (st == MTOPT_STATUS_SUCCESS) {
    /* usable: it steps (the loaded scalars are in range), then back */
    OK(fuzz_step(k));
    OK(mtopt_optimizer_load(opt, pristine_path[k]));
  } else {
    if (st != MTOPT_STATUS_IO_ERROR && st != MTOPT_STATUS_INVALID_ARGUMENT &&
        st != MTOPT_STATUS_NOT_SUPPORTED)
      die("unexpected status");
    if (!mtopt_last_error()[0]) die("refusal without a message");
    snap(opt, &after);
    if (after.n != before.n || memcmp(after.bytes, before.bytes, before.n) != 0 ||
        !same_info(&before.info, &after.info))
      die("a refused load changed the optimizer");
    free(after.bytes);
  }
  free(before.bytes);
  return 0;
}

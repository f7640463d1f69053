/* Uses only the installed public header and library: one AdamW step on one
 * tensor, checked against the formula by hand. Exit 0 on success. */
#include <math.h>
#include <stdio.h>

#include <mtopt/mtopt.h>

#define TRY(expr)                                                              \
  do {                                                                         \
    mtopt_status_t st_ = (expr);                                               \
    if (st_ != MTOPT_STATUS_SUCCESS) {                                         \
      fprintf(stderr, "%s: %s (%s)\n", #expr, mtopt_status_name(st_),          \
              mtopt_last_error());                                             \
      return 1;                                                                \
    }                                                                          \
  } while (0)

int main(void) {
  if (mtopt_version() != MTOPT_VERSION_CODE) {
    fprintf(stderr, "header version %d, library %d\n", MTOPT_VERSION_CODE, mtopt_version());
    return 1;
  }
  float w[5] = {0.5f, -0.25f, 1.0f, 2.0f, -3.0f};
  float g[5] = {0.1f, 0.2f, -0.3f, 0.4f, -0.5f};
  mtopt_context_config_t cc = MTOPT_CONTEXT_CONFIG_INIT;
  mtopt_context_t *ctx = NULL;
  TRY(mtopt_context_create(&cc, &ctx));
  mtopt_tensor_list_t *list = NULL;
  TRY(mtopt_tensor_list_create(ctx, &list));
  TRY(mtopt_tensor_list_add_f32(list, w, g, 5, 0, NULL));
  mtopt_optimizer_config_t oc = MTOPT_OPTIMIZER_CONFIG_INIT; /* AdamW, torch defaults */
  oc.weight_decay = 0.0f;
  mtopt_optimizer_t *opt = NULL;
  TRY(mtopt_optimizer_create(ctx, list, &oc, &opt));
  TRY(mtopt_optimizer_step(opt));
  /* First Adam step without decay: w -= lr * sign(g) (up to eps). */
  int bad = 0;
  const float w0[5] = {0.5f, -0.25f, 1.0f, 2.0f, -3.0f};
  for (int i = 0; i < 5; i++) {
    const double want = w0[i] - 1e-3 * (g[i] > 0 ? 1.0 : -1.0);
    if (fabs(w[i] - want) > 1e-6) {
      fprintf(stderr, "w[%d] = %.9g, want %.9g\n", i, w[i], want);
      bad = 1;
    }
  }
  TRY(mtopt_optimizer_destroy(opt));
  TRY(mtopt_tensor_list_destroy(list));
  TRY(mtopt_context_destroy(ctx));
  printf("consumer: mtopt %s %s\n", mtopt_version_string(), bad ? "FAILED" : "ok");
  return bad;
}

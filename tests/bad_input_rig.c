/* The bad-input suite's checks and fixture (bad_input.h). */
#include <stdlib.h>
#include <string.h>

#include "bad_input.h"

mtopt_context_t *ctx;
float *w[NT], *g[NT];

/* Resets the thread's message to a known one (from a call other than the one
 * under test), so that the check below proves the failing call wrote its own. */
const char *reset_error(const char *expr) {
  if (strstr(expr, "mtopt_context_synchronize") == NULL) {
    ck_assert_int_eq(mtopt_context_synchronize(NULL), MTOPT_STATUS_INVALID_ARGUMENT);
    ck_assert(strstr(mtopt_last_error(), "mtopt_context_synchronize") != NULL);
    return "mtopt_context_synchronize";
  }
  ck_assert_int_eq(mtopt_tensor_list_count(NULL, NULL), MTOPT_STATUS_INVALID_ARGUMENT);
  ck_assert(strstr(mtopt_last_error(), "mtopt_tensor_list_count") != NULL);
  return "mtopt_tensor_list_count";
}

void check_fails(mtopt_status_t got, mtopt_status_t want, const char *needle,
                 const mtopt_context_t *ctx, const char *expr, int line, const char *marker) {
  ck_assert_msg(got == want, "line %d: %s -> %s, expected %s (%s)", line, expr,
                mtopt_status_name(got), mtopt_status_name(want), mtopt_last_error());
  const char *msg = mtopt_last_error();
  ck_assert_msg(strstr(msg, marker) == NULL,
                "line %d: %s left no message of its own", line, expr);
  ck_assert_msg(strstr(msg, needle) != NULL, "line %d: %s: message '%s' does not name '%s'",
                line, expr, msg, needle);
  ck_assert_msg(strstr(msg, mtopt_status_name(want)) != NULL,
                "line %d: message '%s' does not carry the status name", line, msg);
  if (ctx)
    ck_assert_msg(strcmp(mtopt_context_last_error(ctx), msg) == 0,
                  "line %d: context message '%s' differs from '%s'", line,
                  mtopt_context_last_error(ctx), msg);
}



void setup(void) {
  ctx = tu_cpu_context();
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 11);
  for (int i = 0; i < NT; i++) {
    w[i] = malloc(NE * sizeof(float));
    g[i] = malloc(NE * sizeof(float));
    tu_fill(&rng, w[i], NE, -1, 1);
    tu_fill(&rng, g[i], NE, -1, 1);
  }
}

void teardown(void) {
  ck_assert_int_eq(mtopt_context_destroy(ctx), MTOPT_STATUS_SUCCESS);
  for (int i = 0; i < NT; i++) {
    free(w[i]);
    free(g[i]);
  }
}

mtopt_tensor_list_t *good_list(void) {
  mtopt_tensor_list_t *l = NULL;
  TU_OK(mtopt_tensor_list_create(ctx, &l));
  for (int i = 0; i < NT; i++) TU_OK(mtopt_tensor_list_add_f32(l, w[i], g[i], NE, 0, NULL));
  return l;
}

int64_t count_of(const mtopt_tensor_list_t *l) {
  int64_t n = -1;
  TU_OK(mtopt_tensor_list_count(l, &n));
  return n;
}


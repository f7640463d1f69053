/* The shared pieces of the bad-input suite (bad_input.c, bad_input_optimizer.c):
 * FAILS, which checks a failing call's status and message, and the fixture
 * (a CPU context and NT tensors of NE random floats). */
#ifndef MTOPT_TEST_BAD_INPUT_H
#define MTOPT_TEST_BAD_INPUT_H

#include "core/core.h"
#include "test_util.h"

const char *reset_error(const char *expr);
void check_fails(mtopt_status_t got, mtopt_status_t want, const char *needle,
                 const mtopt_context_t *ctx, const char *expr, int line, const char *marker);

/* FAILS(status, needle, ctx-or-NULL, call) */
#define FAILS(status, needle, ctx, expr)                                       \
  do {                                                                         \
    const char *marker_ = reset_error(#expr);                                  \
    check_fails((expr), (status), (needle), (ctx), #expr, __LINE__, marker_);  \
  } while (0)
#define BAD MTOPT_STATUS_INVALID_ARGUMENT
#define USAGE MTOPT_STATUS_INVALID_USAGE

enum { NT = 3, NE = 37 };
extern mtopt_context_t *ctx;
extern float *w[NT], *g[NT];

void setup(void);
void teardown(void);
mtopt_tensor_list_t *good_list(void);
int64_t count_of(const mtopt_tensor_list_t *l);

/* bad_input_optimizer.c's tests, into the fixture's test case. */
void bad_input_add_optimizer_tests(TCase *tc);

#endif

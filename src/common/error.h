/* Status reporting, shared by every layer: the CHECK macros that carry a
 * failure up, and mtopt__error, which formats the detail (core/status.c).
 * Host code only. */
#ifndef MTOPT_COMMON_ERROR_H
#define MTOPT_COMMON_ERROR_H

#include <stdarg.h>

#include "mtopt/mtopt.h"

/* Symbols of one library only. */
#define MTOPT__HIDDEN __attribute__((visibility("hidden")))
/* The core's internal interface (core/internal_api.h, backend/cuda/cuda_glue.h):
 * exported from libmtopt for libmtopt_dist, which is built from the same
 * sources and version (the distributed layer checks it at create). Not API:
 * no header of these is installed. */
#define MTOPT__INTERNAL __attribute__((visibility("default")))

#define MTOPT__ERRLEN 1024

/* Carry a failure up. */
#define CHECK(expr)                                                            \
  do {                                                                         \
    mtopt_status_t check_st_ = (expr);                                         \
    if (check_st_ != MTOPT_STATUS_SUCCESS) return check_st_;                   \
  } while (0)
#define CHECK_GOTO(expr, st, label)                                            \
  do {                                                                         \
    (st) = (expr);                                                             \
    if ((st) != MTOPT_STATUS_SUCCESS) goto label;                              \
  } while (0)

/* Formats the detail into ctx (if any) and the calling thread's buffer, and
 * returns status. */
MTOPT__INTERNAL mtopt_status_t mtopt__error(mtopt_context_t *ctx, mtopt_status_t status,
                                            const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif /* MTOPT_COMMON_ERROR_H */

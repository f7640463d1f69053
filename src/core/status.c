/* Status names and messages (generated from MTOPT_STATUS_LIST), the error
 * buffers, and the version query. */
#include <stdio.h>
#include <string.h>

#include "core.h"

const char *mtopt_status_name(mtopt_status_t status) {
  switch (status) {
#define MTOPT_STATUS_NAME_(name, code, text)                                   \
  case MTOPT_STATUS_##name:                                                    \
    return "MTOPT_STATUS_" #name;
    MTOPT_STATUS_LIST(MTOPT_STATUS_NAME_)
#undef MTOPT_STATUS_NAME_
  }
  return "MTOPT_STATUS_UNKNOWN";
}

const char *mtopt_status_string(mtopt_status_t status) {
  switch (status) {
#define MTOPT_STATUS_TEXT_(name, code, text)                                   \
  case MTOPT_STATUS_##name:                                                    \
    return text;
    MTOPT_STATUS_LIST(MTOPT_STATUS_TEXT_)
#undef MTOPT_STATUS_TEXT_
  }
  return "unknown status code";
}

int mtopt_version(void) { return MTOPT_VERSION_CODE; }
const char *mtopt_version_string(void) { return MTOPT_VERSION_STRING; }

static _Thread_local char thread_error[MTOPT__ERRLEN];

const char *mtopt_last_error(void) { return thread_error; }

const char *mtopt_context_last_error(const mtopt_context_t *ctx) {
  return ctx ? ctx->last_error : thread_error;
}

mtopt_status_t mtopt__error(mtopt_context_t *ctx, mtopt_status_t status,
                            const char *fmt, ...) {
  char msg[MTOPT__ERRLEN - 64];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  snprintf(thread_error, sizeof thread_error, "%s: %s", mtopt_status_name(status), msg);
  if (ctx) memcpy(ctx->last_error, thread_error, sizeof thread_error);
  return status;
}

mtopt_status_t mtopt__check_api_version(mtopt_context_t *ctx, const char *fn,
                                        uint32_t api_version) {
  /* The same major version keeps the ABI; a newer minor may have grown the
   * struct, which struct_size covers. */
  if (api_version / 10000 > MTOPT_VERSION_MAJOR)
    return mtopt__error(ctx, MTOPT_STATUS_NOT_SUPPORTED,
                        "%s: the config was made for mtopt %u.%u (api_version %u); this "
                        "library is %s, an older major version",
                        fn, api_version / 10000, api_version / 100 % 100, api_version,
                        MTOPT_VERSION_STRING);
  return MTOPT_STATUS_SUCCESS;
}

/* Contexts: which backend, which device, how many threads. */
#include <stdlib.h>
#include <string.h>

#include "core.h"

/* Config structs grow at the end: a caller built against an older header
 * passes a smaller struct_size, never one below the first release's layout. */
#define CONTEXT_CONFIG_MIN_SIZE (offsetof(mtopt_context_config_t, num_threads) + sizeof(int))

static const mtopt__backend_ops_t *ops_for(mtopt_backend_t backend) {
  switch (backend) {
  case MTOPT_BACKEND_CPU:
    return &mtopt__cpu_ops;
  case MTOPT_BACKEND_CUDA:
    return mtopt__cuda_ops();
  }
  return NULL;
}

int mtopt_backend_available(mtopt_backend_t backend) {
  if (backend == MTOPT_BACKEND_CPU) return 1;
  const mtopt__backend_ops_t *ops = ops_for(backend);
  if (!ops) return 0;
  mtopt_context_t probe;
  memset(&probe, 0, sizeof probe);
  probe.backend = backend;
  probe.ops = ops;
  if (ops->init(&probe) != MTOPT_STATUS_SUCCESS) return 0;
  ops->fini(&probe);
  return 1;
}

mtopt_status_t mtopt_context_create(const mtopt_context_config_t *config,
                                    mtopt_context_t **out) {
  if (!config || !out)
    return mtopt__error(NULL, MTOPT_STATUS_INVALID_ARGUMENT,
                        "mtopt_context_create: %s is NULL", config ? "out" : "config");
  if (config->struct_size < CONTEXT_CONFIG_MIN_SIZE || config->struct_size > 4096)
    return mtopt__error(NULL, MTOPT_STATUS_INVALID_ARGUMENT,
                        "mtopt_context_create: config.struct_size %zu is not a "
                        "known size (initialise with MTOPT_CONTEXT_CONFIG_INIT)",
                        config->struct_size);
  CHECK(mtopt__check_api_version(NULL, "mtopt_context_create", config->api_version));
  if (config->backend != MTOPT_BACKEND_CPU && config->backend != MTOPT_BACKEND_CUDA)
    return mtopt__error(NULL, MTOPT_STATUS_INVALID_ARGUMENT,
                        "mtopt_context_create: unknown backend %d", (int)config->backend);
  if (config->num_threads < 0 || config->num_threads > 4096)
    return mtopt__error(NULL, MTOPT_STATUS_INVALID_ARGUMENT,
                        "mtopt_context_create: num_threads %d out of range [0, 4096]",
                        config->num_threads);
  if (config->backend == MTOPT_BACKEND_CUDA && config->device < 0)
    return mtopt__error(NULL, MTOPT_STATUS_INVALID_ARGUMENT,
                        "mtopt_context_create: CUDA device %d is negative", config->device);
  const mtopt__backend_ops_t *ops = ops_for(config->backend);
  if (!ops)
    return mtopt__error(NULL, MTOPT_STATUS_NOT_SUPPORTED,
                        "mtopt_context_create: this build of mtopt has no CUDA backend "
                        "(configure with -DMTOPT_WITH_CUDA=ON)");
  mtopt_context_t *ctx = calloc(1, sizeof *ctx);
  if (!ctx)
    return mtopt__error(NULL, MTOPT_STATUS_OUT_OF_MEMORY, "mtopt_context_create: calloc failed");
  ctx->backend = config->backend;
  ctx->device = config->device;
  ctx->num_threads = config->num_threads;
  ctx->ops = ops;
  mtopt_status_t st = ops->init(ctx);
  if (st != MTOPT_STATUS_SUCCESS) {
    free(ctx);
    return st;
  }
  *out = ctx;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_context_destroy(mtopt_context_t *ctx) {
  if (!ctx) return MTOPT_STATUS_SUCCESS;
  if (ctx->live_objects > 0)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_USAGE,
                        "mtopt_context_destroy: %lld tensor lists or optimizers made "
                        "from this context are still alive; destroy them first",
                        (long long)ctx->live_objects);
  ctx->ops->fini(ctx);
  free(ctx);
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_context_synchronize(mtopt_context_t *ctx) {
  if (!ctx)
    return mtopt__error(NULL, MTOPT_STATUS_INVALID_ARGUMENT,
                        "mtopt_context_synchronize: ctx is NULL");
  return ctx->ops->synchronize(ctx);
}

mtopt_status_t mtopt_context_get_backend(const mtopt_context_t *ctx, mtopt_backend_t *out) {
  if (!ctx || !out)
    return mtopt__error(NULL, MTOPT_STATUS_INVALID_ARGUMENT,
                        "mtopt_context_get_backend: %s is NULL", ctx ? "out" : "ctx");
  *out = ctx->backend;
  return MTOPT_STATUS_SUCCESS;
}

#ifndef MTOPT_HAVE_CUDA
const mtopt__backend_ops_t *mtopt__cuda_ops(void) { return NULL; }
#endif

/* ---- backend.h: what a backend reads of its context ---- */

void *mtopt__context_backend_state(const mtopt_context_t *ctx) { return ctx->backend_state; }
void mtopt__context_set_backend_state(mtopt_context_t *ctx, void *state) {
  ctx->backend_state = state;
}
int mtopt__context_device(const mtopt_context_t *ctx) { return ctx->device; }
int mtopt__context_num_threads(const mtopt_context_t *ctx) { return ctx->num_threads; }

/* ---- internal_api.h ---- */

mtopt_status_t mtopt__context_alloc(mtopt_context_t *ctx, size_t bytes, void **out) {
  return ctx->ops->alloc(ctx, bytes, out);
}
void mtopt__context_free(mtopt_context_t *ctx, void *ptr) {
  if (ptr) ctx->ops->release(ctx, ptr);
}
mtopt_status_t mtopt__context_zero(mtopt_context_t *ctx, void *dst, size_t bytes) {
  return ctx->ops->zero_ordered(ctx, dst, bytes);
}
mtopt_status_t mtopt__context_widen(mtopt_context_t *ctx, float *dst, const void *src, int dt,
                                    int64_t n, void *const *stream) {
  return ctx->ops->widen(ctx, dst, src, dt, n, stream);
}
void mtopt__context_hold(mtopt_context_t *ctx) { ctx->live_objects++; }
void mtopt__context_unhold(mtopt_context_t *ctx) { ctx->live_objects--; }

/* CUDA green contexts for mtopt__sm_partition_t (sm_partition.h).
 *
 * The driver functions are looked up at run time (mtopt__driver_fn), at the
 * version of the cuda.h we compile against, so the library does not link
 * libcuda and the structures we pass match the functions we get. A stream
 * of a green context is an ordinary stream to the runtime: kernels launched
 * on it run on that context's SMs, read memory of the primary context, and
 * take part in event waits with streams of other contexts of the device. */
#include <stdlib.h>

#include <cuda.h>

#include "../backend/cuda/cuda_glue.h"
#include "sm_partition.h"

#if defined(CUDART_VERSION) && CUDART_VERSION >= 12050 && CUDA_VERSION >= 12050
#define MTOPT__HAVE_GREEN 1
#endif

#ifdef MTOPT__HAVE_GREEN
typedef struct {
  __typeof__(&cuDeviceGet) device_get;
  __typeof__(&cuDeviceGetDevResource) get_resource;
  __typeof__(&cuDevSmResourceSplitByCount) split;
  __typeof__(&cuDevResourceGenerateDesc) make_desc;
  __typeof__(&cuGreenCtxCreate) ctx_create;
  __typeof__(&cuGreenCtxDestroy) ctx_destroy;
  __typeof__(&cuGreenCtxStreamCreate) stream_create;
  __typeof__(&cuStreamDestroy) stream_destroy;
  __typeof__(&cuGetErrorName) error_name;
} driver_t;

struct mtopt__sm_partition {
  driver_t drv;
  CUgreenCtx green[2];
  CUstream stream[2];
  int sms[2];
};

/* 1 if every function is there. */
static int load_driver(driver_t *d) {
  struct {
    const char *name;
    void **fn;
  } const want[] = {
      {"cuDeviceGet", (void **)&d->device_get},
      {"cuDeviceGetDevResource", (void **)&d->get_resource},
      {"cuDevSmResourceSplitByCount", (void **)&d->split},
      {"cuDevResourceGenerateDesc", (void **)&d->make_desc},
      {"cuGreenCtxCreate", (void **)&d->ctx_create},
      {"cuGreenCtxDestroy", (void **)&d->ctx_destroy},
      {"cuGreenCtxStreamCreate", (void **)&d->stream_create},
      {"cuStreamDestroy", (void **)&d->stream_destroy},
      {"cuGetErrorName", (void **)&d->error_name},
  };
  for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
    if (!(*want[i].fn = mtopt__driver_fn(want[i].name))) return 0;
  return 1;
}

void mtopt__sm_partition_destroy(mtopt__sm_partition_t *p) {
  if (!p) return;
  for (int i = 0; i < 2; i++) {
    if (p->stream[i]) p->drv.stream_destroy(p->stream[i]);
    if (p->green[i]) p->drv.ctx_destroy(p->green[i]);
  }
  free(p);
}

mtopt_status_t mtopt__sm_partition_create(mtopt_context_t *ctx, int sms, int required,
                                          mtopt__sm_partition_t **out) {
  static const char fn[] = "mtopt_comm_create: SM partition (comm_sm_count)";
  *out = NULL;
  mtopt__sm_partition_t *p = calloc(1, sizeof *p);
  if (!p) return mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: calloc failed", fn);
  if (!load_driver(&p->drv)) {
    free(p);
    if (!required) return MTOPT_STATUS_SUCCESS;
    return mtopt__error(ctx, MTOPT_STATUS_NOT_SUPPORTED,
                        "%s: the CUDA driver has no green contexts (driver for CUDA 12.5 "
                        "or newer needed); use comm_sm_count = -1",
                        fn);
  }
  const driver_t *d = &p->drv;
  const char *step = "cuDeviceGet";
  CUdevice dev = 0;
  CUdevResource all, group, rest;
  CUdevResourceDesc desc[2];
  unsigned groups = 1;
  CUresult r = d->device_get(&dev, mtopt__context_device(ctx));
  if (r == CUDA_SUCCESS) {
    step = "cuDeviceGetDevResource";
    r = d->get_resource(dev, &all, CU_DEV_RESOURCE_TYPE_SM);
  }
  if (r == CUDA_SUCCESS) {
    const int total = (int)all.sm.smCount;
    if (!required && total < 3 * sms) {
      mtopt__sm_partition_destroy(p);
      return MTOPT_STATUS_SUCCESS;
    }
    /* Rounded up to the device's granularity, a count near the total leaves
     * no SM (or cannot be split at all). */
    int no_room = sms >= total;
    if (!no_room) {
      step = "cuDevSmResourceSplitByCount";
      r = d->split(&group, &groups, &all, &rest, 0, (unsigned)sms);
      no_room = r == CUDA_ERROR_INVALID_VALUE ||
                (r == CUDA_SUCCESS && (groups != 1 || rest.sm.smCount == 0));
    }
    if (no_room) {
      mtopt__sm_partition_destroy(p);
      if (!required) return MTOPT_STATUS_SUCCESS;
      return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                          "%s: comm_sm_count %d leaves no SM for the steps (device %d has %d; "
                          "the split rounds up to its granularity)",
                          fn, sms, mtopt__context_device(ctx), total);
    }
  }
  CUdevResource *parts[2] = {&group, &rest};
  for (int i = 0; i < 2 && r == CUDA_SUCCESS; i++) {
    step = "cuDevResourceGenerateDesc";
    r = d->make_desc(&desc[i], parts[i], 1);
    if (r == CUDA_SUCCESS) {
      step = "cuGreenCtxCreate";
      r = d->ctx_create(&p->green[i], desc[i], dev, CU_GREEN_CTX_DEFAULT_STREAM);
    }
    if (r == CUDA_SUCCESS) {
      step = "cuGreenCtxStreamCreate";
      r = d->stream_create(&p->stream[i], p->green[i], CU_STREAM_NON_BLOCKING, 0);
    }
    p->sms[i] = (int)parts[i]->sm.smCount;
  }
  if (r != CUDA_SUCCESS) {
    const char *name = "?";
    d->error_name(r, &name);
    mtopt__sm_partition_destroy(p);
    if (!required) return MTOPT_STATUS_SUCCESS;
    return mtopt__error(ctx,
                        r == CUDA_ERROR_NOT_SUPPORTED ? MTOPT_STATUS_NOT_SUPPORTED
                                                      : MTOPT_STATUS_CUDA_ERROR,
                        "%s: %s failed: %s (use comm_sm_count = -1 for no partition)", fn,
                        step, name);
  }
  *out = p;
  return MTOPT_STATUS_SUCCESS;
}

cudaStream_t mtopt__sm_partition_stream(const mtopt__sm_partition_t *p, int part) {
  return (cudaStream_t)p->stream[part];
}

int mtopt__sm_partition_sms(const mtopt__sm_partition_t *p, int part) { return p->sms[part]; }

#else /* no green contexts in this toolkit */

struct mtopt__sm_partition {
  int unused;
};

mtopt_status_t mtopt__sm_partition_create(mtopt_context_t *ctx, int sms, int required,
                                          mtopt__sm_partition_t **out) {
  (void)sms;
  *out = NULL;
  if (!required) return MTOPT_STATUS_SUCCESS;
  return mtopt__error(ctx, MTOPT_STATUS_NOT_SUPPORTED,
                      "mtopt_comm_create: comm_sm_count: this build's CUDA toolkit has no "
                      "green contexts (12.5 or newer needed)");
}

void mtopt__sm_partition_destroy(mtopt__sm_partition_t *p) { (void)p; }

cudaStream_t mtopt__sm_partition_stream(const mtopt__sm_partition_t *p, int part) {
  (void)p;
  (void)part;
  return 0;
}

int mtopt__sm_partition_sms(const mtopt__sm_partition_t *p, int part) {
  (void)p;
  (void)part;
  return 0;
}

#endif

/* The CUDA backend suite (cuda_backend.c), test case edges: a tensor past
 * 2^31 elements, pointers that are not device memory, and the small stream and
 * device-result calls. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_rig.h"

/* ------------------------------------------------------ int64 indexing -- */

/* One tensor of 2^31 + 4099 elements (SGD without momentum, with a
 * statistics pass): chunks past element 2^31 must address the right memory.
 * Weights and gradients are memset to constant patterns, so every element must
 * end up with the bits the CPU backend computes for one element. Needs
 * ~17.2 GB of device memory; skipped (with a note) where there is less. */
START_TEST(test_huge_tensor) {
  const int64_t n = (INT64_C(1) << 31) + 4099;
  const size_t bytes = (size_t)n * sizeof(float);
  size_t free_b = 0, total_b = 0;
  TU_CUDA(cudaSetDevice(0));
  TU_CUDA(cudaMemGetInfo(&free_b, &total_b));
  if (free_b < 2 * bytes + (size_t)(2u << 30)) {
    fprintf(stderr, "test_huge_tensor: %zu MB free, needs %zu: not run\n", free_b >> 20,
            (2 * bytes) >> 20);
    return;
  }
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  c.kind = MTOPT_OPTIMIZER_SGD;
  c.lr = 0.5f;
  c.weight_decay = 0.01f;
  c.skip_nonfinite = 1;

  /* The CPU's answer for one element. */
  float wc[8], gc[8];
  memset(wc, 0x3E, sizeof wc);
  memset(gc, 0x3F, sizeof gc);
  mtopt_context_t *cctx = tu_cpu_context();
  mtopt_tensor_list_t *cl = NULL;
  mtopt_optimizer_t *co = NULL;
  TU_OK(mtopt_tensor_list_create(cctx, &cl));
  TU_OK(mtopt_tensor_list_add_f32(cl, wc, gc, 8, 0, NULL));
  TU_OK(mtopt_optimizer_create(cctx, cl, &c, &co));
  TU_OK(mtopt_optimizer_step(co));
  const float expect = wc[0];
  ck_assert(expect != 0.0f && isfinite(expect));
  TU_OK(mtopt_optimizer_destroy(co));
  TU_OK(mtopt_tensor_list_destroy(cl));
  TU_OK(mtopt_context_destroy(cctx));

  mtopt_context_t *ctx = cuda_context();
  float *w = NULL, *g = NULL;
  TU_CUDA(cudaMalloc((void **)&w, bytes));
  TU_CUDA(cudaMalloc((void **)&g, bytes));
  TU_CUDA(cudaMemset(w, 0x3E, bytes));
  TU_CUDA(cudaMemset(g, 0x3F, bytes));
  TU_CUDA(cudaDeviceSynchronize());
  mtopt_tensor_list_t *l = NULL;
  mtopt_optimizer_t *o = NULL;
  TU_OK(mtopt_tensor_list_create(ctx, &l));
  TU_OK(mtopt_tensor_list_add_f32(l, w, g, n, 0, NULL));
  TU_OK(mtopt_optimizer_create(ctx, l, &c, &o));
  mtopt_optimizer_info_t oi = MTOPT_OPTIMIZER_INFO_INIT;
  TU_OK(mtopt_optimizer_get_info(o, &oi));
  ck_assert_int_eq(oi.chunk_size, 65536); /* chunk_size 0: one large tensor */
  ck_assert_int_eq(oi.num_chunks, (n + oi.chunk_size - 1) / oi.chunk_size);
  ck_assert_int_eq(oi.launches_per_step, 2);
  TU_OK(mtopt_optimizer_step(o));
  TU_OK(mtopt_context_synchronize(ctx));
  const int64_t at[] = {0, (INT64_C(1) << 30) - 16, (INT64_C(1) << 31) - 64,
                        (INT64_C(1) << 31) - 16, (INT64_C(1) << 31), n - 4100, n - 64};
  for (size_t k = 0; k < sizeof at / sizeof *at; k++) {
    float win[64];
    tu_poison(win, 64);
    TU_CUDA(cudaMemcpy(win, w + at[k], sizeof win, cudaMemcpyDeviceToHost));
    for (int i = 0; i < 64; i++)
      ck_assert_msg(memcmp(&win[i], &expect, sizeof expect) == 0,
                    "element %lld: %.9g, expected %.9g", (long long)(at[k] + i),
                    (double)win[i], (double)expect);
  }
  /* The statistics pass saw every element once. */
  mtopt_step_info_t info = MTOPT_STEP_INFO_INIT;
  TU_OK(mtopt_optimizer_get_step_info(o, &info));
  float g1;
  memset(&g1, 0x3F, sizeof g1);
  const double want = sqrt((double)n) * g1;
  ck_assert_msg(fabs(info.last_grad_norm - want) <= 1e-4 * want, "norm %.9g, expected %.9g",
                (double)info.last_grad_norm, want);
  ck_assert_int_eq(info.step, 1);
  TU_OK(mtopt_optimizer_destroy(o));
  TU_OK(mtopt_tensor_list_destroy(l));
  TU_OK(mtopt_context_destroy(ctx));
  TU_CUDA(cudaFree(w));
  TU_CUDA(cudaFree(g));
}
END_TEST

/* ------------------------------------------------------------ bad input -- */

static mtopt_status_t try_create(mtopt_context_t *ctx, float *w0, float *g0, float *w1,
                                 float *g1, int64_t n) {
  mtopt_tensor_list_t *l = NULL;
  mtopt_optimizer_t *o = NULL;
  TU_OK(mtopt_tensor_list_create(ctx, &l));
  TU_OK(mtopt_tensor_list_add_f32(l, w0, g0, n, 0, NULL));
  TU_OK(mtopt_tensor_list_add_f32(l, w1, g1, n, 0, NULL));
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  const mtopt_status_t st = mtopt_optimizer_create(ctx, l, &c, &o);
  if (st == MTOPT_STATUS_SUCCESS) {
    TU_OK(mtopt_optimizer_step(o));
    TU_OK(mtopt_context_synchronize(ctx));
    TU_OK(mtopt_optimizer_destroy(o));
  }
  TU_OK(mtopt_tensor_list_destroy(l));
  return st;
}

START_TEST(test_bad_pointers) {
  const int64_t n = 1000;
  mtopt_context_t *ctx = cuda_context();
  float *d = NULL, *host = xmalloc(4 * (size_t)n * sizeof(float)), *pinned = NULL, *managed = NULL;
  TU_CUDA(cudaMalloc((void **)&d, 4 * (size_t)n * sizeof(float)));
  TU_CUDA(cudaMallocHost((void **)&pinned, (size_t)n * sizeof(float)));
  TU_CUDA(cudaMallocManaged((void **)&managed, 2 * (size_t)n * sizeof(float), cudaMemAttachGlobal));
  tu_fill(&(tu_rng_t){tu_seed()}, host, 4 * n, -1.0f, 1.0f);
  TU_CUDA(cudaMemcpy(d, host, 4 * (size_t)n * sizeof(float), cudaMemcpyHostToDevice));
  memcpy(managed, host, 2 * (size_t)n * sizeof(float));

  /* Host parameter. */
  TU_FAILS(try_create(ctx, host, d, d + n, d + 2 * n, n), MTOPT_STATUS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(mtopt_last_error(), "tensor 0") && strstr(mtopt_last_error(), "param"),
                "%s", mtopt_last_error());
  /* Host gradient of tensor 1. */
  TU_FAILS(try_create(ctx, d, d + n, d + 2 * n, host, n), MTOPT_STATUS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(mtopt_last_error(), "tensor 1") && strstr(mtopt_last_error(), "grad"),
                "%s", mtopt_last_error());
  /* Pinned host memory is not device memory either. */
  TU_FAILS(try_create(ctx, d, d + n, pinned, d + 2 * n, n), MTOPT_STATUS_INVALID_ARGUMENT);
  ck_assert_msg(strstr(mtopt_last_error(), "tensor 1"), "%s", mtopt_last_error());
  /* Managed memory is accepted (and stepped). */
  TU_OK(try_create(ctx, d, d + n, managed, managed + n, n));
  /* The context is still usable after the refusals. */
  TU_OK(try_create(ctx, d, d + n, d + 2 * n, d + 3 * n, n));

  TU_OK(mtopt_context_destroy(ctx));
  TU_CUDA(cudaFree(d));
  TU_CUDA(cudaFreeHost(pinned));
  TU_CUDA(cudaFree(managed));
  free(host);
}
END_TEST

/* --------------------------------------------------------- small calls -- */

START_TEST(test_stream_calls) {
  mtopt_context_t *cpu = tu_cpu_context();
  cudaStream_t s = (cudaStream_t)0;
  TU_FAILS(mtopt_cuda_context_set_stream(cpu, s), MTOPT_STATUS_INVALID_ARGUMENT);
  TU_FAILS(mtopt_cuda_context_get_stream(cpu, &s), MTOPT_STATUS_INVALID_ARGUMENT);
  TU_FAILS(mtopt_cuda_context_set_stream(NULL, s), MTOPT_STATUS_INVALID_ARGUMENT);

  mtopt_context_t *ctx = cuda_context();
  cudaStream_t got = (cudaStream_t)1;
  TU_OK(mtopt_cuda_context_get_stream(ctx, &got));
  ck_assert(got == (cudaStream_t)0); /* the legacy default stream */
  TU_FAILS(mtopt_cuda_context_get_stream(ctx, NULL), MTOPT_STATUS_INVALID_ARGUMENT);
  TU_CUDA(cudaStreamCreate(&s));
  TU_OK(mtopt_cuda_context_set_stream(ctx, s));
  TU_OK(mtopt_cuda_context_get_stream(ctx, &got));
  ck_assert(got == s);

  /* launches_per_step and the device results of CPU/CUDA optimizers. */
  float *d = NULL, w[4] = {1, 2, 3, 4}, gh[4] = {1, 1, 1, 1};
  TU_CUDA(cudaMalloc((void **)&d, 8 * sizeof(float)));
  static const struct {
    mtopt_optimizer_kind_t kind;
    float clip;
    int launches;
  } lp[] = {{MTOPT_OPTIMIZER_ADAMW, 0, 1}, {MTOPT_OPTIMIZER_ADAMW, 1, 2},
            {MTOPT_OPTIMIZER_LAMB, 0, 2},  {MTOPT_OPTIMIZER_LAMB, 1, 3}};
  for (size_t k = 0; k < sizeof lp / sizeof *lp; k++) {
    mtopt_tensor_list_t *l = NULL;
    mtopt_optimizer_t *o = NULL;
    TU_OK(mtopt_tensor_list_create(ctx, &l));
    TU_OK(mtopt_tensor_list_add_f32(l, d, d + 4, 4, 0, NULL));
    mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
    c.kind = lp[k].kind;
    c.max_grad_norm = lp[k].clip;
    TU_OK(mtopt_optimizer_create(ctx, l, &c, &o));
    mtopt_optimizer_info_t oi = MTOPT_OPTIMIZER_INFO_INIT;
    TU_OK(mtopt_optimizer_get_info(o, &oi));
    ck_assert_int_eq(oi.launches_per_step, lp[k].launches);
    const float *dn = NULL;
    TU_OK(mtopt_cuda_optimizer_get_device_results(o, &dn, NULL, NULL));
    ck_assert(dn != NULL);
    TU_OK(mtopt_optimizer_destroy(o));
    TU_OK(mtopt_tensor_list_destroy(l));
  }
  {
    mtopt_tensor_list_t *l = NULL;
    mtopt_optimizer_t *o = NULL;
    TU_OK(mtopt_tensor_list_create(cpu, &l));
    TU_OK(mtopt_tensor_list_add_f32(l, w, gh, 4, 0, NULL));
    mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
    TU_OK(mtopt_optimizer_create(cpu, l, &c, &o));
    const float *dn = NULL;
    TU_FAILS(mtopt_cuda_optimizer_get_device_results(o, &dn, NULL, NULL),
             MTOPT_STATUS_INVALID_ARGUMENT);
    TU_FAILS(mtopt_cuda_optimizer_get_device_results(NULL, &dn, NULL, NULL),
             MTOPT_STATUS_INVALID_ARGUMENT);
    TU_OK(mtopt_optimizer_destroy(o));
    TU_OK(mtopt_tensor_list_destroy(l));
  }
  /* A context with a device that does not exist. */
  int count = 0;
  TU_CUDA(cudaGetDeviceCount(&count));
  mtopt_context_config_t cc = MTOPT_CONTEXT_CONFIG_INIT;
  cc.backend = MTOPT_BACKEND_CUDA;
  cc.device = count;
  mtopt_context_t *none = NULL;
  TU_FAILS(mtopt_context_create(&cc, &none), MTOPT_STATUS_CUDA_ERROR);

  TU_OK(mtopt_context_destroy(ctx));
  TU_OK(mtopt_context_destroy(cpu));
  TU_CUDA(cudaStreamDestroy(s));
  TU_CUDA(cudaFree(d));
}
END_TEST

void cuda_backend_add_edge_tests(TCase *tc) {
  tcase_add_test(tc, test_huge_tensor);
  tcase_add_test(tc, test_bad_pointers);
  tcase_add_test(tc, test_stream_calls);
}

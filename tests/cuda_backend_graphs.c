/* The CUDA backend suite (cuda_backend.c), test case graphs: a step captured
 * in a CUDA graph on a user stream and replayed, against plain steps; and two
 * GPU runs of the same inputs, bit for bit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_rig.h"

/* ------------------------------------------------------- graph capture -- */

/* A step captured once on a user stream and replayed N times, with the lr and
 * the gradients changed between replays, equals N plain steps (both on the
 * GPU: bit for bit, norms included). */
static void graph_case(const cfg_t *t, int inf_at) {
  tu_rng_t r;
  tu_rng_init(&r, tu_seed() ^ name_hash(t->name));
  model_t m;
  model_make(&m, &r, t->ntensors, t->chunk, t->max_numel);
  const mtopt_optimizer_config_t c = config_of(t);
  cudaStream_t stream;
  TU_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  side_t plain, graphed;
  side_open(&plain, &m, 1, &c, 0);
  side_open(&graphed, &m, 1, &c, stream);
  cudaStream_t got = 0;
  TU_OK(mtopt_cuda_context_get_stream(graphed.ctx, &got));
  ck_assert(got == stream);

  cudaGraph_t graph;
  cudaGraphExec_t exec;
  tu_capture_step(stream, cudaStreamCaptureModeGlobal, graphed.opt, &graph, &exec);
  mtopt_step_info_t info = MTOPT_STEP_INFO_INIT;
  TU_OK(mtopt_optimizer_get_step_info(graphed.opt, &info));
  ck_assert_int_eq(info.step, 0); /* capturing ran nothing */

  float *grads = xmalloc((size_t)m.packed * sizeof(float));
  const int N = 8;
  for (int s = 0; s < N; s++) {
    tu_fill(&r, grads, m.packed, -t->loss_scale, t->loss_scale);
    if (s == inf_at) grads[tu_int(&r, 0, m.packed - 1)] = INFINITY;
    side_set_grads(&plain, grads);
    side_set_grads(&graphed, grads); /* ordered on the user stream */
    const float lr = t->lr * (float)(1.0 + 0.3 * s);
    TU_OK(mtopt_optimizer_set_lr(plain.opt, lr));
    TU_OK(mtopt_optimizer_set_lr(graphed.opt, lr)); /* between replays */
    TU_OK(mtopt_optimizer_step(plain.opt));
    TU_CUDA(cudaGraphLaunch(exec, stream));
  }
  TU_OK(mtopt_context_synchronize(graphed.ctx));
  const tols_t exact = {-1, -1, -1};
  compare_sides(&graphed, &plain, &c, &exact, N);
  expect_same_info(&graphed, &plain, 1);
  TU_OK(mtopt_optimizer_get_step_info(graphed.opt, &info));
  ck_assert_int_eq(info.step, N - (inf_at >= 0));
  ck_assert_int_eq(info.skipped_steps, inf_at >= 0);
  expect_all_updated(&graphed);

  /* The device-side results, read in stream order without a host sync. */
  const float *d_norm = NULL, *d_scale = NULL;
  const int32_t *d_skipped = NULL;
  TU_OK(mtopt_cuda_optimizer_get_device_results(graphed.opt, &d_norm, &d_skipped, &d_scale));
  float norm = NAN, scale = NAN;
  int32_t skipped = -1;
  TU_CUDA(cudaMemcpyAsync(&norm, d_norm, sizeof norm, cudaMemcpyDeviceToHost, stream));
  TU_CUDA(cudaMemcpyAsync(&scale, d_scale, sizeof scale, cudaMemcpyDeviceToHost, stream));
  TU_CUDA(cudaMemcpyAsync(&skipped, d_skipped, sizeof skipped, cudaMemcpyDeviceToHost, stream));
  TU_CUDA(cudaStreamSynchronize(stream));
  ck_assert(memcmp(&norm, &info.last_grad_norm, sizeof norm) == 0);
  ck_assert(memcmp(&scale, &info.loss_scale, sizeof scale) == 0);
  ck_assert_int_eq(skipped, info.last_skipped);

  free(grads);
  TU_CUDA(cudaGraphExecDestroy(exec));
  TU_CUDA(cudaGraphDestroy(graph));
  side_close(&plain);
  side_close(&graphed); /* before the stream it uses */
  TU_CUDA(cudaStreamDestroy(stream));
  model_free(&m);
}

START_TEST(test_graph_step) {
  const cfg_t t = {"adamw_graph", MTOPT_OPTIMIZER_ADAMW, 1024, 40, 3000, 1e-2f, 0.1f, 0, 0, 0, 0, 1, 0, 0, 1, 0};
  graph_case(&t, -1);
}
END_TEST

START_TEST(test_graph_clip_loss_scale_step) {
  /* growth_interval 2 (config_of): the scale grows during the replays, and an
   * inf at replay 5 backs it off inside the graph. */
  const cfg_t t = {"adamw_graph_clip", MTOPT_OPTIMIZER_ADAMW, 1024, 40, 3000, 1e-2f, 0.1f, 0, 0, 0, 1.0f, 1024.0f, 1, 0, 1, 0};
  graph_case(&t, 5);
}
END_TEST

START_TEST(test_graph_lamb_step) {
  const cfg_t t = {"lamb_graph_clip", MTOPT_OPTIMIZER_LAMB, 2048, 30, 5000, 1e-2f, 0.01f, 0, 0, 0, 1.0f, 256.0f, 1, 0, 1, 0};
  graph_case(&t, 3);
}
END_TEST

/* --------------------------------------------------------- determinism -- */

/* Two GPU runs of the same inputs: identical bits, norms included. */
START_TEST(test_determinism) {
  static const cfg_t cases[] = {
      {"lamb_clip_scale", MTOPT_OPTIMIZER_LAMB, 1024, 40, 5000, 1e-2f, 0.01f, 0, 0, 0, 1.0f, 512.0f, 1, 0, 1, 0},
      {"adamw_clip_64k", MTOPT_OPTIMIZER_ADAMW, 65536, 12, 200000, 1e-3f, 0.01f, 0, 0, 0, 1.0f, 1, 0, 0, 1, 0},
  };
  const cfg_t *t = &cases[_i];
  tu_rng_t r;
  tu_rng_init(&r, tu_seed() ^ 0xD5u);
  model_t m;
  model_make(&m, &r, t->ntensors, t->chunk, t->max_numel);
  const mtopt_optimizer_config_t c = config_of(t);
  side_t a, b;
  side_open(&a, &m, 1, &c, 0);
  side_open(&b, &m, 1, &c, 0);
  float *grads = xmalloc((size_t)m.packed * sizeof(float));
  const tols_t exact = {-1, -1, -1};
  for (int s = 0; s < 4; s++) {
    tu_fill(&r, grads, m.packed, -t->loss_scale, t->loss_scale);
    side_set_grads(&a, grads);
    side_set_grads(&b, grads);
    TU_OK(mtopt_optimizer_step(a.opt));
    TU_OK(mtopt_optimizer_step(b.opt));
    compare_sides(&a, &b, &c, &exact, s);
    expect_same_info(&a, &b, 1);
  }
  mtopt_step_info_t info = MTOPT_STEP_INFO_INIT;
  TU_OK(mtopt_optimizer_get_step_info(a.opt, &info));
  ck_assert(isfinite(info.last_grad_norm) && info.last_grad_norm > 0.0f);
  free(grads);
  side_close(&a);
  side_close(&b);
  model_free(&m);
}
END_TEST

void cuda_backend_add_graph_tests(TCase *tc) {
  tcase_add_test(tc, test_graph_step);
  tcase_add_test(tc, test_graph_clip_loss_scale_step);
  tcase_add_test(tc, test_graph_lamb_step);
  tcase_add_loop_test(tc, test_determinism, 0, 2);
}

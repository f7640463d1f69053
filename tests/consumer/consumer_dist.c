/* Uses only the installed headers and libraries of mtopt::dist (mtopt_dist.pc):
 * MPI on one or more ranks, a communicator over MPI_COMM_WORLD with a CPU
 * context, one distributed AdamW step on one small tensor, checked against
 * the formula by hand. Every rank writes the same gradient, so the averaged
 * gradient is that gradient. Exit 0 on success. */
#include <math.h>
#include <stdio.h>

#include <mpi.h>

#include <mtopt/mtopt_dist.h>

#define N 5

#define TRY(expr)                                                              \
  do {                                                                         \
    mtopt_status_t st_ = (expr);                                               \
    if (st_ != MTOPT_STATUS_SUCCESS) {                                         \
      fprintf(stderr, "%s: %s (%s)\n", #expr, mtopt_status_name(st_),          \
              mtopt_last_error());                                             \
      MPI_Abort(MPI_COMM_WORLD, 1);                                            \
    }                                                                          \
  } while (0)

int main(int argc, char **argv) {
  MPI_Init(&argc, &argv);
  const float w0[N] = {0.5f, -0.25f, 1.0f, 2.0f, -3.0f};
  const float g0[N] = {0.1f, 0.2f, -0.3f, 0.4f, -0.5f};
  float w[N];
  for (int i = 0; i < N; i++) w[i] = w0[i];

  mtopt_context_config_t cc = MTOPT_CONTEXT_CONFIG_INIT; /* CPU */
  mtopt_context_t *ctx = NULL;
  TRY(mtopt_context_create(&cc, &ctx));
  mtopt_comm_t *comm = NULL;
  TRY(mtopt_comm_create_mpi(ctx, MPI_COMM_WORLD, NULL, &comm));
  int rank = -1, world = 0;
  TRY(mtopt_comm_get_rank(comm, &rank));
  TRY(mtopt_comm_get_size(comm, &world));

  mtopt_tensor_list_t *list = NULL;
  TRY(mtopt_tensor_list_create(ctx, &list));
  TRY(mtopt_tensor_list_add_f32(list, w, NULL, N, 0, NULL)); /* library's gradient */
  mtopt_optimizer_config_t oc = MTOPT_OPTIMIZER_CONFIG_INIT; /* AdamW, torch defaults */
  mtopt_dist_optimizer_t *dopt = NULL;
  TRY(mtopt_dist_optimizer_create(comm, list, &oc, &dopt));
  TRY(mtopt_dist_optimizer_zero_grad(dopt));
  float *g = NULL;
  TRY(mtopt_dist_optimizer_get_grad(dopt, 0, (void **)&g));
  for (int i = 0; i < N; i++) g[i] = g0[i];
  TRY(mtopt_dist_step(dopt));
  TRY(mtopt_dist_synchronize(dopt));

  /* First AdamW step: w = w0 (1 - lr wd) - lr g / (|g| + eps), since the
   * bias-corrected moments are g and g^2. */
  int bad = 0;
  for (int i = 0; i < N; i++) {
    const double lr = oc.lr, wd = oc.weight_decay, eps = oc.eps;
    const double want = w0[i] * (1.0 - lr * wd) - lr * g0[i] / (fabs(g0[i]) + eps);
    if (fabs(w[i] - want) > 1e-6) {
      fprintf(stderr, "rank %d: w[%d] = %.9g, want %.9g\n", rank, i, w[i], want);
      bad = 1;
    }
  }
  TRY(mtopt_dist_optimizer_destroy(dopt));
  TRY(mtopt_tensor_list_destroy(list));
  TRY(mtopt_comm_destroy(comm));
  TRY(mtopt_context_destroy(ctx));
  int any_bad = 0;
  MPI_Allreduce(&bad, &any_bad, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0)
    printf("consumer_dist: mtopt %s, %d rank(s): %s\n", mtopt_version_string(), world,
           any_bad ? "FAILED" : "ok");
  MPI_Finalize();
  return any_bad;
}

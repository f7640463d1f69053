/* The communicator (mtopt_dist.h): made from an MPI_Comm or around a
 * caller's NCCL communicator, it picks its transport once, here (MPI for CPU
 * contexts, NCCL for CUDA ones: transport.h), and every distributed optimizer
 * made from it uses that one. */
#include <stdlib.h>
#include <string.h>

#include "dist_internal.h"

#define COMM_CONFIG_MIN_SIZE (offsetof(mtopt_comm_config_t, zero_stage) + sizeof(int))

static mtopt_backend_t context_backend(const mtopt_context_t *ctx) {
  mtopt_backend_t b = MTOPT_BACKEND_CPU;
  (void)mtopt_context_get_backend(ctx, &b);
  return b;
}

static mtopt_status_t check_mpi_ready(mtopt_context_t *ctx, const char *fn) {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  if (!init || fin)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: MPI is %s (the caller initialises and finalises MPI)", fn,
                        fin ? "already finalised" : "not initialised");
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_comm_local_rank(MPI_Comm comm, int *local_rank) {
  static const char fn[] = "mtopt_comm_local_rank";
  if (!local_rank)
    return mtopt__error(NULL, MTOPT_STATUS_INVALID_ARGUMENT, "%s: local_rank is NULL", fn);
  /* The caller's communicator keeps its error handler (fatal by default):
   * refuse what MPI would abort on. */
  if (comm == MPI_COMM_NULL)
    return mtopt__error(NULL, MTOPT_STATUS_INVALID_ARGUMENT, "%s: comm is MPI_COMM_NULL", fn);
  CHECK(check_mpi_ready(NULL, fn));
  MPI_Comm node;
  int rc = MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  if (rc != MPI_SUCCESS) return mtopt__mpi_fail(NULL, rc, fn);
  int r = 0;
  rc = MPI_Comm_rank(node, &r);
  MPI_Comm_free(&node);
  if (rc != MPI_SUCCESS) return mtopt__mpi_fail(NULL, rc, fn);
  *local_rank = r;
  return MTOPT_STATUS_SUCCESS;
}

static mtopt_status_t read_comm_config(mtopt_context_t *ctx, const char *fn,
                                       const mtopt_comm_config_t *in,
                                       mtopt_comm_config_t *out) {
  const mtopt_comm_config_t def = MTOPT_COMM_CONFIG_INIT;
  *out = def;
  if (!in) return MTOPT_STATUS_SUCCESS;
  if (in->struct_size < COMM_CONFIG_MIN_SIZE || in->struct_size > 4096)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: config.struct_size %zu is not a known size (initialise "
                        "with MTOPT_COMM_CONFIG_INIT)",
                        fn, in->struct_size);
  memcpy(out, in, in->struct_size < sizeof *out ? in->struct_size : sizeof *out);
  out->struct_size = sizeof *out;
  if (out->bucket_bytes == 0 || out->first_bucket_bytes == 0)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: bucket_bytes and first_bucket_bytes must be > 0", fn);
  if (out->timeout_ms < 0)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: timeout_ms %d is negative (0 waits forever)", fn, out->timeout_ms);
  if (out->zero_stage != 0 && out->zero_stage != 1)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: zero_stage %d is not 0 or 1", fn, out->zero_stage);
  if (out->comm_sm_count < -1)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: comm_sm_count %d is not -1 (no partition), 0 (automatic) or a "
                        "number of SMs",
                        fn, out->comm_sm_count);
  if (out->reduce_f32 != 0 && out->reduce_f32 != 1)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: reduce_f32 %d is not 0 (16-bit buckets reduced in their dtype) "
                        "or 1 (in fp32)",
                        fn, out->reduce_f32);
  return MTOPT_STATUS_SUCCESS;
}

/* The communicator around a transport made from args (mpi, existing, rank
 * and world as create_mpi / create_nccl have them); frees nothing of the
 * caller's on failure. */
static mtopt_status_t make_comm(const char *fn, const mtopt__transport_ops_t *ops,
                                mtopt__transport_args_t *a, mtopt_comm_t **out) {
  mtopt_comm_t *c = calloc(1, sizeof *c);
  if (!c) return mtopt__error(a->ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: calloc failed", fn);
  const mtopt_status_t st = ops->create(a, &c->tr);
  if (st != MTOPT_STATUS_SUCCESS) {
    free(c);
    return st;
  }
  c->ctx = a->ctx;
  c->cfg = *a->cfg;
  c->mpi = a->mpi;
  c->rank = a->rank;
  c->world = a->world;
  c->ops = ops;
  mtopt__context_hold(a->ctx);
  *out = c;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_comm_create_mpi(mtopt_context_t *ctx, MPI_Comm comm,
                                     const mtopt_comm_config_t *config, mtopt_comm_t **out) {
  static const char fn[] = "mtopt_comm_create_mpi";
  if (!ctx || !out)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                        ctx ? "out" : "ctx");
  mtopt_comm_config_t cfg;
  CHECK(read_comm_config(ctx, fn, config, &cfg));
  CHECK(check_mpi_ready(ctx, fn));
  if (comm == MPI_COMM_NULL)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: comm is MPI_COMM_NULL", fn);
  const mtopt__transport_ops_t *ops = context_backend(ctx) == MTOPT_BACKEND_CPU
                                          ? mtopt__transport_mpi()
                                          : mtopt__transport_nccl();
  if (!ops)
    return mtopt__error(ctx, MTOPT_STATUS_NOT_SUPPORTED,
                        "%s: a CUDA context needs NCCL; this build has none (configure "
                        "with -DMTOPT_WITH_NCCL=ON)",
                        fn);
  mtopt__transport_args_t a = {.ctx = ctx, .cfg = &cfg, .mpi = MPI_COMM_NULL};
  const int rc = MPI_Comm_dup(comm, &a.mpi);
  if (rc == MPI_SUCCESS) {
    /* Errors come back as codes so that they become COMM_ERROR, not an abort. */
    MPI_Comm_set_errhandler(a.mpi, MPI_ERRORS_RETURN);
    MPI_Comm_rank(a.mpi, &a.rank);
    MPI_Comm_size(a.mpi, &a.world);
  }
  const mtopt_status_t st =
      rc == MPI_SUCCESS ? make_comm(fn, ops, &a, out) : mtopt__mpi_fail(ctx, rc, fn);
  if (st != MTOPT_STATUS_SUCCESS && a.mpi != MPI_COMM_NULL) MPI_Comm_free(&a.mpi);
  return st;
}

mtopt_status_t mtopt_comm_create_nccl(mtopt_context_t *ctx, void *nccl_comm,
                                      const mtopt_comm_config_t *config, mtopt_comm_t **out) {
  static const char fn[] = "mtopt_comm_create_nccl";
  if (!ctx || !out || !nccl_comm)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                        !ctx ? "ctx" : !out ? "out" : "nccl_comm");
  mtopt_comm_config_t cfg;
  CHECK(read_comm_config(ctx, fn, config, &cfg));
  const mtopt__transport_ops_t *ops = mtopt__transport_nccl();
  if (!ops)
    return mtopt__error(ctx, MTOPT_STATUS_NOT_SUPPORTED,
                        "%s: this build of mtopt has no NCCL (configure with "
                        "-DMTOPT_WITH_NCCL=ON)",
                        fn);
  if (context_backend(ctx) != MTOPT_BACKEND_CUDA)
    return mtopt__error(ctx, MTOPT_STATUS_NOT_SUPPORTED,
                        "%s: an NCCL communicator needs a CUDA context", fn);
  mtopt__transport_args_t a = {
      .ctx = ctx, .cfg = &cfg, .mpi = MPI_COMM_NULL, .existing = nccl_comm};
  return make_comm(fn, ops, &a, out);
}

mtopt_status_t mtopt_comm_destroy(mtopt_comm_t *comm) {
  if (!comm) return MTOPT_STATUS_SUCCESS;
  if (comm->users > 0)
    return mtopt__error(comm->ctx, MTOPT_STATUS_INVALID_USAGE,
                        "mtopt_comm_destroy: %lld distributed optimizers made from it are "
                        "alive; destroy them first",
                        (long long)comm->users);
  const mtopt_status_t st = comm->ops->destroy(comm->tr);
  int fin = 0;
  MPI_Finalized(&fin);
  if (comm->mpi != MPI_COMM_NULL && !fin) MPI_Comm_free(&comm->mpi);
  mtopt__context_unhold(comm->ctx);
  free(comm);
  return st;
}

mtopt_status_t mtopt_comm_get_rank(const mtopt_comm_t *comm, int *rank) {
  if (!comm || !rank)
    return mtopt__error(NULL, MTOPT_STATUS_INVALID_ARGUMENT, "mtopt_comm_get_rank: %s is NULL",
                        comm ? "rank" : "comm");
  *rank = comm->rank;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_comm_get_size(const mtopt_comm_t *comm, int *size) {
  if (!comm || !size)
    return mtopt__error(NULL, MTOPT_STATUS_INVALID_ARGUMENT, "mtopt_comm_get_size: %s is NULL",
                        comm ? "size" : "comm");
  *size = comm->world;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_comm_get_sm_split(const mtopt_comm_t *comm, int *comm_sms, int *step_sms) {
  if (!comm || !comm_sms || !step_sms)
    return mtopt__error(NULL, MTOPT_STATUS_INVALID_ARGUMENT,
                        "mtopt_comm_get_sm_split: %s is NULL",
                        !comm ? "comm" : !comm_sms ? "comm_sms" : "step_sms");
  comm->ops->sm_split(comm->tr, comm_sms, step_sms);
  return MTOPT_STATUS_SUCCESS;
}

/* The NCCL transport's registration: none in a build without NCCL (as
 * core/context.c does for the CUDA backend). */
#ifndef MTOPT_HAVE_NCCL
const mtopt__transport_ops_t *mtopt__transport_nccl(void) { return NULL; }
#endif

/* The distributed layer: communicators, the bucket plan, the cross-rank plan
 * check and the bucket epilogue (all-reduce or ZeRO-1). MPI collectives serve
 * the CPU backend; on CUDA the collectives go through comm_nccl.c and this
 * file only orders them. The optimizer math stays in the backends: a bucket's
 * step is ops->run_pass over the bucket's contiguous chunk range. */
#include <limits.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm_internal.h"

int64_t mtopt__dist_slice_elems = INT64_C(1) << 20;
int64_t mtopt__dist_min_segment_chunks = 256;

#define COMM_CONFIG_MIN_SIZE (offsetof(mtopt_comm_config_t, zero_stage) + sizeof(int))

struct mtopt_comm {
  mtopt_context_t *ctx;
  mtopt_comm_config_t cfg;
  int rank, world;
  MPI_Comm mpi;       /* our duplicate, or MPI_COMM_NULL for a wrapped NCCL comm */
  mtopt__nccl_t *nccl; /* NULL: MPI collectives (CPU backend) */
  int64_t users;       /* distributed optimizers alive */
};

typedef struct {
  int64_t first_tensor, num_tensors; /* list indices [first, first + num) */
  int64_t offset, numel;             /* range of the gradient buffer */
  int64_t c0, c1;                    /* chunk range of the inner plan */
  int64_t slice;                     /* ZeRO-1: elements per rank */
  int64_t shard_off;                 /* ZeRO-1: this rank's slice in the shard buffer */
  int64_t p0, p1;                    /* ZeRO-1: this rank's pieces (inner tensors) */
  int s0, s1;                        /* its segments */
} bucket_t;

/* One collective and the pass behind it. zero_stage 0: a bucket of at least
 * twice its size (and of 2 * mtopt__dist_min_segment_chunks chunks) is cut
 * at chunk boundaries into segments of about equal size, so that the last
 * collective of a step leaves little step behind it (a 321 MB GPT-2 XL
 * embedding in one all-reduce left 0.8 ms of step after the end of the
 * communication). zero_stage 1: the bucket. */
typedef struct {
  int bucket;
  int64_t offset, numel; /* zero_stage 0: range of the gradient buffer */
  int64_t c0, c1;        /* chunk range of the inner plan */
} segment_t;

typedef struct { /* ZeRO-1: a piece of a list tensor stepped by this rank */
  int64_t tensor, start, len;
} piece_t;

struct mtopt_dist_optimizer {
  mtopt_comm_t *comm;
  mtopt_context_t *ctx;
  mtopt_tensor_list_t *list;       /* the user's; frozen while we live */
  mtopt_tensor_list_t *shard_list; /* ZeRO-1: the pieces */
  mtopt_optimizer_t *opt;          /* the inner optimizer */
  const mtopt__plan_t *plan;       /* the inner optimizer's */
  mtopt_optimizer_config_t config; /* as read at create */
  int zero, world, rank;
  float inv_world;
  int nb, ns;
  bucket_t *b;
  segment_t *seg;
  int64_t nt;
  int64_t *goff;     /* per list tensor: offset of its gradient in gbuf */
  int64_t *numel;    /* per list tensor */
  float **param;     /* per list tensor */
  int *tbucket;      /* per list tensor: its bucket */
  float *gbuf;       /* the gradient buffer (ZeRO-1: ours; else the inner one's) */
  int64_t gbuf_numel;
  float *shard;      /* ZeRO-1: this rank's reduced slices */
  int64_t shard_numel;
  piece_t *pieces;
  int64_t npieces;
  /* one step */
  unsigned char *marked;
  int next_start; /* buckets [0, next_start) issued */
  int next_done;  /* segments [0, next_done) stepped */
  MPI_Request *req;          /* per segment: its reduction (CPU) */
  MPI_Request *ag_req;       /* per bucket: its all-gather (CPU, ZeRO-1) */
  mtopt__nccl_events_t *ev;  /* NCCL, per segment: its collective has landed */
  int broken;
};

/* ------------------------------------------------------------ MPI helpers -- */

static mtopt_status_t mpi_fail(mtopt_context_t *ctx, int rc, const char *what) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "code %d", rc);
  return mtopt__error(ctx, MTOPT_STATUS_COMM_ERROR, "%s: MPI error: %s", what, text);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* Waits for one request, at most timeout_ms (0: forever). A request that times
 * out stays pending: MPI cannot cancel a collective, so the caller marks the
 * optimizer broken and keeps the buffers alive. */
static mtopt_status_t mpi_wait(mtopt_context_t *ctx, MPI_Request *r, int timeout_ms,
                               const char *what) {
  if (*r == MPI_REQUEST_NULL) return MTOPT_STATUS_SUCCESS;
  if (timeout_ms <= 0) {
    const int rc = MPI_Wait(r, MPI_STATUS_IGNORE);
    return rc == MPI_SUCCESS ? MTOPT_STATUS_SUCCESS : mpi_fail(ctx, rc, what);
  }
  const double deadline = now_ms() + timeout_ms;
  for (unsigned spin = 0;; spin++) {
    int done = 0;
    const int rc = MPI_Test(r, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_fail(ctx, rc, what);
    if (done) return MTOPT_STATUS_SUCCESS;
    if ((spin & 63) == 0 && now_ms() > deadline)
      return mtopt__error(ctx, MTOPT_STATUS_COMM_ERROR,
                          "%s: not finished after timeout_ms = %d (a rank did not join "
                          "the collective, or the network stalled)",
                          what, timeout_ms);
    sched_yield();
  }
}

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

/* -------------------------------------------------------------- comm ------ */

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
  if (rc != MPI_SUCCESS) return mpi_fail(NULL, rc, fn);
  int r = 0;
  rc = MPI_Comm_rank(node, &r);
  MPI_Comm_free(&node);
  if (rc != MPI_SUCCESS) return mpi_fail(NULL, rc, fn);
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
#ifndef MTOPT_HAVE_NCCL
  if (context_backend(ctx) != MTOPT_BACKEND_CPU)
    return mtopt__error(ctx, MTOPT_STATUS_NOT_SUPPORTED,
                        "%s: a CUDA context needs NCCL; this build has none (configure "
                        "with -DMTOPT_WITH_NCCL=ON)",
                        fn);
#endif
  mtopt_comm_t *c = calloc(1, sizeof *c);
  if (!c) return mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: calloc failed", fn);
  c->ctx = ctx;
  c->cfg = cfg;
  c->mpi = MPI_COMM_NULL;
  mtopt_status_t st = MTOPT_STATUS_SUCCESS;
  int rc = MPI_Comm_dup(comm, &c->mpi);
  if (rc != MPI_SUCCESS) {
    st = mpi_fail(ctx, rc, fn);
    goto fail;
  }
  /* Errors come back as codes so that they become COMM_ERROR, not an abort. */
  MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN);
  MPI_Comm_rank(c->mpi, &c->rank);
  MPI_Comm_size(c->mpi, &c->world);
#ifdef MTOPT_HAVE_NCCL
  if (context_backend(ctx) == MTOPT_BACKEND_CUDA) {
    unsigned char id[MTOPT__NCCL_ID_BYTES];
    memset(id, 0, sizeof id);
    /* Rank 0's failure must reach the others, or they would wait in the
     * broadcast for an id that never comes: broadcast a flag with it. */
    mtopt_status_t idst = MTOPT_STATUS_SUCCESS;
    if (c->rank == 0) idst = mtopt__nccl_unique_id(ctx, id);
    unsigned char msg[MTOPT__NCCL_ID_BYTES + 1];
    msg[0] = idst == MTOPT_STATUS_SUCCESS;
    memcpy(msg + 1, id, sizeof id);
    rc = MPI_Bcast(msg, (int)sizeof msg, MPI_BYTE, 0, c->mpi);
    if (rc != MPI_SUCCESS) {
      st = mpi_fail(ctx, rc, fn);
      goto fail;
    }
    if (!msg[0]) {
      st = c->rank == 0 ? idst
                        : mtopt__error(ctx, MTOPT_STATUS_COMM_ERROR,
                                       "%s: rank 0 could not make the NCCL unique id", fn);
      goto fail;
    }
    /* The streams and the SM partition first: a rank that cannot make them
     * must not leave the others waiting in the collective initialisation. */
    st = mtopt__nccl_create(ctx, c->world, c->rank, NULL, cfg.timeout_ms, cfg.comm_sm_count,
                            &c->nccl);
    int ok = st == MTOPT_STATUS_SUCCESS, all = 0;
    rc = MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, c->mpi);
    if (rc != MPI_SUCCESS && st == MTOPT_STATUS_SUCCESS) st = mpi_fail(ctx, rc, fn);
    if (st == MTOPT_STATUS_SUCCESS && !all)
      st = mtopt__error(ctx, MTOPT_STATUS_COMM_ERROR,
                        "%s: another rank could not set up its CUDA streams (its own "
                        "error says why)",
                        fn);
    if (st == MTOPT_STATUS_SUCCESS) st = mtopt__nccl_init(c->nccl, msg + 1);
    if (st != MTOPT_STATUS_SUCCESS) goto fail;
  }
#endif
  mtopt__context_hold(ctx);
  *out = c;
  return MTOPT_STATUS_SUCCESS;
fail:
#ifdef MTOPT_HAVE_NCCL
  if (c->nccl) mtopt__nccl_destroy(c->nccl);
#endif
  if (c->mpi != MPI_COMM_NULL) MPI_Comm_free(&c->mpi);
  free(c);
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
#ifndef MTOPT_HAVE_NCCL
  return mtopt__error(ctx, MTOPT_STATUS_NOT_SUPPORTED,
                      "%s: this build of mtopt has no NCCL (configure with "
                      "-DMTOPT_WITH_NCCL=ON)",
                      fn);
#else
  if (context_backend(ctx) != MTOPT_BACKEND_CUDA)
    return mtopt__error(ctx, MTOPT_STATUS_NOT_SUPPORTED,
                        "%s: an NCCL communicator needs a CUDA context", fn);
  mtopt_comm_t *c = calloc(1, sizeof *c);
  if (!c) return mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: calloc failed", fn);
  c->ctx = ctx;
  c->cfg = cfg;
  c->mpi = MPI_COMM_NULL;
  mtopt_status_t st = mtopt__nccl_comm_info(ctx, nccl_comm, &c->rank, &c->world);
  if (st == MTOPT_STATUS_SUCCESS)
    st = mtopt__nccl_create(ctx, c->world, c->rank, nccl_comm, cfg.timeout_ms,
                            cfg.comm_sm_count, &c->nccl);
  if (st != MTOPT_STATUS_SUCCESS) {
    free(c);
    return st;
  }
  mtopt__context_hold(ctx);
  *out = c;
  return MTOPT_STATUS_SUCCESS;
#endif
}

mtopt_status_t mtopt_comm_destroy(mtopt_comm_t *comm) {
  if (!comm) return MTOPT_STATUS_SUCCESS;
  if (comm->users > 0)
    return mtopt__error(comm->ctx, MTOPT_STATUS_INVALID_USAGE,
                        "mtopt_comm_destroy: %lld distributed optimizers made from it are "
                        "alive; destroy them first",
                        (long long)comm->users);
  mtopt_status_t st = MTOPT_STATUS_SUCCESS;
#ifdef MTOPT_HAVE_NCCL
  if (comm->nccl) st = mtopt__nccl_destroy(comm->nccl);
#endif
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
  *comm_sms = *step_sms = 0;
#ifdef MTOPT_HAVE_NCCL
  if (comm->nccl) mtopt__nccl_sm_split(comm->nccl, comm_sms, step_sms);
#endif
  return MTOPT_STATUS_SUCCESS;
}

/* Element-wise max over ranks of int64 values, on whichever transport the
 * communicator has; bounded by the timeout. */
static mtopt_status_t allreduce_max_i64(mtopt_comm_t *c, int64_t *v, int n, const char *what) {
  if (c->mpi != MPI_COMM_NULL) {
    /* A heap copy: a collective that times out is abandoned with its buffer,
     * which is then leaked rather than left to MPI on a dead stack frame. */
    int64_t *buf = malloc((size_t)n * sizeof *buf);
    if (!buf) return mtopt__error(c->ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: malloc failed", what);
    memcpy(buf, v, (size_t)n * sizeof *buf);
    MPI_Request r;
    const int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, n, MPI_INT64_T, MPI_MAX, c->mpi, &r);
    if (rc != MPI_SUCCESS) {
      free(buf);
      return mpi_fail(c->ctx, rc, what);
    }
    CHECK(mpi_wait(c->ctx, &r, c->cfg.timeout_ms, what));
    memcpy(v, buf, (size_t)n * sizeof *buf);
    free(buf);
    return MTOPT_STATUS_SUCCESS;
  }
#ifdef MTOPT_HAVE_NCCL
  return mtopt__nccl_allreduce_max_i64(c->nccl, v, n);
#else
  return mtopt__error(c->ctx, MTOPT_STATUS_INTERNAL, "%s: no transport", what);
#endif
}

/* ------------------------------------------------------- the bucket plan -- */

/* Groups list tensors [0, n) in reverse order into buckets: the first closes
 * at first_bytes, the others at bytes. Writes lo/hi per bucket into b (may be
 * NULL to count). */
static int plan_buckets(const int64_t *numel, int64_t n, size_t first_bytes, size_t bytes,
                        bucket_t *b) {
  int nb = 0;
  int64_t hi = n, acc = 0;
  for (int64_t i = n - 1; i >= 0; i--) {
    acc += numel[i] * (int64_t)sizeof(float);
    const size_t cap = nb == 0 ? first_bytes : bytes;
    if ((size_t)acc >= cap || i == 0) {
      if (b) {
        b[nb].first_tensor = i;
        b[nb].num_tensors = hi - i;
      }
      nb++;
      hi = i;
      acc = 0;
    }
  }
  return nb;
}

static int64_t round_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

/* ---------------------------------------------------- the plan check -- */

static uint64_t mix(uint64_t h, int64_t v) {
  h ^= (uint64_t)v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h *= 0xff51afd7ed558ccdull;
  return h ^ (h >> 33);
}

enum { H_NT, H_ZERO, H_BUCKET, H_FIRST, H_KIND, H_CHUNK, H_STATS, H_NB, H_GBUF, H_HASH, H_N };
static const char *const h_names[H_N] = {
    "tensor count", "zero_stage", "bucket_bytes", "first_bucket_bytes", "optimizer kind",
    "chunk_size", "statistics pass (clipping / loss scaling / skip_nonfinite)",
    "bucket count", "gradient buffer length", "tensor table"};

/* Every rank must have built the same plan, or the collectives would mix
 * unrelated ranges (or hang on different counts). One max-reduction of
 * (x, -x) gives max and min of each fact; where they differ, a second one over
 * the per-tensor records finds the first differing tensor. Both run on every
 * rank, so every rank reports the same mismatch. */
static mtopt_status_t check_plan_across_ranks(mtopt_dist_optimizer_t *d, const char *fn) {
  mtopt_comm_t *c = d->comm;
  const mtopt_optimizer_config_t *oc = &d->config;
  int64_t h[H_N];
  uint64_t hash = 0x12345;
  for (int64_t i = 0; i < d->nt; i++) {
    const mtopt_tensor_desc_t *t = mtopt__tensor_list_desc(d->list, i);
    hash = mix(mix(mix(mix(hash, t->numel), d->goff[i]), t->group), (int64_t)t->flags);
  }
  h[H_NT] = d->nt;
  h[H_ZERO] = d->zero;
  h[H_BUCKET] = (int64_t)c->cfg.bucket_bytes;
  h[H_FIRST] = (int64_t)c->cfg.first_bucket_bytes;
  h[H_KIND] = oc->kind;
  h[H_CHUNK] = oc->chunk_size;
  h[H_STATS] = d->plan->use_stats;
  h[H_NB] = d->nb;
  h[H_GBUF] = d->gbuf_numel;
  h[H_HASH] = (int64_t)(hash >> 2); /* non-negative: -x must not overflow */
  int64_t v[2 * H_N];
  for (int k = 0; k < H_N; k++) {
    v[k] = h[k];
    v[H_N + k] = -h[k];
  }
  CHECK(allreduce_max_i64(c, v, 2 * H_N, "mtopt_dist_optimizer_create (plan check)"));
  int diff = -1;
  for (int k = 0; k < H_N && diff < 0; k++)
    if (v[k] != -v[H_N + k]) diff = k;
  if (diff < 0) return MTOPT_STATUS_SUCCESS;

  /* Name the first differing tensor among those every rank has. */
  const int64_t nmin = -v[H_N + H_NT];
  const int nrec = 4;
  int64_t *r = malloc((size_t)(2 * nrec * (nmin > 0 ? nmin : 1)) * sizeof *r);
  if (!r) return mtopt__error(c->ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: malloc failed", fn);
  int64_t *mine = malloc((size_t)(nrec * (nmin > 0 ? nmin : 1)) * sizeof *mine);
  if (!mine) {
    free(r);
    return mtopt__error(c->ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: malloc failed", fn);
  }
  for (int64_t i = 0; i < nmin; i++) {
    const mtopt_tensor_desc_t *t = mtopt__tensor_list_desc(d->list, i);
    const int64_t rec[4] = {t->numel, d->goff[i], t->group, (int64_t)t->flags};
    for (int k = 0; k < nrec; k++) {
      mine[i * nrec + k] = rec[k];
      r[i * nrec + k] = rec[k];
      r[nmin * nrec + i * nrec + k] = -rec[k];
    }
  }
  mtopt_status_t st = MTOPT_STATUS_SUCCESS;
  if (nmin > 0 && nmin * 2 * nrec <= INT_MAX)
    st = allreduce_max_i64(c, r, (int)(2 * nrec * nmin), "mtopt_dist_optimizer_create (plan check)");
  if (st == MTOPT_STATUS_SUCCESS) {
    static const char *const rec_names[4] = {"numel", "gradient offset", "group", "flags"};
    /* Causes before consequences: a size, group or flags difference is named
     * before any gradient offset, because offsets follow from the sizes (with
     * ZeRO-1 one extra element in tensor 3 can move tensor 0's offset). */
    static const int order[4] = {0, 2, 3, 1};
    int64_t bad = -1;
    int field = 0;
    for (int o = 0; o < nrec && bad < 0 && nmin * 2 * nrec <= INT_MAX; o++)
      for (int64_t i = 0; i < nmin; i++)
        if (r[i * nrec + order[o]] != -r[nmin * nrec + i * nrec + order[o]]) {
          bad = i;
          field = order[o];
          break;
        }
    if (bad >= 0) {
      const char *nm = mtopt__tensor_list_desc(d->list, bad)->name;
      st = mtopt__error(
          c->ctx, MTOPT_STATUS_INVALID_ARGUMENT,
          "%s: the ranks built different plans: tensor %lld '%s' has %s between %lld and "
          "%lld across ranks (this rank, %d: %lld)%s",
          fn, (long long)bad, nm ? nm : "", rec_names[field],
          (long long)-r[nmin * nrec + bad * nrec + field], (long long)r[bad * nrec + field],
          c->rank, (long long)mine[bad * nrec + field],
          field == 1 ? "; gradient offsets follow the parameters' addresses mod 16 bytes, "
                       "so allocate parameters alike on every rank"
                     : "");
    } else {
      st = mtopt__error(c->ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: the ranks built different plans: %s is between %lld and %lld "
                        "across ranks (this rank, %d: %lld)",
                        fn, h_names[diff], (long long)-v[H_N + diff], (long long)v[diff],
                        c->rank, (long long)h[diff]);
    }
  }
  free(r);
  free(mine);
  return st;
}

/* ------------------------------------------------- the dist optimizer -- */

static void dist_free(mtopt_dist_optimizer_t *d) {
  mtopt_context_t *ctx = d->ctx;
  if (d->opt) mtopt_optimizer_destroy(d->opt);
  if (d->shard_list) mtopt_tensor_list_destroy(d->shard_list);
  if (d->zero) mtopt__context_free(ctx, d->gbuf);
  mtopt__context_free(ctx, d->shard);
#ifdef MTOPT_HAVE_NCCL
  if (d->ev) mtopt__nccl_events_destroy(d->ev);
#endif
  free(d->b);
  free(d->seg);
  free(d->goff);
  free(d->numel);
  free(d->param);
  free(d->tbucket);
  free(d->pieces);
  free(d->marked);
  free(d->req);
  free(d->ag_req);
  free(d);
}

/* ZeRO-1 layout: buckets one after another in bucket order, each padded to a
 * multiple of 4 * world elements so that every rank's slice is the same size
 * and 16-byte aligned; tensors inside at offsets with their weights' residue
 * mod 16 bytes (as the core's buffer), so w, g and state share one vector
 * path. Then this rank's pieces become the inner optimizer's tensors. */
static mtopt_status_t build_zero1(mtopt_dist_optimizer_t *d, const char *fn) {
  mtopt_context_t *ctx = d->ctx;
  const int W = d->world, R = d->rank;
  int64_t off = 0, soff = 0;
  for (int k = 0; k < d->nb; k++) {
    bucket_t *b = &d->b[k];
    b->offset = off;
    int64_t end = off;
    for (int64_t i = b->first_tensor; i < b->first_tensor + b->num_tensors; i++) {
      if (d->numel[i] == 0) {
        d->goff[i] = end;
        continue;
      }
      d->goff[i] = mtopt__aligned_offset(end, d->param[i]);
      end = d->goff[i] + d->numel[i];
    }
    b->slice = round_up((end - off + W - 1) / W, 4);
    b->numel = b->slice * W;
    b->shard_off = soff;
    off += b->numel;
    soff += b->slice;
  }
  d->gbuf_numel = off;
  d->shard_numel = soff;
  if (off > 0) CHECK(mtopt__context_alloc(ctx, (size_t)off * sizeof(float), (void **)&d->gbuf));
  if (soff > 0) CHECK(mtopt__context_alloc(ctx, (size_t)soff * sizeof(float), (void **)&d->shard));

  /* This rank's pieces, bucket by bucket, so that each bucket's pieces (and
   * chunks) are contiguous in the inner optimizer. */
  d->pieces = malloc((size_t)(d->nt + d->nb + 1) * sizeof *d->pieces);
  if (!d->pieces) return mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: malloc failed", fn);
  CHECK(mtopt_tensor_list_create(ctx, &d->shard_list));
  mtopt__tensor_list_copy_groups(d->shard_list, d->list);
  int64_t np = 0;
  for (int k = 0; k < d->nb; k++) {
    bucket_t *b = &d->b[k];
    const int64_t s0 = b->offset + (int64_t)R * b->slice, s1 = s0 + b->slice;
    b->p0 = np;
    for (int64_t i = b->first_tensor; i < b->first_tensor + b->num_tensors; i++) {
      const int64_t lo = d->goff[i] > s0 ? d->goff[i] : s0;
      const int64_t hi = d->goff[i] + d->numel[i] < s1 ? d->goff[i] + d->numel[i] : s1;
      if (hi <= lo) continue;
      const mtopt_tensor_desc_t *src = mtopt__tensor_list_desc(d->list, i);
      mtopt_tensor_desc_t desc = *src;
      desc.struct_size = sizeof desc;
      desc.param = d->param[i] + (lo - d->goff[i]);
      desc.grad = d->shard + b->shard_off + (lo - s0);
      desc.numel = hi - lo;
      CHECK(mtopt_tensor_list_add(d->shard_list, &desc, NULL));
      d->pieces[np++] = (piece_t){i, lo - d->goff[i], hi - lo};
    }
    b->p1 = np;
  }
  d->npieces = np;
  /* Each rank holds a shard: the global norm needs every rank's sums. */
  const mtopt__optimizer_options_t shard = {.defer_stats = 1};
  CHECK(mtopt__optimizer_create(ctx, d->shard_list, &d->config, &shard, &d->opt));
  d->plan = mtopt__optimizer_plan(d->opt);
  const int64_t nc = mtopt__optimizer_plan(d->opt)->num_chunks;
  for (int k = 0; k < d->nb; k++) {
    bucket_t *b = &d->b[k];
    b->c0 = b->p0 < np ? mtopt__optimizer_tensor(d->opt, b->p0)->first_chunk : nc;
    b->c1 = b->p1 < np ? mtopt__optimizer_tensor(d->opt, b->p1)->first_chunk : nc;
  }
  return MTOPT_STATUS_SUCCESS;
}

static const mtopt__tensor_rec_t *rec(const mtopt_dist_optimizer_t *d, int64_t i) {
  return mtopt__optimizer_tensor(d->opt, i);
}

/* zero_stage 0: the inner optimizer owns the buffer (registration order, with
 * alignment padding); a bucket is the range from its first tensor's gradient
 * to its last one's end. */
static void build_zero0(mtopt_dist_optimizer_t *d) {
  void *gbuf = NULL;
  (void)mtopt_optimizer_get_grad_buffer(d->opt, &gbuf, &d->gbuf_numel);
  d->gbuf = gbuf;
  int64_t next = 0; /* offset of the next non-empty tensor, for empty ones */
  for (int64_t i = 0; i < d->nt; i++) {
    if (d->numel[i] > 0) {
      d->goff[i] = rec(d, i)->g - d->gbuf;
      next = d->goff[i] + d->numel[i];
    } else {
      d->goff[i] = next;
    }
  }
  const int64_t nc = d->plan->num_chunks;
  for (int k = 0; k < d->nb; k++) {
    bucket_t *b = &d->b[k];
    const int64_t lo = b->first_tensor, hi = lo + b->num_tensors;
    b->c0 = rec(d, lo)->first_chunk;
    b->c1 = hi < d->nt ? rec(d, hi)->first_chunk : nc;
    int64_t s = -1, e = -1;
    for (int64_t i = lo; i < hi; i++) {
      if (d->numel[i] == 0) continue;
      if (s < 0) s = d->goff[i];
      e = d->goff[i] + d->numel[i];
    }
    b->offset = s < 0 ? d->goff[lo] : s;
    b->numel = s < 0 ? 0 : e - s;
  }
}

static int push_segment(mtopt_dist_optimizer_t *d, int *cap, segment_t s) {
  if (d->ns == *cap) {
    const int grown = *cap * 2;
    segment_t *p = grown > *cap ? realloc(d->seg, (size_t)grown * sizeof *p) : NULL;
    if (!p) return 0;
    d->seg = p;
    *cap = grown;
  }
  d->seg[d->ns++] = s;
  return 1;
}

/* The segments (segment_t) of every bucket, in bucket order. */
static mtopt_status_t build_segments(mtopt_dist_optimizer_t *d, const char *fn) {
  int cap = d->nb > 0 ? d->nb : 1;
  d->seg = malloc((size_t)cap * sizeof *d->seg);
  if (!d->seg) return mtopt__error(d->ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: malloc failed", fn);
  const int64_t cs = d->plan->chunk_size;
  for (int k = 0; k < d->nb; k++) {
    bucket_t *b = &d->b[k];
    b->s0 = d->ns;
    int64_t off = b->offset, c = b->c0;
    /* floor(numel / size) pieces of about equal size: a bucket just over its
     * size (they all close past it) stays whole; one at k times its size is
     * cut in k. The size is at least mtopt__dist_min_segment_chunks chunks:
     * a 4 MB piece is 16 blocks of a block-per-chunk pass, too few to fill a
     * GPU, so its step would fall behind the collectives. Each cut is the
     * first chunk start at or past its target. */
    const size_t bytes = k == 0 ? d->comm->cfg.first_bucket_bytes : d->comm->cfg.bucket_bytes;
    int64_t size = bytes / sizeof(float) > 0 ? (int64_t)(bytes / sizeof(float)) : 1;
    if (size < mtopt__dist_min_segment_chunks * cs) size = mtopt__dist_min_segment_chunks * cs;
    const int64_t pieces = d->zero ? 1 : b->numel / size;
    for (int64_t i = b->first_tensor, cut = 1; pieces > 1 && i < b->first_tensor + b->num_tensors;
         i++) {
      for (int64_t j = 0; j < rec(d, i)->num_chunks && cut < pieces; j++) {
        const int64_t at = d->goff[i] + j * cs; /* chunk j's start in the buffer */
        const int64_t target =
            b->offset + b->numel / pieces * cut + b->numel % pieces * cut / pieces;
        if (at < target || at <= off) continue;
        if (!push_segment(d, &cap, (segment_t){k, off, at - off, c, rec(d, i)->first_chunk + j}))
          return mtopt__error(d->ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: realloc failed", fn);
        off = at;
        c = rec(d, i)->first_chunk + j;
        cut++;
      }
    }
    if (!push_segment(d, &cap, (segment_t){k, off, b->offset + b->numel - off, c, b->c1}))
      return mtopt__error(d->ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: realloc failed", fn);
    b->s1 = d->ns;
  }
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_dist_optimizer_create(mtopt_comm_t *comm, mtopt_tensor_list_t *list,
                                           const mtopt_optimizer_config_t *config,
                                           mtopt_dist_optimizer_t **out) {
  static const char fn[] = "mtopt_dist_optimizer_create";
  if (!comm || !list || !config || !out)
    return mtopt__error(comm ? comm->ctx : NULL, MTOPT_STATUS_INVALID_ARGUMENT, "%s: %s is NULL",
                        fn, !comm ? "comm" : !list ? "list" : !config ? "config" : "out");
  mtopt_context_t *ctx = comm->ctx;
  if (mtopt__tensor_list_context(list) != ctx)
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: the tensor list belongs to another context than the "
                        "communicator",
                        fn);
  mtopt_optimizer_config_t cfg;
  CHECK(mtopt__optimizer_config_read(ctx, fn, config, &cfg));
  for (int64_t i = 0; i < mtopt__tensor_list_size(list); i++) {
    const mtopt_tensor_desc_t *t = mtopt__tensor_list_desc(list, i);
    if (t->grad)
      return mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                          "%s: tensor %lld '%s' was added with its own gradient; the "
                          "distributed optimizer needs grad == NULL (its buckets are "
                          "ranges of the library's contiguous gradient buffer)",
                          fn, (long long)i, t->name ? t->name : "");
  }
  if (mtopt__tensor_list_in_use(list))
    return mtopt__error(ctx, MTOPT_STATUS_INVALID_USAGE,
                        "%s: the tensor list is already used by an optimizer", fn);
  if (comm->cfg.zero_stage == 1 && cfg.kind == MTOPT_OPTIMIZER_LAMB)
    return mtopt__error(ctx, MTOPT_STATUS_NOT_SUPPORTED,
                        "%s: LAMB with zero_stage 1 is not supported: its trust ratio needs "
                        "each tensor's norms, and with ZeRO-1 a tensor's elements are "
                        "spread over ranks (use zero_stage 0)",
                        fn);

  mtopt_status_t st = MTOPT_STATUS_SUCCESS;
  mtopt_dist_optimizer_t *d = calloc(1, sizeof *d);
  if (!d) return mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: calloc failed", fn);
  d->comm = comm;
  d->ctx = ctx;
  d->list = list;
  d->zero = comm->cfg.zero_stage;
  d->world = comm->world;
  d->rank = comm->rank;
  d->inv_world = (float)(1.0 / (double)comm->world);
  d->config = cfg;
  d->nt = mtopt__tensor_list_size(list);
  const size_t nt1 = (size_t)(d->nt > 0 ? d->nt : 1);
  d->goff = calloc(nt1, sizeof *d->goff);
  d->numel = calloc(nt1, sizeof *d->numel);
  d->param = calloc(nt1, sizeof *d->param);
  d->tbucket = calloc(nt1, sizeof *d->tbucket);
  if (!d->goff || !d->numel || !d->param || !d->tbucket) {
    st = mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: calloc failed", fn);
    goto fail;
  }
  for (int64_t i = 0; i < d->nt; i++) {
    d->numel[i] = mtopt__tensor_list_desc(list, i)->numel;
    d->param[i] = mtopt__tensor_list_desc(list, i)->param;
  }
  d->nb = plan_buckets(d->numel, d->nt, comm->cfg.first_bucket_bytes, comm->cfg.bucket_bytes,
                       NULL);
  d->b = calloc((size_t)(d->nb > 0 ? d->nb : 1), sizeof *d->b);
  d->marked = calloc((size_t)(d->nb > 0 ? d->nb : 1), 1);
  d->ag_req = malloc((size_t)(d->nb > 0 ? d->nb : 1) * sizeof *d->ag_req);
  if (!d->b || !d->marked || !d->ag_req) {
    st = mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: calloc failed", fn);
    goto fail;
  }
  plan_buckets(d->numel, d->nt, comm->cfg.first_bucket_bytes, comm->cfg.bucket_bytes, d->b);
  for (int k = 0; k < d->nb; k++) {
    d->ag_req[k] = MPI_REQUEST_NULL;
    for (int64_t i = d->b[k].first_tensor; i < d->b[k].first_tensor + d->b[k].num_tensors; i++)
      d->tbucket[i] = k;
  }

  if (d->zero) {
    CHECK_GOTO(build_zero1(d, fn), st, fail);
  } else {
    const mtopt__optimizer_options_t local = {0};
    CHECK_GOTO(mtopt__optimizer_create(ctx, list, &cfg, &local, &d->opt), st, fail);
    d->plan = mtopt__optimizer_plan(d->opt);
    build_zero0(d);
  }
  CHECK_GOTO(build_segments(d, fn), st, fail);
  d->req = malloc((size_t)(d->ns > 0 ? d->ns : 1) * sizeof *d->req);
  if (!d->req) {
    st = mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: malloc failed", fn);
    goto fail;
  }
  for (int s = 0; s < d->ns; s++) d->req[s] = MPI_REQUEST_NULL;
  for (int s = 0; s < d->ns; s++) {
    const int k = d->seg[s].bucket;
    const int64_t cnt = d->zero ? d->b[k].slice : d->seg[s].numel;
    if (cnt > INT_MAX) {
      st = mtopt__error(ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: bucket %d needs a collective of %lld elements, over the "
                        "2^31 - 1 that MPI counts hold (use a smaller bucket_bytes%s)",
                        fn, k, (long long)cnt, d->zero ? ", or zero_stage 0" : "");
      goto fail;
    }
  }
#ifdef MTOPT_HAVE_NCCL
  if (comm->nccl) CHECK_GOTO(mtopt__nccl_events_create(comm->nccl, d->ns, &d->ev), st, fail);
#endif
  /* Every rank reaches this point with the same arguments (or fails above on
   * every rank alike), so the check's collectives always match. */
  CHECK_GOTO(check_plan_across_ranks(d, fn), st, fail);
  if (d->zero) mtopt__tensor_list_freeze(list); /* zero_stage 0: the inner optimizer did */
  comm->users++;
  *out = d;
  return MTOPT_STATUS_SUCCESS;
fail:
  dist_free(d);
  return st;
}

/* Outstanding MPI requests point into our buffers: wait for them (bounded)
 * before freeing. Ones that never finish leave the memory leaked, not freed
 * under MPI's feet. */
mtopt_status_t mtopt_dist_optimizer_destroy(mtopt_dist_optimizer_t *d) {
  if (!d) return MTOPT_STATUS_SUCCESS;
  mtopt_status_t st = MTOPT_STATUS_SUCCESS;
  int pending = 0;
  if (!d->comm->nccl) {
    for (int k = 0; k < d->ns + d->nb; k++) {
      MPI_Request *r = k < d->ns ? &d->req[k] : &d->ag_req[k - d->ns];
      if (*r == MPI_REQUEST_NULL) continue;
      if (mpi_wait(d->ctx, r, d->comm->cfg.timeout_ms, "mtopt_dist_optimizer_destroy") !=
          MTOPT_STATUS_SUCCESS)
        pending++;
    }
  }
#ifdef MTOPT_HAVE_NCCL
  if (d->comm->nccl) {
    const mtopt_status_t sst = mtopt__nccl_synchronize(d->comm->nccl);
    /* An owned communicator that failed was aborted, so its kernels stopped
     * and the buffers can go. A caller's is never aborted here: its kernels
     * may still write our buffers (and cudaFree would wait for them forever).
     * A failure that an earlier call already reported is not reported again. */
    if (sst != MTOPT_STATUS_SUCCESS) {
      if (mtopt__nccl_is_wrapped(d->comm->nccl)) pending++;
      if (!d->broken) st = sst;
    }
  }
#endif
  d->comm->users--;
  if (d->zero) mtopt__tensor_list_unfreeze(d->list);
  if (pending) {
    /* The objects go; the buffers MPI may still write stay allocated. */
    mtopt_context_t *ctx = d->ctx;
    if (d->zero)
      d->gbuf = NULL;
    else
      mtopt__optimizer_detach_grads(d->opt);
    d->shard = NULL;
    dist_free(d);
    return mtopt__error(ctx, MTOPT_STATUS_COMM_ERROR,
                        "mtopt_dist_optimizer_destroy: %d collective%s never finished; their "
                        "buffers are leaked rather than freed",
                        pending, pending == 1 ? "" : "s");
  }
  dist_free(d);
  return st;
}

static mtopt_status_t check_d(const mtopt_dist_optimizer_t *d, const char *fn) {
  if (!d) return mtopt__error(NULL, MTOPT_STATUS_INVALID_ARGUMENT, "%s: dopt is NULL", fn);
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_dist_optimizer_get_optimizer(mtopt_dist_optimizer_t *d,
                                                  mtopt_optimizer_t **opt) {
  static const char fn[] = "mtopt_dist_optimizer_get_optimizer";
  CHECK(check_d(d, fn));
  if (!opt) return mtopt__error(d->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: opt is NULL", fn);
  *opt = d->opt;
  return MTOPT_STATUS_SUCCESS;
}

static mtopt_status_t check_tensor(const mtopt_dist_optimizer_t *d, const char *fn, int64_t t) {
  if (t < 0 || t >= d->nt)
    return mtopt__error(d->ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: tensor %lld out of range [0, %lld)", fn, (long long)t,
                        (long long)d->nt);
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_dist_optimizer_get_grad(mtopt_dist_optimizer_t *d, int64_t tensor,
                                             void **ptr) {
  static const char fn[] = "mtopt_dist_optimizer_get_grad";
  CHECK(check_d(d, fn));
  if (!ptr) return mtopt__error(d->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: ptr is NULL", fn);
  CHECK(check_tensor(d, fn, tensor));
  *ptr = d->numel[tensor] ? d->gbuf + d->goff[tensor] : NULL;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_dist_optimizer_get_grad_buffer(mtopt_dist_optimizer_t *d, void **ptr,
                                                    int64_t *numel) {
  static const char fn[] = "mtopt_dist_optimizer_get_grad_buffer";
  CHECK(check_d(d, fn));
  if (!ptr || !numel)
    return mtopt__error(d->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: %s is NULL", fn,
                        ptr ? "numel" : "ptr");
  *ptr = d->gbuf;
  *numel = d->gbuf_numel;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_dist_optimizer_zero_grad(mtopt_dist_optimizer_t *d) {
  CHECK(check_d(d, "mtopt_dist_optimizer_zero_grad"));
  if (!d->gbuf) return MTOPT_STATUS_SUCCESS;
  return mtopt__context_zero(d->ctx, d->gbuf, (size_t)d->gbuf_numel * sizeof(float));
}

mtopt_status_t mtopt_dist_get_bucket_count(const mtopt_dist_optimizer_t *d, int *count) {
  CHECK(check_d(d, "mtopt_dist_get_bucket_count"));
  if (!count)
    return mtopt__error(d->ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "mtopt_dist_get_bucket_count: count is NULL");
  *count = d->nb;
  return MTOPT_STATUS_SUCCESS;
}

static mtopt_status_t check_bucket(const mtopt_dist_optimizer_t *d, const char *fn, int b) {
  if (b < 0 || b >= d->nb)
    return mtopt__error(d->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: bucket %d out of range [0, %d)",
                        fn, b, d->nb);
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_dist_get_bucket(const mtopt_dist_optimizer_t *d, int bucket,
                                     int64_t *first_tensor, int64_t *num_tensors,
                                     int64_t *offset, int64_t *numel) {
  static const char fn[] = "mtopt_dist_get_bucket";
  CHECK(check_d(d, fn));
  CHECK(check_bucket(d, fn, bucket));
  const bucket_t *b = &d->b[bucket];
  if (first_tensor) *first_tensor = b->first_tensor;
  if (num_tensors) *num_tensors = b->num_tensors;
  if (offset) *offset = b->offset;
  if (numel) *numel = b->numel;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_dist_get_tensor_bucket(const mtopt_dist_optimizer_t *d, int64_t tensor,
                                            int *bucket) {
  static const char fn[] = "mtopt_dist_get_tensor_bucket";
  CHECK(check_d(d, fn));
  if (!bucket) return mtopt__error(d->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: bucket is NULL", fn);
  CHECK(check_tensor(d, fn, tensor));
  *bucket = d->tbucket[tensor];
  return MTOPT_STATUS_SUCCESS;
}

/* --------------------------------------------------------- the epilogue -- */

static mtopt_status_t broken_error(mtopt_dist_optimizer_t *d, const char *fn) {
  return mtopt__error(d->ctx, MTOPT_STATUS_COMM_ERROR,
                      "%s: an earlier collective failed or timed out; this distributed "
                      "optimizer is unusable (destroy it)",
                      fn);
}

/* A failure mid-step: the optimizer is unusable from now on, and the pass
 * counter that elects the finaliser is reset, so that the inner optimizer
 * alone still steps correctly (e.g. to save a checkpoint). */
static mtopt_status_t fail_step(mtopt_dist_optimizer_t *d, mtopt_status_t st) {
  d->broken = 1;
  (void)mtopt__optimizer_reset_pass(d->opt);
  return st;
}

/* Bucket passes: on the communicator's steps' stream (NCCL; the CPU
 * ignores the stream). */
static mtopt_status_t run_range(mtopt_dist_optimizer_t *d, mtopt__pass_t pass, int64_t c0,
                                int64_t c1) {
  if (c0 >= c1) return MTOPT_STATUS_SUCCESS;
  void *const *stream = NULL;
#ifdef MTOPT_HAVE_NCCL
  if (d->comm->nccl) stream = mtopt__nccl_steps_stream(d->comm->nccl);
#endif
  return mtopt__optimizer_run_pass(d->opt, pass, c0, c1, stream);
}

/* A whole pass, on the context's stream; on an empty plan still one call,
 * which runs the pass's finalisation (the backends finalise when the counter
 * reaches num_chunks). */
static mtopt_status_t run_all(mtopt_dist_optimizer_t *d, mtopt__pass_t pass) {
  return mtopt__optimizer_run_pass(d->opt, pass, 0, d->plan->num_chunks, NULL);
}

/* CPU: the average is the sum times 1/world, in float, after the reduction. */
static void scale(float *x, int64_t n, float s) {
#pragma omp parallel for simd if (n > 65536) schedule(static)
  for (int64_t i = 0; i < n; i++) x[i] *= s;
}

/* Segments issued so far: those of buckets [0, next_start). */
static int segments_issued(const mtopt_dist_optimizer_t *d) {
  return d->next_start > 0 ? d->b[d->next_start - 1].s1 : 0;
}

/* MPI (without an asynchronous progress thread) advances non-blocking
 * collectives only inside MPI calls: a test of the first reduction still in
 * flight after segment s drives all of them. */
static mtopt_status_t poke(mtopt_dist_optimizer_t *d, int s) {
  for (int j = s + 1; j < segments_issued(d); j++) {
    if (d->req[j] == MPI_REQUEST_NULL) continue;
    int done = 0;
    const int rc = MPI_Test(&d->req[j], &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_fail(d->ctx, rc, "mtopt_dist: bucket reduction");
    return MTOPT_STATUS_SUCCESS;
  }
  return MTOPT_STATUS_SUCCESS;
}

/* Work after segment s's reduction has landed: the average (CPU), then the
 * segment's statistics or (no statistics) its update. On the CPU the pass
 * runs in slices of about 2^20 elements with a poke between them, so that the
 * following segments' communication moves while this one is stepped (the
 * pass counter makes the split invisible to the result). */
static mtopt_status_t after_reduce(mtopt_dist_optimizer_t *d, int s) {
  const segment_t *g = &d->seg[s];
  const bucket_t *b = &d->b[g->bucket];
  mtopt__pass_t passes[MTOPT__MAX_PASSES];
  mtopt__step_passes(d->plan, passes);
  const mtopt__pass_t pass = passes[0]; /* the one that follows each bucket */
  if (d->comm->nccl) return run_range(d, pass, g->c0, g->c1);
  if (d->world > 1) {
    if (d->zero)
      scale(d->shard + b->shard_off, b->slice, d->inv_world);
    else
      scale(d->gbuf + g->offset, g->numel, d->inv_world);
  }
  int64_t slice = mtopt__dist_slice_elems / d->plan->chunk_size;
  if (slice < 1) slice = 1;
  for (int64_t c = g->c0; c < g->c1; c += slice) {
    CHECK(run_range(d, pass, c, c + slice < g->c1 ? c + slice : g->c1));
    CHECK(poke(d, s));
  }
  return MTOPT_STATUS_SUCCESS;
}

/* Starts segment s's reduction (ZeRO-1: the segment is its bucket). */
static mtopt_status_t start_segment(mtopt_dist_optimizer_t *d, int s) {
  const segment_t *g = &d->seg[s];
  const bucket_t *b = &d->b[g->bucket];
  static const char what[] = "mtopt_dist: bucket reduction";
#ifdef MTOPT_HAVE_NCCL
  if (d->comm->nccl) {
    /* The communication stream already waits for the gradients (progress);
     * the pass that reads this segment waits for event s (dist_step). */
    mtopt__nccl_t *n = d->comm->nccl;
    if (d->zero)
      CHECK(mtopt__nccl_reduce_scatter_avg_f32(n, d->gbuf + b->offset, d->shard + b->shard_off,
                                                b->slice));
    else
      CHECK(mtopt__nccl_allreduce_avg_f32(n, d->gbuf + g->offset, g->numel));
    return mtopt__nccl_record(d->ev, s);
  }
#endif
  int rc;
  if (d->zero)
    rc = MPI_Ireduce_scatter_block(d->gbuf + b->offset, d->shard + b->shard_off, (int)b->slice,
                                   MPI_FLOAT, MPI_SUM, d->comm->mpi, &d->req[s]);
  else
    rc = MPI_Iallreduce(MPI_IN_PLACE, d->gbuf + g->offset, (int)g->numel, MPI_FLOAT, MPI_SUM,
                        d->comm->mpi, &d->req[s]);
  if (rc != MPI_SUCCESS) return mpi_fail(d->ctx, rc, what);
  return MTOPT_STATUS_SUCCESS;
}

/* Issues the reductions of marked buckets in bucket order (every rank must
 * issue collectives in the same order), then (CPU) steps the segments that
 * have landed, in order, without blocking. */
static mtopt_status_t progress(mtopt_dist_optimizer_t *d) {
#ifdef MTOPT_HAVE_NCCL
  /* CUDA: only the collectives are enqueued here; the passes are enqueued by
   * mtopt_dist_step, each after its segment's event. (They could not go now:
   * the steps' stream waits for the context's stream, so that the passes
   * never run before the gradients are written, and backward is not done.)
   * One wait per call, recorded before anything of ours goes on the
   * context's stream: the collectives wait for the gradients written so far,
   * never for our passes. */
  if (d->comm->nccl) {
    if (d->next_start < d->nb && d->marked[d->next_start]) {
      CHECK(mtopt__nccl_check(d->comm->nccl, "mtopt_dist: bucket reduction"));
      CHECK(mtopt__nccl_comm_wait_compute(d->comm->nccl));
    }
    for (; d->next_start < d->nb && d->marked[d->next_start]; d->next_start++)
      for (int s = d->b[d->next_start].s0; s < d->b[d->next_start].s1; s++)
        CHECK(start_segment(d, s));
    return MTOPT_STATUS_SUCCESS;
  }
#endif
  for (; d->next_start < d->nb && d->marked[d->next_start]; d->next_start++)
    for (int s = d->b[d->next_start].s0; s < d->b[d->next_start].s1; s++)
      CHECK(start_segment(d, s));
  while (d->next_done < segments_issued(d)) {
    int done = 0;
    const int rc = MPI_Test(&d->req[d->next_done], &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mpi_fail(d->ctx, rc, "mtopt_dist: bucket reduction");
    if (!done) break;
    CHECK(after_reduce(d, d->next_done));
    d->next_done++;
  }
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_dist_bucket_ready(mtopt_dist_optimizer_t *d, int bucket) {
  static const char fn[] = "mtopt_dist_bucket_ready";
  CHECK(check_d(d, fn));
  if (d->broken) return broken_error(d, fn);
  CHECK(check_bucket(d, fn, bucket));
  if (d->marked[bucket])
    return mtopt__error(d->ctx, MTOPT_STATUS_INVALID_USAGE,
                        "%s: bucket %d is already marked in this step", fn, bucket);
  d->marked[bucket] = 1;
  mtopt_status_t st = progress(d);
  return st == MTOPT_STATUS_SUCCESS ? st : fail_step(d, st);
}

/* ZeRO-1 statistics: every rank's partial (sum of squares, non-finite count)
 * summed in rank order, so every rank derives the same clip factor to the
 * bit, then the deferred finalisation. */
static mtopt_status_t zero1_stats(mtopt_dist_optimizer_t *d) {
  mtopt_context_t *ctx = d->ctx;
#ifdef MTOPT_HAVE_NCCL
  if (d->comm->nccl) {
    mtopt__nccl_t *n = d->comm->nccl;
    CHECK(mtopt__nccl_comm_wait_compute(n));
    CHECK(mtopt__nccl_allreduce_sum_f64(n, d->plan->stats_sum, 2));
    CHECK(mtopt__nccl_compute_wait_comm(n));
    return mtopt__optimizer_finish_stats(d->opt);
  }
#endif
  double *all = malloc((size_t)d->world * 2 * sizeof *all);
  if (!all) return mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "mtopt_dist_step: malloc failed");
  MPI_Request r;
  int rc = MPI_Iallgather(d->plan->stats_sum, 2, MPI_DOUBLE, all, 2, MPI_DOUBLE, d->comm->mpi, &r);
  if (rc != MPI_SUCCESS) {
    free(all);
    return mpi_fail(ctx, rc, "mtopt_dist_step: gradient norm");
  }
  mtopt_status_t st = mpi_wait(ctx, &r, d->comm->cfg.timeout_ms, "mtopt_dist_step: gradient norm");
  if (st != MTOPT_STATUS_SUCCESS) return st; /* `all` leaks with the pending request */
  double sum = 0.0, bad = 0.0;
  for (int q = 0; q < d->world; q++) {
    sum += all[2 * q];
    bad += all[2 * q + 1];
  }
  free(all);
  d->plan->stats_sum[0] = sum;
  d->plan->stats_sum[1] = bad;
  return mtopt__optimizer_finish_stats(d->opt);
}

/* ZeRO-1: every rank's slice of the new weights to every rank. The gradient
 * buffer is the staging area: this rank's pieces go into its slice, an
 * in-place all-gather fills the others, and every tensor is copied back. */
static mtopt_status_t zero1_gather(mtopt_dist_optimizer_t *d) {
  mtopt_context_t *ctx = d->ctx;
  static const char what[] = "mtopt_dist_step: weight all-gather";
#ifdef MTOPT_HAVE_NCCL
  if (d->comm->nccl) {
    mtopt__nccl_t *n = d->comm->nccl;
    CHECK(mtopt__nccl_comm_wait_compute(n));
    for (int k = 0; k < d->nb; k++) {
      const bucket_t *b = &d->b[k];
      for (int64_t p = b->p0; p < b->p1; p++) {
        const piece_t *q = &d->pieces[p];
        CHECK(mtopt__nccl_copy(n, d->gbuf + d->goff[q->tensor] + q->start,
                               d->param[q->tensor] + q->start, (size_t)q->len * sizeof(float)));
      }
      CHECK(mtopt__nccl_allgather_f32(n, d->gbuf + b->offset, b->slice));
      for (int64_t i = b->first_tensor; i < b->first_tensor + b->num_tensors; i++)
        if (d->numel[i])
          CHECK(mtopt__nccl_copy(n, d->param[i], d->gbuf + d->goff[i],
                                 (size_t)d->numel[i] * sizeof(float)));
    }
    return mtopt__nccl_compute_wait_comm(n);
  }
#endif
  for (int k = 0; k < d->nb; k++) {
    const bucket_t *b = &d->b[k];
    for (int64_t p = b->p0; p < b->p1; p++) {
      const piece_t *q = &d->pieces[p];
      memcpy(d->gbuf + d->goff[q->tensor] + q->start, d->param[q->tensor] + q->start,
             (size_t)q->len * sizeof(float));
    }
    const int rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, d->gbuf + b->offset,
                                  (int)b->slice, MPI_FLOAT, d->comm->mpi, &d->ag_req[k]);
    if (rc != MPI_SUCCESS) return mpi_fail(ctx, rc, what);
  }
  for (int k = 0; k < d->nb; k++) {
    const bucket_t *b = &d->b[k];
    CHECK(mpi_wait(ctx, &d->ag_req[k], d->comm->cfg.timeout_ms, what));
    for (int64_t i = b->first_tensor; i < b->first_tensor + b->num_tensors; i++)
      if (d->numel[i])
        memcpy(d->param[i], d->gbuf + d->goff[i], (size_t)d->numel[i] * sizeof(float));
  }
  return MTOPT_STATUS_SUCCESS;
}

static mtopt_status_t dist_step(mtopt_dist_optimizer_t *d) {
  mtopt_context_t *ctx = d->ctx;
  for (int k = 0; k < d->nb; k++) d->marked[k] = 1;
  CHECK(progress(d));
#ifdef MTOPT_HAVE_NCCL
  /* CUDA: every collective is enqueued; each segment's pass waits for its own
   * collective only, so it runs while the later segments are communicated.
   * The passes go on the steps' stream, which waits for the context's stream
   * first and which the context's stream waits for at the end. */
  if (d->comm->nccl) {
    mtopt__nccl_t *n = d->comm->nccl;
    CHECK(mtopt__nccl_steps_begin(n));
    mtopt_status_t st = MTOPT_STATUS_SUCCESS;
    for (; st == MTOPT_STATUS_SUCCESS && d->next_done < d->ns; d->next_done++) {
      /* Waited for even where the range is empty: the steps end up ordered
       * after every collective of the step. */
      st = mtopt__nccl_steps_wait(d->ev, d->next_done);
      if (st == MTOPT_STATUS_SUCCESS) st = after_reduce(d, d->next_done);
    }
    /* Joined even after a failure: the context's stream (and fail_step's
     * reset of the pass counter on it) must come after the passes already
     * enqueued. */
    const mtopt_status_t end = mtopt__nccl_steps_end(n);
    CHECK(st);
    CHECK(end);
  }
#endif
  /* CPU: wait for the rest in order, stepping each as it lands. */
  while (d->next_done < d->ns) {
    char what[64];
    snprintf(what, sizeof what, "mtopt_dist_step: bucket %d reduction",
             d->seg[d->next_done].bucket);
    CHECK(mpi_wait(ctx, &d->req[d->next_done], d->comm->cfg.timeout_ms, what));
    CHECK(after_reduce(d, d->next_done));
    d->next_done++;
  }
  /* The first pass ran per segment as each landed (on an empty plan it runs
   * once here, for its finalisation); the others run whole, after the ranks'
   * statistics where the plan defers them. One pass at a time: the counter
   * that elects a pass's finaliser cannot tell interleaved passes apart. */
  mtopt__pass_t passes[MTOPT__MAX_PASSES];
  const int np = mtopt__step_passes(d->plan, passes);
  if (d->plan->num_chunks == 0) CHECK(run_all(d, passes[0]));
  if (passes[0] == MTOPT__PASS_STATS && d->plan->defer_stats) CHECK(zero1_stats(d));
  for (int i = 1; i < np; i++) CHECK(run_all(d, passes[i]));
  if (d->zero) CHECK(zero1_gather(d));
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_dist_step(mtopt_dist_optimizer_t *d) {
  static const char fn[] = "mtopt_dist_step";
  CHECK(check_d(d, fn));
  if (d->broken) return broken_error(d, fn);
  mtopt_status_t st = dist_step(d);
  if (st != MTOPT_STATUS_SUCCESS) return fail_step(d, st);
  memset(d->marked, 0, (size_t)d->nb);
  d->next_start = d->next_done = 0;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_dist_synchronize(mtopt_dist_optimizer_t *d) {
  static const char fn[] = "mtopt_dist_synchronize";
  CHECK(check_d(d, fn));
  if (d->broken) return broken_error(d, fn);
#ifdef MTOPT_HAVE_NCCL
  if (d->comm->nccl) {
    mtopt_status_t st = mtopt__nccl_synchronize(d->comm->nccl);
    if (st != MTOPT_STATUS_SUCCESS) d->broken = 1;
    return st;
  }
#endif
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt__dist_comm_only(mtopt_dist_optimizer_t *d) {
  static const char fn[] = "mtopt__dist_comm_only";
  CHECK(check_d(d, fn));
  if (d->broken) return broken_error(d, fn);
  /* ZeRO-1 has one segment per bucket: its all-gather follows segment s. */
#ifdef MTOPT_HAVE_NCCL
  if (d->comm->nccl) {
    mtopt__nccl_t *n = d->comm->nccl;
    CHECK(mtopt__nccl_comm_wait_compute(n));
    for (int s = 0; s < d->ns; s++) {
      CHECK(start_segment(d, s));
      const bucket_t *b = &d->b[d->seg[s].bucket];
      if (d->zero) CHECK(mtopt__nccl_allgather_f32(n, d->gbuf + b->offset, b->slice));
    }
    return mtopt__nccl_compute_wait_comm(n);
  }
#endif
  for (int s = 0; s < d->ns; s++) {
    const mtopt_status_t st = start_segment(d, s);
    if (st != MTOPT_STATUS_SUCCESS) return fail_step(d, st);
  }
  for (int s = 0; s < d->ns; s++) {
    const bucket_t *b = &d->b[d->seg[s].bucket];
    mtopt_status_t st = mpi_wait(d->ctx, &d->req[s], d->comm->cfg.timeout_ms, fn);
    if (st != MTOPT_STATUS_SUCCESS) return fail_step(d, st);
    if (d->zero) {
      const int rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, d->gbuf + b->offset,
                                    (int)b->slice, MPI_FLOAT, d->comm->mpi,
                                    &d->ag_req[d->seg[s].bucket]);
      if (rc != MPI_SUCCESS) return fail_step(d, mpi_fail(d->ctx, rc, fn));
    }
  }
  for (int k = 0; k < d->nb; k++) {
    mtopt_status_t st = mpi_wait(d->ctx, &d->ag_req[k], d->comm->cfg.timeout_ms, fn);
    if (st != MTOPT_STATUS_SUCCESS) return fail_step(d, st);
  }
  return MTOPT_STATUS_SUCCESS;
}

int mtopt__dist_segment_count(const mtopt_dist_optimizer_t *d) { return d->ns; }

void mtopt__dist_segment(const mtopt_dist_optimizer_t *d, int s, int *bucket, int64_t *offset,
                         int64_t *numel, int64_t *c0, int64_t *c1) {
  const segment_t *g = &d->seg[s];
  *bucket = g->bucket;
  *offset = g->offset;
  *numel = g->numel;
  *c0 = g->c0;
  *c1 = g->c1;
}

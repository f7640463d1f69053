/* The MPI transport (transport.h): the collectives of CPU contexts, as MPI
 * non-blocking collectives on host memory over the communicator's duplicate
 * of the caller's MPI_Comm (errors come back as codes, MPI_ERRORS_RETURN, so
 * that they become COMM_ERROR, not an abort).
 *
 * The average is the sum times (float)(1 / world), in float, applied when the
 * host sees the reduction land (test, wait): the tests' reference averages
 * the same way, so results are bit-identical to one process stepping the
 * averaged gradient. MPI has no 16-bit float: BF16 and F16 buckets travel as
 * MPI_UINT16_T under a user-defined sum that adds in float and rounds to
 * nearest even after each addition, and the average is rounded once more.
 * F16 is the exception to "sum, then scale": its range ends at 65504, and
 * the sum of ranks' loss-scaled gradients that are each finite may not be
 * (two ranks' 34912 and 42080 skipped a step one process took), so each
 * rank's F16 values are multiplied by (float)(1 / world), rounded, before
 * the reduction, as NCCL's ncclAvg does.
 *
 * Timeouts. MPI cannot cancel a collective: one that does not land within
 * timeout_ms stays pending with its request, and its buffers must outlive it
 * (the distributed optimizer then becomes unusable and, at destroy, leaks the
 * buffers rather than free them under MPI: see drain).
 *
 * Failure. The first collective that fails or times out marks the transport
 * failed (one flag per communicator): from then on no call waits again, so
 * that everything after a failure, destroy included, returns at once rather
 * than spending a timeout per collective still pending. A wait is then one
 * test (an abandoned collective may still have landed), a new collective is
 * refused with COMM_ERROR. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "transport.h"

struct mtopt__transport {
  mtopt_context_t *ctx;
  MPI_Comm comm; /* the communicator's duplicate, not owned */
  int world;
  int timeout_ms;
  float inv_world; /* (float)(1 / world) */
  int failed;      /* a collective failed or timed out: nothing waits again */
  MPI_Op sum16[MTOPT__NUM_DTYPES]; /* the 16-bit sums, by MTOPT__DT_* */
};

typedef struct {
  MPI_Request req;
  void *avg;       /* an average to finish when the request lands, or NULL */
  int64_t avg_len; /* its elements */
  int avg_dt;      /* their dtype */
} slot_t;

struct mtopt__transport_slots {
  mtopt__transport_t *t;
  int count;
  slot_t slot[];
};

static const char reduction[] = "mtopt_dist: bucket reduction";

mtopt_status_t mtopt__mpi_fail(mtopt_context_t *ctx, int rc, const char *what) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) snprintf(text, sizeof text, "code %d", rc);
  return mtopt__error(ctx, MTOPT_STATUS_COMM_ERROR, "%s: MPI error: %s", what, text);
}

/* The deadline of a wait that starts now: timeout_ms later, or never (0). */
static double deadline_in(int timeout_ms) {
  return timeout_ms > 0 ? mtopt__now_ms() + timeout_ms : HUGE_VAL;
}

/* Polls one request until it lands or the deadline passes (*late = 1, no
 * error set; the request stays pending: MPI cannot cancel a collective, so
 * the caller keeps its buffers alive or leaks them). A deadline already past
 * makes it one test. COMM_ERROR for an MPI error. The pause between polls
 * grows with the time waited (clock.h), so a stalled wait sleeps. */
static mtopt_status_t wait_until(mtopt_context_t *ctx, MPI_Request *r, double deadline,
                                 int *late, const char *what) {
  *late = 0;
  const double start = mtopt__now_ms();
  while (*r != MPI_REQUEST_NULL) {
    int done = 0;
    const int rc = MPI_Test(r, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return mtopt__mpi_fail(ctx, rc, what);
    if (done) break;
    const double now = mtopt__now_ms();
    if (now >= deadline) {
      *late = 1;
      break;
    }
    mtopt__poll_pause(now - start);
  }
  return MTOPT_STATUS_SUCCESS;
}

static mtopt_status_t timed_out(mtopt_context_t *ctx, int timeout_ms, const char *what) {
  return mtopt__error(ctx, MTOPT_STATUS_COMM_ERROR,
                      "%s: not finished after timeout_ms = %d (a rank did not join the "
                      "collective, or the network stalled)",
                      what, timeout_ms);
}

/* Waits for one request, at most timeout_ms (0: forever). */
static mtopt_status_t wait_timed(mtopt_context_t *ctx, MPI_Request *r, int timeout_ms,
                                 const char *what) {
  int late = 0;
  CHECK(wait_until(ctx, r, deadline_in(timeout_ms), &late, what));
  return late ? timed_out(ctx, timeout_ms, what) : MTOPT_STATUS_SUCCESS;
}

/* COMM_ERROR once the transport has failed. */
static mtopt_status_t usable(mtopt__transport_t *t, const char *what) {
  if (!t->failed) return MTOPT_STATUS_SUCCESS;
  return mtopt__error(t->ctx, MTOPT_STATUS_COMM_ERROR,
                      "%s: an earlier collective of this communicator failed or timed out; "
                      "it is unusable",
                      what);
}

/* The transport's waits: until `deadline`, or, once the transport has
 * failed, one test. A failure (an MPI error, or the deadline) marks the
 * transport failed. */
static mtopt_status_t wait_req(mtopt__transport_t *t, MPI_Request *r, double deadline,
                               const char *what) {
  int late = 0;
  mtopt_status_t st = wait_until(t->ctx, r, t->failed ? -HUGE_VAL : deadline, &late, what);
  if (st == MTOPT_STATUS_SUCCESS && late)
    st = t->failed ? usable(t, what) : timed_out(t->ctx, t->timeout_ms, what);
  if (st != MTOPT_STATUS_SUCCESS) t->failed = 1;
  return st;
}

mtopt_status_t mtopt__mpi_max_i64(mtopt_context_t *ctx, MPI_Comm comm, int timeout_ms,
                                  int64_t *v, int n, const char *what) {
  /* A heap copy: a collective that times out is abandoned with its buffer,
   * which is then leaked rather than left to MPI on a dead stack frame. */
  int64_t *buf = malloc((size_t)n * sizeof *buf);
  if (!buf) return mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: malloc failed", what);
  memcpy(buf, v, (size_t)n * sizeof *buf);
  MPI_Request r;
  const int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, n, MPI_INT64_T, MPI_MAX, comm, &r);
  if (rc != MPI_SUCCESS) {
    free(buf);
    return mtopt__mpi_fail(ctx, rc, what);
  }
  CHECK(wait_timed(ctx, &r, timeout_ms, what)); /* `buf` leaks with a pending request */
  memcpy(v, buf, (size_t)n * sizeof *buf);
  free(buf);
  return MTOPT_STATUS_SUCCESS;
}

/* ------------------------------------------------------------ set-up ----- */

/* The 16-bit sums (MPI_User_function): inout[i] += in[i], in float, rounded
 * to nearest even (dtype.h's loads and stores). */
static void sum16(const void *in, void *inout, int len, int dt) {
  for (int i = 0; i < len; i++)
    mtopt__st(inout, dt, i, mtopt__ld(in, dt, i) + mtopt__ld(inout, dt, i), 0, 0u);
}
static void sum_bf16(void *in, void *inout, int *len, MPI_Datatype *type) {
  (void)type;
  sum16(in, inout, *len, MTOPT__DT_BF16);
}
static void sum_f16(void *in, void *inout, int *len, MPI_Datatype *type) {
  (void)type;
  sum16(in, inout, *len, MTOPT__DT_F16);
}

static void free_ops(mtopt__transport_t *t) {
  for (int d = 0; d < MTOPT__NUM_DTYPES; d++)
    if (t->sum16[d] != MPI_OP_NULL) MPI_Op_free(&t->sum16[d]);
}

static mtopt_status_t mpi_create(mtopt__transport_args_t *a, mtopt__transport_t **out) {
  mtopt__transport_t *t = calloc(1, sizeof *t);
  if (!t)
    return mtopt__error(a->ctx, MTOPT_STATUS_OUT_OF_MEMORY, "mtopt_comm_create_mpi: calloc failed");
  t->ctx = a->ctx;
  t->comm = a->mpi;
  t->world = a->world;
  t->timeout_ms = a->cfg->timeout_ms;
  t->inv_world = (float)(1.0 / (double)a->world);
  for (int d = 0; d < MTOPT__NUM_DTYPES; d++) t->sum16[d] = MPI_OP_NULL;
  int rc = MPI_Op_create(sum_bf16, 1, &t->sum16[MTOPT__DT_BF16]);
  if (rc == MPI_SUCCESS) rc = MPI_Op_create(sum_f16, 1, &t->sum16[MTOPT__DT_F16]);
  if (rc != MPI_SUCCESS) {
    free_ops(t);
    free(t);
    return mtopt__mpi_fail(a->ctx, rc, "mtopt_comm_create_mpi: MPI_Op_create");
  }
  *out = t;
  return MTOPT_STATUS_SUCCESS;
}

static mtopt_status_t mpi_destroy(mtopt__transport_t *t) {
  free_ops(t);
  free(t);
  return MTOPT_STATUS_SUCCESS;
}

static void mpi_sm_split(const mtopt__transport_t *t, int *comm_sms, int *step_sms) {
  (void)t;
  *comm_sms = *step_sms = 0;
}

static mtopt_status_t mpi_max(mtopt__transport_t *t, int64_t *v, int n, const char *what) {
  CHECK(usable(t, what));
  const mtopt_status_t st = mtopt__mpi_max_i64(t->ctx, t->comm, t->timeout_ms, v, n, what);
  if (st == MTOPT_STATUS_COMM_ERROR) t->failed = 1;
  return st;
}

static mtopt_status_t mpi_slots_create(mtopt__transport_t *t, int reductions, int gathers,
                                       mtopt__transport_slots_t **out) {
  const int count = reductions + gathers;
  mtopt__transport_slots_t *s = malloc(sizeof *s + (size_t)count * sizeof(slot_t));
  if (!s)
    return mtopt__error(t->ctx, MTOPT_STATUS_OUT_OF_MEMORY,
                        "mtopt_dist_optimizer_create: malloc failed");
  s->t = t;
  s->count = count;
  for (int i = 0; i < count; i++) s->slot[i] = (slot_t){MPI_REQUEST_NULL, NULL, 0, 0};
  *out = s;
  return MTOPT_STATUS_SUCCESS;
}

static void mpi_slots_destroy(mtopt__transport_slots_t *s) { free(s); }

/* ------------------------------------------------------- collectives ----- */

static void scale(void *x, int64_t n, int dt, float s) {
  if (dt == MTOPT__DT_F32) {
    float *f = x;
#pragma omp parallel for simd if (n > 65536) schedule(static)
    for (int64_t i = 0; i < n; i++) f[i] *= s;
    return;
  }
#pragma omp parallel for if (n > 65536) schedule(static)
  for (int64_t i = 0; i < n; i++) mtopt__st(x, dt, i, mtopt__ld(x, dt, i) * s, 0, 0u);
}

/* Slot i's request is done: finish its average (once). */
static void landed(mtopt__transport_slots_t *s, int i) {
  slot_t *q = &s->slot[i];
  if (q->avg) scale(q->avg, q->avg_len, q->avg_dt, s->t->inv_world);
  q->avg = NULL;
}

/* Whether dt's average is taken before the sum (F16, see the top). */
static int scales_first(int dt) { return dt == MTOPT__DT_F16; }

/* The MPI type and sum of elements of dtype dt. */
static MPI_Datatype mpi_type(int dt) { return dt == MTOPT__DT_F32 ? MPI_FLOAT : MPI_UINT16_T; }
static MPI_Op mpi_sum(const mtopt__transport_t *t, int dt) {
  return dt == MTOPT__DT_F32 ? MPI_SUM : t->sum16[dt];
}

/* An MPI error: the transport has failed. */
static mtopt_status_t fail(mtopt__transport_t *t, int rc, const char *what) {
  t->failed = 1;
  return mtopt__mpi_fail(t->ctx, rc, what);
}

/* Records an issued collective: the average to finish later, at one rank
 * none (the sum is the average). */
static mtopt_status_t issued(mtopt__transport_slots_t *s, int i, int rc, void *avg, int64_t n,
                             int dt, const char *what) {
  if (rc != MPI_SUCCESS) return fail(s->t, rc, what);
  s->slot[i].avg = s->t->world > 1 && !scales_first(dt) ? avg : NULL;
  s->slot[i].avg_len = n;
  s->slot[i].avg_dt = dt;
  return MTOPT_STATUS_SUCCESS;
}

static mtopt_status_t mpi_allreduce_avg(mtopt__transport_slots_t *s, int i, void *buf,
                                        int64_t count, int dt, const char *what) {
  CHECK(usable(s->t, what));
  if (scales_first(dt) && s->t->world > 1) scale(buf, count, dt, s->t->inv_world);
  const int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)count, mpi_type(dt), mpi_sum(s->t, dt),
                                s->t->comm, &s->slot[i].req);
  return issued(s, i, rc, buf, count, dt, what);
}

static mtopt_status_t mpi_reduce_scatter_avg(mtopt__transport_slots_t *s, int i, void *send,
                                             void *recv, int64_t recvcount, int dt,
                                             const char *what) {
  CHECK(usable(s->t, what));
  if (scales_first(dt) && s->t->world > 1)
    scale(send, recvcount * s->t->world, dt, s->t->inv_world);
  const int rc = MPI_Ireduce_scatter_block(send, recv, (int)recvcount, mpi_type(dt),
                                           mpi_sum(s->t, dt), s->t->comm, &s->slot[i].req);
  return issued(s, i, rc, recv, recvcount, dt, what);
}

static mtopt_status_t mpi_allgather(mtopt__transport_slots_t *s, int i, void *buf,
                                    int64_t count, int dt, const char *what) {
  CHECK(usable(s->t, what));
  const int rc = MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf, (int)count,
                                mpi_type(dt), s->t->comm, &s->slot[i].req);
  return issued(s, i, rc, NULL, 0, dt, what);
}

static mtopt_status_t mpi_test(mtopt__transport_slots_t *s, int i, int *done, const char *what) {
  *done = 0;
  const int rc = MPI_Test(&s->slot[i].req, done, MPI_STATUS_IGNORE);
  if (rc != MPI_SUCCESS) return fail(s->t, rc, what);
  if (*done) landed(s, i);
  return MTOPT_STATUS_SUCCESS;
}

static mtopt_status_t mpi_wait_slot(mtopt__transport_slots_t *s, int i, mtopt__consumer_t who,
                                    const char *what) {
  (void)who; /* every consumer is the host */
  CHECK(wait_req(s->t, &s->slot[i].req, deadline_in(s->t->timeout_ms), what));
  landed(s, i);
  return MTOPT_STATUS_SUCCESS;
}

/* A test of the first collective still in flight drives all of them. It may
 * complete it: the average is then finished by the test or wait that sees
 * it (an MPI_Test of a completed, nulled request reports it done). */
static mtopt_status_t mpi_poke(mtopt__transport_slots_t *s, int first, int end) {
  for (int j = first; j < end; j++) {
    if (s->slot[j].req == MPI_REQUEST_NULL) continue;
    int done = 0;
    const int rc = MPI_Test(&s->slot[j].req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) return fail(s->t, rc, reduction);
    return MTOPT_STATUS_SUCCESS;
  }
  return MTOPT_STATUS_SUCCESS;
}

/* Outstanding requests point into the optimizer's buffers: all are waited
 * for until one deadline, timeout_ms from now (after a failure, each is
 * tested once), so destroy takes at most one timeout however many are
 * pending; ones that never finish are counted, and their memory is leaked by
 * the caller, not freed under MPI's feet. */
static mtopt_status_t mpi_drain(mtopt__transport_slots_t *s, int *leaked) {
  const double deadline = deadline_in(s->t->timeout_ms);
  for (int i = 0; i < s->count; i++)
    if (s->slot[i].req != MPI_REQUEST_NULL &&
        wait_req(s->t, &s->slot[i].req, deadline, "mtopt_dist_optimizer_destroy") !=
            MTOPT_STATUS_SUCCESS)
      (*leaked)++;
  return MTOPT_STATUS_SUCCESS;
}

/* Every rank's partial (sum of squares, non-finite count) gathered and
 * summed in rank order, so every rank derives the same clip factor to the
 * bit. Both buffers on the heap (the send part after every rank's): a
 * gather that times out leaks them with its request rather than leave MPI
 * the optimizer's plan, which destroy frees. */
static mtopt_status_t mpi_sum_stats(mtopt__transport_t *t, double *stats) {
  static const char what[] = "mtopt_dist_step: gradient norm";
  mtopt_context_t *ctx = t->ctx;
  CHECK(usable(t, what));
  double *all = malloc((size_t)(t->world + 1) * 2 * sizeof *all);
  if (!all) return mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY, "mtopt_dist_step: malloc failed");
  double *mine = all + 2 * t->world;
  mine[0] = stats[0];
  mine[1] = stats[1];
  MPI_Request r;
  int rc = MPI_Iallgather(mine, 2, MPI_DOUBLE, all, 2, MPI_DOUBLE, t->comm, &r);
  if (rc != MPI_SUCCESS) {
    free(all);
    return fail(t, rc, what);
  }
  CHECK(wait_req(t, &r, deadline_in(t->timeout_ms), what)); /* `all` leaks if pending */
  double sum = 0.0, bad = 0.0;
  for (int q = 0; q < t->world; q++) {
    sum += all[2 * q];
    bad += all[2 * q + 1];
  }
  free(all);
  stats[0] = sum;
  stats[1] = bad;
  return MTOPT_STATUS_SUCCESS;
}

static mtopt_status_t mpi_copy(mtopt__transport_t *t, void *dst, const void *src, size_t bytes) {
  (void)t;
  memcpy(dst, src, bytes);
  return MTOPT_STATUS_SUCCESS;
}

/* The look for a failure: whether an earlier collective failed. */
static mtopt_status_t mpi_check(mtopt__transport_t *t, const char *what) {
  return usable(t, what);
}

/* ------------------------------------- ordering: nothing to order here -- */

static mtopt_status_t mpi_nothing(mtopt__transport_t *t) {
  (void)t;
  return MTOPT_STATUS_SUCCESS;
}

static void *const *mpi_no_stream(const mtopt__transport_t *t) {
  (void)t;
  return NULL; /* the CPU backend ignores the stream */
}

static const mtopt__transport_ops_t mpi_ops = {
    .name = "mpi",
    .host_progress = 1,
    .create = mpi_create,
    .destroy = mpi_destroy,
    .sm_split = mpi_sm_split,
    .max_i64 = mpi_max,
    .slots_create = mpi_slots_create,
    .slots_destroy = mpi_slots_destroy,
    .allreduce_avg = mpi_allreduce_avg,
    .reduce_scatter_avg = mpi_reduce_scatter_avg,
    .allgather = mpi_allgather,
    .test = mpi_test,
    .wait = mpi_wait_slot,
    .poke = mpi_poke,
    .drain = mpi_drain,
    .sum_stats = mpi_sum_stats,
    .copy = mpi_copy,
    .check = mpi_check,
    .comm_wait_compute = mpi_nothing,
    .compute_wait_comm = mpi_nothing,
    .comm_wait_steps = mpi_nothing,
    .steps_begin = mpi_nothing,
    .steps_end = mpi_nothing,
    .steps_stream = mpi_no_stream,
    .comm_stream = mpi_no_stream,
    .synchronize = mpi_nothing,
};

const mtopt__transport_ops_t *mtopt__transport_mpi(void) { return &mpi_ops; }

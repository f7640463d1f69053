/* The bucket epilogue (mtopt_dist.h, "The epilogue"): each bucket's
 * reduction issued once it is marked ready, each segment's step once its
 * reduction has landed, overlapping the following ones; ZeRO-1's statistics
 * and weight all-gather.
 *
 * One control flow over the transport (transport.h). What differs between a
 * transport whose collectives the host drives (MPI) and a stream-ordered one
 * (NCCL) lives in the transport, save two numbers taken from
 * ops->host_progress: how many chunks are stepped between two pokes
 * (after_reduce), and how many collectives are issued before the first is
 * waited for where the transport's own work consumes them (issue_ahead).
 * The optimizer math stays in the backends: a segment's step is
 * ops->run_pass over its contiguous chunk range. */
#include <stdio.h>
#include <string.h>

#include "dist_internal.h"

int64_t mtopt__dist_slice_elems = INT64_C(1) << 20;

static const char reduction[] = "mtopt_dist: bucket reduction";

/* The check of every call of the epilogue: a distributed optimizer that a
 * collective has not broken. */
static mtopt_status_t check_usable(mtopt_dist_optimizer_t *d, const char *fn) {
  CHECK(mtopt__dist_check(d, fn));
  if (!d->broken) return MTOPT_STATUS_SUCCESS;
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

/* Bucket passes: on the transport's steps' stream (the CPU ignores the
 * stream). */
static mtopt_status_t run_range(mtopt_dist_optimizer_t *d, mtopt__pass_t pass, int64_t c0,
                                int64_t c1) {
  if (c0 >= c1) return MTOPT_STATUS_SUCCESS;
  return mtopt__optimizer_run_pass(d->opt, pass, c0, c1, d->ops->steps_stream(d->tr));
}

/* A whole pass, on the context's stream; on an empty plan still one call,
 * which runs the pass's finalisation (the backends finalise when the counter
 * reaches num_chunks). */
static mtopt_status_t run_all(mtopt_dist_optimizer_t *d, mtopt__pass_t pass) {
  return mtopt__optimizer_run_pass(d->opt, pass, 0, d->plan->num_chunks, NULL);
}

/* Segments issued so far: those of buckets [0, next_start). */
static int segments_issued(const mtopt_dist_optimizer_t *d) {
  return d->next_start > 0 ? d->lay.b[d->next_start - 1].s1 : 0;
}

/* How many of `count` collectives are issued before the first is waited for,
 * where the transport's own work consumes them (ZeRO-1's all-gather after a
 * reduce-scatter, the copies after an all-gather). Stream-ordered: none, each
 * consumer is enqueued right after its collective (the wait costs nothing).
 * Host progress: all, since a wait blocks the host: every collective is in
 * flight, moving together, before the first wait. */
static int issue_ahead(const mtopt_dist_optimizer_t *d, int count) {
  return d->ops->host_progress ? count : 0;
}

/* Work after segment s's reduction has landed (and been averaged by the
 * transport): the segment's statistics or (no statistics) its update. Where
 * the host drives the collectives, the pass runs in slices of about
 * mtopt__dist_slice_elems elements with a poke between them, so that the
 * following segments' communication moves while this one is stepped (the
 * pass counter makes the split invisible to the result); stream-ordered, it
 * is one pass. */
static mtopt_status_t after_reduce(mtopt_dist_optimizer_t *d, int s) {
  const mtopt__segment_t *g = &d->lay.seg[s];
  mtopt__pass_t passes[MTOPT__MAX_PASSES];
  mtopt__step_passes(d->plan, passes);
  const mtopt__pass_t pass = passes[0]; /* the one that follows each bucket */
  int64_t slice = g->c1 - g->c0;
  if (d->ops->host_progress) {
    slice = mtopt__dist_slice_elems / d->plan->chunk_size;
    if (slice < 1) slice = 1;
  }
  for (int64_t c = g->c0; c < g->c1; c += slice) {
    CHECK(run_range(d, pass, c, c + slice < g->c1 ? c + slice : g->c1));
    CHECK(d->ops->poke(d->slots, s + 1, segments_issued(d)));
  }
  return MTOPT_STATUS_SUCCESS;
}

/* Starts segment s's reduction (ZeRO-1: the segment is its bucket). The
 * transport's work already waits for the gradients (progress); the pass that
 * reads this segment waits for its slot (dist_step). A bucket reduced in
 * fp32 (reduce_f32) is first widened into the fp32 copy of its buffer, on
 * the transport's stream, so that the collective comes after it. */
static mtopt_status_t start_segment(mtopt_dist_optimizer_t *d, int s) {
  const mtopt__segment_t *g = &d->lay.seg[s];
  const mtopt__bucket_t *b = &d->lay.b[g->bucket];
  const int64_t off = d->zero ? b->offset : g->offset, n = d->zero ? b->numel : g->numel;
  char *red = mtopt__dist_reduced_at(d, g->bucket, off);
  if (b->rdt != b->gdt)
    CHECK(mtopt__context_widen(d->ctx, (float *)red, mtopt__dist_grad_at(d, b->gdt, off), b->gdt, n,
                               d->ops->comm_stream(d->tr)));
  if (d->zero)
    return d->ops->reduce_scatter_avg(d->slots, s, red, d->shard + b->shard_off, b->slice,
                                      b->rdt, reduction);
  return d->ops->allreduce_avg(d->slots, s, red, n, b->rdt, reduction);
}

/* Issues the reductions of marked buckets in bucket order (every rank must
 * issue collectives in the same order), then steps the segments that have
 * landed, in order, without blocking. */
static mtopt_status_t progress(mtopt_dist_optimizer_t *d) {
  const mtopt__transport_ops_t *ops = d->ops;
  const mtopt__bucket_layout_t *L = &d->lay;
  /* One wait per call, recorded before anything of ours goes on the
   * context's stream: the collectives wait for the gradients written so far,
   * never for our passes. */
  if (d->next_start < L->nb && d->marked[d->next_start]) {
    CHECK(ops->check(d->tr, reduction));
    CHECK(ops->comm_wait_compute(d->tr));
  }
  for (; d->next_start < L->nb && d->marked[d->next_start]; d->next_start++)
    for (int s = L->b[d->next_start].s0; s < L->b[d->next_start].s1; s++)
      CHECK(start_segment(d, s));
  /* Stream-ordered, no segment is seen to land here: the passes are enqueued
   * by mtopt_dist_step, each after its segment's slot. (They could not go
   * now: the steps' stream waits for the context's stream, so that the
   * passes never run before the gradients are written, and backward is not
   * done.) */
  while (d->next_done < segments_issued(d)) {
    int done = 0;
    CHECK(ops->test(d->slots, d->next_done, &done, reduction));
    if (!done) break;
    CHECK(after_reduce(d, d->next_done));
    d->next_done++;
  }
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_dist_bucket_ready(mtopt_dist_optimizer_t *d, int bucket) {
  static const char fn[] = "mtopt_dist_bucket_ready";
  CHECK(check_usable(d, fn));
  CHECK(mtopt__dist_check_bucket(d, fn, bucket));
  if (d->marked[bucket])
    return mtopt__error(d->ctx, MTOPT_STATUS_INVALID_USAGE,
                        "%s: bucket %d is already marked in this step", fn, bucket);
  d->marked[bucket] = 1;
  mtopt_status_t st = progress(d);
  return st == MTOPT_STATUS_SUCCESS ? st : fail_step(d, st);
}

/* ZeRO-1 statistics: every rank's partial (sum of squares, non-finite count)
 * summed over ranks (the MPI transport in rank order, so every rank derives
 * the same clip factor to the bit), then the deferred finalisation. */
static mtopt_status_t zero1_stats(mtopt_dist_optimizer_t *d) {
  CHECK(d->ops->comm_wait_compute(d->tr));
  CHECK(d->ops->sum_stats(d->tr, d->plan->stats_sum));
  CHECK(d->ops->compute_wait_comm(d->tr));
  return mtopt__optimizer_finish_stats(d->opt);
}

/* ZeRO-1: element e (counted from the bucket's start) of bucket k's staging
 * area, where its new weights are all-gathered (bucket_layout.h). */
static char *stage_at(const mtopt_dist_optimizer_t *d, int k, int64_t e) {
  const mtopt__bucket_t *b = &d->lay.b[k];
  char *base = b->stage_wide ? d->wide : d->gbuf[b->gdt];
  return base + b->stage_off + e * mtopt__dt_size(b->pdt);
}

/* ZeRO-1: once bucket k's all-gather has landed, its tensors back from the
 * staging area. */
static mtopt_status_t unstage(mtopt_dist_optimizer_t *d, int k, const char *what) {
  const mtopt__bucket_layout_t *L = &d->lay;
  const mtopt__bucket_t *b = &L->b[k];
  const size_t pe = (size_t)mtopt__dt_size(b->pdt);
  CHECK(d->ops->wait(d->slots, L->ns + k, MTOPT__FOR_COMM, what));
  for (int64_t i = b->first_tensor; i < b->first_tensor + b->num_tensors; i++)
    if (L->tbucket[i] == k && L->numel[i])
      CHECK(d->ops->copy(d->tr, d->param[i], stage_at(d, k, L->goff[i] - b->offset),
                         (size_t)L->numel[i] * pe));
  return MTOPT_STATUS_SUCCESS;
}

/* ZeRO-1: bucket k's new weights to every rank, once its update is
 * enqueued (or done): this rank's pieces into its slice of the staging area
 * and an in-place all-gather of the others, on the transport (the
 * communication stream on CUDA, after the steps so far), overlapping the
 * next buckets' updates; then the copies back of the buckets whose
 * all-gathers may be waited for (issue_ahead). */
static const char gather_what[] = "mtopt_dist_step: weight all-gather";

static mtopt_status_t gather_bucket(mtopt_dist_optimizer_t *d, int k) {
  const mtopt__bucket_layout_t *L = &d->lay;
  const mtopt__bucket_t *b = &L->b[k];
  const size_t pe = (size_t)mtopt__dt_size(b->pdt);
  CHECK(d->ops->comm_wait_steps(d->tr));
  for (int64_t p = b->p0; p < b->p1; p++) {
    const mtopt__piece_t *q = &L->pieces[p];
    CHECK(d->ops->copy(d->tr, stage_at(d, k, L->goff[q->tensor] + q->start - b->offset),
                       d->param[q->tensor] + (size_t)q->start * pe, (size_t)q->len * pe));
  }
  CHECK(d->ops->allgather(d->slots, L->ns + k, stage_at(d, k, 0), b->slice, b->pdt,
                          gather_what));
  for (const int ahead = issue_ahead(d, L->nb); d->next_back <= k - ahead; d->next_back++)
    CHECK(unstage(d, d->next_back, gather_what));
  return MTOPT_STATUS_SUCCESS;
}

/* ZeRO-1 with statistics: the update after the ranks' statistics, bucket by
 * bucket on the steps' stream, each bucket all-gathered as soon as its
 * update is enqueued. */
static mtopt_status_t update_and_gather(mtopt_dist_optimizer_t *d) {
  const mtopt__transport_ops_t *ops = d->ops;
  if (d->plan->num_chunks == 0) CHECK(run_all(d, MTOPT__PASS_UPDATE)); /* its finalisation */
  CHECK(ops->steps_begin(d->tr));
  mtopt_status_t st = MTOPT_STATUS_SUCCESS;
  for (int k = 0; st == MTOPT_STATUS_SUCCESS && k < d->lay.nb; k++) {
    st = run_range(d, MTOPT__PASS_UPDATE, d->lay.b[k].c0, d->lay.b[k].c1);
    if (st == MTOPT_STATUS_SUCCESS) st = gather_bucket(d, k);
  }
  const mtopt_status_t end = ops->steps_end(d->tr);
  CHECK(st);
  return end;
}

/* ZeRO-1: the copies back of the buckets not yet copied, then the context's
 * stream after them. */
static mtopt_status_t gather_finish(mtopt_dist_optimizer_t *d) {
  for (; d->next_back < d->lay.nb; d->next_back++) CHECK(unstage(d, d->next_back, gather_what));
  return d->ops->compute_wait_comm(d->tr);
}

static mtopt_status_t dist_step(mtopt_dist_optimizer_t *d) {
  const mtopt__transport_ops_t *ops = d->ops;
  for (int k = 0; k < d->lay.nb; k++) d->marked[k] = 1;
  CHECK(progress(d));
  mtopt__pass_t passes[MTOPT__MAX_PASSES];
  const int np = mtopt__step_passes(d->plan, passes);
  /* ZeRO-1 without statistics: each bucket's all-gather follows its update
   * (one segment per bucket), overlapping the next buckets' reductions and
   * updates. Issued only from here, once every reduction is: collectives
   * go in the same order on every rank, and ranks mark buckets ready in
   * their own order (a bucket stepped early, as its reduction landed during
   * backward, is all-gathered now). */
  const int gather_early = d->zero && passes[0] == MTOPT__PASS_UPDATE;
  for (int k = 0; gather_early && k < d->next_done; k++) CHECK(gather_bucket(d, k));
  /* Every collective is issued; each segment's pass waits for its own
   * collective only, so it runs while the later segments are communicated
   * (CPU: the host waits for each in order and steps it). On CUDA the passes
   * go on the steps' stream, which waits for the context's stream first and
   * which the context's stream waits for at the end. */
  CHECK(ops->steps_begin(d->tr));
  mtopt_status_t st = MTOPT_STATUS_SUCCESS;
  for (; st == MTOPT_STATUS_SUCCESS && d->next_done < d->lay.ns; d->next_done++) {
    char what[64];
    snprintf(what, sizeof what, "mtopt_dist_step: bucket %d reduction",
             d->lay.seg[d->next_done].bucket);
    /* Waited for even where the range is empty: the steps end up ordered
     * after every collective of the step. */
    st = ops->wait(d->slots, d->next_done, MTOPT__FOR_STEPS, what);
    if (st == MTOPT_STATUS_SUCCESS) st = after_reduce(d, d->next_done);
    if (st == MTOPT_STATUS_SUCCESS && gather_early)
      st = gather_bucket(d, d->lay.seg[d->next_done].bucket);
  }
  /* Joined even after a failure: the context's stream (and fail_step's
   * reset of the pass counter on it) must come after the passes already
   * enqueued. */
  const mtopt_status_t end = ops->steps_end(d->tr);
  CHECK(st);
  CHECK(end);
  /* The first pass ran per segment as each landed (on an empty plan it runs
   * once here, for its finalisation); the others run whole, after the ranks'
   * statistics where the plan defers them (ZeRO-1's update bucket by bucket,
   * each all-gathered behind it). One pass at a time: the counter that
   * elects a pass's finaliser cannot tell interleaved passes apart. */
  if (d->plan->num_chunks == 0) CHECK(run_all(d, passes[0]));
  if (passes[0] == MTOPT__PASS_STATS && d->plan->defer_stats) CHECK(zero1_stats(d));
  for (int i = 1; i < np; i++)
    CHECK(d->zero && passes[i] == MTOPT__PASS_UPDATE ? update_and_gather(d)
                                                     : run_all(d, passes[i]));
  if (d->zero) CHECK(gather_finish(d));
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_dist_step(mtopt_dist_optimizer_t *d) {
  static const char fn[] = "mtopt_dist_step";
  CHECK(check_usable(d, fn));
  mtopt_status_t st = dist_step(d);
  if (st != MTOPT_STATUS_SUCCESS) return fail_step(d, st);
  memset(d->marked, 0, (size_t)d->lay.nb);
  d->next_start = d->next_done = d->next_back = 0;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt__dist_gather_weights(mtopt_dist_optimizer_t *d) {
  CHECK(d->ops->comm_wait_compute(d->tr));
  for (int k = 0; k < d->lay.nb; k++) CHECK(gather_bucket(d, k));
  CHECK(gather_finish(d));
  d->next_back = 0;
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_dist_synchronize(mtopt_dist_optimizer_t *d) {
  static const char fn[] = "mtopt_dist_synchronize";
  CHECK(check_usable(d, fn));
  const mtopt_status_t st = d->ops->synchronize(d->tr);
  if (st != MTOPT_STATUS_SUCCESS) d->broken = 1;
  return st;
}

/* After segment s's reduction, ZeRO-1's all-gather of its bucket (one
 * segment per bucket). */
static mtopt_status_t gather_after(mtopt_dist_optimizer_t *d, int s, const char *fn) {
  CHECK(d->ops->wait(d->slots, s, MTOPT__FOR_COMM, fn));
  if (!d->zero) return MTOPT_STATUS_SUCCESS;
  const int k = d->lay.seg[s].bucket;
  return d->ops->allgather(d->slots, d->lay.ns + k, stage_at(d, k, 0), d->lay.b[k].slice,
                           d->lay.b[k].pdt, fn);
}

static mtopt_status_t comm_only(mtopt_dist_optimizer_t *d, const char *fn) {
  const int ns = d->lay.ns, ahead = issue_ahead(d, ns);
  CHECK(d->ops->comm_wait_compute(d->tr));
  int landed = 0; /* segments [0, landed) waited for */
  for (int s = 0; s < ns; s++) {
    CHECK(start_segment(d, s));
    for (; landed <= s - ahead; landed++) CHECK(gather_after(d, landed, fn));
  }
  for (; landed < ns; landed++) CHECK(gather_after(d, landed, fn));
  for (int k = 0; k < d->lay.nb; k++) CHECK(d->ops->wait(d->slots, ns + k, MTOPT__FOR_COMM, fn));
  return d->ops->compute_wait_comm(d->tr);
}

mtopt_status_t mtopt__dist_comm_only(mtopt_dist_optimizer_t *d) {
  static const char fn[] = "mtopt__dist_comm_only";
  CHECK(check_usable(d, fn));
  const mtopt_status_t st = comm_only(d, fn);
  return st == MTOPT_STATUS_SUCCESS ? st : fail_step(d, st);
}

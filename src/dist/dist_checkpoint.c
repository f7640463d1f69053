/* Checkpoints of a distributed optimizer (mtopt_dist.h, "Checkpoints").
 * zero_stage 0: every rank holds the same state, so rank 0 saves its inner
 * optimizer's checkpoint and every rank loads that one file. zero_stage 1:
 * each rank saves its shard (its pieces' weights, masters and state) to its
 * own file, and a load on the same world size (the layout must match: the
 * core's checks of the tensor table see to it) restores each rank's shard,
 * then all-gathers the weights. Both are collective: every rank returns the
 * same verdict, and a load writes nothing on any rank unless every rank's
 * file verified and all are of the same step. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dist_internal.h"

/* The file of this rank: the path itself (zero_stage 0), or the path with
 * ".rank<r>-of-<world>" (zero_stage 1); INVALID_ARGUMENT for a NULL path. */
static mtopt_status_t rank_path(const mtopt_dist_optimizer_t *d, const char *fn, const char *path,
                                char **out) {
  *out = NULL;
  if (!path) return mtopt__error(d->ctx, MTOPT_STATUS_INVALID_ARGUMENT, "%s: path is NULL", fn);
  const size_t n = strlen(path) + 40;
  *out = malloc(n);
  if (!*out) return mtopt__error(d->ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: malloc failed", fn);
  if (d->zero)
    snprintf(*out, n, "%s.rank%d-of-%d", path, d->comm->rank, d->comm->world);
  else
    snprintf(*out, n, "%s", path);
  return MTOPT_STATUS_SUCCESS;
}

typedef struct {
  mtopt_dist_optimizer_t *d;
  const char *fn;
  const char *if_other; /* what another rank's failure leaves here */
} agree_t;

/* The verdict over ranks: each one's failure (its status) and step count.
 * A rank's own failure keeps its message; the others name it. */
static mtopt_status_t agree(void *arg, mtopt_status_t local, int64_t step) {
  const agree_t *a = arg;
  mtopt_dist_optimizer_t *d = a->d;
  const int failed = local != MTOPT_STATUS_SUCCESS;
  int64_t v[4] = {failed ? (int64_t)local : 0, failed ? d->comm->rank : -1, step, -step};
  const mtopt_status_t st =
      d->ops->max_i64(d->tr, v, 4, "mtopt_dist_optimizer_save/load (agreement)");
  if (st != MTOPT_STATUS_SUCCESS) {
    d->broken = 1;
    return st;
  }
  if (failed) return local;
  if (v[0] != 0)
    return mtopt__error(d->ctx, (mtopt_status_t)v[0],
                        "%s: rank %lld failed (%s; its own error says why); %s", a->fn,
                        (long long)v[1], mtopt_status_string((mtopt_status_t)v[0]),
                        a->if_other);
  if (step >= 0 && v[2] != -v[3])
    return mtopt__error(d->ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                        "%s: the ranks' shard files are of different steps (%lld to %lld): "
                        "not one checkpoint; nothing was loaded",
                        a->fn, (long long)-v[3], (long long)v[2]);
  return MTOPT_STATUS_SUCCESS;
}

/* What only this rank can know and no collective can report: a NULL or
 * broken optimizer. (A NULL path goes through the agreement, like any other
 * failure of one rank.) */
static mtopt_status_t check_call(mtopt_dist_optimizer_t *d, const char *fn) {
  CHECK(mtopt__dist_check(d, fn));
  if (d->broken)
    return mtopt__error(d->ctx, MTOPT_STATUS_COMM_ERROR,
                        "%s: an earlier collective failed; this distributed optimizer is "
                        "unusable (its inner optimizer can still be saved alone)",
                        fn);
  return MTOPT_STATUS_SUCCESS;
}

mtopt_status_t mtopt_dist_optimizer_save(mtopt_dist_optimizer_t *d, const char *path) {
  static const char fn[] = "mtopt_dist_optimizer_save";
  CHECK(check_call(d, fn));
  char *file = NULL;
  mtopt_status_t st = rank_path(d, fn, path, &file);
  if (st == MTOPT_STATUS_SUCCESS && (d->zero || d->comm->rank == 0))
    st = mtopt_optimizer_save(d->opt, file);
  free(file);
  agree_t a = {d, fn,
               d->zero ? "the set of shard files is incomplete: do not load it"
                       : "the checkpoint was not written"};
  return agree(&a, st, -1);
}

mtopt_status_t mtopt_dist_optimizer_load(mtopt_dist_optimizer_t *d, const char *path) {
  static const char fn[] = "mtopt_dist_optimizer_load";
  CHECK(check_call(d, fn));
  char *file = NULL;
  mtopt_status_t st = rank_path(d, fn, path, &file);
  agree_t a = {d, fn, "nothing was loaded on this rank"};
  if (st == MTOPT_STATUS_SUCCESS)
    st = mtopt__optimizer_load_agreed(d->opt, fn, file, agree, &a);
  else
    st = agree(&a, st, -1);
  free(file);
  CHECK(st);
  /* ZeRO-1: each rank restored its pieces' weights; every rank needs all. */
  if (d->zero) {
    st = mtopt__dist_gather_weights(d);
    if (st != MTOPT_STATUS_SUCCESS) d->broken = 1;
  }
  return st;
}

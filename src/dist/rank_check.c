/* The rank agreement check (dist_internal.h): every rank must have built the
 * same bucket layout, or the collectives would mix unrelated ranges (or hang
 * on different counts). One max-reduction of (x, -x) gives max and min of
 * each fact; a setting that differs is named; where a fact of the tensors
 * differs, a second one over the per-tensor records finds the first
 * differing tensor. Both run on every rank, so every rank reports the same
 * mismatch. */
#include <limits.h>
#include <stdlib.h>

#include "dist_internal.h"

static uint64_t mix(uint64_t h, int64_t v) {
  h ^= (uint64_t)v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
  h *= 0xff51afd7ed558ccdull;
  return h ^ (h >> 33);
}

/* The facts, settings first: a setting that differs is named before any
 * consequence (reduce_f32 moves the gradient offsets: the layer then lays
 * the buffers out). */
enum {
  H_NT, H_ZERO, H_REDUCE, H_BUCKET, H_FIRST, H_KIND, H_CHUNK, H_STATS, H_PREC, H_NB, H_GBUF,
  H_HASH, H_N
};
static const char *const h_names[H_N] = {
    "tensor count", "zero_stage", "reduce_f32", "bucket_bytes", "first_bucket_bytes",
    "optimizer kind",
    "chunk_size", "statistics pass (clipping / loss scaling / skip_nonfinite)",
    "precision (state_dtype / master_weights / rounding)", "bucket count",
    "gradient buffer bytes", "tensor table"};

/* A tensor's dtypes in one number. */
static int64_t dtypes_of(const mtopt_tensor_desc_t *t) {
  return (int64_t)t->param_dtype * 16 + (int64_t)t->grad_dtype;
}

static mtopt_status_t max_over_ranks(mtopt_dist_optimizer_t *d, int64_t *v, int n) {
  return d->ops->max_i64(d->tr, v, n, "mtopt_dist_optimizer_create (plan check)");
}

/* Fact k is between -v[H_N + k] and v[k] across ranks, h[k] here. */
static mtopt_status_t fact_differs(const mtopt_dist_optimizer_t *d, const char *fn, int k,
                                   const int64_t *v, const int64_t *h) {
  return mtopt__error(d->ctx, MTOPT_STATUS_INVALID_ARGUMENT,
                      "%s: the ranks built different plans: %s is between %lld and %lld "
                      "across ranks (this rank, %d: %lld)",
                      fn, h_names[k], (long long)-v[H_N + k], (long long)v[k], d->comm->rank,
                      (long long)h[k]);
}

mtopt_status_t mtopt__dist_rank_agreement(mtopt_dist_optimizer_t *d, const char *fn) {
  mtopt_comm_t *c = d->comm;
  const mtopt__bucket_layout_t *L = &d->lay;
  const mtopt_optimizer_config_t *oc = &d->config;
  int64_t h[H_N];
  uint64_t hash = 0x12345;
  for (int64_t i = 0; i < L->nt; i++) {
    const mtopt_tensor_desc_t *t = mtopt__tensor_list_desc(d->list, i);
    hash = mix(mix(mix(mix(mix(hash, t->numel), L->goff[i]), t->group), (int64_t)t->flags),
               dtypes_of(t));
  }
  h[H_NT] = L->nt;
  h[H_ZERO] = d->zero;
  h[H_REDUCE] = c->cfg.reduce_f32;
  h[H_BUCKET] = (int64_t)c->cfg.bucket_bytes;
  h[H_FIRST] = (int64_t)c->cfg.first_bucket_bytes;
  h[H_KIND] = oc->kind;
  /* the requested size: with ZeRO-1 each rank resolves chunk_size 0 over its
   * own shard, so the sizes in use may differ, harmlessly */
  h[H_CHUNK] = oc->chunk_size;
  h[H_STATS] = d->plan->use_stats;
  h[H_PREC] = (int64_t)oc->state_dtype * 16 + (int64_t)oc->master_weights * 4 + oc->rounding;
  h[H_NB] = L->nb;
  h[H_GBUF] = 0;
  for (int dt = 0; dt < MTOPT__NUM_DTYPES; dt++) h[H_GBUF] += L->gbuf_numel[dt] * mtopt__dt_size(dt);
  h[H_HASH] = (int64_t)(hash >> 2); /* non-negative: -x must not overflow */
  int64_t v[2 * H_N];
  for (int k = 0; k < H_N; k++) {
    v[k] = h[k];
    v[H_N + k] = -h[k];
  }
  CHECK(max_over_ranks(d, v, 2 * H_N));
  int diff = -1;
  for (int k = 0; k < H_N && diff < 0; k++)
    if (v[k] != -v[H_N + k]) diff = k;
  if (diff < 0) return MTOPT_STATUS_SUCCESS;
  /* A setting is named as it is: the tensor records may follow from it. */
  if (diff != H_NT && diff != H_NB && diff != H_GBUF && diff != H_HASH)
    return fact_differs(d, fn, diff, v, h);

  /* Name the first differing tensor among those every rank has. */
  const int64_t nmin = -v[H_N + H_NT];
  const int nrec = 5;
  int64_t *r = malloc((size_t)(2 * nrec * (nmin > 0 ? nmin : 1)) * sizeof *r);
  if (!r) return mtopt__error(c->ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: malloc failed", fn);
  int64_t *mine = malloc((size_t)(nrec * (nmin > 0 ? nmin : 1)) * sizeof *mine);
  if (!mine) {
    free(r);
    return mtopt__error(c->ctx, MTOPT_STATUS_OUT_OF_MEMORY, "%s: malloc failed", fn);
  }
  for (int64_t i = 0; i < nmin; i++) {
    const mtopt_tensor_desc_t *t = mtopt__tensor_list_desc(d->list, i);
    const int64_t rec[5] = {t->numel, L->goff[i], t->group, (int64_t)t->flags, dtypes_of(t)};
    for (int k = 0; k < nrec; k++) {
      mine[i * nrec + k] = rec[k];
      r[i * nrec + k] = rec[k];
      r[nmin * nrec + i * nrec + k] = -rec[k];
    }
  }
  mtopt_status_t st = MTOPT_STATUS_SUCCESS;
  if (nmin > 0 && nmin * 2 * nrec <= INT_MAX) st = max_over_ranks(d, r, (int)(2 * nrec * nmin));
  if (st == MTOPT_STATUS_SUCCESS) {
    static const char *const rec_names[5] = {"numel", "gradient offset", "group", "flags",
                                             "dtypes (param * 16 + grad)"};
    /* Causes before consequences: a size, dtype, group or flags difference is named
     * before any gradient offset, because offsets follow from the sizes (with
     * ZeRO-1 one extra element in tensor 3 can move tensor 0's offset). */
    static const int order[5] = {0, 4, 2, 3, 1};
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
      st = fact_differs(d, fn, diff, v, h);
    }
  }
  free(r);
  free(mine);
  return st;
}

/* Where the library's own arrays go: the state slab (each tensor's moments or
 * momentum buffer and master weights; runs of small tensors array by array)
 * and one contiguous gradient buffer per gradient dtype (for tensors added
 * with grad == NULL), and the tensor records that point into them. One
 * function both counts the bytes (before allocation) and fills the records
 * (after), so the two cannot disagree. */
#include <string.h>

#include "core.h"

int64_t mtopt__place(int64_t off, int elsize, const void *param, int param_elsize) {
  /* i0: the first element at which the parameter is 16-byte aligned. The
   * array gets its 16-byte boundary at the same element, so that one vector
   * path (a scalar prologue of i0 elements) serves every array of a chunk. */
  const int64_t pr = (int64_t)((uintptr_t)param % 16u);
  const int64_t i0 = ((16 - pr) % 16) / param_elsize;
  const int64_t want = ((16 - (i0 * elsize) % 16) % 16); /* off mod 16 */
  const int64_t have = off % 16;
  return off + ((want - have) % 16 + 16) % 16;
}

int64_t mtopt__aligned_offset(int64_t offset, const void *w) {
  return mtopt__place(offset * (int64_t)sizeof(float), (int)sizeof(float), w,
                      (int)sizeof(float)) /
         (int64_t)sizeof(float);
}

int mtopt__master_mode(const mtopt_optimizer_config_t *c, mtopt_dtype_t param_dtype) {
  return param_dtype == MTOPT_DTYPE_F32 ? MTOPT__MASTER_NONE : (int)c->master_weights;
}

static int master_bytes(int mode) {
  return mode == MTOPT__MASTER_F32 ? 4 : mode == MTOPT__MASTER_REMAINDER ? 2 : 0;
}

/* Tensor i's record before its arrays are placed: the caller's pointers
 * (grad NULL: the library's buffer), no state, no chunks. */
static mtopt__tensor_rec_t rec_of(const mtopt_tensor_desc_t *d,
                                  const mtopt_optimizer_config_t *c, int64_t i) {
  mtopt__tensor_rec_t r;
  memset(&r, 0, sizeof r);
  r.w = d->param;
  r.g = d->grad;
  r.numel = d->numel;
  r.sr_tensor = (int32_t)i;
  r.group = d->group;
  r.flags = d->flags;
  r.wdt = (uint8_t)d->param_dtype;
  r.gdt = (uint8_t)d->grad_dtype;
  r.sdt = (uint8_t)c->state_dtype;
  r.mmode = (uint8_t)mtopt__master_mode(c, d->param_dtype);
  return r;
}

void mtopt__layout(const mtopt_tensor_list_t *list, const mtopt_optimizer_config_t *c,
                   int nstate, const int64_t *order, int runs, char *slab,
                   char *const grads[MTOPT__NUM_DTYPES], mtopt__tensor_rec_t *recs,
                   mtopt__layout_t *size) {
  const int se = mtopt__dt_size(c->state_dtype);
  for (int64_t i = 0; recs && i < list->count; i++) {
    const int64_t first = recs[i].first_chunk, nch = recs[i].num_chunks; /* the chunk table's */
    recs[i] = rec_of(&list->items[i].desc, c, i);
    recs[i].first_chunk = first;
    recs[i].num_chunks = nch;
  }
  /* The slab, run by run: the tensors that core/segments.c's rule would join
   * on their parameters and gradients (the state not placed yet: NULL in
   * both) get their first state arrays at the parameters' distances, gaps
   * and all, then their second ones, so that the segments can step them as
   * one; any other tensor keeps its m, v and master side by side, which DRAM
   * serves better on large tensors (ViT-H: 0.97 of a copy, 0.92 with every
   * tensor's m before every v; docs/perf_notes_small.md, v11). With grad
   * NULL the run's gradients go in the library's buffer at the same
   * distances. */
  int64_t soff = 0, goff[MTOPT__NUM_DTYPES] = {0, 0, 0};
#define DESC(j) (&list->items[order ? order[j] : (j)].desc)
  for (int64_t j0 = 0, j1; j0 < list->count; j0 = j1) {
    mtopt__tensor_rec_t run = rec_of(DESC(j0), c, 0);
    const int joinable = runs && mtopt__segment_member(&run);
    for (j1 = j0 + 1; j1 < list->count; j1++) {
      const mtopt_tensor_desc_t *d = DESC(j1);
      if (d->numel == 0) continue; /* no state: in any run */
      const mtopt__tensor_rec_t t = rec_of(d, c, 0);
      const int64_t tg = joinable ? mtopt__segment_gap(&run, &t, runs == MTOPT__RUNS_GAPS) : -1;
      if (tg < 0) break;
      run.numel += tg + t.numel;
    }
    /* Array a of the run (a == nstate: the masters; a == nstate + 1: the
     * library's gradients), each member at its parameter's distance from
     * the first member's. */
    for (int a = 0; a <= nstate + 1; a++) {
      const void *w0 = NULL;
      int64_t base = 0;
      for (int64_t j = j0; j < j1; j++) {
        const int64_t i = order ? order[j] : j;
        const mtopt_tensor_desc_t *d = DESC(j);
        const int pe = mtopt__dt_size(d->param_dtype);
        const int eb = a < nstate    ? se
                       : a == nstate ? master_bytes(mtopt__master_mode(c, d->param_dtype))
                       : d->grad     ? 0
                                     : mtopt__dt_size(d->grad_dtype);
        if (d->numel == 0 || eb == 0) continue;
        int64_t *off = a <= nstate ? &soff : &goff[d->grad_dtype];
        if (!w0) {
          w0 = d->param;
          base = mtopt__place(*off, eb, d->param, pe);
        }
        const int64_t at = base + (int64_t)(((uintptr_t)d->param - (uintptr_t)w0) / (uintptr_t)pe) * eb;
        char *mem = a <= nstate ? slab : grads ? grads[d->grad_dtype] : NULL;
        if (mem) {
          char *q = mem + at;
          if (a == nstate + 1) recs[i].g = (float *)q;
          else if (a == nstate) recs[i].mw = q;
          else if (a == 0) recs[i].s0 = (float *)q;
          else recs[i].s1 = (float *)q;
        }
        *off = at + d->numel * eb;
      }
    }
  }
#undef DESC
  size->slab = soff;
  for (int k = 0; k < MTOPT__NUM_DTYPES; k++) size->grads[k] = goff[k];
}

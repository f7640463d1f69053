/* The CPU backend's passes over a chunk of any dtype combination (plan.h:
 * !all_f32): one element at a time through common/step_elem.h, which the CUDA
 * kernels' mixed path calls too (AdamW, Adam and SGD updates and the
 * statistics pass go in tiles: cpu_tiles.c). The dtypes are uniform over a chunk, so the
 * branches inside the element functions always go the same way. */
#include "../../common/step_elem.h"
#include "cpu_kernels.h"
#include "cpu_mixed.h"

MTOPT__CPU_CLONES
void mtopt__cpu_update_mixed(const mtopt__plan_t *p, const mtopt__hyper_t *h,
                             const mtopt__scalars_t *s, int64_t c) {
  if (p->kind != MTOPT__KIND_LAMB) { /* AdamW, Adam, SGD: in tiles (cpu_tiles.c) */
    mtopt__cpu_update_tiles(p, h, s, c);
    return;
  }
  const mtopt__chunk_rec_t ch = p->chunks[c];
  const mtopt__tensor_rec_t *t = &p->tensors[ch.tensor];
  const mtopt__sr_t sr = mtopt__sr_for(p, h, t);
  mtopt__sum_t wl[MTOPT__CPU_LANES] = {0.0}, ul[MTOPT__CPU_LANES] = {0.0};
  for (int32_t i = 0; i < ch.len; i++)
    mtopt__update_elem(p->kind, s, &sr, t, ch.start + i, &wl[i % MTOPT__CPU_LANES],
                       &ul[i % MTOPT__CPU_LANES]);
  if (p->kind == MTOPT__KIND_LAMB) {
    p->slot_wsq[c] = mtopt__cpu_fold(wl);
    p->slot_usq[c] = mtopt__cpu_fold(ul);
  }
}

MTOPT__CPU_CLONES
void mtopt__cpu_lamb_apply_mixed(const mtopt__plan_t *p, const mtopt__hyper_t *h,
                                 const mtopt__scalars_t *s, int64_t c, float step) {
  const mtopt__chunk_rec_t ch = p->chunks[c];
  const mtopt__tensor_rec_t *t = &p->tensors[ch.tensor];
  const mtopt__sr_t sr = mtopt__sr_for(p, h, t);
  for (int32_t i = 0; i < ch.len; i++) mtopt__lamb_apply_elem(s, &sr, t, ch.start + i, step);
}

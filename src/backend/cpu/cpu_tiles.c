/* The CPU backend's UPDATE pass of AdamW, Adam and SGD over a mixed-precision
 * chunk, in tiles: each array of a tile of TILE elements is widened to fp32
 * by a loop of its own dtype, the fp32 formula runs over the tile (vectorised,
 * as the all-F32 loops), and the results are rounded back by a loop of each
 * array's dtype. The arithmetic per element is step_elem.h's, operation for
 * operation (the formulas of step_math.h, dtype.h's conversions and rounding,
 * the same stochastic-rounding draws), so the bits are those of the element
 * path and of the CUDA kernels; only the order of the work differs. (The
 * segments with gaps of core/segments.c are fp32: backend_cpu.c runs them in
 * place, each run of tensor elements as a chunk of its own.) */
#include <string.h>

#include "../../common/step_elem.h"
#include "cpu_kernels.h"
#include "cpu_mixed.h"

enum { TILE = 512 }; /* a multiple of MTOPT__CPU_LANES */

/* x[k] = element e0 + k of an array of dtype dt. */
MTOPT__CPU_CLONES
static void widen(const void *p, int dt, int64_t e0, int32_t n, float *restrict x) {
  if (dt == MTOPT__DT_F32) {
    memcpy(x, (const float *)p + e0, (size_t)n * sizeof(float));
  } else if (dt == MTOPT__DT_BF16) {
    const uint16_t *restrict h = (const uint16_t *)p + e0;
#pragma omp simd
    for (int32_t k = 0; k < n; k++) x[k] = mtopt__bf16_to_f32(h[k]);
  } else {
    const uint16_t *restrict h = (const uint16_t *)p + e0;
    for (int32_t k = 0; k < n; k++) x[k] = mtopt__f16_to_f32(h[k]);
  }
}

/* Element e0 + k := x[k] rounded for dt (mtopt__st): BF16 stochastically
 * from MTOPT__SR_BITS(r[k], shift) when sr. */
MTOPT__CPU_CLONES
static void narrow(void *p, int dt, int64_t e0, int32_t n, const float *restrict x, int sr,
                   const uint32_t *restrict r, int shift) {
  if (dt == MTOPT__DT_F32) {
    memcpy((float *)p + e0, x, (size_t)n * sizeof(float));
  } else if (dt == MTOPT__DT_BF16) {
    /* The roundings of non-NaN values over the whole tile, and the tile
     * again through the NaN-aware functions where it holds a NaN. */
    uint16_t *restrict h = (uint16_t *)p + e0;
    int nan = 0;
    if (sr) {
#pragma omp simd reduction(| : nan)
      for (int32_t k = 0; k < n; k++) {
        const uint32_t b = mtopt__f32_bits(x[k]);
        nan |= mtopt__f32_bits_nan(b);
        h[k] = mtopt__bf16_sr_bits(b, MTOPT__SR_BITS(r[k], shift));
      }
    } else {
#pragma omp simd reduction(| : nan)
      for (int32_t k = 0; k < n; k++) {
        const uint32_t b = mtopt__f32_bits(x[k]);
        nan |= mtopt__f32_bits_nan(b);
        h[k] = mtopt__bf16_rne_bits(b);
      }
    }
    for (int32_t k = 0; nan && k < n; k++)
      h[k] = sr ? mtopt__f32_to_bf16_sr(x[k], MTOPT__SR_BITS(r[k], shift)) : mtopt__f32_to_bf16(x[k]);
  } else {
    uint16_t *restrict h = (uint16_t *)p + e0;
    for (int32_t k = 0; k < n; k++) h[k] = mtopt__f32_to_f16(x[k]);
  }
}

/* The weights of a tile: the master where there is one (mtopt__ld_weight). */
MTOPT__CPU_CLONES
static void widen_weight(const mtopt__tensor_rec_t *t, int64_t e0, int32_t n,
                         float *restrict w) {
  if (t->mmode == MTOPT__MASTER_F32) {
    widen(t->mw, MTOPT__DT_F32, e0, n, w);
  } else if (t->mmode == MTOPT__MASTER_REMAINDER) {
    const uint16_t *restrict p = (const uint16_t *)t->w + e0, *restrict q = (const uint16_t *)t->mw + e0;
#pragma omp simd
    for (int32_t k = 0; k < n; k++) w[k] = mtopt__join_master(p[k], q[k]);
  } else {
    widen(t->w, t->wdt, e0, n, w);
  }
}

/* mtopt__st_weight for a tile. */
static void narrow_weight(const mtopt__tensor_rec_t *t, int64_t e0, int32_t n,
                          const float *restrict w, int sr, const uint32_t *restrict r) {
  if (t->mmode == MTOPT__MASTER_F32) {
    narrow(t->mw, MTOPT__DT_F32, e0, n, w, 0, r, 0);
    narrow(t->w, t->wdt, e0, n, w, 0, r, 0);
  } else if (t->mmode == MTOPT__MASTER_REMAINDER) {
    uint16_t *restrict p = (uint16_t *)t->w + e0, *restrict q = (uint16_t *)t->mw + e0;
    for (int32_t k = 0; k < n; k++) mtopt__split_master(w[k], &p[k], &q[k]);
  } else {
    narrow(t->w, t->wdt, e0, n, w, sr, r, MTOPT__SR_SHIFT_W);
  }
}

/* The tile's stochastic-rounding draws (mtopt__draws): pm one hash per
 * element, vv the half of a pair's hash (dtype.h: mtopt__sr_bits_v), each
 * pair hashed once. */
MTOPT__CPU_CLONES
static void draws(const mtopt__sr_t *sr, int64_t e, int32_t n, uint32_t *restrict pm,
                  uint32_t *restrict vv) {
  const uint32_t kp = sr->pm, kv = sr->v;
  const uint32_t w0 = mtopt__sr_weyl(e), e0 = (uint32_t)e;
  const uint32_t q0 = mtopt__sr_weyl(e >> 1), p0 = (uint32_t)(e >> 1);
#pragma omp simd
  for (int32_t k = 0; k < n; k++) pm[k] = mtopt__sr_mix(kp, mtopt__sr_weyl_at(w0, e0, (uint32_t)k));
  /* Pair j of the tile is pair (e >> 1) + j of the tensor; element k of the
   * tile takes half (e + k) & 1 of pair (e + k) >> 1 (whole: SR_BITS masks). */
  const int32_t odd = (int32_t)(e & 1), pairs = (odd + n + 1) / 2;
  uint32_t d[TILE / 2 + 1];
#pragma omp simd
  for (int32_t j = 0; j < pairs; j++) d[j] = mtopt__sr_mix(kv, mtopt__sr_weyl_at(q0, p0, (uint32_t)j));
  if (odd) vv[0] = d[0] >> 16;
  const uint32_t *restrict dd = d + odd;
  uint32_t *restrict v = vv + odd;
  const int32_t m = n - odd;
#pragma omp simd
  for (int32_t j = 0; j < m / 2; j++) {
    v[2 * j] = dd[j];
    v[2 * j + 1] = dd[j] >> 16;
  }
  if (m & 1) v[m - 1] = dd[m / 2];
}

/* The formulas over a tile, as the all-F32 loops run them. */
MTOPT__CPU_CLONES
static void adam_tile(const mtopt__scalars_t s, int decoupled, float *restrict w,
                      const float *restrict g, float *restrict m, float *restrict v, int32_t n) {
#pragma omp simd
  for (int32_t k = 0; k < n; k++) mtopt__adam_elem(&s, decoupled, g[k], &w[k], &m[k], &v[k]);
}

MTOPT__CPU_CLONES
static void sgd_tile(const mtopt__scalars_t s, float *restrict w, const float *restrict g,
                     float *restrict b, int32_t n) {
#pragma omp simd
  for (int32_t k = 0; k < n; k++) mtopt__sgd_elem(&s, g[k], &w[k], &b[k]);
}

/* The statistics of a chunk of 16-bit gradients: tiles widened, then summed
 * as fp32 gradients are (TILE is a multiple of the lanes). */
void mtopt__cpu_stats_tiles(const mtopt__plan_t *p, int64_t c, float inv,
                            mtopt__cpu_stats_t *st) {
  const mtopt__chunk_rec_t ch = p->chunks[c];
  const mtopt__tensor_rec_t *t = &p->tensors[ch.tensor];
  float g[TILE];
  for (int32_t i = 0; i < ch.len; i += TILE) {
    const int32_t n = ch.len - i < TILE ? ch.len - i : TILE;
    widen(t->g, t->gdt, ch.start + i, n, g);
    mtopt__cpu_sumsq(g, n, inv, st);
  }
}

void mtopt__cpu_update_tiles(const mtopt__plan_t *p, const mtopt__hyper_t *h,
                             const mtopt__scalars_t *s, int64_t c) {
  const mtopt__chunk_rec_t ch = p->chunks[c];
  const mtopt__tensor_rec_t *t = &p->tensors[ch.tensor];
  const mtopt__sr_t sr = mtopt__sr_for(p, h, t);
  const int adam = p->kind == MTOPT__KIND_ADAMW || p->kind == MTOPT__KIND_ADAM;
  const int buf = !adam && s->momentum != 0.0f; /* SGD with a momentum buffer */
  float w[TILE], g[TILE], m[TILE], v[TILE];
  uint32_t pm[TILE], vv[TILE];
  memset(pm, 0, sizeof pm);
  memset(vv, 0, sizeof vv);
  for (int32_t i = 0; i < ch.len; i += TILE) {
    const int32_t n = ch.len - i < TILE ? ch.len - i : TILE;
    const int64_t e0 = ch.start + i;
    widen(t->g, t->gdt, e0, n, g);
    widen_weight(t, e0, n, w);
    if (sr.on) draws(&sr, t->sr_elem0 + e0, n, pm, vv);
    if (adam || buf) widen(t->s0, t->sdt, e0, n, m);
    else memset(m, 0, (size_t)n * sizeof(float));
    if (adam) {
      widen(t->s1, t->sdt, e0, n, v);
      adam_tile(*s, p->kind == MTOPT__KIND_ADAMW, w, g, m, v, n);
    } else {
      sgd_tile(*s, w, g, m, n);
    }
    narrow_weight(t, e0, n, w, sr.on, pm);
    if (adam || buf) narrow(t->s0, t->sdt, e0, n, m, sr.on, pm, MTOPT__SR_SHIFT_S0);
    if (adam) narrow(t->s1, t->sdt, e0, n, v, sr.on, vv, MTOPT__SR_SHIFT_S1);
  }
}

/* The CPU backend: the same chunk table in host memory, OpenMP over chunks,
 * inner loops the compiler vectorises. The formulas come from step_math.h,
 * shared with the CUDA backend. Built without -ffast-math and with
 * -ffp-contract=off, so the only fused multiply-adds are the explicit fmaf()s. */
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#include "../../common/dtype.h"
#include "../../common/step_math.h"
#include "../backend.h"
#include "cpu_kernels.h"
#include "cpu_mixed.h"

static void cpu_fini(mtopt_context_t *ctx) { (void)ctx; }

static mtopt_status_t cpu_alloc(mtopt_context_t *ctx, size_t bytes, void **out) {
  const size_t rounded = (bytes + 255) / 256 * 256;
  void *p = aligned_alloc(256, rounded ? rounded : 256);
  if (!p)
    return mtopt__error(ctx, MTOPT_STATUS_OUT_OF_MEMORY,
                        "cannot allocate %zu bytes of host memory", bytes);
  memset(p, 0, rounded ? rounded : 256);
  *out = p;
  return MTOPT_STATUS_SUCCESS;
}

static void cpu_release(mtopt_context_t *ctx, void *p) {
  (void)ctx;
  free(p);
}

static mtopt_status_t cpu_copy(mtopt_context_t *ctx, void *dst, const void *src, size_t n) {
  (void)ctx;
  if (n) memmove(dst, src, n);
  return MTOPT_STATUS_SUCCESS;
}

static mtopt_status_t cpu_zero(mtopt_context_t *ctx, void *dst, size_t n) {
  (void)ctx;
  memset(dst, 0, n);
  return MTOPT_STATUS_SUCCESS;
}

static mtopt_status_t cpu_check_pointer(mtopt_context_t *ctx, const void *p, size_t n,
                                        const char *what, int64_t tensor) {
  (void)ctx, (void)p, (void)n, (void)what, (void)tensor;
  return MTOPT_STATUS_SUCCESS; /* host memory cannot be checked cheaply */
}

static mtopt_status_t cpu_sync(mtopt_context_t *ctx) {
  (void)ctx;
  return MTOPT_STATUS_SUCCESS;
}

static int cpu_threads(const mtopt_context_t *ctx) {
#ifdef _OPENMP
  const int n = mtopt__context_num_threads(ctx);
  return n > 0 ? n : omp_get_max_threads();
#else
  (void)ctx;
  return 1;
#endif
}

/* Whether a pass runs on the calling thread alone: one thread asked for, or
 * inside a parallel region whose nested regions would get one thread anyway.
 * A region of one thread still costs libgomp a team allocation (teams of one
 * are not cached), so it is not entered. */
static int cpu_serial(int nt) {
#ifdef _OPENMP
  return nt <= 1 || omp_get_active_level() >= omp_get_max_active_levels();
#else
  (void)nt;
  return 1;
#endif
}

/* The OpenMP runtime cannot report failure: libgomp prints "Out of memory
 * allocating N bytes" (or "Thread creation failed") and exits the process
 * when it cannot allocate its thread pool, a team or a thread. It allocates
 * them at the first parallel region of a thread count on a calling thread
 * and keeps the last team for the next region of the same count. So the
 * context runs one empty region of its thread count here: the pool, the team
 * and the threads are made at mtopt_context_create, and a step on the same
 * thread reuses them without allocating. If they cannot be made, the process
 * still exits, here, inside libgomp: no call can turn that into a status.
 * What this does not cover: a step from another host thread than the
 * creating one (its first region makes that thread's pool and team), and
 * regions of another thread count run in between on the same thread (they
 * replace the kept team). */
static mtopt_status_t cpu_init(mtopt_context_t *ctx) {
  const int nt = cpu_threads(ctx);
  if (cpu_serial(nt)) return MTOPT_STATUS_SUCCESS;
#pragma omp parallel num_threads(nt)
  { __asm__ volatile("" ::: "memory"); /* an empty region the compiler keeps */ }
  return MTOPT_STATUS_SUCCESS;
}

/* ---- passes over one chunk ---- */

MTOPT__CPU_CLONES
void mtopt__cpu_sumsq(const float *restrict x, int32_t n, float inv,
                      mtopt__cpu_stats_t *restrict st) {
  mtopt__sum_t sq[MTOPT__CPU_LANES]; /* in registers across the loop */
  uint32_t bad[MTOPT__CPU_LANES];
  memcpy(sq, st->sq, sizeof sq);
  memcpy(bad, st->bad, sizeof bad);
  int32_t i = 0;
  for (; i + MTOPT__CPU_LANES <= n; i += MTOPT__CPU_LANES) {
#pragma omp simd
    for (int32_t j = 0; j < MTOPT__CPU_LANES; j++) {
      const float y = x[i + j] * inv;
      sq[j] += (mtopt__sum_t)y * y;
      bad[j] += !isfinite(y);
    }
  }
  for (int32_t j = 0; i < n; i++, j++) {
    const float y = x[i] * inv;
    sq[j] += (mtopt__sum_t)y * y;
    bad[j] += !isfinite(y);
  }
  memcpy(st->sq, sq, sizeof sq);
  memcpy(st->bad, bad, sizeof bad);
}

/* Adds the n gradients at x, the first of them element `pos` of its chunk,
 * to the lanes as mtopt__cpu_sumsq over the whole chunk would: the head up
 * to the next lane 0 one at a time, the rest from lane 0. */
static void sumsq_at(const float *x, int32_t n, int64_t pos, float inv,
                     mtopt__cpu_stats_t *st) {
  const int lane = (int)(pos % MTOPT__CPU_LANES);
  int32_t head = (MTOPT__CPU_LANES - lane) % MTOPT__CPU_LANES;
  if (head > n) head = n;
  for (int32_t k = 0; k < head; k++) {
    const float y = x[k] * inv;
    st->sq[lane + k] += (mtopt__sum_t)y * y;
    st->bad[lane + k] += !isfinite(y);
  }
  mtopt__cpu_sumsq(x + head, n - head, inv, st);
}

/* The chunk's statistics slots: fp32 gradients summed in place, run by run
 * (one run without gaps; a gap would add 0, so skipping it keeps the bits),
 * others widened in tiles (cpu_tiles.c), so that every dtype sums alike. */
static void stats_chunk(const mtopt__plan_t *p, int64_t c, float inv) {
  const mtopt__chunk_rec_t ch = p->chunks[c];
  mtopt__cpu_stats_t st;
  memset(&st, 0, sizeof st);
  if (!p->all_f32) {
    mtopt__cpu_stats_tiles(p, c, inv, &st);
  } else {
    const float *g = p->tensors[ch.tensor].g;
    const uint32_t *mask = mtopt__mask_of(p, ch.tensor);
    int64_t a, b = ch.start;
    while (mtopt__cpu_next_run(mask, b, ch.start + ch.len, &a, &b))
      sumsq_at(g + a, (int32_t)(b - a), a - ch.start, inv, &st);
  }
  uint32_t bad = 0;
  for (int j = 0; j < MTOPT__CPU_LANES; j++) bad += st.bad[j];
  p->slot_gsq[c] = mtopt__cpu_fold(st.sq);
  p->slot_nonfinite[c] = bad;
}

static inline void adam_loop(const mtopt__scalars_t *s, const int decoupled,
                             float *restrict w, const float *restrict g,
                             float *restrict m, float *restrict v, int32_t n) {
#pragma omp simd
  for (int32_t i = 0; i < n; i++) {
    float wi = w[i], mi = m[i], vi = v[i];
    mtopt__adam_elem(s, decoupled, g[i], &wi, &mi, &vi);
    w[i] = wi;
    m[i] = mi;
    v[i] = vi;
  }
}

/* The cloned loops take the scalars by value and each variant as its own
 * function, so that every branch of the formula is invariant and known: an
 * if-converted fmaf needs AVX-512's masks, and the AVX+FMA clone would stay
 * scalar. */
MTOPT__CPU_CLONES
static void adamw_chunk(const mtopt__scalars_t s, float *restrict w, const float *restrict g,
                        float *restrict m, float *restrict v, int32_t n) {
  adam_loop(&s, 1, w, g, m, v, n);
}

MTOPT__CPU_CLONES
static void adam_chunk(const mtopt__scalars_t s, float *restrict w, const float *restrict g,
                       float *restrict m, float *restrict v, int32_t n) {
  adam_loop(&s, 0, w, g, m, v, n);
}

MTOPT__CPU_CLONES
static void sgd_chunk(const mtopt__scalars_t s, float *restrict w, const float *restrict g,
                      float *restrict b, int32_t n) {
  if (b) { /* the tensor has a buffer (mtopt__chunk_scalars) */
#pragma omp simd
    for (int32_t i = 0; i < n; i++) {
      float wi = w[i], bi = b[i];
      mtopt__sgd_elem(&s, g[i], &wi, &bi);
      w[i] = wi;
      b[i] = bi;
    }
  } else {
#pragma omp simd
    for (int32_t i = 0; i < n; i++) {
      float wi = w[i], unused = 0.0f;
      mtopt__sgd_elem(&s, g[i], &wi, &unused);
      w[i] = wi;
    }
  }
}

MTOPT__CPU_CLONES
static void lamb_apply_loop(const mtopt__scalars_t s, const float step, float *restrict w,
                            const float *restrict m, const float *restrict v, int32_t n) {
#pragma omp simd
  for (int32_t i = 0; i < n; i++)
    w[i] = fmaf(-step, mtopt__lamb_dir(&s, w[i], m[i], v[i]), w[i]);
}

/* LAMB's first pass: the new moments, and the chunk's sums of w^2 and u^2 in
 * MTOPT__CPU_LANES partial sums (cpu_kernels.h). */

MTOPT__CPU_CLONES
static void lamb_moments_loop(const mtopt__scalars_t s, const float *restrict w,
                              const float *restrict g, float *restrict m, float *restrict v,
                              int32_t n, mtopt__sum_t *wsq_out, mtopt__sum_t *usq_out) {
  mtopt__sum_t wl[MTOPT__CPU_LANES] = {0.0}, ul[MTOPT__CPU_LANES] = {0.0};
  int32_t i = 0;
  for (; i + MTOPT__CPU_LANES <= n; i += MTOPT__CPU_LANES) {
#pragma omp simd
    for (int32_t j = 0; j < MTOPT__CPU_LANES; j++) {
      float mi = m[i + j], vi = v[i + j];
      const float wi = w[i + j];
      const float u = mtopt__lamb_moments_elem(&s, g[i + j], wi, &mi, &vi);
      m[i + j] = mi;
      v[i + j] = vi;
      wl[j] += (mtopt__sum_t)wi * wi;
      ul[j] += (mtopt__sum_t)u * u;
    }
  }
  for (int32_t j = 0; i < n; i++, j++) {
    float mi = m[i], vi = v[i];
    const float wi = w[i];
    const float u = mtopt__lamb_moments_elem(&s, g[i], wi, &mi, &vi);
    m[i] = mi;
    v[i] = vi;
    wl[j] += (mtopt__sum_t)wi * wi;
    ul[j] += (mtopt__sum_t)u * u;
  }
  *wsq_out = mtopt__cpu_fold(wl);
  *usq_out = mtopt__cpu_fold(ul);
}

/* Elements [e, e + n) of an all-F32 record: AdamW, Adam and SGD are element
 * by element, so any span gives the same bits. */
static void update_span(const mtopt__plan_t *p, const mtopt__tensor_rec_t *t,
                        const mtopt__scalars_t s, int64_t e, int32_t n) {
  float *restrict w = t->w + e;
  const float *restrict g = t->g + e;
  switch (p->kind) {
  case MTOPT__KIND_ADAMW:
    adamw_chunk(s, w, g, t->s0 + e, t->s1 + e, n);
    break;
  case MTOPT__KIND_ADAM:
    adam_chunk(s, w, g, t->s0 + e, t->s1 + e, n);
    break;
  default:
    sgd_chunk(s, w, g, s.momentum != 0.0f ? t->s0 + e : NULL, n);
    break;
  }
}

static void update_chunk(const mtopt__plan_t *p, const mtopt__hyper_t *h, int64_t c) {
  const mtopt__chunk_rec_t ch = p->chunks[c];
  const mtopt__tensor_rec_t *t = &p->tensors[ch.tensor];
  const mtopt__scalars_t s = mtopt__chunk_scalars(h, &p->groups[t->group], t);
  if (!p->all_f32) {
    mtopt__cpu_update_mixed(p, h, &s, c);
  } else if (p->kind == MTOPT__KIND_LAMB) { /* LAMB keeps its tensors: no masks */
    lamb_moments_loop(s, t->w + ch.start, t->g + ch.start, t->s0 + ch.start, t->s1 + ch.start,
                      ch.len, &p->slot_wsq[c], &p->slot_usq[c]);
  } else { /* in place, run by run (a segment with gaps; one run without) */
    const uint32_t *mask = mtopt__mask_of(p, ch.tensor);
    int64_t a, b = ch.start;
    while (mtopt__cpu_next_run(mask, b, ch.start + ch.len, &a, &b))
      update_span(p, t, s, a, (int32_t)(b - a));
  }
}

/* LAMB's second pass: the tensor's norms from its chunk slots (in chunk order),
 * then w -= lr * trust * u with u recomputed from the new moments. */
static void lamb_apply_chunk(const mtopt__plan_t *p, const mtopt__hyper_t *h, int64_t c) {
  const mtopt__chunk_rec_t ch = p->chunks[c];
  const mtopt__tensor_rec_t *t = &p->tensors[ch.tensor];
  const mtopt__scalars_t s = mtopt__chunk_scalars(h, &p->groups[t->group], t);
  mtopt__sum_t wsq = 0.0, usq = 0.0;
  for (int64_t k = t->first_chunk; k < t->first_chunk + t->num_chunks; k++) {
    wsq += p->slot_wsq[k];
    usq += p->slot_usq[k];
  }
  const float step = mtopt__lamb_step(h, &s, wsq, usq);
  if (!p->all_f32) {
    mtopt__cpu_lamb_apply_mixed(p, h, &s, c, step);
    return;
  }
  lamb_apply_loop(s, step, t->w + ch.start, t->s0 + ch.start, t->s1 + ch.start, ch.len);
}

static void run_chunk(const mtopt__plan_t *p, const mtopt__hyper_t *h, mtopt__pass_t pass,
                      float inv, int64_t c) {
  if (pass == MTOPT__PASS_STATS)
    stats_chunk(p, c, inv);
  else if (pass == MTOPT__PASS_UPDATE)
    update_chunk(p, h, c);
  else
    lamb_apply_chunk(p, h, c);
}

/* Allocates nothing: the chunk loops use the stack, and the parallel region
 * reuses the team cpu_init made (see there). */
static mtopt_status_t cpu_run_pass(mtopt_context_t *ctx, const mtopt__plan_t *p,
                                   mtopt__pass_t pass, int64_t c0, int64_t c1,
                                   void *const *stream) {
  (void)stream;
  mtopt__hyper_t *h = p->hyper;
  const int nt = cpu_threads(ctx);
  const float inv = pass == MTOPT__PASS_STATS ? mtopt__inv_loss_scale(h) : 0.0f;
  if (pass == MTOPT__PASS_STATS || !h->skip) {
    if (cpu_serial(nt)) {
      for (int64_t c = c0; c < c1; c++) run_chunk(p, h, pass, inv, c);
    } else {
#pragma omp parallel for schedule(static) num_threads(nt)
      for (int64_t c = c0; c < c1; c++) run_chunk(p, h, pass, inv, c);
    }
  }
  h->chunks_done += (uint32_t)(c1 - c0);
  if (h->chunks_done < p->num_chunks) return MTOPT_STATUS_SUCCESS;
  h->chunks_done = 0;
  if (pass == MTOPT__PASS_STATS) {
    /* Fixed order: the same sum on every run. */
    double sumsq = 0.0;
    uint64_t bad = 0;
    for (int64_t c = 0; c < p->num_chunks; c++) {
      sumsq += p->slot_gsq[c];
      bad += p->slot_nonfinite[c];
    }
    if (p->defer_stats) { /* the caller adds the other ranks' sums (plan.h) */
      p->stats_sum[0] = sumsq;
      p->stats_sum[1] = (double)bad;
    } else {
      mtopt__stats_finalize(h, sumsq, bad);
    }
  } else if (mtopt__pass_ends_step(p, pass)) {
    mtopt__step_commit(p, h);
  }
  return MTOPT_STATUS_SUCCESS;
}

/* Runs on the calling thread below 64 K elements: a parallel region costs
 * more than it saves there. */
static mtopt_status_t cpu_widen(mtopt_context_t *ctx, float *dst, const void *src, int dt,
                                int64_t n, void *const *stream) {
  (void)stream;
  const int nt = cpu_threads(ctx);
  if (cpu_serial(nt) || n < 65536) {
    for (int64_t i = 0; i < n; i++) dst[i] = mtopt__ld(src, dt, i);
  } else {
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t i = 0; i < n; i++) dst[i] = mtopt__ld(src, dt, i);
  }
  return MTOPT_STATUS_SUCCESS;
}

static mtopt_status_t cpu_finish_stats(mtopt_context_t *ctx, const mtopt__plan_t *p) {
  (void)ctx;
  mtopt__stats_finalize(p->hyper, p->stats_sum[0], (uint64_t)p->stats_sum[1]);
  return MTOPT_STATUS_SUCCESS;
}

const mtopt__backend_ops_t mtopt__cpu_ops = {
    .name = "cpu",
    .mixed_precision = 1,
    .init = cpu_init,
    .fini = cpu_fini,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .upload = cpu_copy,
    .download = cpu_copy,
    .write_ordered = cpu_copy,
    .zero_ordered = cpu_zero,
    .check_pointer = cpu_check_pointer,
    .run_pass = cpu_run_pass,
    .synchronize = cpu_sync,
    .finish_stats = cpu_finish_stats,
    .widen = cpu_widen,
};

/* Segments (core/segments.c; the rule on records alone is segment_rule.c):
 * optimizers over tensors that lie back to back in one buffer, or pooled,
 * each at its own 256-byte start of one buffer (which merge, the second with
 * gaps), against the same tensors each in its own allocation at the same
 * 16-byte residue (which do not): weights and state bit for bit after
 * every step, the gradient norm to a float ulp (summed over the segments'
 * chunks: on the CPU, their slots are checked), for AdamW, Adam and SGD with
 * groups, no-decay tensors, empty tensors, a large tensor amid small ones, clipping and a
 * loss scale, both chunk sizes, an lr change mid-run; on CUDA also from a
 * captured graph. Tables whose tensors are not small on average merge back
 * to back tensors only, and keep pooled ones apart; LAMB and low-precision
 * tables keep their tensors, packed or pooled. Tensors each in its own
 * allocation of its exact size merge where the allocator put them close:
 * their gaps are other allocations' memory, which ASan (the cpu label under
 * tools/test.sh) and compute-sanitizer's memcheck (gpu_run.sh) guard. CPU
 * backend; MTOPT_TEST_BACKEND=cuda runs it on CUDA. */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "core/core.h"
#include "test_util.h"
#ifdef MTOPT_HAVE_CUDA
#include "mtopt/mtopt_cuda.h"
#endif

/* ------------------------------------------------ packed against apart -- */

enum { NT = 23, STEPS = 5 };

typedef struct {
  mtopt_backend_t be;
  int64_t numel[NT];
  int64_t off[NT];    /* packed: element offsets in one buffer */
  float *w[NT], *g[NT]; /* the tensors' starts (g NULL: library-owned) */
  void *mem[2 * NT];  /* the allocations */
  int nmem;
  int64_t len; /* packed or pooled: the buffers' length */
} layout_t;

#define GAP_W 7.25f /* what the gaps of a pooled w hold (make_layout) */

/* Pooled: every element of w outside the tensors still holds GAP_W. */
static void gaps_kept(const layout_t *L, int step) {
  float *w = malloc((size_t)L->len * 4);
  tu_to_host(L->be, w, L->mem[0], (size_t)L->len * 4);
  for (int i = 0, k = 0; i <= NT; i++) {
    const int64_t end = i < NT ? L->off[i] : L->len;
    for (; k < end; k++)
      ck_assert_msg(w[k] == GAP_W, "step %d: the gap element %d before tensor %d holds %a", step,
                    k, i, (double)w[k]);
    if (i < NT) k = (int)(L->off[i] + L->numel[i]);
  }
  free(w);
}

enum { SIZES_SMALL, SIZES_BIG, SIZES_OWN, SIZES_LONG };

/* Sizes: odd and small, one empty, one large amid them; under 4096 on
 * average (mtopt__small_tensors: pooled tensors merge across gaps), or
 * SIZES_BIG: a second large one, which lifts the mean over it (pooled tensors
 * then stay apart), or SIZES_OWN: 89 to 99 elements and one empty (tensors
 * each in its own allocation: the allocator's size classes put them a
 * similar few bytes apart), or SIZES_LONG: no large one, the last seven
 * 6000 to 7000 elements (their run spans more than MTOPT__GAP_PLAN_CHUNK
 * elements: the CUDA statistics pass's chunks too long to stage their mask
 * words, stream_chunk.cuh). */
static void sizes(tu_rng_t *rng, int64_t *numel, int kind) {
  for (int i = 0; i < NT; i++)
    numel[i] = kind == SIZES_OWN                 ? tu_int(rng, 89, 99) | 1
               : kind == SIZES_LONG && i >= 16 ? tu_int(rng, 6000, 7000) | 1
                                               : tu_int(rng, 1, 1500) | 1;
  numel[4] = 0;
  if (kind == SIZES_OWN || kind == SIZES_LONG) return;
  numel[11] = MTOPT__SEGMENT_TENSOR_MAX + 3;
  numel[12] = 1;
  if (kind == SIZES_BIG) numel[20] = MTOPT__SEGMENT_TENSOR_MAX + 5;
}

/* An allocation of exactly `bytes`, whose neighbours the sanitizers guard
 * (ASan's redzones; compute-sanitizer's memcheck knows cudaMalloc's size):
 * a step that read or wrote a gap between two of them fails there. */
static void *own_alloc(mtopt_backend_t be, size_t bytes) {
  if (be != MTOPT_BACKEND_CPU) return tu_alloc(be, bytes);
  void *p = malloc(bytes ? bytes : 1);
  ck_assert_ptr_nonnull(p);
  return p;
}

static int by_address(const void *a, const void *b) {
  const uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
  return (x > y) - (x < y);
}

/* own (3): each w its own allocation of its size, the tensors in address
 * order (numel permuted to it), g the library's, no skew; packed (1): w and
 * g each one buffer, `skew` floats in, tensors back to back; pooled (2): the
 * same with each tensor at a 64-element (256-byte) start, the gaps of w holding GAP_W and those of g NaN (a step that wrote
 * or summed a gap would show); apart (0): each tensor its own allocation at
 * the packed start's residue. gmode 0: g at w's residue; 1: one element
 * further (the scalar path on CUDA); 2: no g, the library's buffer. */
static void make_layout(layout_t *L, mtopt_backend_t be, int64_t *numel, int skew, int packed,
                        int gmode) {
  memset(L, 0, sizeof *L);
  L->be = be;
  if (packed == 3) { /* own: each w its own allocation, in address order; g the library's */
    struct { uintptr_t at; int64_t numel; } t[NT];
    for (int i = 0; i < NT; i++) {
      t[i].at = (uintptr_t)own_alloc(be, (size_t)numel[i] * 4);
      t[i].numel = numel[i];
    }
    qsort(t, NT, sizeof t[0], by_address);
    for (int i = 0; i < NT; i++) {
      numel[i] = L->numel[i] = t[i].numel;
      L->w[i] = (float *)t[i].at;
      L->mem[L->nmem++] = L->w[i];
    }
    return;
  }
  int64_t at = skew;
  for (int i = 0; i < NT; i++) {
    if (packed == 2) at = (at + 63) / 64 * 64 + skew;
    L->numel[i] = numel[i];
    L->off[i] = at;
    at += numel[i];
  }
  L->len = at;
  const int gs = gmode == 1; /* g's shift */
  if (packed) {
    float *w = tu_alloc(be, (size_t)at * 4), *g = tu_alloc(be, (size_t)(at + 1) * 4);
    float *fill = malloc((size_t)(at + 1) * 4);
    for (int64_t k = 0; k <= at; k++) fill[k] = GAP_W;
    tu_to_backend(be, w, fill, (size_t)at * 4);
    for (int64_t k = 0; k <= at; k++) fill[k] = NAN;
    tu_to_backend(be, g, fill, (size_t)(at + 1) * 4);
    free(fill);
    L->mem[L->nmem++] = w;
    L->mem[L->nmem++] = g;
    for (int i = 0; i < NT; i++) {
      L->w[i] = w + L->off[i];
      L->g[i] = gmode == 2 ? NULL : g + gs + L->off[i];
    }
    return;
  }
  for (int i = 0; i < NT; i++) {
    /* tu_alloc is 256-byte aligned; the pad keeps every next allocation
     * past the widest gap a segment may span (apart, nothing merges) */
    const int64_t r = L->off[i] % 4, pad = MTOPT__SEGMENT_GAP_MAX + 2;
    float *w = tu_alloc(be, (size_t)(r + numel[i] + pad) * 4);
    float *g = tu_alloc(be, (size_t)(r + numel[i] + pad) * 4);
    L->mem[L->nmem++] = w;
    L->mem[L->nmem++] = g;
    L->w[i] = w + r;
    L->g[i] = gmode == 2 ? NULL : g + gs + r;
  }
}

static void free_layout(layout_t *L) {
  for (int k = 0; k < L->nmem; k++) tu_free(L->be, L->mem[k]);
}

static void put(const layout_t *L, float *const *dst, const float *src) {
  for (int i = 0, at = 0; i < NT; at += (int)L->numel[i], i++)
    if (L->numel[i]) tu_to_backend(L->be, dst[i], src + at, (size_t)L->numel[i] * 4);
}

/* Tensors 0-2 in group 0, 3-8 in group 1, 9.. in group 2; 6 and 15 no-decay. */
static mtopt_optimizer_t *build(mtopt_context_t *ctx, const layout_t *L,
                                const mtopt_optimizer_config_t *c, mtopt_tensor_list_t **list) {
  TU_OK(mtopt_tensor_list_create(ctx, list));
  TU_OK(mtopt_tensor_list_set_group(*list, 1, 0.5f, 0.0f));
  TU_OK(mtopt_tensor_list_set_group(*list, 2, 2.0f, 0.5f));
  for (int i = 0; i < NT; i++) {
    mtopt_tensor_desc_t d = MTOPT_TENSOR_DESC_INIT;
    d.param = L->w[i];
    d.grad = L->g[i]; /* NULL: library-owned */
    d.numel = L->numel[i];
    d.group = i < 3 ? 0 : i < 9 ? 1 : 2;
    d.flags = i == 6 || i == 15 ? MTOPT_TENSOR_NO_WEIGHT_DECAY : 0u;
    TU_OK(mtopt_tensor_list_add(*list, &d, NULL));
  }
  mtopt_optimizer_t *opt = NULL;
  TU_OK(mtopt_optimizer_create(ctx, *list, c, &opt));
  return opt;
}

/* How many records the update pass steps (get_info), checked against the
 * plan's own. */
static int64_t update_tensors(const mtopt_optimizer_t *opt) {
  mtopt_optimizer_info_t info = MTOPT_OPTIMIZER_INFO_INIT;
  TU_OK(mtopt_optimizer_get_info(opt, &info));
  ck_assert_int_eq(info.update_tensors, opt->step_plan->num_tensors);
  return info.update_tensors;
}

static void same(const float *a, const float *b, int64_t n, const char *what, int i, int step) {
  const int64_t k = tu_first_bit_diff(a, b, n);
  ck_assert_msg(k < 0, "%s of tensor %d differs at step %d, element %lld: %a vs %a", what, i,
                step, (long long)k, k < 0 ? 0.0 : (double)a[k], k < 0 ? 0.0 : (double)b[k]);
}

/* Both optimizers' weights and state, tensor by tensor. */
static void compare(mtopt_optimizer_t *op, const layout_t *P, mtopt_optimizer_t *oa,
                    const layout_t *A, int nstate, mtopt_state_t s0, int step) {
  for (int i = 0; i < NT; i++) {
    const int64_t n = P->numel[i];
    if (n == 0) continue;
    float *x = malloc((size_t)n * 4), *y = malloc((size_t)n * 4);
    tu_poison(x, n);
    tu_poison(y, n);
    tu_to_host(P->be, x, P->w[i], (size_t)n * 4);
    tu_to_host(A->be, y, A->w[i], (size_t)n * 4);
    same(x, y, n, "the weights", i, step);
    for (int s = 0; s < nstate; s++) {
      tu_poison(x, n);
      tu_poison(y, n);
      TU_OK(mtopt_optimizer_read_state(op, i, (mtopt_state_t)(s0 + s), x));
      TU_OK(mtopt_optimizer_read_state(oa, i, (mtopt_state_t)(s0 + s), y));
      same(x, y, n, s ? "the second moment" : "the first state", i, step);
    }
    free(x);
    free(y);
  }
}

/* Config k (0..6): AdamW, AdamW with clipping and a dynamic loss scale (a
 * statistics pass first), Adam, SGD with momentum and dampening, Nesterov SGD
 * with clipping, plain SGD, LAMB with clipping; its state buffers. */
static mtopt_optimizer_config_t config_of(int k, int64_t chunk, int *nstate,
                                          mtopt_state_t *s0) {
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  c.chunk_size = chunk;
  c.lr = 1e-2f;
  c.weight_decay = 0.1f;
  *nstate = 2;
  *s0 = MTOPT_STATE_EXP_AVG;
  switch (k) {
  case 0: c.kind = MTOPT_OPTIMIZER_ADAMW; break;
  case 1:
    c.kind = MTOPT_OPTIMIZER_ADAMW;
    c.max_grad_norm = 0.5f;
    c.loss_scale = 1024.0f;
    c.dynamic_loss_scale = 1;
    break;
  case 2: c.kind = MTOPT_OPTIMIZER_ADAM; break;
  case 3:
    c.kind = MTOPT_OPTIMIZER_SGD;
    c.momentum = 0.9f;
    c.dampening = 0.1f;
    *nstate = 1;
    *s0 = MTOPT_STATE_MOMENTUM;
    break;
  case 4:
    c.kind = MTOPT_OPTIMIZER_SGD;
    c.momentum = 0.8f;
    c.nesterov = 1;
    c.max_grad_norm = 1.0f;
    *nstate = 1;
    *s0 = MTOPT_STATE_MOMENTUM;
    break;
  case 5: c.kind = MTOPT_OPTIMIZER_SGD; *nstate = 0; break;
  default:
    c.kind = MTOPT_OPTIMIZER_LAMB;
    c.max_grad_norm = 0.5f;
    break;
  }
  return c;
}

/* The two optimizers' step counts and loss scales agree, and their norms to
 * a float ulp: the packed one sums its squares per chunk of the segments,
 * the other per chunk of each tensor, and the double sums may round apart
 * (core/segments.c). Returns whether the norms are the same float, which
 * makes the clip factor, and so every bit of the step, the same. */
static int same_info(mtopt_optimizer_t *op, mtopt_optimizer_t *oa, int step) {
  mtopt_step_info_t ip = MTOPT_STEP_INFO_INIT, ia = MTOPT_STEP_INFO_INIT;
  TU_OK(mtopt_optimizer_get_step_info(op, &ip));
  TU_OK(mtopt_optimizer_get_step_info(oa, &ia));
  ck_assert_int_eq(ip.step, step);
  ck_assert_int_eq(ip.step, ia.step);
  ck_assert_msg(ip.loss_scale == ia.loss_scale && ip.skipped_steps == ia.skipped_steps,
                "step %d: loss scale %g vs %g", step, (double)ip.loss_scale,
                (double)ia.loss_scale);
  /* the same bits, NaN included (no statistics pass, no norm) */
  if (memcmp(&ip.last_grad_norm, &ia.last_grad_norm, sizeof(float)) == 0) return 1;
  const double n = ia.last_grad_norm, ulp = nextafterf(ia.last_grad_norm, INFINITY) - n;
  ck_assert_msg(fabs((double)ip.last_grad_norm - n) <= ulp, "step %d: norm %a vs %a", step,
                (double)ip.last_grad_norm, n);
  return 0;
}

/* CPU: the statistics pass ran over the segments' chunks. Their slots,
 * poisoned before the step (poison_slots: NaN sums, non-finite counts of 1),
 * sum to the packed norm's square and count no non-finite gradient. */
static void poison_slots(mtopt_optimizer_t *op) {
  if (tu_backend() != MTOPT_BACKEND_CPU) return;
  const mtopt__plan_t *s = op->step_plan;
  ck_assert_ptr_eq(s, &op->segment_plan);
  for (int64_t k = 0; k < s->num_chunks; k++) {
    s->slot_gsq[k] = NAN;
    s->slot_nonfinite[k] = 1u;
  }
}

static void slots_sum_to_norm(mtopt_optimizer_t *op) {
  if (tu_backend() != MTOPT_BACKEND_CPU) return;
  const mtopt__plan_t *s = op->step_plan;
  double sumsq = 0.0;
  for (int64_t k = 0; k < s->num_chunks; k++) {
    sumsq += s->slot_gsq[k];
    ck_assert_msg(s->slot_nonfinite[k] == 0u, "segment chunk %lld: %u non-finite", (long long)k,
                  s->slot_nonfinite[k]);
  }
  mtopt_step_info_t ip = MTOPT_STEP_INFO_INIT;
  TU_OK(mtopt_optimizer_get_step_info(op, &ip));
  ck_assert_msg(isfinite(sumsq) && fabs(sqrt(sumsq) - ip.last_grad_norm) <=
                                       1e-6 * ip.last_grad_norm,
                "segment slots: sqrt of their sum %g, norm %g", sqrt(sumsq),
                (double)ip.last_grad_norm);
}

/* CPU: the segments' masks (plan.h) set exactly the tensors' elements of
 * each span. */
static void masks_match(const mtopt_optimizer_t *op, const layout_t *P) {
  if (tu_backend() != MTOPT_BACKEND_CPU) return;
  const mtopt__plan_t *s = op->step_plan;
  int64_t checked = 0;
  for (int64_t k = 0; k < s->num_tensors; k++) {
    const mtopt__tensor_rec_t *t = &s->tensors[k];
    const uint32_t *mask = mtopt__mask_of(s, k);
    const int64_t at = (int64_t)(t->w - P->w[0]) + P->off[0];
    for (int64_t e = 0; e < t->numel; e++) {
      int in = 0;
      for (int i = 0; i < NT && !in; i++) in = at + e >= P->off[i] && at + e < P->off[i] + P->numel[i];
      ck_assert_msg(mask ? mtopt__mask_bit(mask, e) == in : in,
                    "segment %lld element %lld: mask %d, a tensor's %d", (long long)k,
                    (long long)e, mask ? mtopt__mask_bit(mask, e) : -1, in);
      checked += !in;
    }
  }
  ck_assert_int_gt(checked, 100); /* the gaps were there, and masked */
}

/* SIZES_LONG, pooled (CPU; the chunk table is the backends' own): chunks
 * with a mask both longer than MTOPT__GAP_PLAN_CHUNK and not, so that the
 * CUDA statistics pass runs its chunks both with the mask words staged and
 * without (stream_chunk.cuh). */
static void long_and_short_masked(const mtopt_optimizer_t *op) {
  if (tu_backend() != MTOPT_BACKEND_CPU) return;
  const mtopt__plan_t *s = op->step_plan;
  int64_t n_long = 0, n_short = 0;
  for (int64_t c = 0; c < s->num_chunks; c++) {
    if (!mtopt__mask_of(s, s->chunks[c].tensor)) continue;
    n_long += s->chunks[c].len > MTOPT__GAP_PLAN_CHUNK;
    n_short += s->chunks[c].len <= MTOPT__GAP_PLAN_CHUNK;
  }
  ck_assert_int_gt(n_long, 0);
  ck_assert_int_gt(n_short, 0);
}

/* The same tensors packed (P, in context cp) and apart (A, in ca), the same
 * random weights, an optimizer over each; w and g are host staging. */
typedef struct {
  layout_t P, A;
  mtopt_tensor_list_t *lp, *la;
  mtopt_optimizer_t *op, *oa;
  float *w, *g;
  int64_t total;
} pair_t;

/* packed: make_layout's 1 (back to back), 2 (pooled) or 3 (own
 * allocations, sizes SIZES_OWN, the library's gradients); kind: sizes()'s
 * (SIZES_OWN where packed is 3). */
static void pair_open(pair_t *x, tu_rng_t *rng, mtopt_backend_t be, mtopt_context_t *cp,
                      mtopt_context_t *ca, const mtopt_optimizer_config_t *c, int skew,
                      int gmode, int packed, int kind) {
  int64_t numel[NT];
  const int big = kind == SIZES_BIG;
  sizes(rng, numel, packed == 3 ? SIZES_OWN : kind);
  x->total = 0;
  for (int i = 0; i < NT; i++) x->total += numel[i];
  if (packed == 3) gmode = 2;
  if (packed >= 2) skew = 0; /* a span with gaps starts on 16 bytes */
  make_layout(&x->P, be, numel, skew, packed, gmode);
  make_layout(&x->A, be, numel, skew, 0, gmode);
  x->w = malloc((size_t)x->total * 4);
  x->g = malloc((size_t)x->total * 4);
  tu_fill(rng, x->w, x->total, -2.0f, 2.0f);
  put(&x->P, x->P.w, x->w);
  put(&x->A, x->A.w, x->w);
  x->op = build(cp, &x->P, c, &x->lp);
  x->oa = build(ca, &x->A, c, &x->la);
  /* Apart, nothing merges; packed, the groups and the no-decay tensors cut
   * the small tensors into runs, the large ones stay alone; LAMB, and pooled
   * tensors of a big table, keep them all. */
  ck_assert_ptr_eq(x->oa->step_plan, &x->oa->plan);
  ck_assert_int_eq(update_tensors(x->oa), NT);
  if (packed == 3) { /* where the allocator put them: some merge, or the case tests nothing */
    ck_assert_msg(update_tensors(x->op) < NT - 1, "own allocations: %lld segments",
                  (long long)update_tensors(x->op));
  } else if (c->kind == MTOPT_OPTIMIZER_LAMB || (packed == 2 && big)) {
    ck_assert_ptr_eq(x->op->step_plan, &x->op->plan);
    ck_assert_int_eq(update_tensors(x->op), NT);
  } else {
    /* 0-2 | 3,5 | 6 | 7-8 | 9-10 | 11 | 12-14 | 15 | 16.., big: 16-19 | 20 | 21-22;
     * long, 11 small: 9-14 one run */
    ck_assert_int_eq(update_tensors(x->op), big ? 11 : kind == SIZES_LONG ? 7 : 9);
  }
  /* The kernels read a segment's gaps (MTOPT__FLAG_WHOLE_GROUPS) only on
   * CUDA and only where each array's span is one allocation: pooled, every
   * segment with gaps; own allocations (w), none. */
  const mtopt_optimizer_t *o = x->op;
  if (packed == 2 && c->kind != MTOPT_OPTIMIZER_LAMB && !big)
    ck_assert_int_gt(o->gap_segments, 0);
  const int64_t whole = packed == 2 && be == MTOPT_BACKEND_CUDA ? o->gap_segments : 0;
  ck_assert_int_eq(o->whole_segments, whole);
}

/* The gradient arrays of a side: its own, or the library's. */
static void grad_ptrs(const layout_t *L, mtopt_optimizer_t *o, float **g) {
  for (int i = 0; i < NT; i++) {
    g[i] = L->g[i];
    if (!g[i] && L->numel[i]) TU_OK(mtopt_optimizer_get_grad(o, i, (void **)&g[i]));
  }
}

/* Fresh gradients in [-scale, scale) into both. */
static void pair_grads(pair_t *x, tu_rng_t *rng, float scale) {
  float *gp[NT], *ga[NT];
  grad_ptrs(&x->P, x->op, gp);
  grad_ptrs(&x->A, x->oa, ga);
  tu_fill(rng, x->g, x->total, -scale, scale);
  put(&x->P, gp, x->g);
  put(&x->A, ga, x->g);
}

static void pair_close(pair_t *x) {
  TU_OK(mtopt_optimizer_destroy(x->op));
  TU_OK(mtopt_optimizer_destroy(x->oa));
  TU_OK(mtopt_tensor_list_destroy(x->lp));
  TU_OK(mtopt_tensor_list_destroy(x->la));
  free_layout(&x->P);
  free_layout(&x->A);
  free(x->w);
  free(x->g);
}

/* _i: config (7) x chunk size (auto, 700) x gradients (make_layout's gmode)
 * x packed or pooled (84 cases); then a big table (14): config x packed or
 * pooled, automatic chunks, the caller's gradients; then own allocations
 * (6): the configs but LAMB; then long runs (7): the configs, pooled, in
 * 65536-element chunks, the gradients at the weights' residue or one
 * element further (gmode _i % 2: the two with a statistics pass, configs 1
 * and 4 at _i 106 and 109, take one each). */
START_TEST(test_packed_is_apart) {
  const int big = _i >= 84 && _i < 98, own = _i >= 98 && _i < 104, lng = _i >= 104;
  const int cfg = _i % 7;
  const int packed = own ? 3 : lng ? 2 : (big ? _i >= 91 : _i >= 42) ? 2 : 1, pooled = packed == 2;
  const int gmode = lng ? _i % 2 : big || own ? 0 : (_i / 14) % 3;
  const int64_t chunk = lng ? 65536 : !big && !own && (_i / 7) % 2 ? 700 : 0;
  const mtopt_backend_t be = tu_backend();
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() ^ (0x5e6u + (uint64_t)_i));
  mtopt_context_t *ctx = tu_context(be);
  int nstate;
  mtopt_state_t s0;
  const mtopt_optimizer_config_t c = config_of(cfg, chunk, &nstate, &s0);
  pair_t x;
  pair_open(&x, &rng, be, ctx, ctx, &c, (int)tu_int(&rng, 0, 3), gmode, packed,
            big ? SIZES_BIG : lng ? SIZES_LONG : SIZES_SMALL);
  const int merged = x.op->step_plan != &x.op->plan;
  mtopt_optimizer_info_t old = MTOPT_OPTIMIZER_INFO_INIT; /* an older caller's struct */
  old.struct_size = offsetof(mtopt_optimizer_info_t, update_tensors);
  old.update_tensors = -5;
  TU_OK(mtopt_optimizer_get_info(x.op, &old));
  ck_assert_int_eq(old.update_tensors, -5);
  for (int step = 1; step <= STEPS; step++) {
    pair_grads(&x, &rng, cfg == 1 ? 1024.0f : 1.0f);
    if (step == 3) {
      TU_OK(mtopt_optimizer_set_lr(x.op, 3e-3f));
      TU_OK(mtopt_optimizer_set_lr(x.oa, 3e-3f));
    }
    if (c.max_grad_norm > 0.0f && merged) poison_slots(x.op);
    TU_OK(mtopt_optimizer_step(x.op));
    TU_OK(mtopt_optimizer_step(x.oa));
    if (c.max_grad_norm > 0.0f && merged) slots_sum_to_norm(x.op);
    /* Norms a float apart (a double sum rounded across a float's half-ulp,
     * about once in 1e8-1e9 steps) give other clip factors: the runs part. */
    if (!same_info(x.op, x.oa, step)) break;
    compare(x.op, &x.P, x.oa, &x.A, nstate, s0, step);
    if (pooled) gaps_kept(&x.P, step);
  }
  if (merged && pooled) masks_match(x.op, &x.P);
  if (merged && lng) long_and_short_masked(x.op);
  pair_close(&x);
  TU_OK(mtopt_context_destroy(ctx));
}
END_TEST

#ifdef MTOPT_HAVE_CUDA
/* CUDA: the packed optimizer's step (statistics pass, then the segments'
 * update) captured in a graph on a user stream and replayed, the lr changed
 * between replays, equals plain steps of the same tensors apart, bit for
 * bit. The stream is a blocking one, so that the test's copies (the legacy
 * default stream) are ordered with it. */
START_TEST(test_graph) {
  const mtopt_backend_t be = tu_backend();
  if (be != MTOPT_BACKEND_CUDA) return;
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() ^ 0x62a9u);
  cudaStream_t stream;
  TU_CUDA(cudaStreamCreate(&stream));
  mtopt_context_t *cg = tu_context(be), *ca = tu_context(be);
  TU_OK(mtopt_cuda_context_set_stream(cg, stream));
  int nstate;
  mtopt_state_t s0;
  const mtopt_optimizer_config_t c = config_of(1, 0, &nstate, &s0);
  pair_t x;
  pair_open(&x, &rng, be, cg, ca, &c, 3, 0, 2, SIZES_SMALL);
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  tu_capture_step(stream, cudaStreamCaptureModeThreadLocal, x.op, &graph, &exec);
  for (int step = 1; step <= STEPS; step++) {
    pair_grads(&x, &rng, 1024.0f);
    const float lr = 1e-2f * (float)(1.0 + 0.4 * step);
    TU_OK(mtopt_optimizer_set_lr(x.op, lr)); /* between replays, in stream order */
    TU_OK(mtopt_optimizer_set_lr(x.oa, lr));
    TU_CUDA(cudaGraphLaunch(exec, stream));
    TU_OK(mtopt_optimizer_step(x.oa));
    TU_CUDA(cudaStreamSynchronize(stream));
    if (!same_info(x.op, x.oa, step)) break; /* as in test_packed_is_apart */
    compare(x.op, &x.P, x.oa, &x.A, nstate, s0, step);
  }
  TU_CUDA(cudaGraphExecDestroy(exec));
  TU_CUDA(cudaGraphDestroy(graph));
  pair_close(&x);
  TU_OK(mtopt_context_destroy(cg));
  TU_OK(mtopt_context_destroy(ca));
  TU_CUDA(cudaStreamDestroy(stream));
}
END_TEST
#endif

/* Tensor i's m and v lie side by side (at most the 16-byte placement apart):
 * the layout made no runs. */
static void side_by_side(mtopt_optimizer_t *o, int64_t i, int64_t numel, int esize) {
  void *m = NULL, *v = NULL;
  TU_OK(mtopt_optimizer_get_state(o, i, MTOPT_STATE_EXP_AVG, &m));
  TU_OK(mtopt_optimizer_get_state(o, i, MTOPT_STATE_EXP_AVG_SQ, &v));
  const ptrdiff_t d = (char *)v - (char *)m;
  ck_assert_msg(d >= numel * esize && d < numel * esize + 16,
                "tensor %lld: v is %td bytes after m, %lld elements", (long long)i, d,
                (long long)numel);
}

/* LAMB (a trust ratio per tensor) and BF16 parameters keep their tensors,
 * and their state side by side. */
START_TEST(test_kept) {
  const mtopt_backend_t be = tu_backend();
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() ^ 0x1a3bu);
  mtopt_context_t *ctx = tu_context(be);
  int64_t numel[NT];
  sizes(&rng, numel, 0);
  layout_t P;
  make_layout(&P, be, numel, 1, 1, 0);
  mtopt_optimizer_config_t c = MTOPT_OPTIMIZER_CONFIG_INIT;
  c.kind = MTOPT_OPTIMIZER_LAMB;
  mtopt_tensor_list_t *l;
  mtopt_optimizer_t *o = build(ctx, &P, &c, &l);
  ck_assert_ptr_eq(o->step_plan, &o->plan);
  side_by_side(o, 0, numel[0], 4);
  TU_OK(mtopt_optimizer_destroy(o));
  TU_OK(mtopt_tensor_list_destroy(l));
  /* gradients in the library's buffer: back to back there too */
  TU_OK(mtopt_tensor_list_create(ctx, &l));
  for (int i = 0; i < 4; i++)
    TU_OK(mtopt_tensor_list_add_f32(l, P.w[0] + 37 * i, NULL, 37, 0u, NULL));
  c.kind = MTOPT_OPTIMIZER_SGD;
  c.momentum = 0.9f;
  TU_OK(mtopt_optimizer_create(ctx, l, &c, &o));
  ck_assert_int_eq(update_tensors(o), 1);
  TU_OK(mtopt_optimizer_destroy(o));
  TU_OK(mtopt_tensor_list_destroy(l));
  /* two F32 tensors back to back, then two BF16 ones: a table with F16/BF16
   * arrays has no segments, and no runs in its slab */
  {
    TU_OK(mtopt_tensor_list_create(ctx, &l));
    for (int i = 0; i < 4; i++) {
      mtopt_tensor_desc_t d = MTOPT_TENSOR_DESC_INIT;
      d.param = i < 2 ? (void *)(P.w[0] + 64 * i) : (void *)((uint16_t *)(P.w[0] + 128) + 64 * (i - 2));
      d.grad = P.g[0] + 64 * i;
      d.numel = 64;
      d.param_dtype = i < 2 ? MTOPT_DTYPE_F32 : MTOPT_DTYPE_BF16;
      TU_OK(mtopt_tensor_list_add(l, &d, NULL));
    }
    c.kind = MTOPT_OPTIMIZER_ADAMW;
    TU_OK(mtopt_optimizer_create(ctx, l, &c, &o));
    ck_assert_ptr_eq(o->step_plan, &o->plan);
    side_by_side(o, 0, 64, 4);
    TU_OK(mtopt_optimizer_destroy(o));
    TU_OK(mtopt_tensor_list_destroy(l));
  }
  free_layout(&P);
  TU_OK(mtopt_context_destroy(ctx));
}
END_TEST

int main(void) {
  Suite *s = suite_create("segments");
  TCase *tc = tcase_create("segments");
  tcase_set_timeout(tc, 120);
  tcase_add_loop_test(tc, test_packed_is_apart, 0, 111);
  tcase_add_test(tc, test_kept);
#ifdef MTOPT_HAVE_CUDA
  tcase_add_test(tc, test_graph);
#endif
  suite_add_tcase(s, tc);
  return tu_main(s);
}

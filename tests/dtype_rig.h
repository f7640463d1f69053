/* Helpers of the mixed-precision suites (dtypes.c, rounding.c): tables of
 * tensors of any dtypes at misaligned starts in a backend's memory, their
 * optimizers, fresh gradients, and bit-for-bit comparisons of what two
 * optimizers wrote. */
#ifndef MTOPT_TEST_DTYPE_RIG_H
#define MTOPT_TEST_DTYPE_RIG_H

#include <stddef.h>
#include <stdint.h>

#include "common/dtype.h"
#include "test_util.h"

enum { MAXT = 9, STEPS = 6 };

typedef struct {
  mtopt_backend_t be;
  int n;
  int64_t numel[MAXT];
  int pdt[MAXT], gdt[MAXT];
  void *w[MAXT], *g[MAXT];       /* backend memory, at misaligned starts */
  void *wmem[MAXT], *gmem[MAXT]; /* the allocations */
} table_t;

/* Host copies of every array an optimizer writes (params, masters, states),
 * as raw bytes, to compare two runs bit for bit. */
typedef struct {
  int n;
  void *buf[MAXT][4];
  size_t bytes[MAXT][4];
} snap_t;

/* The state buffers of each kind of kind_config (AdamW, Adam, SGD, LAMB). */
extern const mtopt_state_t state_of_kind[4][2];
/* Reductions (clipping's norm, LAMB's norms) are summed in another order by
 * the CUDA kernels' fp32 and mixed paths: there, runs that take them agree to
 * a tolerance (exact_run = 0), elsewhere bit for bit (1). */
extern int exact_run;

/* Bytes per element of dtype dt. */
size_t esize(int dt);
/* n elements of dtype dt, `skew` elements past a fresh allocation (*mem). */
void *alloc_at(mtopt_backend_t be, int64_t n, int dt, int skew, void **mem);
/* Host fp32 values into a backend array of dtype dt, rounded to nearest. */
void put(mtopt_backend_t be, void *dst, int dt, const float *x, int64_t n);
/* A backend array of dtype dt as host fp32 (exact). */
void get(mtopt_backend_t be, float *x, const void *src, int dt, int64_t n);
/* n tensors of the given dtypes: sizes from `numel` (or random, odd, with a
 * one-element tensor first), each at a random misaligned start. */
void table_make(table_t *t, tu_rng_t *rng, mtopt_backend_t be, int n, const int *pdt,
                const int *gdt, const int64_t *numel);
/* MAXT tensors whose dtypes cycle: tensor i's parameter pdt[i % np], its
 * gradient gdt[i % ng]; sizes and starts as table_make, then random weights
 * (table_fill_w). CYCLE(a, b, ...) passes a list and its length. */
void table_cycles(table_t *t, tu_rng_t *rng, mtopt_backend_t be, const int *pdt, int np,
                  const int *gdt, int ng);
#define CYCLE(...) \
  (const int[]){__VA_ARGS__}, (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int))
/* dst's weights := src's (upcast or rounded into dst's dtypes). */
void copy_w(table_t *dst, const table_t *src);
/* Random weights in [-2, 2), rounded into each tensor's dtype. */
void table_fill_w(table_t *t, tu_rng_t *rng);
void table_free(table_t *t);
/* A table of t's sizes and weights in other dtypes (twin of t). */
void table_like(table_t *f, const table_t *t, tu_rng_t *rng, int pdt, int gdt);
/* Fresh random gradients (times scale) in every table of ts[0..k): each in
 * its own dtype, all the same values (those of ts[0]'s dtype, which every
 * other table can hold exactly when it is F32 or the same dtype). */
void set_grads(table_t *const *ts, int k, tu_rng_t *rng, float scale);
/* An optimizer over t's tensors (tensor 1 flagged no-decay). */
mtopt_optimizer_t *make_opt(mtopt_context_t *ctx, const table_t *t,
                            const mtopt_optimizer_config_t *c, mtopt_tensor_list_t **list);
void drop_opt(mtopt_optimizer_t *opt, mtopt_tensor_list_t *list);
/* A test's rng (seeded from the run's seed and a salt) and context. */
mtopt_context_t *begin(tu_rng_t *rng, uint64_t salt);
/* Destroys two optimizers, their tables and the context. */
void finish2(mtopt_context_t *ctx, mtopt_optimizer_t *oa, mtopt_tensor_list_t *la, table_t *a,
             mtopt_optimizer_t *ob, mtopt_tensor_list_t *lb, table_t *b);
/* A config by kind index: 0..3 AdamW, Adam, SGD with momentum, LAMB; 4..7
 * the same with clipping (a statistics pass). */
mtopt_optimizer_config_t kind_config(int k);
/* Asserts two host arrays are equal bit for bit (or, !exact_run, close). */
void same_bits(const float *a, const float *b, int64_t n, const char *what, int tensor, int step);
/* The state buffers of two optimizers agree bit for bit. */
void same_state(mtopt_optimizer_t *a, mtopt_optimizer_t *b, const table_t *t, int kind,
                int step);
/* Every array an optimizer wrote: params, states (read_state), masters. */
void snap_take(snap_t *sn, mtopt_optimizer_t *opt, const table_t *t, int nstate);
void snap_same(const snap_t *a, const snap_t *b, const char *what);
void snap_free(snap_t *sn);

#endif /* MTOPT_TEST_DTYPE_RIG_H */

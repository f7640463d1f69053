/* The rig of the suites run under mpirun on either backend (dist.c,
 * dist_mixed.c, dist_reduce.c): this rank, the run's seed and backend; the
 * backend's memory; failure recording; models of any dtypes, the ranks'
 * gradients and their average, random bucket marks, a step of both
 * optimizers; comparisons with the reference; checkpoint files; and main().
 *
 * The oracle: one process stepping the plain optimizer on the same backend,
 * on the averaged gradient made as the transport makes it (write_grads).
 *
 * The backend: the CPU (MPI collectives) by default, CUDA (NCCL, one GPU per
 * rank) with `--backend cuda` or MTOPT_TEST_BACKEND=cuda. CUDA is touched only
 * after MPI_Init, never before: the suites do not fork.
 *
 * MPI cannot fork: the suites run with CK_NOFORK, and a test records failures
 * (EXPECT) and asserts (REC_ASSERT) only after its last collective, so that a
 * failing rank does not leave the others waiting in a collective. The exit
 * code counts failures on every rank; 77 (skipped) on CUDA where a rank has
 * no GPU. */
#ifndef MTOPT_TESTS_DIST_RIG_H
#define MTOPT_TESTS_DIST_RIG_H

#include <mpi.h>

#include <check.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "mtopt/mtopt.h"
#include "mtopt/mtopt_dist.h"
#include "test_util.h"

extern int g_rank, g_world;
extern uint64_t g_seed; /* the run's, the same on every rank */
extern mtopt_backend_t g_backend;
extern int g_device; /* CUDA: this rank's device */

/* A context of the run's backend (CUDA: on this rank's device). */
mtopt_context_t *test_context(void);

/* ---- the backend's memory: host memory on the CPU, device memory on CUDA.
 * Set-up and read-back helpers; a CUDA failure fails the test (ck_assert),
 * as a failed malloc would. Allocations are 256-byte aligned on both
 * backends (as cudaMalloc), so a start `skew` elements in has the same
 * residue everywhere. The copies run on the legacy default stream, the test
 * contexts' stream, so they are ordered with the library's work there. */
void *mem_alloc(size_t bytes); /* at least one byte */
void mem_free(void *p);
void mem_put(void *dst, const void *src, size_t bytes); /* host -> backend */
void mem_get(void *dst, const void *src, size_t bytes); /* backend -> host */
/* The same for n elements of dtype dt (MTOPT_DTYPE_F32/F16/BF16) as host
 * floats: put rounds to nearest even, get is exact (from a NaN-poisoned copy). */
void mem_put_as(void *dst, int dt, const float *x, int64_t n);
void mem_get_as(float *x, const void *src, int dt, int64_t n);

/* Whether the distributed average is bit-identical to the host reference's
 * sum * (float)(1/world) rounded to the gradient dtype: the MPI transport
 * averages so; NCCL's ncclAvg multiplies each rank's value by 1/world before
 * summing, exact for small integers when world is a power of two. */
int average_is_exact(void);
/* The same for a bucket of gradient dtype gdt: F16 is averaged before the
 * sum on both transports (the MPI transport, to keep the sum in range), so
 * it is exact only at a power-of-two world. */
int average_is_exact_for(int gdt);

/* ---- failure recording ---- */
typedef struct {
  int bad;
  char msg[2048];
} rec_t;

#define EXPECT(r, cond, ...)                                                   \
  do {                                                                         \
    if (!(cond)) {                                                             \
      if (!(r)->bad) snprintf((r)->msg, sizeof (r)->msg, __VA_ARGS__);        \
      (r)->bad++;                                                              \
    }                                                                          \
  } while (0)
#define EXPECT_ST(r, expr, want)                                               \
  do {                                                                         \
    mtopt_status_t e_st_ = (expr);                                             \
    EXPECT(r, e_st_ == (want), "rank %d: %s -> %s, expected %s (%s)", g_rank, #expr, \
           mtopt_status_name(e_st_), mtopt_status_name(want), mtopt_last_error()); \
  } while (0)
#define EXPECT_OK(r, expr) EXPECT_ST(r, expr, MTOPT_STATUS_SUCCESS)
#define REC_ASSERT(r) ck_assert_msg(!(r).bad, "%d failures; first: %s", (r).bad, (r).msg)

/* ---- models: n tensors of any dtypes, twice in the backend's memory (side
 * 0 for the distributed optimizer, 1 for the reference), the same weights ---- */
enum { DR_MAXT = 12, DR_MAXN = 1024 };

typedef struct {
  int n;
  int64_t numel[DR_MAXT];
  int pdt[DR_MAXT], gdt[DR_MAXT]; /* MTOPT_DTYPE_* */
  void *mem[2][DR_MAXT];          /* the allocations */
  void *w[2][DR_MAXT];            /* the weights */
  float init[DR_MAXT][DR_MAXN];   /* the initial weights, as their dtype holds them */
} model_t;

/* n tensors, tensor i of class i % ncls (pdt, gdt); sizes from numel, or
 * (NULL) odd up to 899 with tensor 0 one element long and tensor 4 empty;
 * weights uniform in [-1, 1), no zeros, from the seed and salt. skew 0: every
 * tensor 256-byte aligned; 1: each at a random element residue, the
 * reference's another one. */
void model_init(model_t *m, int n, const int64_t *numel, const int *pdt, const int *gdt,
                int ncls, int skew, uint64_t salt);
void model_free(model_t *m);
/* Side k's tensors with grad == NULL, named "t<i>"; tensor 2 without weight
 * decay, 5 and 6 in group 1 (lr x 0.5, weight decay x 0.25). swap >= 0:
 * tensor `swap` registered at w with numel elements instead (a plan that
 * differs). */
mtopt_tensor_list_t *model_list(mtopt_context_t *ctx, const model_t *m, int k, int swap,
                                void *w, int64_t numel, rec_t *rec);

/* Rank q's gradient of tensor t at step s: n non-zero integers in [-6, 6],
 * so that every sum over ranks is exact in fp32, bf16 and fp16 in any order. */
void rank_grad(int s, int q, int t, int64_t n, float *g);

/* Step s's gradients times `scale` (a loss scale): this rank's into the
 * distributed optimizer's views (after its zero_grad); into ref's (if not
 * NULL) the average as the transport makes it: the ranks' sum in float,
 * times (float)(1/world), rounded to the gradient dtype. inf_tensor >= 0:
 * that tensor's first element overflows on the last rank (so in the average). */
void write_grads(const model_t *m, mtopt_dist_optimizer_t *d, mtopt_optimizer_t *ref, int s,
                 float scale, int inf_tensor, rec_t *rec);
/* Rank q's gradient of tensor t, of gradient dtype dt, at step s: n values. */
typedef void (*grad_gen_t)(int s, int q, int t, int dt, int64_t n, float *g);
/* write_grads with the gradients of gen; f32: ref's gradients are F32 and get
 * the fp32 average (the ranks' sum in float, in rank order, times
 * (float)(1/world), in every dtype: the reduction of reduce_f32). */
void write_grads_of(const model_t *m, mtopt_dist_optimizer_t *d, mtopt_optimizer_t *ref, int s,
                    float scale, int inf_tensor, grad_gen_t gen, int f32, rec_t *rec);
/* write_grads, a random subset of buckets marked ready (mark_random), the
 * distributed step (synchronised) and the reference's. */
void step_both(const model_t *m, mtopt_dist_optimizer_t *d, mtopt_optimizer_t *ref, int s,
               float scale, int inf_tensor, rec_t *rec);
/* step_both after the gradients of step s are written (by another writer). */
void step_written(mtopt_dist_optimizer_t *d, mtopt_optimizer_t *ref, int s, rec_t *rec);

/* Buckets of 512 bytes first, 2048 after (several in a small model), a 30 s
 * timeout, the given zero_stage. */
mtopt_comm_config_t small_buckets(int zero);

/* Marks a random subset of the nb buckets ready, in a random order drawn
 * from the seed, this rank and `step` (different on every rank); the step
 * then marks the rest. */
void mark_random(mtopt_dist_optimizer_t *d, int nb, int step, rec_t *rec);

/* ---- comparisons ---- */

/* The first index where two arrays of dtype dt (as floats) differ: bit for
 * bit, or (tol) beyond two ulps of the dtype (relative 2^-6 for bf16, 2^-9
 * for f16, 1e-5 for f32) plus atol; -1 if none. */
int64_t differs(const float *a, const float *b, int64_t n, int dt, int tol, double atol);

/* The inner optimizer's state buffers (those of `kind`, and the masters of
 * 16-bit parameters unless `master` is NONE) equal the reference's bit for
 * bit. Its tensors are the list's (zero_stage 0) or this rank's pieces
 * (ZeRO-1), each found by its weights' address inside a tensor of side 0;
 * and the ranks' pieces cover every element once. Collective. */
void same_state(const model_t *m, int zero, mtopt_optimizer_kind_t kind, mtopt_master_t master,
                mtopt_optimizer_t *inner, mtopt_optimizer_t *ref, rec_t *rec);

/* A fresh directory under /tmp every rank sees: rank 0 makes it and
 * broadcasts the name ("" if it could not). Collective. */
void dir_make(char dir[64]);
/* Removes it with the files in it, once every rank is done. Collective. */
void dir_remove(const char *dir);
/* A checkpoint's file of `rank`: the path itself (zero_stage 0) or the
 * rank's shard, "<path>.rank<r>-of-<world>" (1). */
void ck_file(char out[320], const char *path, int zero, int rank);
/* A whole file (malloc'd; *len its size), or NULL. */
char *slurp(const char *path, long *len);
/* This rank's files of two checkpoints hold the same bytes: the same
 * weights, masters, state and scalars. */
void same_files(const char *p, const char *q, int zero, rec_t *rec);

/* main(): MPI, the backend (--backend cpu|cuda), the seed (rank 0's, printed
 * and broadcast), the layer's test hooks (buckets stepped in slices of two
 * 64-element chunks, small buckets cut into segments), then the suite under
 * CK_NOFORK. Returns the exit code: 0, 1 (a failure on some rank), 2 (a bad
 * backend name), 77 (CUDA, a rank without a GPU). */
int dist_main(int argc, char **argv, const char *name, Suite *(*suite)(void));

#endif /* MTOPT_TESTS_DIST_RIG_H */

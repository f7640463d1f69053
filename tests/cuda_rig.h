/* The rig of the CUDA backend suite (cuda_backend.c, cuda_backend_graphs.c,
 * cuda_backend_edges.c): a random "model" of tensors of odd sizes (0, 1, 3,
 * chunk_size-1, chunk_size, chunk_size+1, ...) placed at offsets of 0-3 floats
 * from a 16-byte boundary inside one weight allocation, and gradients that are
 * either the user's (in one allocation, at a residue equal to or different from
 * the weights', so both the vector and the scalar path run) or library-owned.
 * A "side" is one optimizer over that model on the CPU or the CUDA backend;
 * results are downloaded into NaN-poisoned host buffers and compared. The
 * whole weight allocation is compared, padding included, so an out-of-bounds
 * write shows. */
#ifndef MTOPT_TEST_CUDA_RIG_H
#define MTOPT_TEST_CUDA_RIG_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#include "mtopt/mtopt_cuda.h"
#include "test_util.h"

/* ------------------------------------------------------------ the model -- */

typedef struct {
  int64_t n;
  int64_t *numel;
  int64_t *w_off; /* floats from the weight allocation's (256-aligned) base */
  int64_t *g_off; /* in the user-gradient allocation; -1: library-owned */
  int64_t *p_off; /* in the packed layout (tensors back to back) */
  int32_t *group;
  uint32_t *flags;
  int64_t w_total, g_total, packed;
  float *w0; /* initial weight allocation, padding included (random) */
} model_t;

/* malloc that fails the test instead of returning NULL. */
void *xmalloc(size_t bytes);
/* Sizes: the chunk-boundary cases first, then random up to max_numel. */
void model_make(model_t *m, tu_rng_t *r, int64_t n, int64_t chunk, int64_t max_numel);
void model_free(model_t *m);

/* -------------------------------------------------- one optimizer: a side -- */

typedef struct {
  int cuda;
  const model_t *m;
  mtopt_context_t *ctx;
  mtopt_tensor_list_t *list;
  mtopt_optimizer_t *opt;
  cudaStream_t stream; /* CUDA: the context's stream */
  float *w, *g;        /* weight and user-gradient allocations */
} side_t;

/* A context on CUDA device 0 (its legacy default stream). */
mtopt_context_t *cuda_context(void);
/* The model's allocations, tensor list (3 groups) and optimizer on the CPU
 * (cuda 0) or CUDA backend; stream != 0 sets the CUDA context's stream. */
void side_open(side_t *s, const model_t *m, int cuda, const mtopt_optimizer_config_t *cfg,
               cudaStream_t stream);
void side_close(side_t *s);
/* Gradients from the packed layout into wherever each tensor's step reads
 * them (user allocation or library buffer). */
void side_set_grads(side_t *s, const float *packed);
/* The whole weight allocation, into a poisoned buffer. */
void side_read_w(side_t *s, float *out);
/* A state buffer of every tensor, packed (into a poisoned buffer). */
void side_read_state(side_t *s, mtopt_state_t which, float *out);
/* The config's state buffers: how many, the k-th, and its name. */
int n_state(const mtopt_optimizer_config_t *c);
mtopt_state_t state_id(const mtopt_optimizer_config_t *c, int k);
const char *state_name(mtopt_state_t w);

/* ------------------------------------------------------------ comparing -- */

typedef struct {
  double w, state0, state1; /* < 0: bit for bit */
} tols_t;

/* Weights and every state buffer of gpu against cpu, within t (any two
 * sides: the names say which is reported as cuda and as cpu). */
void compare_sides(side_t *gpu, side_t *cpu, const mtopt_optimizer_config_t *c,
                   const tols_t *t, int step);
/* Every non-empty tensor's weights moved. */
void expect_all_updated(side_t *s);
/* The step infos agree; the grad norm bit for bit if bitwise_norm, else to
 * rtol 1e-4. */
void expect_same_info(side_t *a, side_t *b, int bitwise_norm);

/* ------------------------------------------------------------- configs -- */

/* FNV-1a of a case's name: each case draws its own model from the run's seed
 * and its name. */
uint64_t name_hash(const char *s);

typedef struct {
  const char *name;
  mtopt_optimizer_kind_t kind;
  int64_t chunk;
  int64_t ntensors, max_numel;
  float lr, wd, momentum, dampening;
  int nesterov;
  float clip, loss_scale;
  int dynamic, skip_nonfinite;
  int bias_correction, always_adapt;
} cfg_t;

/* The optimizer config of a case (growth_interval 2). */
mtopt_optimizer_config_t config_of(const cfg_t *t);

/* The other files' tests, into the suite's test cases (cuda_backend.c). */
void cuda_backend_add_graph_tests(TCase *tc); /* cuda_backend_graphs.c */
void cuda_backend_add_edge_tests(TCase *tc);  /* cuda_backend_edges.c */

#endif

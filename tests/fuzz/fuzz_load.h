/* The loader fuzz target's optimizers, shared with the corpus generator. */
#ifndef MTOPT_FUZZ_LOAD_H
#define MTOPT_FUZZ_LOAD_H

#include <stddef.h>
#include <stdint.h>

#include "mtopt/mtopt.h"

/* The configurations an input's first byte selects (byte % FUZZ_CONFIGS):
 * 0 AdamW, 1 SGD with momentum, 2 AdamW with a dynamic loss scale and
 * clipping, 3 AdamW on a BF16 table with F32 masters. */
#define FUZZ_CONFIGS 4

/* The optimizer of configuration k, built once per process on a CPU context,
 * its weights and state at a fixed point after two steps. */
mtopt_optimizer_t *fuzz_optimizer(int k);
/* Steps it once with fixed gradients. */
mtopt_status_t fuzz_step(int k);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#endif

/*
 * mtopt: CUDA-specific calls (streams, device-side results).
 *
 * Include this header instead of (or after) mtopt/mtopt.h where CUDA types are
 * wanted; the core header stays free of CUDA. These calls exist only in builds
 * with the CUDA backend (MTOPT_HAVE_CUDA is defined for users of mtopt::mtopt).
 *
 * Streams and ordering
 *   A CUDA context enqueues everything (steps, hyperparameter setters,
 *   zero_grad) on one stream: the legacy default stream until
 *   mtopt_cuda_context_set_stream() names another. Work on that stream runs in
 *   the order it was enqueued, so a setter called between two steps affects
 *   exactly the second one, without any host synchronisation.
 *
 * CUDA graphs
 *   mtopt_optimizer_step() only launches kernels on the context's stream: no
 *   allocation, no synchronisation, no pageable copy. It can therefore be
 *   captured (cudaStreamBeginCapture on the context's stream, any capture
 *   mode). Every kernel reads the hyperparameters, the step count and the loss
 *   scale from the optimizer's device block, so a graph stays valid across
 *   replays: call mtopt_optimizer_set_lr() (or any setter) between replays,
 *   outside the capture, on the same stream, and the next replay uses the new
 *   value. A setter called *during* a capture is captured too, with its value
 *   fixed in the graph.
 */
#ifndef MTOPT_MTOPT_CUDA_H
#define MTOPT_MTOPT_CUDA_H

#include <cuda_runtime_api.h>

#include "mtopt/mtopt.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Makes `stream` the stream on which the context enqueues all later work.
 * Work already enqueued on the previous stream is waited for first (the host
 * blocks until it is done), so steps stay ordered across the switch; call it
 * outside stream capture. The stream stays owned by the caller and must
 * outlive its use by the context (set another one, or destroy the context,
 * before destroying it). Pass 0 (or cudaStreamLegacy) for the legacy default
 * stream. Not thread-safe with other calls on the same context.
 * Errors: INVALID_ARGUMENT (NULL ctx, or a context of another backend),
 * CUDA_ERROR (the previous stream reported an error while being waited for). */
MTOPT_API mtopt_status_t mtopt_cuda_context_set_stream(mtopt_context_t *ctx,
                                                       cudaStream_t stream);

/* The stream the context enqueues on (0 for the legacy default stream unless
 * set). Synchronous, no CUDA call.
 * Errors: INVALID_ARGUMENT (NULL argument, or a context of another backend). */
MTOPT_API mtopt_status_t mtopt_cuda_context_get_stream(const mtopt_context_t *ctx,
                                                       cudaStream_t *stream);

/* Device addresses, inside the optimizer's hyperparameter block, of the
 * results the last step left behind:
 *   *last_grad_norm  float:   global norm of the unscaled gradient (NaN while
 *                             the optimizer takes no statistics);
 *   *last_skipped    int32_t: 1 if the last step was skipped for non-finite
 *                             gradients, else 0;
 *   *loss_scale      float:   the loss scale for the next step.
 * Any output pointer may be NULL (that result is not returned). The addresses
 * stay valid until the optimizer is destroyed and are owned by it: read them
 * with a stream-ordered copy (cudaMemcpyAsync on the context's stream) or from
 * a kernel on that stream, e.g. inside a captured graph, to get results
 * without synchronising the host; never write them. No CUDA call is made.
 * Errors: INVALID_ARGUMENT (NULL opt, or an optimizer of a non-CUDA context). */
MTOPT_API mtopt_status_t mtopt_cuda_optimizer_get_device_results(
    mtopt_optimizer_t *opt, const float **last_grad_norm,
    const int32_t **last_skipped, const float **loss_scale);

#ifdef __cplusplus
}
#endif

#endif /* MTOPT_MTOPT_CUDA_H */

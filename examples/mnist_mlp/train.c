/* mnist_mlp's training loop (one epoch at a time) and its evaluation. */
#include <stdlib.h>

#include "mnist.h"

/* Rank r's share of a global batch of n images: [n r / world, n (r+1) / world),
 * so shares differ by at most one image (and may be empty when n < world). */
static void batch_share(const dp_t *dp, int n, int *lo, int *rows) {
  *lo = (int)((int64_t)n * dp->rank / dp->world);
  *rows = (int)((int64_t)n * (dp->rank + 1) / dp->world) - *lo;
}

/* Images in batch b of an epoch (the last one may be short). */
static int batch_size(int64_t count, int batch, int64_t b) {
  const int64_t left = count - b * batch;
  return (int)(left < batch ? left : batch);
}

/* Backward finished layer l (tensors 2l, 2l+1 and everything above):
 * the buckets it completes start their all-reduce now. */
void grads_done(void *dp, int layer) { dp_tensors_done(dp, 2 * layer); }

void trainer_init(trainer_t *t, const options_t *o, mlp_t *m, dp_t *dp, mtopt_optimizer_t *opt,
                  int scale_on_device, FILE *csv) {
  *t = (trainer_t){.o = o, .m = m, .dp = dp, .opt = opt, .scale_on_device = scale_on_device,
                   .csv = csv};
  t->steps_per_epoch = (m->train->count + o->batch - 1) / o->batch;
  t->total_steps = t->steps_per_epoch * o->epochs;
  t->curve = malloc((size_t)t->total_steps * sizeof(float));
  t->slot_loss = malloc((size_t)t->steps_per_epoch * sizeof(float));
  t->slot_correct = malloc((size_t)t->steps_per_epoch * sizeof(int32_t));
  t->step_loss = malloc((size_t)t->steps_per_epoch * sizeof(double));
  if (!t->curve || !t->slot_loss || !t->slot_correct || !t->step_loss)
    MLP_DIE("out of host memory");
}

void trainer_free(trainer_t *t) {
  free(t->curve);
  free(t->slot_loss);
  free(t->slot_correct);
  free(t->step_loss);
}

void train_epoch(trainer_t *t, int epoch, const int32_t *perm, epoch_stats_t *out) {
  const options_t *o = t->o;
  mlp_t *m = t->m;
  dp_t *dp = t->dp;
  const int64_t count = m->train->count, spe = t->steps_per_epoch;
  m->ops->set_order(m, perm, count);
  double step_time = 0.0;
  const double t_epoch = now_s();
  for (int64_t b = 0, step = (epoch - 1) * spe; b < spe; b++, step++) {
    const int n = batch_size(count, o->batch, b);
    int lo = 0, rows = 0;
    batch_share(dp, n, &lo, &rows);
    if (o->cosine) {
      const double lr =
          0.5 * o->lr * (1.0 + cos(M_PI * (double)step / (double)t->total_steps));
      MTOPT_CHECK(mtopt_optimizer_set_lr(t->opt, (float)lr));
    }
    /* Dynamic scaling moves the scale inside the optimizer; the backward
     * pass must use the scale the step will divide by. The CUDA backend
     * reads it on the device; otherwise ask for it here. */
    float scale = o->loss_scale;
    if (o->dynamic_loss_scale && !t->scale_on_device) {
      mtopt_step_info_t si = MTOPT_STEP_INFO_INIT;
      MTOPT_CHECK(mtopt_optimizer_get_step_info(t->opt, &si));
      scale = si.loss_scale;
    }
    /* ZeRO-1 stages its all-gather in the gradient buffer, which is
     * undefined after a step: zero it before backward, as mtopt_dist.h asks. */
    if (dp->zero_stage == 1) dp_zero_grad(dp);
    /* Each rank's gradient is of its rows' summed loss / (n / world): the
     * ranks' average, which mtopt_dist_step takes, is then the gradient of
     * the mean loss over all n images, as one process computes it. */
    if (rows > 0)
      m->ops->train_batch(m, b * o->batch + lo, rows, (float)n / (float)dp->world, scale, b);
    else
      dp_zero_grad(dp); /* fewer images than ranks: this one adds nothing */
    m->ops->synchronize(m); /* so the timer sees the step alone */
    const double t0 = now_s();
    if (dp->on)
      dp_step(dp);
    else
      m->ops->optimizer_step(m, t->opt);
    m->ops->synchronize(m);
    step_time += now_s() - t0;
  }
  dp_synchronize(dp); /* reports asynchronous NCCL errors */
  const double train_time = now_s() - t_epoch;

  /* Each step's loss over the whole batch and the correct count: every
   * rank weighs its mean loss by its rows, and the ranks' sums add up. */
  m->ops->read_slots(m, spe, t->slot_loss, t->slot_correct);
  int64_t correct = 0;
  for (int64_t b = 0; b < spe; b++) {
    int lo = 0, rows = 0;
    batch_share(dp, batch_size(count, o->batch, b), &lo, &rows);
    t->step_loss[b] = rows > 0 ? (double)t->slot_loss[b] * rows : 0.0;
    correct += rows > 0 ? t->slot_correct[b] : 0;
  }
  dp_sum_f64(dp, t->step_loss, (int)spe);
  dp_sum_i64(dp, &correct, 1);
  double loss_sum = 0.0;
  for (int64_t b = 0; b < spe; b++) {
    const int64_t s = (epoch - 1) * spe + b;
    t->curve[s] = (float)(t->step_loss[b] / batch_size(count, o->batch, b));
    if (t->csv) fprintf(t->csv, "%lld,%.6g\n", (long long)s + 1, t->curve[s]);
    loss_sum += t->curve[s];
  }
  out->loss = loss_sum / (double)spe;
  out->train_acc = 100.0 * (double)correct / (double)count;
  out->images_per_s = (double)count / train_time;
  out->step_ms = 1e3 * step_time / (double)spe;
}

double test_accuracy(mlp_t *m, dp_t *dp) {
  const int64_t n = m->test->count;
  const int64_t lo = n * dp->rank / dp->world, hi = n * (dp->rank + 1) / dp->world;
  int64_t correct = hi > lo ? m->ops->evaluate(m, lo, hi - lo) : 0;
  dp_sum_i64(dp, &correct, 1);
  return 100.0 * (double)correct / (double)n;
}

/* The distributed layer's clock: the deadlines of the timeouts (the MPI waits
 * of transport_mpi.c, the stream polls of transport_nccl.c) and the pause
 * between two polls of a wait. */
#ifndef MTOPT_DIST_CLOCK_H
#define MTOPT_DIST_CLOCK_H

#include <sched.h>
#include <time.h>

/* Milliseconds of CLOCK_MONOTONIC: immune to changes of the wall clock. */
static inline double mtopt__now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* A wait polls at full speed (a yield between polls) for its first 100 ms,
 * so that the collectives of a healthy step are seen at once and keep
 * moving: MPI without an asynchronous progress thread moves a collective
 * only inside the polls, and sleeping between them slowed a 25 MB ZeRO-1
 * reduce-scatter + all-gather at 2 ranks on shared memory from 43 ms to
 * 196 ms when 1 ms pauses began after 10 ms. Past that it sleeps between
 * polls, 1/128 of the time waited so far, at most 0.5 ms: a stalled wait (a
 * rank that never joins, until the timeout) costs a few thousand cheap
 * polls a second instead of a whole core (tests/dist_fault.c holds it under
 * a quarter of one), and a long collective still moves every 0.5 ms. */
#define MTOPT__POLL_SPIN_MS 100.0
#define MTOPT__POLL_MAX_PAUSE_MS 0.5

static inline void mtopt__poll_pause(double waited_ms) {
  if (waited_ms < MTOPT__POLL_SPIN_MS) {
    sched_yield();
    return;
  }
  double ms = waited_ms / 128.0;
  if (ms > MTOPT__POLL_MAX_PAUSE_MS) ms = MTOPT__POLL_MAX_PAUSE_MS;
  const struct timespec ts = {0, (long)(ms * 1e6)};
  nanosleep(&ts, NULL);
}

#endif /* MTOPT_DIST_CLOCK_H */

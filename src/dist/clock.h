/* The distributed layer's clock: the deadlines of the timeouts (the MPI waits
 * of transport_mpi.c, the stream polls of transport_nccl.c). */
#ifndef MTOPT_DIST_CLOCK_H
#define MTOPT_DIST_CLOCK_H

#include <time.h>

/* Milliseconds of CLOCK_MONOTONIC: immune to changes of the wall clock. */
static inline double mtopt__now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

#endif /* MTOPT_DIST_CLOCK_H */

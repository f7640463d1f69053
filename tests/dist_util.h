/* What the suites run under mpirun share (dist.c, dist_fault.c). */
#ifndef MTOPT_TESTS_DIST_UTIL_H
#define MTOPT_TESTS_DIST_UTIL_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>

/* This rank's failed checks after srunner_run*: rank 0's runner prints its
 * own (CK_NORMAL); the other ranks run CK_SILENT and speak only here, when
 * they fail. */
static inline int dist_rank_failures(SRunner *sr, int rank) {
  const int failed = srunner_ntests_failed(sr);
  if (failed && rank != 0) {
    TestResult **tr = srunner_failures(sr);
    for (int i = 0; i < failed; i++)
      fprintf(stderr, "rank %d: %s:%d: %s\n", rank, tr_tcname(tr[i]), tr_lno(tr[i]),
              tr_msg(tr[i]));
    free(tr);
  }
  return failed;
}

#endif /* MTOPT_TESTS_DIST_UTIL_H */

/* The segment rule of core/segments.c on tensor records alone: which
 * consecutive tensors join a segment (back to back, or the same gap in every
 * array under MTOPT__SEGMENT_GAP_MAX elements from a 16-byte-aligned start;
 * one group and flags; small, fp32, no masters), and each segment's start
 * and span. segments.c steps optimizers over such tables. */
#include <stdint.h>
#include <string.h>

#include "core/core.h"
#include "test_util.h"

static _Alignas(256) float arena[4 << 17]; /* four arrays of 2^17 elements */

static mtopt__tensor_rec_t rec(int64_t at, int64_t numel) {
  mtopt__tensor_rec_t r;
  memset(&r, 0, sizeof r);
  r.w = arena + at;
  r.g = arena + (1 << 17) + at;
  r.s0 = arena + (2 << 17) + at;
  r.s1 = arena + (3 << 17) + at;
  r.numel = numel;
  return r;
}

/* Segment counts of recs, and each segment's first pointer and length. */
static void expect(const mtopt__tensor_rec_t *r, int64_t n, int64_t nseg, const int64_t *first,
                   const int64_t *numel, const char *what) {
  mtopt__tensor_rec_t segs[16];
  ck_assert_msg(mtopt__segments(r, n, 1, NULL, NULL) == nseg, "%s: %lld segments, expected %lld", what,
                (long long)mtopt__segments(r, n, 1, NULL, NULL), (long long)nseg);
  ck_assert_int_eq(mtopt__segments(r, n, 1, segs, NULL), nseg);
  for (int64_t k = 0; k < nseg; k++) {
    ck_assert_msg(segs[k].w == r[first[k]].w && segs[k].s1 == r[first[k]].s1,
                  "%s: segment %lld does not start at tensor %lld", what, (long long)k,
                  (long long)first[k]);
    ck_assert_msg(segs[k].numel == numel[k], "%s: segment %lld has %lld elements, not %lld",
                  what, (long long)k, (long long)segs[k].numel, (long long)numel[k]);
  }
}

START_TEST(test_rule) {
  mtopt__tensor_rec_t r[6];
  /* three back to back, an empty one between them */
  r[0] = rec(0, 5);
  r[1] = rec(5, 0);
  r[2] = rec(5, 7);
  r[3] = rec(12, 3);
  expect(r, 4, 1, (int64_t[]){0}, (int64_t[]){15}, "back to back");
  /* a gap in any one array breaks the run */
  for (int a = 0; a < 4; a++) {
    r[2] = rec(5, 7);
    float **arr[4] = {&r[2].w, &r[2].g, &r[2].s0, &r[2].s1};
    *arr[a] += 1;
    expect(r, 4, 3, (int64_t[]){0, 2, 3}, (int64_t[]){5, 7, 3}, "a gap");
  }
  r[2] = rec(5, 7);
  r[2].group = 1; /* another group; tensor 3 is group 0 again */
  expect(r, 4, 3, (int64_t[]){0, 2, 3}, (int64_t[]){5, 7, 3}, "groups");
  r[2].group = 0;
  r[3].flags = MTOPT__FLAG_NO_WEIGHT_DECAY;
  expect(r, 4, 2, (int64_t[]){0, 3}, (int64_t[]){12, 3}, "flags");
  r[3].flags = 0;
  /* no state arrays (SGD without momentum): w and g decide */
  for (int i = 0; i < 4; i++) r[i].s0 = r[i].s1 = NULL;
  expect(r, 4, 1, (int64_t[]){0}, (int64_t[]){15}, "no state");
  /* a tensor of MTOPT__SEGMENT_TENSOR_MAX elements stays alone, even back to
   * back; one element fewer joins */
  const int64_t big = MTOPT__SEGMENT_TENSOR_MAX;
  r[0] = rec(0, 9);
  r[1] = rec(9, big);
  r[2] = rec(9 + big, 4);
  r[3] = rec(13 + big, 2);
  expect(r, 4, 3, (int64_t[]){0, 1, 2}, (int64_t[]){9, big, 6}, "a large tensor");
  r[1] = rec(9, big - 1);
  r[2] = rec(8 + big, 4);
  r[3] = rec(12 + big, 2);
  expect(r, 4, 1, (int64_t[]){0}, (int64_t[]){big + 14}, "the largest small tensor");
  /* F16/BF16 arrays, BF16 state or master weights: alone */
  for (int which = 0; which < 4; which++) {
    r[0] = rec(0, 5);
    r[1] = rec(5, 7);
    r[2] = rec(12, 3);
    if (which == 0) r[1].wdt = MTOPT__DT_BF16;
    if (which == 1) r[1].gdt = MTOPT__DT_F16;
    if (which == 2) r[1].sdt = MTOPT__DT_BF16;
    if (which == 3) r[1].mmode = MTOPT__MASTER_F32;
    expect(r, 3, 3, (int64_t[]){0, 1, 2}, (int64_t[]){5, 7, 3}, "low precision");
  }
  ck_assert_int_eq(mtopt__segments(r, 0, 1, NULL, NULL), 0);
  r[0] = rec(0, 0);
  ck_assert_int_eq(mtopt__segments(r, 1, 1, NULL, NULL), 0);
}
END_TEST

START_TEST(test_gaps) {
  mtopt__tensor_rec_t r[4];
  const int64_t G = MTOPT__SEGMENT_GAP_MAX;
  /* a pool: each tensor at a 64-element (256-byte) start, the same in every
   * array; the span counts the gaps */
  r[0] = rec(0, 5);
  r[1] = rec(64, 70);
  r[2] = rec(192, 0);
  r[3] = rec(192, 3);
  expect(r, 4, 1, (int64_t[]){0}, (int64_t[]){195}, "pooled");
  ck_assert_int_eq(mtopt__segments(r, 4, 0, NULL, NULL), 3); /* gaps not admitted */
  ck_assert_int_eq(mtopt__segment_gap(&r[0], &r[1], 1), 59);
  ck_assert_int_eq(mtopt__segment_gap(&r[0], &r[1], 0), -1);
  /* the widest gap joins, one more does not */
  r[1] = rec(5 + G - 1, 7);
  r[3] = rec(5 + G - 1 + 7, 3);
  expect(r, 4, 1, (int64_t[]){0}, (int64_t[]){5 + G - 1 + 10}, "the widest gap");
  r[1] = rec(5 + G, 7);
  r[3] = rec(5 + G + 7, 3);
  expect(r, 4, 2, (int64_t[]){0, 1}, (int64_t[]){5, 10}, "a gap too wide");
  /* another gap in any one array breaks the run */
  for (int a = 0; a < 4; a++) {
    r[1] = rec(64, 70);
    r[3] = rec(192, 3);
    float **arr[4] = {&r[1].w, &r[1].g, &r[1].s0, &r[1].s1};
    *arr[a] += 1;
    expect(r, 4, 3, (int64_t[]){0, 1, 3}, (int64_t[]){5, 70, 3}, "another gap");
  }
  /* a span that does not start on 16 bytes takes no gap, but back to back
   * tensors still join it */
  r[0] = rec(1, 5);
  r[1] = rec(64, 70);
  r[3] = rec(134, 3);
  expect(r, 4, 2, (int64_t[]){0, 1}, (int64_t[]){5, 73}, "an unaligned start");
  /* gaps with no state arrays, and gradients NULL in both (the library's
   * buffer, placed to mirror the parameters) */
  r[0] = rec(0, 5);
  for (int i = 0; i < 4; i++) r[i].s0 = r[i].s1 = r[i].g = NULL;
  expect(r, 4, 1, (int64_t[]){0}, (int64_t[]){137}, "no state, the library's gradients");
  r[1].g = arena + (1 << 17) + 64; /* the caller's beside the library's: no */
  expect(r, 4, 3, (int64_t[]){0, 1, 3}, (int64_t[]){5, 70, 3}, "one gradient given");
  /* a tensor before the last one's end (overlap) never joins */
  r[1] = rec(3, 7);
  expect(r, 2, 2, (int64_t[]){0, 1}, (int64_t[]){5, 7}, "overlap");
  int64_t first[4];
  r[0] = rec(0, 5);
  r[1] = rec(64, 70);
  r[2] = rec(134, 0);
  r[3] = rec(200, 3);
  r[3].group = 1;
  ck_assert_int_eq(mtopt__segments(r, 4, 1, NULL, first), 2);
  ck_assert_int_eq(first[0], 0);
  ck_assert_int_eq(first[1], 3);
}
END_TEST

int main(void) {
  Suite *s = suite_create("segment_rule");
  TCase *tc = tcase_create("rule");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, test_rule);
  tcase_add_test(tc, test_gaps);
  suite_add_tcase(s, tc);
  return tu_main(s);
}

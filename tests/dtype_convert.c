/* The number formats of src/common/dtype.h against independent references:
 * fp16 decoding against ldexp of its fields (all 65536 values); rounding to
 * fp16 and bf16 against the rule "no representable neighbour is nearer, and a
 * tie goes to the even one", on edge values and a million random fp32 bit
 * patterns; stochastic rounding's mean against x; the remainder split's
 * exactness; and the generator's bit balance and independence across
 * neighbouring elements, steps, tensors and seeds. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/dtype.h"
#include "test_util.h"

/* fp16 by its fields, in double. */
static double f16_value(uint16_t h) {
  const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 31) v = m ? NAN : INFINITY;
  else if (e == 0) v = ldexp((double)m, -24);
  else v = ldexp(1024.0 + m, e - 25);
  return s ? -v : v;
}

START_TEST(test_f16_decode_all) {
  for (uint32_t h = 0; h < 65536; h++) {
    const float got = mtopt__f16_to_f32((uint16_t)h);
    const double want = f16_value((uint16_t)h);
    if (isnan(want)) {
      ck_assert_msg(isnan(got), "fp16 %04x: NaN decoded as %g", h, (double)got);
      continue;
    }
    ck_assert_msg((double)got == want && !!signbit(got) == !!signbit(want),
                  "fp16 %04x: got %.9g, want %.9g", h, (double)got, want);
  }
}
END_TEST

/* Whether r is the correctly rounded (nearest, ties to even) encoding of x,
 * by its neighbours in the format: decode(code) gives a code's value, codes
 * are ordered by magnitude within a sign, max_code is the largest finite one. */
static int rounds_right(float x, uint16_t r, double (*decode)(uint16_t), uint16_t max_code) {
  const uint16_t sign = (uint16_t)(signbit(x) ? 0x8000u : 0u);
  const double ax = fabs((double)x);
  const uint16_t mag = (uint16_t)(r & 0x7fffu);
  if ((r & 0x8000u) != sign && ax != 0.0) return 0;
  const double inf_from = decode(max_code) * 1.5 - decode((uint16_t)(max_code - 1)) * 0.5;
  if (mag > max_code) return ax >= inf_from; /* inf: past the midpoint above max */
  const double here = decode(mag), d = fabs(ax - here);
  if (mag < max_code && fabs(decode((uint16_t)(mag + 1)) - ax) < d) return 0;
  if (mag > 0 && fabs(decode((uint16_t)(mag - 1)) - ax) < d) return 0;
  if (mag == max_code && ax >= inf_from) return 0;
  /* a tie: the even code */
  const int tie = (mag < max_code && fabs(decode((uint16_t)(mag + 1)) - ax) == d) ||
                  (mag > 0 && fabs(decode((uint16_t)(mag - 1)) - ax) == d);
  return !tie || (mag & 1u) == 0;
}

static double bf16_value(uint16_t h) { return (double)mtopt__bits_f32((uint32_t)h << 16); }

static float edge(int k) {
  static const float e[] = {0.0f,       -0.0f,      65504.0f,    65519.996f,   65520.0f,
                            65536.0f,   1e-8f,      5.9604645e-8f, 2.9802322e-8f, 8.940697e-8f,
                            6.097555e-5f, 6.1035156e-5f, 1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048,
                            3.3895314e38f, 3.4028235e38f, 1e-40f, 1.1754944e-38f};
  return e[k];
}
#define NEDGE 18

/* Check's assertions write to a pipe each: the loops below count failures
 * and assert once, naming the first. */
static int64_t n_wrong;
static char first_wrong[160];

static void wrong(const char *what, float x, uint16_t got) {
  if (n_wrong++ == 0)
    snprintf(first_wrong, sizeof first_wrong, "%s of %.9g (%08x) is %04x", what, (double)x,
             mtopt__f32_bits(x), got);
}

static void check_rounding(float x) {
  const uint16_t h = mtopt__f32_to_f16(x), b = mtopt__f32_to_bf16(x);
  if (isnan(x)) {
    if (!isnan(mtopt__f16_to_f32(h))) wrong("fp16", x, h);
    if (!isnan(mtopt__bf16_to_f32(b))) wrong("bf16", x, b);
    return;
  }
  if (!rounds_right(x, h, f16_value, 0x7bffu)) wrong("fp16", x, h);
  if (!rounds_right(x, b, bf16_value, 0x7f7fu)) wrong("bf16", x, b);
}

START_TEST(test_round_to_nearest) {
  n_wrong = 0;
  for (int k = 0; k < NEDGE; k++) {
    check_rounding(edge(k));
    check_rounding(-edge(k));
    check_rounding(nextafterf(edge(k), INFINITY));
    check_rounding(nextafterf(edge(k), 0.0f));
  }
  check_rounding(INFINITY);
  check_rounding(-INFINITY);
  check_rounding(NAN);
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 3);
  for (int i = 0; i < 1000000; i++) check_rounding(mtopt__bits_f32((uint32_t)tu_next(&rng)));
  /* fp16's range, densely: exponents -26..16 */
  for (int i = 0; i < 1000000; i++)
    check_rounding((float)ldexp(tu_uniform(&rng, -2.0, 2.0), (int)tu_int(&rng, -26, 16)));
  ck_assert_msg(n_wrong == 0, "%lld wrong roundings, first: %s", (long long)n_wrong, first_wrong);
}
END_TEST

/* E[SR(x)] = x: the mean of n roundings is within 5 standard errors. */
START_TEST(test_stochastic_unbiased) {
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 5);
  static const double fracs[] = {1e-3, 0.1, 0.25, 0.5, 0.9, 0.999};
  const int n = 40000;
  n_wrong = 0;
  for (int trial = 0; trial < 40; trial++) {
    const uint16_t lo = (uint16_t)tu_int(&rng, 0x0080, 0x7f00);
    const double a = bf16_value(lo), b = bf16_value((uint16_t)(lo + 1));
    for (size_t f = 0; f < sizeof fracs / sizeof fracs[0]; f++) {
      const float x = (float)(a + fracs[f] * (b - a));
      const double p = ((double)x - a) / (b - a);
      double sum = 0.0;
      for (int i = 0; i < n; i++) {
        const uint16_t r = mtopt__f32_to_bf16_sr(x, (uint32_t)tu_next(&rng));
        if (r != lo && r != lo + 1) wrong("SR", x, r);
        sum += bf16_value(r);
      }
      const double mean = sum / n, se = (b - a) * sqrt(p * (1 - p) / n);
      ck_assert_msg(fabs(mean - x) <= 5 * se + 1e-12 * fabs(x),
                    "SR(%.9g) mean %.9g, off by %.3g standard errors", (double)x, mean,
                    fabs(mean - x) / se);
    }
  }
  ck_assert_msg(n_wrong == 0, "%lld roundings off the two neighbours, first: %s",
                (long long)n_wrong, first_wrong);
  /* Representable values, infinities and NaN pass through. */
  for (int i = 0; i < 1000; i++) {
    const uint16_t h = (uint16_t)tu_int(&rng, 0, 0x7f7f);
    ck_assert_int_eq(mtopt__f32_to_bf16_sr(mtopt__bf16_to_f32(h), (uint32_t)tu_next(&rng)), h);
  }
  ck_assert_int_eq(mtopt__f32_to_bf16_sr(INFINITY, 0xffffu), 0x7f80u);
  ck_assert(isnan(mtopt__bf16_to_f32(mtopt__f32_to_bf16_sr(NAN, 0x1234u))));
}
END_TEST

/* Remainders: param and remainder together are exactly the master, and the
 * parameter is the master rounded to nearest (ties away from zero). */
START_TEST(test_remainder_split) {
  tu_rng_t rng;
  tu_rng_init(&rng, tu_seed() + 7);
  n_wrong = 0;
  for (int i = 0; i < 2000000; i++) {
    uint32_t bits = (uint32_t)tu_next(&rng);
    if (i % 7 == 0) bits = (bits & 0xffff0000u) | 0x8000u; /* ties */
    const float x = mtopt__bits_f32(bits);
    if (!isfinite(x)) continue;
    uint16_t p, r;
    mtopt__split_master(x, &p, &r);
    if (mtopt__f32_bits(mtopt__join_master(p, r)) != bits) wrong("join(split)", x, p);
    /* the two bf16 around |x| (above max: 2^128, which rounds to inf) */
    const uint16_t c = (uint16_t)(bits >> 16 & 0x7fffu);
    const double ax = fabs((double)x), below = bf16_value(c);
    const double above = c == 0x7f7fu ? ldexp(1.0, 128) : bf16_value((uint16_t)(c + 1));
    double want = ax - below < above - ax ? below : above; /* ties: above */
    if (want == ldexp(1.0, 128)) want = INFINITY;
    if (fabs(bf16_value(p)) != want) wrong("remainder param", x, p);
  }
  ck_assert_msg(n_wrong == 0, "%lld wrong splits, first: %s", (long long)n_wrong, first_wrong);
}
END_TEST

static double bit_balance(uint32_t (*draw)(int64_t, void *), void *arg, int64_t n) {
  int64_t ones = 0;
  for (int64_t i = 0; i < n; i++) ones += __builtin_popcount(draw(i, arg));
  return (double)ones / (32.0 * n);
}

typedef struct {
  uint32_t k1, k2;
  int64_t de;
} pair_t;

static uint32_t draw_same(int64_t i, void *a) {
  const pair_t *p = a;
  return mtopt__sr_bits(p->k1, i);
}
/* XOR of the draws of (k1, i) and (k2, i + de): half its bits set when the
 * two are independent. */
static uint32_t draw_xor(int64_t i, void *a) {
  const pair_t *p = a;
  return mtopt__sr_bits(p->k1, i) ^ mtopt__sr_bits(p->k2, i + p->de);
}

START_TEST(test_generator_bits) {
  const uint64_t seed = tu_seed();
  const int64_t n = 200000;
  /* 4 standard deviations of a fraction of 32 n fair bits */
  const double tol = 4.0 * 0.5 / sqrt(32.0 * n);
  const uint32_t k = mtopt__sr_key(seed, 10, 3, MTOPT__SR_STREAM_PM);
  const pair_t cases[] = {
      {k, k, 0},
      {k, k, 1}, /* neighbouring elements */
      {k, mtopt__sr_key(seed, 11, 3, MTOPT__SR_STREAM_PM), 0},     /* the next step */
      {k, mtopt__sr_key(seed, 10, 4, MTOPT__SR_STREAM_PM), 0},     /* the next tensor */
      {k, mtopt__sr_key(seed, 10, 3, MTOPT__SR_STREAM_V), 0},      /* the other stream */
      {k, mtopt__sr_key(seed + 1, 10, 3, MTOPT__SR_STREAM_PM), 0}, /* another seed */
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    pair_t p = cases[c];
    const double f = c == 0 ? bit_balance(draw_same, &p, n) : bit_balance(draw_xor, &p, n);
    ck_assert_msg(fabs(f - 0.5) < tol, "case %zu: fraction of ones %.5f", c, f);
  }
  /* Each of the 32 bit positions is fair on its own. */
  for (int b = 0; b < 32; b++) {
    int64_t ones = 0;
    for (int64_t i = 0; i < n; i++) ones += (mtopt__sr_bits(k, i) >> b) & 1u;
    ck_assert_msg(fabs((double)ones / n - 0.5) < 4.0 * 0.5 / sqrt((double)n), "bit %d: %.4f", b,
                  (double)ones / n);
  }
  /* Elements past 2^32 draw fresh bits too. */
  ck_assert_uint_ne(mtopt__sr_bits(k, 5), mtopt__sr_bits(k, 5 + (INT64_C(1) << 32)));
  /* The Weyl value steps by MTOPT__SR_WEYL within a 2^32 block of the index
   * (the CUDA vector path steps it so) and not across one (where it takes
   * the element path). */
  tu_rng_t rng;
  tu_rng_init(&rng, seed + 9);
  for (int i = 0; i < 1000; i++) {
    const int64_t e = (int64_t)(tu_next(&rng) >> 1), k2 = tu_int(&rng, 0, 300);
    const uint32_t lo = (uint32_t)e;
    if (lo > UINT32_MAX - (uint32_t)k2) continue;
    ck_assert_uint_eq(mtopt__sr_weyl(e + k2), mtopt__sr_weyl(e) + (uint32_t)k2 * MTOPT__SR_WEYL);
  }
  const int64_t edge = (INT64_C(3) << 32) - 2;
  ck_assert_uint_ne(mtopt__sr_weyl(edge + 4), mtopt__sr_weyl(edge) + 4u * MTOPT__SR_WEYL);
  /* mtopt__sr_weyl_at steps across a block too (the CPU's tiles): starts
   * just below a 2^32 boundary, and anywhere. */
  for (int i = 0; i < 2000; i++) {
    const int64_t e = i < 1000 ? (((int64_t)tu_int(&rng, 0, 1 << 20)) << 32) - tu_int(&rng, 1, 600)
                               : (int64_t)(tu_next(&rng) >> 2);
    const uint32_t k2 = (uint32_t)tu_int(&rng, 0, 1024);
    ck_assert_uint_eq(mtopt__sr_weyl_at(mtopt__sr_weyl(e), (uint32_t)e, k2), mtopt__sr_weyl(e + k2));
  }
}
END_TEST

Suite *dtype_convert_suite(void) {
  Suite *s = suite_create("dtype_convert");
  TCase *tc = tcase_create("formats");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, test_f16_decode_all);
  tcase_add_test(tc, test_round_to_nearest);
  tcase_add_test(tc, test_stochastic_unbiased);
  tcase_add_test(tc, test_remainder_split);
  tcase_add_test(tc, test_generator_bits);
  suite_add_tcase(s, tc);
  return s;
}

int main(void) { return tu_run(dtype_convert_suite(), 0); }

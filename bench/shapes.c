/* The benchmark's shapes. The model lists follow the parameter order of the
 * reference implementations (HF GPT-2, TinyLlama 1.1B); what matters for a
 * step is the element count of each tensor, so only that is kept. */
#include "shapes.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int64_t *v;
  int64_t n, cap;
} vec_t;

static int push(vec_t *a, int64_t x) {
  if (a->n == a->cap) {
    int64_t cap = a->cap ? a->cap * 2 : 256;
    int64_t *v = realloc(a->v, (size_t)cap * sizeof *v);
    if (!v) return -1;
    a->v = v;
    a->cap = cap;
  }
  a->v[a->n++] = x;
  return 0;
}

/* GPT-2 (HF order): wte, wpe, per layer ln_1 w/b, attn.c_attn w/b,
 * attn.c_proj w/b, ln_2 w/b, mlp.c_fc w/b, mlp.c_proj w/b; then ln_f w/b.
 * 124M: d 768, 12 layers (148 tensors); XL: d 1600, 48 layers (580). */
static int gpt2(vec_t *a, int64_t d, int layers) {
  const int64_t vocab = 50257, ctx = 1024;
  int rc = push(a, vocab * d) | push(a, ctx * d);
  for (int l = 0; l < layers; l++) {
    rc |= push(a, d) | push(a, d);                 /* ln_1 */
    rc |= push(a, d * 3 * d) | push(a, 3 * d);     /* attn.c_attn */
    rc |= push(a, d * d) | push(a, d);             /* attn.c_proj */
    rc |= push(a, d) | push(a, d);                 /* ln_2 */
    rc |= push(a, d * 4 * d) | push(a, 4 * d);     /* mlp.c_fc */
    rc |= push(a, 4 * d * d) | push(a, d);         /* mlp.c_proj */
  }
  rc |= push(a, d) | push(a, d); /* ln_f */
  return rc;
}

/* TinyLlama 1.1B: vocab 32000, d 2048, 22 layers, intermediate 5632, grouped
 * query attention with 4 kv heads of 64 (k/v project to 256), RMSNorm weights
 * only, untied lm_head. 201 tensors, 1,100,048,384 parameters. */
static int llama_1b(vec_t *a) {
  const int64_t vocab = 32000, d = 2048, inter = 5632, kv = 4 * 64;
  int rc = push(a, vocab * d); /* embed_tokens */
  for (int l = 0; l < 22; l++) {
    rc |= push(a, d * d) | push(a, kv * d) | push(a, kv * d) | push(a, d * d); /* q k v o */
    rc |= push(a, inter * d) | push(a, inter * d) | push(a, d * inter); /* gate up down */
    rc |= push(a, d) | push(a, d); /* input / post-attention RMSNorm */
  }
  rc |= push(a, d) | push(a, vocab * d); /* final norm, lm_head */
  return rc;
}

/* splitmix64; torch_bench.py has the same generator. */
static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

/* 100,000 tensors, log-uniform in [1, 4096]: an octave 2^e (e uniform in
 * 0..12), then uniform within it. Integer arithmetic only, so Python draws
 * exactly the same sizes. */
static int many_mixed(vec_t *a) {
  uint64_t s = 0x6D746F7074ull; /* "mtopt" */
  int rc = 0;
  for (int i = 0; i < 100000; i++) {
    const uint64_t r1 = splitmix(&s), r2 = splitmix(&s);
    const int64_t lo = INT64_C(1) << (r1 % 13);
    int64_t n = lo + (int64_t)(r2 % (uint64_t)lo);
    if (n > 4096) n = 4096;
    rc |= push(a, n);
  }
  return rc;
}

static int from_file(vec_t *a, const char *path, char *err, size_t errlen) {
  FILE *f = fopen(path, "r");
  if (!f) {
    snprintf(err, errlen, "cannot open shape file '%s': %s", path, strerror(errno));
    return -1;
  }
  char line[512];
  int lineno = 0, rc = 0;
  while (rc == 0 && fgets(line, sizeof line, f)) {
    lineno++;
    char *hash = strchr(line, '#');
    if (hash) *hash = '\0';
    char *p = line;
    while (isspace((unsigned char)*p)) p++;
    if (*p == '\0') continue;
    char *end;
    errno = 0;
    const long long v = strtoll(p, &end, 10);
    while (isspace((unsigned char)*end)) end++;
    if (errno || *end != '\0' || v <= 0) {
      snprintf(err, errlen, "%s:%d: expected one positive element count", path, lineno);
      rc = -1;
    } else if (push(a, v)) {
      snprintf(err, errlen, "out of memory reading %s", path);
      rc = -1;
    }
  }
  fclose(f);
  if (rc == 0 && a->n == 0) {
    snprintf(err, errlen, "shape file '%s' lists no tensors", path);
    rc = -1;
  }
  return rc;
}

int bench_shape_make(const char *name, bench_shape_t *out, char *err, size_t errlen) {
  vec_t a = {0};
  int rc;
  memset(out, 0, sizeof *out);
  if (strcmp(name, "gpt2") == 0)
    rc = gpt2(&a, 768, 12);
  else if (strcmp(name, "gpt2-xl") == 0)
    rc = gpt2(&a, 1600, 48);
  else if (strcmp(name, "llama-1.1b") == 0)
    rc = llama_1b(&a);
  else if (strcmp(name, "many-4096") == 0) {
    rc = 0;
    for (int i = 0; i < 8192; i++) rc |= push(&a, 4096);
  } else if (strcmp(name, "many-mixed") == 0)
    rc = many_mixed(&a);
  else if (strncmp(name, "file:", 5) == 0) {
    if (from_file(&a, name + 5, err, errlen)) {
      free(a.v);
      return -1;
    }
    rc = 0;
  } else {
    snprintf(err, errlen,
             "unknown shape '%s' (gpt2, gpt2-xl, llama-1.1b, many-4096, many-mixed, "
             "file:PATH)",
             name);
    free(a.v);
    return -1;
  }
  if (rc) {
    snprintf(err, errlen, "out of memory building shape '%s'", name);
    free(a.v);
    return -1;
  }
  snprintf(out->name, sizeof out->name, "%s", name);
  out->n = a.n;
  out->numel = a.v;
  for (int64_t i = 0; i < a.n; i++) out->total += a.v[i];
  return 0;
}

void bench_shape_free(bench_shape_t *s) {
  free(s->numel);
  s->numel = NULL;
  s->n = s->total = 0;
}

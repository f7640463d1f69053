/* The benchmark's shapes: the element count of every tensor of a model, in
 * the parameter order of its reference implementation (model.parameters() of
 * the HF or timm module; a tied weight counted once). bench/shapes.py builds
 * the same lists for torch_bench.py, with the same structure and generators;
 * `mtopt_bench --print-shapes` and `shapes.py --print` print one line per
 * shape (tensors, params, a hash of the list) and `shapes.py --check BIN`
 * compares the two (the ctest bench_shapes_agree, label cpu). */
#include "shapes.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  int64_t *v;
  int64_t n, cap;
  int oom;
} vec_t;

/* Appends one element count; an allocation failure is remembered in a->oom. */
static void push(vec_t *a, int64_t x) {
  if (a->n == a->cap) {
    const int64_t cap = a->cap ? a->cap * 2 : 256;
    int64_t *v = realloc(a->v, (size_t)cap * sizeof *v);
    if (!v) {
      a->oom = 1;
      return;
    }
    a->v = v;
    a->cap = cap;
  }
  a->v[a->n++] = x;
}

/* ---------------------------------------------------------------- models -- */

/* GPT-2 (HF order): wte, wpe, per layer ln_1 w/b, attn.c_attn w/b,
 * attn.c_proj w/b, ln_2 w/b, mlp.c_fc w/b, mlp.c_proj w/b; then ln_f w/b. */
static void gpt2(vec_t *a, int64_t d, int layers) {
  const int64_t vocab = 50257, ctx = 1024;
  push(a, vocab * d);
  push(a, ctx * d);
  for (int l = 0; l < layers; l++) {
    const int64_t t[] = {d, d, d * 3 * d, 3 * d, d * d, d, d, d, d * 4 * d, 4 * d, 4 * d * d, d};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) push(a, t[i]);
  }
  push(a, d); /* ln_f */
  push(a, d);
}
static void gpt2_124m(vec_t *a) { gpt2(a, 768, 12); }
static void gpt2_xl(vec_t *a) { gpt2(a, 1600, 48); }

/* TinyLlama 1.1B: vocab 32000, d 2048, 22 layers, intermediate 5632, grouped
 * query attention with 4 kv heads of 64 (k/v project to 256), RMSNorm weights
 * only, untied lm_head. */
static void llama_1b(vec_t *a) {
  const int64_t vocab = 32000, d = 2048, inter = 5632, kv = 4 * 64;
  push(a, vocab * d); /* embed_tokens */
  for (int l = 0; l < 22; l++) {
    const int64_t t[] = {d * d,     kv * d,    kv * d, d * d, /* q k v o */
                         inter * d, inter * d, d * inter,     /* gate up down */
                         d,         d};                       /* two RMSNorms */
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) push(a, t[i]);
  }
  push(a, d);         /* final norm */
  push(a, vocab * d); /* lm_head */
}

/* BERT-large, uncased (HF BertModel of bert-large-uncased): embeddings (word
 * 30522, position 512, token type 2, LayerNorm w/b), 24 layers of query,
 * key, value and attention output dense (1024x1024 + b each), attention
 * LayerNorm, intermediate dense 4096x1024 + b, output dense 1024x4096 + b,
 * output LayerNorm; the pooler dense 1024x1024 + b. */
static void bert_large(vec_t *a) {
  const int64_t d = 1024, ff = 4096;
  push(a, 30522 * d);
  push(a, 512 * d);
  push(a, 2 * d);
  push(a, d);
  push(a, d);
  for (int l = 0; l < 24; l++) {
    for (int i = 0; i < 4; i++) { /* query, key, value, attention.output.dense */
      push(a, d * d);
      push(a, d);
    }
    const int64_t t[] = {d, d, ff * d, ff, d * ff, d, d, d};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) push(a, t[i]);
  }
  push(a, d * d); /* pooler */
  push(a, d);
}

/* ViT-H/14 at 224x224 (timm vit_huge_patch14_224 order, 1000-class head):
 * cls_token, pos_embed (257 x 1280), patch_embed conv 1280x3x14x14 + b, 32
 * blocks of norm1 w/b, attn.qkv 3840x1280 + b, attn.proj 1280x1280 + b, norm2
 * w/b, mlp.fc1 5120x1280 + b, mlp.fc2 1280x5120 + b; norm w/b, head. */
static void vit_h14(vec_t *a) {
  const int64_t d = 1280, mlp = 5120, tokens = (224 / 14) * (224 / 14) + 1;
  push(a, d);
  push(a, tokens * d);
  push(a, d * 3 * 14 * 14);
  push(a, d);
  for (int l = 0; l < 32; l++) {
    const int64_t t[] = {d, d, 3 * d * d, 3 * d, d * d, d, d, d, mlp * d, mlp, d * mlp, d};
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) push(a, t[i]);
  }
  push(a, d);
  push(a, d);
  push(a, 1000 * d); /* head */
  push(a, 1000);
}

/* One feed-forward sublayer of Switch-Base-8: dense (wi, wo), or sparse (the
 * router's classifier 8x768, then wi and wo of each of the 8 experts); then
 * its layer norm (a scale only, as all of T5's). */
static void switch_ff(vec_t *a, int sparse) {
  const int64_t d = 768, ff = 3072, experts = 8;
  if (sparse) push(a, experts * d);
  for (int64_t e = 0; e < (sparse ? experts : 1); e++) {
    push(a, ff * d);
    push(a, d * ff);
  }
  push(a, d);
}

/* The q, k, v, o projections (768x768, no biases) of one attention sublayer,
 * the relative position bias (32 buckets x 12 heads) where it is the stack's
 * first block, then the sublayer's layer norm. */
static void switch_attn(vec_t *a, int first) {
  const int64_t d = 768;
  for (int i = 0; i < 4; i++) push(a, d * d);
  if (first) push(a, 32 * 12);
  push(a, d);
}

/* Switch-Base-8 (Fedus et al. 2021; HF google/switch-base-8,
 * SwitchTransformersForConditionalGeneration): the T5-Base encoder-decoder,
 * d_model 768, 12 heads of 64, d_ff 3072, 12 encoder and 12 decoder blocks,
 * every second block's feed-forward (blocks 1, 3, ..., 11 of each stack) a
 * mixture of 8 experts with a top-1 router. The shared embedding 32128x768 is
 * counted once (the stacks and the lm_head tie to it). */
static void switch_base8(vec_t *a) {
  push(a, 32128 * 768);
  for (int decoder = 0; decoder < 2; decoder++) {
    for (int l = 0; l < 12; l++) {
      switch_attn(a, l == 0);
      if (decoder) switch_attn(a, 0); /* cross-attention: no position bias */
      switch_ff(a, l % 2 == 1);
    }
    push(a, 768); /* final_layer_norm */
  }
}

/* --------------------------------------------------------- synthetic -- */

/* splitmix64; torch_bench.py has the same generator. */
static uint64_t splitmix(uint64_t *s) {
  uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static void many_4096(vec_t *a) {
  for (int i = 0; i < 8192; i++) push(a, 4096);
}

/* 100,000 tensors, log-uniform in [1, 4096]: an octave 2^e (e uniform in
 * 0..12), then uniform within it. Integer arithmetic only, so Python draws
 * exactly the same sizes. */
static void many_mixed(vec_t *a) {
  uint64_t s = 0x6D746F7074ull; /* "mtopt" */
  for (int i = 0; i < 100000; i++) {
    const uint64_t r1 = splitmix(&s), r2 = splitmix(&s);
    const int64_t lo = INT64_C(1) << (r1 % 13);
    const int64_t n = lo + (int64_t)(r2 % (uint64_t)lo);
    push(a, n > 4096 ? 4096 : n);
  }
}

/* 50,000 mostly tiny tensors (the biases, norms, gains and scales of a wide
 * model): by r1 % 100, 50% uniform in [1, 63], 47% in [64, 4095] (an octave
 * 2^e, e = 6 + (r1 / 100) % 6, then uniform within it), 3% uniform in
 * [4096, 70000]. Integer arithmetic only, as for many-mixed. */
static void tiny_50k(vec_t *a) {
  uint64_t s = 0x74696E7935306Bull; /* "tiny50k" */
  for (int i = 0; i < 50000; i++) {
    const uint64_t r1 = splitmix(&s), r2 = splitmix(&s), c = r1 % 100;
    if (c < 50) {
      push(a, 1 + (int64_t)(r2 % 63));
    } else if (c < 97) {
      const int64_t lo = INT64_C(1) << (6 + (r1 / 100) % 6);
      push(a, lo + (int64_t)(r2 % (uint64_t)lo));
    } else {
      push(a, 4096 + (int64_t)(r2 % (70000 - 4096 + 1)));
    }
  }
}

/* ------------------------------------------------------------- registry -- */

typedef struct {
  const char *name;
  void (*build)(vec_t *a);
} shape_def_t;

/* Every built-in shape, in the order --print-shapes lists them. */
static const shape_def_t shape_defs[] = {
    {"gpt2", gpt2_124m},         {"gpt2-xl", gpt2_xl},           {"llama-1.1b", llama_1b},
    {"bert-large", bert_large},  {"vit-h-14", vit_h14},          {"switch-base-8", switch_base8},
    {"many-4096", many_4096},    {"many-mixed", many_mixed},     {"tiny-50k", tiny_50k},
};
#define NDEFS ((int)(sizeof shape_defs / sizeof shape_defs[0]))

int bench_shape_count(void) { return NDEFS; }

const char *bench_shape_name(int i) { return i >= 0 && i < NDEFS ? shape_defs[i].name : NULL; }

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
    } else {
      push(a, v);
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
  memset(out, 0, sizeof *out);
  int found = 0;
  if (strncmp(name, "file:", 5) == 0) {
    if (from_file(&a, name + 5, err, errlen)) {
      free(a.v);
      return -1;
    }
    found = 1;
  }
  for (int i = 0; i < NDEFS && !found; i++) {
    if (strcmp(name, shape_defs[i].name) == 0) {
      shape_defs[i].build(&a);
      found = 1;
    }
  }
  if (!found) {
    int k = snprintf(err, errlen, "unknown shape '%s' (", name);
    for (int i = 0; i < NDEFS && k > 0 && (size_t)k < errlen; i++)
      k += snprintf(err + k, errlen - (size_t)k, "%s, ", shape_defs[i].name);
    if (k > 0 && (size_t)k < errlen) snprintf(err + k, errlen - (size_t)k, "file:PATH)");
    return -1;
  }
  if (a.oom) {
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

/* FNV-1a over 64-bit words: one xor and one multiply per element count, so
 * that Python computes it quickly too. */
uint64_t bench_shape_hash(const bench_shape_t *s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (int64_t i = 0; i < s->n; i++) {
    h ^= (uint64_t)s->numel[i];
    h *= 0x100000001B3ull;
  }
  return h;
}

int bench_shape_print(FILE *f, const char *name) {
  bench_shape_t s;
  char err[512];
  if (bench_shape_make(name, &s, err, sizeof err)) {
    fprintf(stderr, "%s\n", err);
    return -1;
  }
  int64_t under64 = 0, under4096 = 0, largest = 0;
  for (int64_t i = 0; i < s.n; i++) {
    under64 += s.numel[i] < 64;
    under4096 += s.numel[i] < 4096;
    if (s.numel[i] > largest) largest = s.numel[i];
  }
  fprintf(f, "%s %" PRId64 " %" PRId64 " %016" PRIx64 " under64 %" PRId64 " under4096 %" PRId64
             " largest %" PRId64 "\n",
          s.name, s.n, s.total, bench_shape_hash(&s), under64, under4096, largest);
  bench_shape_free(&s);
  return 0;
}

void bench_shape_free(bench_shape_t *s) {
  free(s->numel);
  s->numel = NULL;
  s->n = s->total = 0;
}

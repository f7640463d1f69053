#!/usr/bin/env python3
"""The step benchmark's shapes in Python: the same lists as bench/shapes.c
(the element count of every tensor of a model, in its parameter order; the
same generators for the synthetic sets), for bench/torch_bench.py.

  python3 bench/shapes.py --print [NAME ...]     one line per shape
  python3 bench/shapes.py --check MTOPT_BENCH    the lines of both agree

A line is: name, tensors, params, a 64-bit hash of the ordered list
(FNV-1a over 64-bit words, 16 hex digits), then "under64 N under4096 N
largest N"; `mtopt_bench --print-shapes` prints the same. --check runs it
and exits 1 if any built-in shape differs (a ctest, label cpu).
"""
import argparse
import subprocess
import sys

M64 = (1 << 64) - 1


# ---------------------------------------------------------------- models --

def gpt2(d, layers):
    """HF GPT-2: wte, wpe, per layer ln_1, attn.c_attn, attn.c_proj, ln_2,
    mlp.c_fc, mlp.c_proj (weights and biases), then ln_f."""
    vocab, ctx = 50257, 1024
    out = [vocab * d, ctx * d]
    for _ in range(layers):
        out += [d, d, d * 3 * d, 3 * d, d * d, d, d, d, d * 4 * d, 4 * d, 4 * d * d, d]
    return out + [d, d]


def llama_1b():
    """TinyLlama 1.1B: 22 layers of q k v o, gate up down, two RMSNorms."""
    vocab, d, inter, kv = 32000, 2048, 5632, 4 * 64
    out = [vocab * d]
    for _ in range(22):
        out += [d * d, kv * d, kv * d, d * d, inter * d, inter * d, d * inter, d, d]
    return out + [d, vocab * d]


def bert_large():
    """HF BertModel of bert-large-uncased: embeddings, 24 layers, pooler."""
    d, ff = 1024, 4096
    out = [30522 * d, 512 * d, 2 * d, d, d]
    for _ in range(24):
        out += [d * d, d] * 4  # query, key, value, attention.output.dense
        out += [d, d, ff * d, ff, d * ff, d, d, d]
    return out + [d * d, d]


def vit_h14():
    """timm vit_huge_patch14_224, 1000-class head."""
    d, mlp, tokens = 1280, 5120, (224 // 14) ** 2 + 1
    out = [d, tokens * d, d * 3 * 14 * 14, d]
    for _ in range(32):
        out += [d, d, 3 * d * d, 3 * d, d * d, d, d, d, mlp * d, mlp, d * mlp, d]
    return out + [d, d, 1000 * d, 1000]


def switch_base8():
    """HF google/switch-base-8: T5-Base encoder-decoder, every second block's
    feed-forward a mixture of 8 experts; the shared embedding once."""
    d, ff, experts = 768, 3072, 8

    def attn(first):
        return [d * d] * 4 + ([32 * 12] if first else []) + [d]

    def ffn(sparse):
        if not sparse:
            return [ff * d, d * ff, d]
        return [experts * d] + [ff * d, d * ff] * experts + [d]

    out = [32128 * d]
    for decoder in (False, True):
        for layer in range(12):
            out += attn(layer == 0)
            if decoder:
                out += attn(False)  # cross-attention
            out += ffn(layer % 2 == 1)
        out.append(d)  # final_layer_norm
    return out


# ------------------------------------------------------------- synthetic --

def splitmix(state):
    state = (state + 0x9E3779B97F4A7C15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def many_mixed():
    """100,000 tensors, log-uniform in [1, 4096]."""
    s = 0x6D746F7074  # "mtopt"
    out = []
    for _ in range(100000):
        s, r1 = splitmix(s)
        s, r2 = splitmix(s)
        lo = 1 << (r1 % 13)
        out.append(min(lo + r2 % lo, 4096))
    return out


def tiny_50k():
    """50,000 mostly tiny tensors: 50% in [1, 63], 47% in [64, 4095], 3% in
    [4096, 70000] (shapes.c says how)."""
    s = 0x74696E7935306B  # "tiny50k"
    out = []
    for _ in range(50000):
        s, r1 = splitmix(s)
        s, r2 = splitmix(s)
        c = r1 % 100
        if c < 50:
            out.append(1 + r2 % 63)
        elif c < 97:
            lo = 1 << (6 + (r1 // 100) % 6)
            out.append(lo + r2 % lo)
        else:
            out.append(4096 + r2 % (70000 - 4096 + 1))
    return out


# In shapes.c's order.
SHAPES = {
    "gpt2": lambda: gpt2(768, 12),
    "gpt2-xl": lambda: gpt2(1600, 48),
    "llama-1.1b": llama_1b,
    "bert-large": bert_large,
    "vit-h-14": vit_h14,
    "switch-base-8": switch_base8,
    "many-4096": lambda: [4096] * 8192,
    "many-mixed": many_mixed,
    "tiny-50k": tiny_50k,
}


def from_file(path):
    out = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            line = line.split("#", 1)[0].strip()
            if not line:
                continue
            v = int(line)
            if v <= 0:
                raise ValueError(f"{path}:{lineno}: expected a positive element count")
            out.append(v)
    if not out:
        raise ValueError(f"shape file {path} lists no tensors")
    return out


def numels(name):
    if name.startswith("file:"):
        return from_file(name[5:])
    if name not in SHAPES:
        raise ValueError(f"unknown shape '{name}' ({', '.join(SHAPES)}, file:PATH)")
    return SHAPES[name]()


def shape_hash(ns):
    """FNV-1a over 64-bit words, as bench_shape_hash."""
    h = 0xCBF29CE484222325
    for n in ns:
        h = ((h ^ n) * 0x100000001B3) & M64
    return h


def line(name):
    ns = numels(name)
    return (f"{name} {len(ns)} {sum(ns)} {shape_hash(ns):016x} "
            f"under64 {sum(n < 64 for n in ns)} under4096 {sum(n < 4096 for n in ns)} "
            f"largest {max(ns)}")


def check(binary):
    """0 if `binary --print-shapes` prints this module's lines, else 1."""
    got = subprocess.run([binary, "--print-shapes"], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    want = [line(n) for n in SHAPES]
    bad = 0
    for w, g in zip(want, got + [""] * len(want)):
        ok = w == g
        bad += not ok
        print(("ok   " if ok else "DIFF ") + w + ("" if ok else f"\n     C: {g}"))
    if len(got) != len(want):
        print(f"DIFF {binary} printed {len(got)} shapes, Python has {len(want)}")
        bad += 1
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--print", nargs="*", metavar="NAME", help="print shapes (default all)")
    ap.add_argument("--check", metavar="MTOPT_BENCH", help="compare with mtopt_bench's")
    args = ap.parse_args()
    if args.check:
        return check(args.check)
    for n in args.print or list(SHAPES):
        print(line(n))
    return 0


if __name__ == "__main__":
    sys.exit(main())

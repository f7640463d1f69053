#!/usr/bin/env python3
"""Golden trajectories from torch.optim for tests/golden.c.

Usage: python3 make_golden.py OUT_DIR      (OUT_DIR is tests/data in the repo)

Runs on the CPU in fp32 with a fixed seed: four tensors of odd sizes, T steps,
fresh random gradients each step (some steps small enough that clipping does
not bite), for AdamW, Adam (L2 weight decay), SGD with momentum and dampening,
and SGD with Nesterov momentum, each without and with clip_grad_norm_.
LAMB is not in torch.optim and has no fixture.

Files (all little-endian; text header lines, then the line "end", then raw
float32 data):

  golden_grads.bin
      mtopt-golden-grads 1
      tensors <n> <numel_0> ... <numel_n-1>
      steps <T>
      end
      <initial weights: sum(numel) floats, tensors in order>
      <gradients: T * sum(numel) floats, step-major, tensors in order>

  golden_<case>.bin
      mtopt-golden 1
      case <name>
      optimizer adamw|adam|sgd
      <hyperparameter> <value as a C99 hex float>     (one per line)
      norms <T hex floats>         (clipped cases: torch's total norm per step)
      tensors <n> <numel...>
      steps <T>
      end
      <weights after each step: T * sum(numel) floats>
"""
import os
import struct
import sys

import torch

SEED = 20240611
SIZES = [7, 33, 127, 1000]
STEPS = 20
MAX_NORM = 5.0  # the gradients' norm is ~20 on most steps, ~1 on small ones

CASES = [
    # name, optimizer, kwargs (torch names), clip
    ("adamw", "adamw", dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1), False),
    ("adam", "adam", dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01), False),
    ("sgd_momentum", "sgd",
     dict(lr=1e-2, momentum=0.9, dampening=0.1, weight_decay=0.01, nesterov=False), False),
    ("sgd_nesterov", "sgd",
     dict(lr=1e-2, momentum=0.9, dampening=0.0, weight_decay=0.01, nesterov=True), False),
]
CASES += [(n + "_clip", o, k, True) for (n, o, k, _) in CASES]


def f32(x):
    """x rounded to float32, as a Python float (what mtopt's config holds)."""
    return struct.unpack("<f", struct.pack("<f", float(x)))[0]


def hexf(x):
    return float(f32(x)).hex()


def _pack(t):
    """float32 little-endian bytes (no numpy needed)."""
    vals = t.detach().contiguous().view(-1).tolist()
    return struct.pack("<%df" % len(vals), *vals)


def make_data():
    g = torch.Generator().manual_seed(SEED)

    def uniform(n, scale=1.0):
        x = torch.rand(n, generator=g, dtype=torch.float32) * 2.0 - 1.0
        x[x == 0] = 0.5  # never exact zeros
        return x * scale

    init = [uniform(n) for n in SIZES]
    grads = []
    for t in range(STEPS):
        scale = 0.05 if t % 5 == 3 else 1.0  # a few steps below MAX_NORM
        grads.append([uniform(n, scale) for n in SIZES])
    return init, grads


def run_case(init, grads, opt_name, kw, clip):
    params = [torch.nn.Parameter(w.clone()) for w in init]
    # torch keeps hyperparameters as Python floats; mtopt as float32. Give
    # torch the float32 values so both start from the same numbers.
    kw = dict(kw)
    for k in ("lr", "eps", "weight_decay", "momentum", "dampening"):
        if k in kw:
            kw[k] = f32(kw[k])
    if "betas" in kw:
        kw["betas"] = tuple(f32(b) for b in kw["betas"])
    if opt_name == "adamw":
        opt = torch.optim.AdamW(params, foreach=False, **kw)
    elif opt_name == "adam":
        opt = torch.optim.Adam(params, foreach=False, **kw)
    else:
        opt = torch.optim.SGD(params, foreach=False, **kw)
    traj, norms = [], []
    for step_grads in grads:
        for p, gr in zip(params, step_grads):
            p.grad = gr.clone()
        if clip:
            norms.append(float(torch.nn.utils.clip_grad_norm_(params, f32(MAX_NORM))))
        opt.step()
        traj.append([p.detach().clone() for p in params])
    return traj, norms


def header(lines):
    return ("\n".join(lines) + "\nend\n").encode()


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: make_golden.py OUT_DIR")
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(SEED)
    init, grads = make_data()
    tensors_line = "tensors %d %s" % (len(SIZES), " ".join(map(str, SIZES)))
    with open(os.path.join(out, "golden_grads.bin"), "wb") as f:
        f.write(header(["mtopt-golden-grads 1", tensors_line, "steps %d" % STEPS]))
        f.write(b"".join(_pack(t) for t in init))
        for step_grads in grads:
            f.write(b"".join(_pack(t) for t in step_grads))
    for name, opt_name, kw, clip in CASES:
        traj, norms = run_case(init, grads, opt_name, kw, clip)
        lines = ["mtopt-golden 1", "case " + name, "optimizer " + opt_name]
        for k, v in kw.items():
            if k == "betas":
                lines += ["beta1 " + hexf(v[0]), "beta2 " + hexf(v[1])]
            elif k == "nesterov":
                lines.append("nesterov %d" % int(v))
            else:
                lines.append("%s %s" % (k, hexf(v)))
        if clip:
            lines.append("max_grad_norm " + hexf(MAX_NORM))
            lines.append("norms " + " ".join(hexf(x) for x in norms))
        lines += [tensors_line, "steps %d" % STEPS]
        with open(os.path.join(out, "golden_%s.bin" % name), "wb") as f:
            f.write(header(lines))
            for ws in traj:
                f.write(b"".join(_pack(t) for t in ws))
    print("wrote %d cases to %s (torch %s)" % (len(CASES), out, torch.__version__))


if __name__ == "__main__":
    main()

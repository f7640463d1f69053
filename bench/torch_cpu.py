"""PyTorch's AdamW on the CPU, on mtopt_bench's shapes: torch_bench.py --cpu.

The baselines that bench/compare.py puts next to the rows of
`mtopt_bench --backend cpu --threads N` (run them with the same N):

  fused       torch.optim.AdamW(fused=True) on CPU tensors: ATen's fused CPU
              kernel (aten/src/ATen/native/cpu/FusedAdamKernel.cpp), one
              at::parallel_for over each tensor's elements
  foreach     AdamW(foreach=True): the _foreach_ ops, a pass per operation
  forloop     AdamW(foreach=False)        (not in the default --modes)
  one-tensor  AdamW(fused=True) over one tensor of the total element count
              (not in the default --modes)
  copy        the floor of a B/param figure: dst.copy_(src) of two uint8
              tensors of params x B/param / 2 bytes, ATen's copy kernel split
              over the same threads (both tensors first written by ATen's
              threaded fill). mtopt_bench's CPU copy row is the fastest of
              three threaded copies of its own (memcpy, non-temporal stores,
              an in-place update; bench_cpu.c); this is the one copy PyTorch
              has, so a torch row's floor says how near PyTorch's step comes
              to PyTorch's copy, and the two copy rows side by side say how
              far apart the two floors are.

torch.set_num_threads(--threads) before anything runs (default: PyTorch's,
which is OMP_NUM_THREADS or the core count). Timing: host wall clock,
time.perf_counter() around each step (a CPU step has finished when the call
returns), median over all samples; --repeat R runs the modes R times
interleaved, each round with fresh tensors, and pools the samples (as
mtopt_bench --repeat). host_us stays empty: ms is already host time.
Weights and gradients are random and never zero (torch_bench.rand_nonzero),
B/param is mtopt's count (AdamW 28), so GB/s compares with mtopt_bench.
"""
import datetime
import gc
import statistics
import sys
import time
import traceback

import torch

import torch_bench as tb  # the CUDA runner: rows, builders, output (no cycle at import)

CPU_MODES = ["one-tensor", "forloop", "foreach", "fused"]
DEFAULT_MODES = "fused,foreach"

HEADER = """#
# ms/step   median over all samples (iters x repeat) of the wall-clock time of one
#           step call: time.perf_counter() around it (the step has finished on return)
# B/param   mtopt's count of the bytes a step must move per parameter (AdamW 28), so
#           GB/s compares with mtopt_bench; PyTorch moves the same here
# GB/s      params x B/param / time (1 GB = 1e9 B)
# floor     copy ms / this ms, copy = the copy row of this row's B/param (same shape,
#           same run): dst.copy_(src) of params x B/param / 2 bytes, ATen's copy
#           kernel on the same threads (mtopt_bench's CPU floor: its fastest of three)
# samps     timed samples behind the median
#"""


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def loadavg():
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return ""


def samples(fn, warmup, iters):
    """ms of each of iters calls of fn, after warmup untimed ones."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def step_samples(args, mode, numels, w_src, g_src):
    """One round of a mode: its optimizer on fresh tensors, timed."""
    iters, warmup = args.iters, args.warmup
    if mode in ("forloop", "foreach") and len(numels) > 5000:
        iters, warmup = min(iters, args.loop_iters), min(warmup, 1)
    fn, keep, bpp, _ = tb.build(mode, numels, w_src, g_src, args.lr)
    out = samples(fn, warmup, iters)
    del keep, fn
    return out, bpp


def copy_samples(args, bpp, params):
    n = params * bpp // 2
    src = torch.full((n,), 0x3F, dtype=torch.uint8)
    dst = torch.zeros(n, dtype=torch.uint8)
    return samples(lambda: dst.copy_(src), args.warmup, args.iters)


def attempt(row, fn, *a):
    """fn(*a)'s samples, or None with the failure noted in the row."""
    try:
        return fn(*a)
    except Exception as exc:  # report and go on with the next mode
        row["note"] = f"{type(exc).__name__}: {exc}"[:400]
        traceback.print_exc(file=sys.stderr)
        return None
    finally:
        gc.collect()


def finish(row, pooled):
    if pooled:
        ms = statistics.median(pooled)
        row.update(ms=ms, iters=len(pooled), ok=True,
                   gbps=row["params"] * row["bytes_per_param"] / (ms * 1e-3) / 1e9)


def run_shape(args, shape, modes, gen):
    """Every mode, then a copy row per B/param, args.repeat rounds interleaved;
    then the floors."""
    numels = tb.shapes.numels(shape)
    total = sum(numels)
    gen.manual_seed(1234)
    w_src = tb.rand_nonzero(total, 0.1, gen, device="cpu")
    g_src = tb.rand_nonzero(total, 0.01, gen, device="cpu")
    rows = [tb.new_row(shape, m, numels, tb.BPP_ADAMW) for m in modes]
    pooled = [[] for _ in modes]
    copies = {}  # B/param -> (row, samples)
    for rnd in range(args.repeat):
        for i, mode in enumerate(modes):
            got = attempt(rows[i], step_samples, args, mode, numels, w_src, g_src)
            if got is None:
                pooled[i] = None
            elif pooled[i] is not None:
                pooled[i] += got[0]
                rows[i]["bytes_per_param"] = got[1]
        if rnd == 0:
            for bpp in dict.fromkeys(r["bytes_per_param"] for r in rows):
                row = tb.new_row(shape, "copy", numels, bpp)
                row["copy_variant"] = f"copy_ (ATen copy kernel, {torch.get_num_threads()} threads)"
                copies[bpp] = (row, [])
        for bpp, (row, got) in copies.items():
            if got is not None:
                more = attempt(row, copy_samples, args, bpp, total)
                copies[bpp] = (row, None if more is None else got + more)
    for row, got in zip(rows, pooled):
        finish(row, got)
    for row, got in copies.values():
        finish(row, got)
        rows.append(row)
    tb.set_floors(rows)
    for r in rows:
        tb.print_row(r)
    sys.stdout.flush()
    return rows


def main(args, names):
    modes = [m for m in (args.modes or DEFAULT_MODES).split(",") if m]
    for m in modes:
        if m not in CPU_MODES:
            print(f"torch_bench --cpu: unknown mode '{m}' ({', '.join(CPU_MODES)})",
                  file=sys.stderr)
            return 2
    modes = [m for m in CPU_MODES if m in modes]
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.repeat < 1:
        print("torch_bench --cpu: --repeat must be at least 1", file=sys.stderr)
        return 2
    meta = {
        "tool": "torch_bench",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git_commit": tb.git_commit(),
        "backend": "cpu",
        "device": cpu_name(),
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "torch_version": torch.__version__,
        "optimizer": "adamw",
        "iters": args.iters,
        "warmup": args.warmup,
        "repeat": args.repeat,
        "loadavg_start": loadavg(),
        "floor": "copy ms / ms: the copy row of the row's bytes_per_param "
                 "(params x B/param / 2 bytes, torch copy_), same shape, same run",
    }
    print(f"# torch_bench --cpu  torch {torch.__version__}  commit "
          f"{meta['git_commit'] or 'unknown'}  {meta['date']}")
    print(f"# device {meta['device']}  threads {meta['threads']}  ATen vector ISA "
          f"{meta['cpu_capability']}  optimizer adamw  iters {args.iters}  warmup "
          f"{args.warmup}  repeat {args.repeat}  load {meta['loadavg_start']}")
    gen = torch.Generator(device="cpu")
    rows, failures = tb.run_shapes(names, lambda s: run_shape(args, s, modes, gen), HEADER,
                                   "samps")
    meta["loadavg_end"] = loadavg()
    return tb.write_outputs(args, meta, rows, failures)

#!/usr/bin/env python3
"""PyTorch's optimizer steps on mtopt_bench's shapes, on the same GPU.

The baselines that bench/compare.py puts next to mtopt_bench's rows:

  flat         torch.optim.AdamW(fused=True) over one tensor of the total
               element count: PyTorch's own single-buffer floor
  forloop      AdamW(foreach=False): one set of kernels per tensor
  foreach      AdamW(foreach=True): multi-tensor kernels, metadata per step
  fused        AdamW(fused=True)
  fused-graph  AdamW(fused=True, capturable=True), one step captured in a
               CUDA graph, timed by replays
  gradscaler   the mixed-precision step users write: GradScaler.unscale_ +
               clip_grad_norm_(1.0) + scaler.step(fused AdamW) + scaler.update()

Mixed-precision baselines (not in the default --modes; mtopt_bench --dtype
bf16-all and bf16-master are their counterparts):

  bf16-fused          AdamW(fused=True) on bf16 params and gradients (its
                      state is bf16 too): 14 B/param by mtopt's count
  bf16-fused-graph    the same, captured in a CUDA graph
  master-recipe       bf16 params and gradients with fp32 masters: upcast the
                      gradients into the masters' .grad, fused AdamW on the
                      masters, copy the masters into the bf16 params: 28 B/param
  master-recipe-graph the same, captured in a CUDA graph

Same flags and columns as mtopt_bench (--shapes, --iters, --warmup, --json,
...). Timing: torch.cuda.Event pairs around K back-to-back steps (K > 1 only
for steps under 0.25 ms), median over iters; host_us is the median host time
to return from one step call with the stream idle. Weights and gradients are
random and never zero. bytes/param uses mtopt's count (AdamW 28, the mixed
step 32) so GB/s is comparable across implementations, not what PyTorch
actually moves (it moves more).

Run: python3 bench/torch_bench.py --json torch_bench.json
"""
import argparse
import datetime
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import time
import traceback

try:
    import torch
except ImportError:  # shapes and helpers stay importable without it
    torch = None

MODES = ["flat", "forloop", "foreach", "fused", "fused-graph", "gradscaler"]
MIXED_MODES = ["bf16-fused", "bf16-fused-graph", "master-recipe", "master-recipe-graph"]
BPP_MODE = {"gradscaler": 32, "bf16-fused": 14, "bf16-fused-graph": 14, "master-recipe": 28,
            "master-recipe-graph": 28}
ALL_SHAPES = ["gpt2", "gpt2-xl", "llama-1.1b", "many-4096", "many-mixed"]
BPP_ADAMW = 28  # read w, g, m, v; write w, m, v (fp32)
DEVICE = "cuda"


# ---------------------------------------------------------------- shapes --
# The same lists as bench/shapes.c.

def gpt2(d, layers):
    vocab, ctx = 50257, 1024
    out = [vocab * d, ctx * d]
    for _ in range(layers):
        out += [d, d, d * 3 * d, 3 * d, d * d, d, d, d, d * 4 * d, 4 * d, 4 * d * d, d]
    out += [d, d]
    return out


def llama_1b():
    vocab, d, inter, kv = 32000, 2048, 5632, 4 * 64
    out = [vocab * d]
    for _ in range(22):
        out += [d * d, kv * d, kv * d, d * d, inter * d, inter * d, d * inter, d, d]
    out += [d, vocab * d]
    return out


M64 = (1 << 64) - 1


def splitmix(state):
    state = (state + 0x9E3779B97F4A7C15) & M64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return state, z ^ (z >> 31)


def many_mixed():
    s = 0x6D746F7074  # "mtopt"
    out = []
    for _ in range(100000):
        s, r1 = splitmix(s)
        s, r2 = splitmix(s)
        lo = 1 << (r1 % 13)
        out.append(min(lo + r2 % lo, 4096))
    return out


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


def shape_numels(name):
    if name == "gpt2":
        return gpt2(768, 12)
    if name == "gpt2-xl":
        return gpt2(1600, 48)
    if name == "llama-1.1b":
        return llama_1b()
    if name == "many-4096":
        return [4096] * 8192
    if name == "many-mixed":
        return many_mixed()
    if name.startswith("file:"):
        return from_file(name[5:])
    raise ValueError(f"unknown shape '{name}' (gpt2, gpt2-xl, llama-1.1b, many-4096, "
                     "many-mixed, file:PATH)")


def split_shapes(args_list):
    out = []
    for a in args_list:
        while a:
            if a.startswith("file:"):  # a path takes the rest (it may hold commas)
                out.append(a)
                break
            head, _, a = a.partition(",")
            if head:
                out.append(head)
    return out


# ---------------------------------------------------------------- timing --

SLOW_MS = 2000.0  # steps slower than this are timed once


def time_steps(fn, warmup, iters):
    """Median ms per step (events around K steps) and median host us per call."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    fn()
    e.record()
    e.synchronize()
    t = s.elapsed_time(e)
    if t > SLOW_MS:  # one step takes seconds (a for-loop over 100,000 tensors):
        return t, None, 1  # the probe is the sample; more would blow the budget
    k = 1 if t >= 0.25 else min(64, math.ceil(0.25 / max(t, 0.002)))
    evs = [torch.cuda.Event(enable_timing=True) for _ in range(iters + 1)]
    evs[0].record()
    for i in range(iters):
        for _ in range(k):
            fn()
        evs[i + 1].record()
    torch.cuda.synchronize()
    samples = [evs[i].elapsed_time(evs[i + 1]) / k for i in range(iters)]
    host = []
    for _ in range(min(iters, 20)):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e6)
    torch.cuda.synchronize()
    return statistics.median(samples), statistics.median(host), k


def count_launches(fn):
    """Device operations (kernels, memcpy, memset) of one step, from the
    profiler; None where the profiler is unavailable."""
    try:
        from torch.profiler import ProfilerActivity, profile
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        n = 0
        for ev in prof.events():
            if getattr(ev, "device_type", None) == torch.autograd.DeviceType.CUDA:
                n += 1
        return n if n > 0 else None
    except Exception as exc:  # the count is informative only
        print(f"# launch count unavailable: {exc}", file=sys.stderr)
        return None


# ------------------------------------------------------------------ data --

def rand_nonzero(total, lo, gen):
    """Uniform magnitude in [lo, 1), random sign: never zero. In pieces, so
    the temporaries stay small next to a 1.5 B-element buffer."""
    out = torch.empty(total, device=DEVICE, dtype=torch.float32)
    piece = 1 << 26
    for a in range(0, total, piece):
        b = min(total, a + piece)
        mag = torch.rand(b - a, device=DEVICE, generator=gen).mul_(1.0 - lo).add_(lo)
        sign = torch.rand(b - a, device=DEVICE, generator=gen) < 0.5
        out[a:b] = torch.where(sign, -mag, mag)
    return out


def make_params(numels, w_src, g_src, grad_scale=1.0, dtype=None):
    """Separate tensors, as a model has them (each its own allocation)."""
    params = []
    for w, g in zip(w_src.split(numels), g_src.split(numels)):
        p = torch.nn.Parameter(w.clone() if dtype is None else w.to(dtype))
        g = g.clone() if grad_scale == 1.0 else g.clone().mul_(grad_scale)
        p.grad = g if dtype is None else g.to(dtype)
        params.append(p)
    return params


def graphed(step):
    """One step captured in a CUDA graph, after warm-up steps on a side stream
    (the documented recipe: capturable optimizers make their state lazily)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


# ----------------------------------------------------------------- modes --

def build(mode, numels, w_src, g_src, lr):
    """Returns (step function, objects to keep alive, bytes/param, checker)."""
    if mode == "flat":
        params = make_params([sum(numels)], w_src, g_src)
        opt = torch.optim.AdamW(params, lr=lr, fused=True)
        return opt.step, [params, opt], BPP_ADAMW, None
    if mode in ("forloop", "foreach", "fused"):
        params = make_params(numels, w_src, g_src)
        kw = {"forloop": {"foreach": False}, "foreach": {"foreach": True},
              "fused": {"fused": True}}[mode]
        opt = torch.optim.AdamW(params, lr=lr, **kw)
        return opt.step, [params, opt], BPP_ADAMW, None
    if mode == "fused-graph":
        params = make_params(numels, w_src, g_src)
        opt = torch.optim.AdamW(params, lr=lr, fused=True, capturable=True)
        graph = graphed(opt.step)
        return graph.replay, [params, opt, graph], BPP_ADAMW, None
    if mode in ("bf16-fused", "bf16-fused-graph"):
        params = make_params(numels, w_src, g_src, dtype=torch.bfloat16)
        graph_it = mode.endswith("graph")
        opt = torch.optim.AdamW(params, lr=lr, fused=True, capturable=graph_it)
        if not graph_it:
            return opt.step, [params, opt], BPP_MODE[mode], None
        graph = graphed(opt.step)
        return graph.replay, [params, opt, graph], BPP_MODE[mode], None
    if mode in ("master-recipe", "master-recipe-graph"):
        model = make_params(numels, w_src, g_src, dtype=torch.bfloat16)
        masters = [torch.nn.Parameter(p.detach().float()) for p in model]
        for m in masters:
            m.grad = torch.empty_like(m)
        graph_it = mode.endswith("graph")
        opt = torch.optim.AdamW(masters, lr=lr, fused=True, capturable=graph_it)
        grads16, grads32 = [p.grad for p in model], [m.grad for m in masters]
        data16 = [p.data for p in model]

        def step():
            torch._foreach_copy_(grads32, grads16)
            opt.step()
            torch._foreach_copy_(data16, masters)

        if not graph_it:
            return step, [model, masters, opt], BPP_MODE[mode], None
        graph = graphed(step)
        return graph.replay, [model, masters, opt, graph], BPP_MODE[mode], None
    if mode == "gradscaler":
        # Gradients scaled to a global norm of 0.5 and a loss scale of 1: both
        # unscale_ and clip_grad_norm_ then multiply by exactly 1, so the
        # gradients stay the same random values at every step while every
        # pass still runs.
        norm = float(torch.linalg.vector_norm(g_src))
        params = make_params(numels, w_src, g_src, grad_scale=0.5 / norm)
        opt = torch.optim.AdamW(params, lr=lr, fused=True)
        scaler = torch.amp.GradScaler(DEVICE, init_scale=1.0)
        scaler.scale(torch.ones((), device=DEVICE))  # creates the scale tensor

        def step():
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            scaler.step(opt)
            scaler.update()

        def checker():
            # A skipped step (inf/NaN found) would have backed the scale off.
            s = scaler.get_scale()
            return 0 if s >= 1.0 else None

        return step, [params, opt, scaler], BPP_MODE[mode], checker
    raise ValueError(mode)


def git_commit():
    env = os.environ.get("MTOPT_GIT_COMMIT")
    if env:
        return env
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        return subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
    except Exception:
        return ""


HEADER = """#
# ms/step   median over iters of the time of one step: torch.cuda.Events around K
#           back-to-back steps, divided by K (K > 1 only for steps under 0.25 ms)
# launches  device operations (kernels, copies, memsets) in one step, from
#           torch.profiler ('-' where not counted)
# B/param   mtopt's count of the bytes a step must move per parameter (AdamW 28,
#           mixed step 32), so GB/s compares with mtopt_bench; PyTorch moves more
# GB/s      params x B/param / time (1 GB = 1e9 B)
# floor     PyTorch's own flat single-tensor fused step time / this time
# host_us   median host time to return from one step call, stream idle
#"""


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", action="append", default=[],
                    help="gpt2,gpt2-xl,llama-1.1b,many-4096,many-mixed,file:PATH (default all)")
    ap.add_argument("--modes", default=",".join(MODES),
                    help="default: " + ",".join(MODES) + "; also " + ",".join(MIXED_MODES))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--loop-iters", type=int, default=3,
                    help="iteration cap for forloop/foreach above 5000 tensors (default 3)")
    ap.add_argument("--launches", type=int, default=1, choices=[0, 1],
                    help="count device operations per step with torch.profiler "
                         "(skipped above 10000 tensors)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--json")
    ap.add_argument("--csv")
    args = ap.parse_args()

    if torch is None or not torch.cuda.is_available():
        print("torch_bench: CUDA is not available", file=sys.stderr)
        return 2
    torch.cuda.set_device(args.device)
    shapes = split_shapes(args.shapes) or ALL_SHAPES
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES + MIXED_MODES:
            print(f"torch_bench: unknown mode '{m}' ({', '.join(MODES + MIXED_MODES)})",
                  file=sys.stderr)
            return 2
    modes = [m for m in MODES + MIXED_MODES if m in modes]  # flat first: the floor column
    props = torch.cuda.get_device_properties(args.device)
    meta = {
        "tool": "torch_bench",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git_commit": git_commit(),
        "backend": "cuda",
        "device": f"{props.name} ({props.total_memory / 2**30:.1f} GiB)",
        "torch_version": torch.__version__,
        "cuda_version": torch.version.cuda,
        "optimizer": "adamw",
        "iters": args.iters,
        "warmup": args.warmup,
    }
    print(f"# torch_bench  torch {torch.__version__}  CUDA {torch.version.cuda}  "
          f"commit {meta['git_commit'] or 'unknown'}  {meta['date']}")
    print(f"# device {meta['device']}  optimizer adamw  iters {args.iters}  "
          f"warmup {args.warmup}")
    print(HEADER)
    print(f"{'shape':<12} {'mode':<12} {'tensors':>8} {'params':>12} {'ms/step':>10} "
          f"{'launches':>9} {'B/param':>7} {'GB/s':>9} {'floor':>6} {'host_us':>9} "
          f"{'iters':>6}")
    sys.stdout.flush()

    rows = []
    failures = 0
    gen = torch.Generator(device=DEVICE)
    for shape in shapes:
        try:
            numels = shape_numels(shape)
        except (OSError, ValueError) as exc:
            print(f"torch_bench: {exc}", file=sys.stderr)
            failures += 1
            continue
        total = sum(numels)
        gen.manual_seed(1234)
        w_src = rand_nonzero(total, 0.1, gen)
        g_src = rand_nonzero(total, 0.01, gen)
        flat_ms = None
        for mode in modes:
            row = {"shape": shape, "mode": mode, "impl": "torch", "tensors": len(numels),
                   "params": total, "ms": None, "launches_per_step": None,
                   "bytes_per_param": BPP_MODE.get(mode, BPP_ADAMW),
                   "gbps": None, "frac_of_flat": None, "host_us": None, "iters": 0,
                   "steps_per_sample": 1, "check": "-", "skipped": None, "ok": False,
                   "note": ""}
            fn = keep = checker = None
            try:
                iters, warmup = args.iters, args.warmup
                if mode in ("forloop", "foreach") and len(numels) > 5000:
                    iters, warmup = min(iters, args.loop_iters), min(warmup, 1)
                fn, keep, bpp, checker = build(mode, numels, w_src, g_src, args.lr)
                ms, host_us, k = time_steps(fn, warmup, iters)
                if host_us is None:
                    iters, row["note"] = 1, f"one sample: a step takes over {SLOW_MS / 1e3:g} s"
                row.update(ms=ms, host_us=host_us, iters=iters * k, steps_per_sample=k,
                           gbps=total * bpp / (ms * 1e-3) / 1e9)
                if checker is not None:
                    skipped = checker()
                    row["skipped"] = skipped
                    row["check"] = "ok" if skipped == 0 else "FAIL"
                    if skipped != 0:
                        raise RuntimeError("the loss scale backed off: a step was skipped")
                if args.launches and len(numels) <= 10000:
                    row["launches_per_step"] = count_launches(fn)
                if mode == "flat":
                    flat_ms = ms
                if flat_ms:
                    row["frac_of_flat"] = flat_ms / ms
                row["ok"] = True
            except Exception as exc:  # report and go on with the next mode
                row["note"] = f"{type(exc).__name__}: {exc}"[:400]
                traceback.print_exc(file=sys.stderr)
                failures += 1
            fn = keep = checker = None
            gc.collect()
            torch.cuda.empty_cache()
            rows.append(row)
            if row["ok"]:
                fr = f"{row['frac_of_flat']:.3f}" if row["frac_of_flat"] else "-"
                la = str(row["launches_per_step"]) if row["launches_per_step"] else "-"
                hu = f"{row['host_us']:.1f}" if row["host_us"] is not None else "-"
                print(f"{shape:<12} {mode:<12} {len(numels):>8} {total:>12} {row['ms']:>10.4f} "
                      f"{la:>9} {row['bytes_per_param']:>7} {row['gbps']:>9.2f} {fr:>6} "
                      f"{hu:>9} {row['iters']:>6}")
            else:
                print(f"{shape:<12} {mode:<12} {len(numels):>8} {total:>12}   FAILED: "
                      f"{row['note']}")
            sys.stdout.flush()
        del w_src, g_src
        gc.collect()
        torch.cuda.empty_cache()
    print(f"# {len(rows)} rows, {failures} failed")

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    if args.csv:
        keys = ["shape", "mode", "tensors", "params", "ms", "launches_per_step",
                "bytes_per_param", "gbps", "frac_of_flat", "host_us", "iters",
                "steps_per_sample", "check", "ok"]
        with open(args.csv, "w") as f:
            f.write(",".join(keys) + "\n")
            for r in rows:
                f.write(",".join("" if r[k] is None else str(r[k]) for k in keys) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""PyTorch's optimizer steps on mtopt_bench's shapes, on the same GPU.

The baselines that bench/compare.py puts next to mtopt_bench's rows:

  one-tensor   torch.optim.AdamW(fused=True) over one tensor of the total
               element count: PyTorch's kernel on one contiguous buffer
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

After a shape's modes, one `copy` row for each bytes/param figure among
them: dst.copy_(src) of params x B/param / 2 bytes (a device-to-device
cudaMemcpyAsync, as mtopt_bench's copy). Every row's floor is that copy's
time / the row's time, in the same run: the definition mtopt_bench uses.

Same flags and columns as mtopt_bench (--shapes, --iters, --warmup, --json,
...). Timing: torch.cuda.Event pairs around K back-to-back steps (K > 1 only
for steps under 0.25 ms), median over iters; host_us is the median host time
to return from one step call with the stream idle. Weights and gradients are
random and never zero. bytes/param uses mtopt's count (AdamW 28, the mixed
step 32) so GB/s is comparable across implementations, not what PyTorch
actually moves (it moves more). The shapes come from bench/shapes.py, the
twin of mtopt_bench's shapes.c (--print-shapes prints them without a GPU).

--cpu times PyTorch's CPU AdamW instead (fused, foreach and a copy row, on
CPU tensors, --threads N threads, host wall clock): bench/torch_cpu.py, which
says how, puts its rows next to `mtopt_bench --backend cpu --threads N`.

Run: python3 bench/torch_bench.py --json torch_bench.json
     python3 bench/torch_bench.py --cpu --threads 16 --shapes gpt2,tiny-50k --json t.json
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import shapes  # noqa: E402  (bench/shapes.py)

try:
    import torch
except ImportError:  # shapes and helpers stay importable without it
    torch = None

MODES = ["one-tensor", "forloop", "foreach", "fused", "fused-graph", "gradscaler",
         "mtopt-torch", "mtopt-torch-graph"]
MIXED_MODES = ["bf16-fused", "bf16-fused-graph", "master-recipe", "master-recipe-graph"]
BPP_MODE = {"gradscaler": 32, "bf16-fused": 14, "bf16-fused-graph": 14, "master-recipe": 28,
            "master-recipe-graph": 28}
ALL_SHAPES = list(shapes.SHAPES)
BPP_ADAMW = 28  # read w, g, m, v; write w, m, v (fp32)
DEVICE = "cuda"


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

def rand_nonzero(total, lo, gen, device=DEVICE):
    """Uniform magnitude in [lo, 1), random sign: never zero. In pieces, so
    the temporaries stay small next to a 1.5 B-element buffer."""
    out = torch.empty(total, device=device, dtype=torch.float32)
    piece = 1 << 26
    for a in range(0, total, piece):
        b = min(total, a + piece)
        mag = torch.rand(b - a, device=device, generator=gen).mul_(1.0 - lo).add_(lo)
        sign = torch.rand(b - a, device=device, generator=gen) < 0.5
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
    (the documented recipe: capturable optimizers make their state lazily).
    The capture runs on that same stream: mtopt.torch refuses to switch
    streams inside a capture (docs/python.md)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    return graph


# ----------------------------------------------------------------- modes --

def mtopt_torch():
    """mtopt's torch optimizers (python/mtopt/torch.py), timed in this process:
    the installed package, else this repository's python/ (MTOPT_LIBRARY then
    names the library to load, e.g. build-gpu/libmtopt.so)."""
    try:
        import mtopt.torch as mt
    except ImportError:
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path.insert(0, os.path.join(here, "..", "python"))
        import mtopt.torch as mt
    return mt


def build(mode, numels, w_src, g_src, lr):
    """Returns (step function, objects to keep alive, bytes/param, checker)."""
    if mode == "one-tensor":
        params = make_params([sum(numels)], w_src, g_src)
        opt = torch.optim.AdamW(params, lr=lr, fused=True)
        return opt.step, [params, opt], BPP_ADAMW, None
    if mode in ("forloop", "foreach", "fused"):
        params = make_params(numels, w_src, g_src)
        kw = {"forloop": {"foreach": False}, "foreach": {"foreach": True},
              "fused": {"fused": True}}[mode]
        opt = torch.optim.AdamW(params, lr=lr, **kw)
        return opt.step, [params, opt], BPP_ADAMW, None
    if mode in ("mtopt-torch", "mtopt-torch-graph"):
        # mtopt.torch.AdamW as a PyTorch user would swap it in; its first
        # step (a warm-up) copies each .grad into mtopt's gradient buffer and
        # makes .grad a view of it, so the timed steps read the same values.
        params = make_params(numels, w_src, g_src)
        opt = mtopt_torch().AdamW(params, lr=lr)
        if mode == "mtopt-torch":
            return opt.step, [params, opt], BPP_ADAMW, None
        graph = graphed(opt.step)
        return graph.replay, [params, opt, graph], BPP_ADAMW, None
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
# floor     copy ms / this ms, copy = the copy row of this row's B/param (same
#           shape, same run): dst.copy_(src) of params x B/param / 2 bytes, a
#           device-to-device cudaMemcpyAsync (1.00 = as fast as the memory)
# host_us   median host time to return from one step call, stream idle
#"""

CSV_KEYS = ["shape", "mode", "tensors", "params", "ms", "launches_per_step", "bytes_per_param",
            "gbps", "floor_ms", "frac_of_floor", "host_us", "iters", "steps_per_sample",
            "check", "ok"]


def new_row(shape, mode, numels, bpp):
    return {"shape": shape, "mode": mode, "impl": "torch", "tensors": len(numels),
            "params": sum(numels), "ms": None, "launches_per_step": None,
            "bytes_per_param": bpp, "gbps": None, "floor_ms": None, "frac_of_floor": None,
            "copy_variant": None, "host_us": None, "iters": 0, "steps_per_sample": 1,
            "check": "-", "skipped": None, "ok": False, "note": ""}


def timed(row, fn, warmup, iters):
    ms, host_us, k = time_steps(fn, warmup, iters)
    if host_us is None:
        iters, row["note"] = 1, f"one sample: a step takes over {SLOW_MS / 1e3:g} s"
    row.update(ms=ms, host_us=host_us, iters=iters * k, steps_per_sample=k,
               gbps=row["params"] * row["bytes_per_param"] / (ms * 1e-3) / 1e9)


def run_mode(row, args, mode, numels, w_src, g_src):
    iters, warmup = args.iters, args.warmup
    # Above 5000 tensors every eager step but one-tensor's is bound by
    # per-tensor host work (0.1 to 8 s a step on many-mixed): a few samples
    # tell it, and the nine shapes then fit gpu_run.sh's limit for this step.
    if len(numels) > 5000 and mode != "one-tensor" and not mode.endswith("-graph"):
        iters, warmup = min(iters, args.loop_iters), min(warmup, 1)
    fn, keep, bpp, checker = build(mode, numels, w_src, g_src, args.lr)
    row["bytes_per_param"] = bpp
    timed(row, fn, warmup, iters)
    if checker is not None:
        skipped = checker()
        row["skipped"] = skipped
        row["check"] = "ok" if skipped == 0 else "FAIL"
        if skipped != 0:
            raise RuntimeError("the loss scale backed off: a step was skipped")
    if args.launches and len(numels) <= 10000:
        row["launches_per_step"] = count_launches(fn)


def run_copy(row, args):
    """The floor of row's bytes per parameter: a copy of params x B/param / 2
    bytes."""
    n = row["params"] * row["bytes_per_param"] // 2
    src = torch.full((n,), 0x3F, dtype=torch.uint8, device=DEVICE)
    dst = torch.zeros(n, dtype=torch.uint8, device=DEVICE)
    timed(row, lambda: dst.copy_(src), args.warmup, args.iters)
    row.update(launches_per_step=1, copy_variant="copy_ (cudaMemcpyAsync-d2d)")


def guarded(rows, row, fn, *a):
    """fn(row, *a) fills the row; a failure is noted in it, not an exit."""
    try:
        fn(row, *a)
        row["ok"] = True
    except Exception as exc:  # report and go on with the next mode
        row["note"] = f"{type(exc).__name__}: {exc}"[:400]
        traceback.print_exc(file=sys.stderr)
    gc.collect()
    torch.cuda.empty_cache()
    rows.append(row)


def set_floors(rows):
    for r in rows:
        copies = [c for c in rows if c["mode"] == "copy" and c["ok"]
                  and c["bytes_per_param"] == r["bytes_per_param"]]
        if r["ok"] and copies:
            r["floor_ms"] = copies[0]["ms"]
            r["frac_of_floor"] = r["floor_ms"] / r["ms"]


def print_row(r):
    head = f"{r['shape']:<13} {r['mode']:<12} {r['tensors']:>8} {r['params']:>12}"
    if not r["ok"]:
        print(f"{head}   FAILED: {r['note']}")
        return
    fr = f"{r['frac_of_floor']:.3f}" if r["frac_of_floor"] else "-"
    la = str(r["launches_per_step"]) if r["launches_per_step"] else "-"
    hu = f"{r['host_us']:.1f}" if r["host_us"] is not None else "-"
    print(f"{head} {r['ms']:>10.4f} {la:>9} {r['bytes_per_param']:>7} {r['gbps']:>9.2f} "
          f"{fr:>6} {hu:>9} {r['iters']:>6}")


def run_shape(args, shape, modes, gen):
    """Every mode on one shape, then a copy row per B/param and the floors."""
    numels = shapes.numels(shape)
    total = sum(numels)
    gen.manual_seed(1234)
    w_src = rand_nonzero(total, 0.1, gen)
    g_src = rand_nonzero(total, 0.01, gen)
    rows = []
    for mode in modes:
        row = new_row(shape, mode, numels, BPP_MODE.get(mode, BPP_ADAMW))
        guarded(rows, row, run_mode, args, mode, numels, w_src, g_src)
    del w_src, g_src
    gc.collect()
    torch.cuda.empty_cache()
    for bpp in dict.fromkeys(r["bytes_per_param"] for r in rows):
        guarded(rows, new_row(shape, "copy", numels, bpp), run_copy, args)
    set_floors(rows)
    for r in rows:
        print_row(r)
    sys.stdout.flush()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", action="append", default=[],
                    help=",".join(ALL_SHAPES) + ",file:PATH (default all)")
    ap.add_argument("--print-shapes", action="store_true",
                    help="print the shapes (as mtopt_bench --print-shapes) and exit")
    ap.add_argument("--modes", help="default: " + ",".join(MODES) + "; also " +
                    ",".join(MIXED_MODES) + " (--cpu: see torch_cpu.py)")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--loop-iters", type=int, default=3,
                    help="iteration cap above 5000 tensors for the eager modes but "
                         "one-tensor (default 3)")
    ap.add_argument("--launches", type=int, default=1, choices=[0, 1],
                    help="count device operations per step with torch.profiler "
                         "(skipped above 10000 tensors)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--cpu", action="store_true",
                    help="PyTorch's CPU AdamW on CPU tensors (bench/torch_cpu.py)")
    ap.add_argument("--threads", type=int, default=0,
                    help="--cpu: torch.set_num_threads(N) (default: PyTorch's)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="--cpu: run the modes R times, interleaved, and take the median "
                         "over all samples (as mtopt_bench --repeat; default 1)")
    ap.add_argument("--json")
    ap.add_argument("--csv")
    args = ap.parse_args()
    if args.threads < 0:
        ap.error("--threads must be >= 0 (0: PyTorch's default)")

    names = split_shapes(args.shapes) or ALL_SHAPES
    if args.print_shapes:
        for n in names:
            print(shapes.line(n))
        return 0
    if args.cpu:
        if torch is None:
            print("torch_bench: PyTorch is not installed", file=sys.stderr)
            return 2
        import torch_cpu  # noqa: E402  (bench/torch_cpu.py)
        return torch_cpu.main(args, names)
    if args.modes is None:
        args.modes = ",".join(MODES)
    if torch is None or not torch.cuda.is_available():
        print("torch_bench: CUDA is not available", file=sys.stderr)
        return 2
    torch.cuda.set_device(args.device)
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES + MIXED_MODES:
            print(f"torch_bench: unknown mode '{m}' ({', '.join(MODES + MIXED_MODES)})",
                  file=sys.stderr)
            return 2
    modes = [m for m in MODES + MIXED_MODES if m in modes]
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
        "floor": "copy ms / ms: the copy row of the row's bytes_per_param "
                 "(params x B/param / 2 bytes), same shape, same run",
    }
    print(f"# torch_bench  torch {torch.__version__}  CUDA {torch.version.cuda}  "
          f"commit {meta['git_commit'] or 'unknown'}  {meta['date']}")
    print(f"# device {meta['device']}  optimizer adamw  iters {args.iters}  "
          f"warmup {args.warmup}")
    gen = torch.Generator(device=DEVICE)
    rows, failures = run_shapes(names, lambda s: run_shape(args, s, modes, gen), HEADER, "iters")
    return write_outputs(args, meta, rows, failures)


def run_shapes(names, run_one, header, count_col):
    """The header and the column line, then run_one(shape)'s rows for each
    shape; returns (rows, shapes that failed)."""
    print(header)
    print(f"{'shape':<13} {'mode':<12} {'tensors':>8} {'params':>12} {'ms/step':>10} "
          f"{'launches':>9} {'B/param':>7} {'GB/s':>9} {'floor':>6} {'host_us':>9} "
          f"{count_col:>6}")
    sys.stdout.flush()
    rows, failures = [], 0
    for shape in names:
        try:
            rows += run_one(shape)
        except (OSError, ValueError) as exc:
            print(f"torch_bench: {exc}", file=sys.stderr)
            failures += 1
    return rows, failures


def write_outputs(args, meta, rows, failures):
    """The footer, --json and --csv; the exit code (1 if anything failed)."""
    failures += sum(not r["ok"] for r in rows)
    print(f"# {len(rows)} rows, {failures} failed")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    if args.csv:
        with open(args.csv, "w") as f:
            f.write(",".join(CSV_KEYS) + "\n")
            for r in rows:
                f.write(",".join("" if r[k] is None else str(r[k]) for k in CSV_KEYS) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

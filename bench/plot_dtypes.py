#!/usr/bin/env python3
"""The mixed-precision table and plot of docs/benchmarks.md from mtopt_bench
JSON, one file per --dtype run (tools/gpu_run.sh, step mtopt_bench_dtypes).

  python3 bench/plot_dtypes.py mtopt_bench_bf16-master.json ... \
      [--md dtypes.md] [--png bench_gpu_dtypes.png] [--target 0.95]

Each configuration's fused step against the floor of its own bytes, the
definition of bench/compare.py: frac_of_floor = time(copy of the same bytes,
same shape, same run) / time(step), which the JSON rows carry. The markdown
has one row per configuration (bytes per parameter, then per shape the step's
median, the copy's and the fraction, eager and graph replay); the PNG one
group of bars per configuration, one bar per shape, with the target as a line.
"""
import argparse
import json

# (dtype name, label), in table and plot order; a --dtype not listed here
# (bench_modes.c has the list) follows them, its name as its label
CONFIGS = [
    ("bf16-master", "bf16 params and grads, fp32 master, fp32 state"),
    ("bf16-remainder", "the same with remainders"),
    ("bf16-nearest", "bf16 params and grads, fp32 state, nearest"),
    ("bf16-sr", "the same, stochastic rounding"),
    ("bf16-all", "bf16 everywhere, nearest"),
    ("bf16-all-sr", "bf16 everywhere, stochastic rounding"),
    ("bf16-master-bf16state-sr", "bf16 params and grads, fp32 master, bf16 state, SR"),
    ("f32-bf16state-sr", "fp32 params and grads, bf16 state, SR"),
    ("f32-bf16grad", "fp32 params, bf16 grads"),
    ("mixed-table", "mixed table: bf16 matrices with fp32 masters, fp32 vectors"),
]


def load(paths):
    """dtype -> shape -> mode -> row, and the shapes in first-seen order."""
    runs, shapes = {}, []
    for path in paths:
        with open(path) as f:
            j = json.load(f)
        for run in j if isinstance(j, list) else [j]:  # a list: several runs in one file
            for r in run["rows"]:
                runs.setdefault(run["meta"]["dtype"], {}).setdefault(r["shape"], {})[r["mode"]] = r
                if r["shape"] not in shapes:
                    shapes.append(r["shape"])
    return runs, shapes


def markdown(runs, shapes):
    head = "| configuration | B/param |"
    rule = "|---|---:|"
    for s in shapes:
        head += f" {s} ms | copy ms | of the copy (graph) |"
        rule += "---:|---:|---:|"
    lines = [head, rule]
    for name, label in CONFIGS:
        if name not in runs:
            continue
        cells, bpp = "", ""
        for s in shapes:
            fused = runs[name].get(s, {}).get("fused")
            graph = runs[name].get(s, {}).get("graph")
            if not fused:
                cells += " | | |"
                continue
            bpp = fused["bytes_per_param"]
            g = f" ({graph['frac_of_floor']:.3f})" if graph else ""
            cells += (f" {fused['ms']:.2f} | {fused['floor_ms']:.2f} |"
                      f" {fused['frac_of_floor']:.3f}{g} |")
        lines.append(f"| {label} | {bpp} |{cells}")
    return "\n".join(lines) + "\n"


def plot(runs, shapes, png, target, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [n for n, _ in CONFIGS if n in runs]
    width = 0.8 / max(len(shapes), 1)
    fig, ax = plt.subplots(figsize=(11, 4.8))
    for k, s in enumerate(shapes):
        xs = [i + (k - (len(shapes) - 1) / 2) * width for i in range(len(names))]
        ys = [runs[n].get(s, {}).get("fused", {}).get("frac_of_floor") or 0 for n in names]
        bars = ax.bar(xs, ys, width, label=s)
        ax.bar_label(bars, fmt="%.3f", fontsize=7, padding=1)
    ax.axhline(target, color="k", linestyle="--", linewidth=1, label=f"target {target}")
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels(names, rotation=20, ha="right")
    ax.set_ylim(0.8, 1.0)
    ax.set_ylabel("fused step: copy time of the same bytes / step time")
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(png, dpi=120)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("json", nargs="+", help="mtopt_bench --dtype D --json files")
    ap.add_argument("--md", help="markdown table output (default: stdout)")
    ap.add_argument("--png", help="plot output (needs matplotlib)")
    ap.add_argument("--target", type=float, default=0.95)
    ap.add_argument("--title", default="mtopt AdamW in mixed precision against the copy floor")
    args = ap.parse_args()
    runs, shapes = load(args.json)
    known = {n for n, _ in CONFIGS}
    CONFIGS.extend((n, n) for n in runs if n not in known)
    md = markdown(runs, shapes)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md)
    else:
        print(md, end="")
    if args.png:
        plot(runs, shapes, args.png, args.target, args.title)


if __name__ == "__main__":
    main()

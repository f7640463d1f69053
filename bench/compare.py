#!/usr/bin/env python3
"""Merges mtopt_bench and torch_bench JSON into one markdown table and a plot.

  python3 bench/compare.py --mtopt mtopt_bench.json [--torch torch_bench.json] \
      --md bench_table.md --png bench_gpu.png [--title "..."]

The markdown has, per shape, the median step time of every variant with its
fraction of mtopt's flat single-buffer step (the floor: flat ms / variant ms,
1.00 = as fast as one contiguous buffer), then a detail table with GB/s,
launches and host time. The PNG is a grouped bar chart of ms per step, log
scale, one group per shape. matplotlib draws it; without matplotlib the
script falls back to gnuplot.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

# (implementation, mode) -> label, in table and plot order.
VARIANTS = [
    (("mtopt", "flat"), "mtopt flat (floor)"),
    (("mtopt", "fused"), "mtopt fused"),
    (("mtopt", "graph"), "mtopt fused+graph"),
    (("mtopt", "mixed"), "mtopt mixed"),
    (("mtopt", "graph-mixed"), "mtopt mixed+graph"),
    (("mtopt", "loop"), "mtopt per-tensor loop"),
    (("mtopt", "memcpy"), "memcpy ceiling"),
    (("torch", "forloop"), "torch for-loop"),
    (("torch", "foreach"), "torch foreach"),
    (("torch", "fused"), "torch fused"),
    (("torch", "fused-graph"), "torch fused+graph"),
    (("torch", "gradscaler"), "torch GradScaler step"),
    (("torch", "flat"), "torch flat"),
]
COLORS = {
    "mtopt flat (floor)": "#1b5e20", "mtopt fused": "#2e7d32", "mtopt fused+graph": "#66bb6a",
    "mtopt mixed": "#00838f", "mtopt mixed+graph": "#4dd0e1", "mtopt per-tensor loop": "#9e9d24",
    "memcpy ceiling": "#616161", "torch for-loop": "#b71c1c", "torch foreach": "#e53935",
    "torch fused": "#ef6c00", "torch fused+graph": "#ffa726", "torch GradScaler step": "#6a1b9a",
    "torch flat": "#8d6e63",
}


def load(path):
    with open(path) as f:
        d = json.load(f)
    return d.get("meta", {}), d.get("rows", [])


def fmt_ms(ms):
    if ms is None or not math.isfinite(ms):
        return "-"
    if ms >= 100:
        return f"{ms:.0f}"
    if ms >= 10:
        return f"{ms:.1f}"
    if ms >= 1:
        return f"{ms:.2f}"
    return f"{ms:.3f}"


def fmt_params(n):
    if n >= 1e9:
        return f"{n / 1e9:.2f} B"
    if n >= 1e6:
        return f"{n / 1e6:.1f} M"
    return f"{n / 1e3:.1f} K"


def collect(mtopt_rows, torch_rows):
    """shape -> {label: row}, shapes in first-seen order, and warnings."""
    table, order, warnings = {}, [], []
    impl_rows = [("mtopt", r) for r in mtopt_rows] + [("torch", r) for r in torch_rows]
    labels = dict(VARIANTS)
    facts = {}
    for impl, r in impl_rows:
        impl = r.get("impl", impl)
        shape = r["shape"]
        if shape not in table:
            table[shape] = {}
            order.append(shape)
        label = labels.get((impl, r["mode"]))
        if label is None:
            continue
        table[shape][label] = r
        f = (r.get("tensors"), r.get("params"))
        if shape in facts and facts[shape] != f:
            warnings.append(f"shape {shape}: {impl} has {f[0]} tensors / {f[1]} params, "
                            f"the other run {facts[shape][0]} / {facts[shape][1]}")
        facts.setdefault(shape, f)
    return table, order, warnings


def floor_ms(cells):
    r = cells.get("mtopt flat (floor)")
    return r["ms"] if r and r.get("ok") and r.get("ms") else None


def markdown(table, order, metas, warnings, title):
    present = [lab for _, lab in VARIANTS
               if any(lab in table[s] and table[s][lab].get("ok") for s in order)]
    out = []
    if title:
        out.append(f"### {title}\n")
    for name, meta in metas:
        bits = [f"{k} {meta[k]}" for k in ("device", "date", "git_commit", "threads",
                                           "optimizer", "torch_version", "cuda_version",
                                           "iters", "repeat") if meta.get(k) not in (None, "")]
        out.append(f"- {name}: " + ", ".join(bits))
    out.append("")
    out.append("Median ms per step; in brackets the fraction of the floor, mtopt's flat "
               "single-buffer step on the same hardware (flat ms / ms; 1.00 = as fast as "
               "one contiguous buffer).\n")
    out.append("| shape | tensors | params | " + " | ".join(present) + " |")
    out.append("|---|---:|---:|" + "---:|" * len(present))
    for s in order:
        cells = table[s]
        any_row = next(iter(cells.values()), None)
        if any_row is None:
            continue
        fl = floor_ms(cells)
        line = [s, str(any_row.get("tensors", "")), fmt_params(any_row.get("params", 0))]
        for lab in present:
            r = cells.get(lab)
            if not r:
                line.append("")
            elif not r.get("ok"):
                line.append("failed")
            else:
                frac = f" ({fl / r['ms']:.2f})" if fl and r.get("ms") else ""
                line.append(fmt_ms(r["ms"]) + frac)
        out.append("| " + " | ".join(line) + " |")
    out.append("")
    out.append("Detail: GB/s = params x bytes/param / time (mtopt's byte count: AdamW 28, "
               "mixed step 32; torch's own traffic is higher); launches = kernel launches "
               "per step (torch: device operations seen by the profiler); host us = time "
               "for the step call to return, stream idle.\n")
    out.append("| shape | variant | ms | GB/s | of floor | launches | B/param | host us | "
               "check | note |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---|---|")
    for s in order:
        cells = table[s]
        fl = floor_ms(cells)
        for _, lab in VARIANTS:
            r = cells.get(lab)
            if not r:
                continue
            if not r.get("ok"):
                note = (r.get("note") or "").replace("|", "/").replace("\n", " ")[:120]
                out.append(f"| {s} | {lab} | failed | | | | | | {r.get('check', '')} | {note} |")
                continue
            gb = f"{r['gbps']:.1f}" if r.get("gbps") else "-"
            fr = f"{fl / r['ms']:.3f}" if fl and r.get("ms") else "-"
            la = str(r["launches_per_step"]) if r.get("launches_per_step") else "-"
            hu = f"{r['host_us']:.1f}" if r.get("host_us") is not None else "-"
            note = (r.get("note") or "").replace("|", "/").replace("\n", " ")[:120]
            out.append(f"| {s} | {lab} | {fmt_ms(r['ms'])} | {gb} | {fr} | {la} | "
                       f"{r.get('bytes_per_param', '')} | {hu} | {r.get('check', '')} | "
                       f"{note} |")
    if warnings:
        out.append("")
        out.extend(f"> warning: {w}" for w in warnings)
    out.append("")
    return "\n".join(out)


def series(table, order):
    labels = [lab for _, lab in VARIANTS
              if any(lab in table[s] and table[s][lab].get("ok") for s in order)]
    data = {lab: [table[s][lab]["ms"] if lab in table[s] and table[s][lab].get("ok")
                  else None for s in order] for lab in labels}
    return labels, data


def plot_matplotlib(table, order, png, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    labels, data = series(table, order)
    n = len(labels)
    width = 0.8 / max(n, 1)
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(order) + 0.25 * n * len(order)), 5.5))
    from matplotlib.ticker import FuncFormatter
    values = [y for lab in labels for y in data[lab] if y]
    for i, lab in enumerate(labels):
        xs = [j + (i - (n - 1) / 2) * width for j in range(len(order))]
        ys = data[lab]
        bars = ax.bar([x for x, y in zip(xs, ys) if y], [y for y in ys if y], width,
                      label=lab, color=COLORS.get(lab))
        for b in bars:
            ax.annotate(fmt_ms(b.get_height()), (b.get_x() + b.get_width() / 2, b.get_height()),
                        xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                        fontsize=6, rotation=90)
    ax.set_yscale("log")
    if values:
        # Bars start a decade below the fastest, so heights compare honestly.
        ax.set_ylim(10 ** math.floor(math.log10(min(values)) - 0.5), max(values) * 3)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.set_xticks(range(len(order)))
    ax.set_xticklabels(order)
    ax.set_ylabel("ms per step (median, log scale)")
    ax.set_title(title or "Optimizer step time")
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def plot_gnuplot(table, order, png, title):
    gp = shutil.which("gnuplot")
    if not gp:
        raise RuntimeError("neither matplotlib nor gnuplot is available")
    labels, data = series(table, order)
    with tempfile.TemporaryDirectory() as tmp:
        dat = os.path.join(tmp, "bench.dat")
        with open(dat, "w") as f:
            f.write("shape " + " ".join(f'"{lab}"' for lab in labels) + "\n")
            for j, s in enumerate(order):
                f.write(f'"{s}" ' + " ".join(
                    (f"{data[lab][j]:.6g}" if data[lab][j] else "NaN") for lab in labels) + "\n")
        cols = ", ".join(
            f"'{dat}' using {i + 2}:xtic(1) title columnheader({i + 2}) lc rgb "
            f"'{COLORS.get(lab, '#444444')}'" for i, lab in enumerate(labels))
        script = f"""
set terminal pngcairo size 1400,650 font ",10"
set output '{png}'
set title "{(title or 'Optimizer step time').replace('"', "'")}"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.9 border -1
set logscale y
set ylabel "ms per step (median, log scale)"
set key outside right top
set grid ytics mytics
plot {cols}
"""
        subprocess.run([gp], input=script, text=True, check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mtopt", required=True, help="mtopt_bench --json output")
    ap.add_argument("--torch", help="torch_bench.py --json output (optional)")
    ap.add_argument("--md", help="markdown output (default: stdout)")
    ap.add_argument("--png", help="plot output")
    ap.add_argument("--title", default="")
    args = ap.parse_args()

    m_meta, m_rows = load(args.mtopt)
    metas = [("mtopt_bench", m_meta)]
    t_rows = []
    if args.torch:
        if os.path.exists(args.torch):
            t_meta, t_rows = load(args.torch)
            metas.append(("torch_bench", t_meta))
        else:
            print(f"compare.py: {args.torch} not found: mtopt rows only", file=sys.stderr)
    table, order, warnings = collect(m_rows, t_rows)
    md = markdown(table, order, metas, warnings, args.title)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md)
    else:
        sys.stdout.write(md)
    for w in warnings:
        print(f"compare.py: warning: {w}", file=sys.stderr)
    if args.png:
        try:
            plot_matplotlib(table, order, args.png, args.title)
        except ImportError:
            plot_gnuplot(table, order, args.png, args.title)
    return 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Merges mtopt_bench and torch_bench JSON into one markdown table and a plot.

  python3 bench/compare.py --mtopt mtopt_bench.json [--torch torch_bench.json] \
      --md bench_table.md --png bench_gpu.png [--title "..."]

The floor, the one definition both benchmarks and this script use: a row's
floor is time(copy of the same bytes, in the same run) / time(row), where the
copy moves params x B/param / 2 bytes (it reads and writes as much as a step
of B/param bytes per parameter: a device-to-device cudaMemcpyAsync on CUDA,
the fastest of mtopt_bench's threaded copies on the CPU; torch_bench.py's
rows have their own copy, torch's copy_, on the CPU too), measured for each
B/param a shape's rows need; 1.00 = as fast as the memory moves those bytes.
Rows carry it as floor_ms; for JSON from before issue 13 the script takes a
copy (or memcpy) row of the same shape and B/param from the same file.

The markdown has, per shape, the median step time of every variant with its
fraction of the floor, then a detail table with GB/s, the floor's time,
launches and host time. The PNG has two panels: ms per step (log scale) and
the fraction of the floor, one group per shape. matplotlib draws it; without
matplotlib the script falls back to gnuplot.
"""
import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

# (implementation, mode) -> label, in table and plot order; the copy rows'
# labels carry their B/param (copy_label). LEGACY: the names before issue 13.
VARIANTS = [
    (("mtopt", "one-tensor"), "mtopt one-tensor"),
    (("mtopt", "fused"), "mtopt fused"),
    (("mtopt", "packed"), "mtopt fused, packed"),
    (("mtopt", "graph"), "mtopt fused+graph"),
    (("mtopt", "mixed"), "mtopt mixed"),
    (("mtopt", "packed-mixed"), "mtopt mixed, packed"),
    (("mtopt", "graph-mixed"), "mtopt mixed+graph"),
    (("mtopt", "loop"), "mtopt per-tensor loop"),
    (("mtopt", "ref-adamw"), "reference AdamW kernel"),
    (("mtopt", "ref-adamw-pooled"), "reference AdamW kernel, pooled"),
    (("torch", "forloop"), "torch for-loop"),
    (("torch", "foreach"), "torch foreach"),
    (("torch", "fused"), "torch fused"),
    (("torch", "fused-graph"), "torch fused+graph"),
    (("torch", "gradscaler"), "torch GradScaler step"),
    (("torch", "one-tensor"), "torch one-tensor"),
]
LEGACY = {("mtopt", "flat"): ("mtopt", "one-tensor"), ("torch", "flat"): ("torch", "one-tensor"),
          ("mtopt", "memcpy"): ("mtopt", "copy")}
COPY_MODES = ("copy", "memcpy")
COLORS = {
    "mtopt one-tensor": "#1b5e20", "mtopt fused": "#2e7d32", "mtopt fused, packed": "#004d40",
    "mtopt fused+graph": "#66bb6a",
    "mtopt mixed": "#00838f", "mtopt mixed, packed": "#006064", "mtopt mixed+graph": "#4dd0e1",
    "mtopt per-tensor loop": "#9e9d24",
    "reference AdamW kernel": "#283593", "reference AdamW kernel, pooled": "#5c6bc0", "torch for-loop": "#b71c1c",
    "torch foreach": "#e53935", "torch fused": "#ef6c00", "torch fused+graph": "#ffa726",
    "torch GradScaler step": "#6a1b9a", "torch one-tensor": "#8d6e63",
}
FLOOR_TEXT = ("the floor: time(copy of the same bytes, params x B/param / 2, in the same "
              "run) / time(step); 1.00 = as fast as the memory moves the step's bytes. "
              "CUDA: cudaMemcpyAsync device to device; CPU: the fastest of mtopt_bench's "
              "threaded copies (torch rows: torch's own copy_)")


def copy_label(impl, bpp):
    return f"copy {bpp} B/param (floor)" if impl == "mtopt" else f"torch copy {bpp} B/param"


def color(lab):
    return COLORS.get(lab, "#616161" if lab.startswith("copy") else "#9e9e9e")


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


def clean(note):
    return (note or "").replace("|", "/").replace("\n", " ")[:120]


# ----------------------------------------------------------------- rows --

def with_floors(rows):
    """Each row's floor_ms: its own, or (older JSON) that of a copy row of the
    same shape and B/param in the same file."""
    copies = {(r["shape"], r.get("bytes_per_param")): r["ms"] for r in rows
              if r.get("mode") in COPY_MODES and r.get("ok") and r.get("ms")}
    for r in rows:
        if r.get("floor_ms") is None:
            r["floor_ms"] = copies.get((r["shape"], r.get("bytes_per_param")))
    return rows


def frac(r):
    fl, ms = r.get("floor_ms"), r.get("ms")
    return fl / ms if r.get("ok") and fl and ms else None


def collect(mtopt_rows, torch_rows):
    """shape -> {label: row}, the shapes in first-seen order, the labels in
    table order, and warnings."""
    table, order, warnings, facts, copies = {}, [], [], {}, set()
    labels = dict(VARIANTS)
    impl_rows = ([("mtopt", r) for r in with_floors(mtopt_rows)] +
                 [("torch", r) for r in with_floors(torch_rows)])
    for impl, r in impl_rows:
        key = (r.get("impl", impl), r["mode"])
        key = LEGACY.get(key, key)
        shape = r["shape"]
        if shape not in table:
            table[shape] = {}
            order.append(shape)
        if key[1] == "copy":
            label = copy_label(key[0], r.get("bytes_per_param"))
            copies.add((key[0], r.get("bytes_per_param") or 0, label))
        else:
            label = labels.get(key)
        if label is None:
            continue
        table[shape][label] = r
        f = (r.get("tensors"), r.get("params"))
        if shape in facts and facts[shape] != f:
            warnings.append(f"shape {shape}: {impl} has {f[0]} tensors / {f[1]} params, "
                            f"the other run {facts[shape][0]} / {facts[shape][1]}")
        facts.setdefault(shape, f)
    copy_labels = {impl: [lab for i, _, lab in sorted(copies) if i == impl]
                   for impl in ("mtopt", "torch")}
    ordered = ([lab for (impl, _), lab in VARIANTS if impl == "mtopt"] + copy_labels["mtopt"] +
               [lab for (impl, _), lab in VARIANTS if impl == "torch"] + copy_labels["torch"])
    return table, order, ordered, warnings


def present(table, order, labels):
    return [lab for lab in labels
            if any(lab in table[s] and table[s][lab].get("ok") for s in order)]


# ------------------------------------------------------------- markdown --

def markdown(table, order, labels, metas, warnings, title):
    cols = present(table, order, labels)
    out = [f"### {title}\n"] if title else []
    for name, meta in metas:
        bits = [f"{k} {meta[k]}" for k in ("device", "date", "git_commit", "threads",
                                           "cpu_capability", "optimizer", "dtype", "torch_version",
                                           "cuda_version", "iters", "repeat")
                if meta.get(k) not in (None, "")]
        out.append(f"- {name}: " + ", ".join(bits))
    out.append("")
    out.append(f"Median ms per step; in brackets the fraction of the floor ({FLOOR_TEXT}).\n")
    out.append("| shape | tensors | params | " + " | ".join(cols) + " |")
    out.append("|---|---:|---:|" + "---:|" * len(cols))
    for s in order:
        cells = table[s]
        any_row = next(iter(cells.values()), None)
        if any_row is None:
            continue
        line = [s, str(any_row.get("tensors", "")), fmt_params(any_row.get("params", 0))]
        for lab in cols:
            r = cells.get(lab)
            if not r:
                line.append("")
            elif not r.get("ok"):
                line.append("failed")
            else:
                fr = frac(r)
                line.append(fmt_ms(r["ms"]) + (f" ({fr:.2f})" if fr else ""))
        out.append("| " + " | ".join(line) + " |")
    out.append("")
    out.append("Detail: GB/s = params x bytes/param / time (mtopt's byte count: AdamW 28, "
               "mixed step 32; torch's own traffic is higher); floor ms = the copy of the "
               "row's B/param in the same run; launches = kernel launches per step (torch: "
               "device operations seen by the profiler); host us = time for the step call to "
               "return, stream idle.\n")
    out.append("| shape | variant | ms | GB/s | floor ms | of floor | launches | B/param | "
               "host us | check | note |")
    out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for s in order:
        for lab in labels:
            r = table[s].get(lab)
            if not r:
                continue
            if not r.get("ok"):
                out.append(f"| {s} | {lab} | failed | | | | | | | {r.get('check', '')} | "
                           f"{clean(r.get('note'))} |")
                continue
            gb = f"{r['gbps']:.1f}" if r.get("gbps") else "-"
            fr = f"{frac(r):.3f}" if frac(r) else "-"
            la = str(r["launches_per_step"]) if r.get("launches_per_step") else "-"
            hu = f"{r['host_us']:.1f}" if r.get("host_us") is not None else "-"
            out.append(f"| {s} | {lab} | {fmt_ms(r['ms'])} | {gb} | {fmt_ms(r.get('floor_ms'))} "
                       f"| {fr} | {la} | {r.get('bytes_per_param', '')} | {hu} | "
                       f"{r.get('check', '')} | {clean(r.get('note'))} |")
    if warnings:
        out.append("")
        out.extend(f"> warning: {w}" for w in warnings)
    out.append("")
    return "\n".join(out)


# ----------------------------------------------------------------- plots --

def series(table, order, labels):
    """The labels with data, and label -> per shape (ms, fraction of the
    floor), (None, None) where absent."""
    cols = present(table, order, labels)
    data = {lab: [(table[s][lab]["ms"], frac(table[s][lab]))
                  if lab in table[s] and table[s][lab].get("ok") else (None, None)
                  for s in order] for lab in cols}
    return cols, data


def plot_matplotlib(table, order, labels, png, title):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter
    cols, data = series(table, order, labels)
    n = len(cols)
    width = 0.8 / max(n, 1)
    fig, (ax, af) = plt.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [3, 2]},
                                 figsize=(max(8, 1.6 * len(order) + 0.25 * n * len(order)), 8))
    values = [y for lab in cols for y, _ in data[lab] if y]
    for i, lab in enumerate(cols):
        xs = [j + (i - (n - 1) / 2) * width for j in range(len(order))]
        ms = [(x, y) for x, (y, _) in zip(xs, data[lab]) if y]
        fr = [(x, f) for x, (_, f) in zip(xs, data[lab]) if f]
        bars = ax.bar([x for x, _ in ms], [y for _, y in ms], width, label=lab, color=color(lab))
        for b in bars:
            ax.annotate(fmt_ms(b.get_height()), (b.get_x() + b.get_width() / 2, b.get_height()),
                        xytext=(0, 2), textcoords="offset points", ha="center", va="bottom",
                        fontsize=6, rotation=90)
        af.bar([x for x, _ in fr], [f for _, f in fr], width, color=color(lab))
    ax.set_yscale("log")
    if values:
        # Bars start a decade below the fastest, so heights compare honestly.
        ax.set_ylim(10 ** math.floor(math.log10(min(values)) - 0.5), max(values) * 3)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.set_ylabel("ms per step (median, log scale)")
    ax.set_title(title or "Optimizer step time")
    ax.grid(axis="y", which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    af.axhline(1.0, color="#212121", linewidth=0.8)
    af.set_ylim(0, 1.2)
    af.set_ylabel("fraction of the floor\n(copy of the same bytes / step)")
    af.grid(axis="y", alpha=0.3)
    af.set_xticks(range(len(order)))
    af.set_xticklabels(order)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    plt.close(fig)


def plot_gnuplot(table, order, labels, png, title):
    gp = shutil.which("gnuplot")
    if not gp:
        raise RuntimeError("neither matplotlib nor gnuplot is available")
    cols, data = series(table, order, labels)
    with tempfile.TemporaryDirectory() as tmp:
        dats = []
        for k, what in enumerate(("ms", "fraction")):
            dat = os.path.join(tmp, f"{what}.dat")
            with open(dat, "w") as f:
                f.write("shape " + " ".join(f'"{lab}"' for lab in cols) + "\n")
                for j, s in enumerate(order):
                    # No fraction: a bar of 0 (a column with no point at all is an
                    # error to gnuplot, and both panels keep the same slots).
                    vals = [data[lab][j][k] for lab in cols]
                    none = "0" if k else "NaN"
                    f.write(f'"{s}" ' + " ".join(f"{v:.6g}" if v else none for v in vals) + "\n")
            dats.append(dat)

        def plot(dat):
            return "plot " + ", ".join(
                f"'{dat}' using {i + 2}:xtic(1) title columnheader({i + 2}) "
                f"lc rgb '{color(lab)}'" for i, lab in enumerate(cols))
        script = f"""
set terminal pngcairo size 1400,1000 font ",10"
set output '{png}'
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.9 border -1
set lmargin at screen 0.07
set rmargin at screen 0.80
set xrange [-0.6:{len(order) - 0.4}]
set multiplot layout 2,1 title "{(title or 'Optimizer step time').replace('"', "'")}"
set logscale y
set ylabel "ms per step (median, log scale)"
set key outside right top
set grid ytics mytics
{plot(dats[0])}
unset logscale y
set yrange [0:1.2]
unset key
set ylabel "fraction of the floor (copy of the same bytes / step)"
{plot(dats[1])}
unset multiplot
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
    table, order, labels, warnings = collect(m_rows, t_rows)
    md = markdown(table, order, labels, metas, warnings, args.title)
    if args.md:
        with open(args.md, "w") as f:
            f.write(md)
    else:
        sys.stdout.write(md)
    for w in warnings:
        print(f"compare.py: warning: {w}", file=sys.stderr)
    if args.png:
        try:
            plot_matplotlib(table, order, labels, args.png, args.title)
        except ImportError:
            plot_gnuplot(table, order, labels, args.png, args.title)
    return 0


if __name__ == "__main__":
    sys.exit(main())

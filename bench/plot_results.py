#!/usr/bin/env python3
"""Draw the charts of gfd_benchmark's and gfd_multi_gpu_benchmark's CSV output.

    python3 bench/plot_results.py RUN.csv [MORE.csv ...] --out DIR
        [--metric p50_gbps|ratio_p50|p90_gbps|ratio_p90] [--title TEXT]

The charts of docs/performance.md come from the load sweeps of `bench/measure.sh load`, whose
CSVs are packed in $OUT/measure-<cases>.tgz:

    mkdir -p /tmp/sweeps && tar xzf bench-out/measure-paged-load.tgz -C /tmp/sweeps
    python3 bench/plot_results.py /tmp/sweeps/load_sweep_*.csv --out DIR

CSVs of `gfd_benchmark --layout paged` (recognised by their `method` and `load_slowdown`
columns) give two charts, rate_vs_block_size.png and load_slowdown.png: see bench/plot_paged.py.
CSVs of `python -m gfd_bench.serving` (bench/measure.sh's serving_*.csv; recognised by their
`path` and `tpot_p99_ms` columns) give serving_tpot_p99.png, the decode loop's TPOT P99 beside each
load path as a ratio to the loop alone and to the loop beside the contiguous DMA: see
bench/plot_serving.py.
The rest of this text is about the other layouts (pool, strided).

Expected CSV header (one row per configuration and backend; extra columns are ignored):

    mode,sources,direction,load,blocks,block_size,dst,backend,p50_us,p90_us,p50_gbps,p90_gbps,
    ref_gbps,ratio_p50,ratio_p90,cpu_s_per_gb,threads,compute_slowdown,verified

Several CSVs (e.g. a cold and a warm run) are merged. Colour shows the backend, line style the
sources (solid cold, dashed warm) and a black dotted line the contiguous pinned
cudaMemcpyAsync reference (ref_gbps) of the same bytes. Only rows with load == "none" go into
the two sweeps; rows with load == "sm", "sm-equal" or "sm-short" (measured while compute
kernels keep every SM busy) go into one under-load bar chart per load mode. Rows whose `verified` is not 1/true/yes are skipped.

Charts written (PREFIX is "gbps" for the GB/s metrics, "ratio" for the ratio metrics):
  DIR/PREFIX_vs_blocks_<dst>.png      metric against block count at block size 4096
  DIR/PREFIX_vs_block_size_<dst>.png  metric against block size at the size sweep's block count
  DIR/under_load[_ratio].png          unloaded vs under SM load, per backend (if "sm" rows exist);
  DIR/under_load_equal[_ratio].png, DIR/under_load_short[_ratio].png  the same for the
                                      "sm-equal" and "sm-short" rows (gfd_benchmark --under-load)
If the merged input holds more than one mode or direction, "_<mode>" / "_<direction>" is
appended to the sweep charts' names as well (and each chart holds one mode and direction).

gfd_multi_gpu_benchmark CSVs are recognised by their header (columns `gpus` and
`scaling_efficiency`); files of both programs may be given in one call, and each program's
charts are drawn from its own files only (--metric and --sweep-block-size apply to gfd_benchmark
files; the multi-GPU charts always show p50_gbps). Their header:

    mode,sources,backend,gpus,gpu,blocks,block_size,p50_us,p90_us,p50_gbps,ref_gbps,
    scaling_efficiency,threads,cpus,verified

Rows with gpu == "all" are the aggregate of G = `gpus` GPUs, the others one GPU's rate at that G;
backend "contiguous" is the contiguous pinned DMA reference. Charts written per mode and
blocks x block_size (with "_<mode>" / "_<blocks>x<size>" appended when the input holds several):
  DIR/multi_gpu_aggregate.png  aggregate GB/s against G, a line per backend and sources (solid
                               cold, dashed warm), contiguous black dotted (ref_gbps if there
                               are no contiguous rows), a thin grey "ideal gather (G x 1-GPU)"
                               line, gather's points labelled with scaling_efficiency (computed
                               as aggregate / (G x 1-GPU gather aggregate) where it is empty)
  DIR/multi_gpu_per_gpu.png    per-GPU GB/s at the largest G, a panel per sources, a group of
                               bars per backend with a bar per GPU and a black dash at that GPU's
                               contiguous rate measured alone (ref_gbps)

Only the standard library and matplotlib are needed. Exit status: 0 when at least one chart
was written, 1 on a data error (missing columns, no usable rows, nothing to draw), 2 on usage.
"""

import argparse
import csv
import math
import os
import statistics
import sys
from collections import defaultdict

import plot_paged  # beside this file
import plot_serving  # beside this file

PROG = "plot_results.py"

METRICS = {
    # column: (file prefix, y label, is a ratio to the contiguous reference)
    "p50_gbps": ("gbps", "p50 throughput (GB/s, 1 GB = 10^9 B)", False),
    "p90_gbps": ("gbps_p90", "p90 throughput (GB/s, 1 GB = 10^9 B)", False),
    "ratio_p50": ("ratio", "p50 rate / contiguous pinned cudaMemcpyAsync rate", True),
    "ratio_p90": ("ratio_p90", "p90 rate / contiguous pinned cudaMemcpyAsync rate", True),
}

# Columns every input CSV must have (the chosen metric column is added at run time).
REQUIRED = [
    "mode",
    "sources",
    "direction",
    "load",
    "blocks",
    "block_size",
    "dst",
    "backend",
    "ref_gbps",
    "verified",
]

BACKEND_ORDER = ["gather", "batch_async", "per_block", "zero_copy_kernel"]
BACKEND_COLOURS = {
    "gather": "tab:blue",
    "batch_async": "tab:orange",
    "per_block": "tab:green",
    "zero_copy_kernel": "tab:red",
}
EXTRA_COLOURS = ["tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray"]
SOURCES_STYLE = {"cold": "-", "warm": "--"}
SOURCES_ORDER = ["cold", "warm"]
DST_ORDER = ["contiguous", "scattered"]
MARKERS = {"gather": "o", "batch_async": "s", "per_block": "^", "zero_copy_kernel": "D"}
TRUE_WORDS = {"1", "true", "yes"}


def warn(msg):
    print(f"{PROG}: warning: {msg}", file=sys.stderr)


def die(msg):
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    sys.exit(1)


def ordered(values, preferred):
    """`values` sorted with the `preferred` ones first, in that order, then the rest by name."""
    values = set(values)
    return [v for v in preferred if v in values] + sorted(values - set(preferred))


def size_label(n):
    """512 -> '512', 4096 -> '4K', 262144 -> '256K', 1048576 -> '1M'."""
    for div, suffix in ((1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")):
        if n >= div and n % div == 0:
            return f"{n // div}{suffix}"
    return str(n)


def parse_float(text):
    text = (text or "").strip()
    if text == "":
        return None
    v = float(text)  # ValueError is handled by the caller
    return v if math.isfinite(v) else None


def _read_rows(paths, required, expected, make_row, bad_what, on_header=None):
    """Reads every CSV in `paths`: checks the header for `required` columns (naming `expected`
    in the error), skips blank and unverified rows, and turns the others into dicts with
    make_row(fields, file name); a row for which it raises ValueError or returns None counts as
    unreadable (`bad_what` names its fields in the warning)."""
    rows = []
    for path in paths:
        name = os.path.basename(path)
        try:
            f = open(path, newline="")
        except OSError as e:
            die(f"cannot read {path}: {e.strerror}")
        with f:
            reader = csv.DictReader(f)
            header = [h.strip() for h in (reader.fieldnames or [])]
            reader.fieldnames = header
            missing = [c for c in required if c not in header]
            if missing:
                die(
                    f"{path}: missing required column(s): {', '.join(missing)}\n"
                    f"  expected at least{expected}: {','.join(required)}\n"
                    f"  found: {','.join(header) if header else '(empty file)'}"
                )
            if on_header:
                on_header(path, header)
            unverified, bad = [], []
            for line_no, raw in enumerate(reader, start=2):
                if not any((v or "").strip() for v in raw.values() if isinstance(v, str)):
                    continue  # blank line
                r = {
                    k: (v or "").strip() if isinstance(v, str) else ""
                    for k, v in raw.items()
                    if k is not None
                }
                if r["verified"].lower() not in TRUE_WORDS:
                    unverified.append(line_no)
                    continue
                try:
                    row = make_row(r, name)
                except ValueError:
                    row = None
                if row is None:
                    bad.append(line_no)
                    continue
                rows.append(row)
            if unverified:
                warn(
                    f"{path}: skipped {len(unverified)} row(s) whose 'verified' is not 1/true "
                    f"(line(s) {_lines(unverified)})"
                )
            if bad:
                warn(
                    f"{path}: skipped {len(bad)} row(s) with an empty or unreadable {bad_what} "
                    f"(line(s) {_lines(bad)})"
                )
    if not rows:
        raise NoData(
            "no usable rows (every row was unverified or unreadable, or the files are empty)"
        )
    return rows


def read_csvs(paths, metric):
    """Reads and validates every gfd_benchmark CSV; returns the usable rows as dicts with typed
    fields."""

    def make_row(r, name):
        row = {
            "file": name,
            "mode": r["mode"],
            "sources": r["sources"],
            "direction": r["direction"],
            "load": r["load"],
            "dst": r["dst"],
            "backend": r["backend"],
            "blocks": int(float(r["blocks"])),
            "block_size": int(float(r["block_size"])),
            "value": parse_float(r[metric]),
            "ref_gbps": parse_float(r["ref_gbps"]),
            "compute_slowdown": parse_float(r.get("compute_slowdown", "")),
        }
        if row["value"] is None or row["blocks"] <= 0 or row["block_size"] <= 0:
            return None
        return row

    def on_header(path, header):
        if "compute_slowdown" not in header:
            warn(f"{path}: no compute_slowdown column; the under-load chart is not annotated")

    return _read_rows(
        paths, REQUIRED + [metric], "", make_row, f"{metric}, blocks or block_size", on_header
    )


def _lines(nums, limit=8):
    s = ", ".join(str(n) for n in nums[:limit])
    return s + (", ..." if len(nums) > limit else "")


def aggregate(rows):
    """Merges rows of the same configuration (a point measured twice, or the same run given
    twice) into one: the median of their values. Key -> dict(value, ref_gbps, slowdown, files)."""
    groups = defaultdict(list)
    for r in rows:
        key = (
            r["mode"],
            r["direction"],
            r["load"],
            r["sources"],
            r["dst"],
            r["backend"],
            r["blocks"],
            r["block_size"],
        )
        groups[key].append(r)
    dup = sum(1 for g in groups.values() if len(g) > 1)
    if dup:
        warn(f"{dup} configuration(s) appear more than once; the median of their rows is drawn")
    out = {}
    for key, g in groups.items():
        refs = [r["ref_gbps"] for r in g if r["ref_gbps"] is not None and r["ref_gbps"] > 0]
        slows = [r["compute_slowdown"] for r in g if r["compute_slowdown"] is not None]
        out[key] = {
            "value": statistics.median(r["value"] for r in g),
            "ref_gbps": statistics.median(refs) if refs else None,
            "slowdown": statistics.median(slows) if slows else None,
            "files": {r["file"] for r in g},
        }
    return out


def sources_text(points):
    """'sources: cold (a.csv), warm (b.csv)' for the points drawn in one chart."""
    by_src = defaultdict(set)
    for key, p in points:
        by_src[key[3]].update(p["files"])
    parts = [f"{s} ({', '.join(sorted(by_src[s]))})" for s in ordered(by_src, SOURCES_ORDER)]
    return "sources: " + "; ".join(parts)


def backend_colour(backend, all_backends):
    if backend in BACKEND_COLOURS:
        return BACKEND_COLOURS[backend]
    extra = [b for b in all_backends if b not in BACKEND_COLOURS]
    return EXTRA_COLOURS[extra.index(backend) % len(EXTRA_COLOURS)]


def finish(fig, ax, path, title, subtitle):
    ax.grid(True, which="major", alpha=0.4)
    ax.set_title(subtitle, fontsize=9)
    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(fig)
    print(path)


def draw_sweep(
    plt,
    points,
    x_of,
    x_values,
    x_tick_labels,
    x_label,
    ref_at,
    metric,
    path,
    title,
    subtitle,
    all_backends,
):
    """One line per (backend, sources) of `points` ([(key, point)]) against x_of(key), plus the
    black dotted contiguous reference `ref_at[x]`."""
    _, y_label, is_ratio = METRICS[metric]
    fig, ax = plt.subplots(figsize=(9, 5.2))
    lines = defaultdict(list)
    for key, p in points:
        lines[(key[5], key[3])].append((x_of(key), p["value"]))
    backends = ordered({b for b, _ in lines}, BACKEND_ORDER)
    sources = ordered({s for _, s in lines}, SOURCES_ORDER)
    for b in backends:
        for s in sources:
            pts = sorted(lines.get((b, s), []))
            if not pts:
                continue
            ax.plot(
                [x for x, _ in pts],
                [y for _, y in pts],
                linestyle=SOURCES_STYLE.get(s, "-."),
                marker=MARKERS.get(b, "o"),
                markersize=4,
                linewidth=1.6,
                color=backend_colour(b, all_backends),
                label=f"{b} ({s})",
            )
    if is_ratio:
        ax.axhline(
            1.0,
            color="black",
            linestyle=":",
            linewidth=1.5,
            label="contiguous pinned cudaMemcpyAsync (= 1)",
        )
        from matplotlib.ticker import PercentFormatter

        ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
    else:
        ref = sorted((x, v) for x, v in ref_at.items() if v is not None)
        if ref:
            ax.plot(
                [x for x, _ in ref],
                [v for _, v in ref],
                color="black",
                linestyle=":",
                linewidth=1.8,
                marker=".",
                label="contiguous pinned cudaMemcpyAsync (ref_gbps)",
            )
    ax.set_xscale("log", base=2)
    ax.set_xticks(x_values)
    ax.set_xticklabels(x_tick_labels, fontsize=8)
    ax.minorticks_off()
    ax.set_xlabel(x_label)
    ax.set_ylabel(y_label)
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=True)
    finish(fig, ax, path, title, subtitle)


def main():
    ap = argparse.ArgumentParser(
        prog=PROG,
        description="Draw the charts of gfd_benchmark's and gfd_multi_gpu_benchmark's "
        "CSV output (see the module docstring for the CSV columns and the files written).",
    )
    ap.add_argument(
        "csv",
        nargs="+",
        help="gfd_benchmark and/or gfd_multi_gpu_benchmark --csv "
        "output(s); several of a kind are merged",
    )
    ap.add_argument("--out", required=True, help="directory for the PNGs (created if needed)")
    ap.add_argument(
        "--metric",
        default="p50_gbps",
        choices=sorted(METRICS),
        help="y value (default p50_gbps); ratio_* are fractions of ref_gbps",
    )
    ap.add_argument("--title", default=None, help="headline of every chart")
    ap.add_argument(
        "--sweep-block-size",
        type=int,
        default=4096,
        help="block size of the block-count sweep (default 4096)",
    )
    ap.add_argument(
        "--slowdown-format",
        choices=["fraction", "ratio", "percent"],
        default="fraction",
        help="how compute_slowdown is written: fraction (0.12 = +12%%, default), "
        "ratio (1.12 = +12%%) or percent (12 = +12%%)",
    )
    args = ap.parse_args()

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        die("matplotlib is not installed (python3 -m pip install --user matplotlib)")

    # Each file goes to the charts of its own program, recognised by its header.
    by_kind = {"single": [], "multi": [], "paged": [], "serving": []}
    for path in args.csv:
        by_kind[csv_kind(path)].append(path)
    kinds = [k for k in ("single", "multi", "paged", "serving") if by_kind[k]]
    plots = {
        "single": plot_benchmark,
        "multi": plot_multi_gpu,
        "paged": plot_paged_csvs,
        "serving": plot_serving_csvs,
    }
    names = {
        "single": "gfd_benchmark",
        "multi": "gfd_multi_gpu_benchmark",
        "paged": "gfd_benchmark --layout paged",
        "serving": "gfd_bench.serving",
    }
    written = 0
    for kind in kinds:
        try:
            written += plots[kind](plt, by_kind[kind], args)
        except (NoData, plot_paged.NoData, plot_serving.NoData) as e:
            if len(kinds) == 1:
                die(str(e))
            warn(f"{names[kind]} CSV(s): {e}")
    if not written:
        die("nothing drawn from any of the inputs")
    return 0


class NoData(Exception):
    """No chart can be drawn from one kind of input (a data error, exit status 1)."""


def plot_paged_csvs(plt, paths, args):
    """The charts of docs/performance.md from gfd_benchmark --layout paged CSVs."""
    return plot_paged.plot(plt, paths, args.out, args.title, warn)


def plot_serving_csvs(plt, paths, args):
    """The serving loop's chart from gfd_bench.serving CSVs."""
    return plot_serving.plot(plt, paths, args.out, args.title, warn)


def csv_kind(path):
    """'paged' for a gfd_benchmark --layout paged CSV, 'serving' for a gfd_bench.serving CSV,
    'multi' for a gfd_multi_gpu_benchmark CSV (its header has `gpus` or `scaling_efficiency`; a
    file with one but not the other is then reported as missing a column), else 'single'
    (gfd_benchmark's other layouts)."""
    try:
        f = open(path, newline="")
    except OSError as e:
        die(f"cannot read {path}: {e.strerror}")
    with f:
        header = {h.strip() for h in next(csv.reader(f), [])}
    if plot_paged.is_paged(header):
        return "paged"
    if plot_serving.is_serving(header):
        return "serving"
    return "multi" if header & {"gpus", "scaling_efficiency"} else "single"


def plot_benchmark(plt, paths, args):
    """gfd_benchmark's charts from `paths`; returns how many were written (raises NoData)."""
    rows = read_csvs(paths, args.metric)
    data = aggregate(rows)
    prefix, y_label, is_ratio = METRICS[args.metric]
    headline = args.title or "gfd_benchmark"
    all_backends = ordered({k[5] for k in data}, BACKEND_ORDER)
    modes = ordered({k[0] for k in data}, ["gpu", "host-only"])
    directions = ordered({k[1] for k in data}, ["h2d", "d2h"])
    loads = {k[2] for k in data}
    unknown_loads = loads - {"none"} - set(LOAD_MODES)
    if unknown_loads:
        warn(
            f"rows with load {', '.join(sorted(unknown_loads))} are not drawn "
            f"(only 'none', {', '.join(repr(m) for m in LOAD_MODES)} are known)"
        )
    os.makedirs(args.out, exist_ok=True)
    written = 0

    for mode in modes:
        for direction in directions:
            suffix_md = (f"_{mode}" if len(modes) > 1 else "") + (
                f"_{direction}" if len(directions) > 1 else ""
            )
            unloaded = [
                (k, p)
                for k, p in data.items()
                if k[0] == mode and k[1] == direction and k[2] == "none"
            ]
            for dst in ordered({k[4] for k, _ in unloaded}, DST_ORDER):
                pts = [(k, p) for k, p in unloaded if k[4] == dst]
                meta = f"mode {mode}, {direction}, destinations {dst}; {sources_text(pts)}"

                # 1. Block-count sweep at the fixed block size.
                bs = args.sweep_block_size
                sweep = [(k, p) for k, p in pts if k[7] == bs]
                xs = sorted({k[6] for k, _ in sweep})
                if len(xs) >= 2:
                    ref_at = {
                        x: _median([p["ref_gbps"] for k, p in sweep if k[6] == x]) for x in xs
                    }
                    path = os.path.join(args.out, f"{prefix}_vs_blocks_{dst}{suffix_md}.png")
                    draw_sweep(
                        plt,
                        sweep,
                        lambda k: k[6],
                        xs,
                        [str(x) for x in xs],
                        f"blocks per transfer (block size {bs} B)",
                        ref_at,
                        args.metric,
                        path,
                        headline,
                        f"{_short(y_label)} vs block count, {bs} B blocks\n{meta}",
                        all_backends,
                    )
                    written += 1
                else:
                    warn(
                        f"{mode}/{direction}/{dst}: fewer than two block counts at block size "
                        f"{bs}; no block-count chart"
                    )

                # 2. Block-size sweep. The default sweep uses one block count (2048) for every
                # size except the largest ones, where fewer blocks cap a transfer at 256 MB; the
                # block-count sweep adds other counts at 4096 B (16..16384). So per block size
                # there can be several counts. The sweep's count is taken to be the one present
                # at the most block sizes (ties: the larger count); a size that has it uses it.
                # A size without it (the capped largest sizes, or a custom grid) uses the largest
                # count present at that size, i.e. the one closest to the sweep's
                # "as many blocks as the cap allows" rule, and its tick label shows that count.
                # (Plainly taking the largest count everywhere would pick 16384 at 4096 B, a
                # point of the other sweep, 8x the bytes of its neighbours.)
                counts_at = defaultdict(set)
                for k, _ in pts:
                    counts_at[k[7]].add(k[6])
                sizes = sorted(counts_at)
                if len(sizes) >= 2:
                    popularity = defaultdict(int)
                    for s in sizes:
                        for n in counts_at[s]:
                            popularity[n] += 1
                    n_sweep = max(popularity, key=lambda n: (popularity[n], n))
                    chosen = {
                        s: (n_sweep if n_sweep in counts_at[s] else max(counts_at[s]))
                        for s in sizes
                    }
                    sweep = [(k, p) for k, p in pts if chosen[k[7]] == k[6]]
                    ref_at = {
                        s: _median([p["ref_gbps"] for k, p in sweep if k[7] == s]) for s in sizes
                    }
                    labels = [
                        size_label(s) + ("" if chosen[s] == n_sweep else f"\nN={chosen[s]}")
                        for s in sizes
                    ]
                    path = os.path.join(args.out, f"{prefix}_vs_block_size_{dst}{suffix_md}.png")
                    other = any(chosen[s] != n_sweep for s in sizes)
                    draw_sweep(
                        plt,
                        sweep,
                        lambda k: k[7],
                        sizes,
                        labels,
                        f"block size (bytes); {n_sweep} blocks per transfer"
                        + (" (N = blocks where marked)" if other else ""),
                        ref_at,
                        args.metric,
                        path,
                        headline,
                        f"{_short(y_label)} vs block size, {n_sweep} blocks\n{meta}",
                        all_backends,
                    )
                    written += 1
                else:
                    warn(
                        f"{mode}/{direction}/{dst}: fewer than two block sizes; no block-size chart"
                    )

    # 3. Under SM load, one chart per load mode.
    for load, what in LOAD_MODES.items():
        loaded = [(k, p) for k, p in data.items() if k[2] == load]
        if loaded:
            name = "under_load" + ("" if load == "sm" else "_" + load.replace("sm-", ""))
            path = os.path.join(
                args.out, name + ("" if prefix == "gbps" else f"_{prefix}") + ".png"
            )
            draw_under_load(plt, data, loaded, args, path, headline, all_backends, what)
            written += 1

    if not written:
        raise NoData(
            "nothing to draw: no sweep has two or more points and there are no load == 'sm' rows"
        )
    return written


# gfd_benchmark --under-load modes (the `load` column) and what each chart says of them.
LOAD_MODES = {
    "sm": "one long compute kernel on every SM, transfers at higher stream priority",
    "sm-equal": "one long compute kernel on every SM, transfers at the same stream priority",
    "sm-short": "back-to-back short compute kernels, transfers at the same stream priority",
}


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _short(y_label):
    return y_label.split(" (")[0]


def slowdown_pct(v, fmt):
    if v is None:
        return None
    if fmt == "fraction":
        return 100.0 * v
    if fmt == "ratio":
        return 100.0 * (v - 1.0)
    return v


def draw_under_load(plt, data, loaded, args, path, headline, all_backends, what):
    """One panel per configuration (mode, direction, sources, dst, blocks, block size) measured
    under SM load; in each, per backend, a bar unloaded and a bar under load, the latter
    annotated with the compute kernel's slowdown."""
    _, y_label, is_ratio = METRICS[args.metric]
    configs = defaultdict(dict)
    for k, p in loaded:
        cfg = (k[0], k[1], k[3], k[4], k[6], k[7])
        configs[cfg][k[5]] = (data.get((k[0], k[1], "none", k[3], k[4], k[5], k[6], k[7])), p)

    def cfg_order(c):
        mode, direction, sources, dst, blocks, bsize = c

        def rank(v, pref):
            return pref.index(v) if v in pref else len(pref)

        return (
            rank(mode, ["gpu", "host-only"]),
            mode,
            rank(direction, ["h2d", "d2h"]),
            direction,
            rank(dst, DST_ORDER),
            dst,
            rank(sources, SOURCES_ORDER),
            sources,
            blocks,
            bsize,
        )

    cfgs = sorted(configs, key=cfg_order)
    n = len(cfgs)
    size = (9, 3.6 * n + 0.8)
    try:  # constrained layout keeps the headline clear of the first panel
        fig, axes = plt.subplots(n, 1, figsize=size, squeeze=False, layout="constrained")
    except TypeError:  # matplotlib < 3.5
        fig, axes = plt.subplots(n, 1, figsize=size, squeeze=False, constrained_layout=True)
    missing_unloaded = 0
    files = set()
    for ax, cfg in zip(axes[:, 0], cfgs):
        mode, direction, sources, dst, blocks, bsize = cfg
        per_b = configs[cfg]
        backends = ordered(per_b, BACKEND_ORDER)
        width = 0.38
        ymax = 0.0
        for i, b in enumerate(backends):
            unl, ld = per_b[b]
            files |= ld["files"] | (unl["files"] if unl else set())
            colour = backend_colour(b, all_backends)
            if unl is not None:
                ax.bar(
                    i - width / 2,
                    unl["value"],
                    width,
                    color=colour,
                    edgecolor="black",
                    linewidth=0.6,
                )
                ax.text(
                    i - width / 2,
                    unl["value"],
                    _fmt(unl["value"], is_ratio),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
                ymax = max(ymax, unl["value"])
            else:
                missing_unloaded += 1
                ax.text(
                    i - width / 2,
                    0,
                    "no\nunloaded\nrow",
                    ha="center",
                    va="bottom",
                    fontsize=7,
                    color="gray",
                )
            ax.bar(
                i + width / 2,
                ld["value"],
                width,
                color=colour,
                edgecolor="black",
                linewidth=0.6,
                hatch="///",
                alpha=0.75,
            )
            pct = slowdown_pct(ld["slowdown"], args.slowdown_format)
            if pct is None and unl is not None:
                pct = slowdown_pct(unl["slowdown"], args.slowdown_format)
            note = _fmt(ld["value"], is_ratio)
            note += f"\ncompute {pct:+.1f}%" if pct is not None else "\ncompute n/a"
            ax.text(i + width / 2, ld["value"], note, ha="center", va="bottom", fontsize=7)
            ymax = max(ymax, ld["value"])
        ax.set_xticks(range(len(backends)))
        ax.set_xlim(-0.6, max(len(backends), 4) - 0.4)  # same bar width with fewer backends
        ax.set_xticklabels(backends)
        ax.set_xlabel("backend")
        ax.set_ylabel(_short(y_label) + (" (GB/s)" if not is_ratio else ""))
        if is_ratio:
            from matplotlib.ticker import PercentFormatter

            ax.yaxis.set_major_formatter(PercentFormatter(xmax=1.0))
        ax.set_ylim(0, ymax * 1.3 if ymax > 0 else 1)
        ax.set_title(
            f"mode {mode}, {direction}, {sources} sources, destinations {dst}, "
            f"{blocks} blocks x {bsize} B",
            fontsize=9,
        )
        ax.grid(True, axis="y", alpha=0.4)
        ax.set_axisbelow(True)
        from matplotlib.patches import Patch

        ax.legend(
            handles=[
                Patch(facecolor="white", edgecolor="black", label="unloaded"),
                Patch(facecolor="white", edgecolor="black", hatch="///", label="under SM load"),
            ],
            fontsize=8,
            loc="upper right",
        )
    if missing_unloaded:
        warn(f"under_load: {missing_unloaded} loaded row(s) without a matching unloaded row")
    fig.suptitle(
        f"{headline}\n{_short(y_label)}: unloaded vs {what} "
        f"(hatched; label: compute slowdown)\nfiles: {', '.join(sorted(files))}",
        fontsize=10,
    )
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    print(path)


def _fmt(v, is_ratio):
    return f"{100 * v:.0f}%" if is_ratio else f"{v:.1f}"


# ---------------------------------------------------------------------------------------------
# gfd_multi_gpu_benchmark

MULTI_REQUIRED = [
    "mode",
    "sources",
    "backend",
    "gpus",
    "gpu",
    "blocks",
    "block_size",
    "p50_gbps",
    "ref_gbps",
    "scaling_efficiency",
    "verified",
]
REF_BACKEND = "contiguous"  # the contiguous pinned DMA reference's rows
ALL_GPUS = "all"  # `gpu` of the aggregate rows


def read_multi_csvs(paths):
    """Reads and validates gfd_multi_gpu_benchmark CSVs; returns the usable rows."""

    def make_row(r, name):
        gpu = r["gpu"]
        if gpu.lower() == ALL_GPUS:
            gpu = ALL_GPUS
        else:
            try:
                gpu = str(int(float(gpu)))
            except ValueError:
                pass  # a name other than a number: drawn as given
        row = {
            "file": name,
            "mode": r["mode"],
            "sources": r["sources"],
            "backend": r["backend"],
            "gpu": gpu,
            "gpus": int(float(r["gpus"])),
            "blocks": int(float(r["blocks"])),
            "block_size": int(float(r["block_size"])),
            "value": parse_float(r["p50_gbps"]),
            "ref_gbps": parse_float(r["ref_gbps"]),
            "efficiency": parse_float(r["scaling_efficiency"]),
        }
        if (
            row["value"] is None
            or row["gpus"] <= 0
            or row["blocks"] <= 0
            or row["block_size"] <= 0
            or gpu == ""
        ):
            return None
        return row

    return _read_rows(
        paths,
        MULTI_REQUIRED,
        " (gfd_multi_gpu_benchmark)",
        make_row,
        "p50_gbps, gpus, gpu, blocks or block_size",
    )


def aggregate_multi(rows):
    """Key (mode, sources, blocks, block_size, backend, gpus, gpu) -> dict(value, ref_gbps,
    efficiency, files); rows of one key (measured twice, a file given twice) -> the median."""
    groups = defaultdict(list)
    for r in rows:
        groups[
            (
                r["mode"],
                r["sources"],
                r["blocks"],
                r["block_size"],
                r["backend"],
                r["gpus"],
                r["gpu"],
            )
        ].append(r)
    dup = sum(1 for g in groups.values() if len(g) > 1)
    if dup:
        warn(f"{dup} multi-GPU row key(s) appear more than once; the median of their rows is drawn")
    return {
        key: {
            "value": statistics.median(r["value"] for r in g),
            "ref_gbps": _median([r["ref_gbps"] for r in g]),
            "efficiency": _median([r["efficiency"] for r in g]),
            "files": {r["file"] for r in g},
        }
        for key, g in groups.items()
    }


def _gpu_order(gpu):
    return (0, int(gpu), "") if gpu.isdigit() else (1, 0, gpu)


def _multi_sources_text(points):
    by_src = defaultdict(set)
    for key, p in points:
        by_src[key[1]].update(p["files"])
    return "sources: " + "; ".join(
        f"{s} ({', '.join(sorted(by_src[s]))})" for s in ordered(by_src, SOURCES_ORDER)
    )


def plot_multi_gpu(plt, paths, args):
    """gfd_multi_gpu_benchmark's charts from `paths`; returns how many were written (raises
    NoData). One pair of charts per (mode, blocks, block size); cold and warm share them."""
    if args.metric != "p50_gbps":
        warn(
            f"the multi-GPU charts show p50_gbps (--metric {args.metric} applies to "
            "gfd_benchmark CSVs only)"
        )
    data = aggregate_multi(read_multi_csvs(paths))
    headline = args.title or "gfd_multi_gpu_benchmark"
    all_backends = ordered({k[4] for k in data if k[4] != REF_BACKEND}, BACKEND_ORDER)
    modes = ordered({k[0] for k in data}, ["gpu", "host-only"])
    shapes = sorted({(k[2], k[3]) for k in data})
    os.makedirs(args.out, exist_ok=True)
    written = 0
    for mode in modes:
        for blocks, bsize in shapes:
            pts = [
                (k, p) for k, p in data.items() if k[0] == mode and k[2] == blocks and k[3] == bsize
            ]
            if not pts:
                continue
            suffix = (f"_{mode}" if len(modes) > 1 else "") + (
                f"_{blocks}x{size_label(bsize)}" if len(shapes) > 1 else ""
            )
            where = f"mode {mode}, {blocks} blocks x {bsize} B"
            agg = [(k, p) for k, p in pts if k[6] == ALL_GPUS]
            per = [(k, p) for k, p in pts if k[6] != ALL_GPUS]
            if agg:
                path = os.path.join(args.out, f"multi_gpu_aggregate{suffix}.png")
                draw_multi_aggregate(
                    plt,
                    agg,
                    path,
                    headline,
                    f"aggregate p50 GB/s (all bytes / slowest GPU's time) vs GPU "
                    f"count; {where}\n{_multi_sources_text(agg)}",
                    all_backends,
                )
                written += 1
            else:
                warn(f"{where}: no aggregate (gpu == 'all') rows; no aggregate chart")
            if per:
                path = os.path.join(args.out, f"multi_gpu_per_gpu{suffix}.png")
                draw_multi_per_gpu(plt, per, agg, path, headline, where, all_backends)
                written += 1
            else:
                warn(f"{where}: no per-GPU rows; no per-GPU chart")
    if not written:
        raise NoData("nothing to draw: no aggregate or per-GPU rows")
    return written


def draw_multi_aggregate(plt, agg, path, headline, subtitle, all_backends):
    """Aggregate GB/s against G: a line per (backend, sources), the contiguous reference black
    dotted, a thin grey ideal line G x (1-GPU gather) and gather's points annotated with their
    scaling efficiency."""
    fig, ax = plt.subplots(figsize=(9, 5.2))
    lines = defaultdict(list)
    for k, p in agg:
        lines[(k[4], k[1])].append((k[5], p))
    gs = sorted({k[5] for k, _ in agg})
    sources = ordered({s for _, s in lines}, SOURCES_ORDER)
    backends = ordered({b for b, _ in lines if b != REF_BACKEND}, BACKEND_ORDER)
    ymax = 0.0
    for b in backends:
        for s in sources:
            pts = sorted(lines.get((b, s), []), key=lambda t: t[0])
            if not pts:
                continue
            ys = [p["value"] for _, p in pts]
            ymax = max(ymax, max(ys))
            colour = backend_colour(b, all_backends)
            ax.plot(
                [g for g, _ in pts],
                ys,
                linestyle=SOURCES_STYLE.get(s, "-."),
                marker=MARKERS.get(b, "o"),
                markersize=5,
                linewidth=1.6,
                color=colour,
                label=f"{b} ({s})",
            )
            if b != "gather":
                continue
            one = dict(pts).get(1)
            base = one["value"] if one else None
            if base and len(gs) > 1:
                ideal = [(g, g * base) for g in gs if g >= 1]
                ax.plot(
                    [g for g, _ in ideal],
                    [v for _, v in ideal],
                    color="grey",
                    linewidth=0.9,
                    linestyle=SOURCES_STYLE.get(s, "-."),
                    label="ideal gather (G x 1-GPU)" + (f" ({s})" if len(sources) > 1 else ""),
                    zorder=1,
                )
                ymax = max(ymax, max(v for _, v in ideal))
            elif not base:
                warn(f"{s} sources: no 1-GPU gather aggregate row; no ideal line")
            # The first sources' labels go under-right of its points (below its rising line),
            # the second's (warm: usually the higher line) over-left, so the two stay apart.
            under = len(sources) > 1 and s == sources[0]
            for g, p in pts:
                eff = p["efficiency"]
                if eff is None and base:
                    eff = p["value"] / (g * base)  # the column's definition
                if eff is None:
                    continue
                ax.annotate(
                    f"{100 * eff:.0f}%",
                    (g, p["value"]),
                    textcoords="offset points",
                    xytext=(6, -6) if under else (-6, 6),
                    ha="left" if under else "right",
                    va="top" if under else "bottom",
                    fontsize=8,
                    color=colour,
                    fontweight="bold",
                    bbox=dict(
                        boxstyle="round,pad=0.15", facecolor="white", edgecolor="none", alpha=0.8
                    ),
                )
    # Reference: the `contiguous` backend's aggregate rows, else the rows' ref_gbps.
    for i, s in enumerate(sources):
        ref = sorted(((g, p["value"]) for g, p in lines.get((REF_BACKEND, s), [])))
        label = "contiguous pinned DMA reference"
        if not ref:
            ref_at = defaultdict(list)
            for k, p in agg:
                if k[1] == s:
                    ref_at[k[5]].append(p["ref_gbps"])
            ref = sorted((g, _median(v)) for g, v in ref_at.items() if _median(v) is not None)
            label += " (ref_gbps)"
        if ref:
            ax.plot(
                [g for g, _ in ref],
                [v for _, v in ref],
                color="black",
                linestyle=":",
                linewidth=1.8,
                marker="." if i == 0 else "x",
                markersize=6,
                label=label + (f" ({s})" if len(sources) > 1 else ""),
            )
            ymax = max(ymax, max(v for _, v in ref))
    if len(gs) == 1:
        warn(
            f"{os.path.basename(path)}: only G = {gs[0]} present; the chart has one point per line"
        )
    ax.set_xticks(gs)
    ax.set_xticklabels([str(g) for g in gs])
    ax.set_xlim(min(gs) - 0.5, max(gs) + 0.5)
    ax.minorticks_off()
    ax.set_xlabel("GPUs used (G)")
    ax.set_ylabel("aggregate p50 throughput (GB/s, 1 GB = 10^9 B)")
    ax.set_ylim(0, ymax * 1.1 if ymax > 0 else 1)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=True)
    finish(
        fig,
        ax,
        path,
        headline,
        subtitle + "\nlabels: gather's scaling efficiency (aggregate / (G x 1-GPU aggregate))",
    )


def draw_multi_per_gpu(plt, per, agg, path, headline, where, all_backends):
    """Per-GPU GB/s at the largest G: one panel per sources; in each, a group of bars per
    backend, one bar per GPU, with a black dash at that GPU's contiguous rate alone."""
    from matplotlib.lines import Line2D

    sources = ordered({k[1] for k, _ in per}, SOURCES_ORDER)
    agg_of = {(k[1], k[5], k[4]): p for k, p in agg}
    panels = []
    for s in sources:
        g_max = max(k[5] for k, _ in per if k[1] == s)
        rows = {(k[4], k[6]): p for k, p in per if k[1] == s and k[5] == g_max}
        panels.append((s, g_max, rows))
    n_bars = max(len(rows) for _, _, rows in panels)
    width_in = max(9.0, 0.25 * n_bars + 3.0)
    size = (width_in, 4.4 * len(panels) + 1.0)
    try:
        fig, axes = plt.subplots(len(panels), 1, figsize=size, squeeze=False, layout="constrained")
    except TypeError:  # matplotlib < 3.5
        fig, axes = plt.subplots(
            len(panels), 1, figsize=size, squeeze=False, constrained_layout=True
        )
    files = set()
    for ax, (s, g_max, rows) in zip(axes[:, 0], panels):
        backends = ordered({b for b, _ in rows if b != REF_BACKEND}, BACKEND_ORDER)
        backends += [REF_BACKEND] if any(b == REF_BACKEND for b, _ in rows) else []
        gpus = sorted({g for _, g in rows}, key=_gpu_order)
        if len(gpus) != g_max:
            warn(f"{where}, {s} sources, G = {g_max}: per-GPU rows for {len(gpus)} GPU(s)")
        w = 0.84 / len(gpus)
        ticks, tick_labels, group_labels, ymax = [], [], [], 0.0
        for i, b in enumerate(backends):
            colour = "lightgrey" if b == REF_BACKEND else backend_colour(b, all_backends)
            for j, g in enumerate(gpus):
                x = i - 0.42 + (j + 0.5) * w
                ticks.append(x)
                tick_labels.append(f"GPU {g}")
                p = rows.get((b, g))
                if p is None:
                    continue
                files |= p["files"]
                ax.bar(x, p["value"], w * 0.9, color=colour, edgecolor="black", linewidth=0.5)
                ymax = max(ymax, p["value"])
                if p["ref_gbps"] is not None:
                    ax.hlines(
                        p["ref_gbps"], x - w * 0.45, x + w * 0.45, color="black", linewidth=1.6
                    )
                    ymax = max(ymax, p["ref_gbps"])
                if n_bars <= 24:
                    ax.text(
                        x,
                        p["value"],
                        f"{p['value']:.1f}",
                        ha="center",
                        va="bottom",
                        fontsize=6,
                        rotation=90 if len(gpus) > 2 else 0,
                    )
            a = agg_of.get((s, g_max, b))
            group_labels.append(b + (f"\naggregate {a['value']:.1f} GB/s" if a else ""))
        ax.set_xticks(ticks)
        ax.set_xticklabels(tick_labels, rotation=90, fontsize=7)
        sec = ax.secondary_xaxis("bottom")
        sec.set_xticks(range(len(backends)))
        sec.set_xticklabels(group_labels, fontsize=8)
        sec.tick_params(length=0, pad=34)
        sec.spines["bottom"].set_visible(False)
        ax.set_xlim(-0.6, max(len(backends), 3) - 0.4)
        ax.set_ylabel("p50 throughput per GPU (GB/s)")
        ax.set_ylim(0, ymax * 1.18 if ymax > 0 else 1)
        ax.set_title(f"{where}, {s} sources, G = {g_max} GPU{'s' if g_max > 1 else ''}", fontsize=9)
        ax.grid(True, axis="y", alpha=0.4)
        ax.set_axisbelow(True)
        ax.legend(
            handles=[
                Line2D(
                    [],
                    [],
                    color="black",
                    linewidth=1.6,
                    label="that GPU's contiguous rate, measured alone",
                )
            ],
            fontsize=8,
            loc="upper right",
        )
    fig.suptitle(
        f"{headline}\nper-GPU p50 GB/s at the largest GPU count, one bar per GPU"
        f"\nfiles: {', '.join(sorted(files))}",
        fontsize=10,
    )
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    print(path)


if __name__ == "__main__":
    sys.exit(main())

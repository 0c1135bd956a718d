"""The two charts of docs/performance.md, drawn from the runtime's call measured by
`gfd_benchmark --layout paged` (bench/measure.sh's load_sweep_*.csv): plot_results.py draws them
for any CSV of that program (recognised by its `method` and `load_slowdown` columns).

    rate_vs_block_size.png  GB/s (P50) against block size, a line per method (gfd and each
                            peer) and the contiguous DMA of the same bytes (black, dotted); a
                            panel per direction (rows) and per load (columns: idle, then each
                            load, e.g. "decode": back-to-back bf16 matmuls beside the copies)
    load_slowdown.png       how much longer the load's matmuls took beside each method, against
                            block size, with the contiguous DMA alone (black, dotted: the floor of
                            any copy path); a panel per direction

Columns read: direction, load, block_size, method, p50_gbps, load_slowdown (a fraction: 0.12 is
+12%), verified ("1"; "0" drops the row with a warning; empty: not checked, as for the contiguous
DMA). Several CSVs (runs) are merged: each point is the median of its rows.
"""

import csv
import statistics
from collections import defaultdict

REQUIRED = ["direction", "load", "block_size", "method", "p50_gbps", "load_slowdown", "verified"]

# method -> (label, colour, marker), in drawing order; other methods are drawn after these.
METHODS = {
    "gfd": ("gfd", "tab:blue", "o"),
    "batch": ("batch DMA (vLLM's)", "tab:orange", "s"),
    "per_block": ("per-block memcpy", "tab:green", "^"),
    "gfd_zero_copy": ("gfd zero-copy kernel", "tab:red", "D"),
    "uva2": ("SM copy kernel, 2 CTAs", "tab:purple", "v"),
    "uva12": ("SM copy kernel, 12 CTAs", "tab:brown", "P"),
}
CONTIGUOUS = "dma_contiguous"
DIRECTIONS = {"h2d": "host to GPU", "d2h": "GPU to host"}


class NoData(Exception):
    """Nothing to draw from the given CSVs."""


def is_paged(header):
    """Whether a CSV header is that of gfd_benchmark --layout paged."""
    return "method" in header and "load_slowdown" in header


def _number(text):
    text = (text or "").strip()
    return float(text) if text else None


def read_csvs(paths, required, failed, make_row, warn):
    """make_row(row) of every row of every CSV, after checking that each has the `required`
    columns; the rows for which failed(row) is true are left out, with a warning per file.
    Raises NoData for a missing column or when no row is left."""
    rows = []
    for path in paths:
        with open(path, newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in required if c not in (reader.fieldnames or [])]
            if missing:
                raise NoData(f"{path}: missing column(s) {', '.join(missing)}")
            dropped = 0
            for r in reader:
                if failed(r):
                    dropped += 1
                    continue
                rows.append(make_row(r))
            if dropped:
                warn(f"{path}: {dropped} row(s) failed verification and are not drawn")
    if not rows:
        raise NoData("no rows in " + ", ".join(paths))
    return rows


def read(paths, warn):
    """The usable rows of every CSV: dicts of direction, load, size, method, gbps, slowdown."""
    return read_csvs(
        paths,
        REQUIRED,
        lambda r: r["verified"].strip() == "0",
        lambda r: {
            "direction": r["direction"],
            "load": r["load"],
            "size": int(float(r["block_size"])),
            "method": r["method"],
            "gbps": _number(r["p50_gbps"]),
            "slowdown": _number(r["load_slowdown"]),
        },
        warn,
    )


def medians(rows, field):
    """{(direction, load, method): {size: median of `field`}} over the rows that have it."""
    groups = defaultdict(list)
    for r in rows:
        if r[field] is not None:
            groups[(r["direction"], r["load"], r["method"], r["size"])].append(r[field])
    out = defaultdict(dict)
    for (direction, load, method, size), values in groups.items():
        out[(direction, load, method)][size] = statistics.median(values)
    return out


def _ordered(values, preferred):
    values = set(values)
    return [v for v in preferred if v in values] + sorted(values - set(preferred))


def _size_label(n):
    for div, suffix in ((1 << 20, "M"), (1 << 10, "K")):
        if n >= div and n % div == 0:
            return f"{n // div}{suffix}"
    return str(n)


def _lines(ax, series, methods, scale=1.0):
    """A line per method of `series` ({method: {size: value}}), the contiguous DMA last."""
    for m in methods:
        points = sorted(series.get(m, {}).items())
        if not points:
            continue
        if m == CONTIGUOUS:
            style = {"color": "black", "linestyle": ":", "marker": ".", "label": "contiguous DMA"}
        else:
            label, colour, marker = METHODS.get(m, (m, None, "x"))
            style = {"color": colour, "marker": marker, "label": label}
        ax.plot(
            [s for s, _ in points],
            [v * scale for _, v in points],
            linewidth=1.6,
            markersize=4,
            **style,
        )


def _size_axis(ax, sizes):
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([_size_label(s) for s in sizes], fontsize=8)
    ax.minorticks_off()
    ax.set_xlabel("block size")
    ax.grid(True, alpha=0.4)


def _load_title(load):
    return "idle GPU" if load == "none" else f"under the {load} load"


def draw_rates(plt, rows, path, title):
    """rate_vs_block_size.png: GB/s against block size, a panel per direction and load."""
    data = medians(rows, "gbps")
    directions, loads, methods, sizes = _keys(data, ["none"])
    fig, axes = plt.subplots(
        len(directions),
        len(loads),
        squeeze=False,
        sharey=True,
        figsize=(5.2 * len(loads) + 2, 3.8 * len(directions)),
    )
    for i, d in enumerate(directions):
        for j, load in enumerate(loads):
            ax = axes[i][j]
            _lines(ax, {m: data.get((d, load, m), {}) for m in methods}, methods)
            _size_axis(ax, sizes)
            ax.set_title(f"{DIRECTIONS.get(d, d)}, {_load_title(load)}", fontsize=10)
            ax.set_ylim(bottom=0)
            if j == 0:
                ax.set_ylabel("GB/s (P50)")
    _finish(plt, fig, axes, title, path)


def draw_slowdown(plt, rows, path, title):
    """load_slowdown.png: the load's slowdown beside each method, a panel per direction."""
    data = medians([r for r in rows if r["load"] != "none"], "slowdown")
    if not data:
        return False
    from matplotlib.ticker import FuncFormatter

    directions, loads, methods, sizes = _keys(data, [])
    fig, axes = plt.subplots(
        1, len(directions), squeeze=False, sharey=True, figsize=(5.6 * len(directions) + 2, 4.8)
    )
    for j, d in enumerate(directions):
        ax = axes[0][j]
        for load in loads:
            _lines(ax, {m: data.get((d, load, m), {}) for m in methods}, methods, scale=100)
        _size_axis(ax, sizes)
        # Slowdowns span from a few percent below zero to thousands of percent above it.
        ax.set_yscale("symlog", linthresh=10)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:+.0f}%" if v else "0"))
        ax.axhline(0, color="grey", linewidth=0.8)
        ax.set_title(f"{DIRECTIONS.get(d, d)}, {', '.join(loads)} load", fontsize=10)
        if j == 0:
            ax.set_ylabel("the load's slowdown beside the copies")
    _finish(plt, fig, axes, title, path)
    return True


def _keys(data, loads_first):
    """The directions, loads, methods and block sizes of `data` (see medians), in drawing order."""
    return (
        _ordered({k[0] for k in data}, DIRECTIONS),
        _ordered({k[1] for k in data}, loads_first),
        _ordered({k[2] for k in data}, list(METHODS) + [CONTIGUOUS]),
        sorted({s for series in data.values() for s in series}),
    )


def _finish(plt, fig, axes, title, path):
    """One legend for every panel (the first panel's lines), the title, and the file."""
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    print(path)


def plot(plt, paths, out_dir, title, warn):
    """Both charts into out_dir; returns how many were written (raises NoData)."""
    import os

    rows = read(paths, warn)
    os.makedirs(out_dir, exist_ok=True)
    headline = title or "gfd and its peers on the runtime's call (gfd_benchmark --layout paged)"
    draw_rates(plt, rows, os.path.join(out_dir, "rate_vs_block_size.png"), headline)
    written = 1
    if draw_slowdown(plt, rows, os.path.join(out_dir, "load_slowdown.png"), headline):
        written += 1
    else:
        warn("no row under a load with a slowdown: load_slowdown.png is not drawn")
    return written

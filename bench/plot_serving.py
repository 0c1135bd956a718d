"""The serving loop's chart, drawn from `python -m gfd_bench.serving --csv` (bench/measure.sh's
serving_*.csv): plot_results.py draws it for any CSV of that benchmark (recognised by its `path`
and `tpot_p99_ms` columns).

    serving_tpot_p99.png  the decode loop's TPOT P99 beside each load path, a group of bars per
                          batch size and a bar per path; left panel as a ratio to the loop alone,
                          right panel to the loop beside the contiguous DMA of the same bytes
                          (1.0 = as slow as that reference; the dotted line)

Columns read: batch, path, p99_vs_alone, p99_vs_dma, verified ("NO" drops the row with a
warning; "-": not checked, as for the loop alone). Several CSVs (runs) are merged: each bar is
the median of its rows, with the runs' range as an error bar where there are several.
"""

import statistics
from collections import defaultdict

import plot_paged  # beside this file: the CSV reader the two share

REQUIRED = ["batch", "path", "p99_vs_alone", "p99_vs_dma", "verified"]

# path -> (label, colour), in drawing order; other paths are drawn after these.
PATHS = {
    "dma": ("contiguous DMA", "black"),
    "gfd": ("gfd", "tab:blue"),
    "gfd_worker": ("gfd vLLM worker", "tab:cyan"),
    "batch": ("batch DMA (vLLM's)", "tab:orange"),
    "per_block": ("per-block memcpy", "tab:green"),
    "uva2": ("SM copy kernel, 2 CTAs", "tab:purple"),
    "uva12": ("SM copy kernel, 12 CTAs", "tab:brown"),
}
ALONE = "alone"


NoData = plot_paged.NoData  # nothing to draw from the given CSVs


def is_serving(header):
    """Whether a CSV header is that of gfd_bench.serving."""
    return "path" in header and "tpot_p99_ms" in header


def _number(text):
    try:
        v = float(text)
    except (TypeError, ValueError):
        return None
    return None if v != v else v


def read(paths, warn):
    """The usable rows of every CSV: dicts of batch, path, vs_alone, vs_dma."""
    return plot_paged.read_csvs(
        paths,
        REQUIRED,
        lambda r: r["verified"].strip() == "NO",
        lambda r: {
            "batch": int(r["batch"]),
            "path": r["path"],
            "vs_alone": _number(r["p99_vs_alone"]),
            "vs_dma": _number(r["p99_vs_dma"]),
        },
        warn,
    )


def _bars(ax, rows, field, title, reference):
    """A group of bars per batch size, a bar per path (the reference itself left out)."""
    values = defaultdict(list)
    for r in rows:
        if r[field] is not None and r["path"] not in (ALONE, reference):
            values[(r["batch"], r["path"])].append(r[field])
    batches = sorted({b for b, _ in values})
    present = {p for _, p in values}
    paths = [p for p in PATHS if p in present] + sorted(present - set(PATHS))
    if not batches:
        return False
    width = 0.8 / max(1, len(paths))
    for j, p in enumerate(paths):
        xs, ys, lo, hi = [], [], [], []
        for i, b in enumerate(batches):
            v = values.get((b, p))
            if not v:
                continue
            m = statistics.median(v)
            xs.append(i - 0.4 + width * (j + 0.5))
            ys.append(m)
            lo.append(m - min(v))
            hi.append(max(v) - m)
        label, colour = PATHS.get(p, (p, None))
        ax.bar(
            xs,
            ys,
            width * 0.9,
            label=label,
            color=colour,
            yerr=[lo, hi] if any(lo) or any(hi) else None,
            capsize=2,
        )
    ax.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    ax.set_xticks(range(len(batches)))
    ax.set_xticklabels([str(b) for b in batches])
    ax.set_xlabel("decode batch size")
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="y", alpha=0.4)
    ymin = min(min(v) for v in values.values())
    ax.set_ylim(bottom=min(0.9, ymin * 0.98))
    return True


def plot(plt, paths, out_dir, title, warn):
    """serving_tpot_p99.png into out_dir; returns how many charts were written (raises NoData)."""
    import os

    rows = read(paths, warn)
    os.makedirs(out_dir, exist_ok=True)
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.6), sharey=False)
    drawn = _bars(axes[0], rows, "vs_alone", "TPOT P99 / the loop alone", ALONE)
    drawn = (
        _bars(axes[1], rows, "vs_dma", "TPOT P99 / the loop beside the contiguous DMA", "dma")
        or drawn
    )
    if not drawn:
        plt.close(fig)
        raise NoData("no ratios to draw in " + ", ".join(paths))
    axes[0].set_ylabel("TPOT P99 ratio")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), fontsize=8)
    fig.suptitle(
        title or "the decode loop beside prefix-hit loads (python -m gfd_bench.serving)",
        fontsize=12,
    )
    fig.tight_layout()
    path = os.path.join(out_dir, "serving_tpot_p99.png")
    fig.savefig(path, dpi=120, bbox_inches="tight")
    plt.close(fig)
    print(path)
    return 1

#!/usr/bin/env python3
"""Print the tables of docs/performance.md from the CSVs that bench/measure.sh writes.

    python3 bench/summarize.py DIR|FILE.tgz [CASE ...]

DIR holds the CSVs of one bench/measure.sh call, or is its $OUT (default ./bench-out), whose
measure-<cases>.tgz archives are read together; FILE.tgz is one such archive. CASE names the
tables to print (paged, load, stages, pool, vllm, sglang, latency, onegpu; default: every case
whose CSVs are there).
Each table is Markdown in the layout of docs/performance.md, so that a new run's figures replace
the old ones there as they are. Ratios are to the contiguous pinned DMA of the same bytes in the
same run; where a case ran several times, a cell lists every run ("62.8 / 60.2 / 57.3%") or the
range over the runs ("3.5-3.6%"). Only the standard library is used.
"""

import csv
import glob
import os
import statistics
import sys
import tarfile
import tempfile

CASES = ("paged", "load", "stages", "pool", "vllm", "sglang", "latency", "onegpu")
# gfd and its peers in gfd_benchmark --layout paged's CSVs, and their columns in the tables.
PAGED_METHODS = ["gfd", "batch", "per_block", "gfd_zero_copy", "uva2", "uva12"]
PAGED_HEADERS = ["gfd", "batch (vLLM)", "per block", "gfd zero-copy", "UVA 2 CTAs", "UVA 12 CTAs"]


def read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def runs(directory, pattern):
    """The rows of each file matching pattern, in run order."""
    return [read(p) for p in sorted(glob.glob(os.path.join(directory, pattern)))]


def num(v):
    """v as a float; None where it is missing or NaN (not measured)."""
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if f != f else f


def size_label(n):
    n = int(n)
    for div, suffix in ((1 << 20, " MB"), (1 << 10, " KB")):
        if n >= div and n % div == 0:
            return f"{n // div}{suffix}"
    return f"{n} B"


def pct(values, sep=" / "):
    values = [v for v in values if v is not None]
    return sep.join(f"{100 * v:.1f}" for v in values) + "%" if values else "-"


def signed_pcts(values, sep=" / "):
    """Changes as signed percentages, one per run ("+5.1% / +6.2%")."""
    values = [v for v in values if v is not None]
    return sep.join(f"{100 * v:+.1f}%" for v in values) if values else "-"


def pct_range(values):
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    lo, hi = min(values), max(values)
    return (
        f"{100 * lo:.1f}%"
        if f"{100 * lo:.1f}" == f"{100 * hi:.1f}"
        else f"{100 * lo:.1f}-{100 * hi:.1f}%"
    )


def us_range(values):
    values = [v for v in values if v is not None]
    if not values:
        return "-"

    def fmt(v):
        if v >= 100000:
            return f"{v / 1000:.0f} ms"
        if v >= 10000:
            return f"{v / 1000:.1f} ms"
        return f"{v / 1000:.2f} ms" if v >= 1000 else f"{v:.0f} us"

    lo, hi = min(values), max(values)
    return fmt(lo) if fmt(lo) == fmt(hi) else f"{fmt(lo)} - {fmt(hi)}"


def fine_us_range(values):
    """us_range with a decimal below 100 us (calls of a few microseconds)."""
    values = [v for v in values if v is not None]
    if not values or max(values) >= 100:
        return us_range(values)
    lo, hi = f"{min(values):.1f}", f"{max(values):.1f}"
    return f"{lo} us" if lo == hi else f"{lo} - {hi} us"


def x_range(values):
    """Ratios as "1.04x", or their range over the runs ("1.02-1.08x")."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    lo, hi = f"{min(values):.2f}", f"{max(values):.2f}"
    return f"{lo}x" if lo == hi else f"{lo}-{hi}x"


def gbps(values):
    values = [v for v in values if v is not None]
    return f"{statistics.median(values):.1f}" if values else "-"


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def pick(rows, **match):
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def one(rows, **match):
    hit = pick(rows, **match)
    return hit[0] if hit else None


def col(all_runs, key, **match):
    """key's value in each run's first row matching (None where a run lacks it)."""
    out = []
    for rows in all_runs:
        r = one(rows, **match)
        out.append(num(r.get(key)) if r else None)
    return out


# ---------------------------------------------------------------------------------------------


def paged(d):
    cpp = runs(d, "paged_cpp_*.csv")
    py = runs(d, "paged_py_*.csv")
    parts = []
    if cpp:
        sizes = sorted({int(r["block_size"]) for rows in cpp for r in rows})
        body = []
        for direction in ("h2d", "d2h"):
            for s in sizes:
                m = dict(direction=direction, load="none", block_size=str(s))
                if not any(one(rows, method="gfd", **m) for rows in cpp):
                    continue
                pm = dict(direction=direction, block_bytes=str(s))
                py_ratio = col(py, "ratio", method="gfd", **pm) if py else []
                py_call = col(py, "call_p50_us", method="gfd", **pm) if py else []
                body.append(
                    [
                        size_label(s),
                        direction,
                        pct(col(cpp, "ratio_p50", method="gfd", **m)),
                        gbps(col(cpp, "p50_gbps", method="gfd", **m)),
                        us_range(col(cpp, "submit_p50_us", method="gfd", **m)),
                        pct(py_ratio),
                        us_range(py_call),
                        pct_range(col(cpp, "ratio_p50", method="batch", **m)),
                        pct_range(col(cpp, "ratio_p50", method="uva12", **m)),
                        gbps(col(cpp, "p50_gbps", method="dma_contiguous", **m)),
                    ]
                )
        parts.append(
            table(
                [
                    "block",
                    "dir",
                    "gfd, C++",
                    "gfd GB/s (median)",
                    "call",
                    "gfd, Python",
                    "Python call",
                    "batch DMA (vLLM)",
                    "UVA kernel, 12 CTAs",
                    "contiguous DMA GB/s",
                ],
                body,
            )
        )
    ids = runs(d, "ids_*.csv")
    if ids:
        body = []
        for rows in sorted(ids, key=lambda rs: bool(rs) and rs[0]["direction"] != "h2d"):
            points = sorted(
                {
                    (r["direction"] != "h2d", int(r["blocks"]), r["direction"])
                    for r in rows
                    if r["method"] == "gfd" and r["load"] == "none" and r["block_size"] == "4096"
                }
            )
            for _, blocks, direction in points:
                r = one(
                    rows,
                    method="gfd",
                    direction=direction,
                    load="none",
                    block_size="4096",
                    blocks=str(blocks),
                )
                cells = [r["direction"], r["blocks"]]
                for m in PAGED_METHODS:
                    x = one(
                        rows,
                        method=m,
                        direction=r["direction"],
                        load="none",
                        block_size="4096",
                        blocks=r["blocks"],
                    )
                    cells.append(
                        f"{100 * num(x['ratio_p50']):.1f}% ({us_range([num(x['submit_p50_us'])])})"
                        if x
                        else "-"
                    )
                body.append(cells)
        parts.append(table(["dir", "ids x caches", *PAGED_HEADERS], body))
    return parts


def load(d):
    parts = []
    sweep = runs(d, "load_sweep_*.csv")
    if sweep:
        body = []
        for direction in ("h2d", "d2h"):
            for rows in sweep:
                sizes = sorted({int(r["block_size"]) for r in rows if r["direction"] == direction})
                for s in sizes:
                    m = dict(direction=direction, block_size=str(s))
                    cells = [direction, size_label(s)]
                    for meth in PAGED_METHODS:
                        idle = one(rows, method=meth, load="none", **m)
                        busy = one(rows, method=meth, load="decode", **m)
                        if not idle:
                            cells.append("-")
                            continue
                        cell = f"{100 * num(idle['ratio_p50']):.1f}%"
                        if busy:
                            cell += f" / {100 * num(busy['ratio_p50']):.1f}% {100 * num(busy['load_slowdown']):+.1f}%"
                        cells.append(cell)
                    dma = one(rows, method="dma_contiguous", load="decode", **m)
                    cells.append(
                        f"{100 * num(dma['load_slowdown']):+.1f}%"
                        if dma and num(dma["load_slowdown"]) is not None
                        else "-"
                    )
                    body.append(cells)
        parts.append(table(["dir", "block", *PAGED_HEADERS, "contiguous DMA's slowdown"], body))
    if sweep:
        parts.append(speed(sweep))
    py = runs(d, "load_py_*.csv")
    if py:
        body = []
        for rows in py:
            for r in rows:
                if r["method"] != "gfd" or r.get("load") != "decode":
                    continue
                body.append(
                    [
                        size_label(r["block_bytes"]),
                        r["direction"],
                        f"{100 * num(r['ratio']):.1f}%",
                        f"{100 * num(r['rate_kept']):.1f}%",
                    ]
                )
        parts.append(table(["block", "dir", "gfd, Python, idle", "rate kept under the load"], body))
    return parts


def stages(d):
    """gfd's stages alone beside the matmuls (stages_<run>.csv): the matmuls' slowdown beside gfd
    whole, its gather threads alone, its placing (packing) kernel alone and the contiguous DMA,
    each as the runs' values; and each method's rate kept under the load. Then the call-size table
    (calls)."""
    sweep = runs(d, "stages_*.csv")
    if not sweep:
        return calls(d)
    methods = ["gfd", "gather_only", "place_only", "dma_contiguous"]
    body = []
    for direction in ("h2d", "d2h"):
        sizes = sorted(
            {int(r["block_size"]) for rows in sweep for r in rows if r["direction"] == direction}
        )
        for s in sizes:
            m = dict(direction=direction, block_size=str(s), load="decode")
            cells = [direction, size_label(s)]
            for meth in methods:
                cells.append(signed_pcts(col(sweep, "load_slowdown", method=meth, **m)))
            for meth in methods[:3]:
                cells.append(pct(col(sweep, "rate_kept", method=meth, **m)))
            body.append(cells)
    header = ["dir", "block"]
    header += [f"slowdown: {m.replace('_', ' ')}" for m in methods]
    header += [f"kept: {m.replace('_', ' ')}" for m in methods[:3]]
    return [table(header, body)] + calls(d)


def calls(d):
    """gfd beside the matmuls as the call's size and its blocks' size vary (calls_<run>.csv): per
    block size and ids a call, the bytes a call, the matmuls' slowdown beside gfd and beside the
    contiguous DMA, and gfd's rate under the load, each as the runs' values."""
    sweep = runs(d, "calls_*.csv")
    if not sweep:
        return []
    body = []
    for direction in ("h2d", "d2h"):
        points = sorted(
            {
                (int(r["block_size"]), int(r["blocks"]))
                for rows in sweep
                for r in rows
                if r["direction"] == direction and r["load"] == "decode"
            }
        )
        for size, ids in points:
            m = dict(direction=direction, block_size=str(size), blocks=str(ids), load="decode")
            first = next(r for rows in sweep for r in pick(rows, **m))  # every method's bytes alike
            cells = [
                direction,
                size_label(size),
                str(ids),
                size_label(int(first["transfer_bytes"])),
            ]
            for meth in ("gfd", "dma_contiguous"):
                cells.append(signed_pcts(col(sweep, "load_slowdown", method=meth, **m)))
            cells.append(pct(col(sweep, "ratio_p50", method="gfd", **m)))
            body.append(cells)
    header = ["dir", "block", "ids", "bytes a call", "slowdown: gfd", "slowdown: dma contiguous"]
    return [table(header + ["gfd under the load"], body)]


def speed(sweep):
    """The README's speed table from the load sweeps: GB/s (P50) and % of the contiguous DMA for
    gfd and its peers, and the matmuls' slowdown beside gfd, the 12-CTA kernel and the DMA alone."""
    body = []
    for direction, label in (("h2d", "to GPU"), ("d2h", "to host")):
        for rows in sweep:
            for s in (4096, 16384, 32768, 65536, 2 << 20):
                m = dict(direction=direction, block_size=str(s))
                if not one(rows, method="gfd", load="none", **m):
                    continue
                cells = [size_label(s), label]
                for meth in ("gfd", "batch", "uva12", "per_block"):
                    r = one(rows, method=meth, load="none", **m)
                    cells.append(
                        f"{num(r['p50_gbps']):.1f} GB/s ({100 * num(r['ratio_p50']):.0f}%)"
                        if r
                        else "-"
                    )
                slow = []
                for meth in ("gfd", "uva12", "dma_contiguous"):
                    r = one(rows, method=meth, load="decode", **m)
                    slow.append(
                        f"{100 * num(r['load_slowdown']):+.1f}%"
                        if r and num(r["load_slowdown"]) is not None
                        else "-"
                    )
                cells.append(" / ".join(slow))
                body.append(cells)
    return table(
        [
            "block",
            "direction",
            "gfd",
            "batch DMA (vLLM's)",
            "SM copy kernel (12 CTAs)",
            "per-block memcpy",
            "matmul slowdown: gfd / SM kernel / DMA alone",
        ],
        body,
    )


def pool(d):
    parts = []
    quick = runs(d, "pool_[0-9]*.csv")
    if quick:
        body = []
        for b in ("gather", "zero_copy_kernel", "batch_async", "per_block"):
            m = dict(backend=b, blocks="2048", block_size="4096", load="none")
            ratios = col(quick, "ratio_p50", **m)
            if any(v is not None for v in ratios):
                body.append([b, pct(ratios), gbps(col(quick, "p50_gbps", **m))])
        ref = col(
            quick, "ref_gbps", backend="gather", blocks="2048", block_size="4096", load="none"
        )
        body.append(["contiguous DMA", "100%", gbps(ref)])
        parts.append(table(["backend", "2048 x 4 KB, one pool, h2d", "GB/s (median)"], body))
    strided_h = runs(d, "strided_h2d_*.csv")
    strided_d = runs(d, "strided_d2h_*.csv")
    random_h = runs(d, "random_h2d_*.csv")
    if strided_h or strided_d or random_h:
        counts = sorted(
            {int(r["blocks"]) for rows in strided_h + strided_d + random_h for r in rows}
        )
        body = []
        for n in counts:
            m = dict(blocks=str(n), block_size="4096", load="none")
            body.append(
                [
                    str(n),
                    pct_range(col(strided_h, "ratio_p50", backend="gather", **m)),
                    pct_range(col(strided_d, "ratio_p50", backend="gather", **m)),
                    pct_range(col(random_h, "ratio_p50", backend="gather", **m)),
                    pct_range(col(strided_h, "ratio_p50", backend="batch_async", **m))
                    + " / "
                    + pct_range(col(strided_d, "ratio_p50", backend="batch_async", **m)),
                    pct_range(col(strided_h, "ratio_p50", backend="zero_copy_kernel", **m))
                    + " / "
                    + pct_range(col(strided_d, "ratio_p50", backend="zero_copy_kernel", **m)),
                ]
            )
        parts.append(
            table(
                [
                    "4 KB blocks at a pitch of 2",
                    "gather h2d",
                    "gather d2h",
                    "gather, random blocks h2d",
                    "batch_async h2d / d2h",
                    "zero_copy_kernel h2d / d2h",
                ],
                body,
            )
        )
    return parts


def vllm(d):
    rs = runs(d, "vllm_[0-9]*.csv")
    busy = runs(d, "vllm_busy_*.csv")
    if not rs:
        return []
    body = []
    pages = sorted({int(r["page"]) for rows in rs for r in rows}, reverse=True)
    layouts = [
        x for x in ("block", "region") if any(r["host_layout"] == x for rows in rs for r in rows)
    ]
    for direction, job in (("h2d", "load"), ("d2h", "store")):
        for layout in layouts:
            for p in pages:
                m = dict(direction=direction, page=str(p), host_layout=layout)
                g = col(rs, "ratio_p50", method="gfd", **m)
                if not any(v is not None for v in g):
                    continue
                body.append(
                    [
                        size_label(p).replace("KB", "KiB"),
                        job,
                        layout,
                        pct(g),
                        gbps(col(rs, "gbps_p50", method="gfd", **m)),
                        us_range(col(rs, "submit_us_p50", method="gfd", **m)),
                        pct(col(rs, "ratio_p50", method="vllm_batch", **m)),
                        us_range(col(rs, "submit_us_p50", method="vllm_batch", **m)),
                    ]
                )
    out = [
        table(
            [
                "page",
                "job",
                "host layout",
                "gfd",
                "gfd GB/s (median)",
                "submit",
                "vLLM's batch path (same runs)",
                "its submit",
            ],
            body,
        )
    ]
    if busy:
        rows = []
        for direction, job in (("h2d", "load"), ("d2h", "store")):
            m = dict(direction=direction, host_layout="region")
            # Submit times only: the rates of such a run time the GIL's hand-overs between the
            # timing events as much as the copy (the contiguous DMA's own rate drops as much).
            rows.append(
                [
                    job,
                    us_range(col(busy, "submit_us_p50", method="gfd", **m)),
                    us_range(col(busy, "submit_us_p50", method="vllm_batch", **m)),
                ]
            )
        out.append(table(["job (another Python thread busy)", "gfd submit", "vLLM's submit"], rows))
    return out


def sglang(d):
    rs = runs(d, "sglang_[0-9]*.csv")
    loaded = runs(d, "sglang_load_*.csv")
    if not rs:
        return []
    body = []
    for model in ("llama3-8b", "mla"):
        for layout in ("layer_first", "page_first_direct"):
            for direction in ("load", "write_back"):
                for method in ("gfd", "direct", "kernel"):
                    m = dict(model=model, layout=layout, direction=direction, method=method)
                    g = col(rs, "ratio_p50", **m)
                    if not any(v is not None for v in g):
                        continue
                    slow = (
                        [v for v in col(loaded, "matmul_slowdown", **m) if v is not None]
                        if loaded
                        else []
                    )
                    body.append(
                        [
                            model,
                            layout,
                            direction.replace("_", "-"),
                            method,
                            pct(g),
                            gbps(col(rs, "gbps_p50", **m)),
                            us_range(col(rs, "layer0_us_p50", **m)),
                            us_range(col(rs, "layer0_link_us_p50", **m)),
                            us_range(col(rs, "layer0_enqueued_us_p50", **m)),
                            us_range(col(rs, "call_us_p50", **m)),
                            f"{100 * statistics.median(slow):+.1f}%" if slow else "-",
                        ]
                    )
    return [
        table(
            [
                "model",
                "host layout",
                "batch",
                "method",
                "ratio to the line rate",
                "GB/s (median)",
                "layer 0 usable after",
                "layer 0's copies alone",
                "layer 0 enqueued after",
                "scheduler thread",
                "matmul slowdown",
            ],
            body,
        )
    ]


def latency(d):
    rs = runs(d, "latency_*.csv")
    if not rs:
        return []
    body = []
    for b in ("gather", "zero_copy_kernel", "batch_async", "per_block"):
        cells = [b]
        for n in ("16", "64", "256"):
            m = dict(backend=b, blocks=n, block_size="4096", load="none")
            p50 = [v for v in col(rs, "p50_us", **m) if v is not None]
            ratio = [v for v in col(rs, "ratio_p50", **m) if v]
            if not p50:
                cells.append("-")
                continue
            # ratio_p50 is the rate over the contiguous DMA of the same bytes: 1 / ratio is the time
            # over that DMA's time.
            cell = f"{statistics.median(p50):.1f} us"
            if ratio:
                cell += f" ({1 / statistics.median(ratio):.1f}x one DMA)"
            cells.append(cell)
        if any(c != "-" for c in cells[1:]):
            body.append(cells)
    return [table(["backend", "16 x 4 KB", "64 x 4 KB", "256 x 4 KB"], body)]


def onegpu(d):
    """gfd_multi_gpu_benchmark --one-gpu: per backend, the call's P50 at each engine count, the
    caller's CPU time per transfer with one engine and with the most, and the most engines'
    figures over one engine's."""
    rs = runs(d, "onegpu_*.csv")
    if not rs:
        return []
    counts = sorted({int(r["engines"]) for rows in rs for r in rows})
    most = str(counts[-1])
    body = []
    for b in ("gather", "batch_async", "per_block", "zero_copy_kernel", "contiguous"):
        if not any(pick(rows, backend=b) for rows in rs):
            continue
        cells = ["contiguous DMA" if b == "contiguous" else b]
        cells += [fine_us_range(col(rs, "call_p50_us", backend=b, engines=str(n))) for n in counts]
        cells.append(
            fine_us_range(col(rs, "cpu_p50_us", backend=b, engines="1"))
            + " / "
            + fine_us_range(col(rs, "cpu_p50_us", backend=b, engines=most))
        )
        cells += [
            x_range(col(rs, k, backend=b, engines=most))
            for k in ("call_ratio", "cpu_ratio", "e2e_ratio")
        ]
        body.append(cells)
    header = (
        ["backend"]
        + [f"call, {n} engine{'s' if n > 1 else ''}" for n in counts]
        + [
            f"caller's CPU per transfer, 1 / {most}",
            f"{most} over 1: call",
            "caller's CPU",
            "end to end",
        ]
    )
    return [table(header, body)]


def host_speed(d, slow_us=7.5, max_bytes=256 << 20):
    """How fast this machine's host makes driver calls: the median time the one contiguous
    cudaMemcpyAsync (idle rows of at most 256 MiB, measured on a GPU) took to submit. It is 2-6 us
    on a usual H200 host; on hosts near 10 us gfd's staged rates read a third lower, so such a
    run's figures should not replace others'."""
    subs = []
    for p in glob.glob(os.path.join(d, "*.csv")):
        for r in read(p):
            if (
                r.get("method") != "dma_contiguous"
                or r.get("load") != "none"
                or r.get("mode", "gpu") != "gpu"
            ):
                continue
            if (
                int(num(r.get("transfer_bytes")) or 0) > max_bytes
                or num(r.get("submit_p50_us")) is None
            ):
                continue
            subs.append(num(r["submit_p50_us"]))
    if not subs:
        return ""
    m = statistics.median(subs)
    verdict = (
        f"SLOW (over {slow_us} us): gfd's staged rates read low on such a host; measure again on another"
        if m > slow_us
        else "as usual (2-6 us)"
    )
    return f"host: the contiguous DMA's submit took {m:.1f} us (median of {len(subs)} idle rows): {verdict}"


def main(argv):
    if len(argv) < 2 or argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(argv) >= 2 else 2
    d = argv[1]
    archives = [d] if os.path.isfile(d) else []
    if os.path.isdir(d) and not glob.glob(os.path.join(d, "*.csv")):  # an $OUT of measure.sh
        archives = sorted(glob.glob(os.path.join(d, "measure-*.tgz")))
    if archives:  # measure-<cases>.tgz: their CSVs, one folder
        d = tempfile.mkdtemp(prefix="gfd-summarize.")
        for a in archives:
            with tarfile.open(a) as tar:
                tar.extractall(d, members=[m for m in tar.getmembers() if m.name.endswith(".csv")])
    wanted = argv[2:] or list(CASES)
    bad = [c for c in wanted if c not in CASES]
    if bad:
        print(
            f"summarize.py: unknown case(s) {', '.join(bad)}; cases: {', '.join(CASES)}",
            file=sys.stderr,
        )
        return 2
    host_only = any(
        r.get("mode") == "host-only" for p in glob.glob(os.path.join(d, "*.csv")) for r in read(p)
    )
    if host_only:
        print(
            "host-only: no GPU was used (the emulated device stood in for it); these figures say nothing "
            "about PCIe or the GPU\n"
        )
    host = host_speed(d)
    if host:
        print(host + "\n")
    printed = 0
    for case in wanted:
        for t in globals()[case](d):
            print(f"### {case}\n\n{t}\n")
            printed += 1
    if not printed:
        print(f"summarize.py: no CSVs of {', '.join(wanted)} in {d}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""bench/plot_results.py draws the two charts of docs/performance.md from the CSVs that
bench/measure.sh's load sweeps write (gfd_benchmark --layout paged --under-load=decode)."""

import csv
import os
import subprocess
import sys

import pytest
from conftest import ROOT

pytest.importorskip("matplotlib", reason="matplotlib is not installed (pip install matplotlib)")

SCRIPT = os.path.join(ROOT, "bench", "plot_results.py")
# The header gfd_benchmark --layout paged writes (bench/src/paged_report.cpp).
HEADER = (
    "mode,layout,sources,direction,load,layers,caches,blocks,block_size,transfer_bytes,method,"
    "reps,p50_us,p90_us,p50_gbps,p90_gbps,ref_gbps,ratio_p50,ratio_p90,submit_p50_us,rate_kept,"
    "load_slowdown,verified,host_blocks,gpu_blocks"
).split(",")
METHODS = ["dma_contiguous", "gfd", "batch", "per_block", "gfd_zero_copy", "uva2", "uva12"]
PNG = b"\x89PNG\r\n\x1a\n"


def sweep_csv(path, loads=("none", "decode"), failed=()):
    """A small synthetic sweep: 2 directions x 3 block sizes x every method x `loads`; the
    (method, size) pairs in `failed` are written as failing verification."""
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, HEADER)
        w.writeheader()
        for direction in ("h2d", "d2h"):
            for load in loads:
                for k, size in enumerate((4096, 32768, 2 << 20)):
                    for j, method in enumerate(METHODS):
                        gbps = 50.0 if method == "dma_contiguous" else 5.0 + 6 * j + 3 * k
                        row = dict.fromkeys(HEADER, "")
                        row.update(
                            mode="host-only",
                            layout="paged",
                            sources="cold",
                            direction=direction,
                            load=load,
                            layers=32,
                            caches=64,
                            blocks=64,
                            block_size=size,
                            transfer_bytes=64 * 64 * size,
                            method=method,
                            reps=20,
                            p50_gbps=gbps,
                            ref_gbps=50.0,
                            ratio_p50=gbps / 50.0,
                            verified=""
                            if method == "dma_contiguous"
                            else "0"
                            if (method, size) in failed
                            else "1",
                        )
                        if load != "none":
                            row["load_slowdown"] = (
                                0.01 * j - 0.005 + (20.0 if method == "gfd_zero_copy" else 0)
                            )
                        w.writerow(row)
    return path


def plot(tmp_path, *csvs):
    out = tmp_path / "charts"
    r = subprocess.run(
        [sys.executable, SCRIPT, *map(str, csvs), "--out", str(out)],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    return r, out


def is_png(path):
    return path.is_file() and path.read_bytes()[:8] == PNG and path.stat().st_size > 10000


def test_both_charts_from_the_load_sweeps(tmp_path):
    h2d = sweep_csv(tmp_path / "load_sweep_h2d_1.csv")
    d2h = sweep_csv(tmp_path / "load_sweep_d2h_1.csv")
    r, out = plot(tmp_path, h2d, d2h)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(os.listdir(out)) == ["load_slowdown.png", "rate_vs_block_size.png"]
    assert is_png(out / "rate_vs_block_size.png") and is_png(out / "load_slowdown.png")
    # Each written chart is named on stdout.
    assert (
        str(out / "rate_vs_block_size.png") in r.stdout
        and str(out / "load_slowdown.png") in r.stdout
    )
    assert "appear more than once" not in r.stderr  # the two files' rows are merged quietly


def test_idle_rows_alone_give_the_rate_chart_and_say_why_not_the_other(tmp_path):
    r, out = plot(tmp_path, sweep_csv(tmp_path / "idle.csv", loads=("none",)))
    assert r.returncode == 0, r.stdout + r.stderr
    assert os.listdir(out) == ["rate_vs_block_size.png"]
    assert "load_slowdown.png is not drawn" in r.stderr


def test_rows_that_failed_verification_are_left_out_with_a_warning(tmp_path):
    r, out = plot(tmp_path, sweep_csv(tmp_path / "run.csv", failed={("gfd", 4096)}))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "run.csv: 4 row(s) failed verification and are not drawn" in r.stderr
    assert is_png(out / "rate_vs_block_size.png")


def test_a_csv_without_the_columns_is_refused_naming_them(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("method,load_slowdown,direction\ngfd,0.1,h2d\n")
    r, out = plot(tmp_path, bad)
    assert (
        r.returncode == 1 and "missing column(s) load, block_size, p50_gbps, verified" in r.stderr
    ), r.stderr
    assert not out.exists() or not os.listdir(out)


# python -m gfd_bench.serving's CSV (bench/measure.sh's serving_*.csv): the TPOT P99 chart.
SERVING_HEADER = (
    "batch,path,device,layers,context,output_len,sched_us,load_every,load_pages,load_bytes,steps,loads,"
    "tpot_p50_ms,tpot_p99_ms,tpot_mean_ms,p50_vs_alone,p99_vs_alone,p50_vs_dma,p99_vs_dma,gpu_step_p50_ms,"
    "gpu_step_p99_ms,load_p50_us,load_p99_us,load_gbps,call_p50_us,call_p99_us,backlog,verified"
).split(",")


def serving_csv(path, spread=0.0, failed=()):
    """Every path at batch sizes 1, 16 and 64; (batch, path) pairs in `failed` fail verification."""
    paths = ["alone", "dma", "gfd", "gfd_worker", "batch", "per_block", "uva2", "uva12"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, SERVING_HEADER)
        w.writeheader()
        for batch in (1, 16, 64):
            for j, p in enumerate(paths):
                slow = 1.0 + 0.02 * j + spread
                row = dict.fromkeys(SERVING_HEADER, "")
                row.update(
                    batch=batch,
                    path=p,
                    tpot_p50_ms=2.0 * slow,
                    tpot_p99_ms=2.4 * slow,
                    p50_vs_alone=slow,
                    p99_vs_alone=slow,
                    p50_vs_dma=slow / 1.02 + spread,
                    p99_vs_dma=slow / 1.02 + spread,
                    verified="-" if p == "alone" else "NO" if (batch, p) in failed else "yes",
                )
                w.writerow(row)
    return path


def test_the_serving_chart_from_runs_of_the_serving_loop(tmp_path):
    r, out = plot(
        tmp_path,
        serving_csv(tmp_path / "serving_1.csv"),
        serving_csv(tmp_path / "serving_2.csv", spread=0.01, failed={(64, "uva2")}),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert os.listdir(out) == ["serving_tpot_p99.png"] and is_png(out / "serving_tpot_p99.png")
    assert str(out / "serving_tpot_p99.png") in r.stdout
    assert "serving_2.csv: 1 row(s) failed verification and are not drawn" in r.stderr


def test_serving_and_paged_csvs_in_one_call_each_give_their_charts(tmp_path):
    r, out = plot(
        tmp_path,
        serving_csv(tmp_path / "serving_1.csv"),
        sweep_csv(tmp_path / "load_sweep_h2d_1.csv"),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(os.listdir(out)) == [
        "load_slowdown.png",
        "rate_vs_block_size.png",
        "serving_tpot_p99.png",
    ]

"""python -m gfd_bench (bench/python, not part of the installed package) runs end to end on the
emulated device (the GPU run is in test_gpu.py)."""

import os
import subprocess
import sys

import gfd
import pytest
from conftest import BENCH_PATH, ROOT, bench_env


@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_bench_on_the_emulated_device(direction):
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "gfd_bench",
            "--emulated",
            "--blocks",
            "256",
            "--iters",
            "20",
            "--warmup",
            "1",
            "--backends",
            "gather,per_block",
            "--pool-bytes",
            str(64 << 20),
            "--direction",
            direction,
            "--dst",
            "scattered",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=bench_env(),
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "contiguous copy" in r.stdout and "host-only" in r.stdout
    lines = [line for line in r.stdout.splitlines() if line.startswith("gfd ")]
    assert len(lines) == 2 and all(line.rstrip().endswith("yes") for line in lines), r.stdout


# --layout paged: copy_blocks over every layer's K and V caches (gfd_bench/paged.py). On a GPU it
# needs torch (test_gpu.py runs it there); here it runs on the emulated device with gfd buffers.


def paged(args, tmp_path=None, timeout=300):
    return subprocess.run(
        [sys.executable, "-m", "gfd_bench", "--layout", "paged"] + args,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=bench_env(),
    )


def test_paged_bench_on_the_emulated_device(tmp_path):
    out = tmp_path / "paged.csv"
    r = paged(
        [
            "--emulated",
            "--layers",
            "2",
            "--block-sizes",
            "4K,16K",
            "--blocks",
            "8,16",
            "--iters",
            "20",
            "--warmup",
            "1",
            "--host-cache-bytes",
            "8M",
            "--gpu-cache-bytes",
            "4M",
            "--direction",
            "both",
            "--under-load",
            "--csv",
            str(out),
        ]
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "host-only" in r.stdout
    assert "--under-load needs torch and a CUDA GPU" in r.stdout  # no load on the emulated device
    import csv

    rows = list(csv.DictReader(open(out)))
    # 2 block sizes x 2 block counts x 2 directions, each with the contiguous copy and the methods
    configs = {(x["block_bytes"], x["blocks"], x["direction"]) for x in rows}
    assert len(configs) == 8, rows
    for c in configs:
        methods = {
            x["method"] for x in rows if (x["block_bytes"], x["blocks"], x["direction"]) == c
        }
        assert {"contiguous copy", "gfd", "batch_async", "per_block"} <= methods, (c, methods)
    for x in rows:
        assert x["verified"] in ("yes", "-"), x
        assert x["layers"] == "2" and x["caches"] == "4"
        assert int(x["bytes"]) == 4 * int(x["blocks"]) * int(x["block_bytes"])
        assert float(x["p50_gbps"]) > 0 and float(x["ratio"]) > 0
    # zero_copy_kernel: measured and verified, or skipped with the reason printed
    for d in ("h2d", "d2h"):
        zc = [x for x in rows if x["method"] == "zero_copy_kernel" and x["direction"] == d]
        assert zc or f"skipped: zero_copy_kernel {d}" in r.stdout, r.stdout
    table = [
        line
        for line in r.stdout.splitlines()
        if " gfd " in f" {line} " and ("h2d" in line or "d2h" in line)
    ]
    assert table and all(line.rstrip().endswith("yes") for line in table), r.stdout


def test_paged_bench_help_and_bad_arguments():
    r = paged(["--help"])
    assert r.returncode == 0 and "--under-load" in r.stdout and "--block-sizes" in r.stdout, (
        r.stdout + r.stderr
    )
    r = paged(["--emulated", "--block-sizes", "4Q"])
    assert r.returncode == 2 and "--block-sizes" in r.stderr, r.stderr
    r = paged(["--emulated", "--layers", "2", "--blocks", "100000", "--host-cache-bytes", "8M"])
    assert (
        r.returncode == 2 and "--host-cache-bytes" in r.stderr and "fewer than --blocks" in r.stderr
    ), r.stderr
    r = paged(["--emulated", "--methods", "gather_everything"])
    assert r.returncode == 2 and "--methods" in r.stderr, r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "gfd_bench", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=bench_env(),
    )
    assert r.returncode == 0 and "--layout" in r.stdout


def test_paged_bench_sizes(monkeypatch):
    monkeypatch.syspath_prepend(BENCH_PATH)
    from gfd_bench import paged

    assert [paged.parse_size(s) for s in ("4096", "4K", "16KiB", "32kb", "4G", "1.5M")] == [
        4096,
        4096,
        16384,
        32768,
        4 << 30,
        3 << 19,
    ]
    assert paged.size_list("4K,16K,32K") == [4096, 16384, 32768]


def test_paged_bench_without_torch_on_a_gpu():
    """On a GPU machine without torch the paged layout stops with a clear message (status 2)."""
    if gfd.cuda_device_count() == 0:
        pytest.skip(
            "no CUDA GPU here: the paged bench runs on the emulated device instead (tested above)"
        )
    try:
        import torch  # noqa: F401

        pytest.skip("torch is installed: the GPU run is in test_gpu.py")
    except ImportError:
        pass
    r = paged(["--layers", "1", "--blocks", "4", "--iters", "20"])
    assert r.returncode == 2 and "torch is not installed" in r.stderr, r.stdout + r.stderr


def summarize(d, *cases):
    """bench/summarize.py over the CSVs in ``d`` (the tables of ``cases``, default all)."""
    script = os.path.join(ROOT, "bench", "summarize.py")
    return subprocess.run(
        [sys.executable, script, str(d), *cases], capture_output=True, text=True, timeout=60
    )


def test_summarize_reads_the_hosts_driver_call_speed(tmp_path):
    # bench/summarize.py's host line: the median idle submit of the contiguous DMA's rows, "SLOW"
    # past 7.5 us; other methods, loaded rows, copies over 256 MiB and host-only rows are not read.
    head = "mode,method,load,transfer_bytes,submit_p50_us\n"

    def host_line(name, body):
        d = tmp_path / name
        d.mkdir()
        (d / "run.csv").write_text(head + body)
        return summarize(d).stdout

    out = host_line(
        "usual",
        "gpu,dma_contiguous,none,4096,2.5\ngpu,dma_contiguous,none,4096,3.5\n"
        "gpu,gfd,none,4096,90\ngpu,dma_contiguous,decode,4096,40\n"
        "gpu,dma_contiguous,none,1073741824,50\n",
    )
    assert "3.0 us (median of 2 idle rows" in out and "as usual" in out, out
    out = host_line(
        "slow",
        "gpu,dma_contiguous,none,4096,9.5\ngpu,dma_contiguous,none,4096,10.5\n"
        "gpu,dma_contiguous,none,4096,11\n",
    )
    assert "10.5 us (median of 3 idle rows" in out and "SLOW" in out, out
    out = host_line("host_only", "host-only,dma_contiguous,none,4096,40\n")
    assert "host-only: no GPU was used" in out and "median of" not in out, out


def test_summarize_sglang_table_gives_layer_0_on_the_link_where_measured(tmp_path):
    # gfd_bench.sglang writes NaN where a figure is not measured (a write-back's layer 0 on the
    # link): the table says "-" there, and the runs' range where they measured it.
    head = (
        "model,layout,direction,method,ratio_p50,gbps_p50,layer0_us_p50,layer0_link_us_p50,"
        "layer0_enqueued_us_p50,call_us_p50,matmul_slowdown\n"
    )
    for run, link in ((1, "301.5"), (2, "309.2")):
        (tmp_path / f"sglang_{run}.csv").write_text(
            head + f"llama3-8b,layer_first,load,gfd,0.97,53.1,405,{link},148,2270,nan\n"
            "llama3-8b,layer_first,write_back,gfd,0.92,50.6,10800,nan,1890,1950,nan\n"
        )
    r = summarize(tmp_path, "sglang")
    assert r.returncode == 0, r.stderr
    rows = {
        line.split("|")[3].strip(): [c.strip() for c in line.split("|")[1:-1]]
        for line in r.stdout.splitlines()
        if line.startswith("| llama3-8b")
    }
    header = next(line for line in r.stdout.splitlines() if "layer 0's copies alone" in line)
    at = [c.strip() for c in header.split("|")[1:-1]].index("layer 0's copies alone")
    assert rows["load"][at] == "302 us - 309 us", r.stdout
    assert rows["write-back"][at] == "-", r.stdout


def test_summarize_onegpu_table_gives_each_engine_counts_call_and_the_ratios(tmp_path):
    # gfd_multi_gpu_benchmark --one-gpu CSVs (onegpu_<run>.csv): a column per engine count, the
    # caller's CPU time with one engine and with the most, the most engines' ratios as ranges.
    head = (
        "mode,sources,engines,backend,blocks,block_size,call_p50_us,call_p90_us,call_ratio,cpu_p50_us,"
        "cpu_p90_us,cpu_ratio,e2e_p50_us,e2e_p90_us,e2e_ratio,p50_gbps,ref_gbps,threads,caller_cpus,"
        "gather_cpus,verified\n"
    )
    for run, call8 in ((1, "11.0"), (2, "12.0")):
        (tmp_path / f"onegpu_{run}.csv").write_text(
            head + "gpu,cold,1,contiguous,2048,4096,2.0,2.5,1,2.1,2.6,1,160,170,1,52,52,0,0,,\n"
            "gpu,cold,1,gather,2048,4096,10.0,12,1,9.0,11,1,250,300,1,33,52,15,0,1-15,1\n"
            f"gpu,cold,8,gather,2048,4096,{call8},14,{float(call8) / 10},9.5,12,1.05,1900,2000,7.6,35,52,"
            "1,0 2 4 6 8 10 12 14,1|3|5|7|9|11|13|15,1\n"
        )
    r = summarize(tmp_path, "onegpu")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    header = [
        c.strip() for c in next(line for line in lines if "call, 1 engine" in line).split("|")[1:-1]
    ]
    assert header == [
        "backend",
        "call, 1 engine",
        "call, 8 engines",
        "caller's CPU per transfer, 1 / 8",
        "8 over 1: call",
        "caller's CPU",
        "end to end",
    ], header
    rows = {
        c[0]: c
        for c in (
            [x.strip() for x in line.split("|")[1:-1]] for line in lines if line.startswith("| ")
        )
    }
    assert rows["gather"][1:] == [
        "10.0 us",
        "11.0 - 12.0 us",
        "9.0 us / 9.5 us",
        "1.10-1.20x",
        "1.05x",
        "7.60x",
    ]
    assert rows["contiguous DMA"][1:3] == ["2.0 us", "-"], rows


@pytest.mark.parametrize("module", ["gfd_bench.vllm", "gfd_bench.sglang"])
def test_runtime_benches_say_what_is_missing(module):
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has torch with a GPU: the benchmark would run")
    except ImportError:
        pass
    r = subprocess.run(
        [sys.executable, "-m", module], capture_output=True, text=True, timeout=120, env=bench_env()
    )
    assert r.returncode == 2, r.stdout + r.stderr
    assert "needs" in r.stderr and ("torch" in r.stderr or "sees none" in r.stderr), r.stderr
    h = subprocess.run(
        [sys.executable, "-m", module, "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        env=bench_env(),
    )
    assert h.returncode == 0 and "usage: python -m " + module in h.stdout, h.stdout + h.stderr


def summarized_rows(tmp_path, name, head, runs, header_start):
    """Writes each run's CSV rows as <name>_<run>.csv under ``head``, runs summarize.py's stages
    case, and returns the rows (dicts by column name) of the table whose header starts with
    ``header_start``."""
    for run, body in enumerate(runs, 1):
        (tmp_path / f"{name}_{run}.csv").write_text(head + body)
    r = summarize(tmp_path, "stages")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    names = [c.strip() for c in lines[at].split("|")[1:-1]]
    rows = []
    for line in lines[at + 2 :]:
        if not line.startswith("| "):
            break
        rows.append(dict(zip(names, [c.strip() for c in line.split("|")[1:-1]])))
    return rows, r.stdout


def test_summarize_stages_table_gives_each_stages_slowdown_per_run(tmp_path):
    # gfd_benchmark --methods gfd,gather_only,place_only under the decode load (stages_<run>.csv):
    # one row per direction and block size, each stage's slowdown as every run's value, the DMA's
    # too, and each gfd method's rate kept; idle rows are not read.
    runs = [
        "gpu,h2d,none,32768,gfd,,\n"
        "gpu,h2d,decode,32768,dma_contiguous,0.02,\n"
        "gpu,h2d,decode,32768,gfd,0.11,0.8\n"
        "gpu,h2d,decode,32768,gather_only,0.01,0.97\n"
        f"gpu,h2d,decode,32768,place_only,{place},0.9\n"
        for place in ("0.051", "0.062")
    ]
    head = "mode,direction,load,block_size,method,load_slowdown,rate_kept\n"
    (cells,), out = summarized_rows(tmp_path, "stages", head, runs, "| dir | block | slowdown")
    assert cells["block"] == "32 KB", out
    assert cells["slowdown: place only"] == "+5.1% / +6.2%", out
    assert cells["slowdown: gfd"] == "+11.0% / +11.0%", out
    assert cells["slowdown: dma contiguous"] == "+2.0% / +2.0%", out
    assert cells["kept: gather only"] == "97.0 / 97.0%", out


def test_summarize_calls_table_gives_each_call_size_per_run(tmp_path):
    # gfd_benchmark --blocks 8,64,512 --methods gfd under the decode load (calls_<run>.csv): one row
    # per direction, block size and ids a call, with the bytes a call, gfd's and the DMA's slowdown
    # and gfd's rate under the load as every run's value; idle rows are not read.
    runs = [
        "gpu,h2d,none,8,32768,16777216,gfd,,0.66\n"
        "gpu,h2d,decode,8,32768,16777216,dma_contiguous,0.03,1\n"
        f"gpu,h2d,decode,8,32768,16777216,gfd,{slow},0.47\n"
        "gpu,h2d,decode,64,32768,134217728,dma_contiguous,0.01,1\n"
        "gpu,h2d,decode,64,32768,134217728,gfd,0.02,0.55\n"
        for slow in ("0.175", "0.203")
    ]
    head = "mode,direction,load,blocks,block_size,transfer_bytes,method,load_slowdown,ratio_p50\n"
    rows, out = summarized_rows(tmp_path, "calls", head, runs, "| dir | block | ids")
    assert len(rows) == 2, out
    assert rows[0]["ids"] == "8" and rows[0]["bytes a call"] == "16 MB", out
    assert rows[0]["slowdown: gfd"] == "+17.5% / +20.3%", out
    assert rows[0]["slowdown: dma contiguous"] == "+3.0% / +3.0%", out
    assert rows[0]["gfd under the load"] == "47.0 / 47.0%", out
    assert rows[1]["ids"] == "64" and rows[1]["bytes a call"] == "128 MB", out

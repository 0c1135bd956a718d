"""python -m gfd_bench.serving (bench/python/gfd_bench/serving*.py): the decode loop beside
prefix-hit loads. The loop itself needs torch and a CUDA GPU; here: what it says without them,
its table from a run's CSV, the scheduler's bookkeeping, the load descriptors, and, where torch is
installed, one decode step's arithmetic on the CPU against an unpaged reference."""

import csv
import subprocess
import sys

import numpy as np
import pytest
from conftest import BENCH_PATH, ROOT, bench_env


def serving(args, timeout=120):
    return subprocess.run(
        [sys.executable, "-m", "gfd_bench.serving"] + args,
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env=bench_env(),
    )


@pytest.fixture
def modules(monkeypatch):
    monkeypatch.syspath_prepend(BENCH_PATH)
    from gfd_bench import serving as s
    from gfd_bench import serving_loads, serving_model

    return s, serving_loads, serving_model


def test_help_and_the_message_without_a_gpu_or_torch():
    h = serving(["--help"])
    assert h.returncode == 0, h.stdout + h.stderr
    assert "usage: python -m gfd_bench.serving" in h.stdout
    assert all(
        flag in h.stdout
        for flag in ("--batch-sizes", "--paths", "--sched-us", "--load-every", "--quick", "--table")
    )
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has torch with a GPU: the benchmark would run")
    except ImportError:
        pass
    r = serving([])
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.startswith("skipped: gfd_bench.serving: needs"), r.stdout
    assert "torch" in r.stdout or "GPU" in r.stdout


def write_run(path, runs_scale=1.0, failed=()):
    rows = []
    for batch in (1, 64):
        alone = dict(
            batch=batch, path="alone", tpot_p50_ms=2.0, tpot_p99_ms=2.5 * runs_scale, verified="-"
        )
        rows.append(alone)
        for name, slow in (("dma", 1.02), ("gfd", 1.05), ("batch", 1.10)):
            rows.append(
                dict(
                    batch=batch,
                    path=name,
                    tpot_p50_ms=2.0 * slow,
                    tpot_p99_ms=2.5 * slow * runs_scale,
                    load_p50_us=170.0,
                    load_p99_us=240.0,
                    load_gbps=49.3,
                    call_p50_us=25.0,
                    verified="NO" if (batch, name) in failed else "yes",
                )
            )
    for r in rows:
        r["p50_vs_alone"] = r["tpot_p50_ms"] / 2.0
        r["p99_vs_alone"] = r["tpot_p99_ms"] / (2.5 * runs_scale)
        r["p99_vs_dma"] = r["tpot_p99_ms"] / (2.5 * 1.02 * runs_scale)
    fields = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fields, extrasaction="ignore", restval="")
        w.writeheader()
        w.writerows(rows)
    return path


def test_table_of_two_runs(tmp_path):
    r = serving(
        [
            "--table",
            str(write_run(tmp_path / "serving_1.csv")),
            str(write_run(tmp_path / "serving_2.csv", runs_scale=1.2)),
        ]
    )
    assert r.returncode == 0, r.stdout + r.stderr
    lines = [line for line in r.stdout.splitlines() if line.startswith("| ")]
    cells = {
        tuple(c.strip() for c in line.split("|")[1:3]): [c.strip() for c in line.split("|")[1:-1]]
        for line in lines[1:]
    }
    header = [c.strip() for c in lines[0].split("|")[1:-1]]
    assert len(cells) == 8, r.stdout  # 2 batch sizes x (alone, dma, gfd, batch)
    at = header.index("P99 vs alone")
    assert cells[("1", "gfd")][at] == "+5.0% / +5.0%", r.stdout
    assert cells[("1", "alone")][at] == "-"  # the reference itself
    assert cells[("64", "dma")][header.index("P99 vs contiguous DMA")] == "-"
    assert cells[("64", "batch")][header.index("TPOT P99 (ms)")] == "2.750 / 3.300"
    assert cells[("1", "gfd")][header.index("load P50 (us)")] == "170 / 170"
    # rows in order: each batch size's loop alone first, then the contiguous DMA, then the paths
    assert [k for k in cells][:4] == [("1", "alone"), ("1", "dma"), ("1", "gfd"), ("1", "batch")]
    assert "(2 run(s)" in r.stdout


def test_table_refuses_a_csv_of_another_benchmark(tmp_path):
    other = tmp_path / "paged.csv"
    other.write_text("method,load_slowdown\ngfd,0.1\n")
    r = serving(["--table", str(other)])
    assert r.returncode == 2 and "paged.csv: not a CSV of gfd_bench.serving" in r.stderr, r.stderr
    r = serving(["--table", str(tmp_path / "missing.csv")])
    assert r.returncode == 2 and "cannot read" in r.stderr, r.stderr


def test_summary_rows_give_ratios_to_both_references(modules):
    s, loads, _ = modules

    class A:
        layers, context, output_len, sched_us, load_every, load_pages = 4, 1024, 128, 300.0, 4, 32

    # P99 of 100 steps is the 99th slowest (nearest rank): two outliers make it.
    tp = {
        "alone": [0.002] * 98 + [0.004] * 2,
        "dma": [0.002] * 98 + [0.005] * 2,
        "gfd": [0.0021] * 98 + [0.006] * 2,
    }
    gp = {k: [1.5] * 100 for k in tp}
    rec = loads.LoadRecord(True, 30.0, False)
    rec.usable_us = 200.0
    recs = {"alone": [], "dma": [rec] * 25, "gfd": [rec] * 25}
    rows = s.summarize(
        16, ["alone", "dma", "gfd"], tp, gp, recs, {"dma": "yes", "gfd": "yes"}, A, 8 << 20, "gpu"
    )
    by = {r["path"]: r for r in rows}
    assert by["alone"]["p99_vs_alone"] == pytest.approx(1.0) and by["alone"]["loads"] == 0
    assert by["gfd"]["tpot_p99_ms"] == pytest.approx(6.0) and by["gfd"][
        "p99_vs_alone"
    ] == pytest.approx(1.5)
    assert by["gfd"]["p99_vs_dma"] == pytest.approx(1.2) and by["gfd"][
        "p50_vs_dma"
    ] == pytest.approx(1.05)
    assert by["gfd"]["load_gbps"] == pytest.approx((8 << 20) / 200e3)
    assert by["gfd"]["loads"] == 25 and by["gfd"]["backlog"] == 0 and by["gfd"]["verified"] == "yes"
    assert "load_p50_us" not in by["alone"]


def test_scheduler_advances_finishes_and_builds_inputs(modules):
    _, _, m = modules
    sch = m.Scheduler(batch=3, context=9, output_len=6, page_tokens=4, pages_per_seq=4, vocab=50)
    ids, pos, slots = sch.inputs()
    assert pos == [9, 11, 13]  # staggered starts
    # slot = the position's page of the row's pages, times the page size, plus its offset
    assert slots == [2 * 4 + 1, (4 + 2) * 4 + 3, (8 + 3) * 4 + 1]
    for step in range(30):
        ids, pos, slots = sch.work([7 + step, 8 + step, 9 + step], 0.0)
        assert all(9 <= p < 9 + 6 for p in pos), pos  # every position within the request's pages
        for row, (p, sl) in enumerate(zip(pos, slots)):
            assert sl == sch.block_table[row][p // 4] * 4 + p % 4
        assert sorted(r.slot for r in sch.running) == [0, 1, 2]
        keys = [(r.priority, r.arrival, r.request_id) for r in sch.running]
        assert keys == sorted(keys)  # ordered every step
    assert sch.finished >= 12 and sch.next_id == 3 + sch.finished
    with pytest.raises(ValueError):
        m.Scheduler(batch=1, context=9, output_len=8, page_tokens=4, pages_per_seq=4, vocab=50)


def test_scheduler_work_takes_the_budget(modules):
    import time

    _, _, m = modules
    sch = m.Scheduler(batch=4, context=16, output_len=8, page_tokens=16, pages_per_seq=2, vocab=10)
    t0 = time.perf_counter()
    sch.work([1, 2, 3, 4], 0.002)
    assert time.perf_counter() - t0 >= 0.002


def test_load_descriptors_are_every_tensors_pages(modules):
    _, loads, _ = modules

    class Cache:
        def __init__(self, base, pages, page):
            self.base, self.shape = base, (pages, page)

        def data_ptr(self):
            return self.base

    class Stream:
        cuda_stream = 1234

    page = 32768
    gpu = [Cache(1 << 40, 100, page), Cache(2 << 40, 100, page)]
    host = [Cache(1 << 30, 50, page), Cache(3 << 30, 50, page)]
    s = loads.Setup(None, "cuda:0", Stream(), gpu, host)
    dsts, srcs, sizes = s.descriptors(
        np.array([3, 7], dtype=np.int64), np.array([90, 91], dtype=np.int64)
    )
    assert dsts.dtype == np.uint64 and s.stream_handle == 1234
    assert dsts.tolist() == [
        (1 << 40) + 90 * page,
        (1 << 40) + 91 * page,
        (2 << 40) + 90 * page,
        (2 << 40) + 91 * page,
    ]
    assert srcs.tolist() == [
        (1 << 30) + 3 * page,
        (1 << 30) + 7 * page,
        (3 << 30) + 3 * page,
        (3 << 30) + 7 * page,
    ]
    assert sizes.tolist() == [page] * 4


# --------------------------------------------------------------------------------------------
# One decode step on the CPU (float32), where torch is installed


@pytest.fixture
def small(modules):
    torch = pytest.importorskip("torch")
    _, _, m = modules
    shape = m.ModelShape(
        layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, mlp=96, vocab=50, page_tokens=4
    )
    per_seq = m.pages_per_sequence(shape, 9, 6)
    caches = m.KVCaches(
        torch, shape, 3 * per_seq, 8, torch.float32, "cpu", torch.Generator().manual_seed(0)
    )
    model = m.DecodeModel(
        torch, shape, caches, per_seq * shape.page_tokens, torch.float32, "cpu", seed=0
    )
    sched = m.Scheduler(3, 9, 6, shape.page_tokens, per_seq, shape.vocab)
    return torch, m, shape, caches, model, sched


def test_paged_attention_matches_unpaged_grouped_query_attention(small):
    torch, m, shape, caches, model, sched = small
    g = torch.Generator().manual_seed(3)
    b, pt = 3, shape.page_tokens
    table = torch.tensor(sched.block_table)[:, torch.randperm(4, generator=g)]  # pages in any order
    positions = torch.tensor([5, 9, 14])
    t = table.shape[1] * pt
    mask = (torch.arange(t)[None, :] <= positions[:, None])[:, None, None, :]
    q = torch.randn((b, shape.heads, shape.head_dim), generator=g)
    out = m.paged_attention(torch, q, caches.pages(0), caches.pages(1), table, mask)
    for i in range(b):
        n = int(positions[i]) + 1
        k = torch.cat([caches.pages(0)[p] for p in table[i].tolist()])[:n]  # [n, kv_heads, d]
        v = torch.cat([caches.pages(1)[p] for p in table[i].tolist()])[:n]
        for h in range(shape.heads):
            kv = h // shape.group  # query head h reads KV head h // group
            w = torch.softmax(k[:, kv] @ q[i, h] / shape.head_dim**0.5, dim=0)
            assert torch.allclose(out[i, h], w @ v[:, kv], atol=1e-5), (i, h)


def test_decode_step_writes_its_slots_and_stays_finite(small):
    torch, m, shape, caches, model, sched = small
    table = torch.tensor(sched.block_table)
    before = [t.clone() for t in caches.tensors]
    tokens = None
    for _ in range(8):
        ids, pos, slots = sched.inputs() if tokens is None else sched.work(tokens, 0.0)
        written = torch.tensor(slots)
        for t in range(len(caches.tensors)):
            caches.slots(t)[written] = float("inf")  # poison: the step must overwrite these slots
        snap = [t.clone() for t in caches.tensors]
        tok, logits = model.step(torch.tensor(ids), torch.tensor(pos), written, table)
        assert tok.dtype == torch.int64 and tok.shape == (3,) and bool(torch.isfinite(logits).all())
        assert torch.equal(tok, logits.argmax(-1))
        for t, old in enumerate(snap):
            rows = caches.slots(t)
            assert bool(torch.isfinite(rows[written]).all()), t  # each sequence's new K or V
            old_rows = old.view(torch.float32).view(rows.shape)
            changed = (rows != old_rows).flatten(1).any(1).nonzero().flatten().tolist()
            assert set(changed) == set(slots), (t, changed, slots)  # and nothing else
        tokens = tok.tolist()
    # the load region (pages past the batch's) is never written by the model
    lo = caches.batch_pages
    assert all(torch.equal(t[lo:], b[lo:]) for t, b in zip(caches.tensors, before))


def test_a_short_run_on_a_gpu(tmp_path):
    """The whole benchmark, small: every path runs, is verified and gets its ratios."""
    torch = pytest.importorskip("torch")
    import gfd

    if not torch.cuda.is_available() or gfd.cuda_device_count() == 0:
        pytest.skip("needs torch with a CUDA GPU")
    out = tmp_path / "serving.csv"
    r = serving(
        [
            "--batch-sizes",
            "1,4",
            "--layers",
            "1",
            "--steps",
            "40",
            "--rounds",
            "2",
            "--warmup",
            "4",
            "--host-cache-bytes",
            "256M",
            "--csv",
            str(out),
        ],
        timeout=600,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    rows = list(csv.DictReader(open(out)))
    paths = {"alone", "dma", "gfd", "gfd_worker", "batch", "per_block", "uva2", "uva12"}
    assert {(int(x["batch"]), x["path"]) for x in rows} == {
        (b, p) for b in (1, 4) for p in paths
    }, r.stdout
    for x in rows:
        assert x["verified"] == ("-" if x["path"] == "alone" else "yes"), x
        assert int(x["steps"]) == 40 and float(x["tpot_p99_ms"]) >= float(x["tpot_p50_ms"]) > 0
        assert x["p99_vs_alone"] and x["p99_vs_dma"]
        if x["path"] != "alone":
            assert (
                int(x["loads"]) >= 8 and float(x["load_p50_us"]) > 0 and float(x["call_p50_us"]) > 0
            ), x
    assert "skipped: gfd_sglang" in r.stdout

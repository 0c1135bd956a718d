"""The Python package on a real GPU with torch: register_caches + copy_blocks against torch's own
per-block copies, stream ordering with torch kernels before and after (proven by the data), every
layer's K and V in one transfer,
empty_pinned, transfer lifetime, the example and the benchmark. Skipped, with the reason, where
torch or a CUDA GPU is missing."""

import gc
import subprocess
import sys

import gfd
import pytest
from conftest import ROOT, bench_env

torch = pytest.importorskip("torch", reason="torch is not installed: the GPU suite needs it")
if not torch.cuda.is_available() or gfd.cuda_device_count() == 0:
    pytest.skip(
        "no CUDA GPU here (torch.cuda.is_available() is False or gfd sees no device)",
        allow_module_level=True,
    )

DEV = torch.device("cuda", 0)
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.int8]


@pytest.fixture(scope="module")
def engine():
    e = gfd.Engine(0)
    yield e
    e.close()


def random_cache(blocks, block_bytes, dtype, device, gen, pinned=False):
    item = torch.empty((), dtype=dtype).element_size()
    shape = (blocks, 4, block_bytes // item // 4)
    raw = torch.randint(0, 256, shape[:2] + (shape[2] * item,), dtype=torch.uint8, generator=gen)
    t = raw.view(dtype)
    if device == "cpu":
        return t.pin_memory() if pinned else t
    return t.to(DEV)


def same(a, b):
    """Bitwise equality (random bytes viewed as floats hold NaNs, which torch.equal rejects)."""
    return torch.equal(
        a.contiguous().view(torch.uint8).cpu(), b.contiguous().view(torch.uint8).cpu()
    )


def random_mapping(gen, n_src, n_dst, n):
    return torch.stack(
        [torch.randperm(n_src, generator=gen)[:n], torch.randperm(n_dst, generator=gen)[:n]], 1
    )


def swap(engine, src, dst, mapping, stream=None):
    """Block mapping[i, 0] of src to block mapping[i, 1] of dst (tensors or lists of them), either
    way: the caches registered host side first, then one copy_blocks with the mapping's columns."""
    first = src[0] if isinstance(src, list) else src
    to_device = not first.is_cuda
    m = torch.as_tensor(mapping, dtype=torch.int64).reshape(-1, 2)
    host, dev = (src, dst) if to_device else (dst, src)
    cs = engine.register_caches(host, dev)
    return engine.copy_blocks(
        cs,
        gfd.Direction.TO_DEVICE if to_device else gfd.Direction.TO_HOST,
        m[:, 0],
        m[:, 1],
        stream=stream,
    )


def torch_swap(src, dst, mapping):
    """torch's own per-block copies: the reference."""
    for s, d in mapping.tolist():
        dst[d].copy_(src[s])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_bytes", [1024, 4096, 16384, 65536])
@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_copy_blocks_matches_torch(engine, dtype, block_bytes, direction):
    gen = torch.Generator().manual_seed(block_bytes * 7 + len(str(dtype)))
    host = random_cache(96, block_bytes, dtype, "cpu", gen, pinned=True)
    dev = random_cache(64, block_bytes, dtype, "cuda", gen)
    src, dst = (host, dev) if direction == "h2d" else (dev, host)
    m = random_mapping(gen, src.shape[0], dst.shape[0], 40)
    expect = dst.clone()
    torch_swap(src, expect, m)
    stream = torch.cuda.Stream(DEV)
    with torch.cuda.stream(stream):
        t = swap(engine, src, dst, m)
    t.wait()
    stream.synchronize()
    assert same(dst, expect)


@pytest.mark.parametrize("stream_form", ["current", "explicit", "protocol", "int"])
def test_swap_in_ordered_between_torch_kernels(engine, stream_form):
    gen = torch.Generator().manual_seed(1)
    host = torch.randn((512, 8, 256), generator=gen).half().pin_memory()
    dev = torch.empty((512, 8, 256), dtype=torch.float16, device=DEV)
    m = random_mapping(gen, 512, 512, 256)
    s = torch.cuda.Stream(DEV)
    a = torch.randn(4096, 4096, device=DEV)
    with torch.cuda.stream(s):
        for _ in range(4):
            a = a @ a / 64  # keeps the stream busy for a while
        dev.fill_(1)  # before: must not land after gfd's blocks
    arg = {
        "current": None,
        "explicit": s,
        "int": s.cuda_stream,
        "protocol": type("P", (), {"__cuda_stream__": lambda self: (0, s.cuda_stream)})(),
    }[stream_form]
    if stream_form == "current":
        with torch.cuda.stream(s):
            t = swap(engine, host, dev, m)
    else:
        t = swap(engine, host, dev, m, stream=arg)
    with torch.cuda.stream(s):
        after = dev[m[:, 1].to(DEV)].float() * 2  # after: must see gfd's blocks
    s.synchronize()
    t.wait()
    assert torch.equal(after.cpu(), host[m[:, 0]].float() * 2)
    others = torch.ones(512, dtype=torch.bool)
    others[m[:, 1]] = False
    assert bool((dev[others.to(DEV)] == 1).all())


def test_swap_out_ordered_between_torch_kernels(engine):
    gen = torch.Generator().manual_seed(2)
    dev = torch.empty((512, 8, 256), dtype=torch.float32, device=DEV)
    host = torch.zeros((600, 8, 256), dtype=torch.float32).pin_memory()
    m = random_mapping(gen, 512, 600, 300)
    s = torch.cuda.Stream(DEV)
    a = torch.randn(4096, 4096, device=DEV)
    with torch.cuda.stream(s):
        for _ in range(4):
            a = a @ a / 64
        dev.copy_(torch.arange(dev.numel(), device=DEV, dtype=torch.float32).view_as(dev))  # before
        t = swap(engine, dev, host, m)
        dev.fill_(-1)  # after: may overwrite only once gfd has read the blocks
    t.wait()
    s.synchronize()
    full = torch.arange(dev.numel(), dtype=torch.float32).view(dev.shape)
    assert torch.equal(host[m[:, 1]], full[m[:, 0]])


def test_multi_layer_forms(engine):
    gen = torch.Generator().manual_seed(3)
    layers = 4
    hk = [random_cache(64, 8192, torch.bfloat16, "cpu", gen, pinned=True) for _ in range(layers)]
    hv = [random_cache(64, 8192, torch.bfloat16, "cpu", gen, pinned=True) for _ in range(layers)]
    dk = [random_cache(48, 8192, torch.bfloat16, "cuda", gen) for _ in range(layers)]
    dv = [random_cache(48, 8192, torch.bfloat16, "cuda", gen) for _ in range(layers)]
    m = random_mapping(gen, 64, 48, 30)
    ek, ev = [d.clone() for d in dk], [d.clone() for d in dv]
    for src, dst in zip(hk + hv, ek + ev):
        torch_swap(src, dst, m)
    n0 = engine.stats()["transfers"]
    swap(engine, hk + hv, dk + dv, m).wait()
    assert engine.stats()["transfers"] == n0 + 1
    torch.cuda.synchronize()
    for got, exp in zip(dk + dv, ek + ev):
        assert same(got, exp)
    # Back out to fresh host caches, with separate id tensors.
    ok = [torch.zeros_like(h).pin_memory() for h in hk]
    ov = [torch.zeros_like(h).pin_memory() for h in hv]
    si, di = m[:, 1], torch.arange(30)
    out = engine.register_caches(ok + ov, dk + dv)
    engine.copy_blocks(out, "to_host", si, di).wait()
    for got, src in zip(ok + ov, dk + dv):
        assert same(got[di], src[si.to(DEV)])


def test_empty_pinned_through_dlpack(engine):
    buf = gfd.empty_pinned((64, 2048), torch.float16)
    t = torch.from_dlpack(buf)
    assert t.is_pinned() and t.dtype == torch.float16 and t.shape == (64, 2048)
    assert buf.pool.registered and buf.pool.hugepages in ("hugetlb", "transparent", "none")
    t.copy_(torch.randn(64, 2048).half())
    ref = t.clone()
    del buf
    gc.collect()
    dev = torch.zeros(64, 2048, dtype=torch.float16, device=DEV)
    swap(engine, t, dev, torch.stack([torch.arange(64), torch.arange(64)], 1)).wait()
    torch.cuda.synchronize()
    assert torch.equal(dev.cpu(), ref)


def test_transfer_keeps_torch_tensors_alive(engine):
    # The transfer holds the caches' memory (through the DLPack exports it took), not
    # necessarily the Python tensor objects: dropping the caller's last reference while the
    # copy waits behind GPU work must neither free nor recycle the pinned memory under it.
    host = torch.randn(256, 1024).pin_memory()
    ref = host.clone()
    dev = torch.zeros(256, 1024, device=DEV)
    s = torch.cuda.Stream(DEV)
    with torch.cuda.stream(s):
        # About 1 s of GPU time first (cycles): long enough that the submission, the del and a
        # full gc.collect() are over well before it (0.1 s was not, once, on the H200).
        torch.cuda._sleep(2_000_000_000)
        t = swap(engine, host, dev, torch.stack([torch.arange(256), torch.arange(256)], 1))
    del host
    gc.collect()
    assert not t.done(), "the copy waits behind the sleep"
    # Pinned blocks freed now would be handed out again by torch's caching host allocator.
    reuse = [torch.full((256, 1024), -1.0).pin_memory() for _ in range(4)]
    t.wait()
    torch.cuda.synchronize()
    assert torch.equal(dev.cpu(), ref), "the source memory stayed intact while in flight"
    del reuse


def test_copy_to_device_with_torch_pointer_tensors(engine):
    host = torch.randint(0, 255, (128, 4096), dtype=torch.uint8).pin_memory()
    dev = torch.zeros(128, 4096, dtype=torch.uint8, device=DEV)
    perm = torch.randperm(128)
    src = host.data_ptr() + perm * 4096
    dst = dev.data_ptr() + torch.arange(128) * 4096
    engine.copy_to_device(src, dst, torch.full((128,), 4096)).wait()
    torch.cuda.synchronize()
    assert torch.equal(dev.cpu(), host[perm])
    back = torch.zeros_like(host)
    engine.copy_to_host(dst, back.data_ptr() + perm * 4096, 4096).wait()
    assert torch.equal(back, host)


def test_pageable_host_cache_works(engine):
    host = torch.randn(64, 4096)  # not pinned: gfd stages it (slower, still correct)
    dev = torch.zeros(64, 4096, device=DEV)
    swap(engine, host, dev, [[i, 63 - i] for i in range(64)]).wait()
    torch.cuda.synchronize()
    assert torch.equal(dev.cpu(), host.flip(0))


def test_errors_name_the_argument(engine):
    dev = torch.zeros(8, 1024, device=DEV)
    host = torch.zeros(8, 1024).pin_memory()
    with pytest.raises(gfd.Error, match="device has dtype float16, host float32"):
        swap(engine, host, dev.half(), [[0, 0]])
    cs = engine.register_caches(host, dev)
    with pytest.raises(gfd.Error, match="src_ids: must be in host memory"):
        engine.copy_blocks(cs, "to_device", torch.zeros(1, dtype=torch.int64, device=DEV), [0])
    with pytest.raises(gfd.Error, match="each block must be contiguous"):
        swap(engine, host, dev.view(8, 32, 32).transpose(1, 2), [[0, 0]])
    if torch.cuda.device_count() > 1:
        other = torch.zeros(8, 1024, device=torch.device("cuda", 1))
        # Named by the binding, or (where torch refuses a DLPack export on another GPU's stream
        # and the CUDA array interface, which names no device, is used) by the engine's check.
        with pytest.raises(
            gfd.Error,
            match=r"on cuda:1, but the engine serves GPU 0|not device memory of GPU 0 \(it is device memory of GPU 1\)",
        ):
            swap(engine, host, other, [[0, 0]])


def test_engines_leave_the_current_device_alone():
    torch.cuda.set_device(0)
    last = torch.cuda.device_count() - 1
    with gfd.Engine(last, staging_bytes="8M", slot_bytes="1M") as e:
        assert torch.cuda.current_device() == 0
        assert e.stats()["staging_bytes"] == 8 << 20
    pool = gfd.HostPool(1 << 20, device=last)
    assert pool.registered and torch.cuda.current_device() == 0


def test_from_env(monkeypatch):
    monkeypatch.setenv("GFD_SPIN_US", "33")
    with gfd.Engine.from_env(copy_streams=3) as e:
        o = e.options()
        assert o["spin_us"] == 33 and o["copy_streams"] == 3


def run(args, timeout=600):
    env = bench_env()
    return subprocess.run(
        [sys.executable] + args, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
    )


def test_example_runs():
    r = run(
        [
            "examples/python/swap_kv.py",
            "--layers",
            "2",
            "--gpu-blocks",
            "256",
            "--cpu-blocks",
            "512",
            "--swap",
            "64",
            "--iters",
            "3",
        ]
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "every byte matches" in r.stdout


@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_bench_runs_and_verifies(direction):
    r = run(
        [
            "-m",
            "gfd_bench",
            "--iters",
            "20",
            "--warmup",
            "2",
            "--direction",
            direction,
            "--backends",
            "gather,batch_async",
            "--pool-bytes",
            str(256 << 20),
        ]
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "contiguous copy" in r.stdout and "NO" not in r.stdout.split("verified")[-1]


def test_paged_bench_runs_and_verifies(tmp_path):
    """python -m gfd_bench --layout paged: copy_blocks over every layer's K and V, both directions,
    every backend, under the decode load too; every row verified (no timing is checked)."""
    out = tmp_path / "paged.csv"
    r = run(
        [
            "-m",
            "gfd_bench",
            "--layout",
            "paged",
            "--layers",
            "4",
            "--block-sizes",
            "4K,32K",
            "--blocks",
            "16",
            "--iters",
            "20",
            "--warmup",
            "2",
            "--host-cache-bytes",
            "256M",
            "--gpu-cache-bytes",
            "64M",
            "--under-load=decode",
            "--csv",
            str(out),
        ]
    )
    assert r.returncode == 0, r.stdout + r.stderr
    import csv

    rows = list(csv.DictReader(open(out)))
    assert {x["direction"] for x in rows} == {"h2d", "d2h"}, rows
    assert {"contiguous copy", "gfd", "batch_async", "per_block"} <= {x["method"] for x in rows}
    assert all(x["verified"] in ("yes", "-") for x in rows), rows
    assert all(x["rate_kept"] and x["load_slowdown"] for x in rows), rows

"""gfd's vLLM offloading worker core on a CUDA GPU, on tensors laid out as vLLM lays them out,
byte-identical to vLLM's own copy path rebuilt here (one cudaMemcpyBatchAsync of a descriptor
per (block, tensor), sources in any order for loads, in stream order for stores), both
directions, with torch kernels on the caller's stream before and after each submission.

Needs torch with CUDA; skips with the reason otherwise (the emulated-device suite,
test_kv_worker.py, covers the logic everywhere).
"""

import gfd
import numpy as np
import pytest
from gfd import testing
from gfd.kv_worker import KVTransferWorker, host_block_ids

torch = pytest.importorskip("torch", reason="the GPU suite needs torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU: the worker's GPU suite needs one", allow_module_level=True)

# (name, tensors, page bytes): Llama-3-8B (32 layers, K and V, 16 tokens x 8 heads x 128 x bf16)
# and Llama-3-70B at TP 4 (80 layers, K and V, 2 heads per rank).
SHAPES = [("llama3_8b", 64, 32 << 10), ("llama3_70b_tp4", 160, 8 << 10)]


@pytest.fixture(scope="module")
def engine():
    e = gfd.Engine(device=torch.cuda.current_device())
    yield e
    e.close()


def _random(shape, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-128, 127, shape, dtype=torch.int8, generator=g)


def _vllm_copy(engine, to_device, host_rows, gpu, host_ids, gpu_ids, page, stream):
    """vLLM's CPUOffloadingWorker copy on (rows, page) host arrays."""

    def addr(t, ids):
        h = host_rows[t]
        return np.uint64(h.data_ptr()) + ids.astype(np.uint64) * np.uint64(h.stride(0))

    _batch(engine, to_device, addr, gpu, host_ids, gpu_ids, page, stream)


def _batch(engine, to_device, host_addr, gpu, host_ids, gpu_ids, page, stream):
    """vLLM's copy path on given host addresses: a descriptor per (block, tensor), one batched DMA."""
    src, dst = [], []
    for t, g in enumerate(gpu):
        hp = host_addr(t, host_ids)
        gp = np.uint64(g.data_ptr()) + gpu_ids.astype(np.uint64) * np.uint64(g.stride(0))
        src.append(hp if to_device else gp)
        dst.append(gp if to_device else hp)
    src = np.concatenate(src).astype(np.uint64)
    dst = np.concatenate(dst).astype(np.uint64)
    sizes = np.full(len(src), page, np.uint64)
    testing.memcpy_batch(
        engine,
        dst.ctypes.data,
        src.ctypes.data,
        sizes.ctypes.data,
        len(sizes),
        to_device,
        int(stream.cuda_stream),
    )
    stream.synchronize()


def _wait_job(w, job_id):
    w.wait([job_id])
    for _ in range(10000):
        done = w.get_finished()
        if done:
            assert [r.job_id for r in done] == [job_id]
            return done[0]
    raise AssertionError("job not reported after wait()")


def _gpu_caches(tensors, gpu_blocks, page, alloc):
    """Per-layer (gpu_blocks, page) int8 caches: one allocation each, or (``one``) views of one
    allocation at a constant layer stride, as vLLM 0.33's allocate_kv_cache makes them."""
    if alloc == "separate":
        return [_random((gpu_blocks, page), t).cuda() for t in range(tensors)]
    buf = torch.empty(tensors * gpu_blocks * page, dtype=torch.int8, device="cuda")
    gpu = [
        buf[t * gpu_blocks * page : (t + 1) * gpu_blocks * page].view(gpu_blocks, page)
        for t in range(tensors)
    ]
    for t, g in enumerate(gpu):
        g.copy_(_random((gpu_blocks, page), t))
    return gpu


@pytest.mark.parametrize("name,tensors,page", SHAPES)
@pytest.mark.parametrize("bpc", [1, 4])
@pytest.mark.parametrize("layout", ["tensor", "block"])
@pytest.mark.parametrize("alloc", ["separate", "one"])
def test_worker_matches_vllm_copy_path(engine, name, tensors, page, bpc, layout, alloc):
    gpu_blocks, num_chunks, blocks = 256, 96, 64
    gpu = _gpu_caches(tensors, gpu_blocks, page, alloc)
    strided_before = engine.stats()["strided_copies"]
    w = KVTransferWorker(engine, gpu, [list(range(tensors))], bpc, num_chunks, host_layout=layout)
    rows = num_chunks * bpc
    host_rows = [w.host_rows(t) for t in range(tensors)]  # (rows, page) views, either layout
    for t, h in enumerate(host_rows):
        h.copy_(_random((rows, page), 1000 + t))
    rng = np.random.default_rng(5)
    side = torch.cuda.Stream()
    cur = torch.cuda.current_stream()
    try:
        # Store: GPU blocks -> host chunks, after kernels on the caller's stream that rewrite the
        # source blocks (the store must see their result), with more kernels queued after it.
        gids = rng.choice(gpu_blocks, blocks, replace=False).astype(np.int64)
        skip = 1 if bpc > 1 else 0  # an unaligned first block
        chunks = rng.choice(num_chunks, -(-(blocks + skip) // bpc), replace=False).astype(np.int64)
        hids = host_block_ids(chunks, bpc, blocks, skip)
        gsel = torch.from_numpy(gids).cuda()
        ref_host = [h.clone() for h in host_rows]
        torch.cuda._sleep(2_000_000)  # ~1 ms on the caller's stream before the writes
        for t, g in enumerate(gpu):
            g[gsel] = (g[gsel] + (t + 1)).to(torch.int8)
        w.submit(1, False, chunks, gids, [blocks], [skip])
        scratch = torch.randn(2048, 2048, device="cuda") @ torch.randn(2048, 2048, device="cuda")
        r = _wait_job(w, 1)
        assert r.success and r.bytes == blocks * tensors * page and r.seconds > 0, r
        cur.synchronize()
        pinned_ref = [torch.empty_like(h).pin_memory() for h in ref_host]
        for p, h in zip(pinned_ref, ref_host):
            p.copy_(h)
        _vllm_copy(engine, False, pinned_ref, gpu, hids, gids, page, side)
        for t, (h, p) in enumerate(zip(host_rows, pinned_ref)):
            assert torch.equal(h, p), f"store: host cache {t} differs from vLLM's copy path"

        # Load: host chunks -> other GPU blocks, after kernels on the caller's stream that zero
        # the destination blocks (the load must land after them).
        gids2 = rng.choice(gpu_blocks, blocks, replace=False).astype(np.int64)
        chunks2 = rng.choice(num_chunks, -(-(blocks + skip) // bpc), replace=False).astype(np.int64)
        hids2 = host_block_ids(chunks2, bpc, blocks, skip)
        ref_gpu = [g.clone() for g in gpu]
        cur.synchronize()
        gsel2 = torch.from_numpy(gids2).cuda()
        torch.cuda._sleep(2_000_000)
        for g in gpu:
            g[gsel2] = 0
        w.submit(2, True, chunks2, gids2, [blocks], [skip])
        scratch = scratch @ scratch
        r = _wait_job(w, 2)
        assert r.success and r.bytes == blocks * tensors * page, r
        cur.synchronize()
        for g in ref_gpu:
            g[gsel2] = 0
        _vllm_copy(engine, True, host_rows, ref_gpu, hids2, gids2, page, side)
        for t, (g, ref) in enumerate(zip(gpu, ref_gpu)):
            assert torch.equal(g, ref), f"load: GPU tensor {t} differs from vLLM's copy path"
        if alloc == "one" and layout == "block":
            # Each block's pages of every layer: one constant-stride run, one 2D copy, both ways.
            assert engine.stats()["strided_copies"] - strided_before == 2 * blocks
    finally:
        w.shutdown()


def test_worker_rejects_bad_ids_in_the_call_and_reports_a_failed_job(engine):
    gpu = [torch.zeros((16, 4096), dtype=torch.int8, device="cuda") for _ in range(2)]
    w = KVTransferWorker(engine, gpu, [[0, 1]], 1, 8)
    try:
        # Chunk 8 of 8: out of range, rejected by submit itself.
        with pytest.raises(gfd.InvalidArgument, match=r"submit: chunk_ids\[0\]: 8 is out of range"):
            w.submit(7, True, [8], [0])
        # GPU block 0 given twice as a destination: found by the transfer, a failed job.
        assert w.submit(7, True, [1, 2], [0, 0])
        r = _wait_job(w, 7)
        assert not r.success and isinstance(r.error, gfd.Error) and r.bytes == 0
        assert w.submit(8, True, [3], [1])
        assert _wait_job(w, 8).success
    finally:
        w.shutdown()


def test_torch_host_memory_and_many_jobs_in_flight(engine):
    page, tensors = 16 << 10, 8
    gpu = [_random((128, page), t).cuda() for t in range(tensors)]
    w = KVTransferWorker(engine, gpu, [list(range(tensors))], 2, 64, host_memory="torch")
    try:
        assert all(h.is_pinned() for h in w.host_caches)
        for j in range(32):  # stores of blocks 2j, 2j+1 into chunk j, all queued at once
            w.submit(j, False, [j], [2 * j, 2 * j + 1])
        w.wait(set(range(32)))
        seen = []
        for _ in range(100):
            seen += w.get_finished()
            if len(seen) == 32:
                break
        assert sorted(r.job_id for r in seen) == list(range(32)) and all(r.success for r in seen)
        for t, (g, h) in enumerate(zip(gpu, w.host_caches)):
            assert torch.equal(h.view(128, page)[:64], g[:64].cpu()), f"tensor {t}"
    finally:
        w.shutdown()


def _region(tensors, page, bpc, num_chunks):
    """vLLM's SharedOffloadRegion of one rank rebuilt: pinned rows of every tensor's bpc pages of a
    chunk side by side (padded to 4 KiB), per tensor an int8 (chunks, page * bpc) view whose rows
    are a region row apart; and the address of page id i (chunk i // bpc, sub-block i % bpc) of
    tensor t, as vLLM's compute_sub_block_ptrs computes it."""
    row = -(-tensors * page * bpc // 4096) * 4096
    base = torch.zeros(num_chunks * row, dtype=torch.int8, pin_memory=True)
    views = [
        torch.as_strided(base, (num_chunks, page * bpc), (row, 1), t * page * bpc)
        for t in range(tensors)
    ]

    def addr(t, ids):
        ids = ids.astype(np.uint64)
        return (
            np.uint64(base.data_ptr())
            + ids // np.uint64(bpc) * np.uint64(row)
            + np.uint64(t * page * bpc)
            + ids % np.uint64(bpc) * np.uint64(page)
        )

    return base, views, addr


@pytest.mark.parametrize("bpc", [1, 4])
def test_worker_on_vllms_shared_region_matches_vllm_copy_path(engine, bpc):
    """The worker on vLLM's shared-region layout (what gfd.vllm hands it): stores and loads
    byte-identical to vLLM's own copy path on a second region, both directions."""
    tensors, page, gpu_blocks, num_chunks, blocks = 16, 8 << 10, 256, 64, 48
    gpu = _gpu_caches(tensors, gpu_blocks, page, "one")
    base, views, addr = _region(tensors, page, bpc, num_chunks)
    ref_base, _, ref_addr = _region(tensors, page, bpc, num_chunks)
    w = KVTransferWorker(engine, gpu, [list(range(tensors))], bpc, num_chunks, host_caches=views)
    rng = np.random.default_rng(9)
    side = torch.cuda.Stream()
    try:
        skip = 1 if bpc > 1 else 0
        gids = rng.choice(gpu_blocks, blocks, replace=False).astype(np.int64)
        chunks = rng.choice(num_chunks, -(-(blocks + skip) // bpc), replace=False).astype(np.int64)
        hids = host_block_ids(chunks, bpc, blocks, skip)
        w.submit(1, False, chunks, gids, [blocks], [skip])
        r = _wait_job(w, 1)
        assert r.success and r.bytes == blocks * tensors * page, r
        torch.cuda.synchronize()
        _batch(engine, False, ref_addr, gpu, hids, gids, page, side)
        assert torch.equal(base, ref_base), "store: the region differs from vLLM's copy path"

        gids2 = rng.choice(gpu_blocks, blocks, replace=False).astype(np.int64)
        ref_gpu = [g.clone() for g in gpu]
        gsel2 = torch.from_numpy(gids2).cuda()
        for g in gpu:
            g[gsel2] = 0
        for g in ref_gpu:
            g[gsel2] = 0
        torch.cuda.synchronize()
        w.submit(2, True, chunks, gids2, [blocks], [skip])
        r = _wait_job(w, 2)
        assert r.success, r
        torch.cuda.synchronize()
        _batch(engine, True, ref_addr, ref_gpu, hids, gids2, page, side)
        for t, (g, ref) in enumerate(zip(gpu, ref_gpu)):
            assert torch.equal(g, ref), f"load: GPU tensor {t} differs from vLLM's copy path"
    finally:
        w.shutdown()

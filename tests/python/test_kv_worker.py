"""gfd.kv_worker.KVTransferWorker on the emulated device (no vLLM, no torch): host caches laid out
as vLLM's CPU offloading lays them out (host_layout "tensor") or a block's pages side by side
("block"), jobs of (chunk ids, GPU block ids, group sizes, block
indices), every byte checked with numpy against a reference built here, the jobs' results, and
the errors a job or a worker can raise. test_kv_worker_gpu.py covers the same core on a CUDA GPU;
tests/vllm the glue to vLLM (gfd.vllm)."""

import re
import threading

import gfd
import numpy as np
import pytest
from gfd import testing
from gfd.kv_worker import KVTransferWorker, host_block_ids

PAGES = (2048, 1024, 4096)  # bytes per GPU block, per tensor (tensors of different page sizes)
GPU_BLOCKS = 24


def device_caches(engine, pages=PAGES, blocks=GPU_BLOCKS, seed=0):
    """Per tensor, a (blocks, page) int8 device buffer filled with random bytes, and its numpy
    view (the emulated device's memory is host memory)."""
    rng = np.random.default_rng(seed)
    bufs = [testing.device_buffer(engine, (blocks, p), "int8") for p in pages]
    views = [np.asarray(b) for b in bufs]
    for v in views:
        v[:] = rng.integers(-128, 128, v.shape, dtype=np.int8)
    return bufs, views


def host_rows(worker, tensors=None):
    """Per tensor, the worker's host pages as (chunks * bpc, page) rows (numpy views): row
    c * bpc + j is sub-block j of chunk c, in either layout; every tensor of PAGES by default."""
    out = []
    for t in range(len(PAGES) if tensors is None else tensors):
        pages = worker.host_pages(t)
        rows = pages.reshape(-1, pages.shape[2])
        assert np.shares_memory(rows, pages)  # a view: writing it writes the worker's memory
        out.append(rows)
    return out


def run(worker, job_id, *args, **kw):
    """Submits one job, waits for it and returns its result (the only one reported)."""
    assert worker.submit(job_id, *args, **kw) is True
    worker.wait([job_id])
    done = worker.get_finished()
    assert [r.job_id for r in done] == [job_id]
    return done[0]


@pytest.fixture
def counted(engine, monkeypatch):
    """The engine, its copy_blocks calls (one per gfd transfer) counted."""
    calls = []
    real = engine.copy_blocks

    def copy_blocks(caches, direction, src, dst, **kw):
        calls.append((caches, np.array(src), np.array(dst)))
        return real(caches, direction, src, dst, **kw)

    monkeypatch.setattr(engine, "copy_blocks", copy_blocks)
    return engine, calls


def test_host_block_ids():
    assert list(host_block_ids(np.array([5, 2, 7]), 1, 3, 0)) == [5, 2, 7]
    assert list(host_block_ids(np.array([5, 2, 7]), 1, 2, 0)) == [5, 2]
    # Chunk c, sub-block j is id c * 4 + j; the first chunk may start mid-chunk.
    assert list(host_block_ids(np.array([3, 1]), 4, 6, 0)) == [12, 13, 14, 15, 4, 5]
    assert list(host_block_ids(np.array([3, 1]), 4, 5, 3)) == [15, 4, 5, 6, 7]


@pytest.mark.parametrize("bpc", [1, 4])
def test_host_caches_shapes(engine, bpc):
    bufs, _ = device_caches(engine)
    w = KVTransferWorker(engine, bufs, [[0, 1, 2]], bpc, 5)
    try:
        assert w.host_layout == "tensor"
        hosts = w.host_caches
        assert [tuple(h.shape) for h in hosts] == [(5, p * bpc) for p in PAGES]
        assert all(np.asarray(h).dtype == np.int8 for h in hosts)
        assert hosts is not w.host_caches  # a new list each time: the worker's own is not exposed
        for t, (h, p) in enumerate(zip(hosts, PAGES)):  # rows: views of the same memory
            rows = np.asarray(w.host_rows(t))
            assert rows.shape == (5 * bpc, p) and rows.ctypes.data == np.asarray(h).ctypes.data
    finally:
        w.shutdown()


@pytest.mark.parametrize("bpc", [1, 4])
def test_block_layout_rows(engine, bpc):
    """host_layout "block": one host array, a row per GPU block holding that block's page of
    every tensor side by side; host_caches does not exist there."""
    bufs, _ = device_caches(engine)
    w = KVTransferWorker(engine, bufs, [[0, 1, 2]], bpc, 5, host_layout="block")
    try:
        assert w.host_layout == "block"
        rows = host_rows(w)
        assert [r.shape for r in rows] == [(5 * bpc, p) for p in PAGES]
        assert all(r.strides[0] == sum(PAGES) for r in rows)
        assert [r.ctypes.data - rows[0].ctypes.data for r in rows] == [
            0,
            PAGES[0],
            PAGES[0] + PAGES[1],
        ]
        with pytest.raises(gfd.Error, match="'block' layout keeps one array"):
            _ = w.host_caches
    finally:
        w.shutdown()


@pytest.mark.parametrize("layout", ["tensor", "block"])
@pytest.mark.parametrize("bpc,skip", [(1, 0), (4, 0), (4, 3)])
def test_store_then_load_every_byte(counted, bpc, skip, layout):
    engine, calls = counted
    bufs, gpu = device_caches(engine)
    w = KVTransferWorker(engine, bufs, [[0, 1, 2]], bpc, 8, host_layout=layout)
    try:
        host = host_rows(w)
        blocks = np.array([7, 2, 19, 11, 4, 23, 0][: max(3, 7 - skip)], np.int64)
        n = len(blocks)
        chunks = np.array([6, 1, 3, 5, 0, 2, 4][: -(-(n + skip) // bpc)], np.int64)
        ids = host_block_ids(chunks, bpc, n, skip)
        before = [h.copy() for h in host]
        r = run(
            w, 1, False, chunks, blocks, [n], [5 * bpc + skip]
        )  # block index: only its offset counts
        assert r.success and r.error is None and r.bytes == n * sum(PAGES) and r.seconds > 0
        for t, (h, b, g) in enumerate(zip(host, before, gpu)):
            b[ids] = g[blocks]
            assert np.array_equal(h, b), f"store: host cache {t}"
        # Load those chunks back into other GPU blocks: every other block stays as it was.
        others = np.array([1, 3, 5, 8, 9, 10, 12][:n], np.int64)
        expect = [g.copy() for g in gpu]
        for e, g in zip(expect, gpu):
            e[others] = g[blocks]
        r = run(w, 2, True, chunks, others, [n], [skip])
        assert r.success and r.bytes == n * sum(PAGES)
        for t, (g, e) in enumerate(zip(gpu, expect)):
            assert np.array_equal(g, e), f"load: GPU tensor {t}"
        assert len(calls) == 2  # one gfd transfer per job
    finally:
        w.shutdown()


def test_groups_sharing_tensors_move_as_one_transfer(counted):
    """vLLM's hybrid groups (full attention and sliding window layers aliasing the same
    tensors): both groups' rows go in one transfer, each group's first chunk at its own offset."""
    engine, calls = counted
    bufs, gpu = device_caches(engine, pages=PAGES[:2])
    w = KVTransferWorker(engine, bufs, [[0, 1], [1, 0]], 4, 8)
    try:
        host = host_rows(w, 2)
        g0, g1 = np.array([3, 4, 5, 6, 7], np.int64), np.array([12, 13], np.int64)
        c0, c1 = (
            np.array([2, 5]),
            np.array([7]),
        )  # group 0 from sub-block 1 of chunk 2; group 1 at 2 of 7
        r = run(w, 1, False, np.concatenate([c0, c1]), np.concatenate([g0, g1]), [5, 2], [1, 6])
        assert r.success and r.bytes == 7 * sum(PAGES[:2])
        assert len(calls) == 1 and len(calls[0][1]) == 7
        ids0, ids1 = host_block_ids(c0, 4, 5, 1), host_block_ids(c1, 4, 2, 2)
        assert list(ids0) == [9, 10, 11, 20, 21] and list(ids1) == [30, 31]
        for h, g in zip(host, gpu):
            assert np.array_equal(h[ids0], g[g0]) and np.array_equal(h[ids1], g[g1])
        # A group without blocks this job: only the other moves.
        r = run(w, 2, True, [7], [20, 21], [0, 2], [0, 2])
        assert r.success and r.bytes == 2 * sum(PAGES[:2]) and len(calls) == 2
        for g in gpu:
            assert np.array_equal(g[[20, 21]], g[g1])
    finally:
        w.shutdown()


def test_groups_with_different_tensors_move_as_one_transfer_each(counted):
    engine, calls = counted
    bufs, gpu = device_caches(engine)
    w = KVTransferWorker(engine, bufs, [[0], [1, 2]], 1, 8)
    try:
        host = host_rows(w)
        before = [h.copy() for h in host]
        r = run(w, 1, False, [4, 0, 6], [9, 1, 15], [2, 1], [0, 0])
        assert r.success and r.bytes == 2 * PAGES[0] + PAGES[1] + PAGES[2]
        assert len(calls) == 2 and {len(c[1]) for c in calls} == {1, 2}
        before[0][[4, 0]] = gpu[0][[9, 1]]
        before[1][6], before[2][6] = gpu[1][15], gpu[2][15]
        for t, (h, b) in enumerate(zip(host, before)):
            assert np.array_equal(h, b), f"tensor {t}: only its group's blocks are stored"
    finally:
        w.shutdown()


def test_submit_errors(engine):
    bufs, _ = device_caches(engine)
    w = KVTransferWorker(engine, bufs, [[0], [1, 2], []], 4, 8)
    try:

        def bad(match, *args):
            with pytest.raises(gfd.Error, match=match):
                w.submit(9, *args)

        bad("group_sizes: 2 sizes for 3 groups", False, [0], [1, 2], [1, 1], [0, 0])
        bad("block_indices: 2 indices for 3 groups", False, [0], [1, 2], [1, 1, 0], [0, 0])
        bad(
            "the sizes sum to 3, gpu_block_ids has 2 blocks",
            False,
            [0],
            [1, 2],
            [2, 1, 0],
            [0, 0, 0],
        )
        bad(
            "group 1 needs 1 chunks from position 1, 1 given",
            False,
            [0],
            [1, 2],
            [1, 1, 0],
            [0, 0, 0],
        )
        bad("3 chunks given, the groups use 2", False, [0, 1, 2], [1, 2], [1, 1, 0], [0, 0, 0])
        # Skipping 3 sub-blocks of the first chunk: 2 blocks need 2 chunks.
        bad(
            "group 0 needs 2 chunks from position 0, 1 given",
            False,
            [0],
            [1, 2],
            [2, 0, 0],
            [3, 0, 0],
        )
        bad("group 2 has blocks but no tensors", False, [0], [1], [0, 0, 1], [0, 0, 0])
        assert w.get_finished() == []  # nothing was queued
        # A job id in flight (submitted, not yet reported by get_finished) cannot be used again.
        assert w.submit(5, False, [0], [1], [1, 0, 0], [0, 0, 0])
        with pytest.raises(gfd.Error, match="job 5 is already in flight"):
            w.submit(5, False, [1], [2], [1, 0, 0], [0, 0, 0])
        w.wait([5])
        assert [r.job_id for r in w.get_finished()] == [5]
        assert run(w, 5, True, [0], [3], [1, 0, 0], [0, 0, 0]).success  # reported: free again
    finally:
        w.shutdown()
    with pytest.raises(gfd.Error, match="shut down"):
        w.submit(6, False, [0], [1], [1, 0, 0], [0, 0, 0])


def test_constructor_errors(engine):
    bufs, _ = device_caches(engine)

    def bad(match, *args, **kw):
        with pytest.raises((gfd.Error, TypeError), match=match):
            KVTransferWorker(*args, **kw)

    bad("expected a gfd.Engine", object(), bufs, [[0]], 1, 4)
    bad(r"blocks_per_chunk: 0 is out of range \[1, ", engine, bufs, [[0]], 0, 4)
    bad(r"num_chunks: -1 is out of range \[1, ", engine, bufs, [[0]], 1, -1)
    bad(r"num_chunks: 0 is out of range \[1, ", engine, bufs, [[0]], 1, 0)
    bad("no tensor given", engine, [], [[0]], 1, 4)
    bad(r"groups\[0\]\[1\]: 3 is out of range \[0, 2\]", engine, bufs, [[0, 3]], 1, 4)
    bad(r"groups\[1\]: a tensor is listed twice", engine, bufs, [[0], [1, 1]], 1, 4)
    flat = testing.device_buffer(engine, (GPU_BLOCKS * 16,), "int8")
    bad(r"gpu_caches\[0\]: expected a 2-D", engine, [flat], [[0]], 1, 4)
    wide = testing.device_buffer(engine, (GPU_BLOCKS, 16), "int32")
    bad(r"gpu_caches\[0\]: expected a byte array", engine, [wide], [[0]], 1, 4)
    bad("copy_bytes: 2 entries for 3 GPU tensors", engine, bufs, [[0]], 1, 4, copy_bytes=[1, 2])
    bad(
        r"copy_bytes\[1\]: 2048 is out of range \[1, 1024\]",
        engine,
        bufs,
        [[0]],
        1,
        4,
        copy_bytes=[8, 2048, 8],
    )
    hosts = [testing.pinned_buffer(engine, (4, p * 2), "int8") for p in PAGES]
    bad("host_caches: 2 arrays for 3 GPU tensors", engine, bufs, [[0]], 2, 4, host_caches=hosts[:2])
    short = [hosts[0], testing.pinned_buffer(engine, (3, PAGES[1] * 2), "int8"), hosts[2]]
    bad(
        r"host_caches\[1\]: expected 4 rows of 2048 bytes, got 3 x 2048",
        engine,
        bufs,
        [[0]],
        2,
        4,
        host_caches=short,
    )
    bad(
        r"host_memory: expected one of \('pool', 'torch'\), got 'mmap'",
        engine,
        bufs,
        [[0]],
        1,
        4,
        host_memory="mmap",
    )
    bad(
        r"host_layout: expected one of \('tensor', 'block'\), got 'rows'",
        engine,
        bufs,
        [[0]],
        1,
        4,
        host_layout="rows",
    )
    bad(
        "'block' allocates its own host memory",
        engine,
        bufs,
        [[0]],
        2,
        4,
        host_caches=hosts,
        host_layout="block",
    )


def test_given_host_caches_are_used(engine):
    bufs, gpu = device_caches(engine)
    hosts = [testing.pinned_buffer(engine, (4, p * 2), "int8") for p in PAGES]
    w = KVTransferWorker(engine, bufs, [[0, 1, 2]], 2, 4, host_caches=hosts)
    try:
        assert all(a is b for a, b in zip(w.host_caches, hosts)) and len(w.host_caches) == 3
        assert run(w, 1, False, [3], [5, 6], [2], [0]).success
        for h, g, p in zip(hosts, gpu, PAGES):
            assert np.array_equal(np.asarray(h)[3].reshape(2, p), g[[5, 6]])
    finally:
        w.shutdown()


def test_bad_ids_are_a_failed_job_not_an_exception(engine):
    bufs, gpu = device_caches(engine)
    w = KVTransferWorker(engine, bufs, [[0, 1, 2]], 1, 8)
    try:
        # A destination given twice: found before anything is enqueued, reported as a failed job.
        for job, to_device, chunks, blocks in [
            (1, True, [0, 1], [3, 3]),
            (2, False, [4, 4], [0, 1]),
        ]:
            r = run(w, job, to_device, chunks, blocks)
            assert not r.success and r.bytes == 0 and isinstance(r.error, gfd.Error)
        snapshot = [g.copy() for g in gpu]
        r = run(w, 3, True, [2], [4])
        assert r.success and r.error is None  # the worker goes on
        host = host_rows(w)
        for g, s, h in zip(gpu, snapshot, host):
            s[4] = h[2]
            assert np.array_equal(g, s)
    finally:
        w.shutdown()


@pytest.mark.parametrize("bpc", [2, 4])
def test_a_destination_twice_in_a_job_fails_it_whole_in_the_callers_terms(engine, bpc):
    """vLLM's region (a chunk's sub-blocks side by side per tensor in a rank's cell): a job is
    one transfer per sub-block position, each seeing only its own rows. A destination given
    twice across them (GPU block 9 from two slots of one chunk; a chunk given twice; a duplicate
    only in a later slot) fails the whole job before anything is enqueued, named in the job's
    own arguments."""
    page, tensors, chunks = 1024, 2, 6
    buf, a = region(engine, chunks, tensors * bpc * page + 4096)
    bufs, gpu = device_caches(engine, (page,) * tensors, seed=30)
    w = KVTransferWorker(
        engine, bufs, [[0, 1]], bpc, chunks, host_caches=cell_views(a, page, bpc, tensors, 0)
    )
    try:
        a[:] = np.random.default_rng(31).integers(-128, 128, a.shape, dtype=np.int8)
        host_before, gpu_before = a.copy(), [g.copy() for g in gpu]
        cases = [  # (to_device, chunk ids, GPU block ids, message)
            (
                True,
                [1],
                [9, 9] + list(range(10, 10 + bpc - 2)),
                r"submit: gpu_block_ids\[1\]: GPU block 9 is written twice in this job \(also by gpu_block_ids\[0\]\)",
            ),
            (
                True,
                [0, 1],
                list(range(12, 12 + 2 * bpc - 1)) + [12],
                rf"submit: gpu_block_ids\[{2 * bpc - 1}\]: GPU block 12 is written twice",
            ),
            (
                False,
                [4, 4],
                list(range(2 * bpc)),
                r"submit: chunk_ids\[1\]: sub-block 0 of chunk 4 is written twice in this job \(also by chunk_ids\[0\]\)",
            ),
        ]
        for job, (to_device, chunk_ids, blocks, message) in enumerate(cases):
            r = run(w, job, to_device, chunk_ids, blocks)
            assert not r.success and r.bytes == 0
            assert isinstance(r.error, gfd.InvalidArgument)
            assert re.search(message, str(r.error)), str(r.error)
        assert np.array_equal(a, host_before), "a failed job wrote host memory"
        assert all(np.array_equal(g, b) for g, b in zip(gpu, gpu_before)), (
            "a failed job wrote GPU memory"
        )
        assert engine.stats()["transfers"] == 0  # nothing was enqueued
        r = run(w, 9, True, [1], list(range(10, 10 + bpc)))  # the same job without the duplicate
        assert r.success
    finally:
        w.shutdown()


def test_wait_takes_a_set_or_list_of_job_ids(engine):
    bufs, _ = device_caches(engine)
    w = KVTransferWorker(engine, bufs, [[0, 1, 2]], 1, 8)
    try:
        for bad, what in [(None, "NoneType"), (5, "int"), ("12", "str")]:
            with pytest.raises(
                gfd.InvalidType,
                match=f"wait: job_ids: expected a set or list of job ids, got {what}",
            ):
                w.wait(bad)
        with pytest.raises(
            gfd.InvalidType, match=r"wait: job_ids\[1\]: expected an int, got float"
        ):
            w.wait([1, 2.0])
        w.wait(set())
        w.wait({3, 4})  # not in flight: nothing to wait for
    finally:
        w.shutdown()


def test_results_in_lane_order_and_wait(slow_engine):
    """With every emulated copy held 20 ms, jobs stay in flight: wait() returns once they are
    done, get_finished reports each once, in submission order per direction."""
    bufs, gpu = device_caches(slow_engine)
    w = KVTransferWorker(slow_engine, bufs, [[0, 1, 2]], 2, 8)
    try:
        for j in range(4):  # stores of blocks 2j, 2j+1 into chunk j
            assert w.submit(j, False, [j], [2 * j, 2 * j + 1])
        assert w.submit(10, True, [7], [20, 21], expedited=True)
        w.wait([0, 1, 2, 3, 10, 99])  # 99: not in flight, ignored
        done = w.get_finished()
        ids = [r.job_id for r in done]
        assert sorted(ids) == [0, 1, 2, 3, 10] and [i for i in ids if i < 10] == [0, 1, 2, 3]
        assert all(r.success and r.bytes == 2 * sum(PAGES) and r.seconds > 0 for r in done)
        assert w.get_finished() == []
        host = host_rows(w)
        for h, g in zip(host, gpu):
            assert np.array_equal(h[:8], g[:8])
    finally:
        w.shutdown()


def test_shutdown_with_jobs_in_flight(slow_engine):
    bufs, gpu = device_caches(slow_engine)
    w = KVTransferWorker(slow_engine, bufs, [[0, 1, 2]], 1, 16)
    for j in range(6):
        w.submit(j, False, [j], [j + 3])
    hosts = w.host_caches  # the worker's host arrays, held here: they outlive its shutdown
    w.shutdown()  # submits what is queued and waits for all of it
    w.shutdown()  # idempotent
    assert w.get_finished() == []  # results not collected are dropped
    for h, g in zip(hosts, gpu):
        assert np.array_equal(h[:6], g[3:9])
    # The worker let go of its host memory: its views are refused, not read after the free.
    with pytest.raises(gfd.Error, match="host_rows: the worker is shut down") as info:
        w.host_rows(0)
    assert info.value.code == "shutdown"


def test_block_layout_moves_in_place_through_a_small_ring():
    """The block layout's rows (8 tensors x 4 KB side by side) move in place both ways (chunks
    read from host memory directly: no piece for the gather threads), in transfers 12 times the
    staging ring (a ring that waits for a slot that only issuing frees would hang)."""
    e = testing.emulated_engine(
        gather_threads=2,
        direct_min_bytes=16384,
        direct_min_bytes_to_host=16384,
        staging_bytes=512 << 10,
        slot_bytes=256 << 10,
        first_chunk_bytes=64 << 10,
        piece_bytes=16 << 10,
    )
    try:
        pages = 8
        gpu = [testing.device_buffer(e, (256, 4096), "int8") for _ in range(pages)]
        w = KVTransferWorker(e, gpu, [list(range(pages))], 1, 512, host_layout="block")
        rng = np.random.default_rng(1)
        for t in range(pages):
            w.host_rows(t)[:] = rng.integers(-128, 127, (512, 4096), dtype=np.int8)
        chunks, blocks = rng.choice(512, 200, replace=False), rng.choice(256, 200, replace=False)
        w.submit(1, True, chunks, blocks)
        w.wait([1])
        assert [r.success for r in w.get_finished()] == [True]
        for t in range(pages):
            assert np.array_equal(np.asarray(gpu[t])[blocks], w.host_rows(t)[chunks]), (
                f"load, tensor {t}"
            )
        back = rng.choice(512, 200, replace=False)
        w.submit(2, False, back, blocks)
        w.wait([2])
        assert [r.success for r in w.get_finished()] == [True]
        for t in range(pages):
            assert np.array_equal(w.host_rows(t)[back], np.asarray(gpu[t])[blocks]), (
                f"store, tensor {t}"
            )
        st = e.stats()
        assert st["chunks"] > 0
        w.shutdown()
    finally:
        e.close()


def test_workers_of_both_layouts_share_one_engine():
    """Four workers on one engine, two per host layout, each storing and loading random blocks
    from its own thread: transfers moved in place (block layout) and gathered ones (tensor
    layout) interleave in the engine's ring and queue; every byte is checked."""
    e = testing.emulated_engine(
        gather_threads=2,
        direct_min_bytes=16384,
        direct_min_bytes_to_host=16384,
        staging_bytes=1 << 20,
        slot_bytes=256 << 10,
        first_chunk_bytes=64 << 10,
        piece_bytes=16 << 10,
    )
    errors = []

    def run(layout, seed):
        try:
            rng = np.random.default_rng(seed)
            gpu = [testing.device_buffer(e, (128, 4096), "int8") for _ in range(6)]
            w = KVTransferWorker(e, gpu, [list(range(6))], 1, 256, host_layout=layout)
            for t in range(6):
                w.host_rows(t)[:] = rng.integers(-128, 127, (256, 4096), dtype=np.int8)
            for job in range(30):
                n = int(rng.integers(1, 100))
                chunks, blocks = (
                    rng.choice(256, n, replace=False),
                    rng.choice(128, n, replace=False),
                )
                w.submit(job, job % 2 == 0, chunks, blocks)
                w.wait([job])
                assert [r.success for r in w.get_finished()] == [True]
                for t in range(6):
                    assert np.array_equal(np.asarray(gpu[t])[blocks], w.host_rows(t)[chunks]), (
                        layout,
                        job,
                        t,
                    )
            w.shutdown()
        except Exception as ex:  # noqa: BLE001 - reported below, with the thread's layout
            errors.append(f"{layout}: {ex!r}")

    try:
        threads = [
            threading.Thread(target=run, args=(layout, seed))
            for seed, layout in enumerate(["block", "tensor", "block", "tensor"])
        ]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        assert errors == []
        st = e.stats()
        assert st["chunks"] > 0
    finally:
        e.close()


class CudaArray:
    """GPU memory offered through __cuda_array_interface__ alone: no .dtype, no .shape."""

    def __init__(self, buf):
        self.__cuda_array_interface__ = {
            "shape": tuple(buf.shape),
            "typestr": "|i1",
            "data": (buf.ptr, False),
            "strides": None,
            "version": 3,
        }


def test_cuda_array_interface_caches_without_dtype(engine):
    bufs, gpu = device_caches(engine)
    w = KVTransferWorker(engine, [CudaArray(b) for b in bufs], [[0, 1, 2]], 1, 8)
    try:
        assert run(w, 1, False, [3], [5], [1], [0]).success
        for t, g in enumerate(gpu):
            assert np.array_equal(host_rows(w)[t][3], g[5])
    finally:
        w.shutdown()


class DeviceRows:
    """Host memory handed to gfd as a (rows, width) device array (CUDA array interface), as a
    runtime without a GPU hands over its "GPU" caches once the emulated device adopted them."""

    def __init__(self, array):
        self.array = array
        self.__cuda_array_interface__ = {
            "shape": array.shape,
            "typestr": "|i1",
            "strides": array.strides,
            "data": (array.ctypes.data, False),
            "version": 3,
        }


def test_adopted_host_memory_serves_as_the_emulated_gpus_memory(engine):
    gpu = np.random.default_rng(1).integers(-128, 128, (16, 4096), dtype=np.int8)
    host = testing.pinned_buffer(engine, (8, 4096), "int8")
    assert testing.pointer_kind(engine, gpu.ctypes.data) == "pageable"
    adopted = testing.adopt_device_memory(engine, gpu.ctypes.data, gpu.nbytes, gpu)
    try:
        assert testing.pointer_kind(engine, gpu.ctypes.data) == "device"
        with pytest.raises(gfd.Error, match="overlaps device or pinned memory already known"):
            testing.adopt_device_memory(engine, gpu.ctypes.data + 4096, 4096)
        caches = engine.register_caches([host], [DeviceRows(gpu)])
        engine.copy_blocks(caches, "to_host", [3, 9], [0, 1]).wait()
        assert np.array_equal(np.asarray(host)[:2], gpu[[3, 9]])
    finally:
        adopted.release()
        adopted.release()  # idempotent
    assert testing.pointer_kind(engine, gpu.ctypes.data) == "pageable"
    with pytest.raises(gfd.Error, match="device"):
        engine.register_caches([host], [DeviceRows(gpu)])


def test_releasing_adopted_memory_waits_for_the_copies_queued_on_it():
    # As cudaFree does: once release() returns, its owner may free the memory, so the copies
    # into it that were still queued (slow emulated copies on a stream of the caller's) have run.
    with testing.emulated_engine(copy_delay_us=20000) as e:
        gpu = np.zeros((4, 1 << 20), dtype=np.int8)
        host = testing.pinned_buffer(e, (4, 1 << 20), "int8")
        np.asarray(host)[:] = np.arange(1, 5, dtype=np.int8)[:, None]
        adopted = testing.adopt_device_memory(e, gpu.ctypes.data, gpu.nbytes, gpu)
        s = testing.create_stream(e)
        caches = e.register_caches([host], [DeviceRows(gpu)])
        e.copy_blocks(caches, "to_device", [0, 1, 2, 3], [3, 2, 1, 0], stream=s)
        adopted.release()
        assert np.array_equal(gpu[:, 0], [4, 3, 2, 1])
        testing.destroy_stream(e, s)


@pytest.mark.parametrize(
    "value,settings",
    [
        ("", None),
        ("0", None),
        ("1", {}),
        ("copy_delay_us=5,fault=copy_d2h", {"copy_delay_us": 5, "fault": "copy_d2h"}),
    ],
)
def test_emulated_device_variable(monkeypatch, value, settings):
    monkeypatch.setenv("GFD_EMULATED_DEVICE", value)
    assert testing.emulated_device_settings() == settings


@pytest.mark.parametrize("value", ["yes", "copy_delay_us=fast", "speed=3"])
def test_emulated_device_variable_rejects_what_it_cannot_read(monkeypatch, value):
    monkeypatch.setenv("GFD_EMULATED_DEVICE", value)
    with pytest.raises(gfd.Error, match="GFD_EMULATED_DEVICE="):
        testing.emulated_device_settings()


def region(engine, chunks, row):
    """A host region of ``chunks`` rows of ``row`` bytes (pinned), zeroed, and its bytes."""
    buf = testing.pinned_buffer(engine, (chunks, row), "int8")
    a = np.asarray(buf)
    a[:] = 0
    return buf, a


def cell_views(a, page, bpc, tensors, offset):
    """Per tensor, an int8 (chunks, bpc * page) view of the region whose rows are a region row
    apart: a rank's cell at ``offset``, each tensor's pages of a chunk side by side (vLLM's
    SharedOffloadRegion layout)."""
    return [
        np.lib.stride_tricks.as_strided(
            a[:, offset + t * bpc * page :], (a.shape[0], bpc * page), a.strides
        )
        for t in range(tensors)
    ]


@pytest.mark.parametrize("bpc", [1, 3])
def test_ranks_cells_in_one_region_with_any_row_stride(engine, bpc):
    """Two ranks' workers on one region: each moves its own cell of every row (a chunk's
    sub-blocks are not one stride from the next chunk's when bpc > 1: one set per position)."""
    page, tensors, chunks = 1024, 2, 6
    cell = tensors * bpc * page
    buf, a = region(engine, chunks, 2 * cell + 4096)  # padded rows, as the region aligns them
    ranks = []
    for r in range(2):
        bufs, gpu = device_caches(engine, (page,) * tensors, seed=10 + r)
        w = KVTransferWorker(
            engine,
            bufs,
            [[0, 1]],
            bpc,
            chunks,
            host_caches=cell_views(a, page, bpc, tensors, r * cell),
        )
        ranks.append((w, gpu))
    try:
        blocks = [4, 17, 2, 9, 11][: 2 * bpc if bpc > 1 else 2]
        skip = 1 if bpc > 1 else 0
        chunk_ids = [5, 0] if bpc > 1 else [5, 0]
        for r, (w, gpu) in enumerate(ranks):
            n = len(blocks) if bpc == 1 else min(len(blocks), 2 * bpc - skip)
            assert run(w, 1, False, chunk_ids, blocks[:n], [n], [skip]).success
            pages = host_block_ids(np.array(chunk_ids), bpc, n, skip)
            for b, p in zip(blocks[:n], pages):
                for t in range(tensors):
                    c, j = divmod(int(p), bpc)
                    at = r * cell + t * bpc * page + j * page
                    assert np.array_equal(a[c, at : at + page], gpu[t][b]), (r, b, t)
            assert np.array_equal(w.host_pages(0)[5, skip], gpu[0][blocks[0]])
            # And back, into other blocks.
            back = [20, 21, 22, 23, 1][:n]
            assert run(w, 2, True, chunk_ids, back, [n], [skip]).success
            for b, src in zip(back, blocks[:n]):
                assert all(np.array_equal(gpu[t][b], gpu[t][src]) for t in range(tensors))
        assert not a[:, 2 * cell :].any(), "the rows' padding was written"
        with pytest.raises(gfd.Error, match="not one stride apart") if bpc > 1 else _nothing():
            ranks[0][0].host_rows(0)
    finally:
        for w, _ in ranks:
            w.shutdown()


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_fragments_and_writer_rotation_on_a_shared_canonical_page(engine):
    """Two ranks' head shards of one canonical page (vLLM's canonical layout): rank r's page is
    4 token rows, each going to its half of the canonical token row; a store moves only those
    fragments, a load brings them back. Replicated pages (writers (2, r)): page p is written by
    rank p % 2 alone."""
    page, chunks, bpc = 1024, 4, 2
    row_bytes = page // 4  # one token's heads of this rank
    canon = 2 * page  # the canonical page: both ranks' heads
    buf, a = region(engine, chunks, canon * bpc + 4096)
    views = [a[:, : canon * bpc]]
    ranks = []
    for r in range(2):
        bufs, gpu = device_caches(engine, (page,), seed=20 + r)
        frags = [(i * row_bytes, i * 2 * row_bytes + r * row_bytes, row_bytes) for i in range(4)]
        w = KVTransferWorker(engine, bufs, [[0]], bpc, chunks, host_caches=views, fragments=[frags])
        ranks.append((w, gpu))
    try:
        for w, _gpu in ranks:
            assert run(w, 1, False, [2, 3], [6, 7, 8, 9]).success  # pages 4..7
        for p, b in zip(range(4, 8), [6, 7, 8, 9]):
            c, j = divmod(p, bpc)
            got = a[c, j * canon : (j + 1) * canon].reshape(4, 2, row_bytes)  # token, rank, bytes
            for r, (_, gpu) in enumerate(ranks):
                assert np.array_equal(got[:, r], gpu[0][b].reshape(4, row_bytes)), (p, r)
        for w, gpu in ranks:
            assert run(w, 2, True, [2, 3], [10, 11, 12, 13]).success
            assert all(
                np.array_equal(gpu[0][d], gpu[0][s]) for d, s in zip([10, 11, 12, 13], [6, 7, 8, 9])
            )
    finally:
        for w, _ in ranks:
            w.shutdown()
    # Replicated: every rank holds the same bytes; page p is written by rank p % 2 only.
    a[:] = 0
    ranks = []
    for r in range(2):
        bufs, gpu = device_caches(engine, (page,), seed=30 + r)
        w = KVTransferWorker(
            engine, bufs, [[0]], bpc, chunks, host_caches=[a[:, : page * bpc]], writers=[(2, r)]
        )
        ranks.append((w, gpu))
    try:
        results = [run(w, 1, False, [0, 1, 2], [1, 2, 3, 4, 5], [5], [1]) for w, _ in ranks]
        assert all(x.success for x in results)
        assert [x.bytes for x in results] == [2 * page, 3 * page]  # pages 2, 4 and 1, 3, 5
        for p, b in zip(range(1, 6), [1, 2, 3, 4, 5]):
            c, j = divmod(p, bpc)
            assert np.array_equal(a[c, j * page : (j + 1) * page], ranks[p % 2][1][0][b]), p
        # A load reads every page, whoever wrote it.
        w, gpu = ranks[0]
        assert run(w, 2, True, [0, 1, 2], [10, 11, 12, 13, 14], [5], [1]).success
        for p, b in zip(range(1, 6), [10, 11, 12, 13, 14]):
            assert np.array_equal(gpu[0][b], ranks[p % 2][1][0][p]), p
    finally:
        for w, _ in ranks:
            w.shutdown()


def test_bad_fragments_and_writers_name_the_argument(engine):
    bufs, _ = device_caches(engine, (1024,))
    hosts = [np.asarray(testing.pinned_buffer(engine, (4, 2048), "int8"))]

    def bad(match, **kw):
        with pytest.raises((gfd.Error, TypeError), match=match):
            KVTransferWorker(engine, bufs, [[0]], 1, 4, host_caches=hosts, **kw)

    bad(
        r"fragments\[0\]\[0\]: expected \(gpu_offset, host_offset, size\), got 2 values",
        fragments=[[(0, 0)]],
    )
    bad(
        r"fragments\[0\]\[0\]: gpu_offset: 1000 is out of range \[0, 924\]",
        fragments=[[(1000, 0, 100)]],
    )
    bad(
        r"fragments\[0\]\[0\]: host_offset: 2000 is out of range \[0, 1948\]",
        fragments=[[(0, 2000, 100)]],
    )
    bad(r"fragments\[0\]: no fragment given", fragments=[[]])
    bad("fragments: 2 entries for 1 GPU tensors", fragments=[None, None])
    bad(r"writers\[0\]: writer_index: 2 is out of range \[0, 1\]", writers=[(2, 2)])
    bad(r"writers\[0\]: num_writers: 0 is out of range", writers=[(0, 0)])
    bad(r"host_caches\[0\]: expected 4 rows of 1024 bytes, got 4 x 2048")

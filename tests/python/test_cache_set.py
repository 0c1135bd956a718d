"""CacheSet: caches registered once (Engine.register_caches) and transfers by block ids
(Engine.copy_blocks); and swap_blocks finding its set again from torch-like tensors, so that a
runtime's repeated call registers nothing (emulated device)."""

import numpy as np
import pytest

import gfd
from gfd import _testing

from test_swap import caches, expect_error, raw


class TorchLike:
    """What swap_blocks reads of a torch tensor to find its set again: data_ptr(), nbytes, and a
    weak reference; DLPack for the registration itself."""

    def __init__(self, buf):
        self._buf = buf
        self.nbytes = raw(buf).nbytes

    def data_ptr(self):
        return self._buf.ptr

    def __dlpack__(self, stream=None, **kw):
        return self._buf.__dlpack__(**kw)

    def __dlpack_device__(self):
        return self._buf.__dlpack_device__()


def layers(engine, n, host_blocks=24, dev_blocks=16, block=2048, seed=0):
    hs, ds, hv, dv = [], [], [], []
    for i in range(n):
        h, d, a, b = caches(engine, host_blocks, dev_blocks, (block,), "uint8", seed=seed + i)
        hs.append(h), ds.append(d), hv.append(a), dv.append(b)
    return hs, ds, hv, dv


def test_register_and_copy_both_ways(engine):
    hs, ds, hv, dv = layers(engine, 4)
    cs = engine.register_caches(hs, ds)
    assert cs.pairs == 4 and cs.host_pinned and cs.bytes_per_id == 4 * 2048
    assert cs.host_blocks == 24 and cs.device_blocks == 16
    m = np.array([[3, 0], [20, 7], [9, 15]], np.int64)
    expect = [d.copy() for d in dv]
    for e, h in zip(expect, hv):
        e[m[:, 1]] = h[m[:, 0]]
    engine.copy_blocks(cs, m).wait()
    assert all((d == e).all() for d, e in zip(dv, expect))
    # Out, with separate int32 id arrays: device blocks 0 and 7 to host blocks 1 and 2.
    src, dst = np.array([0, 7], np.int32), np.array([1, 2], np.int32)
    engine.copy_blocks(cs, src, dst, to_device=False).wait()
    for h, d in zip(hv, dv):
        assert (h[dst] == d[src]).all()


def test_torch_cpu_tensors_as_ids(engine):
    # Read through their numpy views: int64 and int32, a transposed (strided) mapping, separate
    # id tensors; bad ids still named by row; a float tensor refused naming the argument.
    torch = pytest.importorskip("torch")
    hs, ds, hv, dv = layers(engine, 3)
    cs = engine.register_caches(hs, ds)
    m = np.array([[3, 0], [20, 7], [9, 15]], np.int64)
    for mapping in (torch.from_numpy(m), torch.from_numpy(m).to(torch.int32),
                    torch.from_numpy(np.ascontiguousarray(m.T)).t()):
        for d in dv:
            d[:] = 0
        engine.copy_blocks(cs, mapping).wait()
        for h, d in zip(hv, dv):
            assert (d[m[:, 1]] == h[m[:, 0]]).all()
    src, dst = torch.tensor([5, 6]), torch.tensor([1, 2], dtype=torch.int32)
    engine.copy_blocks(cs, src, dst).wait()
    for h, d in zip(hv, dv):
        assert (d[[1, 2]] == h[[5, 6]]).all()
    expect_error(r"copy_blocks: block_mapping row 1 \(block 24 -> 1\): source block 24 is out of range",
                 engine.copy_blocks, cs, torch.tensor([[0, 0], [24, 1]]), block=1)
    with pytest.raises(gfd.Error, match="block_mapping"):
        engine.copy_blocks(cs, torch.tensor([[0.0, 1.0]]))


def test_copy_blocks_errors(engine):
    hs, ds, hv, dv = layers(engine, 2)
    cs = engine.register_caches(hs, ds)
    before = [d.copy() for d in dv]
    expect_error(r"copy_blocks: block_mapping row 1 \(block 24 -> 1\): source block 24 is out of range "
                 r"\(host\[0\] has 24 blocks\)", engine.copy_blocks, cs, [[0, 0], [24, 1]], block=1)
    expect_error(r"dst_indices row 2 \(block 2 -> 5\): destination block 5 is also that of "
                 r"copy_blocks: dst_indices row 0", engine.copy_blocks, cs, [0, 1, 2], [5, 6, 5], block=2)
    expect_error(r"src_indices has 2 entries, dst_indices 1", engine.copy_blocks, cs, [0, 1], [5])
    assert all((d == b).all() for d, b in zip(dv, before)), "a rejected transfer moved bytes"
    other = _testing.emulated_engine()
    try:
        expect_error(r"made by this engine", other.copy_blocks, cs, [[0, 0]])
    finally:
        other.close()


def test_register_errors(engine):
    hs, ds, _, _ = layers(engine, 2)
    expect_error(r"register_caches: host\[0\] is on cuda:0 and device\[0\] on cpu; the first must be host",
                 engine.register_caches, ds, hs)
    expect_error(r"2 host caches but 1 device", engine.register_caches, hs, ds[:1])
    expect_error(r"register_caches: device\[1\] overlaps device\[0\]", engine.register_caches, hs, [ds[0], ds[0]])
    expect_error(r"register_caches: host\[1\] overlaps host\[0\]", engine.register_caches, [hs[0], hs[0]], ds)
    h16, d16, _, _ = caches(engine, 8, 8, (1024,), "float16")
    expect_error(r"device has dtype float16, host uint8", engine.register_caches, hs[0], d16)


def test_swap_blocks_registers_torch_like_lists_once(engine):
    hs, ds, hv, dv = layers(engine, 3)
    src, dst = [TorchLike(h) for h in hs], [TorchLike(d) for d in ds]
    core = engine._core
    n0 = core._cached_sets
    rng = np.random.default_rng(5)
    for k in range(4):
        m = np.stack([rng.choice(24, 5, replace=False), rng.choice(16, 5, replace=False)], 1).astype(np.int64)
        expect = [d.copy() for d in dv]
        for e, h in zip(expect, hv):
            e[m[:, 1]] = h[m[:, 0]]
        engine.swap_blocks(src, dst, m).wait()
        assert all((d == e).all() for d, e in zip(dv, expect)), f"call {k}"
        assert core._cached_sets == n0 + 1, "the same lists are described once"
    # A list with one other tensor is another set; the first is still found.
    h2, d2, hv2, dv2 = caches(engine, 24, 16, (2048,), "uint8", seed=99)
    engine.swap_blocks(src[:2] + [TorchLike(h2)], dst[:2] + [TorchLike(d2)], [[4, 9]]).wait()
    assert (dv2[9] == hv2[4]).all()
    assert core._cached_sets == n0 + 2
    engine.swap_blocks(src, dst, [[1, 2]]).wait()
    assert core._cached_sets == n0 + 2
    # The other direction with the same tensors is a set of its own (its destinations differ).
    engine.swap_blocks(dst, src, [[2, 23]]).wait()
    assert (hv[0][23] == dv[0][2]).all()
    assert core._cached_sets == n0 + 3


def test_swap_blocks_sees_a_tensor_whose_memory_changed(engine):
    hs, ds, hv, dv = layers(engine, 1)
    src, dst = [TorchLike(hs[0])], [TorchLike(ds[0])]
    engine.swap_blocks(src, dst, [[0, 0]]).wait()
    # The same object now over other memory (torch's set_, say): found stale, registered again.
    h2, d2, hv2, dv2 = caches(engine, 24, 16, (2048,), "uint8", seed=7)
    dst[0]._buf = d2
    engine.swap_blocks(src, dst, [[3, 4]]).wait()
    assert (dv2[4] == hv[0][3]).all()


def test_swap_blocks_sees_a_tensor_whose_size_changed(engine):
    hs, ds, hv, dv = layers(engine, 1)
    src, dst = [TorchLike(hs[0])], [TorchLike(ds[0])]
    core = engine._core
    engine.swap_blocks(src, dst, [[0, 0]]).wait()
    n = core._cached_sets
    engine.swap_blocks(src, dst, [[1, 1]]).wait()
    assert core._cached_sets == n, "the same tensors are found again"
    # The same object at the same address over fewer bytes (torch's resize_ in place, say): found
    # stale, registered again.
    dst[0].nbytes -= 2048
    engine.swap_blocks(src, dst, [[2, 2]]).wait()
    assert core._cached_sets == n + 1
    assert (dv[0][2] == hv[0][2]).all()


def test_cached_sets_do_not_keep_tensors_alive(engine):
    import gc
    import weakref
    hs, ds, _, _ = layers(engine, 1)
    src, dst = TorchLike(hs[0]), TorchLike(ds[0])
    engine.swap_blocks([src], [dst], [[0, 0]]).wait()
    ref = weakref.ref(dst)
    del src, dst
    gc.collect()
    assert ref() is None

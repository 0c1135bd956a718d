"""swap_blocks (vLLM's contract), its multi-layer form and transfer_kv_all_layers: tensors in
through DLPack and the CUDA array interface, the copy list built in C++, the bytes moved, the
errors, and how long a transfer keeps its tensors (emulated device)."""

import gc
import time
import weakref

import numpy as np
import pytest

import gfd
from gfd import _testing

DTYPES = {"float16": np.float16, "float32": np.float32, "uint8": np.uint8, "int64": np.int64,
          "bfloat16": None}


def caches(engine, blocks_host, blocks_dev, block_shape, dtype, seed=0):
    """A pinned host cache and a device cache, filled with random bytes; numpy views of both."""
    host = _testing.pinned_buffer(engine, (blocks_host,) + block_shape, dtype)
    dev = _testing.device_buffer(engine, (blocks_dev,) + block_shape, dtype)
    hv, dv = raw(host), raw(dev)
    rng = np.random.default_rng(seed)
    hv[:] = rng.integers(1, 256, hv.shape, dtype=np.uint8)
    dv[:] = rng.integers(1, 256, dv.shape, dtype=np.uint8)
    return host, dev, hv, dv


def raw(buf):
    """The bytes of a buffer as a [blocks, block bytes] uint8 array."""
    a = np.asarray(buf)
    return a.view(np.uint8).reshape(a.shape[0], -1)


def mapping(rng, n_src, n_dst, n):
    return np.stack([rng.choice(n_src, n, replace=False), rng.choice(n_dst, n, replace=False)], 1).astype(np.int64)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("block_bytes", [1024, 4096, 16384, 65536])
@pytest.mark.parametrize("direction", ["in", "out"])
def test_swap_blocks_moves_the_mapped_blocks(engine, dtype, block_bytes, direction):
    item = {"float16": 2, "bfloat16": 2, "float32": 4, "uint8": 1, "int64": 8}[dtype]
    block_shape = (16, block_bytes // item // 16)
    host, dev, hv, dv = caches(engine, 48, 32, block_shape, dtype, seed=block_bytes)
    rng = np.random.default_rng(block_bytes + len(dtype))
    if direction == "in":
        m = mapping(rng, 48, 32, 20)
        expect = dv.copy()
        expect[m[:, 1]] = hv[m[:, 0]]
        engine.swap_blocks(host, dev, m).wait()
        assert (dv == expect).all()
    else:
        m = mapping(rng, 32, 48, 20)
        expect = hv.copy()
        expect[m[:, 1]] = dv[m[:, 0]]
        engine.swap_blocks(dev, host, m).wait()
        assert (hv == expect).all()


def test_every_backend(engine_b):
    host, dev, hv, dv = caches(engine_b, 40, 40, (4096,), "uint8")
    m = mapping(np.random.default_rng(1), 40, 40, 25)
    expect = dv.copy()
    expect[m[:, 1]] = hv[m[:, 0]]
    engine_b.swap_blocks(host, dev, m).wait()
    assert (dv == expect).all()


@pytest.mark.parametrize("form", ["numpy", "list", "int32", "tuple_rows", "array_interface"])
def test_mapping_forms(engine, form):
    host, dev, hv, dv = caches(engine, 8, 8, (1024,), "uint8")
    m = np.array([[1, 0], [5, 2], [7, 7]], dtype=np.int64)
    arg = {"numpy": m, "list": m.tolist(), "int32": m.astype(np.int32),
           "tuple_rows": tuple(tuple(r) for r in m.tolist()), "array_interface": ArrayIface(m)}[form]
    expect = dv.copy()
    expect[m[:, 1]] = hv[m[:, 0]]
    engine.swap_blocks(host, dev, arg).wait()
    assert (dv == expect).all()


class ArrayIface:
    """Host memory offered through __array_interface__ only."""

    def __init__(self, a):
        self.a = a
        self.__array_interface__ = a.__array_interface__


class CudaIface:
    """Device memory offered through __cuda_array_interface__ only (as Numba or CuPy do)."""

    def __init__(self, ptr, shape, typestr, strides=None, stream=None):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr, "data": (ptr, False),
                                         "strides": strides, "version": 3, "stream": stream}


def test_cuda_array_interface_and_strided_caches(engine):
    # A vLLM-style [2, blocks, ...] layer cache whose K and V halves are strided views: K of block b
    # lies at (2 b) * block, V at (2 b + 1) * block, on both sides.
    blocks, block = 12, 2048
    host = _testing.pinned_buffer(engine, (blocks, 2, block), "uint8")
    dev = _testing.device_buffer(engine, (blocks, 2, block), "uint8")
    hv, dv = np.asarray(host), np.asarray(dev)
    rng = np.random.default_rng(3)
    hv[:] = rng.integers(1, 256, hv.shape, dtype=np.uint8)
    dv[:] = 0
    m = mapping(rng, blocks, blocks, 6)
    for half in (0, 1):
        h = hv[:, half]  # numpy strided view (DLPack from numpy)
        d = CudaIface(dev.ptr + half * block, (blocks, block), "|u1", strides=(2 * block, 1))
        engine.swap_blocks(h, d, m).wait()
    expect = np.zeros_like(dv)
    expect[m[:, 1]] = hv[m[:, 0]]
    assert (dv == expect).all()


def test_cuda_array_interface_producer_stream_is_waited_for(engine):
    s = _testing.create_stream(engine)
    try:
        host, dev, hv, dv = caches(engine, 8, 8, (4096,), "uint8")
        # The "producer" stream is busy for 30 ms, then clears the device cache; the swap runs on
        # the engine's default stream, which must wait for that first.
        _testing.delay(engine, 30000, s)
        _testing.memset(engine, dev.ptr, 0, dev.nbytes, s)
        d = CudaIface(dev.ptr, (8, 4096), "|u1", stream=s)
        engine.swap_blocks(host, d, [[2, 3]]).wait()
        _testing.stream_sync(engine, s)
        assert (dv[3] == hv[2]).all()
        assert (dv[[0, 1, 2, 4, 5, 6, 7]] == 0).all()
    finally:
        _testing.destroy_stream(engine, s)


def test_multi_layer_lists_in_one_transfer(engine):
    layers = 6
    pairs = [caches(engine, 20, 16, (8, 128), "float16", seed=l) for l in range(2 * layers)]
    srcs = [p[0] for p in pairs]
    dsts = [p[1] for p in pairs]
    m = mapping(np.random.default_rng(9), 20, 16, 10)
    expects = []
    for p in pairs:
        e = p[3].copy()
        e[m[:, 1]] = p[2][m[:, 0]]
        expects.append(e)
    before = engine.stats()["transfers"]
    t = engine.swap_blocks(srcs, dsts, m)
    t.wait()
    assert engine.stats()["transfers"] == before + 1, "one transfer for every layer"
    assert t.bytes == 2 * layers * 10 * 8 * 128 * 2
    for p, e in zip(pairs, expects):
        assert (p[3] == e).all()


@pytest.mark.parametrize("with_v", [True, False])
@pytest.mark.parametrize("direction", ["in", "out"])
def test_transfer_kv_all_layers(engine, with_v, direction):
    layers = 4
    k = [caches(engine, 30, 30, (2048,), "bfloat16", seed=l) for l in range(layers)]
    v = [caches(engine, 30, 30, (2048,), "bfloat16", seed=100 + l) for l in range(layers)]
    rng = np.random.default_rng(11)
    si = rng.choice(30, 12, replace=False)
    di = rng.choice(30, 12, replace=False)
    host = lambda c: c[0]
    devc = lambda c: c[1]
    src_side, dst_side = (host, devc) if direction == "in" else (devc, host)
    src_view, dst_view = (2, 3) if direction == "in" else (3, 2)
    used = k + (v if with_v else [])
    expects = []
    for c in used:
        e = c[dst_view].copy()
        e[di] = c[src_view][si]
        expects.append(e)
    untouched = [c[dst_view].copy() for c in v]
    t = engine.transfer_kv_all_layers([src_side(c) for c in k], [dst_side(c) for c in k],
                                      [src_side(c) for c in v] if with_v else None,
                                      [dst_side(c) for c in v] if with_v else None,
                                      list(si), np.asarray(di, np.int32))
    t.wait()
    for c, e in zip(used, expects):
        assert (c[dst_view] == e).all()
    if not with_v:
        for c, before in zip(v, untouched):
            assert (c[dst_view] == before).all()


def test_empty_mapping(engine):
    host, dev, hv, dv = caches(engine, 4, 4, (1024,), "uint8")
    assert engine.swap_blocks(host, dev, np.empty((0, 2), np.int64)).wait()
    assert engine.swap_blocks(host, dev, []).wait()


# ---- errors ---------------------------------------------------------------------------------

def expect_error(match, fn, *args, block=None):
    with pytest.raises(gfd.Error, match=match) as info:
        fn(*args)
    assert info.value.code == "invalid_argument"
    if block is not None:
        assert info.value.block == block
    return info.value


def test_mapping_errors(engine):
    host, dev, hv, dv = caches(engine, 8, 4, (1024,), "uint8")
    s = engine.swap_blocks
    expect_error(r"block_mapping must have shape \[N, 2\].*\[3, 3\]", s, host, dev, np.zeros((3, 3), np.int64))
    expect_error(r"block_mapping must have shape \[N, 2\].*\[4\]", s, host, dev, np.zeros(4, np.int64))
    expect_error(r"block_mapping: dtype float32 is not an integer type|block_mapping: buffer of format 'f'",
                 s, host, dev, np.zeros((2, 2), np.float32))
    expect_error(r"row 1 .*destination block 4 is out of range \(dst has 4 blocks\)", s, host, dev,
                 [[0, 0], [1, 4]], block=1)
    expect_error(r"row 2 .*source block 9 is out of range \(src has 8 blocks\)", s, host, dev,
                 [[0, 0], [1, 1], [9, 2]], block=2)
    expect_error(r"block_mapping\[1\]\[0\]: -1 is negative", s, host, dev, [[0, 0], [-1, 1]])
    expect_error(r"block_mapping row 1 \(block -1 -> 1\): source block -1 is negative", s, host, dev,
                 np.array([[0, 0], [-1, 1]]), block=1)
    expect_error(r"rows differ in shape", s, host, dev, [[0, 0], [1]])


def test_duplicate_destination_names_the_row(engine):
    host, dev, hv, dv = caches(engine, 8, 8, (1024,), "uint8")
    dv[:] = 0
    err = expect_error(r"row (0|2) \(block (0|5) -> 1\)", engine.swap_blocks, host, dev, [[0, 1], [3, 2], [5, 1]])
    assert err.block in (0, 2)
    assert (dv == 0).all(), "nothing copied"


def test_tensor_errors(engine):
    host, dev, hv, dv = caches(engine, 8, 8, (1024,), "uint8")
    host2, dev2, _, _ = caches(engine, 8, 8, (1024,), "float16")
    host3, dev3, _, _ = caches(engine, 8, 8, (2048,), "uint8")
    s = engine.swap_blocks
    m = [[0, 0]]
    expect_error(r"dst has dtype float16, src uint8", s, host, dev2, m)
    expect_error(r"blocks of src have 1024 bytes, blocks of dst 2048", s, host, dev3, m)
    expect_error(r"src is on cpu and dst on cpu", s, host, host, m)
    expect_error(r"src is on cuda:0 and dst on cuda:0", s, dev, dev, m)
    expect_error(r"src: expected a tensor .* got str", s, "cache", dev, m)
    expect_error(r"2 source caches but 1 destination", s, [host, host], [dev], m)
    expect_error(r"dst\[1\] has dtype float16", s, [host, host], [dev, dev2], m)
    expect_error(r"src\[1\] -> dst\[1\] goes the other way", s, [host, dev], [dev, host], m)
    # Dimensions after the first must be compact.
    strided = CudaIface(dev.ptr, (8, 4, 128), "|u1", strides=(1024, 256, 1))
    expect_error(r"dst: each block must be contiguous.*dimension 1 has stride 256, expected 128",
                 s, host, strided, m)
    overlapping = CudaIface(dev.ptr, (8, 1024), "|u1", strides=(512, 1))
    expect_error(r"dst: blocks overlap", s, host, overlapping, m)
    expect_error(r"src: a cache needs a first \(block\) dimension", s, np.uint8(3), dev, m)


class RefusesDlpack:
    """A host array whose DLPack export fails (as a read-only numpy array's does) but whose array
    interface works, or (broken=True) whose __dlpack__ returns something that is not a capsule."""

    def __init__(self, array, broken=False):
        self.__array_interface__ = array.__array_interface__
        self._array, self._broken = array, broken

    def __dlpack_device__(self):
        return (1, 0)

    def __dlpack__(self, stream=None):
        if self._broken:
            return 42
        raise BufferError("cannot export a read-only array")


def test_refused_dlpack_export_falls_back_to_the_array_interface(engine):
    host, dev, hv, dv = caches(engine, 8, 8, (1024,), "uint8")
    m = np.array([[0, 3], [5, 1]], dtype=np.int64)
    expect = dv.copy()
    expect[m[:, 1]] = hv[m[:, 0]]
    engine.swap_blocks(RefusesDlpack(hv), dev, m).wait()
    assert (dv == expect).all()
    # A producer whose export returns garbage is an error, not a reason to look elsewhere.
    expect_error(r"src: __dlpack__ did not return a DLPack capsule", engine.swap_blocks,
                 RefusesDlpack(hv, broken=True), dev, m)


def test_tensor_on_another_gpu(engine):
    other = _testing.emulated_engine(ordinal=1)
    try:
        host, _, _, _ = caches(engine, 8, 8, (1024,), "uint8")
        dev1 = _testing.device_buffer(other, (8, 1024))
        expect_error(r"dst is on cuda:1, but the engine serves GPU 0", engine.swap_blocks, host, dev1, [[0, 0]])
    finally:
        other.close()


def test_kv_all_layers_errors(engine):
    host, dev, _, _ = caches(engine, 8, 8, (1024,), "uint8")
    f = engine.transfer_kv_all_layers
    expect_error(r"src_indices has 2 entries, dst_indices 1", f, [host], [dev], None, None, [0, 1], [0])
    expect_error(r"both be given or both be None", f, [host], [dev], [host], None, [0], [0])
    expect_error(r"K and V layer lists differ", f, [host], [dev], [host, host], [dev, dev], [0], [0])
    expect_error(r"src_k_layers\[1\]: expected a tensor", f, [host, None], [dev, dev], None, None, [0], [0])
    dev_v = _testing.device_buffer(engine, (8, 1024), "uint8")
    expect_error(r"src_indices row 0 \(block 5 -> 0\): source block 5 is out of range \(src_v_layers\[0\] has 4 "
                 r"blocks\)", f, [host], [dev], [_testing.pinned_buffer(engine, (4, 1024), "uint8")], [dev_v], [5], [0],
                 block=0)
    # One device tensor as both K and V: its blocks would be written twice.
    expect_error(r"dst_v_layers\[0\] overlaps dst_k_layers\[0\]", f, [host], [dev], [host], [dev], [0], [0])
    # Sources may be shared: they are only read.
    f([host], [dev], [host], [dev_v], [1], [2]).wait()


# ---- lifetime -------------------------------------------------------------------------------

class HostCache:
    """A host cache that is a plain Python object (weak-referenceable), offering its numpy
    array through __array_interface__."""

    def __init__(self, buf):
        self.buf = buf
        self.__array_interface__ = np.asarray(buf).__array_interface__


def test_transfer_keeps_its_tensors_alive(slow_engine):
    host, dev, hv, dv = caches(slow_engine, 8, 8, (4096,), "uint8")
    src = HostCache(host)
    alive = weakref.ref(src)
    _testing.delay(slow_engine, 300000)  # the transfer starts after 300 ms of work on its stream
    t = slow_engine.swap_blocks(src, dev, [[i, i] for i in range(8)])
    del src  # no cycles: freed here unless the transfer holds it
    assert not t.done()
    assert alive() is not None, "kept alive while in flight"
    t.wait()
    gc.collect()
    assert alive() is None, "released once done"


def test_dropped_handle_still_keeps_tensors_alive(slow_engine):
    host, dev, hv, dv = caches(slow_engine, 8, 8, (4096,), "uint8")
    src = HostCache(host)
    alive = weakref.ref(src)
    _testing.delay(slow_engine, 300000)
    t = slow_engine.swap_blocks(src, dev, [[i, i] for i in range(8)])
    del src, t
    assert alive() is not None, "an abandoned transfer keeps its objects until it is done"
    deadline = time.time() + 30
    while alive() is not None and time.time() < deadline:
        slow_engine.copy_to_device([], [], [])  # every submission drops finished orphans
        gc.collect()
        time.sleep(0.01)
    assert alive() is None


def test_error_and_done_release(slow_engine):
    host, dev, hv, dv = caches(slow_engine, 8, 8, (4096,), "uint8")
    src = HostCache(host)
    alive = weakref.ref(src)
    _testing.delay(slow_engine, 20000)
    t = slow_engine.swap_blocks(src, dev, [[0, 0]])
    del src
    assert t.error() is None
    gc.collect()
    assert alive() is None
    assert "done" in repr(t)

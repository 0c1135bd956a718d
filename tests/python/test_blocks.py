"""Engine.register_caches + copy_blocks on caches of every kind: tensors in through DLPack and
the (CUDA) array interface, every layer's pair in one transfer, the ids in every integer form,
the bytes moved, the errors (each naming its argument), and how long a transfer keeps its
objects alive (emulated device)."""

import gc
import time
import weakref

import gfd
import numpy as np
import pytest
from gfd import testing

DTYPES = {
    "float16": np.float16,
    "float32": np.float32,
    "uint8": np.uint8,
    "int64": np.int64,
    "bfloat16": None,
}


def caches(engine, blocks_host, blocks_dev, block_shape, dtype, seed=0):
    """A pinned host cache and a device cache, filled with random bytes; numpy views of both."""
    host = testing.pinned_buffer(engine, (blocks_host,) + block_shape, dtype)
    dev = testing.device_buffer(engine, (blocks_dev,) + block_shape, dtype)
    hv, dv = raw(host), raw(dev)
    rng = np.random.default_rng(seed)
    hv[:] = rng.integers(1, 256, hv.shape, dtype=np.uint8)
    dv[:] = rng.integers(1, 256, dv.shape, dtype=np.uint8)
    return host, dev, hv, dv


def swap(engine, src, dst, mapping, stream=None):
    """Block mapping[i, 0] of src to block mapping[i, 1] of dst (single tensors or lists), one
    way or the other: the caches registered with the host side first, then one copy_blocks."""
    srcs = src if isinstance(src, list) else [src]
    to_device = getattr(srcs[0], "is_host", True)
    m = np.asarray(mapping, dtype=np.int64).reshape(-1, 2)
    host, dev = (src, dst) if to_device else (dst, src)
    cs = engine.register_caches(host, dev)
    return engine.copy_blocks(
        cs,
        gfd.Direction.TO_DEVICE if to_device else gfd.Direction.TO_HOST,
        m[:, 0],
        m[:, 1],
        stream=stream,
    )


def raw(buf):
    """The bytes of a buffer as a [blocks, block bytes] uint8 array."""
    a = np.asarray(buf)
    return a.view(np.uint8).reshape(a.shape[0], -1)


def mapping(rng, n_src, n_dst, n):
    return np.stack(
        [rng.choice(n_src, n, replace=False), rng.choice(n_dst, n, replace=False)], 1
    ).astype(np.int64)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("block_bytes", [1024, 4096, 16384, 65536])
@pytest.mark.parametrize("direction", ["in", "out"])
def test_copy_blocks_moves_the_mapped_blocks(engine, dtype, block_bytes, direction):
    item = {"float16": 2, "bfloat16": 2, "float32": 4, "uint8": 1, "int64": 8}[dtype]
    block_shape = (16, block_bytes // item // 16)
    host, dev, hv, dv = caches(engine, 48, 32, block_shape, dtype, seed=block_bytes)
    rng = np.random.default_rng(block_bytes + len(dtype))
    if direction == "in":
        m = mapping(rng, 48, 32, 20)
        expect = dv.copy()
        expect[m[:, 1]] = hv[m[:, 0]]
        swap(engine, host, dev, m).wait()
        assert (dv == expect).all()
    else:
        m = mapping(rng, 32, 48, 20)
        expect = hv.copy()
        expect[m[:, 1]] = dv[m[:, 0]]
        swap(engine, dev, host, m).wait()
        assert (hv == expect).all()


def test_every_backend(engine_b):
    host, dev, hv, dv = caches(engine_b, 40, 40, (4096,), "uint8")
    m = mapping(np.random.default_rng(1), 40, 40, 25)
    expect = dv.copy()
    expect[m[:, 1]] = hv[m[:, 0]]
    swap(engine_b, host, dev, m).wait()
    assert (dv == expect).all()


@pytest.mark.parametrize("form", ["numpy", "list", "int32", "tuple_rows", "array_interface"])
def test_mapping_forms(engine, form):
    host, dev, hv, dv = caches(engine, 8, 8, (1024,), "uint8")
    m = np.array([[1, 0], [5, 2], [7, 7]], dtype=np.int64)
    arg = {
        "numpy": m,
        "list": m.tolist(),
        "int32": m.astype(np.int32),
        "tuple_rows": tuple(tuple(r) for r in m.tolist()),
        "array_interface": ArrayIface(m),
    }[form]
    expect = dv.copy()
    expect[m[:, 1]] = hv[m[:, 0]]
    cs = engine.register_caches([host], [dev])
    if form == "array_interface":
        s, d = ArrayIface(m[:, 0].copy()), ArrayIface(m[:, 1].copy())
    elif form == "tuple_rows":
        s, d = tuple(m[:, 0].tolist()), tuple(m[:, 1].tolist())
    elif form == "list":
        s, d = m[:, 0].tolist(), m[:, 1].tolist()
    else:  # numpy arrays: the mapping's columns, strided views read in place
        s, d = arg[:, 0], arg[:, 1]
    engine.copy_blocks(cs, "to_device", s, d).wait()
    assert (dv == expect).all()


class ArrayIface:
    """Host memory offered through __array_interface__ only."""

    def __init__(self, a):
        self.a = a
        self.__array_interface__ = a.__array_interface__


class CudaIface:
    """Device memory offered through __cuda_array_interface__ only (as Numba or CuPy do)."""

    def __init__(self, ptr, shape, typestr, strides=None, stream=None):
        self.__cuda_array_interface__ = {
            "shape": tuple(shape),
            "typestr": typestr,
            "data": (ptr, False),
            "strides": strides,
            "version": 3,
            "stream": stream,
        }


def test_cuda_array_interface_and_strided_caches(engine):
    # A vLLM-style [2, blocks, ...] layer cache whose K and V halves are strided views: K of block b
    # lies at (2 b) * block, V at (2 b + 1) * block, on both sides.
    blocks, block = 12, 2048
    host = testing.pinned_buffer(engine, (blocks, 2, block), "uint8")
    dev = testing.device_buffer(engine, (blocks, 2, block), "uint8")
    hv, dv = np.asarray(host), np.asarray(dev)
    rng = np.random.default_rng(3)
    hv[:] = rng.integers(1, 256, hv.shape, dtype=np.uint8)
    dv[:] = 0
    m = mapping(rng, blocks, blocks, 6)
    for half in (0, 1):
        h = hv[:, half]  # numpy strided view (DLPack from numpy)
        d = CudaIface(dev.ptr + half * block, (blocks, block), "|u1", strides=(2 * block, 1))
        swap(engine, h, d, m).wait()
    expect = np.zeros_like(dv)
    expect[m[:, 1]] = hv[m[:, 0]]
    assert (dv == expect).all()


def test_multi_layer_lists_in_one_transfer(engine):
    layers = 6
    pairs = [caches(engine, 20, 16, (8, 128), "float16", seed=i) for i in range(2 * layers)]
    srcs = [p[0] for p in pairs]
    dsts = [p[1] for p in pairs]
    m = mapping(np.random.default_rng(9), 20, 16, 10)
    expects = []
    for p in pairs:
        e = p[3].copy()
        e[m[:, 1]] = p[2][m[:, 0]]
        expects.append(e)
    before = engine.stats()["transfers"]
    t = swap(engine, srcs, dsts, m)
    t.wait()
    assert engine.stats()["transfers"] == before + 1, "one transfer for every layer"
    assert t.bytes == 2 * layers * 10 * 8 * 128 * 2
    for p, e in zip(pairs, expects):
        assert (p[3] == e).all()


@pytest.mark.parametrize("with_v", [True, False])
@pytest.mark.parametrize("direction", ["in", "out"])
def test_every_layer_k_and_v_in_one_transfer(engine, with_v, direction):
    layers = 4
    k = [caches(engine, 30, 30, (2048,), "bfloat16", seed=i) for i in range(layers)]
    v = [caches(engine, 30, 30, (2048,), "bfloat16", seed=100 + i) for i in range(layers)]
    rng = np.random.default_rng(11)
    si = rng.choice(30, 12, replace=False)
    di = rng.choice(30, 12, replace=False)
    src_view, dst_view = (2, 3) if direction == "in" else (3, 2)
    used = k + (v if with_v else [])
    expects = []
    for c in used:
        e = c[dst_view].copy()
        e[di] = c[src_view][si]
        expects.append(e)
    untouched = [c[dst_view].copy() for c in v]
    cs = engine.register_caches([c[0] for c in used], [c[1] for c in used])
    t = engine.copy_blocks(
        cs, "to_device" if direction == "in" else "to_host", list(si), np.asarray(di, np.int32)
    )
    t.wait()
    for c, e in zip(used, expects):
        assert (c[dst_view] == e).all()
    if not with_v:
        for c, before in zip(v, untouched):
            assert (c[dst_view] == before).all()


def test_empty_ids(engine):
    host, dev, hv, dv = caches(engine, 4, 4, (1024,), "uint8")
    cs = engine.register_caches(host, dev)
    assert engine.copy_blocks(cs, "to_device", np.empty(0, np.int64), np.empty(0, np.int32)).wait()
    assert engine.copy_blocks(cs, "to_host", [], []).wait()


# ---- errors ---------------------------------------------------------------------------------


def expect_error(match, fn, *args, block=None):
    with pytest.raises(gfd.Error, match=match) as info:
        fn(*args)
    assert info.value.code == "invalid_argument"
    if block is not None:
        assert info.value.block == block
    return info.value


def test_duplicate_destination_names_the_row(engine):
    host, dev, hv, dv = caches(engine, 8, 8, (1024,), "uint8")
    dv[:] = 0
    cs = engine.register_caches(host, dev)
    err = expect_error(
        r"dst_ids\[(0|2)\] \(block (0|5) -> 1\)",
        engine.copy_blocks,
        cs,
        "to_device",
        [0, 3, 5],
        [1, 2, 1],
    )
    assert err.block in (0, 2)
    assert (dv == 0).all(), "nothing copied"


def test_tensor_errors(engine):
    host, dev, hv, dv = caches(engine, 8, 8, (1024,), "uint8")
    host2, dev2, _, _ = caches(engine, 8, 8, (1024,), "float16")
    host3, dev3, _, _ = caches(engine, 8, 8, (2048,), "uint8")
    r = engine.register_caches
    expect_error(r"register_caches: device has dtype float16, host uint8", r, host, dev2)
    expect_error(r"register_caches: host has blocks of 1024 bytes, device of 2048", r, host, dev3)
    expect_error(r"register_caches: device is on cpu", r, host, host)
    expect_error(r"register_caches: host is on cuda:0", r, dev, dev)
    expect_error(
        r"register_caches: host: expected a tensor or a list of tensors, got str", r, "cache", dev
    )
    expect_error(r"2 host caches but 1 device caches", r, [host, host], [dev])
    expect_error(r"device\[1\] has dtype float16", r, [host, host], [dev, dev2])
    expect_error(r"register_caches: host\[1\] is on cuda:0", r, [host, dev], [dev, host])
    expect_error(r"register_caches: host\[1\]: expected a tensor", r, [host, None], [dev, dev])
    # Dimensions after the first must be compact.
    strided = CudaIface(dev.ptr, (8, 4, 128), "|u1", strides=(1024, 256, 1))
    expect_error(
        r"device: each block must be contiguous.*dimension 1 has stride 256, expected 128",
        r,
        host,
        strided,
    )
    overlapping = CudaIface(dev.ptr, (8, 1024), "|u1", strides=(512, 1))
    expect_error(r"device: blocks overlap", r, host, overlapping)
    expect_error(r"host: a cache needs a first \(block\) dimension", r, np.uint8(3), dev)
    # One device tensor registered twice: its blocks would be written twice by one transfer.
    expect_error(
        r"device\[1\].*device\[0\]|device\[0\].*device\[1\]",
        r,
        [host, caches(engine, 8, 8, (1024,), "uint8")[0]],
        [dev, dev],
    )


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
    swap(engine, RefusesDlpack(hv), dev, m).wait()
    assert (dv == expect).all()
    # A producer whose export returns garbage is an error, not a reason to look elsewhere.
    expect_error(
        r"host: __dlpack__ did not return a DLPack capsule",
        engine.register_caches,
        RefusesDlpack(hv, broken=True),
        dev,
    )


def test_tensor_on_another_gpu(engine):
    other = testing.emulated_engine(ordinal=1)
    try:
        host, _, _, _ = caches(engine, 8, 8, (1024,), "uint8")
        dev1 = testing.device_buffer(other, (8, 1024))
        expect_error(
            r"device is on cuda:1, but the engine serves GPU 0", engine.register_caches, host, dev1
        )
    finally:
        other.close()


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
    testing.delay(slow_engine, 300000)  # the transfer starts after 300 ms of work on its stream
    cs = slow_engine.register_caches(src, dev)
    t = slow_engine.copy_blocks(cs, "to_device", list(range(8)), list(range(8)))
    del src, cs  # no cycles: freed here unless the transfer holds them
    assert not t.done()
    assert alive() is not None, "kept alive while in flight"
    t.wait()
    gc.collect()
    assert alive() is None, "released once done"


def test_dropped_handle_still_keeps_tensors_alive(slow_engine):
    host, dev, hv, dv = caches(slow_engine, 8, 8, (4096,), "uint8")
    src = HostCache(host)
    alive = weakref.ref(src)
    testing.delay(slow_engine, 300000)
    cs = slow_engine.register_caches(src, dev)
    t = slow_engine.copy_blocks(cs, "to_device", list(range(8)), list(range(8)))
    del src, t, cs
    assert alive() is not None, "an abandoned transfer keeps its objects until it is done"
    deadline = time.time() + 30
    while alive() is not None and time.time() < deadline:
        slow_engine.copy_to_device([], [], [])  # every submission drops finished orphans
        gc.collect()
        time.sleep(0.01)
    assert alive() is None


def test_caches_dropped_by_their_owner_in_flight_are_let_go_when_the_engine_closes():
    """The owner drops its tensors, the cache set and the handle with a transfer in flight (a
    runtime ending): the transfer keeps them until it is done; closing the engine waits for it
    and lets them go, with no later submission needed."""
    e = testing.emulated_engine(copy_delay_us=20000)
    host, dev, hv, dv = caches(e, 8, 8, (4096,), "uint8")
    hv[:] = 7
    src = HostCache(host)
    alive = weakref.ref(src)
    cs = e.register_caches(src, dev)
    t = e.copy_blocks(cs, "to_device", list(range(8)), list(range(8)))
    del src, cs, t, host
    gc.collect()
    assert alive() is not None, "kept while in flight"
    e.close()
    gc.collect()
    assert alive() is None, "let go when the engine closed"
    assert (dv == 7).all()


def test_dropped_list_of_transfers_keeps_tensors_alive_until_done(slow_engine):
    # A list call's handles dropped at once (as a runtime that acknowledges by stream events
    # does): every set's objects stay until its transfer is done, and a later list call lets
    # them go.
    host, dev, hv, dv = caches(slow_engine, 8, 8, (4096,), "uint8")
    host2, dev2, _, _ = caches(slow_engine, 8, 8, (4096,), "uint8")
    src = HostCache(host)
    alive = weakref.ref(src)
    testing.delay(slow_engine, 300000)
    sets = [slow_engine.register_caches(src, dev), slow_engine.register_caches(host2, dev2)]
    slow_engine.copy_blocks(sets, "to_device", list(range(8)), list(range(8)))
    del src, sets
    gc.collect()
    assert alive() is not None, "an abandoned transfer keeps its objects until it is done"
    other = [slow_engine.register_caches(host2, dev2)]
    deadline = time.time() + 30
    while alive() is not None and time.time() < deadline:
        slow_engine.copy_blocks(other, "to_device", [0], [0]).pop().wait()
        gc.collect()
    assert alive() is None, "released by a later submission once done"


def test_error_and_done_release(slow_engine):
    host, dev, hv, dv = caches(slow_engine, 8, 8, (4096,), "uint8")
    src = HostCache(host)
    alive = weakref.ref(src)
    testing.delay(slow_engine, 20000)
    cs = slow_engine.register_caches(src, dev)
    t = slow_engine.copy_blocks(cs, "to_device", [0], [0])
    del src, cs
    assert t.error() is None
    gc.collect()
    assert alive() is None
    assert "done" in repr(t)

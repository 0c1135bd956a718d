"""copy_to_device / copy_to_host with integer arrays: argument forms, bytes moved, errors, streams
and ordering (emulated device, every backend)."""

import array
import threading
import time

import gfd
import numpy as np
import pytest
from gfd import testing

BLOCK = 4096


def setup_blocks(engine, n=64, seed=0):
    rng = np.random.default_rng(seed)
    host = testing.pinned_buffer(engine, (2 * n, BLOCK))
    dev = testing.device_buffer(engine, (n, BLOCK))
    h = np.asarray(host)
    h[:] = rng.integers(1, 256, h.shape, dtype=np.uint8)
    src_rows = rng.permutation(2 * n)[:n]
    dst_rows = rng.permutation(n)
    src = host.ptr + src_rows.astype(np.uint64) * BLOCK
    dst = dev.ptr + dst_rows.astype(np.uint64) * BLOCK
    return host, dev, h, src_rows, dst_rows, src, dst


def test_copy_to_device_numpy(engine_b):
    host, dev, h, sr, dr, src, dst = setup_blocks(engine_b)
    t = engine_b.copy_to_device(src, dst, np.full(len(src), BLOCK, dtype=np.int64))
    assert t.wait() is True
    assert t.done() and t.error() is None
    assert t.bytes == len(src) * BLOCK
    d = np.asarray(dev)
    assert (d[dr] == h[sr]).all()


@pytest.mark.parametrize(
    "form", ["list", "tuple", "int32_sizes", "array_module", "scalar_size", "strided", "uint64"]
)
def test_argument_forms(engine, form):
    host, dev, h, sr, dr, src, dst = setup_blocks(engine, n=32)
    sizes = np.full(len(src), BLOCK, dtype=np.int64)
    if form == "list":
        src, dst, sizes = [int(x) for x in src], [int(x) for x in dst], [BLOCK] * len(src)
    elif form == "tuple":
        src, dst, sizes = (
            tuple(int(x) for x in src),
            tuple(int(x) for x in dst),
            (BLOCK,) * len(src),
        )
    elif form == "int32_sizes":
        sizes = sizes.astype(np.int32)
    elif form == "array_module":
        src, dst = array.array("Q", src.tolist()), array.array("Q", dst.tolist())
        sizes = array.array("l", sizes.tolist())
    elif form == "scalar_size":
        sizes = BLOCK
    elif form == "strided":
        both = np.stack([src, dst], axis=1).astype(np.int64)  # columns: strided views
        src, dst = both[:, 0], both[:, 1]
        assert not src.flags.c_contiguous
    elif form == "uint64":
        src, dst = src.astype(np.uint64), dst.astype(np.uint64)
    engine.copy_to_device(src, dst, sizes).wait()
    assert (np.asarray(dev)[dr] == h[sr]).all()


def test_copy_to_host(engine_b):
    if engine_b.options()["backend"] == "zero_copy_kernel":
        pytest.skip("zero_copy_kernel moves host to device only")
    host, dev, h, sr, dr, src, dst = setup_blocks(engine_b)
    d = np.asarray(dev)
    d[:] = np.random.default_rng(5).integers(1, 256, d.shape, dtype=np.uint8)
    h[:] = 0
    engine_b.copy_to_host(dst, src, BLOCK).wait()
    assert (h[sr] == d[dr]).all()
    others = np.setdiff1d(np.arange(h.shape[0]), sr)
    assert (h[others] == 0).all()


def test_empty_transfer(engine):
    t = engine.copy_to_device([], [], [])
    assert t.wait() and t.bytes == 0
    t = engine.copy_to_host(np.empty(0, np.uint64), np.empty(0, np.uint64), np.empty(0, np.uint64))
    assert t.wait()


@pytest.mark.parametrize(
    "bad,match",
    [
        (dict(src=np.zeros(3, np.float64)), "src_ptrs.*float64|src_ptrs.*integer"),
        (dict(dst=np.zeros((3, 2), np.int64)), "1-D"),
        (dict(sizes=[1, 2]), "sizes has 2 entries"),
        (dict(dst=[1, 2]), "dst_ptrs 2"),
        (dict(src=[1 << 20, -2, 3]), "src_ptrs\\[1\\].*negative"),
        (dict(src="abc"), "src_ptrs: expected an array of integers"),
        (dict(sizes=[1.0, 2.0, 3.0]), "sizes\\[0\\]: expected an int"),
        (dict(src=np.array([1 << 20, -2, 3], np.int64)), "src_ptrs\\[1\\]: -2 is negative"),
    ],
)
def test_argument_errors_name_the_argument(engine, bad, match):
    args = dict(src=[1 << 20, 2 << 20, 3 << 20], dst=[4 << 20, 5 << 20, 6 << 20], sizes=[7, 8, 9])
    args.update(bad)
    with pytest.raises(gfd.Error, match=match) as info:
        engine.copy_to_device(args["src"], args["dst"], args["sizes"])
    assert info.value.code == "invalid_argument"


def test_bad_block_names_its_index_and_copies_nothing(engine):
    host, dev, h, sr, dr, src, dst = setup_blocks(engine, n=16)
    np.asarray(dev)[:] = 0
    src = src.copy()
    src[9] = 0  # null source
    with pytest.raises(gfd.Error) as info:
        engine.copy_to_device(src, dst, BLOCK)
    assert info.value.code == "invalid_argument"
    assert info.value.block == 9
    assert "9" in str(info.value)
    time.sleep(0.01)
    assert (np.asarray(dev) == 0).all()


def test_destination_not_on_the_device(engine):
    host, dev, h, sr, dr, src, dst = setup_blocks(engine, n=8)
    dst = dst.copy()
    dst[3] = host.ptr  # host memory as a destination
    with pytest.raises(gfd.Error) as info:
        engine.copy_to_device(src, dst, BLOCK)
    assert info.value.block == 3


class CudaStreamProtocol:
    def __init__(self, handle):
        self.handle = handle

    def __cuda_stream__(self):
        return (0, self.handle)


class TorchLikeStream:
    def __init__(self, handle):
        self.cuda_stream = handle


@pytest.mark.parametrize("kind", ["int", "protocol", "torch_like"])
def test_stream_forms_and_ordering(engine, kind):
    # On stream S: a 30 ms hold, then a memset of the destination, then the transfer, then a read
    # back. Only if gfd waits for the memset and the read waits for gfd are the bytes right.
    s = testing.create_stream(engine)
    try:
        stream = {"int": s, "protocol": CudaStreamProtocol(s), "torch_like": TorchLikeStream(s)}[
            kind
        ]
        host, dev, h, sr, dr, src, dst = setup_blocks(engine, n=32)
        back = np.zeros_like(np.asarray(dev))
        testing.delay(engine, 30000, s)
        testing.memset(engine, dev.ptr, 0, dev.nbytes, s)
        t = engine.copy_to_device(src, dst, BLOCK, stream=stream)
        testing.copy(engine, back.ctypes.data, dev.ptr, dev.nbytes, to_device=False, stream=s)
        testing.stream_sync(engine, s)
        t.wait()
        assert (back[dr] == h[sr]).all()
    finally:
        testing.destroy_stream(engine, s)


def test_stream_of_the_wrong_type(engine):
    with pytest.raises(TypeError, match="stream"):
        engine.copy_to_device([], [], [], stream="default")
    with pytest.raises(TypeError, match="stream"):
        engine.copy_to_device([], [], [], stream=1.5)


@pytest.mark.parametrize("n", [4, 64])  # whole on the caller's stream, and planned in stretches
def test_a_stream_handle_the_emulated_device_never_made_is_refused(engine_b, n):
    """A made-up handle (or one destroyed) would crash the process if followed: the emulated
    device knows its streams and refuses it, naming it, as the call's error or the transfer's
    (where the device is first asked to queue on it after the call returned, as a CUDA error
    would be); nothing is written, the engine goes on."""
    host, dev, h, sr, dr, src, dst = setup_blocks(engine_b, n=n)
    d = np.asarray(dev)
    d[:] = 0
    gone = testing.create_stream(engine_b)
    testing.destroy_stream(engine_b, gone)
    cs = engine_b.register_caches(host, dev)
    calls = [
        lambda s: engine_b.copy_to_device(src, dst, BLOCK, stream=s),
        lambda s: engine_b.copy_blocks(cs, "to_device", list(range(n)), list(range(n)), stream=s),
    ]
    if engine_b.options()["backend"] != "zero_copy_kernel":  # it moves host to device only
        calls.append(lambda s: engine_b.copy_to_host(dst, src, BLOCK, stream=s))
    for stream in (0x1234, gone):
        for call in calls:
            with pytest.raises(
                gfd.InvalidArgument, match="stream 0x[0-9a-f]+: not a stream of the emulated device"
            ):
                call(stream).wait()
    assert not d.any(), "a refused call wrote device memory"
    engine_b.copy_to_device(src, dst, BLOCK).wait()
    assert (d[dr] == h[sr]).all()


def test_wait_timeout_and_gil_released(slow_engine):
    host, dev, h, sr, dr, src, dst = setup_blocks(slow_engine, n=8)
    slow_engine.options()
    testing.delay(slow_engine, 100000)  # 100 ms of work on the stream first
    t = slow_engine.copy_to_device(src, dst, BLOCK)
    assert t.wait(timeout=0) is False
    assert t.wait(timeout=0.001) is False
    # Another thread keeps running Python while this one waits.
    ticks = []
    stop = threading.Event()

    def tick():
        while not stop.is_set():
            ticks.append(1)
            time.sleep(0.001)

    th = threading.Thread(target=tick)
    th.start()
    assert t.wait() is True
    stop.set()
    th.join()
    assert t.done()
    assert len(ticks) > 3


def test_fault_reported_through_the_transfer():
    e = testing.emulated_engine(
        fault="copy_d2h", **{"gather_threads": 2, "staging_bytes": 1 << 20, "slot_bytes": 256 << 10}
    )
    try:
        host, dev, h, sr, dr, src, dst = setup_blocks(e, n=64)
        try:
            t = e.copy_to_host(dst, src, BLOCK)
        except gfd.Error as err:  # the fault may surface at submission already
            assert err.code == "cuda"
            return
        err = t.error()
        assert isinstance(err, gfd.Error) and err.code == "cuda"
        assert "fault" in str(err)
        with pytest.raises(gfd.Error):
            t.wait()
    finally:
        try:
            e.close()
        except gfd.Error:
            pass

"""The bad-input contract of the Python API (docs/python.md, "Bad input"), one test per kind of
input that once broke it: wrap-around, non-integers taken as integers, sizes that wrap, work
in proportion to a call that is rejected anyway, exceptions that were not gfd.Error, messages
naming the wrong argument, and host pointers outside the user address space (emulated device)."""

import time
import tracemalloc

import gfd
import numpy as np
import pytest
from gfd import testing
from gfd.kv_worker import KVTransferWorker

MiB = 1 << 20


def rejects(fn, *args, match=None, kind=gfd.InvalidArgument, **kw):
    with pytest.raises(kind, match=match) as info:
        fn(*args, **kw)
    assert isinstance(info.value, gfd.Error) and info.value.code == "invalid_argument"
    return info.value


@pytest.fixture
def cached(engine):
    """8 host blocks and 8 device blocks of 1 KiB, registered; numpy views of both."""
    host = testing.pinned_buffer(engine, (8, 1024), "uint8")
    dev = testing.device_buffer(engine, (8, 1024), "uint8")
    h, d = np.asarray(host), np.asarray(dev)
    h[:] = np.arange(8, dtype=np.uint8)[:, None] + 1
    d[:] = 0xEE
    return engine.register_caches(host, dev), h, d


@pytest.fixture
def worker(engine):
    gpu = [testing.device_buffer(engine, (16, 256), "int8") for _ in range(2)]
    w = KVTransferWorker(engine, gpu, [[0, 1]], 4, 4)
    for t in range(2):
        w.host_rows(t)[:] = np.arange(16, dtype=np.int8)[:, None]
    yield w, gpu
    w.shutdown()


# 1. Wrap-around: ids whose host row would wrap are rejected in the call, nothing moves.


def test_chunk_ids_that_would_wrap_are_rejected(worker):
    w, gpu = worker
    before = [w.host_rows(t).copy() for t in range(2)]
    rejects(
        w.submit,
        1,
        False,
        [2**62],
        [0, 1, 2, 3],
        match=r"submit: chunk_ids\[0\]: 4611686018427387904 is out "
        r"of range \(the worker has 4 chunks\)",
    )
    rejects(
        w.submit,
        2,
        True,
        np.array([2**63 + 1], np.uint64),
        [0, 1, 2, 3],
        match=r"submit: chunk_ids\[0\]: 9223372036854775809 is out of range",
    )
    rejects(w.submit, 3, True, [-1], [0, 1, 2, 3], match=r"chunk_ids\[0\]: -1 is negative")
    rejects(
        w.submit,
        4,
        True,
        [0],
        [0, 1, 2, 16],
        match=r"gpu_block_ids\[3\]: 16 is out of range \(the GPU caches "
        r"have 16 blocks\)",
    )
    time.sleep(0.01)
    assert w.get_finished() == []
    assert all(np.array_equal(w.host_rows(t), b) for t, b in zip(range(2), before))


# 2. Non-integers: bool and float rejected everywhere, in lists too, and the direction is
#    spelled, never guessed from a falsy value.


def test_bools_and_floats_are_not_integers(engine, cached, worker):
    cs, h, d = cached
    c = engine.copy_blocks
    rejects(
        c,
        cs,
        "to_device",
        [True, False],
        [0, 1],
        kind=gfd.InvalidType,
        match=r"src_ids\[0\]: expected an int, got bool",
    )
    rejects(
        c,
        cs,
        "to_device",
        [0, 1],
        [1.0, 2.0],
        kind=gfd.InvalidType,
        match=r"dst_ids\[0\]: expected an int, got float",
    )
    rejects(
        c,
        cs,
        "to_device",
        np.array([0.0]),
        [1],
        kind=gfd.InvalidType,
        match="src_ids: float64 is not an integer",
    )
    rejects(
        c,
        cs,
        "to_device",
        np.array([True]),
        [1],
        kind=gfd.InvalidType,
        match="src_ids: bool is not an integer",
    )
    rejects(c, cs, None, [0], [1], kind=gfd.InvalidType, match="direction: expected")
    rejects(c, cs, 0, [0], [1], kind=gfd.InvalidType, match="direction: expected")
    n = 4
    rejects(
        engine.copy_to_device,
        [1 << 20] * n,
        [2 << 20] * n,
        [True] * n,
        kind=gfd.InvalidType,
        match=r"copy_to_device: sizes\[0\]: expected an int, got bool",
    )
    rejects(
        engine.copy_to_device,
        [1 << 20],
        [2 << 20],
        True,
        kind=gfd.InvalidType,
        match=r"sizes: expected an int, got bool",
    )
    w, _ = worker
    rejects(
        w.submit,
        1,
        True,
        [0.5],
        [0, 1, 2, 3],
        kind=gfd.InvalidType,
        match=r"chunk_ids\[0\]: expected an int",
    )
    rejects(
        w.submit,
        2,
        True,
        [0],
        [0.0, 1.9, 2, 3],
        kind=gfd.InvalidType,
        match=r"gpu_block_ids\[0\]: expected an int",
    )
    rejects(
        w.submit,
        3,
        True,
        [0],
        [0, 1],
        [1.5, 0.5],
        kind=gfd.InvalidType,
        match=r"group_sizes\[0\]: expected an int",
    )
    rejects(w.submit, 4, True, [0], [0, 1], [3, -1], match=r"group_sizes\[1\]: -1 is negative")
    rejects(
        w.submit,
        5,
        1,
        [0],
        [0, 1],
        kind=gfd.InvalidType,
        match="submit: to_device: expected a bool",
    )
    assert (d == 0xEE).all()
    assert w.get_finished() == []


# 3. Sizes that wrap.


def test_sizes_that_would_wrap(engine):
    rejects(
        gfd.HostPool,
        2**64 - 1,
        device=-1,
        register=False,
        match=r"HostPool: bytes: 18446744073709551615 is out of range",
    )
    rejects(
        gfd.HostPool,
        2**64,
        device=-1,
        register=False,
        match=r"HostPool: bytes: an integer beyond 64 bits",
    )
    pool = gfd.HostPool(2 * MiB, device=-1, register=False)
    assert pool.bytes == 2 * MiB and pool.data % (2 * MiB) == 0
    rejects(
        pool.view,
        (2**62, 4),
        "uint8",
        match=r"view: shape: the shape has more bytes than an address space",
    )
    rejects(
        pool.view, (2**20, 4), "uint8", match=r"view: shape: 4194304 bytes at offset 0 do not fit"
    )
    rejects(pool.view, (4,), "uint8", 2**64, match=r"view: offset: .* is out of range")
    rejects(gfd.empty_pinned, (2**40, 2**40), "uint8", match="empty_pinned: shape")
    rejects(testing.device_buffer, engine, (2**62, 8), "uint8", match=r"device_buffer: shape")


# 4. Cheap checks first: a mapping longer than the destination has blocks is rejected before any
#    work in proportion to it, and the call leaves no buffer of its size behind.


def test_a_huge_mapping_is_rejected_at_once(engine, cached):
    cs, h, d = cached
    ids = np.zeros(10**7, np.int64)  # 80 MB each: the arrays themselves are the caller's
    uids = ids.astype(np.uint64)
    tracemalloc.start()
    rejects(
        engine.copy_blocks,
        cs,
        "to_device",
        ids,
        ids,
        match=r"copy_blocks: dst_ids: 10000000 ids, but device "
        r"has 8 blocks",
    )
    rejects(engine.copy_blocks, cs, "to_device", uids, uids, match="dst_ids: 10000000 ids")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < MiB
    assert (d == 0xEE).all()
    engine.copy_blocks(cs, "to_device", [1], [2]).wait()  # usable after
    assert (d[2] == 2).all()


# 5. Every exception is a gfd.Error (InvalidType where Python expects a TypeError).


@pytest.mark.parametrize(
    "call",
    [
        lambda e, cs: e.copy_to_device([2**64], [1 << 20], [8]),
        lambda e, cs: e.copy_to_device([1 << 20], [1 << 21], [2**70]),
        lambda e, cs: e.copy_blocks(cs, "to_device", [2**64], [0]),
        lambda e, cs: e.copy_to_device(None, [1], [1]),
        lambda e, cs: e.copy_to_device("abc", [1], [1]),
        lambda e, cs: e.copy_to_device([1], [1], 1.5),
        lambda e, cs: e.copy_to_device([], [], [], stream=2**64),
        lambda e, cs: e.copy_to_device([], [], [], stream=-1),
        lambda e, cs: e.copy_to_device([], [], [], stream=1.0),
        lambda e, cs: e.copy_to_device([], [], [], stream="s"),
        lambda e, cs: e.copy_blocks(cs, "to_device", None, [0]),
        lambda e, cs: e.copy_blocks(None, "to_device", [0], [0]),
        lambda e, cs: e.register_caches(None, None),
        lambda e, cs: e.register_caches("host", "device"),
        lambda e, cs: e.register_caches([1.5], [2.5]),
        lambda e, cs: gfd.HostPool(None),
        lambda e, cs: gfd.HostPool("1M", device=-1, register=False),
        lambda e, cs: gfd.HostPool(MiB, device=1.0, register=False),
        lambda e, cs: gfd.HostPool(MiB, device=-1, register=None),
        lambda e, cs: gfd.HostPool(MiB, device=-1, register=False).view(None),
        lambda e, cs: gfd.HostPool(MiB, device=-1, register=False).view((4,), "uint8", -1),
        lambda e, cs: gfd.HostPool(MiB, device=-1, register=False).view((4.0,)),
        lambda e, cs: gfd.HostPool(MiB, device=-1, register=False).view((4,), "complex64"),
        lambda e, cs: KVTransferWorker(e, None, [[0]], 1, 1),
        lambda e, cs: KVTransferWorker(e, [], "x", 1, 1),
        lambda e, cs: KVTransferWorker(
            e, [testing.device_buffer(e, (4, 8), "int8")], [[0]], 1.0, 1
        ),
        lambda e, cs: gfd.Engine(device=None),
        lambda e, cs: testing.emulated_engine(spin_us=2**70),
        lambda e, cs: testing.emulated_engine(check_overlaps=None),
    ],
    ids=lambda f: "",
)
def test_every_exception_is_a_gfd_error(engine, cached, call):
    cs, h, d = cached
    with pytest.raises(gfd.Error) as info:
        call(engine, cs)
    assert info.value.code == "invalid_argument", info.value
    assert (d == 0xEE).all()


def test_error_classes():
    assert issubclass(gfd.InvalidArgument, gfd.Error) and issubclass(
        gfd.InvalidArgument, ValueError
    )
    assert issubclass(gfd.InvalidType, gfd.InvalidArgument) and issubclass(
        gfd.InvalidType, TypeError
    )
    assert issubclass(gfd.Error, RuntimeError)


def resident_mib():
    """This process's resident memory (MiB)."""
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MiB


@pytest.mark.parametrize("call", ["copy_to_device", "copy_to_host"])
def test_a_rejected_list_of_a_hundred_million_blocks_leaves_nothing_of_its_size(engine, call):
    """10^8 blocks to one destination (the caller's arrays stride-0 views: no memory of theirs):
    rejected naming two blocks, and afterwards the process holds no more memory than before
    (the engine kept a byte a block of a rejected list, about 95 MiB, until it closed)."""
    host = np.asarray(testing.pinned_buffer(engine, (4, 4096), "uint8"))
    dev = np.asarray(testing.device_buffer(engine, (4, 4096), "uint8"))
    hp, dp = host.ctypes.data, dev.ctypes.data
    fn = getattr(engine, call)
    ends = (hp, dp) if call == "copy_to_device" else (dp, hp)
    fn([ends[0]], [ends[1]], 4096).wait()  # the engine's pools made
    n = 10**8
    src, dst = (np.broadcast_to(np.uint64(a), (n,)) for a in ends)
    before = resident_mib()
    err = rejects(fn, src, dst, 4096, match=rf"{call}: block 1: destination range overlaps block 0")
    assert err.block == 1
    after = resident_mib()
    assert after - before < 32, f"{after - before:.0f} MiB more resident after the rejection"
    source, destination = (host, dev) if call == "copy_to_device" else (dev, host)
    source[0] = 9
    fn([ends[0]], [ends[1]], 4096).wait()  # usable after
    assert (destination[0] == 9).all()


# 6. Messages name the argument as the caller spelled it.


def test_messages_name_the_argument(engine, cached, worker):
    cs, h, d = cached
    rejects(
        engine.copy_blocks,
        cs,
        "to_device",
        np.array([2**63], np.uint64),
        [0],
        match=r"copy_blocks: src_ids\[0\]: 9223372036854775808 is out of range \(ids are 64-bit signed integers\)",
    )
    rejects(
        engine.copy_blocks,
        cs,
        "to_device",
        [0],
        [0, 1],
        match="copy_blocks: src_ids has 1 ids, dst_ids 2",
    )
    e = rejects(
        engine.copy_blocks,
        cs,
        "to_host",
        np.array([0, 1, 9]),
        np.array([0, 1, 2]),
        match=r"copy_blocks: src_ids\[2\] \(block 9 -> 2\): source block 9 is out of range",
    )
    assert e.block == 2
    rejects(
        engine.copy_to_host,
        [1 << 20, 2 << 20],
        [3 << 20, 4 << 20],
        np.array([8, -1]),
        match=r"copy_to_host: sizes\[1\]: -1 is negative",
    )
    rejects(
        KVTransferWorker,
        engine,
        [testing.device_buffer(engine, (4, 8), "int8")],
        [[0]],
        1,
        0,
        match=r"KVTransferWorker: num_chunks: 0 is out of range",
    )
    w, _ = worker
    rejects(
        w.submit,
        1,
        True,
        [0],
        [0, 1],
        [1],
        [0],
        match=r"submit: group_sizes: the sizes sum to 1, gpu_block_ids has 2",
    )
    rejects(
        w.submit,
        2,
        True,
        [0],
        [0, 1],
        [2, 0],
        [0],
        match=r"submit: group_sizes: 2 sizes for 1 groups",
    )
    rejects(
        w.submit,
        3,
        True,
        [0, 1],
        [0, 1],
        [2],
        [0],
        match=r"submit: chunk_ids: 2 chunks given, the groups use 1",
    )


# 7. Host pointers outside the user address space.


@pytest.mark.parametrize("address", [0x1000, 2**47, 2**63, 2**64 - 4096])
def test_host_pointers_outside_user_space(engine, address):
    dev = testing.device_buffer(engine, (4, 4096), "uint8")
    np.asarray(dev)[:] = 0xEE
    rejects(
        engine.copy_to_device,
        [address],
        [dev.ptr],
        [4096],
        match=r"copy_to_device: src_ptrs\[0\]: host address 0x[0-9a-f]+ \+ 4096 bytes is outside the user address space",
    )
    rejects(
        engine.copy_to_host,
        [dev.ptr],
        [address],
        [4096],
        match=r"copy_to_host: dst_ptrs\[0\]: host address .* is outside the user address space",
    )
    assert (np.asarray(dev) == 0xEE).all()


def test_a_block_running_past_the_address_space(engine):
    host = testing.pinned_buffer(engine, (1, 4096), "uint8")
    rejects(
        engine.copy_to_device,
        [host.ptr],
        [1 << 20],
        [2**47],
        match=r"sizes\[0\]: .* is out of range|outside the user",
    )
    rejects(
        engine.copy_to_device,
        [host.ptr],
        [2**64 - 8],
        [4096],
        match=r"dst_ptrs\[0\]: device address \+ 4096 bytes "
        r"runs past the end",
    )

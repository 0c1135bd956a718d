"""CacheSet: caches registered once (Engine.register_caches) and transfers by block ids
(Engine.copy_blocks), both directions spelled both ways (emulated device)."""

import gfd
import numpy as np
import pytest
from gfd import testing
from test_blocks import caches, expect_error


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
    engine.copy_blocks(cs, gfd.Direction.TO_DEVICE, m[:, 0], m[:, 1]).wait()
    assert all((d == e).all() for d, e in zip(dv, expect))
    # Out, with int32 id arrays: device blocks 0 and 7 to host blocks 1 and 2.
    src, dst = np.array([0, 7], np.int32), np.array([1, 2], np.int32)
    engine.copy_blocks(cs, "to_host", src, dst).wait()
    for h, d in zip(hv, dv):
        assert (h[dst] == d[src]).all()


def test_torch_cpu_tensors_as_ids(engine):
    # Read through their numpy views: int64 and int32, strided columns of a mapping; bad ids
    # named by position; float and bool tensors refused naming the argument.
    torch = pytest.importorskip("torch")
    hs, ds, hv, dv = layers(engine, 3)
    cs = engine.register_caches(hs, ds)
    m = np.array([[3, 0], [20, 7], [9, 15]], np.int64)
    for mapping in (
        torch.from_numpy(m),
        torch.from_numpy(m).to(torch.int32),
        torch.from_numpy(np.ascontiguousarray(m.T)).t(),
    ):
        for d in dv:
            d[:] = 0
        engine.copy_blocks(cs, "to_device", mapping[:, 0], mapping[:, 1]).wait()
        for h, d in zip(hv, dv):
            assert (d[m[:, 1]] == h[m[:, 0]]).all()
    src, dst = torch.tensor([5, 6]), torch.tensor([1, 2], dtype=torch.int32)
    engine.copy_blocks(cs, "to_device", src, dst).wait()
    for h, d in zip(hv, dv):
        assert (d[[1, 2]] == h[[5, 6]]).all()
    expect_error(
        r"copy_blocks: src_ids\[1\] \(block 24 -> 1\): source block 24 is out of range",
        engine.copy_blocks,
        cs,
        "to_device",
        torch.tensor([0, 24]),
        torch.tensor([0, 1]),
        block=1,
    )
    with pytest.raises(gfd.InvalidType, match="src_ids: float32 is not an integer type"):
        engine.copy_blocks(cs, "to_device", torch.tensor([0.0, 1.0]), [0, 1])
    with pytest.raises(gfd.InvalidType, match="dst_ids: bool is not an integer type"):
        engine.copy_blocks(cs, "to_device", [0, 1], torch.tensor([True, False]))


def test_ids_as_lists_and_tuples(engine):
    # A list or tuple mixing plain ints with numpy integer scalars and an int subclass moves the
    # same blocks as an array; ids beyond 64-bit signed integers are refused naming the element.
    hs, ds, hv, dv = layers(engine, 2)
    cs = engine.register_caches(hs, ds)

    class BlockId(int):
        pass

    expect = [d.copy() for d in dv]
    for e, h in zip(expect, hv):
        e[[0, 7, 15]] = h[[3, 20, 9]]
    engine.copy_blocks(cs, "to_device", [3, np.int64(20), BlockId(9)], (0, np.uint16(7), 15)).wait()
    assert all((d == e).all() for d, e in zip(dv, expect))
    beyond = {
        2**63: "9223372036854775808",
        -(2**63) - 1: "a negative integer beyond 64 bits",
        2**64: "an integer beyond 64 bits",
    }
    for big, text in beyond.items():
        expect_error(
            rf"copy_blocks: dst_ids\[1\]: {text} is out of range \(ids are 64-bit signed integers\)",
            engine.copy_blocks,
            cs,
            "to_device",
            [0, 1],
            [0, big],
        )
    assert all((d == e).all() for d, e in zip(dv, expect)), "a rejected transfer moved bytes"


def test_copy_blocks_errors(engine):
    hs, ds, hv, dv = layers(engine, 2)
    cs = engine.register_caches(hs, ds)
    before = [d.copy() for d in dv]
    c = engine.copy_blocks
    # One check, in the engine, with one wording whatever the ids are given as.
    for ids in ([0, 24], np.array([0, 24]), np.array([0, 24], np.uint16)):
        expect_error(
            r"copy_blocks: src_ids\[1\] \(block 24 -> 1\): source block 24 is out of range "
            r"\(host\[0\] has 24 blocks\)",
            c,
            cs,
            "to_device",
            ids,
            [0, 1],
            block=1,
        )
    expect_error(
        r"copy_blocks: dst_ids\[0\] \(block 0 -> -1\): destination block -1 is negative",
        c,
        cs,
        "to_device",
        [0],
        [-1],
        block=0,
    )
    expect_error(
        r"dst_ids\[2\] \(block 2 -> 5\): destination block 5 is also that of dst_ids\[0\]",
        c,
        cs,
        "to_device",
        [0, 1, 2],
        [5, 6, 5],
        block=2,
    )
    expect_error(r"src_ids has 2 ids, dst_ids 1", c, cs, "to_device", [0, 1], [5])
    expect_error(r"direction: 'sideways' is not a direction", c, cs, "sideways", [0], [0])
    with pytest.raises(gfd.InvalidType, match="direction: expected"):
        c(cs, True, [0], [0])
    assert all((d == b).all() for d, b in zip(dv, before)), "a rejected transfer moved bytes"
    other = testing.emulated_engine()
    try:
        expect_error(
            r"copy_blocks: caches was registered with another engine",
            other.copy_blocks,
            cs,
            "to_device",
            [0],
            [0],
        )
        expect_error(
            r"copy_blocks: caches\[0\] was registered with another engine",
            other.copy_blocks,
            [cs],
            "to_device",
            [0],
            [0],
        )
    finally:
        other.close()


def test_register_errors(engine):
    hs, ds, _, _ = layers(engine, 2)
    # Given the wrong way round: both sides named.
    expect_error(
        r"register_caches: host\[0\] is on cuda:0 and device\[0\] on cpu( \(pinned\))?: host and device "
        r"swapped\?",
        engine.register_caches,
        ds,
        hs,
    )
    expect_error(
        r"register_caches: host\[0\] is on cuda:0; the host caches must be in host memory",
        engine.register_caches,
        ds,
        ds,
    )
    expect_error(r"2 host caches but 1 device", engine.register_caches, hs, ds[:1])
    expect_error(
        r"register_caches: device\[1\] overlaps device\[0\]",
        engine.register_caches,
        hs,
        [ds[0], ds[0]],
    )
    expect_error(
        r"register_caches: host\[1\] overlaps host\[0\]", engine.register_caches, [hs[0], hs[0]], ds
    )
    h16, d16, _, _ = caches(engine, 8, 8, (1024,), "float16")
    expect_error(r"device has dtype float16, host uint8", engine.register_caches, hs[0], d16)


def test_layers_in_one_call_in_order(engine):
    """A list of CacheSets (a model's layers): one transfer each, issued in order in one call,
    after_each(k) between them (where a runtime records layer k's event)."""
    hs, ds, hv, dv = layers(engine, 4, seed=40)
    sets = [engine.register_caches([h], [d]) for h, d in zip(hs, ds)]
    called = []
    before = engine.stats()["transfers"]

    def after(k):
        called.append((k, engine.stats()["transfers"] - before))  # set k's transfer is enqueued

    ts = engine.copy_blocks(sets, "to_device", [3, 20, 9], [0, 7, 15], after_each=after)
    assert called == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert len(ts) == 4 and all(isinstance(t, gfd.Transfer) for t in ts)
    for t in ts:
        t.wait()
    for h, d in zip(hv, dv):
        assert (d[[0, 7, 15]] == h[[3, 20, 9]]).all()
    # Out, without a callback.
    for t in engine.copy_blocks(sets, gfd.Direction.TO_HOST, [0, 7], [1, 2]):
        t.wait()
    for h, d in zip(hv, dv):
        assert (h[[1, 2]] == d[[0, 7]]).all()


def test_layers_in_one_call_bad_input(engine):
    hs, ds, hv, dv = layers(engine, 2, seed=50)
    sets = [engine.register_caches([h], [d]) for h, d in zip(hs, ds)]
    small = layers(engine, 1, host_blocks=4, dev_blocks=4, seed=60)
    sets.append(engine.register_caches(small[0], small[1]))
    before = engine.stats()["transfers"]
    for ids in ([0, 9], np.array([0, 9])):
        with pytest.raises(
            gfd.InvalidArgument,
            match=r"copy_blocks: src_ids\[1\] \(block 9 -> 1\): source block 9 is "
            r"out of range \(caches\[2\]'s host\[0\] has 4 blocks\)",
        ):
            engine.copy_blocks(sets, "to_device", ids, [0, 1])
    with pytest.raises(gfd.InvalidArgument, match="empty list"):
        engine.copy_blocks([], "to_device", [0], [0])
    with pytest.raises(gfd.InvalidType, match=r"caches\[1\]: expected a gfd.CacheSet, got int"):
        engine.copy_blocks([sets[0], 3], "to_device", [0], [0])
    with pytest.raises(gfd.InvalidType, match="after_each: expected a callable"):
        engine.copy_blocks(sets[:2], "to_device", [0], [0], after_each=5)
    with pytest.raises(gfd.InvalidArgument, match="only with a list"):
        engine.copy_blocks(sets[0], "to_device", [0], [0], after_each=print)
    assert engine.stats()["transfers"] == before  # nothing moved

    # An exception in after_each: every set's transfer is still issued, the first error raised,
    # no later callback called.
    called = []

    def boom(k):
        called.append(k)
        raise RuntimeError(f"layer {k}")

    with pytest.raises(RuntimeError, match="layer 0"):
        engine.copy_blocks(sets[:2], "to_device", [1], [2], after_each=boom)
    assert called == [0] and engine.stats()["transfers"] == before + 2
    testing.stream_sync(engine)


def test_stream_ordered_to_host_option():
    e = testing.emulated_engine(stream_ordered_to_host=True)
    try:
        assert e.options()["stream_ordered_to_host"] is True
    finally:
        e.close()

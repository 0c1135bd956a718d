"""Pinned host memory out: HostPool and empty_pinned as DLPack / numpy buffers (the memory lives
as long as any view), and pools registered with the (emulated) device."""

import gc

import gfd
import numpy as np
import pytest
from gfd import testing

MiB = 1 << 20


def test_unregistered_pool_needs_no_gpu():
    pool = gfd.HostPool(3 * MiB + 1, device=-1, register=False)
    assert pool.bytes == 4 * MiB
    assert pool.data % (2 * MiB) == 0
    assert pool.hugepages in ("hugetlb", "transparent", "none")
    assert pool.numa_node == -1 and pool.registered is False
    assert "HostPool" in repr(pool)
    # The default device too: without registration no GPU is opened (none here).
    assert gfd.HostPool(MiB, register=False).bytes == 2 * MiB


@pytest.mark.parametrize(
    "dtype,np_dtype",
    [
        ("float16", np.float16),
        (np.float32, np.float32),
        (np.dtype("int64"), np.int64),
        ("torch.uint8", np.uint8),
        ("bool", np.bool_),
    ],
)
def test_view_through_numpy_and_dlpack(dtype, np_dtype):
    pool = gfd.HostPool(MiB, device=-1, register=False)
    buf = pool.view((16, 32), dtype)
    assert buf.shape == (16, 32) and buf.is_host and buf.ptr == pool.data
    a = np.asarray(buf)
    assert a.dtype == np_dtype and a.shape == (16, 32)
    assert (a == 0).all(), "fresh pool memory reads as zeros"
    a[3, 4] = 1
    b = np.from_dlpack(buf)
    assert b.dtype == np_dtype and b[3, 4] == 1, "the same memory"
    assert b.ctypes.data == pool.data


def test_versioned_dlpack_export():
    pool = gfd.HostPool(MiB, device=-1, register=False)
    buf = pool.view((8,), "int32")
    cap = buf.__dlpack__(max_version=(1, 0))
    assert "dltensor_versioned" in repr(cap)
    cap = buf.__dlpack__()
    assert "dltensor" in repr(cap)
    assert buf.__dlpack_device__() == (1, 0)
    with pytest.raises(BufferError):
        buf.__dlpack__(copy=True)


def test_memory_outlives_pool_and_buffer():
    pool = gfd.HostPool(MiB, device=-1, register=False)
    a = np.from_dlpack(pool.view((1024,), "uint8", offset=4096))
    b = np.asarray(pool.view((1024,), "uint8", offset=4096))
    a[:] = 42
    del pool
    gc.collect()
    assert (a == 42).all() and (b == 42).all()
    a[:] = 7
    assert (b == 7).all()


def test_view_bounds_and_alignment():
    pool = gfd.HostPool(MiB, device=-1, register=False)
    with pytest.raises(gfd.Error, match="do not fit"):
        pool.view((2 * MiB + 1,), "uint8")
    with pytest.raises(gfd.Error, match="offset: 3 is not a multiple of the element size 4"):
        pool.view((4,), "float32", offset=3)
    with pytest.raises(gfd.Error, match="dtype: 'complex64' is not a dtype gfd knows"):
        pool.view((4,), "complex64")
    with pytest.raises(gfd.Error, match=r"shape\[1\]: -2 is negative"):
        pool.view((4, -2), "uint8")


def test_pool_options_errors():
    with pytest.raises(gfd.Error, match="bytes: must be at least 1") as info:
        gfd.HostPool(0, device=-1, register=False)
    assert info.value.code == "invalid_argument"
    with pytest.raises(gfd.Error, match="numa_node: 100000 does not exist"):
        gfd.HostPool(MiB, device=-1, numa_node=100000, register=False)


@pytest.mark.skipif(gfd.cuda_device_count() > 0, reason="this machine has a GPU")
def test_empty_pinned_without_gpu_fails_clearly():
    with pytest.raises(gfd.Error) as info:
        gfd.empty_pinned((4, 4), "float16")
    assert info.value.code != "invalid_argument" and str(info.value)


def test_pinned_buffer_is_registered_with_the_device(engine):
    buf = testing.pinned_buffer(engine, (4, 4096), "uint8")
    assert testing.pointer_kind(engine, buf.ptr) == "pinned"
    assert buf.pool.registered
    assert "registered=True" in repr(buf)
    dev = testing.device_buffer(engine, (4, 4096), "uint8")
    assert testing.pointer_kind(engine, dev.ptr) == "device"
    assert dev.__dlpack_device__() == (2, 0)
    assert not dev.is_host
    pool = gfd.HostPool(MiB, device=-1, register=False)
    assert testing.pointer_kind(engine, pool.data) == "pageable"


def test_unregistered_pool_as_a_pageable_source(engine):
    # gfd stages pageable sources too (pinned is faster): a plain pool works for swap-ins.
    pool = gfd.HostPool(MiB, device=-1, register=False)
    host = pool.view((16, 4096), "uint8")
    np.asarray(host)[:] = np.arange(16, dtype=np.uint8)[:, None] + 1
    dev = testing.device_buffer(engine, (16, 4096), "uint8")
    engine.copy_blocks(
        engine.register_caches(host, dev), "to_device", list(range(16)), [15 - i for i in range(16)]
    ).wait()
    assert (np.asarray(dev)[:, 0] == np.arange(16, 0, -1)).all()

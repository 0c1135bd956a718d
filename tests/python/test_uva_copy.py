"""gfd._gfd.testing.uva_copy: the SM copy kernel the benchmarks measure as a peer (the test-device
facade's testkit::uva_copy). Its arguments are checked on any device; the kernel needs a GPU, and
the emulated device says so. The copy itself is checked where torch and a GPU are present."""

import gfd
import numpy as np
import pytest
from gfd import testing

uva_copy = gfd._gfd.testing.uva_copy


@pytest.fixture
def emu():
    e = testing.emulated_engine()
    yield e
    e.close()


def test_the_emulated_device_has_no_sm_kernel(emu):
    with pytest.raises(
        gfd.InvalidArgument,
        match="uva_copy: an SM copy kernel needs a CUDA device, not the emulated one",
    ):
        uva_copy(emu, 0x1000, 0x2000, 0x3000, 4, 2, None)
    with pytest.raises(gfd.InvalidArgument, match="not the emulated one"):
        uva_copy(emu, 0, 0, 0, 0, 12, None)  # nothing to copy: still no kernel here


@pytest.mark.parametrize(
    "args, error, message",
    [
        ((0x1000, 0x2000, 0x3000, -1, 2), gfd.InvalidArgument, "uva_copy: count: -1 is negative"),
        (
            (0x1000, 0x2000, 0x3000, 4, 0),
            gfd.InvalidArgument,
            r"uva_copy: ctas: 0 is out of range \[1, 1024\]",
        ),
        (
            (0x1000, 0x2000, 0x3000, 4, 1025),
            gfd.InvalidArgument,
            r"uva_copy: ctas: 1025 is out of range",
        ),
        (
            (0x1000, 0x2000, 0x3000, 4, True),
            gfd.InvalidType,
            "uva_copy: ctas: expected an int, got bool",
        ),
        ((0x1000, 0x2000, 0x3000, 4.0, 2), gfd.InvalidType, "uva_copy: count: expected an int"),
        ((1.5, 0x2000, 0x3000, 4, 2), gfd.InvalidType, "uva_copy: dsts: expected an int"),
        ((0, 0x2000, 0x3000, 4, 2), gfd.InvalidArgument, "uva_copy: dsts: null, with 4 copies"),
        ((0x1000, 0, 0x3000, 4, 2), gfd.InvalidArgument, "uva_copy: srcs: null, with 4 copies"),
        ((0x1000, 0x2000, 0, 4, 2), gfd.InvalidArgument, "uva_copy: sizes: null, with 4 copies"),
    ],
)
def test_arguments_are_checked_on_any_device(emu, args, error, message):
    with pytest.raises(error, match=message):
        uva_copy(emu, *args, None)


def test_a_bad_stream_and_a_closed_engine(emu):
    with pytest.raises(gfd.InvalidType, match="uva_copy: stream"):
        uva_copy(emu, 0x1000, 0x2000, 0x3000, 4, 2, "stream")
    emu.close()
    with pytest.raises(gfd.Error, match="closed"):
        uva_copy(emu, 0x1000, 0x2000, 0x3000, 4, 2, None)


def _torch_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or gfd.cuda_device_count() == 0:
        pytest.skip("needs torch with a CUDA GPU")
    return torch


@pytest.mark.parametrize("ctas", [2, 12])
def test_pages_move_both_ways_on_a_gpu(ctas):
    torch = _torch_gpu()
    engine = gfd.Engine()
    try:
        page, pages = 4096 + 48, 64  # a size that is not a multiple of 16 takes the byte loop too
        host = torch.randint(1, 255, (pages, page), dtype=torch.uint8).pin_memory()
        gpu = torch.zeros((2 * pages, page), dtype=torch.uint8, device="cuda")
        back = torch.zeros((pages, page), dtype=torch.uint8).pin_memory()
        dst_rows = torch.randperm(2 * pages)[:pages]
        stream = torch.cuda.Stream()

        def run(dst_ptrs, src_ptrs):
            arrays = torch.tensor(
                np.stack([dst_ptrs, src_ptrs, np.full(pages, page, np.uint64)]).view(np.int64),
                device="cuda",
            )
            uva_copy(
                engine,
                arrays[0].data_ptr(),
                arrays[1].data_ptr(),
                arrays[2].data_ptr(),
                pages,
                ctas,
                int(stream.cuda_stream),
            )
            stream.synchronize()

        rows = np.arange(pages, dtype=np.uint64) * np.uint64(page)
        run(
            np.uint64(gpu.data_ptr()) + dst_rows.numpy().astype(np.uint64) * np.uint64(page),
            np.uint64(host.data_ptr()) + rows,
        )
        assert torch.equal(gpu[dst_rows.cuda()].cpu(), host)
        assert int(torch.count_nonzero(gpu)) == pages * page  # nothing else written
        run(
            np.uint64(back.data_ptr()) + rows,
            np.uint64(gpu.data_ptr()) + dst_rows.numpy().astype(np.uint64) * np.uint64(page),
        )
        assert torch.equal(back, host)
        # The kernel reads its arrays itself: pageable host memory is refused, naming the array.
        pageable = np.zeros(3 * pages, dtype=np.uint64)
        with pytest.raises(gfd.InvalidArgument, match="uva_copy: srcs: pageable memory"):
            arrays = torch.zeros((3, pages), dtype=torch.int64, device="cuda")
            uva_copy(
                engine,
                arrays[0].data_ptr(),
                pageable.ctypes.data,
                arrays[2].data_ptr(),
                pages,
                ctas,
                int(stream.cuda_stream),
            )
    finally:
        engine.close()

"""Shared fixtures of gfd's Python suite.

Everything except test_gpu.py runs on the emulated device (gfd.testing): device memory is host
memory there, so the bytes every call moves are checked with numpy on any machine. test_gpu.py
needs torch and a CUDA GPU and skips with the reason otherwise.
"""

import os

# `import gfd` must find the package under test: tools/python_test.sh puts the build tree's
# python/ first on PYTHONPATH; an installed gfd (pip install .) works as well. A missing package
# is an error, never a skip: CI would otherwise pass without testing anything.
import pytest
from gfd import testing  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
#: The Python benchmarks (gfd_bench), which are not part of the installed package.
BENCH_PATH = os.path.join(ROOT, "bench", "python")


def bench_env():
    """The environment a benchmark runs in: this one, with gfd_bench importable."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (BENCH_PATH, env.get("PYTHONPATH")) if p)
    return env


def small_options(**over):
    """A small ring, so that transfers cycle through it (as the C++ suites' small_options)."""
    o = dict(
        staging_bytes=1 << 20,
        slot_bytes=256 << 10,
        first_chunk_bytes=64 << 10,
        piece_bytes=16 << 10,
        direct_min_bytes=512 << 10,
        direct_min_bytes_to_host=512 << 10,
        inline_gather_bytes=16 << 10,
        gather_threads=2,
        copy_streams=2,
        spin_us=20,
    )
    o.update(over)
    return o


@pytest.fixture(params=["gather", "batch_async", "per_block", "zero_copy_kernel"])
def backend(request):
    return request.param


@pytest.fixture
def engine():
    e = testing.emulated_engine(**small_options())
    yield e
    e.close()


@pytest.fixture
def engine_b(backend):
    """An emulated engine per backend."""
    e = testing.emulated_engine(**small_options(backend=backend))
    yield e
    e.close()


@pytest.fixture
def slow_engine():
    """Every emulated copy takes 20 ms: transfers stay in flight long enough to observe."""
    e = testing.emulated_engine(copy_delay_us=20000, **small_options())
    yield e
    e.close()

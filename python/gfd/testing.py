"""Test a runtime integration without a GPU.

:func:`emulated_engine` gives a :class:`gfd.Engine` on an emulated device: its "device memory"
is host memory, its streams are threads that keep CUDA's ordering and events, and the engine
runs gfd's whole pipeline on it. Everything a runtime does with gfd (register its caches, copy
blocks, order transfers on streams, wait, handle errors) runs unchanged on any machine, and the
bytes moved can be checked with numpy: :func:`device_buffer` makes "device" memory that numpy
reads (``numpy.asarray``), :func:`pinned_buffer` pinned host memory, :func:`create_stream`
streams. The same helpers work on a CUDA engine (device memory, streams of its GPU), for tests
that run both ways. The trace and copy helpers serve gfd's own benchmarks.

::

    import numpy as np, gfd, gfd.testing

    engine = gfd.testing.emulated_engine()
    gpu = gfd.testing.device_buffer(engine, (16, 4096), "uint8")   # "device" memory
    host = np.arange(8 * 4096, dtype=np.uint8).reshape(8, 4096)
    caches = engine.register_caches([host], [gpu])
    engine.copy_blocks(caches, "to_device", [0, 1], [5, 6]).wait()
    assert (np.asarray(gpu)[5] == host[0]).all()
"""

from __future__ import annotations

from typing import Any, Optional

from ._errors import _error
from ._gfd import Buffer, Engine
from ._gfd import testing as _t


def emulated_engine(
    copy_delay_us: int = 0, ordinal: int = 0, fault: str = "", **options: Any
) -> Engine:
    """An Engine on the emulated device (ordinal ``ordinal``) with ``options``.

    ``copy_delay_us`` makes every emulated copy sleep that long first (transfers then stay in
    flight long enough to observe). ``fault`` names a device operation ("copy_h2d", "copy_d2h",
    "scatter", "gather", "zero_copy", "copy_batch") that fails as a GPU fault would, leaving
    the device in a sticky error state. stream=None is an emulated stream standing in for the
    default stream."""
    return _t.emulated_engine(options, copy_delay_us, ordinal, fault)


#: The environment variable that puts gfd's runtime integrations (gfd.vllm) on the emulated
#: device: "1", or comma-separated settings of :func:`emulated_engine`
#: ("copy_delay_us=2000,fault=copy_d2h"). Unset, empty or "0": the GPU.
EMULATED_DEVICE_VARIABLE = "GFD_EMULATED_DEVICE"


def emulated_device_settings() -> Optional[dict]:
    """GFD_EMULATED_DEVICE as :func:`emulated_engine`'s keyword arguments, or None where it is
    unset, empty or "0". Raises :class:`gfd.InvalidArgument` naming the variable for a setting
    that is not ``copy_delay_us=<int>`` or ``fault=<operation>``."""
    import os

    value = os.environ.get(EMULATED_DEVICE_VARIABLE, "").strip()
    if value in ("", "0"):
        return None
    out: dict = {}
    if value == "1":
        return out
    for item in value.split(","):
        key, sep, v = item.strip().partition("=")
        if key == "copy_delay_us" and sep and v.isdigit():
            out[key] = int(v)
        elif key == "fault" and sep and v:
            out[key] = v
        else:
            raise _error(
                f"{EMULATED_DEVICE_VARIABLE}={value!r}: {item.strip()!r} is not a setting "
                '("1", or copy_delay_us=<microseconds> and fault=<operation>, comma-separated)'
            )
    return out


class AdoptedMemory:
    """Host memory that the emulated device serves as its own device memory (see
    :func:`adopt_device_memory`), until :meth:`release`."""

    def __init__(self, engine: Engine, ptr: int, nbytes: int, owner: Any) -> None:
        self._release = _t.adopt_device_memory(engine, ptr, nbytes)
        self.ptr, self.nbytes, self._owner = ptr, nbytes, owner

    def release(self) -> None:
        """Gives the memory back to the host (also after the engine has closed), once the copies
        queued on the emulated device have run, as ``cudaFree`` waits for the GPU. Idempotent."""
        if self._release is not None:
            self._release()
            self._release = self._owner = None

    def __del__(self) -> None:
        try:
            self.release()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def adopt_device_memory(engine: Engine, ptr: int, nbytes: int, owner: Any = None) -> AdoptedMemory:
    """Makes ``nbytes`` of host memory at ``ptr`` device memory of the emulated ``engine``'s
    device until the returned object is released: a runtime that runs without a GPU keeps its
    "GPU" caches in host memory (CPU tensors), and the emulated device then takes them as the
    device side of :meth:`gfd.Engine.register_caches`. ``owner`` (the tensor, say) is kept
    alive meanwhile. The range must not overlap memory the emulated device already knows."""
    return AdoptedMemory(engine, ptr, nbytes, owner)


def adopt_tensors(engine: Engine, tensors: Any) -> list:
    """Adopts (:func:`adopt_device_memory`) the whole storage of each CPU torch tensor of
    ``tensors`` that the emulated device does not know yet, once per storage: a runtime's "GPU"
    caches on a machine without a GPU. Returns the adopted memory (release each when done)."""
    import sys

    torch = sys.modules.get("torch")
    out: list = []
    try:
        for t in tensors:
            if torch is None or not isinstance(t, torch.Tensor) or t.is_cuda:
                continue
            storage = t.untyped_storage()
            if (
                any(a.ptr == storage.data_ptr() for a in out)
                or pointer_kind(engine, t.data_ptr()) == "device"
            ):
                continue
            out.append(adopt_device_memory(engine, storage.data_ptr(), storage.nbytes(), storage))
    except BaseException:
        for a in out:
            a.release()
        raise
    return out


def device_buffer(engine: Engine, shape: Any, dtype: Any = "uint8") -> Buffer:
    """Device memory of the engine's GPU as a gfd.Buffer (DLPack device: CUDA). On the emulated
    device it also has __array_interface__, so numpy.asarray shows the "device" bytes."""
    return _t.device_buffer(engine, shape, dtype)


def pinned_buffer(engine: Engine, shape: Any, dtype: Any = "uint8") -> Buffer:
    """A pinned host buffer (a HostPool registered with the engine's device: on the emulated
    device, registered with the emulator)."""
    return _t.pinned_buffer(engine, shape, dtype)


def create_stream(engine: Engine) -> int:
    """A new stream of the engine's device, as an int handle."""
    return _t.create_stream(engine)


def destroy_stream(engine: Engine, stream: int) -> None:
    _t.destroy_stream(engine, stream)


def stream_sync(engine: Engine, stream: Optional[int] = None) -> None:
    """Waits for everything queued on ``stream`` (None: the engine's default stream)."""
    _t.stream_sync(engine, stream)


def delay(engine: Engine, microseconds: int, stream: Optional[int] = None) -> None:
    """Holds ``stream`` for that long (a spin kernel on a GPU): work queued after it waits."""
    _t.delay(engine, microseconds, stream)


def copy(
    engine: Engine, dst: int, src: int, nbytes: int, to_device: bool, stream: Optional[int] = None
) -> None:
    """One plain asynchronous copy (cudaMemcpyAsync) on ``stream``."""
    _t.copy(engine, dst, src, nbytes, to_device, stream)


def memset(engine: Engine, dst: int, value: int, nbytes: int, stream: Optional[int] = None) -> None:
    _t.memset(engine, dst, value, nbytes, stream)


def pointer_kind(engine: Engine, address: int) -> str:
    """'pageable', 'pinned', 'device', 'other_device' or 'managed', as the engine's device
    sees the address."""
    return _t.pointer_kind(engine, address)


def memcpy_batch(
    engine: Engine, dsts: int, srcs: int, sizes: int, count: int, to_device: bool, stream: int
) -> None:
    """vLLM's CPU offloading copy path: one cudaMemcpyBatchAsync of ``count`` descriptors (the
    addresses of pointer and size arrays, e.g. numpy's ``.ctypes.data``) on ``stream``, sources
    read in any order for loads and in stream order for stores (CUDA devices only)."""
    _t.memcpy_batch(engine, dsts, srcs, sizes, count, to_device, stream)


def trace_start(engine: Engine, capacity: int = 1 << 20) -> None:
    """Starts recording the engine's trace points (see src/trace_event.hpp)."""
    _t.trace_start(engine, capacity)


def trace_take(engine: Engine) -> list:
    """The points recorded since trace_start, as (ns, transfer, what, thread, a, b) tuples."""
    return _t.trace_take(engine)


# TraceEvent::What and TraceEvent::Stage, as in src/trace_event.hpp.
_WHAT = (
    "submit",
    "planned",
    "chunk_published",
    "piece_start",
    "piece_end",
    "chunk_issued",
    "finalized",
    "return",
    "dma_done",
    "stage",
)
_STAGES = (
    "pool woken",
    "plan storage",
    "lanes begun",
    "slot taken",
    "list written",
    "gathered",
    "early chunks out",
    "packed",
    "enqueued",
)


def trace_report(events: list, transfer: Optional[int] = None) -> str:
    """A transfer's timeline (the last one traced by default), in microseconds from its call: as
    gfd_benchmark --trace prints it (bench/src/trace_report.cpp), per chunk when it was published,
    gathered, issued and its DMA done."""
    if not events:
        return "trace: no events"
    if transfer is None:
        transfer = max(e[1] for e in events)
    ev = [e for e in events if e[1] == transfer]
    t0 = next((e[0] for e in ev if _WHAT[e[2]] == "submit"), ev[0][0])
    us = lambda ns: (ns - t0) / 1e3  # noqa: E731
    chunks: dict = {}
    stages, marks, packed = {}, {}, []
    for ns, _, what, _thread, a, b in ev:
        w = _WHAT[what] if what < len(_WHAT) else str(what)
        if w == "stage":
            name = _STAGES[a] if a < len(_STAGES) else str(a)
            if name == "packed":
                packed.append(f"{b}@{us(ns):.1f}")
            else:
                stages[name] = us(ns)
        elif w in ("planned", "finalized", "return"):
            marks[w] = us(ns)
        elif w in ("chunk_published", "piece_start", "piece_end", "chunk_issued", "dma_done"):
            c = chunks.setdefault(a, {"pieces": 0, "first": None, "last": None})
            if w == "chunk_published":
                c["published"], c["pieces"] = us(ns), b
            elif w == "piece_start":
                c["first"] = us(ns) if c["first"] is None else min(c["first"], us(ns))
            elif w == "piece_end":
                c["last"] = us(ns) if c["last"] is None else max(c["last"], us(ns))
            elif w == "chunk_issued":
                c["issued"], c["bytes"] = us(ns), b
            else:
                c["dma_done"] = us(ns)
    f = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    lines = [
        f"trace of transfer {transfer}: " + " | ".join(f"{k} {v:.1f}" for k, v in marks.items()),
        "  submission: " + " | ".join(f"{k} {v:.1f}" for k, v in stages.items()),
        "  packed (blocks@us): " + " ".join(packed),
        "  chunk   bytes  pieces  published  1st_piece  last_piece  issued  dma_done",
    ]
    for k in sorted(chunks):
        c = chunks[k]
        lines.append(
            f"  {k:<6} {str(c.get('bytes', 0) >> 10) + 'K':>6} {c['pieces']:>7} {f(c.get('published')):>10} "
            f"{f(c['first']):>10} {f(c['last']):>11} {f(c.get('issued')):>7} {f(c.get('dma_done')):>9}"
        )
    return "\n".join(lines)

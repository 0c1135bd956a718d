"""gfd: fast scattered KV-cache block transfers between host memory and GPUs.

One :class:`Engine` per GPU moves many small blocks between (pinned) host memory and that GPU's
memory: CPU gather threads pack the blocks into a pinned staging ring, and large DMAs on
dedicated copy-engine streams carry them, so no SM is used. Transfers are ordered on a CUDA
stream like any other work on it (torch's current stream by default).

The calls serving runtimes make::

    import torch, gfd

    engine = gfd.Engine(device=0)
    gpu_k = torch.empty(num_blocks, block_size, heads, head_dim, dtype=torch.float16, device="cuda")
    cpu_k = torch.from_dlpack(gfd.empty_pinned((num_cpu_blocks, block_size, heads, head_dim), torch.float16))
    caches = engine.register_caches([cpu_k], [gpu_k])         # once: every layer's pair
    t = engine.copy_blocks(caches, gfd.Direction.TO_DEVICE, [3, 9], [0, 1])  # host 3 -> GPU 0, 9 -> 1
    # kernels queued on torch's current stream from here on see the blocks; no host wait
    t.wait()                                                  # or t.done() to poll

Tensors come in through DLPack (``__dlpack__``) or the CUDA array interface, so torch is not
needed to build or import gfd. Every exception gfd raises is a :class:`gfd.Error` with
``.code`` and ``.block``; a bad argument is a :class:`gfd.InvalidArgument` (also a ValueError),
one of the wrong type a :class:`gfd.InvalidType` (also a TypeError), raised before anything is
written (docs/python.md, "Bad input").
"""

from __future__ import annotations

import atexit
import enum
import sys
import threading
import weakref
from typing import Any, Iterable, Optional, Sequence

from . import _gfd
from ._gfd import Buffer, Error, InvalidArgument, InvalidType

__all__ = [
    "Engine",
    "CacheSet",
    "Direction",
    "Transfer",
    "Error",
    "InvalidArgument",
    "InvalidType",
    "HostPool",
    "Buffer",
    "empty_pinned",
    "option_names",
    "stats_names",
    "default_options",
    "backends",
    "cuda_device_count",
]

__version__: str = _gfd.__version__

#: Names of every Engine option (the fields of gfd::EngineOptions), in declaration order.
option_names: tuple = tuple(_gfd.option_names)
#: Keys of the dict Engine.stats() returns (the fields of gfd::EngineStats).
stats_names: tuple = tuple(_gfd.stats_names)
#: Every option's default value.
default_options: dict = dict(_gfd.default_options)


def backends() -> list:
    """Names of the transfer backends ('gather', 'batch_async', 'per_block', 'zero_copy_kernel')."""
    return list(_gfd.backend_names())


def cuda_device_count() -> int:
    """Usable CUDA devices in this process (0 without a driver or a GPU)."""
    return _gfd.cuda_device_count()


def _error(message: str, code: str = "invalid_argument", block: Optional[int] = None) -> Error:
    """A gfd.Error raised from Python, with the attributes the compiled ones carry: an
    InvalidArgument for code 'invalid_argument'."""
    e = (InvalidArgument if code == "invalid_argument" else Error)(message)
    e.code = code
    e.block = block
    return e


def _type_error(message: str) -> Error:
    """A gfd.InvalidType (an argument of the wrong type) raised from Python."""
    e = InvalidType(message)
    e.code = "invalid_argument"
    e.block = None
    return e


class Direction(str, enum.Enum):
    """Which way a transfer moves blocks. The strings ``"to_device"`` and ``"to_host"`` are
    accepted wherever a direction is taken."""

    TO_DEVICE = "to_device"  #: host memory to the engine's GPU
    TO_HOST = "to_host"      #: the engine's GPU to host memory


# --------------------------------------------------------------------------------------------
# Streams


def _stream_handle(stream: Any, device: int, emulated: bool) -> Optional[int]:
    """The cudaStream_t (as an int) a transfer is ordered on.

    None: torch's current stream for the engine's device when torch is loaded and has used CUDA
    (without it, work cannot be queued on any other stream yet), else the default stream (0).
    Also accepted: torch.cuda.Stream (``.cuda_stream``), any object with ``__cuda_stream__``
    (returning ``(version, handle)``), or an int handle.
    """
    if stream is None:
        if emulated:
            return None  # the emulated engine's stand-in for the default stream
        torch = sys.modules.get("torch")
        if torch is not None:
            cuda = getattr(torch, "cuda", None)
            if cuda is not None and cuda.is_initialized():
                # torch's raw getter where it has one: the same handle without a Stream object
                # made (about 7 us of a 4096-block call on an H200 host).
                raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
                if raw is not None:
                    return raw(device)
                return cuda.current_stream(device).cuda_stream
        return 0
    if isinstance(stream, bool) or isinstance(stream, float):
        raise _type_error(f"stream: expected a CUDA stream, got {type(stream).__name__}")
    if isinstance(stream, int) or type(stream).__module__ == "numpy":
        return stream  # range-checked by the compiled call, as every integer argument
    try:
        proto = getattr(stream, "__cuda_stream__", None)
        if proto is not None:
            value = proto() if callable(proto) else proto
            if not isinstance(value, tuple) or len(value) != 2:
                raise _type_error("stream: __cuda_stream__ must return (version, handle)")
            return value[1]
        handle = getattr(stream, "cuda_stream", None)  # torch.cuda.Stream, torch.cuda.ExternalStream
    except Error:
        raise
    except Exception as e:  # noqa: BLE001 - a foreign object's failing attribute
        raise _type_error(f"stream: reading the stream handle of a {type(stream).__name__} failed: {e}") from e
    if handle is not None:
        return handle
    raise _type_error(
        "stream: expected None, an int handle, a torch.cuda.Stream or an object with "
        f"__cuda_stream__, got {type(stream).__name__}"
    )


# --------------------------------------------------------------------------------------------
# Transfers

# Transfers whose Python handle went away before they were done: their objects stay referenced
# here until the transfer completes (checked at every submission and at exit).
_orphans: list = []
_orphans_lock = threading.RLock()  # __del__ may run (garbage collection) while it is held


def _prune_orphans() -> None:
    if not _orphans:
        return
    with _orphans_lock:
        _orphans[:] = [(t, keep) for (t, keep) in _orphans if not t.done()]


class Transfer:
    """Handle of one submitted transfer.

    It keeps the Python objects of the transfer (tensors, index arrays) alive until the transfer
    is done, so that their memory cannot be freed or reused while blocks are in flight, even if
    this handle is dropped first.
    """

    __slots__ = ("_t", "_keep")

    def __init__(self, t: Any, keep: tuple) -> None:
        self._t = t
        self._keep = keep  # the C++ handle holds the DLPack exports (t.keep) itself

    def done(self) -> bool:
        """True once every byte is in place (or the transfer failed). Never blocks."""
        if self._t.done():
            self._release()
            return True
        return False

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Blocks until the transfer is done (the GIL is released meanwhile).

        Returns True when it is done, False if ``timeout`` seconds passed first. Raises the
        transfer's :class:`gfd.Error` if it failed.
        """
        try:
            ok = self._t.wait(timeout)
        except BaseException:
            if self._t.done():
                self._release()
            raise
        if ok:
            self._release()
        return ok

    def error(self) -> Optional[Error]:
        """The failure of the transfer as a :class:`gfd.Error`, or None. Blocks like wait()."""
        e = self._t.error()
        self._release()
        return e

    @property
    def bytes(self) -> int:
        """Payload bytes this transfer moves."""
        return self._t.bytes

    def _release(self) -> None:
        if self._keep is not None:
            self._keep = None
            self._t.keep = []

    def __repr__(self) -> str:
        state = "done" if self._t.done() else "in flight"
        return f"gfd.Transfer({self._t.bytes} bytes, {state})"

    def __del__(self) -> None:
        try:
            if self._keep is not None and not self._t.done():
                with _orphans_lock:
                    _orphans.append((self._t, self._keep))
        except Exception:  # interpreter shutdown
            pass


# --------------------------------------------------------------------------------------------
# Engines

_engines: "weakref.WeakSet[Engine]" = weakref.WeakSet()


def _names(name: str, value: Any) -> tuple:
    """(objects, [(name, count)]) for a tensor or a list of tensors."""
    if isinstance(value, (list, tuple)):
        return list(value), [(name, len(value))]
    if value is None or isinstance(value, (str, bytes, int, float, dict)):
        raise _type_error(f"register_caches: {name}: expected a tensor or a list of tensors, got "
                          f"{type(value).__name__}")
    return [value], [(name, 0)]


class Engine:
    """A transfer engine bound to one GPU.

    ``gfd.Engine(device=0, **options)`` takes every option of gfd::EngineOptions by name
    (see :data:`gfd.option_names` and the README's option table), with the defaults for the
    rest; ``gfd.Engine.from_env(**options)`` starts from the GFD_* environment variables
    instead. Sizes take ints or strings such as ``"64M"``; ``backend`` and ``staging_writes``
    take names (``"gather"``, ``"auto"``...).

    An engine owns a pinned staging ring, a pool of gather threads and its copy streams; keep one
    per GPU for the life of the process. It is thread-safe. Use it as a context manager or call
    :meth:`close`; engines still open at exit are closed then.
    """

    def __init__(self, device: int = 0, **options: Any) -> None:
        if device is None:
            raise _type_error("Engine: device: expected an int, got NoneType")
        self._init(_gfd._Engine(device, options, False))

    @classmethod
    def from_env(cls, device: Optional[int] = None, **options: Any) -> "Engine":
        """An engine configured by the GFD_* environment variables (GFD_DEVICE included, unless
        ``device`` is given), then by ``options``."""
        self = cls.__new__(cls)
        self._init(_gfd._Engine(device, options, True))
        return self

    @classmethod
    def _wrap(cls, core: Any) -> "Engine":
        self = cls.__new__(cls)
        self._init(core)
        return self

    def _init(self, core: Any) -> None:
        self._core = core
        self._device = core.device
        self._emulated = core.emulated
        _engines.add(self)

    # -- life ----------------------------------------------------------------------------------

    @property
    def device(self) -> int:
        """The CUDA device ordinal this engine serves."""
        return self._device

    @property
    def closed(self) -> bool:
        return self._core.closed

    def close(self) -> None:
        """Waits for every submitted transfer, then frees the engine's threads, staging ring and
        streams. Idempotent. Transfers submitted earlier may still be waited on afterwards."""
        core = self.__dict__.get("_core")
        if core is not None and not core.closed:
            core.close()

    def __del__(self) -> None:
        # Waits for the engine's transfers with the GIL released (the compiled engine's own
        # destructor would wait holding it).
        try:
            self.close()
        except Exception:
            pass

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        if self.closed:
            return f"gfd.Engine(device={self._device}, closed)"
        o = self._core.options()
        return f"gfd.Engine(device={self._device}, backend={o['backend']!r})"

    # -- state ---------------------------------------------------------------------------------

    def options(self) -> dict:
        """The options in force (automatic choices resolved), by name."""
        return self._core.options()

    def stats(self) -> dict:
        """Counters since creation (bytes, transfers, blocks, chunks, seconds spent gathering,
        in DMA, waiting and planning) and what the engine got (hugepages, numa_node,
        gather_threads, staging_bytes, cpus, ...): see gfd::EngineStats."""
        return self._core.stats()

    # -- transfers -----------------------------------------------------------------------------

    def _stream(self, stream: Any) -> Optional[int]:
        return _stream_handle(stream, self._device, self._emulated)

    def copy_to_device(self, src_ptrs: Any, dst_ptrs: Any, sizes: Any, stream: Any = None) -> Transfer:
        """Copies ``sizes[i]`` bytes from host address ``src_ptrs[i]`` (pinned or pageable) to
        device address ``dst_ptrs[i]`` on this engine's GPU, for every i, ordered on ``stream``.

        The arrays are integer numpy arrays, CPU tensors or lists (``sizes`` may be one int for
        all blocks). Every block is validated first; a bad one raises :class:`gfd.Error` with
        ``.block`` set to its index, and nothing is copied. Returns once every DMA is enqueued
        (the gather threads copy meanwhile); work queued on ``stream`` afterwards sees the data. Sources must
        stay unchanged until the transfer is done.
        """
        s = self._stream(stream)
        t = self._core.copy_to_device(src_ptrs, dst_ptrs, sizes, s)
        _prune_orphans()
        return Transfer(t, (src_ptrs, dst_ptrs, sizes))

    def copy_to_host(self, src_ptrs: Any, dst_ptrs: Any, sizes: Any, stream: Any = None) -> Transfer:
        """Copies blocks from this engine's GPU (``src_ptrs``) to host memory (``dst_ptrs``),
        after the work already queued on ``stream``; the transfer is done when every byte is in
        host memory. Arguments and validation as for :meth:`copy_to_device`."""
        s = self._stream(stream)
        t = self._core.copy_to_host(src_ptrs, dst_ptrs, sizes, s)
        _prune_orphans()
        return Transfer(t, (src_ptrs, dst_ptrs, sizes))

    def register_caches(self, host: Any, device: Any) -> "CacheSet":
        """Describes a runtime's caches to the engine once: ``host[i]`` (a host tensor, pinned for
        speed) mirrors ``device[i]`` (a tensor on this engine's GPU), for every i; single tensors
        or equally long lists (every layer's K and V, say). Each tensor's first dimension indexes
        blocks and the rest of a block is contiguous; a pair has one dtype and block size.

        Checked here (device, extents, pinned or not, no two tensors sharing a byte), so that
        :meth:`copy_blocks` only checks block ids. The set keeps its tensors alive. Errors name
        the tensor (``host[3]``, ``device[0]``).
        """
        hosts, host_names = _names("host", host)
        devices, device_names = _names("device", device)
        return CacheSet(self, self._core.register_caches(hosts, devices, host_names, device_names))

    def copy_blocks(self, caches: Any, direction: Any, src_ids: Any, dst_ids: Any,
                    stream: Any = None, after_each: Any = None) -> Any:
        """One transfer on a registered :class:`CacheSet`: block ``src_ids[i]`` to block
        ``dst_ids[i]`` of every pair, for every i. ``direction``: :attr:`Direction.TO_DEVICE`
        (or ``"to_device"``: ``src_ids`` index the host tensors) or :attr:`Direction.TO_HOST`
        (``"to_host"``). The ids are 1-D integer numpy arrays, CPU tensors or lists (int32 and
        int64 arrays are read in place).

        Ordered on ``stream`` (default: torch's current stream); the call checks the ids (in
        range, no destination id twice; a bad one raises :class:`gfd.InvalidArgument` whose
        ``.block`` is its position i) and returns once every DMA is enqueued.

        ``caches`` may be a list of CacheSets (a model's layers, say): then one transfer per set
        with the same ids, issued in order on ``stream`` in this one call, each starting after
        the previous one has completed, so that the sets complete in order; ``after_each(k)`` is
        called once set k's transfer is enqueued and before the next (record layer k's event on
        ``stream`` there: the forward pass may wait for layer k alone). Returns the list of
        Transfers. Every id is checked against every set before anything moves.
        """
        # Done transfers whose handles were dropped are let go after the submission, not before:
        # a load's first copies are not held up behind the previous batch's bookkeeping.
        s = self._stream(stream)
        if isinstance(caches, (list, tuple)):
            core_sets = []
            for i, c in enumerate(caches):
                if not isinstance(c, CacheSet):
                    raise _type_error(f"copy_blocks: caches[{i}]: expected a gfd.CacheSet, got {type(c).__name__}")
                if c._engine is not self:
                    raise _error(f"copy_blocks: caches[{i}]: a CacheSet made by another engine's register_caches")
                core_sets.append(c._set)
            if after_each is not None and not callable(after_each):
                raise _type_error(f"copy_blocks: after_each: expected a callable, got {type(after_each).__name__}")
            ts = self._core.copy_blocks_sets(core_sets, direction, src_ids, dst_ids, s, after_each)
            _prune_orphans()
            return [Transfer(t, (c, src_ids, dst_ids)) for t, c in zip(ts, caches)]
        if after_each is not None:
            raise _error("copy_blocks: after_each: only with a list of CacheSets")
        if not isinstance(caches, CacheSet):
            raise _type_error(f"copy_blocks: caches: expected a gfd.CacheSet, got {type(caches).__name__}")
        if caches._engine is not self:
            raise _error("copy_blocks: caches: a CacheSet made by another engine's register_caches")
        t = self._core.copy_blocks(caches._set, direction, src_ids, dst_ids, s)
        _prune_orphans()
        return Transfer(t, (caches, src_ids, dst_ids))


class CacheSet:
    """Caches registered with one engine (:meth:`Engine.register_caches`): pairs of a host and a
    device tensor of blocks, checked once; transfers on it (:meth:`Engine.copy_blocks`) pass only
    block ids. Keeps its tensors alive."""

    __slots__ = ("_engine", "_set", "__weakref__")

    def __init__(self, engine: "Engine", core_set: Any) -> None:
        self._engine = engine
        self._set = core_set

    @property
    def pairs(self) -> int:
        """Number of (host, device) tensor pairs."""
        return self._set.pairs

    @property
    def host_pinned(self) -> bool:
        """Whether every host tensor lies in pinned memory."""
        return self._set.host_pinned

    @property
    def bytes_per_id(self) -> int:
        """Bytes one block id moves (every pair's block size summed)."""
        return self._set.bytes_per_id

    @property
    def host_blocks(self) -> int:
        """Blocks of the smallest host tensor (host ids must be below)."""
        return self._set.host_blocks

    @property
    def device_blocks(self) -> int:
        """Blocks of the smallest device tensor (device ids must be below)."""
        return self._set.device_blocks

    def __repr__(self) -> str:
        return (f"gfd.CacheSet({self.pairs} pairs, {self.bytes_per_id} bytes per id, "
                f"host_pinned={self.host_pinned})")


@atexit.register
def _close_all() -> None:
    """Closes every engine still open at exit (waiting for their transfers), while the CUDA
    runtime is still there."""
    for e in list(_engines):
        try:
            e.close()
        except Exception:
            pass
    with _orphans_lock:
        _orphans.clear()


# --------------------------------------------------------------------------------------------
# Pinned host memory


def _dtype_name(dtype: Any, what: str = "dtype") -> str:
    """'float16' for 'float16', torch.float16, numpy.float16 or numpy.dtype('float16')."""
    if isinstance(dtype, str):
        name = dtype
    elif isinstance(dtype, type):
        name = {float: "float64", int: "int64", bool: "bool"}.get(dtype, dtype.__name__)
    else:
        name = getattr(dtype, "name", None)
        if not isinstance(name, str):
            name = str(dtype)
    name = name[len("torch."):] if name.startswith("torch.") else name
    if name not in _ITEMSIZE:
        raise _error(f"{what}: '{name}' is not a dtype gfd knows ({', '.join(_gfd.dtype_names)})")
    return name


class HostPool:
    """Pinned host memory for a runtime's KV pool, placed where the gather path reads it fastest:
    huge pages where the system gives them (reserved hugetlb pages, else transparent huge pages,
    else ordinary pages), bound to the GPU's NUMA node, registered with CUDA (portable: every GPU
    of the process, and so several engines, can use it). ``bytes`` is rounded up to 2 MiB.

    ``device``: the GPU whose NUMA node the memory goes on (-1: none). ``numa_node``: -1 = that
    GPU's node, >= 0 = this node, -2 = no binding. ``register=False`` gives pageable memory with
    the same pages and placement (no GPU needed).

    :meth:`view` makes typed buffers of it; the pool's memory lives as long as the pool or any
    buffer or tensor made from it.
    """

    def __init__(self, bytes: int, device: int = 0, numa_node: int = -1, register: bool = True) -> None:
        if type(register).__name__ == "bool_":  # numpy.bool_
            register = bool(register)
        self._pool = _gfd._HostPool(bytes, device, numa_node, register)

    @classmethod
    def _wrap(cls, pool: Any) -> "HostPool":
        self = cls.__new__(cls)
        self._pool = pool
        return self

    @property
    def data(self) -> int:
        """Address of the first byte (2 MiB aligned)."""
        return self._pool.data

    @property
    def bytes(self) -> int:
        """Usable bytes (the requested size rounded up to 2 MiB)."""
        return self._pool.bytes

    @property
    def hugepages(self) -> str:
        """'hugetlb', 'transparent' or 'none': the pages behind the pool."""
        return self._pool.hugepages

    @property
    def numa_node(self) -> int:
        """The node the memory is bound to, or -1."""
        return self._pool.numa_node

    @property
    def registered(self) -> bool:
        """Whether the pool is registered with CUDA (page-locked)."""
        return self._pool.registered

    @property
    def device(self) -> int:
        return self._pool.device

    def view(self, shape: Any, dtype: Any = "uint8", offset: int = 0) -> Buffer:
        """A :class:`gfd.Buffer` of ``shape`` and ``dtype`` at byte ``offset`` of the pool
        (compact, row-major); ``torch.from_dlpack`` or ``numpy.asarray`` turn it into a tensor
        or array sharing the memory."""
        return self._pool.view(shape, _dtype_name(dtype, "view: dtype"), offset)

    def __repr__(self) -> str:
        return (f"gfd.HostPool({self.bytes} bytes, hugepages={self.hugepages!r}, "
                f"numa_node={self.numa_node}, registered={self.registered})")


def empty_pinned(shape: Any, dtype: Any = "uint8", device: int = 0, numa_node: int = -1) -> Buffer:
    """An uninitialised (in fact zero-filled) pinned host array of ``shape`` and ``dtype`` in a
    :class:`HostPool` of its own (huge pages, the GPU's NUMA node, registered with CUDA).

    Returns a :class:`gfd.Buffer`; ``torch.from_dlpack(buf)`` gives a CPU tensor on it (pinned:
    ``is_pinned()`` is True), ``numpy.asarray(buf)`` a numpy array. The memory lives as long as
    any of them. ``dtype``: a torch or numpy dtype or its name ('float16', 'bfloat16', ...).
    """
    name = _dtype_name(dtype, "empty_pinned: dtype")
    dims = _gfd._shape(shape, "empty_pinned: shape")
    n = _ITEMSIZE[name]
    for d in dims:
        n *= d  # Python ints: exact
    if n > 1 << 46:
        raise _error(f"empty_pinned: shape: {n} bytes is more than a host pool takes")
    pool = HostPool(max(1, n), device, numa_node, True)
    return pool.view(dims, name, 0)


_ITEMSIZE = {
    "bool": 1, "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4,
    "int64": 8, "uint64": 8, "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8,
    "float8_e4m3fn": 1, "float8_e5m2": 1,
}

"""A KV-offloading worker on gfd: jobs of (block, layer) copies between a GPU's paged caches and
host caches laid out as vLLM's CPU offloading lays them out, each job ONE gfd transfer.

This module does not import vLLM (``gfd.vllm`` is the thin glue that does), so that the worker's
logic (descriptors from block ids, jobs, results) is tested where vLLM is not installed: on the
emulated device in CI and on a GPU machine.

The layout, as vLLM's ``CPUOffloadingWorker`` has it (``vllm/v1/kv_offload/cpu/gpu_worker.py``):

- ``gpu_caches[t]`` is one canonical KV tensor viewed as ``(num_gpu_blocks, page_bytes[t])``
  bytes: a GPU block is one row.
- ``host_caches[t]`` is ``(num_chunks, page_bytes[t] * blocks_per_chunk)`` bytes: a host chunk
  holds ``blocks_per_chunk`` consecutive GPU blocks' pages of tensor t.
- ``groups[g]`` lists the tensors of KV-cache group g. A job gives, per group, ``group_sizes[g]``
  GPU block ids and the host chunks holding them; the first chunk may start mid-chunk, at
  ``block_indices[g] % blocks_per_chunk``.

A job moves, for every group g, every tensor t of g and every GPU block of g, the page of that
block between the GPU row and its sub-block of the host chunk. Sub-block j of chunk c is host
"block" ``c * blocks_per_chunk + j`` of the host cache viewed as ``page_bytes[t]`` rows, so the
job is a list of (host block id, GPU block id) rows applied to every tensor: one
:meth:`gfd.Engine.copy_blocks` on a :class:`gfd.CacheSet` registered once. When every group has
the same tensors (one group, or vLLM's hybrid groups sharing their tensors) the groups' rows are
concatenated into ONE transfer; groups with different tensors move as one transfer each (the job
is done when all are).

Submission does not block: :meth:`KVTransferWorker.submit` checks the job's shape, orders it after
the work queued so far on the caller's stream (one event) and hands it to a submitter thread,
which builds the ids, submits the transfer on a stream of the worker's (one per direction, so
jobs of one direction complete in order; expedited loads have their own) and records its end.
The caller's stream never waits for a job: completion is seen by :meth:`get_finished` (a poll)
or :meth:`wait`.
"""

from __future__ import annotations

import collections
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterable, List, Optional, Sequence

import numpy as np

from . import Direction, Engine, Error, HostPool, _error, _gfd, _type_error

__all__ = ["KVTransferWorker", "JobResult", "host_block_ids"]


@dataclass
class JobResult:
    """One finished job: what vLLM's ``TransferResult`` carries, plus the failure, if any."""

    job_id: int
    success: bool
    bytes: int
    seconds: float
    error: Optional[BaseException] = None


def host_block_ids(chunk_ids: np.ndarray, blocks_per_chunk: int, count: int, skip: int) -> np.ndarray:
    """Host block ids (sub-blocks of chunks) of ``count`` GPU blocks starting ``skip`` sub-blocks
    into the first chunk of ``chunk_ids``: chunk c, sub-block j is id ``c * blocks_per_chunk + j``.
    """
    c = np.asarray(chunk_ids, dtype=np.int64)
    if blocks_per_chunk == 1:
        return c[:count]
    ids = (c[:, None] * blocks_per_chunk + np.arange(blocks_per_chunk, dtype=np.int64)[None, :]).ravel()
    return ids[skip:skip + count]


class _Lane:
    """Jobs of one direction (or expedited loads): a stream of the worker's and, in order, the
    jobs submitted on it that are not reported yet."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream
        self.jobs: "collections.deque[_Job]" = collections.deque()


@dataclass
class _Job:
    job_id: int
    lane: _Lane
    to_device: bool
    chunks: np.ndarray       # the host chunk ids, as given
    blocks: np.ndarray       # the GPU block ids, as given
    slices: list             # per group with blocks: (set key, first chunk, chunks, first block, blocks, skip)
    bytes: int
    ready: Any = None        # the caller's stream at submission (an event), or None
    submitted: bool = False  # the submitter thread is through with it
    transfers: Optional[list] = None
    error: Optional[BaseException] = None
    start_event: Any = None
    end_event: Any = None
    t0: float = 0.0
    t1: Optional[float] = None


class KVTransferWorker:
    """Offloading jobs between ``gpu_caches`` and host caches of the same tensors.

    ``engine``: the gfd.Engine of the caches' GPU. ``gpu_caches``: per tensor, a 2-D
    ``(num_gpu_blocks, page_bytes)`` byte array on that GPU (torch tensor, DLPack or CUDA array
    interface object). ``groups``: per KV-cache group, the indices of its tensors.
    ``blocks_per_chunk``: GPU blocks per host chunk. ``num_chunks``: host chunks per tensor.

    ``host_caches``: per tensor, a ``(num_chunks, page_bytes * blocks_per_chunk)`` host byte
    array to use; None: the worker allocates them, in one :class:`gfd.HostPool` (huge pages, the
    GPU's NUMA node, pinned) with ``host_memory="pool"``, or as pinned torch tensors with
    ``host_memory="torch"`` (what vLLM's CPU worker allocates).

    ``host_layout``: ``"tensor"`` (vLLM's: one host array per tensor, a chunk's pages of that
    tensor together) or ``"block"`` (one host array of ``num_chunks * blocks_per_chunk`` rows,
    a row holding one GPU block's page of every tensor side by side: a job's host side is then
    one contiguous run per block, which the copy engine reads in place, with no CPU copy; and where the GPU tensors are views of one allocation at a
    constant stride, as vLLM 0.33 makes them, each block of a job is one 2D copy, see
    EngineOptions::strided_min_rows). Only with host memory the worker allocates.

    ``copy_bytes``: per tensor, the bytes of a page that a job moves (a page's unpadded size;
    None: the whole page).
    """

    def __init__(self, engine: Engine, gpu_caches: Sequence[Any], groups: Sequence[Sequence[int]],
                 blocks_per_chunk: int, num_chunks: int, *, host_caches: Optional[Sequence[Any]] = None,
                 host_memory: str = "pool", host_layout: str = "tensor",
                 copy_bytes: Optional[Sequence[int]] = None) -> None:
        fn = "KVTransferWorker"
        if not isinstance(engine, Engine):
            raise _type_error(f"{fn}: engine: expected a gfd.Engine, got {type(engine).__name__}")
        self._engine = engine
        self._bpc = _gfd._int(blocks_per_chunk, f"{fn}: blocks_per_chunk", 1, _MAX_ROWS)
        self._num_chunks = _gfd._int(num_chunks, f"{fn}: num_chunks", 1, _MAX_ROWS // self._bpc)
        self._gpu = _list(gpu_caches, f"{fn}: gpu_caches")
        if not self._gpu:
            raise _error(f"{fn}: gpu_caches: no tensor given")
        self._pages = [_row_bytes(t, f"{fn}: gpu_caches[{i}]") for i, t in enumerate(self._gpu)]
        self._gpu_blocks = min(_rows_of(t) for t in self._gpu)
        if copy_bytes is None:
            self._copy = list(self._pages)
        else:
            self._copy = [_gfd._int(b, f"{fn}: copy_bytes[{t}]", 1, p)
                          for t, (b, p) in enumerate(zip(_list(copy_bytes, f"{fn}: copy_bytes"), self._pages))]
            if len(self._copy) != len(self._gpu) or len(copy_bytes) != len(self._gpu):
                raise _error(f"{fn}: copy_bytes: {len(copy_bytes)} sizes for {len(self._gpu)} GPU tensors")
        self._groups = []
        for g, members in enumerate(_list(groups, f"{fn}: groups")):
            m = [_gfd._int(t, f"{fn}: groups[{g}][{i}]", 0, len(self._gpu) - 1)
                 for i, t in enumerate(_list(members, f"{fn}: groups[{g}]"))]
            if len(set(m)) != len(m):
                raise _error(f"{fn}: groups[{g}]: a tensor is listed twice")
            self._groups.append(m)
        if not self._groups:
            raise _error(f"{fn}: groups: no group given")
        for name, value, allowed in (("host_memory", host_memory, ("pool", "torch")),
                                     ("host_layout", host_layout, ("tensor", "block"))):
            if not isinstance(value, str):
                raise _type_error(f"{fn}: {name}: expected one of {allowed}, got {type(value).__name__}")
            if value not in allowed:
                raise _error(f"{fn}: {name}: expected one of {allowed}, got {value!r}")
        rows = self._num_chunks * self._bpc  # both checked above: the product fits an int64 id
        if rows * sum(self._pages) > _MAX_HOST_BYTES:
            raise _error(f"{fn}: num_chunks: {self._num_chunks} chunks of {self._bpc} blocks of "
                         f"{sum(self._pages)} bytes is more host memory than a worker takes")
        self._torch = _torch_for(self._gpu[0])
        self._pools: List[HostPool] = []  # the HostPools the worker allocated
        self._layout = host_layout
        if host_layout == "block":
            if host_caches is not None:
                raise _error("host_layout: 'block' allocates its own host memory; host_caches must be None")
            self._host = None
            whole = self._allocate(host_memory, (rows, sum(self._pages)))
            self._host_block = whole
            offsets = np.cumsum([0] + self._pages[:-1]).tolist()
            self._rows = [_columns(whole, o, p) for o, p in zip(offsets, self._pages)]
        elif host_layout == "tensor":
            if host_caches is None:
                host_caches = [self._allocate(host_memory, (self._num_chunks, p * self._bpc)) for p in self._pages]
            self._host = _list(host_caches, f"{fn}: host_caches")
            self._host_block = None
            if len(self._host) != len(self._gpu):
                raise _error(f"{fn}: host_caches: {len(self._host)} arrays for {len(self._gpu)} GPU tensors")
            for t, h in enumerate(self._host):
                want = (self._num_chunks, self._pages[t] * self._bpc)
                got = _shape_of(h, f"{fn}: host_caches[{t}]")
                if got != want or _row_bytes(h, f"{fn}: host_caches[{t}]") != want[1]:
                    raise _error(f"{fn}: host_caches[{t}]: expected {want[0]} x {want[1]} bytes, got shape {got}")
            self._rows = [_as_rows(h, p, rows) for h, p in zip(self._host, self._pages)]
        # One set of (host sub-block rows, GPU rows) pairs per distinct tensor list; groups with
        # the same tensors share theirs (and their rows go in one transfer).
        self._sets: dict = {}
        self._group_set: List[Optional[tuple]] = []
        for members in self._groups:
            key = tuple(sorted(members))
            if key and key not in self._sets:
                hosts = [self._rows[t][:, :self._copy[t]] for t in key]
                gpus = [self._gpu[t] if self._copy[t] == self._pages[t] else _first_bytes(self._gpu[t], self._copy[t], t)
                        for t in key]
                self._sets[key] = engine.register_caches(hosts, gpus)
            self._group_set.append(key if key else None)
        self._one_set = len(self._sets) == 1
        self._bytes_per_row = {k: s.bytes_per_id for k, s in self._sets.items()}
        stream = self._new_stream
        self._lanes = {"store": _Lane(stream()), "load": _Lane(stream()), "expedited": _Lane(stream())}
        self._by_id: dict = {}
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._queue: "collections.deque[_Job]" = collections.deque()
        self._events: list = []
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"gfd-kv-worker-{engine.device}", daemon=True)
        self._thread.start()

    # -- setup ---------------------------------------------------------------------------------

    def _allocate(self, kind: str, shape: tuple) -> Any:
        """One pinned host byte array of ``shape``: in a HostPool of its own (``"pool"``: huge
        pages on the GPU's NUMA node) or a pinned torch tensor (``"torch"``)."""
        if kind == "pool":
            if getattr(self._engine, "_emulated", False):
                from . import testing  # the emulated device registers its own pinned memory
                return np.asarray(testing.pinned_buffer(self._engine, shape, "int8"))
            pool = HostPool(max(shape[0] * shape[1], 1), device=self._engine.device)
            self._pools.append(pool)
            view = pool.view(shape, "int8", 0)
            return self._torch.from_dlpack(view) if self._torch is not None else np.asarray(view)
        if kind == "torch":
            torch = self._torch or sys.modules.get("torch")
            if torch is None:
                raise _error("host_memory: 'torch' needs torch")
            return torch.zeros(shape, dtype=torch.int8, pin_memory=True)
        raise _error(f"host_memory: expected 'pool' or 'torch', got {kind!r}")

    def _new_stream(self) -> Any:
        if self._torch is not None:
            return self._torch.cuda.Stream(device=self._engine.device)
        return None  # the emulated device's stand-in for a stream

    @property
    def host_caches(self) -> list:
        """Per tensor, the ``(num_chunks, page_bytes * blocks_per_chunk)`` host array (the
        "tensor" layout; the "block" layout has no such arrays: see :meth:`host_rows`)."""
        if self._host is None:
            raise _error("host_caches: the 'block' layout keeps one array (host_rows gives each tensor's view)")
        return list(self._host)

    def host_rows(self, tensor: int) -> Any:
        """Tensor ``tensor``'s host pages as ``(num_chunks * blocks_per_chunk, page_bytes)``
        rows (a view; row ``chunk * blocks_per_chunk + j`` is sub-block j of that chunk), in
        either layout."""
        return self._rows[tensor]

    @property
    def host_layout(self) -> str:
        return self._layout

    # -- jobs ----------------------------------------------------------------------------------

    def submit(self, job_id: int, to_device: bool, chunk_ids: Any, gpu_block_ids: Any,
               group_sizes: Optional[Sequence[int]] = None, block_indices: Optional[Sequence[int]] = None,
               expedited: bool = False) -> bool:
        """Queues one job: host chunks ``chunk_ids`` to GPU blocks ``gpu_block_ids``
        (``to_device``) or back. ``group_sizes[g]`` GPU blocks belong to group g, in order
        (None: one group, all of them); the chunks follow in the same order, each group's first
        starting ``block_indices[g] % blocks_per_chunk`` sub-blocks in. Returns True once queued.

        Checked in the call, before anything is queued (a :class:`gfd.InvalidArgument` or
        :class:`gfd.InvalidType` naming the argument): every argument's type (integers only:
        Python ints or numpy/torch integer arrays and scalars, no bool or float), every chunk id
        below ``num_chunks``, every GPU block id below the GPU caches' blocks, the group sizes
        (non-negative, summing to the GPU block ids given) and the chunks they use. What only
        the transfer checks (a GPU block or host sub-block given twice as a destination) makes
        the job fail: :meth:`get_finished` reports it with ``success=False``, nothing moved.
        Never waits for data.
        """
        if self._closed:
            raise _error("submit: the worker is shut down", code="shutdown")
        # Every argument checked here, before anything is queued: integers only (bool and float
        # rejected, also inside lists), every id in range, so that no later arithmetic can wrap.
        job_id = _gfd._int(job_id, "submit: job_id", -(1 << 63), (1 << 63) - 1)
        to_device = _flag(to_device, "submit: to_device")
        expedited = _flag(expedited, "submit: expedited")
        chunks = np.frombuffer(_gfd._int64_array(chunk_ids, "submit: chunk_ids", self._num_chunks - 1,
                                                 f"the worker has {self._num_chunks} chunks"), dtype=np.int64)
        blocks = np.frombuffer(_gfd._int64_array(gpu_block_ids, "submit: gpu_block_ids", self._gpu_blocks - 1,
                                                 f"the GPU caches have {self._gpu_blocks} blocks"), dtype=np.int64)
        groups = len(self._groups)
        if group_sizes is None:
            group_sizes = [len(blocks)] + [0] * (groups - 1)
        else:
            group_sizes = _gfd._ints(group_sizes, "submit: group_sizes", len(blocks))
        if block_indices is None:
            block_indices = [0] * len(group_sizes)
        else:
            block_indices = _gfd._ints(block_indices, "submit: block_indices", (1 << 63) - 1)
        if len(group_sizes) != groups:
            raise _error(f"submit: group_sizes: {len(group_sizes)} sizes for {groups} groups")
        if len(block_indices) != groups:
            raise _error(f"submit: block_indices: {len(block_indices)} indices for {groups} groups")
        if sum(group_sizes) != len(blocks):
            raise _error(f"submit: group_sizes: the sizes sum to {sum(group_sizes)}, gpu_block_ids has "
                         f"{len(blocks)} blocks")
        # Only the shape of the job is checked further here; the submitter thread builds the
        # ids, so that the caller is back at once.
        slices = []  # (set key, first chunk, chunks, first block, blocks, skip)
        c0 = b0 = 0
        total = 0
        for g, (n, first) in enumerate(zip(group_sizes, block_indices)):
            if n == 0:
                continue
            skip = first % self._bpc
            used = -(-(n + skip) // self._bpc)
            if c0 + used > len(chunks):
                raise _error(f"submit: chunk_ids: group {g} needs {used} chunks from position {c0}, "
                             f"{len(chunks)} given")
            key = self._group_set[g]
            if key is None:
                raise _error(f"submit: group_sizes: group {g} has blocks but no tensors")
            slices.append((key, c0, used, b0, n, skip))
            total += n * self._bytes_per_row[key]
            c0 += used
            b0 += n
        if c0 != len(chunks):
            raise _error(f"submit: chunk_ids: {len(chunks)} chunks given, the groups use {c0}")
        lane = self._lanes["store" if not to_device else "expedited" if expedited else "load"]
        job = _Job(job_id, lane, bool(to_device), chunks, blocks, slices, total)
        with self._lock:
            if job_id in self._by_id:
                raise _error(f"submit: job {job_id} is already in flight")
        job.ready = self._mark_caller_stream()
        job.t0 = time.perf_counter()
        with self._lock:
            if job_id in self._by_id:  # submitted meanwhile from another thread
                if job.ready is not None:
                    self._events.append(job.ready)
                raise _error(f"submit: job {job_id} is already in flight")
            self._by_id[job_id] = job
            lane.jobs.append(job)
            self._queue.append(job)
            self._wake.notify()
        return True

    def _mark_caller_stream(self) -> Any:
        """An event recorded on the caller's current stream: the job starts after it."""
        if self._torch is None:
            return None
        torch = self._torch
        ev = self._events.pop() if self._events else torch.cuda.Event(enable_timing=False)
        ev.record(torch.cuda.current_stream(self._engine.device))
        return ev

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._queue and not self._closed:
                    self._wake.wait()
                if not self._queue:
                    return
                # Expedited loads first: they are waited on within the step.
                job = next((j for j in self._queue if j.lane is self._lanes["expedited"]), None) or self._queue[0]
                self._queue.remove(job)
            self._submit(job)
            with self._lock:
                job.submitted = True
                self._wake.notify_all()

    def _submit(self, job: _Job) -> None:
        torch = self._torch
        stream = job.lane.stream
        try:
            if torch is not None:
                stream.wait_event(job.ready)
                job.start_event = torch.cuda.Event(enable_timing=True)
                job.start_event.record(stream)
            job.transfers = []
            for caches, src, dst in self._parts(job):
                job.transfers.append(self._engine.copy_blocks(
                    caches, Direction.TO_DEVICE if job.to_device else Direction.TO_HOST, src, dst, stream=stream))
            if torch is not None:
                job.end_event = torch.cuda.Event(enable_timing=True)
                job.end_event.record(stream)
        except BaseException as e:  # noqa: BLE001 - reported as a failed job
            job.error = e
        finally:
            if torch is not None and job.ready is not None:
                self._events.append(job.ready)
                job.ready = None

    def _parts(self, job: _Job) -> list:
        """The job's transfers: (CacheSet, source ids, destination ids) per set of tensors, the
        rows of every group on that set concatenated."""
        rows: dict = {}
        for key, c0, used, b0, n, skip in job.slices:
            host = host_block_ids(job.chunks[c0:c0 + used], self._bpc, n, skip)
            rows.setdefault(key, []).append((host, job.blocks[b0:b0 + n]))
        parts = []
        for key, r in rows.items():
            host = r[0][0] if len(r) == 1 else np.concatenate([x[0] for x in r])
            gpu = r[0][1] if len(r) == 1 else np.concatenate([x[1] for x in r])
            src, dst = (host, gpu) if job.to_device else (gpu, host)
            parts.append((self._sets[key], np.ascontiguousarray(src), np.ascontiguousarray(dst)))
        return parts

    def _finished(self, job: _Job) -> bool:
        # A job whose later part failed to submit is done only once its earlier parts are: until
        # then they still read or write its blocks.
        return job.submitted and all(t.done() for t in job.transfers or [])

    def _result(self, job: _Job) -> JobResult:
        err = job.error
        if err is None:
            for t in job.transfers:
                e = t.error()
                if e is not None:
                    err = e
                    break
        if job.start_event is not None and job.end_event is not None and err is None:
            try:
                job.end_event.synchronize()  # done already: the transfers' ends are before it
                seconds = job.start_event.elapsed_time(job.end_event) * 1e-3
            except Exception:  # noqa: BLE001 - a failed device: no time
                seconds = time.perf_counter() - job.t0
        else:
            seconds = (job.t1 or time.perf_counter()) - job.t0
        return JobResult(job.job_id, err is None, job.bytes if err is None else 0, seconds, err)

    def get_finished(self) -> List[JobResult]:
        """The jobs done since the last call (each lane's in submission order). Never blocks."""
        out = []
        with self._lock:
            for lane in self._lanes.values():
                while lane.jobs and self._finished(lane.jobs[0]):
                    job = lane.jobs.popleft()
                    job.t1 = time.perf_counter()
                    del self._by_id[job.job_id]
                    out.append(job)
        return [self._result(j) for j in out]

    def wait(self, job_ids: Iterable[int]) -> None:
        """Blocks until every job of ``job_ids`` still in flight is done (ids not in flight are
        ignored); their results are still reported by :meth:`get_finished`."""
        for job_id in job_ids:
            with self._lock:
                job = self._by_id.get(job_id)
                if job is None:
                    continue
                while not job.submitted:
                    self._wake.wait()
            for t in job.transfers or []:
                try:
                    t.wait()
                except Error:
                    pass  # reported by get_finished

    def shutdown(self) -> None:
        """Submits what is queued, waits for every job in flight and stops the submitter
        thread. Idempotent; results not collected are dropped."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._wake.notify_all()
        self._thread.join()
        with self._lock:
            jobs = [j for lane in self._lanes.values() for j in lane.jobs]
        for job in jobs:
            for t in job.transfers or []:
                try:
                    t.wait()
                except Error:
                    pass
        with self._lock:
            for lane in self._lanes.values():
                lane.jobs.clear()
            self._by_id.clear()

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _torch_for(t: Any) -> Any:
    """torch, when ``t`` is a torch CUDA tensor (streams and events are torch's then)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(t, torch.Tensor) and t.is_cuda:
        return torch
    return None


#: The most host rows (chunks x blocks per chunk) and bytes a worker takes: ids and byte
#: offsets then stay far from int64's range.
_MAX_ROWS = 1 << 40
_MAX_HOST_BYTES = 1 << 50


def _list(value: Any, name: str) -> list:
    """``value`` as a list (a list, tuple or other sequence; not a str, dict or single number)."""
    if value is None or isinstance(value, (str, bytes, dict, int, float)) or not hasattr(value, "__len__"):
        raise _type_error(f"{name}: expected a list, got {type(value).__name__}")
    try:
        return list(value)
    except TypeError as e:
        raise _type_error(f"{name}: expected a list, got {type(value).__name__}") from e


def _flag(value: Any, name: str) -> bool:
    """A bool argument: Python's or numpy's bool, nothing else."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise _type_error(f"{name}: expected a bool, got {type(value).__name__}")


def _interface(t: Any) -> Optional[dict]:
    """The CUDA array interface or the array interface of ``t``, if it has one."""
    for attr in ("__cuda_array_interface__", "__array_interface__"):
        d = getattr(t, attr, None)
        if isinstance(d, dict):
            return d
    return None


def _shape_of(t: Any, name: str) -> tuple:
    shape = getattr(t, "shape", None)
    if shape is None:
        d = _interface(t)
        shape = d.get("shape") if d is not None else None
    if shape is None:
        raise _type_error(f"{name}: expected a 2-D array or tensor, got {type(t).__name__}")
    return tuple(_gfd._int(d, f"{name}: shape[{i}]", 0, (1 << 63) - 1) for i, d in enumerate(shape))


def _rows_of(t: Any) -> int:
    return _shape_of(t, "gpu_caches")[0]


def _row_bytes(t: Any, name: str) -> int:
    shape = _shape_of(t, name)
    if len(shape) != 2:
        raise _error(f"{name}: expected a 2-D (blocks, bytes) array, got shape {shape}")
    item = _itemsize(t, name)
    if item != 1:
        raise _error(f"{name}: expected a byte array (int8 or uint8), got {item}-byte elements")
    return shape[1]


def _itemsize(t: Any, name: str) -> int:
    """Bytes per element: the tensor's own ``itemsize`` or ``dtype``, else the typestr of its
    (CUDA) array interface, which an object need not mirror in a ``dtype`` attribute."""
    size = getattr(t, "itemsize", None)
    if isinstance(size, int) and not isinstance(size, bool):
        return size
    dtype = getattr(t, "dtype", None)
    size = getattr(dtype, "itemsize", None)
    if isinstance(size, int) and not isinstance(size, bool):
        return size
    d = _interface(t)
    typestr = d.get("typestr") if d is not None else None
    if typestr is None and dtype is not None:
        typestr = str(dtype)
    try:
        return int(np.dtype(typestr).itemsize)
    except (TypeError, ValueError) as e:
        raise _type_error(f"{name}: cannot tell its element type ({typestr!r})") from e


def _first_bytes(t: Any, n: int, index: int) -> Any:
    """The first ``n`` bytes of every row of a 2-D device array (a view)."""
    if not hasattr(t, "__getitem__"):
        raise _error(f"copy_bytes[{index}]: moving part of a page needs a tensor that can be sliced "
                     f"(a torch tensor); gpu_caches[{index}] is a {type(t).__name__}")
    return t[:, :n]


def _columns(whole: Any, offset: int, width: int) -> Any:
    """Columns [offset, offset + width) of every row of a 2-D byte array (a strided view)."""
    return whole[:, offset:offset + width]


def _as_rows(host: Any, page: int, rows: int) -> Any:
    """The host cache ``(chunks, page * bpc)`` as ``rows`` compact rows of ``page`` bytes (a view
    of the same memory: torch's view, else numpy's reshape of the array it sees)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(host, torch.Tensor):
        return host.view(rows, page)
    return np.asarray(host).reshape(rows, page)

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

from . import Engine, Error, HostPool, _error

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
    one contiguous run per block, which the copy engine reads in place, with no CPU copy, see
    EngineOptions::host_direct; and where the GPU tensors are views of one allocation at a
    constant stride, as vLLM 0.33 makes them, each block of a job is one 2D copy, see
    EngineOptions::strided_min_rows). Only with host memory the worker allocates.

    ``copy_bytes``: per tensor, the bytes of a page that a job moves (a page's unpadded size;
    None: the whole page).
    """

    def __init__(self, engine: Engine, gpu_caches: Sequence[Any], groups: Sequence[Sequence[int]],
                 blocks_per_chunk: int, num_chunks: int, *, host_caches: Optional[Sequence[Any]] = None,
                 host_memory: str = "pool", host_layout: str = "tensor",
                 copy_bytes: Optional[Sequence[int]] = None) -> None:
        if not isinstance(engine, Engine):
            raise TypeError("engine: expected a gfd.Engine")
        if blocks_per_chunk < 1:
            raise _error(f"blocks_per_chunk: must be at least 1, got {blocks_per_chunk}")
        if num_chunks < 0:
            raise _error(f"num_chunks: must not be negative, got {num_chunks}")
        self._engine = engine
        self._bpc = int(blocks_per_chunk)
        self._num_chunks = int(num_chunks)
        self._gpu = list(gpu_caches)
        if not self._gpu:
            raise _error("gpu_caches: no tensor given")
        self._pages = [_row_bytes(t, f"gpu_caches[{i}]") for i, t in enumerate(self._gpu)]
        self._copy = list(self._pages) if copy_bytes is None else [int(b) for b in copy_bytes]
        if len(self._copy) != len(self._gpu):
            raise _error(f"copy_bytes: {len(self._copy)} sizes for {len(self._gpu)} GPU tensors")
        for t, (b, p) in enumerate(zip(self._copy, self._pages)):
            if not 0 < b <= p:
                raise _error(f"copy_bytes[{t}]: {b} bytes for pages of {p}")
        self._groups = [list(g) for g in groups]
        for g, members in enumerate(self._groups):
            for t in members:
                if not 0 <= t < len(self._gpu):
                    raise _error(f"groups[{g}]: tensor index {t} is out of range ({len(self._gpu)} tensors)")
            if len(set(members)) != len(members):
                raise _error(f"groups[{g}]: a tensor is listed twice")
        self._torch = _torch_for(self._gpu[0])
        self._pools: List[HostPool] = []  # the HostPools the worker allocated
        self._layout = host_layout
        rows = self._num_chunks * self._bpc
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
            self._host = list(host_caches)
            self._host_block = None
            if len(self._host) != len(self._gpu):
                raise _error(f"host_caches: {len(self._host)} arrays for {len(self._gpu)} GPU tensors")
            for t, h in enumerate(self._host):
                want = (self._num_chunks, self._pages[t] * self._bpc)
                if tuple(int(d) for d in h.shape) != want or _row_bytes(h, f"host_caches[{t}]") != want[1]:
                    raise _error(f"host_caches[{t}]: expected {want[0]} x {want[1]} bytes, got shape {tuple(h.shape)}")
            self._rows = [_as_rows(h, p, rows) for h, p in zip(self._host, self._pages)]
        else:
            raise _error(f"host_layout: expected 'tensor' or 'block', got {host_layout!r}")
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
                from . import _testing  # the emulated device registers its own pinned memory
                return np.asarray(_testing.pinned_buffer(self._engine, shape, "int8"))
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
        starting ``block_indices[g] % blocks_per_chunk`` sub-blocks in. Returns True once queued;
        a job whose ids do not fit raises :class:`gfd.Error` here; one whose transfer fails
        later is reported by :meth:`get_finished` with ``success=False``. Never waits for data.
        """
        if self._closed:
            raise _error("submit: the worker is shut down")
        chunks = np.array(chunk_ids, dtype=np.int64).reshape(-1)  # copies: the caller may reuse its arrays
        blocks = np.array(gpu_block_ids, dtype=np.int64).reshape(-1)
        if group_sizes is None:
            group_sizes = [len(blocks)] + [0] * (len(self._groups) - 1)
        if block_indices is None:
            block_indices = [0] * len(group_sizes)
        if len(group_sizes) != len(self._groups) or len(block_indices) != len(self._groups):
            raise _error(f"submit: job {job_id}: {len(group_sizes)} group sizes and {len(block_indices)} block "
                         f"indices for {len(self._groups)} groups")
        if sum(group_sizes) != len(blocks):
            raise _error(f"submit: job {job_id}: group sizes sum to {sum(group_sizes)}, {len(blocks)} GPU blocks given")
        # Only the shape of the job is checked here (plain integers); the submitter thread
        # builds the ids, so that the caller is back at once.
        slices = []  # (set key, first chunk, chunks, first block, blocks, skip)
        c0 = b0 = 0
        total = 0
        for g, (n, first) in enumerate(zip(group_sizes, block_indices)):
            n = int(n)
            if n == 0:
                continue
            skip = int(first) % self._bpc
            used = -(-(n + skip) // self._bpc)
            if c0 + used > len(chunks):
                raise _error(f"submit: job {job_id}: group {g} needs {used} chunks from position {c0}, "
                             f"{len(chunks)} given")
            key = self._group_set[g]
            if key is None:
                raise _error(f"submit: job {job_id}: group {g} has blocks but no tensors")
            slices.append((key, c0, used, b0, n, skip))
            total += n * self._bytes_per_row[key]
            c0 += used
            b0 += n
        if c0 != len(chunks):
            raise _error(f"submit: job {job_id}: {len(chunks)} chunks given, the groups use {c0}")
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
                job.transfers.append(self._engine.copy_blocks(caches, src, dst, to_device=job.to_device,
                                                              stream=stream))
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


def _row_bytes(t: Any, name: str) -> int:
    shape = tuple(int(d) for d in t.shape)
    if len(shape) != 2:
        raise _error(f"{name}: expected a 2-D (blocks, bytes) array, got shape {shape}")
    item = _itemsize(t)
    if item != 1:
        raise _error(f"{name}: expected a byte array (int8 or uint8), got {item}-byte elements")
    return shape[1]


def _itemsize(t: Any) -> int:
    size = getattr(t, "itemsize", None)
    if isinstance(size, int):
        return size
    dtype = getattr(t, "dtype", None)
    size = getattr(dtype, "itemsize", None)
    if isinstance(size, int):
        return size
    return int(np.dtype(str(dtype)).itemsize)


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

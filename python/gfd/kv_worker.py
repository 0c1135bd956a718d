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
page ``c * blocks_per_chunk + j``, so the job is a list of (host page, GPU block) rows applied to
every tensor: one :meth:`gfd.Engine.copy_blocks` on a :class:`gfd.CacheSet` registered once.
Where a chunk's sub-blocks are not one constant stride from the next chunk's (vLLM's shared
region with blocks_per_chunk > 1: a rank's cell holds each tensor's pages of the chunk side by
side), there is one set per sub-block position and the rows are split among them. When every
group has the same tensors (one group, or vLLM's hybrid groups sharing their tensors) the
groups' rows go in the same transfers; groups with different tensors move as transfers of their
own (the job is done when all are).

Submission issues the job in the call: :meth:`KVTransferWorker.submit` checks the job's shape,
builds the ids, makes a stream of the worker's (one per direction, so that jobs of one direction
complete in order; expedited loads have their own) wait for the work queued so far on the
caller's stream, and enqueues the transfers on it with the GIL released. No thread stands
between the caller and the copy engine, so a job starts as soon as its data is ready however busy
the interpreter is. The caller's stream never waits for a job: completion is seen by
:meth:`get_finished` (a poll) or :meth:`wait`.

Host memory is the runtime's (``host_caches``: vLLM's shared region, with any row stride) or the
worker's own. A tensor's page may move as fragments (``fragments``: vLLM's canonical layout, this
rank's share of a parallelism-free page), and ranks holding identical bytes may take turns
writing them (``writers``).
"""

from __future__ import annotations

import collections
import ctypes
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, List, Optional, Sequence

import numpy as np

from . import Direction, Engine, Error, HostPool, _gfd
from ._errors import _error, _type_error
from ._views import Rows as _Rows
from ._views import View as _View
from ._views import rows as _rows

__all__ = ["KVTransferWorker", "JobResult", "host_block_ids"]


@dataclass
class JobResult:
    """One finished job: what vLLM's ``TransferResult`` carries, plus the failure, if any."""

    job_id: int
    success: bool
    bytes: int
    seconds: float
    error: Optional[BaseException] = None


def host_block_ids(
    chunk_ids: np.ndarray, blocks_per_chunk: int, count: int, skip: int
) -> np.ndarray:
    """Host block ids (sub-blocks of chunks) of ``count`` GPU blocks starting ``skip`` sub-blocks
    into the first chunk of ``chunk_ids``: chunk c, sub-block j is id ``c * blocks_per_chunk + j``.
    """
    c = np.asarray(chunk_ids, dtype=np.int64)
    if blocks_per_chunk == 1:
        return c[:count]
    ids = (
        c[:, None] * blocks_per_chunk + np.arange(blocks_per_chunk, dtype=np.int64)[None, :]
    ).ravel()
    return ids[skip : skip + count]


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
    bytes: int
    transfers: list = field(default_factory=list)
    error: Optional[BaseException] = None
    start_event: Any = None
    end_event: Any = None
    t0: float = 0.0
    t1: Optional[float] = None
    issued: bool = False  # its transfers are all enqueued (or it failed to)


@dataclass(frozen=True)
class _HostTensor:
    """Where tensor t's host pages are: sub-block j of chunk c at
    ``ptr + c * chunk_stride + j * sub_stride``, ``page`` bytes each."""

    ptr: int
    chunk_stride: int
    sub_stride: int
    page: int


class KVTransferWorker:
    """Offloading jobs between ``gpu_caches`` and host caches of the same tensors.

    ``engine``: the gfd.Engine of the caches' GPU. ``gpu_caches``: per tensor, a 2-D
    ``(num_gpu_blocks, page_bytes)`` byte array on that GPU (torch tensor, DLPack or CUDA array
    interface object; a row stride larger than the page, as packed layouts have, is kept).
    ``groups``: per KV-cache group, the indices of its tensors. ``blocks_per_chunk``: GPU
    blocks per host chunk. ``num_chunks``: host chunks per tensor.

    ``host_caches``: per tensor, a ``(num_chunks, blocks_per_chunk * host_page)`` host byte
    array to use, with any row stride (vLLM's shared region gives views whose rows are a whole
    region row apart); sub-block j of a chunk is columns ``[j * host_page, (j + 1) * host_page)``.
    None: the worker allocates them, in one :class:`gfd.HostPool` (huge pages, the GPU's NUMA
    node, pinned) with ``host_memory="pool"``, or as pinned torch tensors with
    ``host_memory="torch"``; ``host_page`` is then the GPU page.

    ``host_layout`` (host memory the worker allocates): ``"tensor"`` (vLLM's: one host array per
    tensor, a chunk's pages of that tensor together) or ``"block"`` (one host array of
    ``num_chunks * blocks_per_chunk`` rows, a row holding one GPU block's page of every tensor
    side by side: a job's host side is then one contiguous run per block, which the copy engine
    reads in place, with no CPU copy; where the GPU tensors are views of one allocation at a
    constant stride, as vLLM 0.33 makes them, each block of a job is one 2D copy, see
    EngineOptions::strided_min_rows).

    ``copy_bytes``: per tensor, the bytes of a page that a job moves (a page's unpadded size;
    None: the whole page). ``fragments``: per tensor, None or a list of ``(gpu_offset,
    host_offset, size)``: the page's bytes at ``gpu_offset`` are those at ``host_offset`` of the
    host page (vLLM's canonical layout: this rank's share of a parallelism-free page); None:
    ``(0, 0, copy_bytes[t])``. ``writers``: per tensor, None or ``(num_writers, writer_index)``:
    ranks holding identical bytes take turns, a store writing host page p (``chunk *
    blocks_per_chunk + sub-block``) only where ``p % num_writers == writer_index``.
    """

    def __init__(
        self,
        engine: Engine,
        gpu_caches: Sequence[Any],
        groups: Sequence[Sequence[int]],
        blocks_per_chunk: int,
        num_chunks: int,
        *,
        host_caches: Optional[Sequence[Any]] = None,
        host_memory: str = "pool",
        host_layout: str = "tensor",
        copy_bytes: Optional[Sequence[int]] = None,
        fragments: Optional[Sequence[Any]] = None,
        writers: Optional[Sequence[Any]] = None,
    ) -> None:
        fn = "KVTransferWorker"
        if not isinstance(engine, Engine):
            raise _type_error(f"{fn}: engine: expected a gfd.Engine, got {type(engine).__name__}")
        self._engine = engine
        self._closed = True  # until the end of construction
        self._bpc = _gfd._int(blocks_per_chunk, f"{fn}: blocks_per_chunk", 1, _MAX_ROWS)
        self._num_chunks = _gfd._int(num_chunks, f"{fn}: num_chunks", 1, _MAX_ROWS // self._bpc)
        self._gpu_objects = _list(gpu_caches, f"{fn}: gpu_caches")
        if not self._gpu_objects:
            raise _error(f"{fn}: gpu_caches: no tensor given")
        n = len(self._gpu_objects)
        self._gpu = [_rows(t, f"{fn}: gpu_caches[{i}]") for i, t in enumerate(self._gpu_objects)]
        self._pages = [g.width for g in self._gpu]
        self._gpu_blocks = min(g.rows for g in self._gpu)
        copy = (
            self._pages if copy_bytes is None else _per_tensor(copy_bytes, n, f"{fn}: copy_bytes")
        )
        self._copy = [
            _gfd._int(b, f"{fn}: copy_bytes[{t}]", 1, p)
            for t, (b, p) in enumerate(zip(copy, self._pages))
        ]
        self._groups = []
        for g, members in enumerate(_list(groups, f"{fn}: groups")):
            m = [
                _gfd._int(t, f"{fn}: groups[{g}][{i}]", 0, n - 1)
                for i, t in enumerate(_list(members, f"{fn}: groups[{g}]"))
            ]
            if len(set(m)) != len(m):
                raise _error(f"{fn}: groups[{g}]: a tensor is listed twice")
            self._groups.append(m)
        if not self._groups:
            raise _error(f"{fn}: groups: no group given")
        for name, value, allowed in (
            ("host_memory", host_memory, ("pool", "torch")),
            ("host_layout", host_layout, ("tensor", "block")),
        ):
            if not isinstance(value, str):
                raise _type_error(
                    f"{fn}: {name}: expected one of {allowed}, got {type(value).__name__}"
                )
            if value not in allowed:
                raise _error(f"{fn}: {name}: expected one of {allowed}, got {value!r}")
        self._writers = (
            [(1, 0)] * n
            if writers is None
            else [
                _writer(w, f"{fn}: writers[{t}]")
                for t, w in enumerate(_per_tensor(writers, n, f"{fn}: writers"))
            ]
        )
        rows = self._num_chunks * self._bpc  # both checked above: the product fits an int64 id
        self._torch = _torch_for(self._gpu_objects[0])
        self._pools: List[HostPool] = []  # the HostPools the worker allocated
        self._keep: list = []  # the host arrays the views below point into
        self._layout = host_layout
        if host_caches is not None and host_layout == "block":
            raise _error(
                f"{fn}: host_layout: 'block' allocates its own host memory; host_caches must be None"
            )
        if host_caches is None:
            if rows * sum(self._pages) > _MAX_HOST_BYTES:
                raise _error(
                    f"{fn}: num_chunks: {self._num_chunks} chunks of {self._bpc} blocks of "
                    f"{sum(self._pages)} bytes is more host memory than a worker takes"
                )
            self._hosts = self._allocate_hosts(host_memory, host_layout, rows)
            self._tensor_arrays = None if host_layout == "block" else list(self._keep)
        else:
            given = _list(host_caches, f"{fn}: host_caches")
            if len(given) != n:
                raise _error(f"{fn}: host_caches: {len(given)} arrays for {n} GPU tensors")
            self._hosts = []
            for t, h in enumerate(given):
                r = _rows(h, f"{fn}: host_caches[{t}]")
                if fragments is None or _per_tensor(fragments, n, f"{fn}: fragments")[t] is None:
                    want = f"{self._pages[t] * self._bpc} bytes"  # whole GPU pages
                    fits = r.width == self._pages[t] * self._bpc
                else:
                    want = f"a multiple of {self._bpc} bytes (blocks_per_chunk host pages)"
                    fits = r.width % self._bpc == 0 and r.width > 0
                if r.rows != self._num_chunks or not fits:
                    raise _error(
                        f"{fn}: host_caches[{t}]: expected {self._num_chunks} rows of {want}, "
                        f"got {r.rows} x {r.width}"
                    )
                page = r.width // self._bpc
                # One page per chunk: the chunks are the pages, one stride apart whatever it is.
                self._hosts.append(
                    _HostTensor(r.ptr, r.stride, page if self._bpc > 1 else r.stride, page)
                )
                self._keep.append(h)
            self._tensor_arrays = list(given)
        self._fragments = []
        for t in range(n):
            f = None if fragments is None else _per_tensor(fragments, n, f"{fn}: fragments")[t]
            self._fragments.append(
                _fragments(
                    f, self._copy[t], self._pages[t], self._hosts[t].page, f"{fn}: fragments[{t}]"
                )
            )
            if f is None and self._copy[t] > self._hosts[t].page:
                raise _error(
                    f"{fn}: host_caches[{t}]: host pages of {self._hosts[t].page} bytes hold less than "
                    f"the {self._copy[t]} bytes a job moves of a GPU page"
                )
        # The cache sets: per group, its tensors split by writer rotation; a split whose host
        # pages are one constant stride apart (chunk stride = blocks_per_chunk sub-blocks) is one
        # set whose host ids are page ids, any other (vLLM's region, a chunk's pages of each
        # tensor side by side in a rank's cell) one set per sub-block position, ids chunk ids.
        # Groups with the same tensors share their sets (and a job's rows go in one transfer).
        self._sets: dict = {}
        self._plans: List[list] = []
        for members in self._groups:
            by_writer: dict = {}
            for t in sorted(members):
                by_writer.setdefault(self._writers[t], []).append(t)
            plan = []
            for w, ts in by_writer.items():
                ts = tuple(ts)
                flat = all(
                    self._hosts[t].chunk_stride == self._bpc * self._hosts[t].sub_stride for t in ts
                )
                for j in [None] if flat else range(self._bpc):
                    if (ts, w, j) not in self._sets:
                        self._sets[(ts, w, j)] = self._register(ts, j)
                plan.append((ts, w, flat))
            self._plans.append(plan)
        self._bytes_per_row = {k: s.bytes_per_id for k, s in self._sets.items()}
        stream = self._new_stream
        self._lanes = {
            "store": _Lane(stream()),
            "load": _Lane(stream()),
            "expedited": _Lane(stream()),
        }
        self._by_id: dict = {}
        self._lock = threading.Lock()
        self._issued = threading.Condition(self._lock)
        self._events: list = []
        self._closed = False

    # -- setup ---------------------------------------------------------------------------------

    def _allocate_hosts(self, kind: str, layout: str, rows: int) -> List[_HostTensor]:
        if layout == "block":
            whole = self._allocate(kind, (rows, sum(self._pages)))
            r = _rows(whole, "host memory")
            offsets = np.cumsum([0] + self._pages[:-1]).tolist()
            return [
                _HostTensor(r.ptr + o, self._bpc * r.stride, r.stride, p)
                for o, p in zip(offsets, self._pages)
            ]
        out = []
        for p in self._pages:
            r = _rows(self._allocate(kind, (self._num_chunks, p * self._bpc)), "host memory")
            out.append(_HostTensor(r.ptr, r.stride, p, p))
        return out

    def _allocate(self, kind: str, shape: tuple) -> Any:
        """One pinned host byte array of ``shape``: in a HostPool of its own (``"pool"``: huge
        pages on the GPU's NUMA node) or a pinned torch tensor (``"torch"``)."""
        if kind == "pool":
            if getattr(self._engine, "_emulated", False):
                from . import testing  # the emulated device registers its own pinned memory

                out = np.asarray(testing.pinned_buffer(self._engine, shape, "int8"))
            else:
                pool = HostPool(max(shape[0] * shape[1], 1), device=self._engine.device)
                self._pools.append(pool)
                out = np.asarray(pool.view(shape, "int8", 0))
        else:
            torch = self._torch or sys.modules.get("torch")
            if torch is None:
                raise _error("host_memory: 'torch' needs torch")
            out = torch.zeros(shape, dtype=torch.int8, pin_memory=True)
        self._keep.append(out)
        return out

    def _register(self, tensors: tuple, j: Optional[int]) -> Any:
        """One cache set of ``tensors``' fragments: host rows are page ids (``j`` None) or the
        chunks' sub-block ``j``."""
        hosts, gpus = [], []
        for t in tensors:
            h, g = self._hosts[t], self._gpu[t]
            if j is None:
                base, rows, stride = h.ptr, self._num_chunks * self._bpc, h.sub_stride
            else:
                base, rows, stride = h.ptr + j * h.sub_stride, self._num_chunks, h.chunk_stride
            for go, ho, size in self._fragments[t]:
                hosts.append(_View(_Rows(base + ho, rows, size, stride), False, self._keep))
                gpus.append(
                    _View(_Rows(g.ptr + go, g.rows, size, g.stride), True, self._gpu_objects[t])
                )
        return self._engine.register_caches(hosts, gpus)

    def _new_stream(self) -> Any:
        if self._torch is not None:
            return self._torch.cuda.Stream(device=self._engine.device)
        return None  # the emulated device's stand-in for a stream

    def host_pages(self, tensor: int) -> np.ndarray:
        """Tensor ``tensor``'s host pages as a numpy view ``(num_chunks, blocks_per_chunk,
        host_page)``: ``[c, j]`` is sub-block j of chunk c."""
        self._open("host_pages")
        h = self._hosts[_gfd._int(tensor, "host_pages: tensor", 0, len(self._hosts) - 1)]
        return np.lib.stride_tricks.as_strided(
            self._span(h), (self._num_chunks, self._bpc, h.page), (h.chunk_stride, h.sub_stride, 1)
        )

    def host_rows(self, tensor: int) -> Any:
        """Tensor ``tensor``'s host pages as ``(num_chunks * blocks_per_chunk, host_page)`` rows
        (a view, a torch tensor where the GPU caches are torch's; row ``chunk *
        blocks_per_chunk + j`` is sub-block j of that chunk). Only where a chunk's pages are one
        constant stride from the next chunk's (see :meth:`host_pages` for any layout)."""
        self._open("host_rows")
        h = self._hosts[_gfd._int(tensor, "host_rows: tensor", 0, len(self._hosts) - 1)]
        if h.chunk_stride != self._bpc * h.sub_stride:
            raise _error(
                f"host_rows: tensor {tensor}'s host pages are not one stride apart across chunks; "
                "host_pages gives them as (chunks, blocks_per_chunk, page)"
            )
        rows = np.lib.stride_tricks.as_strided(
            self._span(h), (self._num_chunks * self._bpc, h.page), (h.sub_stride, 1)
        )
        return self._torch.from_numpy(rows) if self._torch is not None else rows

    def _span(self, h: _HostTensor) -> np.ndarray:
        span = (self._num_chunks - 1) * h.chunk_stride + (self._bpc - 1) * h.sub_stride + h.page
        return np.ctypeslib.as_array((ctypes.c_int8 * span).from_address(h.ptr))

    @property
    def host_caches(self) -> list:
        """Per tensor, the ``(num_chunks, page_bytes * blocks_per_chunk)`` host array (given, or
        allocated in the "tensor" layout; the "block" layout has no such arrays: see
        :meth:`host_rows`)."""
        self._open("host_caches")
        if self._tensor_arrays is None:
            raise _error(
                "host_caches: the 'block' layout keeps one array (host_rows gives each tensor's view)"
            )
        return list(self._tensor_arrays)

    @property
    def host_layout(self) -> str:
        """``"block"`` or ``"tensor"``."""
        return self._layout

    # -- jobs ----------------------------------------------------------------------------------

    def submit(
        self,
        job_id: int,
        to_device: bool,
        chunk_ids: Any,
        gpu_block_ids: Any,
        group_sizes: Optional[Sequence[int]] = None,
        block_indices: Optional[Sequence[int]] = None,
        expedited: bool = False,
    ) -> bool:
        """Issues one job: host chunks ``chunk_ids`` to GPU blocks ``gpu_block_ids``
        (``to_device``) or back. ``group_sizes[g]`` GPU blocks belong to group g, in order
        (None: one group, all of them); the chunks follow in the same order, each group's first
        starting ``block_indices[g] % blocks_per_chunk`` sub-blocks in. Returns True.

        The job's transfers are enqueued before this returns, after the work queued so far on
        the caller's current stream (the lane's stream waits for it), on a stream of the
        worker's per direction (jobs of one direction complete in order; expedited loads have
        their own): no thread stands between the call and the copy engine. The GIL is released
        while gfd plans and enqueues. Never waits for data.

        Checked in the call, before anything is enqueued (a :class:`gfd.InvalidArgument` or
        :class:`gfd.InvalidType` naming the argument): every argument's type (integers only:
        Python ints or numpy/torch integer arrays and scalars, no bool or float), every chunk id
        below ``num_chunks``, every GPU block id below the GPU caches' blocks, the group sizes
        (non-negative, summing to the GPU block ids given) and the chunks they use. A
        destination the job writes twice (a GPU block of a load, a host page of a store, in any
        of its transfers) makes the job fail with nothing enqueued: :meth:`get_finished` reports
        it with ``success=False`` and the error naming the argument (``gpu_block_ids[i]`` or
        ``chunk_ids[k]``).
        """
        self._open("submit")
        # Every argument checked here, before anything is enqueued: integers only (bool and
        # float rejected, also inside lists), every id in range, so that no later arithmetic
        # can wrap.
        job_id = _gfd._int(job_id, "submit: job_id", -(1 << 63), (1 << 63) - 1)
        to_device = _flag(to_device, "submit: to_device")
        expedited = _flag(expedited, "submit: expedited")
        chunks = np.frombuffer(
            _gfd._int64_array(
                chunk_ids,
                "submit: chunk_ids",
                self._num_chunks - 1,
                f"the worker has {self._num_chunks} chunks",
            ),
            dtype=np.int64,
        )
        blocks = np.frombuffer(
            _gfd._int64_array(
                gpu_block_ids,
                "submit: gpu_block_ids",
                self._gpu_blocks - 1,
                f"the GPU caches have {self._gpu_blocks} blocks",
            ),
            dtype=np.int64,
        )
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
            raise _error(
                f"submit: group_sizes: the sizes sum to {sum(group_sizes)}, gpu_block_ids has "
                f"{len(blocks)} blocks"
            )
        slices = []  # (group, first chunk, chunks, first block, blocks, skip)
        c0 = b0 = 0
        for g, (count, first) in enumerate(zip(group_sizes, block_indices)):
            if count == 0:
                continue
            skip = first % self._bpc
            used = -(-(count + skip) // self._bpc)
            if c0 + used > len(chunks):
                raise _error(
                    f"submit: chunk_ids: group {g} needs {used} chunks from position {c0}, "
                    f"{len(chunks)} given"
                )
            if not self._groups[g]:
                raise _error(f"submit: group_sizes: group {g} has blocks but no tensors")
            slices.append((g, c0, used, b0, count, skip))
            c0 += used
            b0 += count
        if c0 != len(chunks):
            raise _error(f"submit: chunk_ids: {len(chunks)} chunks given, the groups use {c0}")
        with self._lock:
            if job_id in self._by_id:
                raise _error(f"submit: job {job_id} is already in flight")
        # The job's transfers each see only their own rows (one per cache set: per sub-block
        # position in vLLM's region), so a destination given twice across them is looked for
        # here, in the whole job, before anything is enqueued.
        twice = self._written_twice(to_device, chunks, blocks, slices)
        parts = [] if twice is not None else self._parts(to_device, chunks, blocks, slices)
        lane = self._lanes["store" if not to_device else "expedited" if expedited else "load"]
        job = _Job(
            job_id, lane, sum(len(src) * self._bytes_per_row[k] for k, src, _ in parts), error=twice
        )
        job.t0 = time.perf_counter()
        with self._lock:
            if job_id in self._by_id:  # submitted meanwhile from another thread
                raise _error(f"submit: job {job_id} is already in flight")
            self._by_id[job_id] = job
            lane.jobs.append(job)
        if twice is None:
            self._issue(job, to_device, parts)
        with self._lock:
            job.issued = True
            self._issued.notify_all()
        return True

    def _written_twice(
        self, to_device: bool, chunks: np.ndarray, blocks: np.ndarray, slices: list
    ) -> Optional[Error]:
        """The first destination the job writes twice, as a gfd.InvalidArgument in the caller's
        terms (``gpu_block_ids[i]`` for a load, ``chunk_ids[k]`` for a store), or None. A
        destination is a tensor's GPU block (load) or host page (store: pages another rank
        writes left out); tensors of the same groups and writer share their destinations."""
        rows = []  # per group slice: the destinations and the caller's position of each
        for g, c0, used, b0, count, skip in slices:
            if to_device:
                rows.append((g, blocks[b0 : b0 + count], np.arange(b0, b0 + count)))
            else:
                pages = host_block_ids(chunks[c0 : c0 + used], self._bpc, count, skip)
                rows.append((g, pages, c0 + (skip + np.arange(count)) // self._bpc))
        seen = set()
        for t in range(len(self._gpu)):
            writer = (1, 0) if to_device else self._writers[t]
            key = (tuple(i for i, r in enumerate(rows) if t in self._groups[r[0]]), writer)
            if not key[0] or key in seen:
                continue
            seen.add(key)
            dest = np.concatenate([rows[i][1] for i in key[0]])
            at = np.concatenate([rows[i][2] for i in key[0]])
            if writer[0] > 1:
                mine = dest % writer[0] == writer[1]
                dest, at = dest[mine], at[mine]
            order = np.argsort(dest, kind="stable")
            again = np.flatnonzero(dest[order][1:] == dest[order][:-1])
            if not len(again):
                continue
            # The earliest row that repeats a destination, and the first row that wrote it (the
            # sort is stable: equal destinations stay in row order).
            second = int(order[again[np.argmin(order[again + 1])] + 1])
            first = int(order[np.searchsorted(dest[order], dest[second])])
            if to_device:
                return _error(
                    f"submit: gpu_block_ids[{at[second]}]: GPU block {dest[second]} is written twice in this "
                    f"job (also by gpu_block_ids[{at[first]}])",
                    block=int(at[second]),
                )
            page = int(dest[second])
            return _error(
                f"submit: chunk_ids[{at[second]}]: sub-block {page % self._bpc} of chunk {page // self._bpc} "
                f"is written twice in this job (also by chunk_ids[{at[first]}])",
                block=int(at[second]),
            )
        return None

    def _parts(self, to_device: bool, chunks: np.ndarray, blocks: np.ndarray, slices: list) -> list:
        """The job's transfers: (set key, source ids, destination ids) per cache set, the rows of
        every group on that set concatenated; a store leaves out the pages another rank writes."""
        rows: dict = {}
        for g, c0, used, b0, count, skip in slices:
            host = host_block_ids(chunks[c0 : c0 + used], self._bpc, count, skip)
            gpu = blocks[b0 : b0 + count]
            for ts, w, flat in self._plans[g]:
                h, d = host, gpu
                if not to_device and w[0] > 1:
                    mine = h % w[0] == w[1]
                    h, d = h[mine], d[mine]
                if flat:
                    rows.setdefault((ts, w, None), []).append((h, d))
                    continue
                sub, chunk = h % self._bpc, h // self._bpc
                for j in range(self._bpc):
                    at = sub == j
                    if at.any():
                        rows.setdefault((ts, w, j), []).append((chunk[at], d[at]))
        parts = []
        for key, r in rows.items():
            host = r[0][0] if len(r) == 1 else np.concatenate([x[0] for x in r])
            gpu = r[0][1] if len(r) == 1 else np.concatenate([x[1] for x in r])
            if len(host):
                src, dst = (host, gpu) if to_device else (gpu, host)
                parts.append((key, np.ascontiguousarray(src), np.ascontiguousarray(dst)))
        return parts

    def _issue(self, job: _Job, to_device: bool, parts: list) -> None:
        """Enqueues the job's transfers on its lane's stream, after the caller's current stream."""
        torch = self._torch
        stream = job.lane.stream
        try:
            if torch is not None:
                stream.wait_stream(torch.cuda.current_stream(self._engine.device))
                job.start_event = self._event()
                job.start_event.record(stream)
            direction = Direction.TO_DEVICE if to_device else Direction.TO_HOST
            for key, src, dst in parts:
                job.transfers.append(
                    self._engine.copy_blocks(self._sets[key], direction, src, dst, stream=stream)
                )
            if torch is not None:
                job.end_event = self._event()
                job.end_event.record(stream)
        except BaseException as e:  # noqa: BLE001 - reported as a failed job
            job.error = e

    def _event(self) -> Any:
        return self._events.pop() if self._events else self._torch.cuda.Event(enable_timing=True)

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
            self._events += [job.start_event, job.end_event]
        else:
            seconds = (job.t1 or time.perf_counter()) - job.t0
        return JobResult(job.job_id, err is None, job.bytes if err is None else 0, seconds, err)

    def get_finished(self) -> List[JobResult]:
        """The jobs done since the last call (each lane's in submission order). Never blocks."""
        out = []
        with self._lock:
            for lane in self._lanes.values():
                while (
                    lane.jobs
                    and lane.jobs[0].issued
                    and all(t.done() for t in lane.jobs[0].transfers)
                ):
                    job = lane.jobs.popleft()
                    job.t1 = time.perf_counter()
                    del self._by_id[job.job_id]
                    out.append(job)
            return [self._result(j) for j in out]

    def wait(self, job_ids: Iterable[int]) -> None:
        """Blocks until every job of ``job_ids`` (a set or list of job ids) still in flight is
        done (ids not in flight are ignored); their results are still reported by
        :meth:`get_finished`."""
        if isinstance(job_ids, (str, bytes, dict)) or not hasattr(job_ids, "__iter__"):
            raise _type_error(
                f"wait: job_ids: expected a set or list of job ids, got {type(job_ids).__name__}"
            )
        job_ids = [
            _gfd._int(j, f"wait: job_ids[{i}]", -(1 << 63), (1 << 63) - 1)
            for i, j in enumerate(job_ids)
        ]
        for job_id in job_ids:
            with self._lock:
                job = self._by_id.get(job_id)
                while job is not None and not job.issued:
                    self._issued.wait()
            for t in job.transfers if job is not None else ():
                try:
                    t.wait()
                except Error:
                    pass  # reported by get_finished

    def shutdown(self) -> None:
        """Waits for every job in flight. Idempotent; results not collected are dropped."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            while any(not j.issued for lane in self._lanes.values() for j in lane.jobs):
                self._issued.wait()
            jobs = [j for lane in self._lanes.values() for j in lane.jobs]
        for job in jobs:
            for t in job.transfers:
                try:
                    t.wait()
                except Error:
                    pass
        with self._lock:
            for lane in self._lanes.values():
                lane.jobs.clear()
            self._by_id.clear()
        # Nothing moves any more: the memory given (vLLM's region and GPU caches) and the sets
        # describing it are let go, so that its owner can free or unmap it.
        self._sets.clear()
        self._keep.clear()  # what the sets' host views hold
        self._tensor_arrays = None
        self._pools.clear()
        self._gpu_objects = []

    def _open(self, fn: str) -> None:
        if self._closed:
            raise _error(
                f"{fn}: the worker is shut down (its host memory is let go)", code="shutdown"
            )

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
    if (
        value is None
        or isinstance(value, (str, bytes, dict, int, float))
        or not hasattr(value, "__len__")
    ):
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


def _per_tensor(value: Any, n: int, name: str) -> list:
    out = _list(value, name)
    if len(out) != n:
        raise _error(f"{name}: {len(out)} entries for {n} GPU tensors")
    return out


def _writer(value: Any, name: str) -> tuple:
    """(num_writers, writer_index); None: (1, 0), this rank writes every page."""
    if value is None:
        return (1, 0)
    pair = _list(value, name)
    if len(pair) != 2:
        raise _error(f"{name}: expected (num_writers, writer_index), got {len(pair)} values")
    count = _gfd._int(pair[0], f"{name}: num_writers", 1, 1 << 20)
    return (count, _gfd._int(pair[1], f"{name}: writer_index", 0, count - 1))


def _fragments(value: Any, copy: int, gpu_page: int, host_page: int, name: str) -> list:
    """(gpu_offset, host_offset, size) triples, each inside its page on both sides."""
    if value is None:
        return [(0, 0, copy)]
    out = []
    for i, f in enumerate(_list(value, name)):
        triple = _list(f, f"{name}[{i}]")
        if len(triple) != 3:
            raise _error(
                f"{name}[{i}]: expected (gpu_offset, host_offset, size), got {len(triple)} values"
            )
        size = _gfd._int(triple[2], f"{name}[{i}]: size", 1, gpu_page)
        if size > host_page:
            raise _error(f"{name}[{i}]: size: {size} bytes do not fit a host page of {host_page}")
        go = _gfd._int(triple[0], f"{name}[{i}]: gpu_offset", 0, gpu_page - size)
        ho = _gfd._int(triple[1], f"{name}[{i}]: host_offset", 0, host_page - size)
        out.append((go, ho, size))
    if not out:
        raise _error(f"{name}: no fragment given")
    return out

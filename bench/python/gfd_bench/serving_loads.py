"""The prefix-hit loads of :mod:`gfd_bench.serving`: every path that can move P pages of every
layer's K and V from pinned host caches into the model's own KV caches, each issued from the
loop's thread between decode steps, on a side stream (the load stream), timed by CUDA events.

Each path has ``issue(src, dst)`` (host page ids, device page ids: int64 numpy arrays, the same
for every tensor), ``poll()`` (collects the loads that are done, never blocks) and ``drain()``
(waits for every load). A load's record: its time from submit to usable (events recorded on the
load stream just before and just after the submit: the later one fires once the data is in
place), and how long the call held the loop's thread.
"""

from __future__ import annotations

import collections
import time
from typing import Any, List, Optional

import numpy as np


class LoadRecord:
    __slots__ = ("timed", "call_us", "usable_us", "backlog")

    def __init__(self, timed: bool, call_us: float, backlog: bool) -> None:
        self.timed = timed
        self.call_us = call_us
        self.usable_us: Optional[float] = None
        self.backlog = backlog  # the previous load was still in flight when this one was issued


class Setup:
    """What every path shares: torch, the device, the load stream, the model's KV caches (int8
    ``[pages, page bytes]`` on the GPU) and the pinned host caches of the same tensors."""

    def __init__(
        self, torch: Any, device: Any, stream: Any, gpu: List[Any], host: List[Any]
    ) -> None:
        self.torch, self.device, self.stream, self.gpu, self.host = torch, device, stream, gpu, host
        self.page = gpu[0].shape[1]
        self.stream_handle = int(stream.cuda_stream)
        self.gpu_base = np.array([t.data_ptr() for t in gpu], dtype=np.uint64)[:, None]
        self.host_base = np.array([t.data_ptr() for t in host], dtype=np.uint64)[:, None]

    def descriptors(self, src: np.ndarray, dst: np.ndarray) -> tuple:
        """One (destination, source, size) per (tensor, page), tensor-major, as vLLM's worker
        builds them with numpy for each job."""
        page = np.uint64(self.page)
        srcs = (self.host_base + src.astype(np.uint64)[None, :] * page).ravel()
        dsts = (self.gpu_base + dst.astype(np.uint64)[None, :] * page).ravel()
        return dsts, srcs, np.full(dsts.size, self.page, dtype=np.uint64)


class Path:
    """A load path timed by events on the load stream around its submit."""

    name = ""
    what = ""

    def __init__(self, s: Setup) -> None:
        self.s = s
        # (record, start event, end event, what the load's copies read until they are done)
        self.pending: "collections.deque" = collections.deque()
        self.records: List[LoadRecord] = []
        self._events: list = []

    def _event(self) -> Any:
        return self._events.pop() if self._events else self.s.torch.cuda.Event(enable_timing=True)

    def submit(self, src: np.ndarray, dst: np.ndarray) -> Any:
        """Enqueues one load on the load stream; returns what must live until it is done."""
        raise NotImplementedError

    def issue(self, src: np.ndarray, dst: np.ndarray, timed: bool) -> None:
        start, end = self._event(), self._event()
        backlog = bool(self.pending) and not self.pending[-1][2].query()
        start.record(self.s.stream)
        t0 = time.perf_counter()
        keep = self.submit(src, dst)
        t1 = time.perf_counter()
        end.record(self.s.stream)
        rec = LoadRecord(timed, (t1 - t0) * 1e6, backlog)
        self.records.append(rec)
        self.pending.append((rec, start, end, keep))

    def poll(self) -> None:
        while self.pending and self.pending[0][2].query():
            self._collect()

    def _collect(self) -> None:
        rec, start, end, _ = self.pending.popleft()
        rec.usable_us = start.elapsed_time(end) * 1e3
        self._events += [start, end]

    def drain(self) -> None:
        while self.pending:
            self.pending[0][2].synchronize()
            self._collect()

    def take(self) -> List[LoadRecord]:
        """The records since the last take (after drain)."""
        out, self.records = self.records, []
        return out

    def close(self) -> None:
        self.drain()


class ContiguousDma(Path):
    """One pinned host buffer to one device buffer of the same bytes (torch, non_blocking)."""

    name = "dma"
    what = "contiguous DMA of the same bytes (one pinned buffer -> one device buffer, torch non_blocking copy)"

    def __init__(self, s: Setup, nbytes: int, fill: Any) -> None:
        super().__init__(s)
        torch = s.torch
        self.host_buf = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        fill(self.host_buf.numpy(), 7777)
        self.dev_buf = torch.empty(nbytes, dtype=torch.uint8, device=s.device)

    def submit(self, src: np.ndarray, dst: np.ndarray) -> Any:
        with self.s.torch.cuda.stream(self.s.stream):
            self.dev_buf.copy_(self.host_buf, non_blocking=True)
        return None


class GfdCaches(Path):
    """gfd on caches registered once: ``engine.copy_blocks(caches, TO_DEVICE, src, dst, stream)``
    (the default engine as ``gfd``; another backend through the same call, e.g. per_block)."""

    def __init__(self, s: Setup, gfd: Any, engine: Any, name: str, what: str) -> None:
        super().__init__(s)
        self.gfd, self.engine, self.name, self.what = gfd, engine, name, what
        self.caches = engine.register_caches(s.host, s.gpu)
        self.transfers: "collections.deque" = collections.deque()

    def submit(self, src: np.ndarray, dst: np.ndarray) -> Any:
        self.transfers.append(
            self.engine.copy_blocks(
                self.caches, self.gfd.Direction.TO_DEVICE, src, dst, stream=self.s.stream
            )
        )
        return None  # the Transfer keeps what it reads

    def poll(self) -> None:
        super().poll()
        while self.transfers and self.transfers[0].done():
            self.transfers.popleft().wait()  # done: raises the transfer's error, if any

    def drain(self) -> None:
        super().drain()
        while self.transfers:
            self.transfers.popleft().wait()


class VllmBatchDma(Path):
    """vLLM's CPU offloading copy path: a descriptor per (page, tensor) built with numpy, one
    ``cudaMemcpyBatchAsync`` of them (gfd.testing.memcpy_batch)."""

    name = "batch"
    what = "vLLM's batch DMA (one cudaMemcpyBatchAsync of every (page, tensor) descriptor)"

    def __init__(self, s: Setup, testing: Any, engine: Any) -> None:
        super().__init__(s)
        self.testing, self.engine = testing, engine

    def submit(self, src: np.ndarray, dst: np.ndarray) -> Any:
        dsts, srcs, sizes = self.s.descriptors(src, dst)
        self.testing.memcpy_batch(
            self.engine,
            dsts.ctypes.data,
            srcs.ctypes.data,
            sizes.ctypes.data,
            dsts.size,
            True,
            self.s.stream_handle,
        )
        return dsts, srcs, sizes  # kept until the load is done, as vLLM keeps a job's descriptors


class UvaKernel(Path):
    """An SM copy kernel reading pinned host memory through unified addressing, on ``ctas`` CTAs
    of 1024 threads (the kernel gfd_benchmark measures, gfd.testing's uva_copy): descriptors built
    with numpy into a pinned slot, copied to the GPU on the load stream, then the kernel. The
    slots form a ring; a slot is written again only once the load that used it is done."""

    RING = 16

    def __init__(self, s: Setup, uva_copy: Any, engine: Any, ctas: int, count: int) -> None:
        super().__init__(s)
        torch = s.torch
        self.uva_copy, self.engine, self.ctas, self.count = uva_copy, engine, ctas, count
        self.name = f"uva{ctas}"
        self.what = f"SM copy kernel on {ctas} CTAs (UVA: the SMs read pinned host memory)"
        self.host_slots = torch.empty((self.RING, 3, count), dtype=torch.int64, pin_memory=True)
        self.dev_slots = torch.empty((self.RING, 3, count), dtype=torch.int64, device=s.device)
        self.slot_done = [torch.cuda.Event() for _ in range(self.RING)]
        self.slot_used = [False] * self.RING
        self.next = 0
        self.slot_waits = 0

    def submit(self, src: np.ndarray, dst: np.ndarray) -> Any:
        k = self.next
        self.next = (k + 1) % self.RING
        if self.slot_used[k] and not self.slot_done[k].query():
            self.slot_waits += 1
            self.slot_done[k].synchronize()
        dsts, srcs, sizes = self.s.descriptors(src, dst)
        if dsts.size != self.count:
            raise ValueError(f"{self.name}: {dsts.size} copies, the slots hold {self.count}")
        h = self.host_slots[k].numpy().view(np.uint64)
        h[0], h[1], h[2] = dsts, srcs, sizes
        torch = self.s.torch
        d = self.dev_slots[k]
        with torch.cuda.stream(self.s.stream):
            d.copy_(self.host_slots[k], non_blocking=True)
        self.uva_copy(
            self.engine,
            d[0].data_ptr(),
            d[1].data_ptr(),
            d[2].data_ptr(),
            self.count,
            self.ctas,
            self.s.stream_handle,
        )
        self.slot_done[k].record(self.s.stream)
        self.slot_used[k] = True
        return None  # the slot is guarded by its event


class GfdWorker(Path):
    """gfd's vLLM offloading worker (gfd.kv_worker.KVTransferWorker, which runs without vLLM):
    ``submit`` of one load job (host chunks = host pages, one block per chunk), on the worker's
    own load stream after the caller's current stream, as vLLM's worker orders it; completion by
    ``get_finished`` and the time from the job's own CUDA events on the worker's stream (the
    worker records them around the job's transfers)."""

    name = "gfd_worker"
    what = "gfd's vLLM offloading worker (KVTransferWorker.submit, one job per load)"

    def __init__(self, s: Setup, worker_cls: Any, engine: Any) -> None:
        super().__init__(s)
        self.worker = worker_cls(
            engine, s.gpu, [list(range(len(s.gpu)))], 1, s.host[0].shape[0], host_caches=s.host
        )
        self.job_id = 0
        self.by_job: dict = {}
        self.last_job: Optional[int] = None

    def issue(self, src: np.ndarray, dst: np.ndarray, timed: bool) -> None:
        self.job_id += 1
        backlog = self.last_job in self.by_job
        t0 = time.perf_counter()
        self.worker.submit(self.job_id, True, src, dst)
        t1 = time.perf_counter()
        rec = LoadRecord(timed, (t1 - t0) * 1e6, backlog)
        self.records.append(rec)
        self.by_job[self.job_id] = rec
        self.last_job = self.job_id

    def poll(self) -> None:
        for r in self.worker.get_finished():
            rec = self.by_job.pop(r.job_id)
            if not r.success:
                raise RuntimeError(f"gfd_worker: job {r.job_id} failed: {r.error}")
            rec.usable_us = r.seconds * 1e6

    def drain(self) -> None:
        self.worker.wait(list(self.by_job))
        self.poll()
        if self.by_job:
            raise RuntimeError(f"gfd_worker: {len(self.by_job)} job(s) waited on but not reported")

    def close(self) -> None:
        self.drain()
        self.worker.shutdown()

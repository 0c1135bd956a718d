"""``python -m gfd_bench.vllm``: gfd's vLLM offloading worker against vLLM's own copy path.

The layout of vLLM's CPU offloading (``--tensors`` canonical KV tensors on the GPU, int8
``[gpu blocks, page]``; host caches ``[chunks, page * blocks_per_chunk]``, about
``--host-bytes`` in all so that sources are cold) and its jobs: ``--blocks`` GPU blocks per job,
each with a random host chunk (distinct) and a random GPU block (distinct), every tensor. Methods
in the same run, each on the same host caches:

- ``gfd``: :class:`gfd.kv_worker.KVTransferWorker` (``submit`` then ``get_finished`` until the job
  is reported), the time from the job's own CUDA events on the worker's stream;
- ``vllm_batch``: what vLLM's CPU worker does per job: a descriptor per (block, tensor) built with
  numpy as vLLM builds it, and one ``cudaMemcpyBatchAsync`` of them on a stream of its own
  (sources read in any order for loads, in stream order for stores), timed by events;
- ``dma``: one contiguous copy of the same bytes (pinned host tensor to GPU tensor, or back):
  the line rate of this run.

The GPU tensors are laid out as vLLM 0.33 allocates them for its offloading connector
(``--gpu-alloc one``: one backing allocation, layer ``l`` of block ``g`` at
``l * layer stride + g * page``, the LBHNC layout the connector asks for), or as one allocation
per tensor (``--gpu-alloc separate``, as earlier vLLM releases did).

``--busy-thread`` keeps another Python thread busy meanwhile, as a serving process's other threads
may be: the submit time then includes taking the GIL back each time a call released it (a switch
interval, 5 ms by default, for each). Read only the submit times of such a run: its GB/s also
time the GIL's hand-overs between the timing events, and the contiguous DMA's drop as much.
P50 and the spread over ``--reps`` timed jobs after warm-up; every method's bytes verified once
per configuration against a numpy reference. "submit us": how long the call blocks its caller
(P50: gfd's ``submit``; vLLM's descriptor build and batch call). Needs torch and a CUDA GPU.
The engine is made from the GFD_* environment variables (``gfd.Engine.from_env``), so that an
option can be switched for a comparison (``GFD_STRIDED_MIN_ROWS=0``, say).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from typing import List, Optional

import numpy as np
from gfd import Engine, testing
from gfd.kv_worker import KVTransferWorker, host_block_ids

from ._util import fmt_size, percentile, write_csv
from .paged import parse_size, size_list


def _ptrs(base: int, ids: np.ndarray, stride: int) -> np.ndarray:
    return (np.uint64(base) + ids.astype(np.uint64) * np.uint64(stride)).astype(np.uint64)


class VllmBatch:
    """vLLM's per-job copy path: descriptors of every (block, tensor), one batched DMA."""

    def __init__(self, engine: Engine, torch, gpu, host, page: int, bpc: int) -> None:
        self.engine, self.torch, self.gpu, self.host, self.page, self.bpc = (
            engine,
            torch,
            gpu,
            host,
            page,
            bpc,
        )
        self.stream = torch.cuda.Stream()
        self.n = 0

    def submit(self, to_device: bool, chunks: np.ndarray, blocks: np.ndarray):
        n = len(blocks)
        t = len(self.gpu)
        src = np.empty(n * t, np.uint64)
        dst = np.empty(n * t, np.uint64)
        sizes = np.full(n * t, self.page, np.uint64)
        host_ids = host_block_ids(chunks, self.bpc, n, 0)
        for i, (g, h) in enumerate(zip(self.gpu, self.host)):
            hp = _ptrs(h.data_ptr(), host_ids, h.stride(0))
            gp = _ptrs(g.data_ptr(), blocks, g.stride(0))
            (src if to_device else dst)[i * n : (i + 1) * n] = hp
            (dst if to_device else src)[i * n : (i + 1) * n] = gp
        torch = self.torch
        s = self.stream
        s.wait_stream(torch.cuda.current_stream())
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(s)
        testing.memcpy_batch(
            self.engine,
            dst.ctypes.data,
            src.ctypes.data,
            sizes.ctypes.data,
            len(sizes),
            to_device,
            int(s.cuda_stream),
        )
        end.record(s)
        self.keep = (src, dst, sizes)
        return start, end


def _stats_line(engine: Engine) -> str:
    s = engine.stats()
    return " ".join(f"{k}={s[k]}" for k in ("chunks", "direct_copies", "strided_copies"))


def _fill(torch, tensors, seed: int) -> None:
    g = torch.Generator(device="cpu").manual_seed(seed)
    for t in tensors:
        cpu = torch.randint(-128, 127, t.shape, dtype=torch.int8, generator=g)
        t.copy_(cpu)


def gpu_caches(torch, tensors: int, gpu_blocks: int, page: int, alloc: str = "one"):
    """The per-layer ``[gpu_blocks, page]`` int8 GPU caches: views of one backing allocation at a
    constant layer stride, as vLLM 0.33's ``allocate_kv_cache`` makes them (``one``), or one
    allocation each (``separate``)."""
    if alloc == "separate":
        return [
            torch.empty((gpu_blocks, page), dtype=torch.int8, device="cuda") for _ in range(tensors)
        ]
    if alloc != "one":
        raise ValueError(f"gpu alloc must be 'one' or 'separate', not {alloc!r}")
    layer = gpu_blocks * page
    buf = torch.empty(tensors * layer, dtype=torch.int8, device="cuda")
    return [buf[t * layer : (t + 1) * layer].view(gpu_blocks, page) for t in range(tensors)]


def region_views(torch, tensors: int, page: int, bpc: int, num_chunks: int) -> list:
    """Host caches laid out as vLLM 0.33's SharedOffloadRegion lays out one rank's (world size 1):
    one pinned allocation of ``num_chunks`` rows, a row being the rank's cell (every tensor's
    ``bpc`` pages of the chunk, tensor after tensor) padded to 4 KiB; per tensor an int8
    ``[num_chunks, page * bpc]`` view whose rows are a whole row apart. (vLLM maps /dev/shm and
    registers it with cudaHostRegister; here it is a pinned torch allocation: 4 KiB pages both.)"""
    cell = tensors * page * bpc
    row = -(-cell // 4096) * 4096
    base = torch.empty(num_chunks * row, dtype=torch.int8, pin_memory=True)
    return [
        torch.as_strided(base, (num_chunks, page * bpc), (row, 1), t * page * bpc)
        for t in range(tensors)
    ]


def run_case(
    torch,
    engine: Engine,
    tensors: int,
    page: int,
    blocks: int,
    bpc: int,
    host_bytes: int,
    reps: int,
    warmup: int,
    host_memory: str,
    direction: str,
    host_layout: str = "tensor",
    trace: bool = False,
    gpu_alloc: str = "one",
) -> List[dict]:
    chunk_bytes = page * bpc
    num_chunks = max(blocks, host_bytes // (tensors * chunk_bytes))
    gpu_blocks = max(2 * blocks * bpc, 1024)
    gpu = gpu_caches(torch, tensors, gpu_blocks, page, gpu_alloc)
    if host_layout == "region":
        w = KVTransferWorker(
            engine,
            gpu,
            [list(range(tensors))],
            bpc,
            num_chunks,
            host_caches=region_views(torch, tensors, page, bpc, num_chunks),
        )
    else:
        w = KVTransferWorker(
            engine,
            gpu,
            [list(range(tensors))],
            bpc,
            num_chunks,
            host_memory=host_memory,
            host_layout=host_layout,
        )
    if host_layout == "region" and bpc > 1:
        raise SystemExit(
            "gfd_bench.vllm: --host-layout region measures --blocks-per-chunk 1 (vLLM's copy path "
            "reproduced here reads host pages as rows)"
        )
    host_rows = [w.host_rows(t) for t in range(tensors)]
    host_rows = [h if isinstance(h, torch.Tensor) else torch.from_numpy(h) for h in host_rows]
    _fill(torch, gpu, 1)
    for h in host_rows:
        h[: min(num_chunks * bpc, 64)] = 3  # the rest stays as allocated (zeros)
    vb = VllmBatch(engine, torch, gpu, host_rows, page, bpc)
    to_device = direction == "h2d"
    # The line rate: one contiguous copy of a job's bytes.
    job_bytes = tensors * blocks * page
    dma_host = torch.empty(job_bytes, dtype=torch.int8, pin_memory=True)
    dma_dev = torch.empty(job_bytes, dtype=torch.int8, device="cuda")
    rng = np.random.default_rng(7)
    results = {"gfd": [], "vllm_batch": [], "dma": []}
    submit_us = {"gfd": [], "vllm_batch": []}
    job_id = 0
    cur = torch.cuda.current_stream()
    for rep in range(warmup + reps):
        timed = rep >= warmup
        for method in ("dma", "gfd", "vllm_batch"):
            chunks = rng.choice(num_chunks, size=-(-blocks // bpc), replace=False).astype(np.int64)
            gblocks = rng.choice(gpu_blocks, size=blocks, replace=False).astype(np.int64)
            torch.cuda.synchronize()
            if method == "dma":
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record(cur)
                if to_device:
                    dma_dev.copy_(dma_host, non_blocking=True)
                else:
                    dma_host.copy_(dma_dev, non_blocking=True)
                e.record(cur)
                e.synchronize()
                seconds = s.elapsed_time(e) * 1e-3
            elif method == "gfd":
                job_id += 1
                traced = trace and rep == warmup + reps // 2
                if traced:
                    testing.trace_start(engine)
                t0 = time.perf_counter()
                w.submit(job_id, to_device, chunks, gblocks, [blocks], [0])
                t1 = time.perf_counter()
                while True:
                    done = w.get_finished()
                    if done:
                        break
                    time.sleep(20e-6)
                r = done[0]
                if traced:
                    print(
                        f"{host_layout} layout, {fmt_size(page)} pages, {direction}, job {job_id}: "
                        f"{job_bytes / r.seconds / 1e9:.1f} GB/s; stats {_stats_line(engine)}"
                    )
                    print(testing.trace_report(testing.trace_take(engine)))
                if not r.success:
                    raise RuntimeError(f"gfd job failed: {r.error}")
                seconds = r.seconds
                if timed:
                    submit_us["gfd"].append((t1 - t0) * 1e6)
            else:
                t0 = time.perf_counter()
                s, e = vb.submit(to_device, chunks, gblocks)
                t1 = time.perf_counter()
                e.synchronize()
                seconds = s.elapsed_time(e) * 1e-3
                if timed:
                    submit_us["vllm_batch"].append((t1 - t0) * 1e6)
            if timed:
                results[method].append(job_bytes / seconds / 1e9)
            if rep == warmup and method != "dma":
                _verify(torch, to_device, host_rows, gpu, chunks, gblocks, bpc)
    w.shutdown()
    line = percentile(results["dma"], 0.5)
    rows = []
    for method, rates in results.items():
        rows.append(
            dict(
                method=method,
                direction=direction,
                tensors=tensors,
                page=page,
                blocks=blocks,
                bpc=bpc,
                host_memory=host_memory,
                host_layout=host_layout,
                gpu_alloc=gpu_alloc,
                gbps_p50=percentile(rates, 0.5),
                gbps_min=min(rates),
                gbps_max=max(rates),
                ratio_p50=percentile(rates, 0.5) / line,
                submit_us_p50=percentile(submit_us[method], 0.5)
                if method in submit_us
                else float("nan"),
                descriptors=tensors * blocks,
            )
        )
    return rows


def _verify(torch, to_device, host_rows, gpu, chunks, gblocks, bpc) -> None:
    torch.cuda.synchronize()
    hid = torch.from_numpy(host_block_ids(chunks, bpc, len(gblocks), 0))
    gid = torch.from_numpy(gblocks).cuda()
    for h, g in zip(host_rows, gpu):
        if not torch.equal(h[hid].cuda(), g[gid]):
            raise RuntimeError(f"verification failed ({'h2d' if to_device else 'd2h'})")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m gfd_bench.vllm", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument(
        "--tensors",
        type=int,
        default=64,
        help="canonical KV tensors (default 64: 32 layers, K and V)",
    )
    ap.add_argument(
        "--pages",
        type=size_list,
        default=size_list("8K,32K"),
        help="page bytes per block and tensor",
    )
    ap.add_argument("--blocks", type=int, default=64, help="GPU blocks per job (default 64)")
    ap.add_argument("--blocks-per-chunk", type=int, default=1)
    ap.add_argument(
        "--host-bytes", type=parse_size, default=parse_size("8G"), help="host caches in all (cold)"
    )
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--host-memory", default="pool", help="pool, torch or both (comma list)")
    ap.add_argument("--directions", default="h2d,d2h")
    ap.add_argument(
        "--host-layout",
        default="tensor,block",
        help="tensor (vLLM's per-tensor arrays), block, region (vLLM's shared region), comma list",
    )
    ap.add_argument(
        "--gpu-alloc", default="one", help="one (vLLM 0.33's single backing allocation) or separate"
    )
    ap.add_argument("--csv", default="")
    ap.add_argument(
        "--trace", action="store_true", help="print the timeline of one timed gfd job per case"
    )
    ap.add_argument(
        "--busy-thread",
        action="store_true",
        help="keep another Python thread busy (a pure-Python loop) during the runs, as a serving "
        "process's other threads are: the submit times then include taking the GIL back",
    )
    a = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print(
            "gfd_bench.vllm: needs torch with CUDA and a CUDA GPU, and torch is not installed for "
            f"{sys.executable}.\nInstall it with `{sys.executable} -m pip install torch` (vLLM itself is not "
            "needed: its copy path is reproduced here). On a machine without a GPU, the vLLM worker is "
            "tested by tools/vllm_test.sh instead.",
            file=sys.stderr,
        )
        return 2
    if not torch.cuda.is_available():
        print(
            f"gfd_bench.vllm: needs a CUDA GPU, and torch {torch.__version__} sees none "
            "(torch.cuda.is_available() is False: no GPU or driver here, or a CPU-only torch build).",
            file=sys.stderr,
        )
        return 2
    engine = Engine.from_env(device=torch.cuda.current_device())  # GFD_* variables apply (A/B runs)
    rows = []
    stop = threading.Event()
    if a.busy_thread:

        def spin() -> None:
            n = 0
            while not stop.is_set():
                n += 1

        threading.Thread(target=spin, daemon=True).start()
    for hm in a.host_memory.split(","):
        for layout in a.host_layout.split(","):
            for page in a.pages:
                for d in a.directions.split(","):
                    rows += run_case(
                        torch,
                        engine,
                        a.tensors,
                        page,
                        a.blocks,
                        a.blocks_per_chunk,
                        a.host_bytes,
                        a.reps,
                        a.warmup,
                        hm,
                        d,
                        layout,
                        a.trace,
                        a.gpu_alloc,
                    )
    stop.set()
    engine.close()
    write_csv(a.csv, rows)
    print(
        f"{'host':>5} {'layout':>6} {'page':>6} {'dir':>4} {'method':>10} {'GB/s p50':>9} {'min-max':>13} {'ratio':>6} {'submit us':>9}"
    )
    for r in rows:
        print(
            f"{r['host_memory']:>5} {r['host_layout']:>6} {fmt_size(r['page']):>6} {r['direction']:>4} {r['method']:>10} "
            f"{r['gbps_p50']:9.1f} {r['gbps_min']:6.1f}-{r['gbps_max']:<6.1f} {100 * r['ratio_p50']:5.1f}% "
            f"{r['submit_us_p50']:9.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

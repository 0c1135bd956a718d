"""``python -m gfd_bench --layout paged``: gfd measured the way vLLM calls it.

Every layer's K and V (2 x --layers caches on the GPU, torch int8 tensors [gpu blocks, block
bytes], and as many pinned host caches from gfd.empty_pinned, together about --host-cache-bytes
so that sources are cold) and ONE public call per transfer,
``engine.copy_blocks(caches, direction, src_ids, dst_ids)`` on every layer's K and V caches registered
once (``engine.register_caches``), with fresh random distinct host and
device block ids every repetition (block_mapping an int64 CPU tensor [N, 2]; the same pairs for
every cache). Methods, in the same run: gfd (a default Engine) and gfd's other backends through
the same call, against one contiguous torch copy of the same bytes (pinned host tensor to GPU
tensor, non_blocking, or back). P50 and P90 over >= 20 timed repetitions after warm-up, each
method as GB/s (10^9 bytes/s) and as a ratio to the contiguous copy; every byte verified once
per configuration and method, outside the timed region.

Timing: the transfers are ordered on torch's current stream (a torch.cuda.Stream made current
for the run, of default priority). Host to device: torch.cuda.Event pairs around each call on
that stream. Device to host: the Transfer is done only when the gather threads have placed the
last bytes in host memory, after the DMAs the stream waits for, so the figure is the host clock
from just before the call until t.wait() and the end event have both returned (the contiguous
copy is timed the same way); the event time is in the CSV as well. "call us": how long the call
itself blocks the caller (P50, time.perf_counter()).

--under-load=decode: back-to-back 4096 x 4096 bf16 matmuls on another torch.cuda.Stream of equal
(default) priority while the transfers run; per method the rate kept (P50 under load / idle P50)
and the load's slowdown (median matmul time, by events on the load stream, of the matmuls that
overlap a transfer, against the matmul time alone: the load's rate alone over its rate while a
transfer runs, counting only the overlapped part of each matmul), the contiguous copy included:
that is the floor for any copy path.

Without a GPU (or with --emulated) it runs on gfd's emulated device with gfd buffers instead of
torch tensors (no torch needed): host-only figures that say nothing about PCIe, and no load.
A GPU without torch is an error: the paged layout is measured on torch tensors.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import gfd
import numpy as np
from gfd import testing

from ._util import fmt_size, percentile

METHODS = ("gfd", "batch_async", "per_block", "zero_copy_kernel")
REF = "contiguous copy"


# --------------------------------------------------------------------------------------------
# Small helpers


def parse_size(text: str) -> int:
    """'4096', '4K', '16KiB', '4G' -> bytes (K, M, G are powers of 1024)."""
    s = text.strip().upper()
    if s.endswith("IB"):
        s = s[:-2]
    elif s.endswith("B") and len(s) > 1 and s[-2] in "KMGT":
        s = s[:-1]
    mult = 1
    if s[-1:] in ("K", "M", "G", "T"):
        mult = 1 << (10 * ("KMGT".index(s[-1]) + 1))
        s = s[:-1]
    try:
        value = float(s) if "." in s else int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a size (examples: 4096, 16K, 4G)"
        ) from None
    n = int(value * mult)
    if n <= 0:
        raise argparse.ArgumentTypeError(f"'{text}': a size must be positive")
    return n


def size_list(text: str) -> List[int]:
    return [parse_size(x) for x in text.split(",") if x.strip()]


def int_list(text: str) -> List[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"'{text}' is not a comma-separated list of integers"
        ) from None
    if not out or any(v <= 0 for v in out):
        raise argparse.ArgumentTypeError(f"'{text}': every value must be a positive integer")
    return out


_BASE: Dict[int, np.ndarray] = {}


def fill_random(a: np.ndarray, salt: int) -> None:
    """Random bytes, never zero (the poison), different in every cache (``salt``) and block."""
    a = a.reshape(-1).view(np.uint8)
    n = min(a.size, 64 << 20)
    base = _BASE.get(n)
    if base is None:
        base = _BASE[n] = np.random.default_rng(0x9E3779B9).integers(1, 256, n, dtype=np.uint8)
    for seg, off in enumerate(range(0, a.size, n)):
        k = min(n, a.size - off)
        a[off : off + k] = np.roll(base, 4099 * (salt * 997 + seg + 1))[:k]


def lcm(values: List[int]) -> int:
    out = 1
    for v in values:
        out = out * v // math.gcd(out, v)
    return out


# --------------------------------------------------------------------------------------------
# Environments: the caches, the reference copy and the clock


class Sample:
    __slots__ = ("time_us", "event_us", "wall_us", "call_us", "window")

    def __init__(self, time_us, event_us, wall_us, call_us, window):
        self.time_us = time_us  # the figure: events (h2d) or host clock to completion (d2h)
        self.event_us = event_us  # start to end event on the stream (None on the emulated device)
        self.wall_us = wall_us  # host clock, call to completion
        self.call_us = call_us  # how long the call blocked
        self.window = window  # (start event, end event) for the load overlap, or None


class TorchEnv:
    """A CUDA GPU with torch: torch tensors, torch's current stream, torch.cuda.Event."""

    emulated = False

    def __init__(
        self,
        torch: Any,
        device: int,
        caches: int,
        host_per_cache: int,
        gpu_per_cache: int,
        first_bs: int,
        max_nbytes: int,
    ) -> None:
        self.torch = torch
        self.dev = torch.device("cuda", device)
        torch.cuda.set_device(self.dev)
        self.stream = torch.cuda.Stream(self.dev)  # default priority; made current by run()
        self.label = f"torch {torch.__version__}, {torch.cuda.get_device_name(self.dev)}"
        # One flat allocation per cache, viewed as [blocks, block bytes] for each block size (so
        # the 4 GB is pinned and filled once, not once per block size).
        self.host_flat = []
        for i in range(caches):
            buf = gfd.empty_pinned((host_per_cache // first_bs, first_bs), "int8", device=device)
            t = torch.from_dlpack(buf)
            fill_random(t.numpy(), i)
            self.host_flat.append(t.view(-1))
        self.gpu_flat = [
            torch.empty(
                (gpu_per_cache // first_bs, first_bs), dtype=torch.int8, device=self.dev
            ).view(-1)
            for _ in range(caches)
        ]
        self.ref_host = torch.empty(max_nbytes, dtype=torch.uint8, pin_memory=True)
        fill_random(self.ref_host.numpy(), 100003)
        self.ref_gpu = torch.empty(max_nbytes, dtype=torch.uint8, device=self.dev)
        self.gen = torch.Generator(device=self.dev)
        self.gen.manual_seed(12345)
        self.host_pinned = bool(self.host_flat[0].is_pinned())
        torch.cuda.synchronize(self.dev)

    def current(self):
        return self.torch.cuda.stream(self.stream)

    def views(self, bs: int) -> Tuple[list, list]:
        return [t.view(-1, bs) for t in self.host_flat], [t.view(-1, bs) for t in self.gpu_flat]

    def mapping(self, pairs: np.ndarray) -> Any:
        m = self.torch.from_numpy(np.ascontiguousarray(pairs, dtype=np.int64))
        return m[:, 0], m[:, 1]  # (source ids, destination ids): strided columns, read in place

    def reference(self, nbytes: int, to_host: bool) -> Callable[[], None]:
        h, g = self.ref_host[:nbytes], self.ref_gpu[:nbytes]
        if to_host:
            return lambda: h.copy_(g, non_blocking=True)
        return lambda: g.copy_(h, non_blocking=True)

    def run_once(self, call: Callable[[], Any], to_host: bool) -> Sample:
        torch = self.torch
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record(self.stream)
        t0 = time.perf_counter()
        t = call()
        t1 = time.perf_counter()
        end.record(self.stream)
        if isinstance(t, gfd.Transfer):
            t.wait()  # d2h: the bytes are in host memory only then
        end.synchronize()
        t2 = time.perf_counter()
        ev = start.elapsed_time(end) * 1e3
        wall = (t2 - t0) * 1e6
        return Sample(wall if to_host else ev, ev, wall, (t1 - t0) * 1e6, (start, end))

    # -- verification (outside the timed region) ---------------------------------------------

    def fill_gpu_random(self) -> None:
        torch = self.torch
        with self.current():
            for g in self.gpu_flat:
                g.view(torch.uint8).copy_(
                    torch.randint(
                        1, 256, g.shape, dtype=torch.uint8, device=self.dev, generator=self.gen
                    )
                )
        self.stream.synchronize()

    def verify_h2d(self, hosts, gpus, pairs, submit) -> Tuple[bool, str]:
        torch = self.torch
        with self.current():
            for g in self.gpu_flat:
                g.zero_()  # poison: sources are never zero
        self.stream.synchronize()
        submit().wait()
        self.stream.synchronize()
        h_ids = torch.from_numpy(pairs[:, 0].astype(np.int64))
        d_ids = torch.from_numpy(pairs[:, 1].astype(np.int64)).to(self.dev)
        n_bytes = pairs.shape[0] * gpus[0].shape[1]
        for i, (h, g) in enumerate(zip(hosts, gpus)):
            want = h.index_select(0, h_ids).to(self.dev)
            if not torch.equal(g.index_select(0, d_ids), want):
                return False, f"cache {i}: destination blocks differ from their sources"
            nz = int(torch.count_nonzero(g))
            if nz != n_bytes:
                return (
                    False,
                    f"cache {i}: {nz} nonzero bytes, expected {n_bytes} (bytes outside the mapped blocks written, or missed)",
                )
        return True, ""

    def verify_d2h(self, gpus, hosts, pairs, submit) -> Tuple[bool, str]:
        torch = self.torch
        self.stream.synchronize()
        d_ids = torch.from_numpy(pairs[:, 0].astype(np.int64)).to(self.dev)
        h_ids = torch.from_numpy(pairs[:, 1].astype(np.int64))
        rows = hosts[0].shape[0]
        hset = set(pairs[:, 1].tolist())
        nbr = sorted({j for k in hset for j in (k - 1, k + 1) if 0 <= j < rows and j not in hset})
        nbr_t = torch.tensor(nbr, dtype=torch.int64)
        before = [h.index_select(0, nbr_t) for h in hosts] if nbr else None
        for h in hosts:
            h.index_fill_(0, h_ids, 0)  # poison the destinations
        submit().wait()
        self.stream.synchronize()
        ok, why = True, ""
        for i, (g, h) in enumerate(zip(gpus, hosts)):
            want = g.index_select(0, d_ids).cpu()
            if ok and not torch.equal(h.index_select(0, h_ids), want):
                ok, why = False, f"cache {i}: host blocks differ from their device sources"
            if ok and before is not None and not torch.equal(h.index_select(0, nbr_t), before[i]):
                ok, why = False, f"cache {i}: host blocks next to the destinations were written"
            if not ok:
                h.index_copy_(0, h_ids, want)  # leave no zeros behind for later h2d checks
        return ok, why

    def close(self) -> None:
        pass


class EmulatedEnv:
    """gfd's emulated device, gfd buffers and numpy: host-only figures, no torch needed."""

    emulated = True
    label = "emulated device (host-only), gfd buffers"

    def __init__(
        self,
        helper: gfd.Engine,
        caches: int,
        host_per_cache: int,
        gpu_per_cache: int,
        max_nbytes: int,
    ) -> None:
        self.helper = helper
        self.caches = caches
        self.host_per_cache = host_per_cache
        self.gpu_per_cache = gpu_per_cache
        self.handle = testing.create_stream(helper)
        self.ref_host = testing.pinned_buffer(helper, (max_nbytes,), "uint8")
        fill_random(np.asarray(self.ref_host), 100003)
        self.ref_gpu = testing.device_buffer(helper, (max_nbytes,), "uint8")
        self.rng = np.random.default_rng(12345)
        self.host_pinned = True
        self.bs = None

    def current(self):
        import contextlib

        return contextlib.nullcontext()

    def views(self, bs: int) -> Tuple[list, list]:
        # gfd.Buffer has no reshape: new buffers for each block size (they are small here).
        if self.bs != bs:
            self.hosts = [
                testing.pinned_buffer(self.helper, (self.host_per_cache // bs, bs), "int8")
                for _ in range(self.caches)
            ]
            self.gpus = [
                testing.device_buffer(self.helper, (self.gpu_per_cache // bs, bs), "int8")
                for _ in range(self.caches)
            ]
            for i, h in enumerate(self.hosts):
                fill_random(np.asarray(h), i)
            self.bs = bs
        return self.hosts, self.gpus

    def mapping(self, pairs: np.ndarray) -> Any:
        m = np.ascontiguousarray(pairs, dtype=np.int64)
        return m[:, 0], m[:, 1]  # (source ids, destination ids): strided columns, read in place

    def reference(self, nbytes: int, to_host: bool) -> Callable[[], None]:
        h, g = self.ref_host.ptr, self.ref_gpu.ptr
        if to_host:
            return lambda: testing.copy(self.helper, h, g, nbytes, False, self.handle)
        return lambda: testing.copy(self.helper, g, h, nbytes, True, self.handle)

    def run_once(self, call: Callable[[], Any], to_host: bool) -> Sample:
        t0 = time.perf_counter()
        t = call()
        t1 = time.perf_counter()
        if isinstance(t, gfd.Transfer):
            t.wait()
        testing.stream_sync(self.helper, self.handle)
        wall = (time.perf_counter() - t0) * 1e6
        return Sample(wall, None, wall, (t1 - t0) * 1e6, None)

    def fill_gpu_random(self) -> None:
        for g in self.gpus:
            a = np.asarray(g).view(np.uint8)
            a[:] = self.rng.integers(1, 256, a.shape, dtype=np.uint8)

    def verify_h2d(self, hosts, gpus, pairs, submit) -> Tuple[bool, str]:
        for g in gpus:
            np.asarray(g)[:] = 0
        submit().wait()
        testing.stream_sync(self.helper, self.handle)
        n_bytes = pairs.shape[0] * np.asarray(gpus[0]).shape[1]
        for i, (h, g) in enumerate(zip(hosts, gpus)):
            hv, gv = np.asarray(h), np.asarray(g)
            if not np.array_equal(gv[pairs[:, 1]], hv[pairs[:, 0]]):
                return False, f"cache {i}: destination blocks differ from their sources"
            nz = int(np.count_nonzero(gv))
            if nz != n_bytes:
                return False, f"cache {i}: {nz} nonzero bytes, expected {n_bytes}"
        return True, ""

    def verify_d2h(self, gpus, hosts, pairs, submit) -> Tuple[bool, str]:
        rows = np.asarray(hosts[0]).shape[0]
        hset = set(pairs[:, 1].tolist())
        nbr = np.array(
            sorted({j for k in hset for j in (k - 1, k + 1) if 0 <= j < rows and j not in hset}),
            dtype=np.int64,
        )
        before = [np.asarray(h)[nbr].copy() for h in hosts]
        for h in hosts:
            np.asarray(h)[pairs[:, 1]] = 0
        submit().wait()
        ok, why = True, ""
        for i, (g, h) in enumerate(zip(gpus, hosts)):
            hv, want = np.asarray(h), np.asarray(g)[pairs[:, 0]]
            if ok and not np.array_equal(hv[pairs[:, 1]], want):
                ok, why = False, f"cache {i}: host blocks differ from their device sources"
            if ok and not np.array_equal(hv[nbr], before[i]):
                ok, why = False, f"cache {i}: host blocks next to the destinations were written"
            if not ok:
                hv[pairs[:, 1]] = want
        return ok, why

    def close(self) -> None:
        testing.destroy_stream(self.helper, self.handle)


# --------------------------------------------------------------------------------------------
# The decode-like load


class DecodeLoad:
    """Back-to-back 4096 x 4096 bf16 matmuls on a torch.cuda.Stream of default priority, fed
    between repetitions so that the queue always holds more work than one transfer takes."""

    MAX_AHEAD = 300  # matmuls queued at most (stays well under the launch queue's depth)

    def __init__(self, torch: Any, dev: Any, n: int = 4096) -> None:
        self.torch = torch
        self.stream = torch.cuda.Stream(dev)  # default priority, as the transfer stream
        g = torch.Generator(device=dev)
        g.manual_seed(7)
        self.a = torch.randn((n, n), device=dev, dtype=torch.bfloat16, generator=g)
        self.b = torch.randn((n, n), device=dev, dtype=torch.bfloat16, generator=g)
        self.c = torch.empty((n, n), device=dev, dtype=torch.bfloat16)
        self.events: list = []
        self.done = 0
        self.ahead = 8
        self.dry = 0
        self.mm_ms = 0.2
        torch.cuda.synchronize(dev)  # the inputs were made on another stream
        self.alone()  # warm-up (cuBLAS handle, workspace, clocks)
        self.mm_ms = self.alone()

    def _enqueue(self, k: int) -> None:
        torch = self.torch
        with torch.cuda.stream(self.stream):
            for _ in range(k):
                torch.mm(self.a, self.b, out=self.c)
                e = torch.cuda.Event(enable_timing=True)
                e.record(self.stream)
                self.events.append(e)

    def _first(self) -> None:
        e = self.torch.cuda.Event(enable_timing=True)
        e.record(self.stream)
        self.events = [e]
        self.done = 0

    def alone(self, count: int = 60) -> float:
        """Median matmul time (ms) with nothing else running."""
        self.stream.synchronize()
        self._first()
        self._enqueue(count)
        self.stream.synchronize()
        ev = self.events
        d = [ev[i].elapsed_time(ev[i + 1]) for i in range(5, len(ev) - 1)]
        return percentile(d, 0.5)

    def start(self, cover_ms: float) -> None:
        """Starts the load with enough queued for ``cover_ms``; returns once it runs."""
        self.stream.synchronize()
        self.ahead = max(8, min(self.MAX_AHEAD, int(math.ceil(cover_ms / self.mm_ms)) + 4))
        self.dry = 0
        self._first()
        self._enqueue(self.ahead)
        while not self.events[2].query():  # two matmuls done: the load is running
            time.sleep(20e-6)

    def _advance(self) -> None:
        ev = self.events
        while self.done + 1 < len(ev) and ev[self.done + 1].query():
            self.done += 1

    def top_up(self) -> None:
        self._advance()
        if self.done + 1 >= len(self.events):
            self.dry += 1  # the queue ran empty since the last top-up
        pending = len(self.events) - 1 - self.done
        if pending < self.ahead:
            self._enqueue(self.ahead - pending)

    def stop(self) -> List[Tuple[float, float]]:
        """Waits for the queued matmuls; returns (start ms, end ms) of each, from the first event."""
        self.stream.synchronize()
        ev = self.events
        t = [ev[0].elapsed_time(e) for e in ev]
        return [(t[i], t[i + 1]) for i in range(len(t) - 1)]

    def during(
        self, spans: List[Tuple[float, float]], windows: List[Tuple[Any, Any]], alone_ms: float
    ) -> Tuple[Optional[float], Optional[float], int]:
        """The load's slowdown while transfers run: (slowdown, median ms of the matmuls that
        overlap a transfer, how many do).

        A matmul that overlaps the transfers for ``ov`` ms of its ``d`` ms did its work at the
        idle rate for ``d - ov`` and at 1/s of it for ``ov``: ``(d - ov) + ov / s = alone``. Summed
        over every overlapping matmul, s = sum(ov) / (sum(ov) - sum(d - alone)): the load's rate
        alone over its rate during transfers, for transfers shorter than one matmul as well."""
        e0 = self.events[0]
        w = sorted((e0.elapsed_time(s), e0.elapsed_time(e)) for s, e in windows)
        durations = []
        total_ov = extra = 0.0
        j = 0
        for a, b in spans:
            while j < len(w) and w[j][1] <= a:
                j += 1
            ov = 0.0
            k = j
            while k < len(w) and w[k][0] < b:
                ov += max(0.0, min(b, w[k][1]) - max(a, w[k][0]))
                k += 1
            if ov > 0:
                durations.append(b - a)
                total_ov += ov
                extra += (b - a) - alone_ms
        if not durations or total_ov <= 0:
            return None, None, 0
        denom = total_ov - extra
        slowdown = total_ov / denom if denom > total_ov / 100 else 100.0  # the load all but stopped
        return slowdown, percentile(durations, 0.5), len(durations)


# --------------------------------------------------------------------------------------------
# The run


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m gfd_bench --layout paged",
        description="gfd measured the way a runtime calls it: copy_blocks over every layer's K and V caches, registered once.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument(
        "--layers", type=int, default=32, help="layers (2 caches each, K and V; default 32)"
    )
    p.add_argument(
        "--block-sizes",
        type=size_list,
        default=size_list("4K,16K,32K"),
        help="bytes per block of one cache, comma-separated (default 4K,16K,32K)",
    )
    p.add_argument(
        "--blocks",
        type=int_list,
        default=[64],
        help="blocks per transfer, comma-separated (default 64)",
    )
    p.add_argument(
        "--direction", choices=["h2d", "d2h", "both"], default="both", help="default both"
    )
    p.add_argument(
        "--methods",
        default=",".join(METHODS),
        help=f"comma-separated, of {', '.join(METHODS)} (default all; 'gfd' is a default Engine)",
    )
    p.add_argument(
        "--iters", type=int, default=20, help="timed repetitions (default 20, at least 20)"
    )
    p.add_argument("--warmup", type=int, default=3, help="untimed repetitions first (default 3)")
    p.add_argument(
        "--host-cache-bytes",
        type=parse_size,
        default=None,
        help="all host caches together (default 4G; 256M on the emulated device)",
    )
    p.add_argument(
        "--gpu-cache-bytes",
        type=parse_size,
        default=None,
        help="all GPU caches together (default 2G; 256M on the emulated device)",
    )
    p.add_argument(
        "--under-load",
        nargs="?",
        const="decode",
        default=None,
        choices=["decode"],
        help="also measure under a decode-like matmul load on another stream",
    )
    p.add_argument("--device", type=int, default=0)
    p.add_argument(
        "--emulated", action="store_true", help="the emulated device (host-only figures, no torch)"
    )
    p.add_argument("--csv", metavar="FILE", default=None, help="also write every row to FILE")
    p.add_argument("--seed", type=int, default=1, help="seed of the block picks (default 1)")
    return p


CSV_FIELDS = [
    "layout",
    "device",
    "layers",
    "caches",
    "block_bytes",
    "blocks",
    "direction",
    "method",
    "backend",
    "bytes",
    "iters",
    "p50_us",
    "p90_us",
    "p50_gbps",
    "p90_gbps",
    "ref_p50_gbps",
    "ratio",
    "call_p50_us",
    "event_p50_us",
    "wall_p50_us",
    "verified",
    "load",
    "load_p50_gbps",
    "load_p90_gbps",
    "load_ratio",
    "rate_kept",
    "load_dry",
    "mm_alone_ms",
    "mm_during_ms",
    "load_slowdown",
    "mm_samples",
]


def main(argv: Optional[List[str]] = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    iters = max(20, a.iters)
    warmup = max(0, a.warmup)
    if a.layers <= 0:
        p.error("--layers must be positive")
    methods = [m.strip() for m in a.methods.split(",") if m.strip()]
    bad = [m for m in methods if m not in METHODS]
    if bad or not methods:
        p.error(
            f"--methods: unknown {', '.join(bad) or '(none)'}; choose from {', '.join(METHODS)}"
        )
    directions = ["h2d", "d2h"] if a.direction == "both" else [a.direction]
    caches = 2 * a.layers

    emulated = a.emulated or gfd.cuda_device_count() == 0
    torch = None
    if emulated:
        if not a.emulated:
            print(
                "No CUDA GPU is visible here: running on the emulated device. These figures are host-only\n"
                "(gather threads into the real staging ring, the 'DMA' a host memcpy) and say nothing about PCIe."
            )
        if a.under_load:
            print(
                "--under-load needs torch and a CUDA GPU: no load on the emulated device (skipped)"
            )
    else:
        try:
            import torch  # noqa: F401  (the benchmark needs it; gfd itself does not)
        except ImportError:
            print(
                "error: --layout paged measures copy_blocks on torch tensors and times it with torch.cuda.Event,\n"
                "but torch is not installed for this interpreter. Install PyTorch (with CUDA), or pass --emulated\n"
                "for the host-only run, or use the default layout (python -m gfd_bench), which needs no torch.",
                file=sys.stderr,
            )
            return 2
        if not torch.cuda.is_available():
            print(
                "error: --layout paged: gfd sees a CUDA GPU but torch.cuda.is_available() is False (a CPU-only\n"
                "torch build?). Install a CUDA build of PyTorch, or pass --emulated for the host-only run.",
                file=sys.stderr,
            )
            return 2

    host_total = a.host_cache_bytes or ((256 << 20) if emulated else (4 << 30))
    gpu_total = a.gpu_cache_bytes or ((256 << 20) if emulated else (2 << 30))
    sizes = a.block_sizes
    if not sizes:
        p.error("--block-sizes: give at least one size")
    unit = lcm(sizes)
    host_per_cache = host_total // caches // unit * unit
    gpu_per_cache = gpu_total // caches // unit * unit
    max_n = max(a.blocks)
    for bs in sizes:
        if host_per_cache // bs < max_n:
            p.error(
                f"--host-cache-bytes: {fmt_size(host_total)} over {caches} caches gives "
                f"{host_per_cache // bs} host blocks of {fmt_size(bs)} per cache, fewer than --blocks {max_n}"
            )
        if gpu_per_cache // bs < max_n:
            p.error(
                f"--gpu-cache-bytes: {fmt_size(gpu_total)} over {caches} caches gives "
                f"{gpu_per_cache // bs} GPU blocks of {fmt_size(bs)} per cache, fewer than --blocks {max_n}"
            )
    max_nbytes = caches * max_n * max(sizes)

    # Engines: a default one ('gfd') and one per other backend, from the GFD_* variables (A/B runs).
    engines: Dict[str, Any] = {}
    skipped: Dict[Tuple[str, str], str] = {}
    for m in methods:
        opts = {} if m == "gfd" else {"backend": m}
        try:
            engines[m] = (
                testing.emulated_engine(**opts)
                if emulated
                else gfd.Engine.from_env(device=a.device, **opts)
            )
        except gfd.Error as e:
            print(
                f"skipped: {m}: gfd.Engine({', '.join(f'{k}={v!r}' for k, v in opts.items())}) raised: {e}"
            )
    if not engines:
        print("error: no engine could be created", file=sys.stderr)
        return 1
    helper = next(iter(engines.values()))

    if emulated:
        env: Any = EmulatedEnv(helper, caches, host_per_cache, gpu_per_cache, max_nbytes)
    else:
        env = TorchEnv(torch, a.device, caches, host_per_cache, gpu_per_cache, sizes[0], max_nbytes)
    load = DecodeLoad(torch, env.dev) if (a.under_load and not emulated) else None

    st = helper.stats()
    backends = {m: e.options()["backend"] for m, e in engines.items()}
    print(
        f"gfd_bench --layout paged: {a.layers} layers x K,V = {caches} caches per side, "
        f"engine.copy_blocks(caches, direction, src_ids, dst_ids) on caches registered once, one call per transfer"
    )
    print(
        f"  device {a.device}{' (emulated)' if emulated else ''} | {env.label} | host caches "
        f"{fmt_size(host_per_cache * caches)} (gfd.empty_pinned, {fmt_size(host_per_cache)} each, "
        f"pinned={env.host_pinned}), GPU caches {fmt_size(gpu_per_cache * caches)} | cold: fresh random "
        f"distinct host and device blocks every rep | {iters} timed reps after {warmup} warm-up"
    )
    print(
        "  methods: "
        + ", ".join(f"{m} (backend {b})" for m, b in backends.items())
        + f" | engine: {st['gather_threads']} gather threads, staging {fmt_size(st['staging_bytes'])}"
        + (
            f" | GFD_* applied: {' '.join(f'{k}={v}' for k, v in sorted(os.environ.items()) if k.startswith('GFD_'))}"
            if any(k.startswith("GFD_") for k in os.environ) and not emulated
            else ""
        )
    )
    if emulated:
        print(
            "  timing: host clock from the call until the transfer is done and the stream drained"
        )
    else:
        print(
            "  timing: h2d by torch.cuda.Event on the current stream; d2h host clock from the call until "
            "t.wait() (bytes placed in host memory)"
        )
    if load is not None:
        print(
            f"  load: 4096x4096 bf16 matmul back to back on a default-priority stream, "
            f"{load.mm_ms:.3f} ms each alone"
        )

    rng = np.random.default_rng(a.seed)
    rows: List[dict] = []
    failures = 0
    t_start = time.perf_counter()

    def picks(n: int, hb: int, gb: int, to_host: bool, count: int) -> List[np.ndarray]:
        out = []
        for _ in range(count):
            h = rng.choice(hb, n, replace=False)
            d = rng.choice(gb, n, replace=False)
            out.append(np.stack([d, h] if to_host else [h, d], 1).astype(np.int64))
        return out

    def series(
        call_for: Callable[[Any], Callable[[], Any]],
        maps: List[Any],
        to_host: bool,
        under_load: bool,
        cover_ms: float,
    ):
        """warmup + iters repetitions: the timed samples, and under load the matmul spans and
        every repetition's window (warm-up ones too: they load the GPU as well)."""
        samples, windows = [], []
        if under_load:
            load.start(cover_ms)
        spans = None
        try:
            for i, m in enumerate(maps):
                if under_load:
                    load.top_up()
                s = env.run_once(call_for(m), to_host)
                windows.append(s.window)
                if i >= warmup:
                    samples.append(s)
        finally:
            if under_load:
                spans = load.stop()
        return samples, spans, windows

    def summarize(samples: List[Sample], nbytes: int) -> dict:
        t = [s.time_us for s in samples]
        ev = [s.event_us for s in samples if s.event_us is not None]
        p50, p90 = percentile(t, 0.5), percentile(t, 0.9)
        return dict(
            p50_us=p50,
            p90_us=p90,
            p50_gbps=nbytes / (p50 * 1e3),
            p90_gbps=nbytes / (p90 * 1e3),
            call_p50_us=percentile([s.call_us for s in samples], 0.5),
            event_p50_us=percentile(ev, 0.5) if ev else None,
            wall_p50_us=percentile([s.wall_us for s in samples], 0.5),
        )

    def skip(name: str, direction: str, bs: int, n: int, what: str, e: Exception) -> None:
        why = f"{what} raised gfd.Error [{getattr(e, 'code', '?')}]: {e}"
        print(f"skipped: {name} {direction} {fmt_size(bs)} x {n}: {why}")
        skipped.setdefault((name, direction), why)

    with env.current():
        for bs in sizes:
            hosts, gpus = env.views(bs)
            hb, gb = hosts[0].shape[0], gpus[0].shape[0]
            # Every layer's K and V described once per engine; each call passes only the ids.
            sets = {name: eng.register_caches(hosts, gpus) for name, eng in engines.items()}
            for direction in directions:
                to_host = direction == "d2h"
                if to_host:
                    env.fill_gpu_random()  # never time or verify on zeros
                src, dst = (gpus, hosts) if to_host else (hosts, gpus)
                way = gfd.Direction.TO_HOST if to_host else gfd.Direction.TO_DEVICE
                for n in a.blocks:
                    nbytes = caches * n * bs
                    print(
                        f"  ... {fmt_size(bs)} x {n} blocks x {caches} caches, {direction}",
                        file=sys.stderr,
                        flush=True,
                    )
                    ref_call = env.reference(nbytes, to_host)

                    def plan(name):
                        """(call for a mapping, the mappings of one series)"""
                        if name == REF:
                            return (lambda m: ref_call), [None] * (warmup + iters)
                        eng = engines[name]
                        maps = [env.mapping(x) for x in picks(n, hb, gb, to_host, warmup + iters)]
                        cs = sets[name]
                        return (lambda m: lambda: eng.copy_blocks(cs, way, m[0], m[1])), maps

                    config = dict(
                        layout="paged",
                        device=("emulated" if emulated else str(a.device)),
                        layers=a.layers,
                        caches=caches,
                        block_bytes=bs,
                        blocks=n,
                        direction=direction,
                        bytes=nbytes,
                        iters=iters,
                        load=a.under_load if load is not None else "",
                    )
                    measured = []  # rows of this configuration, the contiguous copy first
                    for name in [REF] + list(engines):
                        call_for, maps = plan(name)
                        try:
                            s, _, _ = series(call_for, maps, to_host, False, 0)
                        except gfd.Error as e:
                            skip(name, direction, bs, n, "copy_blocks", e)
                            continue
                        ok = "-"
                        if name != REF:
                            eng = engines[name]
                            pairs = picks(n, hb, gb, to_host, 1)[0]
                            m = env.mapping(pairs)
                            try:
                                verify = env.verify_d2h if to_host else env.verify_h2d
                                cs = sets[name]
                                good, why = verify(
                                    src, dst, pairs, lambda: eng.copy_blocks(cs, way, m[0], m[1])
                                )
                            except gfd.Error as e:
                                good, why = False, f"gfd.Error: {e}"
                            if not good:
                                failures += 1
                                print(
                                    f"VERIFY FAILED: {name} {direction} {fmt_size(bs)} x {n}: {why}",
                                    file=sys.stderr,
                                )
                            ok = "yes" if good else "NO"
                        row = dict(
                            config, method=name, backend=backends.get(name, "-"), verified=ok
                        )
                        row.update(summarize(s, nbytes))
                        measured.append(row)
                    ref = measured[0] if measured and measured[0]["method"] == REF else None
                    for row in measured:
                        row["ref_p50_gbps"] = ref["p50_gbps"] if ref else None
                        row["ratio"] = row["p50_gbps"] / ref["p50_gbps"] if ref else None
                    if load is not None:
                        mm_alone = load.alone()
                        for row in measured:
                            call_for, maps = plan(row["method"])
                            cover = max(20.0, 10.0 * row["p50_us"] / 1e3)
                            try:
                                ls, spans, windows = series(call_for, maps, to_host, True, cover)
                            except gfd.Error as e:
                                skip(row["method"], direction, bs, n, "copy_blocks under load", e)
                                continue
                            lsum = summarize(ls, nbytes)
                            slow, mm_during, count = load.during(spans, windows, mm_alone)
                            row.update(
                                load_p50_gbps=lsum["p50_gbps"],
                                load_p90_gbps=lsum["p90_gbps"],
                                rate_kept=lsum["p50_gbps"] / row["p50_gbps"],
                                load_dry=load.dry,
                                mm_alone_ms=mm_alone,
                                mm_during_ms=mm_during,
                                mm_samples=count,
                                load_slowdown=slow,
                            )
                        lref = ref.get("load_p50_gbps") if ref else None
                        for row in measured:
                            if lref and row.get("load_p50_gbps"):
                                row["load_ratio"] = row["load_p50_gbps"] / lref
                    rows.extend(measured)

    elapsed = time.perf_counter() - t_start
    print_table(rows, load is not None)
    if emulated:
        print("(host-only: the emulated device; these figures say nothing about PCIe)")
    if load is not None and any(r.get("load_dry") for r in rows):
        print(
            "note: the load queue ran empty during some repetitions (load_dry in the CSV): those "
            "repetitions were partly unloaded"
        )
    for (name, direction), why in skipped.items():
        print(f"skipped: {name} {direction} (first reason): {why}")
    print(f"({elapsed:.1f} s measuring)")
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=CSV_FIELDS, extrasaction="ignore")
            w.writeheader()
            for r in rows:
                w.writerow(
                    {
                        k: (
                            ""
                            if r.get(k) is None
                            else (f"{r[k]:.6g}" if isinstance(r.get(k), float) else r[k])
                        )
                        for k in CSV_FIELDS
                    }
                )
        print(f"wrote {len(rows)} rows to {a.csv}")
    env.close()
    for e in engines.values():
        e.close()
    return 1 if failures else 0


def print_table(rows: List[dict], loaded: bool) -> None:
    def f(v, spec):
        return "-" if v is None else format(v, spec)

    print()
    head = (
        f"{'block':>8}{'blocks':>7}{'dir':>5}  {'method':<18}{'P50 GB/s':>9}{'ratio':>7}{'P90 GB/s':>9}"
        f"{'call us':>9}  {'verified':<8}"
    )
    if loaded:
        head += f"{'load GB/s':>10}{'kept':>6}{'ratio':>7}{'mm x':>8}"
    print(head)
    for r in rows:
        line = (
            f"{fmt_size(r['block_bytes']).replace(' ', ''):>8}{r['blocks']:>7}{r['direction']:>5}  "
            f"{r['method']:<18}{r['p50_gbps']:>9.2f}{f(r.get('ratio'), '.2f'):>7}{r['p90_gbps']:>9.2f}"
            f"{r['call_p50_us']:>9.0f}  {r['verified']:<8}"
        )
        if loaded:
            line += (
                f"{f(r.get('load_p50_gbps'), '.2f'):>10}{f(r.get('rate_kept'), '.2f'):>6}"
                f"{f(r.get('load_ratio'), '.2f'):>7}{f(r.get('load_slowdown'), '.3f'):>8}"
            )
        print(line)
    if loaded:
        print(
            "kept: P50 under load / idle P50; ratio: to the contiguous copy under the same load; mm x: the "
            "load's slowdown while transfers run\n(its rate alone / its rate during them; the contiguous "
            "copy's is the floor)"
        )


if __name__ == "__main__":
    sys.exit(main())

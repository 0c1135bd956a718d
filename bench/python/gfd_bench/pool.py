"""``python -m gfd_bench``: gfd_benchmark's headline figure from Python.

Moves N scattered blocks (default 2048 x 4 KiB) from pinned host memory to the GPU through the
Python binding, from cold sources (fresh random blocks of a pool several times the L3 each
repetition, at a 2x stride, as gfd_benchmark picks them), and compares each backend with a
contiguous copy of the same bytes measured in the same run. Reports P50 and P90 GB/s over >= 20
timed repetitions after warm-up, timed from the call to the stream's completion, and the ratio
to the contiguous copy; every byte is verified once, outside the timed region.

With torch (and a GPU) the contiguous copy, the buffers and the stream are torch's (a pinned
cudaHostAlloc pool, like gfd_benchmark's registered one); without torch, gfd's own testing
helpers provide them. Without a GPU, or with --emulated, it runs on the emulated device: the
figures are then host-only and say nothing about PCIe.

``--layout paged`` measures instead the way vLLM calls gfd: every layer's K and V caches (torch
tensors) through ``engine.register_caches`` once and ``engine.copy_blocks(caches, direction, src_ids, dst_ids)``; see gfd_bench/paged.py
(``python -m gfd_bench --layout paged --help``).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any, List

import gfd
import numpy as np
from gfd import testing

from ._util import fmt_size, percentile


def l3_bytes() -> int:
    for idx in range(8):
        base = f"/sys/devices/system/cpu/cpu0/cache/index{idx}/"
        try:
            level = int(open(base + "level").read())
            size = open(base + "size").read().strip()
        except OSError:
            continue
        if level == 3:
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(size[-1:], 1)
            return int(size.rstrip("KMG")) * mult
    return 256 << 20


class TorchEnv:
    """Buffers, stream and the contiguous copy from torch."""

    label = "torch"

    def __init__(
        self, torch: Any, device: int, pool_bytes: int, span: int, use_gfd_pool: bool
    ) -> None:
        self.torch = torch
        self.dev = torch.device("cuda", device)
        self.stream = torch.cuda.Stream(self.dev)
        self.handle = self.stream.cuda_stream
        if use_gfd_pool:
            self._pool_buf = gfd.HostPool(pool_bytes, device=device)
            self.pool = torch.from_dlpack(self._pool_buf.view((pool_bytes,), "uint8"))
            self.pool_label = f"gfd.HostPool ({self._pool_buf.hugepages} pages)"
        else:
            self.pool = torch.empty(pool_bytes, dtype=torch.uint8, pin_memory=True)
            self.pool_label = "torch pinned (cudaHostAlloc)"
        fill_random(self.pool.numpy())
        self.pool_ptr = self.pool.data_ptr()
        self.ref_src = torch.empty(span, dtype=torch.uint8, pin_memory=True)
        fill_random(self.ref_src.numpy())
        self.dst = torch.empty(span, dtype=torch.uint8, device=self.dev)
        self.dst_ptr = self.dst.data_ptr()

    def sync(self) -> None:
        self.stream.synchronize()

    def reference(self, nbytes: int, to_host: bool) -> None:
        with self.torch.cuda.stream(self.stream):
            if to_host:
                self.ref_src[:nbytes].copy_(self.dst[:nbytes], non_blocking=True)
            else:
                self.dst[:nbytes].copy_(self.ref_src[:nbytes], non_blocking=True)

    def device_bytes(self, nbytes: int) -> np.ndarray:
        self.sync()
        return self.dst[:nbytes].cpu().numpy()

    def clear_device(self, nbytes: int, value: int = 0) -> None:
        with self.torch.cuda.stream(self.stream):
            self.dst[:nbytes].fill_(value)
        self.sync()

    def write_device(self, data: np.ndarray) -> None:
        self.dst[: data.size].copy_(self.torch.from_numpy(data))
        self.torch.cuda.synchronize(self.dev)

    def pool_view(self) -> np.ndarray:
        return self.pool.numpy()


class GfdEnv:
    """The same from gfd's testing helpers (no torch), on a real or the emulated device."""

    def __init__(
        self, helper: gfd.Engine, device: int, pool_bytes: int, span: int, emulated: bool
    ) -> None:
        self.helper = helper
        self.label = "emulated device (host-only)" if emulated else "gfd helpers"
        self.handle = testing.create_stream(helper)
        if emulated:
            self._pool = testing.pinned_buffer(helper, (pool_bytes,), "uint8")
            self.pool_label = "gfd.HostPool on the emulated device"
        else:
            self._pool = gfd.HostPool(pool_bytes, device=device).view((pool_bytes,), "uint8")
            self.pool_label = "gfd.HostPool"
        self.pool_ptr = self._pool.ptr
        fill_random(np.asarray(self._pool))
        self._ref = testing.pinned_buffer(helper, (span,), "uint8")
        fill_random(np.asarray(self._ref))
        self._dst = testing.device_buffer(helper, (span,), "uint8")
        self.dst_ptr = self._dst.ptr

    def sync(self) -> None:
        testing.stream_sync(self.helper, self.handle)

    def reference(self, nbytes: int, to_host: bool) -> None:
        if to_host:
            testing.copy(self.helper, self._ref.ptr, self.dst_ptr, nbytes, False, self.handle)
        else:
            testing.copy(self.helper, self.dst_ptr, self._ref.ptr, nbytes, True, self.handle)

    def device_bytes(self, nbytes: int) -> np.ndarray:
        out = np.empty(nbytes, np.uint8)
        testing.copy(self.helper, out.ctypes.data, self.dst_ptr, nbytes, False, self.handle)
        self.sync()
        return out

    def clear_device(self, nbytes: int, value: int = 0) -> None:
        testing.memset(self.helper, self.dst_ptr, value, nbytes, self.handle)
        self.sync()

    def write_device(self, data: np.ndarray) -> None:
        testing.copy(self.helper, self.dst_ptr, data.ctypes.data, data.size, True, self.handle)
        self.sync()

    def pool_view(self) -> np.ndarray:
        return np.asarray(self._pool)

    def close(self) -> None:
        testing.destroy_stream(self.helper, self.handle)


def fill_random(a: np.ndarray) -> None:
    """Random bytes, never zero (zeros hide missed blocks), quickly for a multi-GB pool."""
    rng = np.random.default_rng(0x9E3779B9)
    chunk = rng.integers(1, 256, min(a.size, 64 << 20), dtype=np.uint8)
    for off in range(0, a.size, chunk.size):
        n = min(chunk.size, a.size - off)
        a[off : off + n] = chunk[:n]
        chunk = np.roll(chunk, 4099)  # no two chunks alike


def main(argv: List[str] = None) -> int:
    # --layout paged is its own benchmark (gfd_bench/paged.py) with its own options.
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--layout", choices=["flat", "paged"], default="flat")
    known, rest = pre.parse_known_args(sys.argv[1:] if argv is None else argv)
    if known.layout == "paged":
        from . import paged

        return paged.main(rest)
    argv = rest
    p = argparse.ArgumentParser(prog="python -m gfd_bench", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--layout",
        choices=["flat", "paged"],
        default="flat",
        help="flat (default): scattered blocks of one pool through copy_to_device/copy_to_host; "
        "paged: every layer's K and V caches through copy_blocks on torch tensors, as vLLM "
        "calls it (python -m gfd_bench --layout paged --help)",
    )
    p.add_argument("--blocks", type=int, default=2048, help="blocks per transfer (default 2048)")
    p.add_argument("--block-size", type=int, default=4096, help="bytes per block (default 4096)")
    p.add_argument(
        "--backends", default="gather", help="comma-separated backends, or 'all' (default: gather)"
    )
    p.add_argument(
        "--iters", type=int, default=30, help="timed repetitions (default 30, at least 20)"
    )
    p.add_argument("--warmup", type=int, default=5, help="untimed repetitions first (default 5)")
    p.add_argument(
        "--warm", action="store_true", help="reuse the same source blocks every repetition"
    )
    p.add_argument(
        "--dst",
        choices=["contiguous", "scattered"],
        default="contiguous",
        help="destination blocks consecutive (default) or a random permutation",
    )
    p.add_argument("--direction", choices=["h2d", "d2h"], default="h2d", help="default h2d")
    p.add_argument("--device", type=int, default=0)
    p.add_argument(
        "--pool",
        choices=["pinned", "gfd"],
        default="pinned",
        help="source pool: torch's pinned memory (cudaHostAlloc, default) or gfd.HostPool",
    )
    p.add_argument(
        "--pool-bytes",
        type=int,
        default=0,
        help="source pool size (default max(8 x L3, 32 x transfer))",
    )
    p.add_argument(
        "--no-torch", action="store_true", help="use gfd's helpers even when torch is installed"
    )
    p.add_argument(
        "--emulated", action="store_true", help="the emulated device (host-only figures)"
    )
    a = p.parse_args(argv)
    iters = max(20, a.iters)
    n, size = a.blocks, a.block_size
    to_host = a.direction == "d2h"
    backends = gfd.backends() if a.backends == "all" else [b.strip() for b in a.backends.split(",")]
    if to_host and "zero_copy_kernel" in backends:
        backends.remove("zero_copy_kernel")
        print("zero_copy_kernel moves host to device only: skipped")

    emulated = a.emulated or gfd.cuda_device_count() == 0
    if emulated and not a.emulated:
        print(
            "No CUDA GPU is visible here: running on the emulated device. These figures are host-only\n"
            "(gather threads into the real staging ring, the 'DMA' a host memcpy) and say nothing about PCIe."
        )
    torch = None
    if not emulated and not a.no_torch:
        try:
            import torch  # noqa: F401  (the benchmark needs it; gfd itself does not)
        except ImportError:
            torch = None

    span = 2 * n * size  # destination area (scattered destinations use a 2x range)
    default_pool = max(8 * l3_bytes(), 32 * n * size)
    pool_bytes = a.pool_bytes or (min(default_pool, 1 << 30) if emulated else default_pool)
    pool_bytes = max(pool_bytes & ~((1 << 20) - 1), 1 << 20)
    slots = pool_bytes // (2 * size)
    if n > slots // 2:
        print(
            f"error: a {fmt_size(pool_bytes)} pool cannot give {n} blocks of {fmt_size(size)}",
            file=sys.stderr,
        )
        return 2

    engines = {}
    for b in backends:
        if emulated:
            engines[b] = testing.emulated_engine(backend=b)
        else:
            engines[b] = gfd.Engine.from_env(device=a.device, backend=b)
    first = next(iter(engines.values()))
    if torch is not None:
        env: Any = TorchEnv(torch, a.device, pool_bytes, span, a.pool == "gfd")
    else:
        env = GfdEnv(first, a.device, pool_bytes, span, emulated)
    nbytes = n * size

    st = first.stats()
    print(
        f"gfd_bench: {n} x {fmt_size(size)} ({fmt_size(nbytes) if nbytes % 1024 == 0 else nbytes}), "
        f"{'device to host' if to_host else 'host to device'}, "
        f"{'warm (same blocks every rep)' if a.warm else 'cold (fresh random blocks every rep)'}, "
        f"{a.dst} destinations"
    )
    print(
        f"  device {a.device}{' (emulated)' if emulated else ''} | buffers: {env.label} | pool "
        f"{fmt_size(pool_bytes)} ({env.pool_label}), L3 {fmt_size(l3_bytes())}, 2x block stride | "
        f"{iters} timed reps after {a.warmup} warm-up"
    )
    print(
        f"  engine: {st['gather_threads']} gather threads, staging {fmt_size(st['staging_bytes'])} "
        f"({st['hugepages']} pages), numa node {st['numa_node']}, staging writes {st['staging_writes']}"
    )

    # The contiguous copy of the same bytes, timed the same way (call to stream completion).
    ref_us = []
    for i in range(a.warmup + iters):
        t0 = time.perf_counter()
        env.reference(nbytes, to_host)
        env.sync()
        if i >= a.warmup:
            ref_us.append((time.perf_counter() - t0) * 1e6)
    ref_p50 = percentile(ref_us, 0.5)
    ref_gbps = nbytes / (ref_p50 * 1e3)

    rng = np.random.default_rng(0xC0FFEE + n * 31 + size)
    pool_np = env.pool_view()

    def pick():
        src_slots = rng.choice(slots, n, replace=False).astype(np.uint64)
        dst_idx = rng.permutation(2 * n)[:n] if a.dst == "scattered" else np.arange(n)
        host = env.pool_ptr + src_slots * np.uint64(2 * size)
        dev = env.dst_ptr + dst_idx.astype(np.uint64) * np.uint64(size)
        return src_slots, dst_idx, host, dev

    def submit(engine, host, dev):
        if to_host:
            return engine.copy_to_host(dev, host, size, stream=env.handle)
        return engine.copy_to_device(host, dev, size, stream=env.handle)

    rows = []
    failures = 0
    for b, engine in engines.items():
        us = []
        picked = pick()
        for i in range(a.warmup + iters):
            if not a.warm and i > 0:
                picked = pick()
            _, _, host, dev = picked
            t0 = time.perf_counter()
            t = submit(engine, host, dev)
            t.wait()
            env.sync()
            if i >= a.warmup:
                us.append((time.perf_counter() - t0) * 1e6)
        # Verify every byte of one fresh set.
        src_slots, dst_idx, host, dev = pick()
        blocks = pool_np.reshape(-1, size)  # block k of a slot s is row 2 s
        rows_idx = (src_slots * 2).astype(np.int64)
        if to_host:
            fresh = np.random.default_rng(7).integers(1, 256, span, dtype=np.uint8)
            env.write_device(fresh)
            blocks[rows_idx] = 0
            submit(engine, host, dev).wait()
            env.sync()
            ok = bool((blocks[rows_idx] == fresh.reshape(-1, size)[dst_idx]).all())
        else:
            env.clear_device(span, 0)
            submit(engine, host, dev).wait()
            got = env.device_bytes(span).reshape(-1, size)
            ok = bool((got[dst_idx] == blocks[rows_idx]).all())
        if not ok:
            failures += 1
            print(f"VERIFY FAILED: {b}: bytes differ", file=sys.stderr)
        p50, p90 = percentile(us, 0.5), percentile(us, 0.9)
        rows.append((b, nbytes / (p50 * 1e3), nbytes / (p90 * 1e3), ok))

    print()
    print(f"{'method':<22}{'P50 GB/s':>10}{'P90 GB/s':>10}{'ratio':>8}  verified")
    ref_p90 = percentile(ref_us, 0.9)
    print(
        f"{'contiguous copy':<22}{ref_gbps:>10.2f}{nbytes / (ref_p90 * 1e3):>10.2f}{1.0:>8.2f}  -"
    )
    for b, g50, g90, ok in rows:
        print(
            f"{'gfd ' + b:<22}{g50:>10.2f}{g90:>10.2f}{g50 / ref_gbps:>8.2f}  {'yes' if ok else 'NO'}"
        )
    if emulated:
        print("(host-only: the emulated device; these figures say nothing about PCIe)")
    if isinstance(env, GfdEnv):
        env.close()
    for e in engines.values():
        e.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""A soak of gfd through its Python API: random transfers both ways through every path, for as
long as asked, every byte checked, resident memory and open file descriptors watched.

    PYTHONPATH=build/python python3 tools/soak.py --seconds 3600            # emulated device
    PYTHONPATH=build-gpu/python python3 tools/soak.py --device cuda --seconds 1800

(``BUILD_DIR=build tools/python_test.sh`` builds the package into build/python.) One thread per
engine, engines of every backend (gather, batch_async, per_block, zero_copy_kernel) and a
gather engine with stream-ordered device-to-host transfers, all at once. Each thread picks, at
random every step:

- a block list (copy_to_device / copy_to_host): 1 to 512 blocks of 512 B to 2 MiB, scattered,
  or as one contiguous run (coalesced), or at one constant pitch (2D copies), from pinned or
  pageable host memory;
- a transfer on registered caches (copy_blocks): one set of several layers, or a list of
  per-layer sets with an event-like callback after each;
- a vLLM-style offloading job (KVTransferWorker, 2 blocks per chunk), a store or a load.

The bytes each transfer was to move are compared with their source after it is done (device
memory read back with a plain copy on a GPU). A status line every --report seconds gives the
transfers, bytes, resident memory (RSS) and open file descriptors; at the end the verdict: no
wrong byte, no error, RSS within --rss-slack MiB of its level after the first report, and no
more descriptors than then. Exit status 0 only then.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import gfd
import numpy as np
from gfd import testing
from gfd.kv_worker import KVTransferWorker

MiB = 1 << 20
SIZES = (512, 4096, 16384, 65536, 2 * MiB)  # block sizes: staged, direct (2 MiB), in between


def rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / MiB


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class Soak:
    """One engine and its memory: a block-list arena (pinned and pageable host, device), caches
    registered once, an offloading worker; one thread runs steps on it until the deadline."""

    def __init__(self, name: str, engine: gfd.Engine, seed: int, cuda: bool) -> None:
        self.name, self.engine, self.cuda = name, engine, cuda
        self.rng = np.random.default_rng(seed)
        # zero_copy_kernel moves host to device only, from pinned memory only.
        self.d2h = self.pageable_ok = engine.options()["backend"] != "zero_copy_kernel"
        self.stream = testing.create_stream(engine)
        self.pinned = np.asarray(testing.pinned_buffer(engine, (32 * MiB,), "uint8"))
        self.pageable = np.zeros(16 * MiB, np.uint8)
        self.dev = testing.device_buffer(engine, (32 * MiB,), "uint8")
        self.scratch = np.asarray(
            testing.pinned_buffer(engine, (32 * MiB,), "uint8")
        )  # device read-back
        for a in (self.pinned, self.pageable):
            a[:] = self.rng.integers(0, 256, a.shape, dtype=np.uint8)
        # Caches: 8 layers of (host 256 blocks, device 128 blocks) of 4 KiB, each its own set too.
        self.layers = 8
        self.cache_host = [
            np.asarray(testing.pinned_buffer(engine, (256, 4096), "uint8"))
            for _ in range(self.layers)
        ]
        self.cache_dev = [
            testing.device_buffer(engine, (128, 4096), "uint8") for _ in range(self.layers)
        ]
        for h in self.cache_host:
            h[:] = self.rng.integers(0, 256, h.shape, dtype=np.uint8)
        self.caches = engine.register_caches(self.cache_host, self.cache_dev)
        self.layer_sets = [
            engine.register_caches(h, d) for h, d in zip(self.cache_host, self.cache_dev)
        ]
        # An offloading worker: 3 tensors, 64 GPU blocks, 32 chunks of 2 blocks.
        self.kv_gpu = [testing.device_buffer(engine, (64, p), "int8") for p in (2048, 1024, 4096)]
        self.worker = KVTransferWorker(engine, self.kv_gpu, [[0, 1, 2]], 2, 32)
        self.transfers = self.bytes = self.wrong = self.errors = 0
        self.failures: list = []

    # -- reading memory -------------------------------------------------------------------------

    def device_bytes(self, buf, offset: int, nbytes: int) -> np.ndarray:
        """``nbytes`` of device buffer ``buf`` at ``offset`` (a copy on a GPU)."""
        if not self.cuda:
            return np.asarray(buf).reshape(-1).view(np.uint8)[offset : offset + nbytes]
        testing.copy(
            self.engine, self.scratch.ctypes.data, buf.ptr + offset, nbytes, False, self.stream
        )
        testing.stream_sync(self.engine, self.stream)
        return self.scratch[:nbytes]

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            self.wrong += 1
            if len(self.failures) < 20:
                self.failures.append(f"{self.name}: {what}")

    # -- steps ----------------------------------------------------------------------------------

    def block_list(self) -> None:
        size = int(self.rng.choice(SIZES))
        slots = (self.dev.nbytes // size) // 2  # a pitch of up to two slots fits
        n = int(self.rng.integers(1, min(512, slots) + 1))
        shape = self.rng.choice(["scattered", "run", "pitch"], p=[0.6, 0.2, 0.2])
        if shape == "scattered":
            dst = self.rng.choice(2 * slots, n, replace=False)
        elif shape == "run":
            dst = np.arange(n) + self.rng.integers(0, 2 * slots - n + 1)
        else:
            dst = np.arange(n) * 2 + self.rng.integers(0, 2)
        host = self.pinned if not self.pageable_ok or self.rng.random() < 0.7 else self.pageable
        hslots = host.size // size
        if shape == "scattered":
            src = self.rng.choice(hslots, n, replace=False)
        else:  # one run, or one pitch (three slots) on the host side too
            src = (np.arange(n) * (1 if shape == "run" else 3)) % hslots
        dev_off = dst.astype(np.uint64) * size
        host_off = src.astype(np.uint64) * size
        to_device = not self.d2h or self.rng.random() < 0.5
        if to_device:
            t = self.engine.copy_to_device(
                host.ctypes.data + host_off, self.dev.ptr + dev_off, size, stream=self.stream
            )
        else:
            got = self.device_bytes(self.dev, 0, self.dev.nbytes)
            before = [got[d : d + size].copy() for d in dev_off.tolist()]
            t = self.engine.copy_to_host(
                self.dev.ptr + dev_off, host.ctypes.data + host_off, size, stream=self.stream
            )
        t.wait()
        self.transfers += 1
        self.bytes += n * size
        if to_device:
            got = self.device_bytes(self.dev, 0, self.dev.nbytes)
            for h, d in zip(host_off.tolist(), dev_off.tolist()):
                self.check(
                    np.array_equal(got[d : d + size], host[h : h + size]),
                    f"h2d {size} B block at {d}",
                )
        else:
            for h, b in zip(host_off.tolist(), before):
                self.check(np.array_equal(host[h : h + size], b), f"d2h {size} B block at {h}")

    def cache_blocks(self) -> None:
        n = int(self.rng.integers(1, 65))
        to_device = not self.d2h or self.rng.random() < 0.5
        src = self.rng.choice(256 if to_device else 128, n, replace=True)
        dst = self.rng.choice(128 if to_device else 256, n, replace=False)
        if not to_device:
            before = [
                self.device_bytes(d, 0, d.nbytes).copy().reshape(128, 4096) for d in self.cache_dev
            ]
        if self.rng.random() < 0.5:
            ts = [
                self.engine.copy_blocks(
                    self.caches,
                    "to_device" if to_device else "to_host",
                    src,
                    dst,
                    stream=self.stream,
                )
            ]
        else:
            seen = []
            ts = self.engine.copy_blocks(
                self.layer_sets,
                "to_device" if to_device else "to_host",
                src,
                dst,
                stream=self.stream,
                after_each=seen.append,
            )
            self.check(seen == list(range(self.layers)), f"after_each called for {seen}")
        for t in ts:
            t.wait()
        self.transfers += len(ts)
        self.bytes += n * 4096 * self.layers
        for layer in range(self.layers):
            if to_device:
                got = self.device_bytes(self.cache_dev[layer], 0, 128 * 4096).reshape(128, 4096)
                self.check(
                    np.array_equal(got[dst], self.cache_host[layer][src]),
                    f"copy_blocks h2d layer {layer}",
                )
            else:
                self.check(
                    np.array_equal(self.cache_host[layer][dst], before[layer][src]),
                    f"copy_blocks d2h layer {layer}",
                )

    def offload_job(self) -> None:
        w = self.worker
        store = self.d2h and self.rng.random() < 0.5
        chunks = self.rng.choice(32, 2, replace=False)
        blocks = self.rng.choice(64, 4, replace=False)
        gpu_before = [self.device_bytes(g, 0, g.nbytes).copy().reshape(64, -1) for g in self.kv_gpu]
        w.submit(self.transfers, not store, chunks, blocks)
        w.wait([self.transfers])
        (r,) = w.get_finished()
        self.transfers += 1
        if not r.success:
            raise r.error
        self.bytes += r.bytes
        for t, g in enumerate(self.kv_gpu):
            pages = w.host_pages(t)
            after = self.device_bytes(g, 0, g.nbytes).reshape(64, -1)
            for i, b in enumerate(blocks.tolist()):
                c, j = int(chunks[i // 2]), i % 2
                want = gpu_before[t][b] if store else pages[c, j]
                self.check(
                    np.array_equal(pages[c, j] if store else after[b], want), f"offload tensor {t}"
                )

    def run(self, deadline: float) -> None:
        steps = (self.block_list, self.cache_blocks, self.offload_job)
        while time.monotonic() < deadline:
            step = steps[int(self.rng.choice(3, p=[0.5, 0.3, 0.2]))]
            try:
                step()
            except Exception as e:  # noqa: BLE001 - counted and reported
                self.errors += 1
                if len(self.failures) < 20:
                    self.failures.append(f"{self.name}: {step.__name__}: {type(e).__name__}: {e}")

    def close(self) -> None:
        self.worker.shutdown()
        testing.destroy_stream(self.engine, self.stream)
        self.engine.close()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="tools/soak.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=3600, help="how long (default 3600)")
    p.add_argument(
        "--device",
        choices=["emulated", "cuda"],
        default="emulated",
        help="gfd's emulated device (default: no GPU needed) or a CUDA GPU",
    )
    p.add_argument("--ordinal", type=int, default=0, help="the GPU (--device cuda)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--report", type=float, default=60, help="seconds between status lines (default 60)"
    )
    p.add_argument(
        "--rss-slack",
        type=float,
        default=64,
        help="MiB RSS may grow after the first report (default 64)",
    )
    a = p.parse_args(argv)
    cuda = a.device == "cuda"
    if cuda and gfd.cuda_device_count() <= a.ordinal:
        print(
            f"soak: no CUDA GPU {a.ordinal} here; --device emulated runs without one",
            file=sys.stderr,
        )
        return 2

    def engine(**options):
        small = dict(staging_bytes=8 * MiB, slot_bytes=1 * MiB)
        if cuda:
            return gfd.Engine(a.ordinal, **small, **options)
        return testing.emulated_engine(**small, **options)

    soaks = [
        Soak(b, engine(backend=b), a.seed + i, cuda)
        for i, b in enumerate(("gather", "batch_async", "per_block", "zero_copy_kernel"))
    ]
    soaks.append(
        Soak(
            "gather, stream-ordered to host", engine(stream_ordered_to_host=True), a.seed + 9, cuda
        )
    )
    print(
        f"soak: gfd {gfd.__version__}, {'GPU ' + str(a.ordinal) if cuda else 'emulated device'}, "
        f"{len(soaks)} engines, {a.seconds:.0f} s, seed {a.seed}",
        flush=True,
    )
    t0 = time.monotonic()
    deadline = t0 + a.seconds
    threads = [threading.Thread(target=s.run, args=(deadline,), daemon=True) for s in soaks]
    for t in threads:
        t.start()
    base = None  # (RSS, fds) at the first report: pools, rings and caches made by then
    peak_rss = 0.0
    next_report = t0 + a.report
    while any(t.is_alive() for t in threads):
        time.sleep(max(0.0, min(1.0, next_report - time.monotonic())))
        if time.monotonic() < next_report and any(t.is_alive() for t in threads):
            continue
        next_report += a.report
        rss, fds = rss_mib(), open_fds()
        if base is None:
            base = (rss, fds)
        peak_rss = max(peak_rss, rss)
        n, b = sum(s.transfers for s in soaks), sum(s.bytes for s in soaks)
        wrong, errors = sum(s.wrong for s in soaks), sum(s.errors for s in soaks)
        print(
            f"soak: {time.monotonic() - t0:7.0f} s  {n} transfers  {b / 1e9:.2f} GB  wrong {wrong}  errors {errors}  "
            f"RSS {rss:.0f} MiB  fds {fds}",
            flush=True,
        )
        if time.monotonic() > deadline + 300:
            print("soak: a thread did not finish 300 s after the deadline", file=sys.stderr)
            return 1
    for s in soaks:
        s.close()
    rss, fds = rss_mib(), open_fds()
    wrong, errors = sum(s.wrong for s in soaks), sum(s.errors for s in soaks)
    for s in soaks:
        for f in s.failures:
            print("soak: " + f, file=sys.stderr)
    grew = max(peak_rss, rss) - base[0]
    ok = wrong == 0 and errors == 0 and grew <= a.rss_slack and fds <= base[1]
    print(
        f"soak: {'passed' if ok else 'FAILED'}: {sum(s.transfers for s in soaks)} transfers, "
        f"{sum(s.bytes for s in soaks) / 1e9:.2f} GB, {wrong} wrong, {errors} errors; RSS {base[0]:.0f} MiB "
        f"after the first report, at most {max(peak_rss, rss):.0f} MiB since (+{grew:.0f}, slack {a.rss_slack:.0f}); "
        f"fds {base[1]} then, {fds} at the end",
        flush=True,
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

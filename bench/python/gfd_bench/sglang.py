"""``python -m gfd_bench.sglang``: HiCache's loads and write-backs as gfd.sglang makes them,
against SGLang's own two transfer paths rebuilt from their published shapes, in the same run.

The pools as SGLang's HiCache lays them out (SGLang itself is not needed): per layer a device
K and V buffer (tokens, heads, dim) of bf16 (``--model llama3-8b``: 32 layers, 8 KV heads x 128;
``--model mla``: 61 layers of one 576-value latent), a pinned host pool of about ``--host-bytes``
(cold) in the ``layer_first`` or ``page_first_direct`` layout, pages of ``--page`` tokens. A load
moves ``--pages`` random host pages to random device pages in every layer; a write-back the
reverse. Methods, each in the same run on the same pools:

- ``gfd``: gfd.sglang's call: one ``copy_blocks`` over every layer's cache set on the load
  stream, an event recorded after each layer (a write-back: one transfer of every layer, on an
  engine with ``stream_ordered_to_host``, acknowledged by an event after the call);
- ``direct``: SGLang's ``direct`` io backend: one copy per page per layer (gfd's per_block
  backend: a ``cudaMemcpyAsync`` each), called per layer from Python with an event after each;
- ``kernel``: SGLang's ``kernel`` io backend: an SM kernel of 2 CTAs of 32 warps each reading (or
  writing) host memory through unified addressing, a page at a time, launched per layer (Triton);
  its page addresses are on the GPU before the batch starts, as SGLang's indices are;
- ``dma``: one contiguous copy of the same bytes, the line rate of this run.

Reported per method (P50 and spread of ``--reps`` timed batches): GB/s and its ratio to the
line rate; "layer 0": the time from the batch's start on the stream until layer 0's event (the
first layer the forward pass can use); "link us": layer 0's copies alone, timed once all of them
are enqueued (issued behind a GPU spin), so that "layer 0" less "link us" is what the calls add;
"enq us": from the first call until layer 0's copies are enqueued; "call us": how long the calls
hold the scheduler's thread for the whole batch. With ``--load matmul`` each method also runs
beside back-to-back bf16 matmuls on another stream, and the matmuls' slowdown is reported. Every
method's bytes are verified once per configuration. Needs torch with CUDA (and Triton for ``kernel``).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import List, Optional, Tuple

import numpy as np
from gfd import Engine

from ._util import fmt_size, percentile, write_csv
from .paged import parse_size

MODELS = {
    "llama3-8b": (32, (8, 128), 2),
    "mla": (61, (1, 576), 1),
}  # layers, per-token shape, K/V parts


def _uva_kernel():
    """SGLang's kernel path rebuilt: ``grid`` programs (CTAs) copying pages through unified
    addressing, each program a page at a time."""
    import triton
    import triton.language as tl

    @triton.jit
    def copy_pages(src_addrs, dst_addrs, n, WORDS: tl.constexpr, CHUNK: tl.constexpr):
        pid = tl.program_id(0)
        step = tl.num_programs(0)
        offsets = tl.arange(0, CHUNK)
        job = pid
        while job < n:
            src = tl.load(src_addrs + job).to(tl.pointer_type(tl.int64))
            dst = tl.load(dst_addrs + job).to(tl.pointer_type(tl.int64))
            for start in range(0, WORDS, CHUNK):
                mask = start + offsets < WORDS
                tl.store(
                    dst + start + offsets, tl.load(src + start + offsets, mask=mask), mask=mask
                )
            job += step

    # SGLang launches 2 CTAs of 32 warps (block_quota 2, num_warps_per_block 32), a warp copying
    # one token's bytes with 8-byte loads: up to 64 warps' loads in flight. 32 warps a program
    # and 64 KiB a step keep as many bytes in flight, which reading host memory over PCIe needs.
    return lambda src, dst, n, words: copy_pages[(2,)](
        src, dst, n, WORDS=words, CHUNK=8192, num_warps=32
    )


class Pools:
    """Device buffers and a pinned host pool shaped as SGLang's, and each layer's pages as byte
    rows (pages, page bytes) for registration and for the peers' addresses."""

    def __init__(
        self, torch, model: str, layout: str, page: int, host_bytes: int, device_pages: int
    ) -> None:
        layers, token, parts = MODELS[model]
        self.torch, self.layers, self.parts, self.layout, self.page = (
            torch,
            layers,
            parts,
            layout,
            page,
        )
        per_token = int(np.prod(token)) * 2
        self.page_bytes = page * per_token
        self.host_pages = max(host_bytes // (self.page_bytes * layers * parts), 256)
        self.device_pages = device_pages
        self.dev = [
            [
                torch.empty((device_pages * page, *token), dtype=torch.bfloat16, device="cuda")
                for _ in range(layers)
            ]
            for _ in range(parts)
        ]
        if layout == "layer_first":
            shape = (parts, layers, self.host_pages * page, *token)
        else:
            shape = (parts, self.host_pages, layers, page, *token)
        self.host = torch.empty(
            shape, dtype=torch.bfloat16, pin_memory=True
        )  # far larger than the caches
        g = torch.Generator(device="cuda").manual_seed(1)
        for part in self.dev:
            for t in part:
                t.view(torch.int16).random_(generator=g)

    def host_rows(self, part: int, layer: int):
        if self.layout == "layer_first":
            return self.host[part, layer].view(self.host_pages, -1).view(self.torch.int8)
        return self.host[part, :, layer].flatten(1).view(self.torch.int8)

    def dev_rows(self, part: int, layer: int):
        return self.dev[part][layer].view(self.device_pages, -1).view(self.torch.int8)

    def arrays(self, layer: int) -> tuple:
        return (
            [self.host_rows(p, layer) for p in range(self.parts)],
            [self.dev_rows(p, layer) for p in range(self.parts)],
        )

    def addresses(
        self, layers: range, host_pages: np.ndarray, dev_pages: np.ndarray, to_device: bool
    ) -> tuple:
        """(sources, destinations) of every page of ``layers``, as int64 device tensors."""
        src, dst = [], []
        for layer, p in ((layer, p) for layer in layers for p in range(self.parts)):
            h, d = self.host_rows(p, layer), self.dev_rows(p, layer)
            hp = h.data_ptr() + host_pages.astype(np.int64) * h.stride(0)
            dp = d.data_ptr() + dev_pages.astype(np.int64) * d.stride(0)
            src.append(hp if to_device else dp)
            dst.append(dp if to_device else hp)
        t = self.torch
        return (t.from_numpy(np.concatenate(src)).cuda(), t.from_numpy(np.concatenate(dst)).cuda())


def run_case(torch, args, model: str, layout: str, direction: str) -> List[dict]:
    to_device = direction == "load"
    pools = Pools(torch, model, layout, args.page, args.host_bytes, max(4 * args.pages, 1024))
    L, parts = pools.layers, pools.parts
    device = torch.cuda.current_device()
    gfd_engine = Engine.from_env(device=device, stream_ordered_to_host=True)
    direct_engine = Engine.from_env(device=device, backend="per_block")
    per_layer = [gfd_engine.register_caches(*pools.arrays(layer)) for layer in range(L)]
    hosts, devs = [], []
    for layer in range(L):
        h, d = pools.arrays(layer)
        hosts += h
        devs += d
    every = gfd_engine.register_caches(hosts, devs)
    direct_sets = [direct_engine.register_caches(*pools.arrays(layer)) for layer in range(L)]
    direct_every = direct_engine.register_caches(hosts, devs)
    kernel = _uva_kernel() if "kernel" in args.methods else None
    stream = torch.cuda.Stream()
    batch_bytes = args.pages * pools.page_bytes * L * parts
    dma_host = torch.empty(batch_bytes, dtype=torch.int8, pin_memory=True)
    dma_dev = torch.empty(batch_bytes, dtype=torch.int8, device="cuda")
    rng = np.random.default_rng(7)
    rows = []

    def batch(method: str, hp: np.ndarray, dp: np.ndarray) -> tuple:
        """One batch on ``stream``: (start event, per-layer events, seconds the calls took,
        seconds until layer 0's copies were enqueued)."""
        events = [torch.cuda.Event(enable_timing=True) for _ in range(L)]
        layer0_at = []  # perf_counter() once layer 0 is enqueued

        def record(k: int) -> None:
            events[k].record(stream)
            if k == 0:
                layer0_at.append(time.perf_counter())

        addresses = []
        if method == "kernel":  # built and on the GPU before the batch, outside the timed calls
            addresses = [
                (part, pools.addresses(part, hp, dp, to_device))
                for part in (
                    [range(layer, layer + 1) for layer in range(L)] if to_device else [range(L)]
                )
            ]
            torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        start.record(stream)
        t0 = time.perf_counter()
        if method == "gfd":
            if to_device:
                gfd_engine.copy_blocks(
                    per_layer, "to_device", hp, dp, stream=stream, after_each=record
                )
            else:
                gfd_engine.copy_blocks(every, "to_host", dp, hp, stream=stream)
                for k in range(L):
                    record(k)
        elif method == "direct":  # loads per layer from Python, a write-back all layers in one call
            if to_device:
                for layer in range(L):
                    direct_engine.copy_blocks(
                        direct_sets[layer], "to_device", hp, dp, stream=stream
                    )
                    record(layer)
            else:
                direct_engine.copy_blocks(direct_every, "to_host", dp, hp, stream=stream)
                for k in range(L):
                    record(k)
        elif method == "kernel":  # the same, a launch per layer or one for all
            with torch.cuda.stream(stream):
                for part, (src, dst) in addresses:
                    kernel(src, dst, len(src), pools.page_bytes // 8)
                    for layer in part:
                        record(layer)
        else:  # dma
            with torch.cuda.stream(stream):
                if to_device:
                    dma_dev.copy_(dma_host, non_blocking=True)
                else:
                    dma_host.copy_(dma_dev, non_blocking=True)
                for k in range(L):
                    record(k)
        return start, events, time.perf_counter() - t0, layer0_at[0] - t0

    def layer0_on_link(method: str, hp: np.ndarray, dp: np.ndarray) -> float:
        """Microseconds layer 0's copies of a load take once every one of them is enqueued: issued
        behind a GPU spin on ``stream`` and timed from the spin's end to their completion, so the
        calls' own time is left out (NaN where the calls outlasted the spin). Loads by gfd,
        ``direct`` or ``kernel`` only."""
        if method == "kernel":
            src, dst = pools.addresses(range(1), hp, dp, True)
        torch.cuda.synchronize()
        spin, begin, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        spin.record(stream)
        with torch.cuda.stream(stream):
            torch.cuda._sleep(4_000_000)  # GPU clock cycles: about 2 ms
        begin.record(stream)
        t0 = time.perf_counter()
        if method == "gfd":
            gfd_engine.copy_blocks(per_layer[:1], "to_device", hp, dp, stream=stream)
        elif method == "direct":
            direct_engine.copy_blocks(direct_sets[0], "to_device", hp, dp, stream=stream)
        else:
            with torch.cuda.stream(stream):
                kernel(src, dst, len(src), pools.page_bytes // 8)
        enqueued = time.perf_counter() - t0
        end.record(stream)
        end.synchronize()
        if enqueued * 1e3 >= spin.elapsed_time(begin):
            return float("nan")
        return begin.elapsed_time(end) * 1e3

    def verify(method: str, hp: np.ndarray, dp: np.ndarray) -> None:
        hi, di = torch.from_numpy(hp), torch.from_numpy(dp).cuda()
        for layer in range(L):
            for p in range(parts):
                h, d = pools.host_rows(p, layer)[hi], pools.dev_rows(p, layer)[di].cpu()
                if not torch.equal(h, d):
                    raise RuntimeError(
                        f"{method}: {direction} layer {layer} part {p}: bytes differ"
                    )

    def matmuls(n: int) -> float:
        """Seconds for n back-to-back bf16 matmuls on a stream of their own."""
        s = torch.cuda.Stream()
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        with torch.cuda.stream(s):
            b0, b1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            b0.record(s)
            for _ in range(n):
                a = (a @ a).clamp_(-1, 1)
            b1.record(s)
        b1.synchronize()
        return b0.elapsed_time(b1) * 1e-3

    def pick() -> Tuple[np.ndarray, np.ndarray]:
        """A batch's random host and device pages, none twice: cold host pages each batch."""
        hp = rng.choice(pools.host_pages, args.pages, replace=False).astype(np.int64)
        dp = rng.choice(pools.device_pages, args.pages, replace=False).astype(np.int64)
        return hp, dp

    idle_mm = None
    if args.load == "matmul":
        matmuls(10)  # cuBLAS's first calls pick their kernels: not part of the idle time
        idle_mm = matmuls(args.matmuls)
    for method in ["dma"] + [m for m in args.methods if m != "dma"]:
        rates, first, enqueued, calls, slow = [], [], [], [], []
        for rep in range(args.warmup + args.reps):
            hp, dp = pick()
            torch.cuda.synchronize()
            start, events, call, issued = batch(method, hp, dp)
            events[-1].synchronize()
            if method != "dma" and rep == args.warmup - 1:
                verify(method, hp, dp)
            if rep < args.warmup:
                continue
            rates.append(batch_bytes / (start.elapsed_time(events[-1]) * 1e-3) / 1e9)
            first.append(start.elapsed_time(events[0]) * 1e3)
            calls.append(call * 1e6)
            enqueued.append(issued * 1e6)
        on_link = []
        for _ in range(args.reps if to_device and method != "dma" else 0):
            hp, dp = pick()
            on_link.append(layer0_on_link(method, hp, dp))
        on_link = [v for v in on_link if v == v]
        if args.load == "matmul":
            # Beside the model: the method's batches back to back while the matmuls run.
            torch.cuda.synchronize()
            s = torch.cuda.Stream()
            a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
            b0, b1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(s):
                b0.record(s)
                for _ in range(args.matmuls):
                    a = (a @ a).clamp_(-1, 1)
                b1.record(s)
            while not b1.query():
                hp, dp = pick()
                _, events, _, _ = batch(method, hp, dp)
                events[-1].synchronize()
            slow.append(b0.elapsed_time(b1) * 1e-3 / idle_mm - 1)
        rows.append(
            dict(
                model=model,
                layout=layout,
                direction=direction,
                method=method,
                page=pools.page_bytes,
                pages=args.pages,
                layers=L,
                gbps_p50=percentile(rates, 0.5),
                gbps_min=min(rates),
                gbps_max=max(rates),
                layer0_us_p50=percentile(first, 0.5),
                layer0_link_us_p50=percentile(on_link, 0.5) if on_link else float("nan"),
                layer0_enqueued_us_p50=percentile(enqueued, 0.5),
                call_us_p50=percentile(calls, 0.5),
                matmul_slowdown=slow[0] if slow else float("nan"),
            )
        )
    line = rows[0]["gbps_p50"]
    for r in rows:
        r["ratio_p50"] = r["gbps_p50"] / line
    gfd_engine.close()
    direct_engine.close()
    return rows


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m gfd_bench.sglang", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument("--models", default="llama3-8b,mla", help="llama3-8b, mla (comma list)")
    ap.add_argument("--layouts", default="layer_first,page_first_direct")
    ap.add_argument("--directions", default="load,write_back")
    ap.add_argument(
        "--methods", default="gfd,direct,kernel", help="gfd, direct, kernel (dma always runs)"
    )
    ap.add_argument("--page", type=int, default=64, help="tokens per page (default 64)")
    ap.add_argument("--pages", type=int, default=64, help="pages per batch (default 64)")
    ap.add_argument(
        "--host-bytes", type=parse_size, default=parse_size("8G"), help="host pool in all (cold)"
    )
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument(
        "--load", default="none", help="none, or matmul: also beside back-to-back bf16 matmuls"
    )
    ap.add_argument("--matmuls", type=int, default=200, help="matmuls of the --load matmul run")
    ap.add_argument("--csv", default="")
    a = ap.parse_args(argv)
    a.methods = [m for m in a.methods.split(",") if m]
    try:
        import torch
    except ImportError:
        print(
            f"gfd_bench.sglang: needs torch with CUDA and a CUDA GPU; torch is not installed for {sys.executable}",
            file=sys.stderr,
        )
        return 2
    if not torch.cuda.is_available():
        print(
            "gfd_bench.sglang: needs a CUDA GPU, and torch sees none (on a machine without a GPU, "
            "tools/sglang_test.sh tests the plugin against SGLang instead)",
            file=sys.stderr,
        )
        return 2
    rows = []
    for model in a.models.split(","):
        for layout in a.layouts.split(","):
            for d in a.directions.split(","):
                rows += run_case(torch, a, model, layout, d)
    write_csv(a.csv, rows)
    print(
        f"{'model':>9} {'layout':>17} {'dir':>10} {'method':>7} {'page':>8} {'GB/s p50':>9} {'min-max':>13} "
        f"{'ratio':>6} {'layer0 us':>9} {'link us':>7} {'enq us':>7} {'call us':>8} {'matmul':>7}"
    )
    for r in rows:
        print(
            f"{r['model']:>9} {r['layout']:>17} {r['direction']:>10} {r['method']:>7} {fmt_size(r['page']):>8} "
            f"{r['gbps_p50']:9.1f} {r['gbps_min']:6.1f}-{r['gbps_max']:<6.1f} {100 * r['ratio_p50']:5.1f}% "
            f"{r['layer0_us_p50']:9.0f} {r['layer0_link_us_p50']:7.0f} {r['layer0_enqueued_us_p50']:7.0f} "
            f"{r['call_us_p50']:8.0f} {100 * r['matmul_slowdown']:+6.1f}%"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``python -m gfd_bench.serving``: what a serving runtime's users feel of a KV load path: the
decode loop's time per output token (TPOT) while prefix-hit loads run beside it.

The loop is shaped like a runtime's (torch only, random weights, no model download):
``--layers`` Llama-3-8B-shaped decoder layers (hidden 4096, 32 query heads, 8 KV heads, head
dim 128, MLP 14336, RMSNorm, RoPE) and an LM head of ``--vocab`` tokens, bf16, over a paged KV
cache laid out as vLLM lays it out (per layer one int8 tensor ``[pages, page bytes]`` for K
and one for V, pages of 16 tokens: 32 KiB; a block table per sequence). A decode step gathers
each sequence's pages through its block table, runs grouped-query attention with torch's
scaled_dot_product_attention, writes the new token's K and V into its page slot and samples by
argmax. The step is captured once per batch size as a CUDA graph (static inputs) and replayed
by a Python loop that, between steps, reads the sampled tokens back to the host (``.tolist()``,
the sampler's sync), does a scheduler's bookkeeping (requests advance, finish after
``--output-len`` tokens and are replaced, are ordered, and the next step's inputs are built as
Python lists; then Python work up to ``--sched-us`` in all), and copies the inputs to the GPU.
Each sequence starts with ``--context`` tokens in the cache.

Beside it, every ``--load-every`` steps, one prefix-hit load is issued from the loop's own thread
(after the scheduling work, before the next step, as a runtime's scheduler issues it): P =
``--load-pages`` pages of every layer's K and V from pinned host caches (gfd.empty_pinned, about
``--host-cache-bytes`` in all, so that sources are cold; fresh random pages every load) into
random pages of the model's own KV caches that the running batch does not read, on a side
stream (default priority, as the model's). Paths, in the same run:

- ``alone``: the loop with no loads (the first reference);
- ``dma``: the contiguous DMA of the same bytes (one pinned buffer to one device buffer, torch
  non_blocking copy): the second reference, what any copy path costs the loop at least;
- ``gfd``: gfd on caches registered once (``engine.register_caches(host, gpu)``, then
  ``engine.copy_blocks(caches, TO_DEVICE, host_ids, gpu_ids, stream=load stream)``);
- ``gfd_worker``: gfd's vLLM offloading worker (gfd.kv_worker.KVTransferWorker, which needs no
  vLLM), one ``submit`` per load on its own load stream after the caller's stream;
- ``batch``: vLLM's batch DMA: a descriptor per (page, tensor) built with numpy, one
  ``cudaMemcpyBatchAsync`` (gfd.testing.memcpy_batch);
- ``per_block``: one ``cudaMemcpyAsync`` per page (gfd's per_block backend, the same call as gfd);
- ``uva2``, ``uva12``: an SM copy kernel reading pinned host memory on 2 or 12 CTAs (the kernel
  gfd_benchmark measures), its descriptors copied to the GPU on the load stream first.

gfd.sglang is not a path here: it drives SGLang's own HiCache objects (``python -m
gfd_bench.sglang`` measures its calls). Per batch size (``--batch-sizes``) and path: TPOT P50
and P99 (host clock between consecutive tokens reaching the host: everything the runtime's thread
does per step, the load's call included), as ratios to the loop alone and to the loop beside
the contiguous DMA; the replay's GPU time (events on the model's stream); each load's time from
submit to usable (events recorded on the load stream just before and after the submit; the
worker's own events around its job), P50 and P99, its GB/s (10^9 bytes/s, at the P50) and how
long the call held the loop's thread. The timed steps of a path (``--steps``) are spread over
``--rounds`` rounds, each running every path in turn (in a rotated order), so that a drift of
the GPU's clocks over the run falls on every path alike. Every path's bytes are verified once,
outside the timed steps, before the first; activations are checked finite.

A run of the defaults is 3 batch sizes x 8 paths x 1,650 steps (about 40,000 decode steps of a few
milliseconds each); ``--quick`` is a tenth of that, with 1 GiB of host caches.
Needs torch with CUDA and a GPU: without them it says so and exits 0 ("skipped").
``--table CSV...`` prints the Markdown table of docs/performance.md from the CSVs of one or
more runs (no GPU needed).
"""

from __future__ import annotations

import argparse
import csv
import gc
import sys
import time
from typing import Any, Dict, List, Optional

import numpy as np

from . import serving_loads as loads
from ._util import percentile, write_csv
from .serving_model import DecodeModel, KVCaches, ModelShape, Scheduler, pages_per_sequence

ALONE, DMA = "alone", "dma"
PATHS = ("gfd", "gfd_worker", "batch", "per_block", "uva2", "uva12")

CSV_FIELDS = [
    "batch",
    "path",
    "device",
    "layers",
    "context",
    "output_len",
    "sched_us",
    "load_every",
    "load_pages",
    "load_bytes",
    "steps",
    "loads",
    "tpot_p50_ms",
    "tpot_p99_ms",
    "tpot_mean_ms",
    "p50_vs_alone",
    "p99_vs_alone",
    "p50_vs_dma",
    "p99_vs_dma",
    "gpu_step_p50_ms",
    "gpu_step_p99_ms",
    "load_p50_us",
    "load_p99_us",
    "load_gbps",
    "call_p50_us",
    "call_p99_us",
    "backlog",
    "verified",
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m gfd_bench.serving",
        description="A decode loop (CUDA graph replayed by a Python loop) beside prefix-hit "
        "KV loads through each path: TPOT P50/P99 and each load's time.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=__doc__.split("\n\n", 1)[1],
    )
    p.add_argument(
        "--batch-sizes",
        default="1,16,64",
        help="decode batch sizes, comma-separated (default 1,16,64)",
    )
    p.add_argument(
        "--paths",
        default=",".join(PATHS),
        help=f"load paths beside the loop, comma-separated, of {', '.join(PATHS)} (default all; the "
        "loop alone and the contiguous DMA always run)",
    )
    p.add_argument(
        "--layers", type=int, default=4, help="decoder layers (K and V caches each; default 4)"
    )
    p.add_argument(
        "--vocab",
        type=int,
        default=16384,
        help="LM head size (default 16384: about the share of the step that Llama-3-8B's 128256-token "
        "head has beside its 32 layers)",
    )
    p.add_argument(
        "--context",
        type=int,
        default=1024,
        help="tokens in the cache when a request starts (default 1024)",
    )
    p.add_argument(
        "--output-len",
        type=int,
        default=128,
        help="tokens a request generates before a new one takes its place (default 128)",
    )
    p.add_argument(
        "--sched-us",
        type=float,
        default=300.0,
        help="the scheduler's Python work between steps, in microseconds (default 300)",
    )
    p.add_argument(
        "--load-every", type=int, default=4, help="one load every N decode steps (default 4)"
    )
    p.add_argument(
        "--load-pages",
        type=int,
        default=32,
        help="pages of 16 tokens per load, of every layer's K and V (default 32: 512 tokens)",
    )
    p.add_argument(
        "--load-region-pages",
        type=int,
        default=None,
        help="pages per cache that loads land in, outside the batch's (default 8 x --load-pages)",
    )
    p.add_argument(
        "--host-cache-bytes",
        default=None,
        help="pinned host caches in all (default 4G; --quick 1G)",
    )
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help="timed steps per path and batch size (default 1500; --quick 150)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="rounds the timed steps are spread over (default 3; --quick 1)",
    )
    p.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="untimed steps before each path's steps in a round (default 50; --quick 20)",
    )
    p.add_argument(
        "--quick", action="store_true", help="a short run (fewer steps, one round, 1G host caches)"
    )
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--csv", metavar="FILE", default=None, help="also write every row to FILE")
    p.add_argument(
        "--table",
        metavar="CSV",
        nargs="+",
        default=None,
        help="only print the Markdown table of these CSVs (one or more runs), then exit",
    )
    return p


def skipped(why: str) -> int:
    print(f"skipped: gfd_bench.serving: {why}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    if a.table:
        return print_markdown(a.table)
    try:
        import torch
    except ImportError:
        return skipped(
            f"needs torch with CUDA and a CUDA GPU, and torch is not installed for {sys.executable}"
        )
    if not torch.cuda.is_available():
        return skipped(
            f"needs a CUDA GPU, and torch {torch.__version__} sees none (torch.cuda.is_available() is "
            "False: no GPU or driver here, or a CPU-only torch build)"
        )
    import gfd

    if gfd.cuda_device_count() == 0:
        return skipped("needs a CUDA GPU, and gfd sees none")
    from .paged import int_list, parse_size

    try:
        a.batch = int_list(a.batch_sizes)
        a.host_bytes = parse_size(a.host_cache_bytes or ("1G" if a.quick else "4G"))
    except argparse.ArgumentTypeError as e:
        p.error(str(e))
    a.path_list = [x.strip() for x in a.paths.split(",") if x.strip()]
    bad = [x for x in a.path_list if x not in PATHS]
    if bad:
        p.error(f"--paths: unknown {', '.join(bad)}; choose from {', '.join(PATHS)}")
    a.steps = a.steps if a.steps is not None else (150 if a.quick else 1500)
    a.rounds = a.rounds if a.rounds is not None else (1 if a.quick else 3)
    a.warmup = a.warmup if a.warmup is not None else (20 if a.quick else 50)
    for name in (
        "layers",
        "vocab",
        "context",
        "output_len",
        "load_every",
        "load_pages",
        "steps",
        "rounds",
    ):
        if getattr(a, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if a.warmup < 1:
        p.error("--warmup must be at least 1")
    if a.steps < 20 * a.rounds:
        p.error(f"--steps {a.steps}: at least 20 per round (--rounds {a.rounds})")
    if a.sched_us < 0:
        p.error("--sched-us must not be negative")
    if a.load_region_pages is None:
        a.load_region_pages = 8 * a.load_pages
    if a.load_region_pages < a.load_pages:
        p.error(
            f"--load-region-pages {a.load_region_pages}: fewer than --load-pages {a.load_pages}"
        )
    return run(a, torch, gfd)


# --------------------------------------------------------------------------------------------
# The run


class Loop:
    """One batch size's decode loop: the scheduler, the static inputs and the captured step."""

    def __init__(
        self,
        torch: Any,
        model: DecodeModel,
        shape: ModelShape,
        batch: int,
        a: Any,
        pages_per_seq: int,
        device: Any,
        stream: Any,
    ) -> None:
        self.torch, self.stream = torch, stream
        self.sched = Scheduler(
            batch, a.context, a.output_len, shape.page_tokens, pages_per_seq, shape.vocab
        )
        self.inp_h = torch.zeros((3, batch), dtype=torch.int64, pin_memory=True)
        self.inp_np = self.inp_h.numpy()
        self.inp_g = torch.zeros((3, batch), dtype=torch.int64, device=device)
        self.table = torch.tensor(self.sched.block_table, dtype=torch.int64, device=device)
        self.next = self.sched.inputs()
        self._stage(self.next)
        self.inp_g.copy_(self.inp_h)
        ids, pos, slots = self.inp_g[0], self.inp_g[1], self.inp_g[2]
        # Warm-up on a side stream, then capture: every kernel's module is loaded and every
        # workspace allocated before the graph exists, and the graph's own pool holds the rest.
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        from torch.nn.attention import SDPBackend, sdpa_kernel

        backends = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
        with sdpa_kernel(backends):
            with torch.cuda.stream(side):
                for _ in range(3):
                    model.step(ids, pos, slots, self.table)
            torch.cuda.current_stream(device).wait_stream(side)
            torch.cuda.synchronize(device)
            self.graph = torch.cuda.CUDAGraph()
            # thread_local: the engines' own threads may call CUDA meanwhile; only this thread's
            # calls belong to the capture.
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                self.tokens, self.logits = model.step(ids, pos, slots, self.table)
        torch.cuda.synchronize(device)
        with torch.cuda.stream(stream):
            self.graph.replay()
            finite = bool(torch.isfinite(self.logits).all().item())
        if not finite:
            raise RuntimeError(
                f"batch {batch}: the model's logits are not finite (weights or KV caches "
                "out of range)"
            )

    def _stage(self, inputs: tuple) -> None:
        ids, pos, slots = inputs
        self.inp_np[0] = ids
        self.inp_np[1] = pos
        self.inp_np[2] = slots

    def series(
        self,
        path: Optional[loads.Path],
        steps: int,
        warmup: int,
        every: int,
        srcs: list,
        dsts: list,
        budget_s: float,
    ) -> tuple:
        """``warmup`` then ``steps`` decode steps, a load every ``every`` steps through ``path``
        (None: no loads). Returns (TPOT seconds per timed step, GPU ms per timed step)."""
        torch = self.torch
        ev = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(steps)
        ]
        tpot: List[float] = []
        perf = time.perf_counter
        sched, graph, inp_g, inp_h, ms = self.sched, self.graph, self.inp_g, self.inp_h, self.stream
        t_prev = None
        nl = 0
        with torch.cuda.stream(ms):
            for i in range(warmup + steps):
                k = i - warmup
                self._stage(self.next)
                inp_g.copy_(inp_h, non_blocking=True)
                if k >= 0:
                    ev[k][0].record(ms)
                graph.replay()
                if k >= 0:
                    ev[k][1].record(ms)
                tokens = self.tokens.tolist()  # the sampler's sync
                t = perf()
                if k >= 0:
                    tpot.append(t - t_prev)
                t_prev = t
                self.next = sched.work(tokens, budget_s)
                if path is not None:
                    path.poll()
                    if i % every == every - 1:
                        path.issue(srcs[nl], dsts[nl], k >= 0)
                        nl += 1
            if path is not None:
                path.drain()
            ms.synchronize()
        gpu = [s.elapsed_time(e) for s, e in ev]
        return tpot, gpu

    def close(self) -> None:
        del self.graph


def verify(
    torch: Any,
    path: loads.Path,
    setup: loads.Setup,
    region: tuple,
    pages: int,
    host_pages: int,
    rng: np.random.Generator,
) -> str:
    """One load through ``path`` with fresh ids into a zeroed load region, outside any timing:
    "" when exact (the destination pages hold their sources, nothing else of the load region or
    of the batch's pages changed), else what differs."""
    lo, hi = region
    torch.cuda.synchronize()
    if isinstance(path, loads.ContiguousDma):
        path.dev_buf.zero_()
        torch.cuda.synchronize()
        path.issue(None, None, False)
        path.drain()
        path.take()
        return (
            ""
            if torch.equal(path.dev_buf.cpu(), path.host_buf)
            else "the device buffer differs from its source"
        )
    for g in setup.gpu:
        g[lo:hi].zero_()
    before = [int(g[:lo].view(torch.int64).sum()) for g in setup.gpu]
    torch.cuda.synchronize()
    src = rng.choice(host_pages, pages, replace=False).astype(np.int64)
    dst = (lo + rng.choice(hi - lo, pages, replace=False)).astype(np.int64)
    path.issue(src, dst, False)
    path.drain()
    path.take()
    torch.cuda.synchronize()
    s_ids, d_ids = torch.from_numpy(src), torch.from_numpy(dst).to(setup.device)
    for t, (g, h) in enumerate(zip(setup.gpu, setup.host)):
        if not torch.equal(g.index_select(0, d_ids), h.index_select(0, s_ids).to(setup.device)):
            return f"tensor {t}: destination pages differ from their sources"
        nz = int(torch.count_nonzero(g[lo:hi]))
        if nz != pages * setup.page:
            return (
                f"tensor {t}: {nz} nonzero bytes in the load region, expected {pages * setup.page}"
            )
        if int(g[:lo].view(torch.int64).sum()) != before[t]:
            return f"tensor {t}: the running batch's pages changed"
    return ""


def make_paths(
    a: Any, torch: Any, gfd: Any, setup: loads.Setup, count: int, dma_bytes: int, fill: Any
) -> tuple:
    """The paths of --paths that can run here, the contiguous DMA first; and the engines."""
    from gfd import testing

    paths: Dict[str, loads.Path] = {DMA: loads.ContiguousDma(setup, dma_bytes, fill)}
    engines: list = []

    def engine(**opts):
        e = gfd.Engine.from_env(device=a.device, **opts)  # GFD_* variables apply (A/B runs)
        engines.append(e)
        return e

    helper = engine()
    for name in a.path_list:
        try:
            if name == "gfd":
                paths[name] = loads.GfdCaches(
                    setup, gfd, helper, "gfd", "gfd, caches registered once (copy_blocks)"
                )
            elif name == "per_block":
                paths[name] = loads.GfdCaches(
                    setup,
                    gfd,
                    engine(backend="per_block"),
                    "per_block",
                    "one cudaMemcpyAsync per page (gfd's per_block backend, the same call)",
                )
            elif name == "gfd_worker":
                from gfd.kv_worker import KVTransferWorker

                paths[name] = loads.GfdWorker(setup, KVTransferWorker, engine())
            elif name == "batch":
                paths[name] = loads.VllmBatchDma(setup, testing, helper)
            elif name in ("uva2", "uva12"):
                uva_copy = getattr(gfd._gfd.testing, "uva_copy", None)
                if uva_copy is None:
                    print(
                        f"skipped: {name}: this gfd build has no gfd._gfd.testing.uva_copy (rebuild the extension)"
                    )
                    continue
                paths[name] = loads.UvaKernel(setup, uva_copy, helper, int(name[3:]), count)
        except (gfd.Error, ImportError, RuntimeError) as e:
            print(f"skipped: {name}: {type(e).__name__}: {e}")
    print(
        "skipped: gfd_sglang: gfd.sglang drives SGLang's own HiCache objects (L2TransferEngine, host pools), "
        "which this loop does not build; python -m gfd_bench.sglang measures its calls"
    )
    return paths, engines


def run(a: Any, torch: Any, gfd: Any) -> int:
    from .paged import fill_random

    t_start = time.perf_counter()
    dev = torch.device("cuda", a.device)
    torch.cuda.set_device(dev)
    bf16 = torch.bfloat16
    shape = ModelShape(layers=a.layers, vocab=a.vocab)
    per_seq = pages_per_sequence(shape, a.context, a.output_len)
    batch_pages = max(a.batch) * per_seq
    gen = torch.Generator(device=dev)
    gen.manual_seed(a.seed)
    caches = KVCaches(torch, shape, batch_pages, a.load_region_pages, bf16, dev, gen)
    model = DecodeModel(torch, shape, caches, per_seq * shape.page_tokens, bf16, dev, seed=a.seed)
    tensors = len(caches.tensors)
    page = caches.page_bytes
    host_pages = a.host_bytes // (tensors * page)
    if host_pages < a.load_pages:
        print(
            f"error: --host-cache-bytes {a.host_bytes}: {host_pages} host pages per tensor, fewer than "
            f"--load-pages {a.load_pages}",
            file=sys.stderr,
        )
        return 2
    host = []
    for i in range(tensors):
        h = torch.from_dlpack(gfd.empty_pinned((host_pages, page), "int8", device=a.device))
        fill_random(h.numpy(), i)  # never zero: the verification's poison
        host.append(h)
    load_stream = torch.cuda.Stream(dev)
    model_stream = torch.cuda.Stream(dev)
    setup = loads.Setup(torch, dev, load_stream, caches.tensors, host)
    load_bytes = a.load_pages * tensors * page
    paths, engines = make_paths(
        a, torch, gfd, setup, a.load_pages * tensors, load_bytes, fill_random
    )
    region = (caches.batch_pages, caches.num_pages)
    rng = np.random.default_rng(a.seed)

    print(
        f"gfd_bench.serving: {a.layers} Llama-3-8B-shaped layers (bf16, random weights), LM head {a.vocab}, "
        f"paged KV cache ({tensors} tensors of {caches.num_pages} pages x {page // 1024} KiB), context "
        f"{a.context} + {a.output_len} tokens per request, CUDA graph replayed by a Python loop, "
        f"{a.sched_us:.0f} us of scheduling per step"
    )
    print(
        f"  {torch.cuda.get_device_name(dev)} | torch {torch.__version__} | gfd {gfd.__version__} | load: "
        f"{a.load_pages} pages x {tensors} tensors = {load_bytes / 1e6:.1f} MB every {a.load_every} steps from "
        f"{host_pages * tensors * page / 2**30:.1f} GiB of pinned host caches | {a.steps} timed steps per path "
        f"and batch size over {a.rounds} round(s), {a.warmup} warm-up steps each"
    )
    for name, pth in paths.items():
        print(f"  path {name}: {pth.what}")

    # Verified once, before anything is timed; the SM kernels first, before any gfd transfer has
    # run (their module loads then, with no engine stream in flight).
    verified: Dict[str, str] = {}
    failures = 0
    order = [DMA] + sorted(
        (n for n in paths if n != DMA), key=lambda n: (not n.startswith("uva"), n)
    )
    for name in order:
        why = verify(torch, paths[name], setup, region, a.load_pages, host_pages, rng)
        verified[name] = "yes" if not why else "NO"
        if why:
            failures += 1
            print(f"VERIFY FAILED: {name}: {why}", file=sys.stderr)

    names = [ALONE] + list(paths)
    budget = a.sched_us * 1e-6
    per_round = [
        a.steps // a.rounds + (1 if r < a.steps % a.rounds else 0) for r in range(a.rounds)
    ]
    rows: List[dict] = []
    for b in a.batch:
        loop = Loop(torch, model, shape, b, a, per_seq, dev, model_stream)
        tp: Dict[str, list] = {n: [] for n in names}
        gp: Dict[str, list] = {n: [] for n in names}
        recs: Dict[str, list] = {n: [] for n in names}
        for r, steps in enumerate(per_round):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                print(
                    f"  ... batch {b}, {name}, round {r + 1}/{a.rounds}",
                    file=sys.stderr,
                    flush=True,
                )
                path = paths.get(name)
                n_loads = (a.warmup + steps) // a.load_every + 1
                srcs = [
                    rng.choice(host_pages, a.load_pages, replace=False).astype(np.int64)
                    for _ in range(n_loads)
                ]
                dsts = [
                    (
                        region[0] + rng.choice(region[1] - region[0], a.load_pages, replace=False)
                    ).astype(np.int64)
                    for _ in range(n_loads)
                ]
                gc.collect()  # the garbage of setting up falls outside the series, alike for every path
                t, g = loop.series(path, steps, a.warmup, a.load_every, srcs, dsts, budget)
                tp[name] += t
                gp[name] += g
                if path is not None:
                    recs[name] += [x for x in path.take() if x.timed]
        loop.close()
        del loop
        torch.cuda.empty_cache()
        rows += summarize(
            b, names, tp, gp, recs, verified, a, load_bytes, torch.cuda.get_device_name(dev)
        )

    for pth in paths.values():
        pth.close()
    for e in engines:
        e.close()
    print_rows(rows)
    for name, pth in paths.items():
        waits = getattr(pth, "slot_waits", 0)
        if waits:
            print(f"note: {name} waited {waits} time(s) for a descriptor slot (loads queued up)")
    print(f"({time.perf_counter() - t_start:.1f} s in all)")
    if a.csv:
        write_csv(a.csv, [{k: _csv_cell(r.get(k)) for k in CSV_FIELDS} for r in rows])
        print(f"wrote {len(rows)} rows to {a.csv}")
    return 1 if failures else 0


def summarize(
    batch: int,
    names: List[str],
    tp: dict,
    gp: dict,
    recs: dict,
    verified: dict,
    a: Any,
    load_bytes: int,
    device: str,
) -> List[dict]:
    rows = []
    for name in names:
        t = [x * 1e3 for x in tp[name]]
        row = dict(
            batch=batch,
            path=name,
            device=device,
            layers=a.layers,
            context=a.context,
            output_len=a.output_len,
            sched_us=a.sched_us,
            load_every=a.load_every if name != ALONE else "",
            load_pages=a.load_pages if name != ALONE else "",
            load_bytes=load_bytes if name != ALONE else "",
            steps=len(t),
            tpot_p50_ms=percentile(t, 0.5),
            tpot_p99_ms=percentile(t, 0.99),
            tpot_mean_ms=sum(t) / len(t),
            gpu_step_p50_ms=percentile(gp[name], 0.5),
            gpu_step_p99_ms=percentile(gp[name], 0.99),
            verified=verified.get(name, "-"),
        )
        r = [x for x in recs[name] if x.usable_us is not None]
        row["loads"] = len(r) if name != ALONE else 0
        if r:
            usable = [x.usable_us for x in r]
            call = [x.call_us for x in r]
            row.update(
                load_p50_us=percentile(usable, 0.5),
                load_p99_us=percentile(usable, 0.99),
                load_gbps=load_bytes / (percentile(usable, 0.5) * 1e3),
                call_p50_us=percentile(call, 0.5),
                call_p99_us=percentile(call, 0.99),
                backlog=sum(x.backlog for x in r),
            )
        rows.append(row)
    by = {r["path"]: r for r in rows}
    for row in rows:
        for ref, key in ((ALONE, "alone"), (DMA, "dma")):
            if ref in by:
                row[f"p50_vs_{key}"] = row["tpot_p50_ms"] / by[ref]["tpot_p50_ms"]
                row[f"p99_vs_{key}"] = row["tpot_p99_ms"] / by[ref]["tpot_p99_ms"]
    return rows


def _csv_cell(v: Any) -> str:
    return "" if v is None else f"{v:.6g}" if isinstance(v, float) else str(v)


def _f(v: Any, spec: str) -> str:
    return "-" if v is None or v == "" else format(v, spec)


def print_rows(rows: List[dict]) -> None:
    print()
    print(
        f"{'batch':>5}  {'path':<11}{'TPOT p50':>9}{'p99 ms':>8}{'p50/alone':>10}{'p99/alone':>10}{'p99/dma':>8}"
        f"{'GPU p50':>8}{'load p50':>9}{'p99 us':>8}{'GB/s':>6}{'call p50':>9}{'p99 us':>8}{'queued':>7}  verified"
    )
    for r in rows:
        print(
            f"{r['batch']:>5}  {r['path']:<11}{r['tpot_p50_ms']:>9.3f}{r['tpot_p99_ms']:>8.3f}"
            f"{_f(r.get('p50_vs_alone'), '.3f'):>10}{_f(r.get('p99_vs_alone'), '.3f'):>10}"
            f"{_f(r.get('p99_vs_dma'), '.3f'):>8}{r['gpu_step_p50_ms']:>8.3f}{_f(r.get('load_p50_us'), '.0f'):>9}"
            f"{_f(r.get('load_p99_us'), '.0f'):>8}{_f(r.get('load_gbps'), '.1f'):>6}"
            f"{_f(r.get('call_p50_us'), '.0f'):>9}{_f(r.get('call_p99_us'), '.0f'):>8}"
            f"{_f(r.get('backlog'), 'd'):>7}  {r['verified']}"
        )
    print(
        "TPOT: host clock between tokens (ms); p50/alone, p99/alone: to the loop with no loads; p99/dma: to the "
        "loop beside the contiguous DMA;\nGPU p50: the step's replay on the GPU (ms); load: submit to usable (us), "
        "GB/s at its P50; call: how long the load's call held the loop's thread (us);\nqueued: loads issued while "
        "the previous one was still in flight"
    )


# --------------------------------------------------------------------------------------------
# --table: the Markdown table of docs/performance.md from one or more runs' CSVs


def _num(v: Any) -> Optional[float]:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return None if x != x else x


def print_markdown(paths: List[str]) -> int:
    runs = []
    for p in paths:
        try:
            with open(p, newline="") as f:
                rows = list(csv.DictReader(f))
        except OSError as e:
            print(f"gfd_bench.serving --table: cannot read {p}: {e.strerror}", file=sys.stderr)
            return 2
        missing = [
            c for c in ("batch", "path", "tpot_p50_ms", "tpot_p99_ms") if rows and c not in rows[0]
        ]
        if missing or not rows:
            print(
                f"gfd_bench.serving --table: {p}: not a CSV of gfd_bench.serving "
                f"({'missing ' + ', '.join(missing) if missing else 'no rows'})",
                file=sys.stderr,
            )
            return 2
        runs.append(rows)
    order = [ALONE, DMA] + list(PATHS)
    keys: list = []
    for rows in runs:
        for r in rows:
            k = (int(r["batch"]), r["path"])
            if k not in keys:
                keys.append(k)
    keys.sort(key=lambda k: (k[0], order.index(k[1]) if k[1] in order else len(order), k[1]))

    def cell(k, col, spec, scale=1.0, pct=False):
        vals = []
        for rows in runs:
            for r in rows:
                if (int(r["batch"]), r["path"]) == k and _num(r.get(col)) is not None:
                    vals.append(_num(r[col]) * scale)
        if not vals:
            return "-"
        if pct:
            return " / ".join(f"{100 * (v - 1):+.1f}%" for v in vals)
        return " / ".join(format(v, spec) for v in vals)

    print(
        "| batch | path | TPOT P50 (ms) | TPOT P99 (ms) | P99 vs alone | P99 vs contiguous DMA | P50 vs alone "
        "| load P50 (us) | load P99 (us) | load GB/s | call P50 (us) |"
    )
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for k in keys:
        vs_alone = k[1] != ALONE
        vs_dma = k[1] != DMA
        print(
            f"| {k[0]} | {k[1]} | {cell(k, 'tpot_p50_ms', '.3f')} | {cell(k, 'tpot_p99_ms', '.3f')} "
            f"| {cell(k, 'p99_vs_alone', '', pct=True) if vs_alone else '-'} "
            f"| {cell(k, 'p99_vs_dma', '', pct=True) if vs_dma else '-'} "
            f"| {cell(k, 'p50_vs_alone', '', pct=True) if vs_alone else '-'} "
            f"| {cell(k, 'load_p50_us', '.0f')} | {cell(k, 'load_p99_us', '.0f')} | {cell(k, 'load_gbps', '.1f')} "
            f"| {cell(k, 'call_p50_us', '.0f')} |"
        )
    print(f"\n({len(runs)} run(s); where several, a cell lists each run's figure)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""gfd inside SGLang's hierarchical cache (HiCache): a plugin that SGLang loads by entry point.

::

    pip install .                        # in gfd's source tree (not on PyPI); declares the plugin
    GFD_SGLANG_HICACHE=1 python -m sglang.launch_server --model-path <model> \\
        --enable-hierarchical-cache --hicache-io-backend direct --hicache-mem-layout layer_first

SGLang loads plugins of the entry-point group ``sglang.srt.plugins`` in every process it starts
(``SGLANG_PLUGINS`` may narrow them by name). With ``GFD_SGLANG_HICACHE=1`` the plugin takes over
the transfers of HiCache's ``direct`` io backend between GPU and host memory, in
``L2TransferEngine``:

- a load (``submit_host_to_device``) is ONE gfd call over every layer: a transfer per layer,
  issued in order on SGLang's host-to-device stream, each layer's ``LayerLoadingEvent`` recorded
  right after its layer, so the forward pass waits for layer l alone, as with SGLang's own loop;
- a write-back (``submit_device_to_host``) is one gfd transfer of every layer's K and V, ordered
  on SGLang's device-to-host stream so that the event SGLang records after it (its
  acknowledgement) fires only once every byte is in host memory (the engine's
  ``stream_ordered_to_host``).

Covered: ``MHATokenToKVPoolHost`` and ``MLATokenToKVPoolHost`` in the ``layer_first`` and
``page_first_direct`` host layouts, device K/V (or latent) buffers with packed rows, whole pages.
Anything else (other pools, layouts or io backends, draft layers, decode context parallelism, a
transfer that is not whole pages) goes SGLang's own way, unchanged. The host memory stays
SGLang's (mmap + cudaHostRegister); each pool's caches are registered with gfd once.

At load the plugin checks SGLang's version and the signatures it hooks; on a mismatch it logs
why and leaves SGLang as it is. ``GFD_EMULATED_DEVICE`` (see :mod:`gfd.testing`) puts it on gfd's
emulated device, SGLang's "GPU" pools being CPU tensors there; torch's CPU streams (SGLang's
streams there) then get the ``synchronize()`` SGLang calls when a transfer fails, so that a
gfd.Error reaches the caller as itself.

Lifetimes: the cache sets registered for a pool hold its buffers, and each transfer holds its
sets until it is done, so a pool dropped (or a scheduler ending) with a write-back in flight
keeps its memory until the bytes are placed. A pool's ``destroy()``, which unpins its memory,
first waits for gfd's transfers on it.
"""

from __future__ import annotations

import inspect
import logging
import os
import threading
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from . import Engine, testing
from ._errors import _error
from ._views import Rows, View

__all__ = ["plugin", "ENABLE_VARIABLE", "SUPPORTED_SGLANG"]

logger = logging.getLogger("gfd.sglang")

#: The switch: "1" routes HiCache's direct io backend through gfd; unset or "0" leaves SGLang as is.
ENABLE_VARIABLE = "GFD_SGLANG_HICACHE"
#: The SGLang release the hooks are written against (major.minor.patch prefix).
SUPPORTED_SGLANG = "0.5.23"

_L2 = "sglang.srt.mem_cache.l2_transfer.L2TransferEngine"
_LAYOUTS = ("layer_first", "page_first_direct")
# The host pools' destroy(), which unregisters (unpins) their memory: MHA's own, and the base
# class's, which MLA's pool inherits.
_DESTROY = (
    "sglang.srt.mem_cache.pool_host.mha.MHATokenToKVPoolHost",
    "sglang.srt.mem_cache.pool_host.base.HostKVCache",
)


def enabled() -> bool:
    return os.environ.get(ENABLE_VARIABLE, "").strip() not in ("", "0")


def _mismatch() -> Optional[str]:
    """Why the hooks would not fit this SGLang, or None."""
    import sglang
    from sglang.srt.mem_cache import l2_transfer

    version = getattr(sglang, "__version__", "?")
    if not version.startswith(SUPPORTED_SGLANG):
        return (
            f"SGLang {version} is not {SUPPORTED_SGLANG}, the release gfd.sglang is written against"
        )
    engine = getattr(l2_transfer, "L2TransferEngine", None)
    want = {
        "submit_host_to_device": [
            "self",
            "transfers",
            "transfer_layer_id_max",
            "start_event",
            "on_layer_done",
        ],
        "submit_device_to_host": ["self", "transfers"],
        "_submission": ["self", "transfers", "stream", "transfer_key", "start_event"],
    }
    for name, params in want.items():
        fn = getattr(engine, name, None)
        if fn is None or list(inspect.signature(fn).parameters) != params:
            return f"L2TransferEngine.{name} has changed"
    return None


def plugin() -> None:
    """The entry point SGLang calls in each process: registers the hooks where enabled and
    where this SGLang is the one they are written for."""
    if not enabled():
        return
    why = _mismatch()
    if why is not None:
        logger.warning("gfd.sglang: %s; HiCache keeps SGLang's own transfer path", why)
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(f"{_L2}.submit_host_to_device", _load, HookType.AROUND)
    HookRegistry.register(f"{_L2}.submit_device_to_host", _write_back, HookType.AROUND)
    for pool in _DESTROY:  # a pool unpins its memory there: gfd's transfers on it end first
        HookRegistry.register(f"{pool}.destroy", _drain_then, HookType.AROUND)
    logger.info("gfd.sglang: HiCache's direct io backend goes through gfd")


# -- the hooks -----------------------------------------------------------------------------------


def _load(
    original: Callable,
    self: Any,
    transfers: list,
    *,
    transfer_layer_id_max: int,
    start_event: Any = None,
    on_layer_done: Any = None,
) -> Any:
    plans = _plans(self, transfers) if len(transfers) == 1 else None
    if plans is None:
        return original(
            self,
            transfers,
            transfer_layer_id_max=transfer_layer_id_max,
            start_event=start_event,
            on_layer_done=on_layer_done,
        )
    plan = plans[0]
    done = on_layer_done if on_layer_done is not None else (lambda layer: None)
    with self._submission(transfers, self.host_to_device_stream, "host_to_device", start_event) as (
        prepared,
        completion,
    ):
        (t,) = prepared
        pages = _pages(t, plan.page)
        # Not whole pages: the pool's own per-layer copies, as SGLang's loop makes them.
        if pages is None:
            for layer in range(transfer_layer_id_max):
                t.host_pool.load_to_device_per_layer_physical(
                    t.device_pool, t.host_indices, t.device_indices, layer, self.io_backend
                )
                done(layer)
            return completion
        issued = [layer for layer in range(transfer_layer_id_max) if layer in plan.layer_sets]
        next_layer = [0]

        def after(k: int) -> None:  # layer issued[k] is enqueued: its event (and skipped ones') now
            for layer in range(next_layer[0], issued[k] + 1):
                done(layer)
            next_layer[0] = issued[k] + 1

        if issued:
            plan.issued(
                plan.engine.copy_blocks(
                    [plan.layer_sets[layer] for layer in issued],
                    "to_device",
                    pages[0],
                    pages[1],
                    stream=_stream_of(self.host_to_device_stream),
                    after_each=after,
                )
            )
        for layer in range(next_layer[0], transfer_layer_id_max):  # layers the pool does not hold
            done(layer)
    return completion


def _write_back(original: Callable, self: Any, transfers: list) -> Any:
    plans = _plans(self, transfers)
    if plans is None:
        return original(self, transfers)
    with self._submission(transfers, self.device_to_host_stream, "device_to_host") as (
        prepared,
        completion,
    ):
        for plan, t in zip(plans, prepared):
            pages = _pages(t, plan.page)
            if pages is None:  # not whole pages: the pool's own copy
                t.host_pool.backup_from_device_all_layer_physical(
                    t.device_pool, t.host_indices, t.device_indices, self.io_backend
                )
                continue
            plan.issued(
                [
                    plan.engine.copy_blocks(
                        plan.all_layers,
                        "to_host",
                        pages[1],
                        pages[0],
                        stream=_stream_of(self.device_to_host_stream),
                    )
                ]
            )
    return completion


# -- what gfd registers per pool -------------------------------------------------------------------


class _Plan:
    """One (host pool, device pool): gfd's engine for the device and the pool's caches registered
    once: per layer (loads) and every layer together (write-backs). The cache sets hold the
    pool's buffers (and each transfer its sets) until the transfers on them are done, however
    soon SGLang lets go of the pool; ``in_flight`` are those transfers, for draining."""

    def __init__(
        self, engine: Engine, layer_sets: Dict[int, Any], all_layers: Any, page: int
    ) -> None:
        self.engine, self.layer_sets, self.all_layers, self.page = (
            engine,
            layer_sets,
            all_layers,
            page,
        )
        self.in_flight: list = []
        self._lock = threading.Lock()  # loads and write-backs may be issued from two threads

    def issued(self, transfers: list) -> None:
        with self._lock:
            self.in_flight = [t for t in self.in_flight if not t.done()] + list(transfers)

    def drain(self) -> None:
        """Waits for every transfer issued on the pool (their failures are SGLang's to see)."""
        with self._lock:
            waiting, self.in_flight = self.in_flight, []
        for t in waiting:
            try:
                t.wait()
            except Exception:  # noqa: BLE001 - reported where the transfer's completion is read
                pass


def _drain_then(original: Callable, self: Any, *args: Any, **kwargs: Any) -> Any:
    """A host pool's destroy(): gfd's transfers on its memory end first."""
    made = getattr(self, "_gfd_plan", None)
    if made is not None and made[1] is not None:
        made[1].drain()
    return original(self, *args, **kwargs)


_lock = threading.RLock()  # _plans holds it while _make_plan makes the engine
_engines: Dict[
    int, tuple
] = {}  # per GPU (-1: the emulated device): the engine, the memory it adopted


_warned: set = set()


def _plans(l2: Any, transfers: list) -> Optional[List[_Plan]]:
    """gfd's plan of each transfer, or None where any of them is not covered (SGLang's way)."""
    backend = getattr(l2, "io_backend", None)
    if backend != "direct":
        if backend not in _warned:
            _warned.add(backend)
            logger.warning(
                "gfd.sglang: --hicache-io-backend %s stays SGLang's; gfd carries the direct io backend "
                "(--hicache-io-backend direct)",
                backend,
            )
        return None
    if not transfers:
        return None
    out = []
    for t in transfers:
        if t.layer_mapper is not None or t.is_draft:
            return None
        with _lock:
            # Kept on the host pool: a plan lives and dies with the memory it registered.
            made = getattr(t.host_pool, "_gfd_plan", None)
            if made is None or made[0] is not t.device_pool:
                try:
                    plan = _make_plan(t.host_pool, t.device_pool)
                except Exception as e:  # noqa: BLE001 - not covered: SGLang's own path
                    logger.warning(
                        "gfd.sglang: %s: %s; this pool keeps SGLang's transfer path",
                        type(t.host_pool).__name__,
                        e,
                    )
                    plan = None
                made = (t.device_pool, plan)
                t.host_pool._gfd_plan = made
            plan = made[1]
        if plan is None:
            return None
        out.append(plan)
    return out


def _pages(transfer: Any, page: int) -> Optional[tuple]:
    """(host page ids, device page ids) of a transfer of whole pages, or None where it is not."""
    host = transfer.host_indices
    host = host.cpu().numpy() if hasattr(host, "cpu") else np.asarray(host)
    device = transfer.device_indices
    device = device.cpu().numpy() if hasattr(device, "cpu") else np.asarray(device)
    if len(host) != len(device):
        raise _error(
            f"gfd.sglang: host_indices has {len(host)} entries, device_indices {len(device)} "
            "(a transfer moves one host token to one device token)"
        )
    if len(host) % page:
        return None
    hp, dp = host[::page], device[::page]
    offsets = np.arange(page, dtype=host.dtype)
    if (
        (hp % page).any()
        or (dp % page).any()
        or not np.array_equal(host.reshape(-1, page), hp[:, None] + offsets)
        or not np.array_equal(device.reshape(-1, page), dp[:, None] + offsets)
    ):
        return None
    return hp // page, dp // page


def _stream_of(stream: Any) -> Any:
    """A torch CUDA stream as gfd takes it; None (the emulated device's) for a CPU stream."""
    return stream if getattr(stream, "cuda_stream", None) is not None else None


def _engine_for(device_buffers: list) -> Engine:
    """The process's engine for the pool's GPU (stream-ordered device to host), or the emulated
    one (GFD_EMULATED_DEVICE) with the pool's CPU buffers adopted as its device memory."""
    t = device_buffers[0]
    index = t.device.index if getattr(t, "is_cuda", False) else -1
    with _lock:
        if index in _engines:
            engine, adopted = _engines[index]
        else:
            emulated = testing.emulated_device_settings()
            if emulated is None:
                engine = Engine.from_env(device=index, stream_ordered_to_host=True)
            else:
                engine = testing.emulated_engine(**emulated, stream_ordered_to_host=True)
                _give_cpu_streams_synchronize()
            adopted = []
            _engines[index] = (engine, adopted)
        if engine._emulated:
            adopted += testing.adopt_tensors(engine, device_buffers)  # kept: the pools live as long
    return engine


def _give_cpu_streams_synchronize() -> None:
    """On the emulated device SGLang's streams are torch's CPU streams, which have no
    synchronize(); SGLang's transfer engine calls it when a transfer raises, and the error would
    reach the caller as an AttributeError instead of the gfd.Error. They get one that waits for
    the work on the emulated device (where gfd orders what SGLang puts on them)."""
    import torch

    stream = getattr(getattr(torch, "cpu", None), "Stream", None)
    if stream is None or hasattr(stream, "synchronize"):
        return

    def synchronize(self: Any) -> None:
        for engine, _ in list(_engines.values()):
            if engine._emulated and not engine.closed:
                testing.stream_sync(engine)

    stream.synchronize = synchronize


def _page_rows(t: Any, page: int, name: str) -> Rows:
    """A token-major buffer (tokens, ...) of packed rows as pages of ``page`` tokens."""
    if not t.is_contiguous():
        raise _error(f"{name}: its rows are not packed")
    row = t[0].numel() * t.element_size()
    return Rows(t.data_ptr(), t.shape[0] // page, page * row, page * row)


def _host_layer(buf: Any, layer: int, page: int, layout: str, name: str) -> Rows:
    """Layer ``layer`` of a host buffer as pages: ``layer_first`` (layers, tokens, ...) or
    ``page_first_direct`` (pages, layers, page tokens, ...)."""
    if not buf.is_contiguous():
        raise _error(f"{name}: not contiguous")
    item = buf.element_size()
    if layout == "layer_first":
        per_token = buf[0, 0].numel() * item
        return Rows(buf[layer].data_ptr(), buf.shape[1] // page, page * per_token, page * per_token)
    width = buf[0, 0].numel() * item  # one layer's page: (page tokens, ...)
    return Rows(buf[0, layer].data_ptr(), buf.shape[0], width, buf.stride(0) * item)


def _make_plan(host: Any, device: Any) -> _Plan:
    """The pool's caches registered with gfd; raises what makes the pool not covered."""
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    page, layout = host.page_size, host.layout
    if layout not in _LAYOUTS:
        raise _error(f"the {layout!r} host layout is not covered (only {_LAYOUTS})")
    layers: Dict[int, list] = {}  # controller layer -> [(host rows, device buffer)]
    if type(host) is MHATokenToKVPoolHost:
        if host.layer_num != host.target_layer_num:
            raise _error("draft layers are not covered")
        for layer in range(host.target_layer_num):
            layers[layer] = [
                (
                    _host_layer(host.k_buffer, layer, page, layout, "k_buffer"),
                    host.device_k_buffers[layer],
                ),
                (
                    _host_layer(host.v_buffer, layer, page, layout, "v_buffer"),
                    host.device_v_buffers[layer],
                ),
            ]
    elif type(host) is MLATokenToKVPoolHost:
        if getattr(host, "_is_dummy", False) or getattr(host, "dcp_size", 1) != 1:
            raise _error("a dummy pool or decode context parallelism is not covered")
        for layer in host._target_layer_indices:
            h = host._host_layer_by_controller[layer]
            d = host.device_kv_buffers[host._buffer_index_by_layer[layer]]
            layers[layer] = [(_host_layer(host.kv_buffer, h, page, layout, "kv_buffer"), d)]
    else:
        raise _error("only MHATokenToKVPoolHost and MLATokenToKVPoolHost are covered")
    engine = _engine_for([d for pairs in layers.values() for _, d in pairs])
    # The pool's buffers themselves (which own their memory), not the pool: the plan is kept on
    # the pool, and a transfer in flight keeps the memory it writes however soon the pool goes.
    keep = [host.kv_buffer]  # MHA's k_buffer and v_buffer are views of it

    def views(pairs: list) -> tuple:
        hs = [View(r, False, keep) for r, _ in pairs]
        ds = [View(_page_rows(d, page, "device buffer"), True, d) for _, d in pairs]
        return hs, ds

    layer_sets = {layer: engine.register_caches(*views(pairs)) for layer, pairs in layers.items()}
    every = [p for layer in sorted(layers) for p in layers[layer]]
    return _Plan(engine, layer_sets, engine.register_caches(*views(every)), page)

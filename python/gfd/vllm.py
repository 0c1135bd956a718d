"""gfd inside vLLM: offloading specs that vLLM's ``OffloadingConnector`` loads by configuration.

::

    --kv-transfer-config '{"kv_connector":"OffloadingConnector","kv_role":"kv_both",
      "kv_connector_extra_config":{"spec_name":"GfdOffloadingSpec","spec_module_path":"gfd.vllm",
      "cpu_bytes_to_use":68719476736}}'

``GfdOffloadingSpec`` is vLLM's CPU spec and ``GfdTieringOffloadingSpec`` vLLM's tiering spec
(``secondary_tiers``: ``fs``, ``obj``, ``p2p`` or out-of-tree tiers below the CPU tier), each with
gfd's worker for the GPU hop. Everything else is vLLM's, unchanged: sizing, the scheduler-side
manager, eviction, the secondary tiers, and the host memory itself: the worker moves blocks
between the GPU caches and vLLM's ``SharedOffloadRegion`` (one mmap region per engine, pinned by
vLLM, each rank's cell or the shared canonical area), registered with gfd once. So vLLM's modes
work as they do with vLLM's own worker: one host copy of a pure-MLA model under TP
(``replicated_layout``: vLLM's connector lets rank 0 write), ``canonical_layout`` (pages free of
the parallel layout; each rank moves its share as fragments, ranks holding identical bytes taking
turns to write them), hybrid groups, packed layouts (one region per block). Each job is issued in
the ``submit_load`` / ``submit_store`` call (:class:`gfd.kv_worker.KVTransferWorker`).

Keys of ``kv_connector_extra_config`` read here, beside vLLM's own (``cpu_bytes_to_use``,
``block_size``, ``eviction_policy``, ``secondary_tiers``, ``canonical_layout``, ...):

- ``gfd_options``: a dict of gfd.Engine options (see ``gfd.option_names``), applied over the
  GFD_* environment variables.
- ``gfd_host_memory``: ``"vllm"`` (default: vLLM's shared region) or ``"pool"`` (gfd's own
  per-rank memory, huge pages on the GPU's NUMA node: no sharing between ranks, so no
  ``replicated_layout``, ``canonical_layout`` or tiering; ``gfd_host_layout`` ``"block"`` (default)
  or ``"tensor"`` picks its layout).

Without a GPU (a CI job checking a configuration), ``GFD_EMULATED_DEVICE=1`` runs the worker on
gfd's emulated device: vLLM's KV caches, CPU tensors there, serve as the emulated GPU's memory,
and every transfer goes through gfd's whole pipeline (see :mod:`gfd.testing`).

The only module of the package that imports vLLM; written against vLLM 0.33.
"""

from __future__ import annotations

import logging
from typing import Any, List, Optional

import vllm
from vllm.utils.torch_utils import PIN_MEMORY
from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.config import OffloadingConfig
from vllm.v1.kv_offload.cpu import spec as _cpu_spec
from vllm.v1.kv_offload.cpu.gpu_worker import pin_mmap_region
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from . import Engine, testing
from ._errors import _error
from .kv_worker import KVTransferWorker

__all__ = ["GfdOffloadingSpec", "GfdTieringOffloadingSpec", "GfdOffloadingWorker"]

logger = logging.getLogger("gfd.vllm")

_HOST_MEMORY = ("vllm", "pool")


def _host_memory(extra: Any) -> str:
    value = (extra or {}).get("gfd_host_memory", "vllm")
    if value not in _HOST_MEMORY:
        raise _error(
            f"kv_connector_extra_config: gfd_host_memory: expected one of {_HOST_MEMORY}, got {value!r}"
        )
    return value


def _needs(module: Any, name: str) -> Any:
    """A name of vLLM's that the worker builds on, or a clear error naming it and the version."""
    value = getattr(module, name, None)
    if value is None:
        raise _error(
            f"gfd.vllm: vLLM {vllm.__version__} has no {getattr(module, '__name__', module)}.{name}; "
            "gfd.vllm is written against vLLM 0.33"
        )
    return value


def _torch() -> Any:
    import sys

    return sys.modules.get("torch")


def _block_rows(tensor: Any, page: int) -> Any:
    """A canonical KV tensor as (num_blocks, page) bytes, as vLLM's CPU worker views it."""
    torch = _torch()
    if torch is not None and isinstance(tensor, torch.Tensor):
        if tensor.dtype == torch.int8 and tensor.dim() == 2 and tensor.shape[1] == page:
            return tensor  # already rows (a packed layout's rows may have a larger stride)
        return tensor.view(torch.int8).view((-1, page))
    return tensor  # a DLPack or CUDA-array-interface object: 2-D (blocks, page) bytes already


def _device_of(tensor: Any) -> int:
    torch = _torch()
    if torch is not None and isinstance(tensor, torch.Tensor) and tensor.is_cuda:
        return (
            tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()
        )
    return 0


def _engine(device: int, options: dict, gpu: list) -> tuple:
    """The worker's engine, and the host memory the emulated device adopted (GFD_EMULATED_DEVICE:
    vLLM's "GPU" caches are CPU tensors there)."""
    emulated = testing.emulated_device_settings()
    if emulated is None:
        return Engine.from_env(device=device, **options), []
    engine = testing.emulated_engine(**emulated, **options)
    try:
        return engine, testing.adopt_tensors(engine, gpu)
    except BaseException:
        engine.close()
        raise


def _canonical(kv_caches: CanonicalKVCaches) -> tuple:
    """The canonical layout as the worker takes it: one entry per (tensor, mapping) pair, since
    layers of different groups sharing a tensor (a hybrid model's attention and Mamba layers) map
    its pages each their own way. Returns (tensor of each entry, mapping of each entry, the
    groups as entry indices), or a clear refusal where vLLM could not certify a layer."""
    entries: dict = {}
    tensor_of, mapping_of, groups = [], [], []
    for refs in kv_caches.group_data_refs:
        members = []
        for r in refs:
            if r.mapping is None:
                raise _error(
                    "kv_connector_extra_config: canonical_layout: vLLM could not certify this KV cache "
                    "layout for canonical pages (the offload workers must be exactly the TP group; "
                    "packed and cross-layer layouts are not supported); remove canonical_layout"
                )
            key = (r.tensor_idx, r.mapping)
            if key not in entries:
                entries[key] = len(tensor_of)
                tensor_of.append(r.tensor_idx)
                mapping_of.append(r.mapping)
            members.append(entries[key])
        groups.append(sorted(set(members)))
    return tensor_of, mapping_of, groups


def _fragments(mapping: Any) -> list:
    """A mapping's runs unrolled into (gpu_offset, host_offset, size), fragments contiguous on
    both sides merged."""
    out: list = []
    for run in mapping.runs:
        for i in range(run.num_fragments):
            go, ho = (
                run.local_offset + i * run.local_stride,
                run.canonical_offset + i * run.canonical_stride,
            )
            if out and out[-1][0] + out[-1][2] == go and out[-1][1] + out[-1][2] == ho:
                out[-1] = (out[-1][0], out[-1][1], out[-1][2] + run.fragment_size)
            else:
                out.append((go, ho, run.fragment_size))
    return out


#: Said at startup where GfdOffloadingSpec is given canonical_layout: vLLM 0.33's own CPU spec
#: ignores the key (only its tiering spec honours it), gfd's honours it.
CANONICAL_NOTE = (
    "gfd.vllm: canonical_layout is honoured: the host pages are laid out canonically (free of the "
    "parallel layout, ranks holding identical bytes taking turns to write them), as vLLM's tiering "
    "spec lays them out. vLLM 0.33's own CPU spec ignores canonical_layout (each rank's pages stay in "
    "its own cell), so under tensor parallelism the region's bytes lie elsewhere than with vLLM's "
    "worker; every load returns what was stored either way"
)


def _region(spec: CPUOffloadingSpec) -> SharedOffloadRegion:
    """vLLM's shared region for this rank, made as vLLM's own spec makes it for its worker."""
    cfg = spec.config
    rank = 0 if spec.replicated_layout else cfg.parallel.rank
    common = dict(
        num_chunks=spec.num_chunks,
        rank=rank,
        kv_bytes_per_chunk=spec.kv_bytes_per_chunk,
        cpu_page_size=spec.cpu_page_size_per_worker,
    )
    if isinstance(spec, TieringOffloadingSpec):
        # The scheduler made the region (its secondary tiers read it); the worker joins it.
        return SharedOffloadRegion(engine_id=cfg.engine_id, **common)
    shard = (cfg.parallel.rank, cfg.parallel.world_size) if spec.replicated_layout else None
    return SharedOffloadRegion(
        engine_id=cfg.engine_id,
        barrier=_needs(_cpu_spec, "_all_workers_barrier"),
        num_segments=_needs(_cpu_spec, "_REGION_SEGMENTS"),
        populate_shard=shard,
        **common,
    )


class GfdOffloadingWorker(OffloadingWorker):
    """vLLM's worker contract on a :class:`KVTransferWorker`: submit_store / submit_load issue
    one job in the call and return; get_finished reports the done ones."""

    def __init__(self, spec: CPUOffloadingSpec, kv_caches: CanonicalKVCaches) -> None:
        extra = dict(spec.extra_config)
        options = dict(extra.get("gfd_options") or {})
        host_memory = _host_memory(extra)
        canonical = bool(spec.config.canonical_layout)
        bpc, chunks = spec.blocks_per_chunk, spec.num_chunks
        if chunks <= 0:
            raise _error(
                f"kv_connector_extra_config: cpu_bytes_to_use: {extra.get('cpu_bytes_to_use')} bytes hold "
                f"no chunk of {spec.kv_bytes_per_chunk} bytes"
            )
        if canonical and host_memory != "vllm":
            raise _error(
                "kv_connector_extra_config: canonical_layout needs vLLM's shared region; "
                "gfd_host_memory 'pool' keeps per-rank memory (remove one of the two)"
            )
        tensors = [_block_rows(t.tensor, t.page_size_bytes) for t in kv_caches.tensors]
        groups = [sorted({r.tensor_idx for r in refs}) for refs in kv_caches.group_data_refs]
        self.groups = [
            list(g) for g in groups
        ]  # per KV-cache group, its tensors (indices into kv_caches)
        # A job moves each page's unpadded bytes (what vLLM's worker copies); a tensor shared by
        # several layers moves the most any of them uses.
        copy = [0] * len(tensors)
        for refs in kv_caches.group_data_refs:
            for r in refs:
                copy[r.tensor_idx] = max(copy[r.tensor_idx], int(r.page_size_bytes))
        copy = [c if c > 0 else int(t.page_size_bytes) for c, t in zip(copy, kv_caches.tensors)]
        self._region: Optional[SharedOffloadRegion] = None
        self.engine, self._adopted = _engine(
            _device_of(tensors[0]) if tensors else 0, options, tensors
        )
        try:
            if host_memory == "pool":
                layout = str(extra.get("gfd_host_layout", "block"))
                self.core = KVTransferWorker(
                    self.engine,
                    tensors,
                    groups,
                    bpc,
                    chunks,
                    host_memory="pool",
                    host_layout=layout,
                    copy_bytes=copy,
                )
                return
            if canonical and not isinstance(spec, TieringOffloadingSpec):
                logger.warning(CANONICAL_NOTE)
            if canonical:
                tensor_of, mapping_of, groups = _canonical(kv_caches)
            if canonical and isinstance(spec, TieringOffloadingSpec):
                _needs(spec, "_validate_canonical_refs")(
                    kv_caches
                )  # records portability for the tiers
            self._region = _region(spec)
            if PIN_MEMORY and not self.engine._emulated:
                pin_mmap_region(
                    self._region, worker_slot_only=not canonical
                )  # as vLLM's worker pins it
            if canonical:
                # A tensor's canonical page holds the largest page any of its layers maps into.
                widest = [
                    max(
                        (
                            m.canonical_page_size_bytes
                            for t2, m in zip(tensor_of, mapping_of)
                            if t2 == t
                        ),
                        default=int(kv_caches.tensors[t].page_size_bytes),
                    )
                    for t in range(len(tensors))
                ]
                views = [self._region.create_next_canonical_view(w * bpc) for w in widest]
                hosts = [views[t] for t in tensor_of]
                tensors = [tensors[t] for t in tensor_of]
                copy = [copy[t] for t in tensor_of]
                fragments = [_fragments(m) for m in mapping_of]
                writers = [(m.num_writers, m.writer_index) for m in mapping_of]
            else:
                hosts = [
                    self._region.create_next_worker_view(t.page_size_bytes * bpc)
                    for t in kv_caches.tensors
                ]
                fragments = writers = None
            self.core = KVTransferWorker(
                self.engine,
                tensors,
                groups,
                bpc,
                chunks,
                host_caches=hosts,
                copy_bytes=copy,
                fragments=fragments,
                writers=writers,
            )
        except BaseException:
            self._release()
            raise

    @property
    def region(self) -> Optional[SharedOffloadRegion]:
        """vLLM's shared region the worker moves blocks to and from (None with ``"pool"``)."""
        return self._region

    def submit_store(
        self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec
    ) -> bool:
        """GPU -> CPU, after the work queued so far on the current stream. Enqueued in the call."""
        return self.core.submit(
            job_id,
            False,
            dst_spec.block_ids,
            src_spec.block_ids,
            src_spec.group_sizes,
            src_spec.block_indices,
        )

    def submit_load(
        self,
        job_id: int,
        src_spec: LoadStoreSpec,
        dst_spec: GPULoadStoreSpec,
        expedited: bool = False,
    ) -> bool:
        """CPU -> GPU, after the work queued so far on the current stream. Enqueued in the call."""
        return self.core.submit(
            job_id,
            True,
            src_spec.block_ids,
            dst_spec.block_ids,
            dst_spec.group_sizes,
            dst_spec.block_indices,
            expedited=expedited,
        )

    def get_finished(self) -> List[TransferResult]:
        out = []
        for r in self.core.get_finished():
            if not r.success:  # vLLM sees success=False alone: the cause is said here
                logger.error("gfd.vllm: job %d failed: %s", r.job_id, r.error)
            out.append(
                TransferResult(
                    job_id=r.job_id,
                    success=r.success,
                    transfer_size=r.bytes,
                    transfer_time=r.seconds,
                )
            )
        return out

    def wait(self, job_ids: set) -> None:
        self.core.wait(job_ids)

    def shutdown(self) -> None:
        try:
            core = getattr(self, "core", None)
            if core is not None:
                core.shutdown()
        finally:
            self._release()

    def _release(self) -> None:
        self.engine.close()  # waits for every transfer: the adopted memory is then free to go
        for a in self._adopted:
            a.release()
        self._adopted = []
        if self._region is not None:
            self._region.cleanup()
            self._region = None


class _GfdWorker:
    """gfd's worker under one of vLLM's specs (a mixin placed before the spec)."""

    def _uses_shared_region(self) -> bool:
        return _host_memory(self.extra_config) == "vllm"

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            self._worker = GfdOffloadingWorker(self, kv_caches)
        return self._worker


class GfdOffloadingSpec(_GfdWorker, CPUOffloadingSpec):
    """vLLM's CPU offloading spec with gfd's worker: ``spec_name`` GfdOffloadingSpec,
    ``spec_module_path`` gfd.vllm."""


class GfdTieringOffloadingSpec(_GfdWorker, TieringOffloadingSpec):
    """vLLM's tiering spec (a CPU primary tier and vLLM's secondary tiers below it) with gfd's
    worker for the GPU hop: ``spec_name`` GfdTieringOffloadingSpec, ``spec_module_path``
    gfd.vllm."""

    def __init__(self, config: OffloadingConfig) -> None:
        if _host_memory(config.extra_config) != "vllm":
            raise _error(
                "kv_connector_extra_config: gfd_host_memory: the secondary tiers read vLLM's shared "
                "region; GfdTieringOffloadingSpec takes only 'vllm'"
            )
        super().__init__(config)

"""gfd inside vLLM: an offloading spec that vLLM's ``OffloadingConnector`` loads by configuration.

::

    --kv-transfer-config '{"kv_connector":"OffloadingConnector","kv_role":"kv_both",
      "kv_connector_extra_config":{"spec_name":"GfdOffloadingSpec","spec_module_path":"gfd.vllm",
      "cpu_bytes_to_use":68719476736}}'

The spec is vLLM's CPU spec on the scheduler side (sizing, manager, load and store specs, all
unchanged); its worker moves every job as ONE gfd transfer of all the job's (block, layer) pages on
caches registered once (:class:`gfd.kv_worker.KVTransferWorker`, which holds the logic and does not
import vLLM). Keys of ``kv_connector_extra_config`` read here, beside the CPU spec's own
(``cpu_bytes_to_use``, ``eviction_policy``, ...):

- ``gfd_options``: a dict of gfd.Engine options (see ``gfd.option_names``), applied over the
  GFD_* environment variables.
- ``gfd_host_memory``: ``"pool"`` (default: gfd.HostPools, huge pages on the GPU's NUMA node,
  pinned) or ``"torch"`` (pinned torch tensors, as vLLM's CPU worker allocates).
- ``gfd_host_layout``: ``"block"`` (a host row holds one GPU block's page of every tensor side
  by side, so a job's host side is one contiguous run per block, which the copy engine moves in
  place with no CPU copy) or ``"tensor"`` (vLLM's CPU layout, one
  host array per tensor). Default: ``"block"`` up to 64 GiB of host memory per worker (one
  pinned allocation), ``"tensor"`` above. With vLLM 0.33's GPU caches (every layer in one
  allocation at a constant stride) each block of a job is then one 2D copy of all its layers:
  on the H200 32 KiB pages loaded at 89% of the line rate and 8 KiB pages at 74%, with no SM
  (vLLM's own path: 36% and 6%; docs/performance.md).

The only module of the package that imports vLLM.
"""

from __future__ import annotations

from typing import Any, Callable, List, Optional

from vllm.v1.kv_offload.base import (
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

from . import Engine
from .kv_worker import KVTransferWorker

__all__ = ["GfdOffloadingSpec", "GfdOffloadingWorker", "engine_factory"]


def _default_engine(device: int, options: dict) -> Engine:
    return Engine.from_env(device=device, **options)


#: The largest host memory the default "block" layout takes as one pinned allocation.
_MAX_BLOCK_LAYOUT_BYTES = 64 << 30

#: Makes the worker's engine from (device, gfd_options). Replaceable (tests put the emulated
#: device behind it).
engine_factory: Callable[[int, dict], Engine] = _default_engine


def _block_rows(tensor: Any, page: int) -> Any:
    """A canonical KV tensor as (num_blocks, page) bytes, as vLLM's CPU worker views it."""
    torch = _torch()
    if torch is not None and isinstance(tensor, torch.Tensor):
        if tensor.dtype == torch.int8 and tensor.dim() == 2 and tensor.shape[1] == page:
            return tensor  # already rows (a packed layout's rows may have a larger stride)
        return tensor.view(torch.int8).view((-1, page))
    return tensor  # a DLPack or CUDA-array-interface object: 2-D (blocks, page) bytes already


def _torch() -> Any:
    import sys
    return sys.modules.get("torch")


def _device_of(tensor: Any) -> int:
    torch = _torch()
    if torch is not None and isinstance(tensor, torch.Tensor) and tensor.is_cuda:
        return tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()
    return 0


class GfdOffloadingWorker(OffloadingWorker):
    """vLLM's worker contract on a :class:`KVTransferWorker`: submit_store / submit_load queue one
    gfd transfer and return at once; get_finished reports the done ones."""

    def __init__(self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int, num_chunks: int,
                 extra_config: Optional[dict] = None) -> None:
        extra = dict(extra_config or {})
        options = dict(extra.get("gfd_options") or {})
        host_memory = str(extra.get("gfd_host_memory", "pool"))
        tensors = [_block_rows(t.tensor, t.page_size_bytes) for t in kv_caches.tensors]
        host_layout = extra.get("gfd_host_layout")
        if host_layout is None:
            # The block layout is one pinned allocation of every tensor's pages; above
            # _MAX_BLOCK_LAYOUT_BYTES (vLLM registers host memory in pieces no larger, to stay
            # clear of driver limits) the per-tensor layout keeps each allocation small.
            total = num_chunks * blocks_per_chunk * sum(int(t.page_size_bytes) for t in kv_caches.tensors)
            host_layout = "block" if total <= _MAX_BLOCK_LAYOUT_BYTES else "tensor"
        host_layout = str(host_layout)
        groups = [[r.tensor_idx for r in refs] for refs in kv_caches.group_data_refs]
        # A job moves each page's unpadded bytes (what vLLM's worker copies); a tensor shared by
        # several layers moves the most any of them uses.
        copy = [0] * len(tensors)
        for refs in kv_caches.group_data_refs:
            for r in refs:
                copy[r.tensor_idx] = max(copy[r.tensor_idx], int(r.page_size_bytes))
        copy = [c if c > 0 else int(t.page_size_bytes) for c, t in zip(copy, kv_caches.tensors)]
        self.engine = engine_factory(_device_of(tensors[0]) if tensors else 0, options)
        try:
            self.core = KVTransferWorker(self.engine, tensors, [sorted(set(g)) for g in groups],
                                         blocks_per_chunk, num_chunks, host_memory=host_memory,
                                         host_layout=host_layout, copy_bytes=copy)
        except BaseException:
            self.engine.close()
            raise

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        """GPU -> CPU, after the work queued so far on the current stream. Does not block."""
        return self.core.submit(job_id, False, dst_spec.block_ids, src_spec.block_ids,
                                src_spec.group_sizes, src_spec.block_indices)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec,
                    expedited: bool = False) -> bool:
        """CPU -> GPU, after the work queued so far on the current stream. Does not block."""
        return self.core.submit(job_id, True, src_spec.block_ids, dst_spec.block_ids,
                                dst_spec.group_sizes, dst_spec.block_indices, expedited=expedited)

    def get_finished(self) -> List[TransferResult]:
        return [TransferResult(job_id=r.job_id, success=r.success, transfer_size=r.bytes,
                               transfer_time=r.seconds) for r in self.core.get_finished()]

    def wait(self, job_ids: set) -> None:
        self.core.wait(job_ids)

    def shutdown(self) -> None:
        try:
            self.core.shutdown()
        finally:
            self.engine.close()


class GfdOffloadingSpec(CPUOffloadingSpec):
    """vLLM's CPU offloading spec with gfd's worker: ``spec_name`` GfdOffloadingSpec,
    ``spec_module_path`` gfd.vllm."""

    def _uses_shared_region(self) -> bool:
        # The worker allocates its host caches itself (a HostPool or pinned tensors, one copy
        # per worker): no shared mmap region, so no single-copy (replicated) layout either.
        return False

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        if self._worker is None:
            self._worker = GfdOffloadingWorker(kv_caches, self.blocks_per_chunk, self.num_chunks,
                                               dict(self.extra_config))
        return self._worker

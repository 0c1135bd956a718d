"""gfd.vllm against the real vLLM package, on the CPU (gfd's emulated device behind the worker).

The configuration a user gives vLLM (--kv-transfer-config JSON naming GfdOffloadingSpec in
gfd.vllm) is parsed as vLLM's CLI parses it, into a real VllmConfig of a tiny local Llama
config.json; vLLM's own KVConnectorFactory builds the OffloadingConnector for the scheduler and
the worker role, which resolve the spec through OffloadingSpecFactory / build_offloading_config.
The worker side registers its KV caches through vLLM's register_kv_caches: the caches are gfd
emulated device buffers, handed to vLLM as CPU torch views of the same memory; the
CanonicalKVCaches vLLM builds from them is given to the spec with each tensor swapped for the
device buffer at its address (gfd takes only device memory as the GPU side). Jobs come from
vLLM's CPUOffloadingManager (prepare_store / complete_store / prepare_load) with GPU specs built
as vLLM's OffloadingConnectorScheduler builds them, and run through the connector's worker-side
step (handle_preemptions, start_load_kv, wait_for_save, get_finished) or the worker directly,
with both host layouts (gfd_host_layout). Every byte of every tensor is checked against a numpy
reference.

Run by tools/vllm_test.sh, which installs vLLM into a virtual environment and sets
GFD_REQUIRE_VLLM=1: without vLLM this module then fails instead of skipping.
"""

import hashlib
import json
import os
import sys
import threading
import time

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the model is a local config.json: ask no hub
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
try:
    import vllm  # noqa: F401
except Exception as e:  # noqa: BLE001 - any failure to import vLLM (a broken torch, say)
    if os.environ.get("GFD_REQUIRE_VLLM") == "1":
        raise RuntimeError(
            f"GFD_REQUIRE_VLLM=1 but vllm cannot be imported ({type(e).__name__}: {e}); "
            "tools/vllm_test.sh installs it into a virtual environment"
        ) from e
    pytest.skip(
        f"vllm is not importable ({type(e).__name__}: {e}); tools/vllm_test.sh installs it "
        "and runs this suite",
        allow_module_level=True,
    )

import gfd  # noqa: E402
import gfd.vllm as gfd_vllm  # noqa: E402 - an error, never a skip: the package under test
import torch  # noqa: E402 - vLLM's dependency
from pydantic import TypeAdapter  # noqa: E402
from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, VllmConfig  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1 import KVConnectorRole  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import (  # noqa: E402
    OffloadingConnectorMetadata,
    TransferJob,
)
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import build_offloading_config  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    MambaSpec,
    SlidingWindowSpec,
)
from vllm.v1.kv_offload.base import (  # noqa: E402
    GPULoadStoreSpec,
    LookupResult,
    ReqContext,
    ScheduleEndContext,
    TransferResult,
    make_offload_key,
)
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager  # noqa: E402
from vllm.v1.kv_offload.factory import OffloadingSpecFactory  # noqa: E402

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 4,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "float16",
}
LAYERS = [f"model.layers.{i}.self_attn.attn" for i in range(4)]
TOKENS = 16  # per GPU block
ATTN = FullAttentionSpec(block_size=TOKENS, num_kv_heads=2, head_size=16, dtype=torch.float16)
SWA = SlidingWindowSpec(
    block_size=TOKENS, num_kv_heads=2, head_size=16, dtype=torch.float16, sliding_window=32
)
MAMBA = MambaSpec(block_size=TOKENS, shapes=((512,), (512,)), dtypes=(torch.float16, torch.float16))
PAGE = ATTN.page_size_bytes  # 2 heads x 16 tokens x (16 + 16) x 2 bytes = 2048
NUM_BLOCKS = 48
CPU_BYTES = 1 << 20
# A small staging ring (as tests/python/conftest.py's small_options): transfers cycle through it.
SMALL = dict(
    staging_bytes=1 << 20,
    slot_bytes=256 << 10,
    first_chunk_bytes=64 << 10,
    piece_bytes=16 << 10,
    gather_threads=2,
    copy_streams=2,
    spin_us=20,
)


def config_json(extra, spec="GfdOffloadingSpec"):
    return json.dumps(
        {
            "kv_connector": "OffloadingConnector",
            "kv_role": "kv_both",
            "kv_connector_extra_config": {
                "spec_name": spec,
                "spec_module_path": "gfd.vllm",
                "cpu_bytes_to_use": CPU_BYTES,
                **extra,
            },
        }
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("tiny-llama")
    (d / "config.json").write_text(json.dumps(LLAMA))
    return d


def vllm_config(model_dir, extra, spec="GfdOffloadingSpec"):
    # As vLLM's CLI parses --kv-transfer-config (EngineArgs: TypeAdapter(...).validate_json).
    kv = TypeAdapter(KVTransferConfig).validate_json(config_json(extra, spec))
    model = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, max_model_len=128)
    return VllmConfig(
        model_config=model,
        device_config=DeviceConfig("cpu"),
        cache_config=CacheConfig(block_size=TOKENS),
        kv_transfer_config=kv,
    )


def kv_cache_config(topology):
    """'one_group': two full-attention layers, a tensor each. 'hybrid': vLLM's hybrid allocator,
    a full-attention group and a sliding-window group whose layers alias the same two tensors."""

    def tensor(layers):
        return KVCacheTensor(
            size=2 * NUM_BLOCKS * PAGE,
            layers=layers,
            layer_stride=NUM_BLOCKS * PAGE,
            block_stride=PAGE,
        )

    if topology == "one_group":
        groups = [KVCacheGroupSpec(LAYERS[:2], ATTN)]
    elif topology == "hybrid":
        groups = [
            KVCacheGroupSpec([LAYERS[0], LAYERS[2]], ATTN),
            KVCacheGroupSpec([LAYERS[1], LAYERS[3]], SWA),
        ]
    else:  # "mamba": full attention beside Mamba state pages of the same size
        groups = [
            KVCacheGroupSpec([LAYERS[0], LAYERS[2]], ATTN),
            KVCacheGroupSpec([LAYERS[1], LAYERS[3]], MAMBA),
        ]
    return KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[tensor(g.layer_names) for g in groups],
        kv_cache_groups=groups,
    )


@pytest.fixture(scope="module", autouse=True)
def world(tmp_path_factory):
    """vLLM's world group of this one worker process (gloo), as vLLM's worker sets it up: the
    CPU spec's shared region waits on it."""
    from vllm.distributed import parallel_state as ps

    if ps._WORLD is None:
        init = f"file://{tmp_path_factory.mktemp('dist')}/init"
        ps.init_distributed_environment(
            world_size=1, rank=0, distributed_init_method=init, local_rank=0, backend="gloo"
        )
    yield


class Stack:
    """One OffloadingConnector per role, as vLLM builds them, the worker's caches registered
    through vLLM's register_kv_caches: CPU tensors, which gfd's emulated device
    (GFD_EMULATED_DEVICE) serves as GPU memory."""

    def __init__(
        self,
        model_dir,
        monkeypatch,
        topology="one_group",
        extra=None,
        emulated="1",
        spec="GfdOffloadingSpec",
    ):
        monkeypatch.setenv("GFD_EMULATED_DEVICE", emulated)
        extra = {"gfd_options": SMALL, **dict(extra or {})}
        self.vllm_config = vllm_config(model_dir, extra, spec)
        kcc = kv_cache_config(topology)
        self.scheduler = KVConnectorFactory.create_connector(
            self.vllm_config, KVConnectorRole.SCHEDULER, kcc
        )
        self.conn = KVConnectorFactory.create_connector(
            self.vllm_config, KVConnectorRole.WORKER, kcc
        )
        self.manager = self.scheduler.connector_scheduler.manager
        self.spec = self.conn.connector_worker.spec
        self.bpc = self.spec.blocks_per_chunk
        rng = np.random.default_rng(7)
        # The KV caches as vLLM's GPU model runner lays them out: per tensor (B, 2, H, N, C)
        # fp16 views of one byte allocation; hybrid: layer i of each group on tensor i.
        self.gpu_tensors = [torch.empty((NUM_BLOCKS, PAGE), dtype=torch.int8) for _ in range(2)]
        self.gpu = [t.numpy() for t in self.gpu_tensors]
        for g in self.gpu:
            g[:] = rng.integers(-128, 128, g.shape, dtype=np.int8)
        views = [t.view(torch.float16).view(NUM_BLOCKS, 2, TOKENS, 2, 16) for t in self.gpu_tensors]
        layer_views = {
            name: views[t] for g in kcc.kv_cache_groups for t, name in enumerate(g.layer_names)
        }
        self.conn.register_kv_caches(layer_views)
        self.worker = self.conn.connector_worker.worker
        assert isinstance(self.worker, gfd_vllm.GfdOffloadingWorker)
        self.engine = self.worker.engine
        assert self.engine._emulated
        self.groups = self.worker.groups
        # Per tensor, the host pages as (chunks, bpc, page): [c, j] is sub-block j of chunk c.
        self.host = [self.worker.core.host_pages(t) for t in range(len(self.gpu))]
        self.ctx = ReqContext(req_id="req-0")
        self.manager.on_new_request(self.ctx)

    def host_page(self, t, row):
        """Host page ``row`` (chunk * bpc + sub-block) of tensor t."""
        return self.host[t][row // self.bpc, row % self.bpc]

    def step(self, load_jobs=None, store_jobs=None, flush=None):
        """One engine step of the worker side, in the model runner's order."""
        meta = OffloadingConnectorMetadata(
            load_jobs=dict(load_jobs or {}), store_jobs=dict(store_jobs or {}), jobs_to_flush=flush
        )
        self.conn.handle_preemptions(meta)
        self.conn.bind_connector_metadata(meta)
        self.conn.start_load_kv(None)
        self.conn.wait_for_save()
        _, recving = self.conn.get_finished(set())
        out = self.conn.build_connector_worker_meta()
        self.conn.clear_connector_metadata()
        return recving, out

    def keys(self, group, chunks, salt="a"):
        return [
            make_offload_key(hashlib.sha256(f"{salt}/{c}".encode()).digest(), group) for c in chunks
        ]

    def job(self, tables, ranges, store, salt="a"):
        """A store (GPU -> CPU) or load of the blocks at positions [start, end) of each group's block
        table: the manager's CPU spec of the chunks covering them, and the GPU spec as the scheduler
        builds it (groups in order, null blocks (id 0) left out, block_indices[g] the position of
        group g's first block). Also (group, GPU block, host row) of every block moved."""
        keys, ids, sizes, starts, moved = [], [], [], [], []
        for g, (table, (start, end)) in enumerate(zip(tables, ranges)):
            first, base = start // self.bpc, len(keys)
            keys += self.keys(g, range(first, -(-end // self.bpc)), salt)
            pos = [p for p in range(start, end) if table[p] != 0]
            ids += [int(table[p]) for p in pos]
            sizes.append(len(pos))
            starts.append(pos[0] if pos else 0)
            moved += [(g, int(table[p]), base + p // self.bpc - first, p % self.bpc) for p in pos]
        with self.manager.lock:
            if store:
                out = self.manager.prepare_store(keys, self.ctx)
                assert out.keys_to_store == keys and not out.evicted_keys
                cpu = out.store_spec
            else:
                assert all(self.manager.lookup(k, self.ctx) is LookupResult.HIT for k in keys)
                cpu = self.manager.prepare_load(keys, self.ctx)
        assert len(cpu.block_ids) == len(keys)
        gpu = GPULoadStoreSpec(ids, group_sizes=sizes, block_indices=starts)
        rows = [(g, b, int(cpu.block_ids[k]) * self.bpc + j) for g, b, k, j in moved]
        return keys, gpu, cpu, rows

    def expect_host(self, rows, before):
        """``before`` (per tensor, a copy of the host pages) with a store of ``rows`` applied."""
        for g, b, row in rows:
            for t in self.groups[g]:
                before[t][row // self.bpc, row % self.bpc] = self.gpu[t][b]
        return before


def tables_for(s, rng):
    """Per group, a store table and a load table of 3 chunks of positions (block ids all distinct;
    0 is vLLM's null block), and the stored and loaded ranges. Group 0: all positions stored; the
    load starts at position 1 (one block computed on the GPU already): unaligned for bpc > 1. The
    sliding-window group: only its window (the last bpc + 2 positions) is real and stored, so its
    first block starts mid-chunk too."""
    n = 3 * s.bpc
    free = iter(rng.permutation(np.arange(1, NUM_BLOCKS)))
    stores, loads, store_ranges, load_ranges = [], [], [], []
    for g in range(len(s.groups)):
        live = 0 if g == 0 else n - (s.bpc + 2 if s.bpc > 1 else 2)
        stores.append([0] * live + [next(free) for _ in range(n - live)])
        loads.append([0] * live + [next(free) for _ in range(n - live)])
        store_ranges.append((live, n))
        load_ranges.append((1 if g == 0 else live, n))
    return stores, loads, store_ranges, load_ranges


@pytest.mark.parametrize(
    "extra,bpc", [({}, 1), ({"block_size": 4 * TOKENS}, 4), ({"blocks_per_chunk": 4}, 4)]
)
def test_config_resolves_to_the_gfd_spec_in_both_roles(model_dir, extra, bpc):
    vc = vllm_config(model_dir, extra)
    extra_config = vc.kv_transfer_config.kv_connector_extra_config
    assert vc.kv_transfer_config.kv_connector == "OffloadingConnector"
    assert OffloadingSpecFactory.get_spec_cls(extra_config) is gfd_vllm.GfdOffloadingSpec
    kcc = kv_cache_config("one_group")
    oc = build_offloading_config(vc, kcc)
    assert oc.cache.blocks_per_chunk == bpc and oc.worker_kv_bytes_per_block == 2 * PAGE
    assert [g.layer_names for g in oc.groups] == [tuple(LAYERS[:2])]
    spec = OffloadingSpecFactory.create_spec(oc)
    chunk = -(-2 * PAGE * bpc // spec.BLOCK_SIZE_ALIGNMENT) * spec.BLOCK_SIZE_ALIGNMENT
    assert type(spec) is gfd_vllm.GfdOffloadingSpec and spec.blocks_per_chunk == bpc
    assert spec.num_chunks == CPU_BYTES // chunk > 0 and not spec.replicated_layout
    scheduler = KVConnectorFactory.create_connector(vc, KVConnectorRole.SCHEDULER, kcc)
    assert (
        scheduler.connector_worker is None
        and scheduler.connector_scheduler.config.blocks_per_chunk == bpc
    )
    manager = scheduler.connector_scheduler.manager
    assert isinstance(manager, CPUOffloadingManager) and manager._num_chunks == spec.num_chunks
    worker = KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, kcc)
    assert worker.connector_scheduler is None and worker.connector_worker.worker is None
    wspec = worker.connector_worker.spec
    assert type(wspec) is gfd_vllm.GfdOffloadingSpec
    assert (wspec.blocks_per_chunk, wspec.num_chunks) == (bpc, spec.num_chunks)


HOST_MEMORY = {
    "region": {},
    "canonical": {"canonical_layout": True},
    "pool-block": {"gfd_host_memory": "pool"},
    "pool-tensor": {"gfd_host_memory": "pool", "gfd_host_layout": "tensor"},
}


@pytest.mark.parametrize("memory", list(HOST_MEMORY))
@pytest.mark.parametrize("topology", ["one_group", "hybrid", "mamba"])
@pytest.mark.parametrize("extra", [{}, {"block_size": 4 * TOKENS}], ids=["bpc1", "bpc4"])
def test_store_then_load_back_through_the_connector(
    model_dir, monkeypatch, topology, extra, memory
):
    s = Stack(model_dir, monkeypatch, topology, {**extra, **HOST_MEMORY[memory]})
    if memory == "region":  # the host pages are vLLM's region: this rank's cell of each row
        region = s.worker.region
        assert region is not None and s.worker.core.host_layout == "tensor"
        base = region.base_tensor.data_ptr()
        assert s.host[0].ctypes.data == base and s.host[0].strides[0] == region._row_stride
        assert s.host[1].ctypes.data == base + PAGE * s.bpc
    elif memory == "canonical":  # vLLM's derived mapping: pages in the shared canonical area
        # One rank: the canonical page is the local page, its runs merged into one fragment (an
        # entry per tensor and mapping: a Mamba layer's differs from the attention layer's).
        core = s.worker.core
        assert len(core._fragments) == (2 if topology != "mamba" else 4)
        assert all(f == [(0, 0, PAGE)] for f in core._fragments) and set(core._writers) == {(1, 0)}
        assert s.host[0].ctypes.data == s.worker.region.base_tensor.data_ptr()
    else:
        assert s.worker.region is None
    assert s.groups == [[0, 1]] * (1 if topology == "one_group" else 2)
    stores, loads, store_ranges, load_ranges = tables_for(s, np.random.default_rng(s.bpc))
    keys, gpu_spec, cpu_spec, rows = s.job(stores, store_ranges, store=True)
    original = [g.copy() for g in s.gpu]
    expect = s.expect_host(rows, [h.copy() for h in s.host])
    nbytes = len(rows) * 2 * PAGE
    # Step 1 defers the store (wait_for_save); step 2 flushes it: submitted, waited on, reported.
    recving, meta = s.step(store_jobs={1: TransferJob("req-0", gpu_spec, cpu_spec)})
    assert meta is None and not recving
    recving, meta = s.step(flush={1})
    assert meta.completed_jobs == {1: 1} and not recving
    assert meta.transfer_stats.store.sizes == [nbytes] and meta.transfer_stats.store.time > 0
    for t, (h, e) in enumerate(zip(s.host, expect)):
        assert np.array_equal(h, e), f"store: host cache {t}"
    with s.manager.lock:
        s.manager.complete_store(keys, s.ctx)
    # Load the chunks back into other GPU blocks.
    load_keys, gpu_spec, cpu_spec, rows = s.job(loads, load_ranges, store=False)
    stored = {(g, p): b for g, table in enumerate(stores) for p, b in enumerate(table)}
    expect = [g.copy() for g in s.gpu]
    for g, b, row in rows:
        for t in s.groups[g]:
            expect[t][b] = s.host_page(t, row)
    recving, meta = s.step(load_jobs={2: TransferJob("req-0", cpu_spec, gpu_spec)})
    s.worker.wait({2})
    recving2, meta2 = s.step()
    assert recving | recving2 == {"req-0"}
    loads_done = [m for m in (meta, meta2) if m is not None]
    assert [m.completed_jobs for m in loads_done] == [{2: 1}]
    assert loads_done[0].transfer_stats.load.sizes == [len(rows) * 2 * PAGE]
    for t, (g, e) in enumerate(zip(s.gpu, expect)):
        assert np.array_equal(g, e), f"load: GPU tensor {t}"
    for g, (table, (a, z)) in enumerate(zip(loads, load_ranges)):
        for p in range(a, z):  # the round trip: each loaded block holds its stored block's bytes
            for t in s.groups[g]:
                assert np.array_equal(s.gpu[t][table[p]], original[t][stored[(g, p)]])
    with s.manager.lock:
        s.manager.complete_load(load_keys, s.ctx)
    s.conn.shutdown()
    assert s.engine.closed


def test_jobs_in_flight_then_done(model_dir, monkeypatch):
    delay = 200_000  # us per emulated copy: a job stays in flight at least that long
    s = Stack(
        model_dir,
        monkeypatch,
        "one_group",
        {"block_size": 4 * TOKENS},
        emulated=f"copy_delay_us={delay}",
    )
    stores = tables_for(s, np.random.default_rng(3))[0]
    first = s.job(stores, [(0, 4)], store=True, salt="x")
    second = s.job(stores, [(4, 12)], store=True, salt="y")
    t0 = time.perf_counter()
    assert s.worker.submit_store(1, first[1], first[2]) is True
    assert s.worker.submit_store(2, second[1], second[2]) is True
    early = s.worker.get_finished()
    if time.perf_counter() - t0 < delay * 1e-6:
        assert early == [], "a job reported done before its first copy could end"
    s.worker.wait({1, 2, 77})  # 77: not in flight, ignored
    done = early + s.worker.get_finished()
    assert [r.job_id for r in done] == [1, 2]
    for r, rows in zip(done, (first[3], second[3])):
        assert isinstance(r, TransferResult) and r.success is True
        assert r.transfer_size == len(rows) * 2 * PAGE
        assert isinstance(r.transfer_time, float) and r.transfer_time > 0
    assert s.worker.get_finished() == []  # each result once
    for g, b, row in first[3] + second[3]:
        for t in s.groups[g]:
            assert np.array_equal(s.host_page(t, row), s.gpu[t][b]), f"host cache {t}, row {row}"
    s.worker.shutdown()


def test_sync_load_is_expedited_and_waited_within_the_step(model_dir, monkeypatch):
    s = Stack(
        model_dir,
        monkeypatch,
        "one_group",
        {"block_size": 4 * TOKENS},
        emulated="copy_delay_us=50000",
    )
    stores, loads, store_ranges, load_ranges = tables_for(s, np.random.default_rng(4))
    keys, gpu_spec, cpu_spec, rows = s.job(stores, store_ranges, store=True)
    assert s.step(flush={1}, store_jobs={1: TransferJob("req-0", gpu_spec, cpu_spec)})[
        1
    ].completed_jobs == {1: 1}
    with s.manager.lock:
        s.manager.complete_store(keys, s.ctx)
    _, gpu_spec, cpu_spec, rows = s.job(loads, load_ranges, store=False)
    recving, meta = s.step(load_jobs={5: TransferJob("req-0", cpu_spec, gpu_spec, sync=True)})
    # start_load_kv returned after the expedited load: its bytes are in place, nothing to receive.
    assert meta.completed_jobs == {5: 1} and not recving
    for g, b, row in rows:
        for t in s.groups[g]:
            assert np.array_equal(s.gpu[t][b], s.host_page(t, row))
    s.conn.shutdown()


@pytest.mark.parametrize("fault", ["copy_d2h", "copy_h2d"])
def test_device_fault_is_a_failed_job(model_dir, monkeypatch, fault):
    s = Stack(
        model_dir, monkeypatch, "one_group", {"block_size": 4 * TOKENS}, emulated=f"fault={fault}"
    )
    stores, loads, store_ranges, load_ranges = tables_for(s, np.random.default_rng(5))
    keys, gpu_spec, cpu_spec, _ = s.job(stores, store_ranges, store=True)
    assert s.worker.submit_store(1, gpu_spec, cpu_spec) is True  # never raises for a device fault
    s.worker.wait({1})
    (r,) = s.worker.get_finished()
    if fault == "copy_d2h":
        assert (r.job_id, r.success, r.transfer_size) == (1, False, 0)
        assert isinstance(r.transfer_time, float)
    else:
        assert (r.job_id, r.success) == (1, True)
        with s.manager.lock:
            s.manager.complete_store(keys, s.ctx)
        _, gpu_spec, cpu_spec, _ = s.job(loads, load_ranges, store=False)
        assert s.worker.submit_load(2, cpu_spec, gpu_spec) is True
        s.worker.wait({2})
        (r,) = s.worker.get_finished()
        assert (r.job_id, r.success, r.transfer_size) == (2, False, 0)
    s.worker.shutdown()
    assert s.engine.closed


def test_shutdown_with_jobs_in_flight(model_dir, monkeypatch):
    s = Stack(model_dir, monkeypatch, "one_group", {}, emulated="copy_delay_us=100000")
    stores = tables_for(s, np.random.default_rng(6))[0]
    jobs = [s.job(stores, [(p, p + 1)], store=True, salt=f"s{p}") for p in range(3)]
    for j, (_, gpu_spec, cpu_spec, _) in enumerate(jobs):
        assert s.worker.submit_store(j, gpu_spec, cpu_spec)
    keep = s.worker.region.base_tensor  # keeps vLLM's region mapped after shutdown, to read it
    th = threading.Thread(target=s.conn.shutdown, daemon=True)  # the connector's: the worker's
    th.start()
    th.join(120)  # a guard against a hang only
    assert not th.is_alive(), "shutdown did not return with jobs in flight"
    assert s.engine.closed
    # Shutdown waited for the jobs: their bytes are on the host.
    for _, _, _, rows in jobs:
        for _, b, row in rows:
            for t in s.groups[0]:
                assert np.array_equal(s.host_page(t, row), s.gpu[t][b])
    s.worker.shutdown()  # idempotent
    del keep


def mapped(path):
    """Whether this process still maps the file at ``path`` (unlinked or not)."""
    with open("/proc/self/maps") as f:
        return any(path in line for line in f)


@pytest.mark.parametrize("bpc", [2, 4])
def test_a_job_writing_a_block_twice_fails_whole_says_why_and_moves_nothing(
    model_dir, monkeypatch, caplog, bpc
):
    """vLLM's shared region holds a chunk's pages of a tensor side by side (a transfer per slot):
    a load writing GPU block 9 from two slots of one chunk, a load whose duplicate is only in a
    later slot and a store of one chunk twice each fail before anything moves, and the cause is
    logged, since vLLM sees success=False alone."""
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

    s = Stack(model_dir, monkeypatch, "one_group", {"block_size": bpc * TOKENS})
    assert s.bpc == bpc and s.worker.region is not None
    n = 2 * bpc
    stored = list(range(1, 1 + n))
    assert s.worker.submit_store(
        1, GPULoadStoreSpec(stored, group_sizes=[n], block_indices=[0]), CPULoadStoreSpec([0, 1])
    )
    s.worker.wait({1})
    assert [(r.job_id, r.success) for r in s.worker.get_finished()] == [(1, True)]
    gpu_before, host_before = [g.copy() for g in s.gpu], [h.copy() for h in s.host]
    jobs = {  # job id: (load?, chunk ids, GPU block ids, what the log says)
        2: (
            True,
            [0],
            [9, 9] + list(range(10, 8 + bpc)),
            "gpu_block_ids[1]: GPU block 9 is written twice",
        ),
        3: (
            True,
            [0, 1],
            list(range(20, 19 + n)) + [20],
            f"gpu_block_ids[{n - 1}]: GPU block 20 is written twice",
        ),
        4: (
            False,
            [2, 2],
            list(range(30, 30 + n)),
            "chunk_ids[1]: sub-block 0 of chunk 2 is written twice",
        ),
    }
    with caplog.at_level("ERROR", logger="gfd.vllm"):
        for job, (load, chunks, blocks, _) in jobs.items():
            gpu_spec = GPULoadStoreSpec(blocks, group_sizes=[len(blocks)], block_indices=[0])
            if load:
                assert s.worker.submit_load(job, CPULoadStoreSpec(chunks), gpu_spec) is True
            else:
                assert s.worker.submit_store(job, gpu_spec, CPULoadStoreSpec(chunks)) is True
        s.worker.wait(set(jobs))
        done = s.worker.get_finished()
    assert sorted((r.job_id, r.success, r.transfer_size) for r in done) == [
        (j, False, 0) for j in sorted(jobs)
    ]
    for job, (_, _, _, said) in jobs.items():
        assert f"gfd.vllm: job {job} failed: submit: {said}" in caplog.text, caplog.text
    assert all(np.array_equal(g, b) for g, b in zip(s.gpu, gpu_before)), (
        "a failed load wrote GPU blocks"
    )
    assert all(np.array_equal(h, b) for h, b in zip(s.host, host_before)), (
        "a failed store wrote host pages"
    )
    s.conn.shutdown()


def test_shutdown_lets_go_of_vllms_region(model_dir, monkeypatch):
    """After shutdown() (jobs in flight waited for) nothing of gfd's holds vLLM's region, so that
    vLLM unmaps it: it is no longer mapped in the process."""
    s = Stack(
        model_dir,
        monkeypatch,
        "one_group",
        {"block_size": 2 * TOKENS},
        emulated="copy_delay_us=50000",
    )
    region = s.worker.region
    path = region.mmap_path
    assert mapped(path)
    stores = tables_for(s, np.random.default_rng(11))[0]
    _, gpu_spec, cpu_spec, _ = s.job(stores, [(0, 4)], store=True)
    assert s.worker.submit_store(1, gpu_spec, cpu_spec)
    del stores, gpu_spec, cpu_spec
    s.host = None  # the test's own views of the region
    s.conn.shutdown()
    assert s.engine.closed and s.worker.region is None
    assert region.mmap_obj is None, "vLLM kept its region mapped: buffers still exported"
    assert not mapped(path)


def _exit_with_jobs_in_flight(model_dir, init, out):
    """A worker process (spawned) that submits stores, each copy held 200 ms, and ends without
    shutting the worker down: gfd's exit hook drains the engine while vLLM's region and caches
    are still there."""
    try:
        os.environ["GFD_EMULATED_DEVICE"] = "copy_delay_us=200000"
        from vllm.distributed import parallel_state as ps
        from vllm.v1.kv_offload.base import (
            CanonicalKVCacheRef,
            CanonicalKVCaches,
            CanonicalKVCacheTensor,
        )
        from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

        ps.init_distributed_environment(
            world_size=1, rank=0, distributed_init_method=init, local_rank=0, backend="gloo"
        )
        vc = vllm_config(model_dir, {"gfd_options": SMALL, "block_size": 2 * TOKENS})
        spec = OffloadingSpecFactory.create_spec(
            build_offloading_config(vc, kv_cache_config("one_group"))
        )
        gpu = [torch.full((NUM_BLOCKS, PAGE), t + 1, dtype=torch.int8) for t in range(2)]
        worker = spec.get_worker(
            CanonicalKVCaches(
                [CanonicalKVCacheTensor(g, PAGE) for g in gpu],
                [[CanonicalKVCacheRef(t, PAGE) for t in range(2)]],
            )
        )
        for job in range(3):
            assert worker.submit_store(
                job,
                GPULoadStoreSpec([2 * job + 1, 2 * job + 2], group_sizes=[2], block_indices=[0]),
                CPULoadStoreSpec([job]),
            )
        out.put("submitted")
    except BaseException as e:  # noqa: BLE001 - reported to the test
        import traceback

        out.put(f"{type(e).__name__}: {e}\n{traceback.format_exc()}")


def test_a_process_ending_with_jobs_in_flight_exits_cleanly(model_dir, tmp_path):
    """The worker process ends (vLLM's engine exiting) with stores in flight and no shutdown():
    no crash, exit status 0."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(
        target=_exit_with_jobs_in_flight, args=(model_dir, f"file://{tmp_path}/init", out)
    )
    p.start()
    said = out.get(timeout=300)  # a hang guard only
    p.join(120)
    assert said == "submitted", said
    assert p.exitcode == 0, f"the worker process ended with {p.exitcode}"


def test_canonical_layout_is_said_at_startup(model_dir, monkeypatch, caplog):
    """vLLM's own CPU spec ignores canonical_layout, gfd's honours it: the worker says so."""
    with caplog.at_level("WARNING", logger="gfd.vllm"):
        s = Stack(model_dir, monkeypatch, "one_group", {})
    assert "canonical_layout" not in caplog.text
    s.conn.shutdown()
    caplog.clear()
    with caplog.at_level("WARNING", logger="gfd.vllm"):
        s = Stack(model_dir, monkeypatch, "one_group", {"canonical_layout": True})
    assert gfd_vllm.CANONICAL_NOTE in caplog.text
    s.conn.shutdown()


def test_unsupported_combinations_are_refused_naming_the_key(model_dir, monkeypatch):
    with pytest.raises(
        gfd.Error, match="gfd_host_memory: expected one of \\('vllm', 'pool'\\), got 'mmap'"
    ):
        Stack(model_dir, monkeypatch, "one_group", {"gfd_host_memory": "mmap"})
    with pytest.raises(gfd.Error, match="canonical_layout needs vLLM's shared region"):
        Stack(
            model_dir,
            monkeypatch,
            "one_group",
            {"gfd_host_memory": "pool", "canonical_layout": True},
        )
    with pytest.raises(gfd.Error, match="GfdTieringOffloadingSpec takes only 'vllm'"):
        Stack(
            model_dir,
            monkeypatch,
            "one_group",
            {"gfd_host_memory": "pool"},
            spec="GfdTieringOffloadingSpec",
        )


def enqueued_within(engine, call):
    """Whether ``call`` (a submission, which returns True) had its transfer reach gfd by the time
    it returned, with no other thread able to run meanwhile (a switch interval far longer than
    the test: a caller busy in Python keeps the interpreter)."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1000.0)
    try:
        before = engine.stats()["transfers"]
        assert call() is True
        return engine.stats()["transfers"] > before
    finally:
        sys.setswitchinterval(interval)


def test_a_job_reaches_gfd_within_the_submit_call(model_dir, monkeypatch):
    """No thread stands between submit_store / submit_load and gfd: the transfer is enqueued
    when the call returns, though no other thread could have run meanwhile (the switch interval
    is far longer than the test, so a caller busy in Python keeps the interpreter)."""
    s = Stack(
        model_dir,
        monkeypatch,
        "one_group",
        {"block_size": 4 * TOKENS},
        emulated="copy_delay_us=20000",
    )
    stores, loads, store_ranges, load_ranges = tables_for(s, np.random.default_rng(8))
    keys, gpu_spec, cpu_spec, rows = s.job(stores, store_ranges, store=True)
    assert enqueued_within(s.engine, lambda: s.worker.submit_store(1, gpu_spec, cpu_spec)), (
        "the store was not enqueued by the time submit_store returned"
    )
    s.worker.wait({1})
    assert [(r.job_id, r.success) for r in s.worker.get_finished()] == [(1, True)]
    with s.manager.lock:
        s.manager.complete_store(keys, s.ctx)
    _, gpu_spec, cpu_spec, rows = s.job(loads, load_ranges, store=False)
    assert enqueued_within(s.engine, lambda: s.worker.submit_load(2, cpu_spec, gpu_spec)), (
        "the load was not enqueued by the time submit_load returned"
    )
    s.worker.wait({2})
    assert [(r.job_id, r.success) for r in s.worker.get_finished()] == [(2, True)]
    for g, b, row in rows:
        for t in s.groups[g]:
            assert np.array_equal(s.gpu[t][b], s.host_page(t, row))
    s.conn.shutdown()


def poll(condition, what, manager=None, limit=60.0):
    """Runs scheduler steps (on_schedule_end) until ``condition()``; a hang guard, not a time
    threshold."""
    deadline = time.monotonic() + limit
    while not condition():
        if manager is not None:
            with manager.lock:
                manager.on_schedule_end(ScheduleEndContext((), ()))
        assert time.monotonic() < deadline, f"{what}: nothing after {limit} s"
        time.sleep(0.005)


def test_fs_tier_below_gfds_cpu_tier_round_trip(model_dir, monkeypatch, tmp_path):
    """GfdTieringOffloadingSpec with vLLM's fs tier: one instance stores through gfd into vLLM's
    region, vLLM's tier writes the chunks to files; a second instance, its CPU tier empty,
    finds them there, vLLM promotes them into its region, and gfd loads them onto its GPU."""
    tiers = {
        "secondary_tiers": [
            {
                "type": "fs",
                "root_dir": str(tmp_path / "kv"),
                "n_read_threads": 2,
                "n_write_threads": 2,
            }
        ]
    }
    a = Stack(model_dir, monkeypatch, "one_group", tiers, spec="GfdTieringOffloadingSpec")
    assert isinstance(a.spec, gfd_vllm.GfdTieringOffloadingSpec) and a.worker.region is not None
    n = 3 * a.bpc
    table = [
        int(b) for b in np.random.default_rng(9).permutation(np.arange(1, NUM_BLOCKS))[: 2 * n]
    ]
    keys, gpu_spec, cpu_spec, rows = a.job([table[:n]], [(0, n)], store=True)
    assert a.step(flush={1}, store_jobs={1: TransferJob("req-0", gpu_spec, cpu_spec)})[
        1
    ].completed_jobs == {1: 1}
    stored = {p: table[p] for p in range(n)}
    with a.manager.lock:
        a.manager.complete_store(keys, a.ctx)
        a.manager.on_request_finished(a.ctx)
    files = lambda: sum(1 for p in (tmp_path / "kv").rglob("*") if p.is_file())  # noqa: E731
    poll(
        lambda: files() >= len(keys) and not a.manager.has_pending_work(),
        "the fs tier's writes",
        a.manager,
    )
    original = [g.copy() for g in a.gpu]
    a.conn.shutdown()
    a.scheduler.shutdown()

    b = Stack(model_dir, monkeypatch, "one_group", tiers, spec="GfdTieringOffloadingSpec")
    for g in b.gpu:
        g[:] = 0
    with b.manager.lock:
        first = [b.manager.lookup(k, b.ctx) for k in keys]
    assert all(r is not LookupResult.HIT for r in first), (
        "the second instance's CPU tier is not empty"
    )

    def promoted():
        with b.manager.lock:
            return all(b.manager.lookup(k, b.ctx) is LookupResult.HIT for k in keys)

    poll(promoted, "the promotion from the fs tier", b.manager)
    _, gpu_spec, cpu_spec, rows = b.job([table[n:]], [(0, n)], store=False)
    recving, meta = b.step(load_jobs={2: TransferJob("req-0", cpu_spec, gpu_spec)})
    b.worker.wait({2})
    recving2, meta2 = b.step()
    assert recving | recving2 == {"req-0"}
    for p in range(n):
        for t in b.groups[0]:
            assert np.array_equal(b.gpu[t][table[n + p]], original[t][stored[p]]), (
                f"position {p}, tensor {t}"
            )
    b.conn.shutdown()
    b.scheduler.shutdown()


def _rank(rank, mode, model_dir, init, engine_id, out):
    """One worker process of a world of 2 (spawned): vLLM's gloo world group, the spec built from
    vLLM's offloading config of this rank, gfd's worker on the emulated device. Each rank
    stores its own GPU content (rank-specific bytes) to chunks 0..2, then, after a barrier, checks
    the whole shared region: ``cells``: every rank's cell holds that rank's pages; ``replicated``
    (pure-MLA, canonical pages, one copy): page p written once, by rank p % 2. Puts "ok" or
    the error in ``out``."""
    try:
        import dataclasses

        os.environ["GFD_EMULATED_DEVICE"] = "1"
        from vllm.distributed import parallel_state as ps
        from vllm.v1.kv_offload.base import (
            CanonicalKVCacheRef,
            CanonicalKVCaches,
            CanonicalKVCacheTensor,
            CanonicalPageMapping,
            CopyRun,
        )
        from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

        ps.init_distributed_environment(
            world_size=2, rank=rank, distributed_init_method=init, local_rank=rank, backend="gloo"
        )
        extra = {"engine_id": engine_id}
        if mode == "replicated":
            extra["canonical_layout"] = True
        kv = json.loads(config_json({"gfd_options": SMALL, **extra}))
        kv["engine_id"] = engine_id
        vc = VllmConfig(
            model_config=ModelConfig(
                model=str(model_dir), skip_tokenizer_init=True, max_model_len=128
            ),
            device_config=DeviceConfig("cpu"),
            cache_config=CacheConfig(block_size=TOKENS),
            kv_transfer_config=TypeAdapter(KVTransferConfig).validate_python(kv),
        )
        oc = build_offloading_config(vc, kv_cache_config("one_group"))
        oc = dataclasses.replace(
            oc,
            parallel=dataclasses.replace(oc.parallel, rank=rank, world_size=2, tp_size=2),
            replicated_layout=mode == "replicated",
            canonical_layout=mode == "replicated",
        )
        spec = OffloadingSpecFactory.create_spec(oc)
        gpu = [torch.full((NUM_BLOCKS, PAGE), 0, dtype=torch.int8) for _ in range(2)]
        for t, g in enumerate(gpu):  # byte value: who wrote it, which tensor, which block
            g[:] = torch.arange(NUM_BLOCKS, dtype=torch.int8)[:, None] + 16 * t + 64 * rank
        if mode == "replicated":  # the MLA latent: the whole page is canonical, ranks take turns
            mapping = CanonicalPageMapping(
                PAGE, PAGE, (CopyRun(0, 0, PAGE, 1, PAGE, PAGE),), 2, rank, True
            )
        else:
            mapping = None
        refs = [[CanonicalKVCacheRef(t, PAGE, mapping) for t in range(2)]]
        worker = spec.get_worker(
            CanonicalKVCaches([CanonicalKVCacheTensor(g, PAGE) for g in gpu], refs)
        )
        blocks = [5, 9, 13]
        worker.submit_store(
            1,
            GPULoadStoreSpec(blocks, group_sizes=[3], block_indices=[0]),
            CPULoadStoreSpec([0, 1, 2]),
        )
        worker.wait({1})
        (r,) = worker.get_finished()
        assert r.success, r
        ps.get_world_group().barrier()  # both ranks' stores are in the region
        region = worker.region
        base = region.base_tensor.numpy()
        row = region._row_stride
        for c, b in enumerate(blocks):
            for t in range(2):
                if mode == "cells":
                    for owner in range(2):  # each rank's cell: its tensors' pages side by side
                        at = c * row + owner * region.cpu_page_size + t * PAGE
                        want = (b + 16 * t + 64 * owner) & 0xFF
                        assert (base[at : at + PAGE].view(np.uint8) == want).all(), (
                            mode,
                            c,
                            t,
                            owner,
                        )
                else:  # one copy, canonical area from the row's start; page c written by rank c % 2
                    at = c * row + t * PAGE
                    want = (b + 16 * t + 64 * (c % 2)) & 0xFF
                    assert (base[at : at + PAGE].view(np.uint8) == want).all(), (mode, c, t)
        ps.get_world_group().barrier()
        worker.shutdown()
        out.put((rank, "ok"))
    except BaseException as e:  # noqa: BLE001 - reported to the test
        import traceback

        out.put((rank, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


@pytest.mark.parametrize("mode", ["cells", "replicated"])
def test_two_ranks_share_vllms_region(model_dir, tmp_path, mode):
    """World size 2 (two processes, as vLLM's TP workers are): ``cells``: one region, each rank
    its own cell of every row; ``replicated`` with canonical pages: one copy, the ranks taking
    turns to write it (vLLM's writer rotation)."""
    import multiprocessing
    import uuid

    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    init = f"file://{tmp_path}/init"
    engine_id = f"gfd-test-{uuid.uuid4().hex}"
    procs = [
        ctx.Process(target=_rank, args=(r, mode, model_dir, init, engine_id, out)) for r in range(2)
    ]
    for p in procs:
        p.start()
    results = {}
    for _ in procs:
        rank, status = out.get(timeout=300)  # a hang guard only
        results[rank] = status
    for p in procs:
        p.join(60)
    assert results == {0: "ok", 1: "ok"}, results


def test_packed_layout_one_region_per_block(model_dir, monkeypatch):
    """A packed layout (DeepSeek-V4: every layer of a block interleaved in one region, its block
    stride larger than any layer's page) reaches the worker as vLLM hands it over: one tensor of
    whole blocks, every group referring to it. Stored and loaded back byte for byte."""
    from vllm.v1.kv_offload.base import (
        CanonicalKVCacheRef,
        CanonicalKVCaches,
        CanonicalKVCacheTensor,
    )
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

    monkeypatch.setenv("GFD_EMULATED_DEVICE", "1")
    vc = vllm_config(model_dir, {"gfd_options": SMALL, "block_size": 2 * TOKENS})
    spec = OffloadingSpecFactory.create_spec(
        build_offloading_config(vc, kv_cache_config("one_group"))
    )
    block = 2 * PAGE  # the packed block: both layers' pages
    whole = torch.empty((NUM_BLOCKS, block), dtype=torch.int8)
    gpu = whole.numpy()
    gpu[:] = np.random.default_rng(10).integers(-128, 128, gpu.shape, dtype=np.int8)
    worker = spec.get_worker(
        CanonicalKVCaches([CanonicalKVCacheTensor(whole, block)], [[CanonicalKVCacheRef(0, block)]])
    )
    host = worker.core.host_pages(0)
    assert host.shape[1:] == (2, block)
    blocks = [7, 3, 30, 12]  # chunks 4 and 1, two blocks each
    assert worker.submit_store(
        1, GPULoadStoreSpec(blocks, group_sizes=[4], block_indices=[0]), CPULoadStoreSpec([4, 1])
    )
    worker.wait({1})
    assert [r.success for r in worker.get_finished()] == [True]
    for i, b in enumerate(blocks):
        assert np.array_equal(host[[4, 1][i // 2], i % 2], gpu[b])
    back = [40, 41, 42]  # from the second sub-block of chunk 4 on
    assert worker.submit_load(
        2, CPULoadStoreSpec([4, 1]), GPULoadStoreSpec(back, group_sizes=[3], block_indices=[1])
    )
    worker.wait({2})
    assert [r.success for r in worker.get_finished()] == [True]
    for b, src in zip(back, blocks[1:]):
        assert np.array_equal(gpu[b], gpu[src])
    worker.shutdown()

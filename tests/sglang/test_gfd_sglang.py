"""gfd.sglang against the real SGLang package, on the CPU (gfd's emulated device behind it).

The plugin is found the way SGLang finds plugins: ``load_plugins()`` reads the entry points of
the group ``sglang.srt.plugins`` (the distribution metadata written here declares the entry point
pyproject.toml declares), narrowed by ``SGLANG_PLUGINS``, with ``GFD_SGLANG_HICACHE=1`` and
``GFD_EMULATED_DEVICE=1``. Real ``MHATokenToKVPool`` / ``MLATokenToKVPool`` device pools (CPU
tensors, which the emulated device adopts as its memory), real ``MHATokenToKVPoolHost`` /
``MLATokenToKVPoolHost`` host pools in each covered layout and the real ``L2TransferEngine`` with
the direct io backend: write-backs of all layers and loads layer by layer, every byte checked,
per-layer completion in order, a write-back's acknowledgement (its stream) never before its
bytes, and SGLang's own path for what is not covered.

Run by tools/sglang_test.sh, which installs SGLang into a virtual environment and sets
GFD_REQUIRE_SGLANG=1: without SGLang this module then fails instead of skipping.
"""

import os
import sys
from pathlib import Path

import numpy as np
import pytest
import tomllib

try:
    import sglang  # noqa: F401
    import torch
except Exception as e:  # noqa: BLE001 - any failure to import SGLang
    if os.environ.get("GFD_REQUIRE_SGLANG") == "1":
        raise RuntimeError(
            f"GFD_REQUIRE_SGLANG=1 but sglang cannot be imported ({type(e).__name__}: {e}); "
            "tools/sglang_test.sh installs it into a virtual environment"
        ) from e
    pytest.skip(
        f"sglang is not importable ({type(e).__name__}: {e}); tools/sglang_test.sh installs it and runs "
        "this suite",
        allow_module_level=True,
    )

ROOT = Path(__file__).resolve().parents[2]
P, H, D, LAYERS, TOKENS = (
    16,
    2,
    32,
    4,
    256,
)  # page tokens, KV heads, head dim, layers, device tokens
KV_LORA, ROPE = 64, 16  # MLA latent: 80 values a token


@pytest.fixture(scope="module")
def plugins(tmp_path_factory):
    """SGLang's plugin loader run as in each SGLang process, gfd installed as far as entry points
    go: a distribution's metadata with the entry points pyproject.toml declares."""
    import gfd

    points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"][
        "sglang.srt.plugins"
    ]
    site = tmp_path_factory.mktemp("site")
    info = site / f"gfd-{gfd.__version__}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: gfd\nVersion: {gfd.__version__}\n"
    )
    (info / "entry_points.txt").write_text(
        "[sglang.srt.plugins]\n" + "".join(f"{k} = {v}\n" for k, v in points.items())
    )
    sys.path.insert(0, str(site))
    env = {"SGLANG_PLUGINS": "gfd", "GFD_SGLANG_HICACHE": "1", "GFD_EMULATED_DEVICE": "1"}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    from sglang.srt import plugins as sp
    from sglang.srt.mem_cache.l2_transfer import L2TransferEngine

    unhooked = (L2TransferEngine.submit_host_to_device, L2TransferEngine.submit_device_to_host)
    sp.load_plugins()
    yield unhooked
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def test_the_plugin_is_found_by_entry_point_and_hooks_the_transfer_engine(plugins):
    from sglang.srt.mem_cache.l2_transfer import L2TransferEngine
    from sglang.srt.plugins.hook_registry import HookRegistry

    assert (
        L2TransferEngine.submit_host_to_device,
        L2TransferEngine.submit_device_to_host,
    ) != plugins
    hooked = {t for t in HookRegistry._patched if t.startswith("sglang.srt.mem_cache.l2_transfer.")}
    assert hooked == {
        "sglang.srt.mem_cache.l2_transfer.L2TransferEngine.submit_host_to_device",
        "sglang.srt.mem_cache.l2_transfer.L2TransferEngine.submit_device_to_host",
    }


def pools(kind, layout):
    """A device pool of random bytes and a host pool of the given layout (not pinned: no GPU)."""
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

    gen = torch.Generator().manual_seed(hash((kind, layout)) % (1 << 31))
    if kind == "mha":
        dev = MHATokenToKVPool(
            TOKENS, P, torch.bfloat16, H, D, LAYERS, "cpu", False, start_layer=0, end_layer=LAYERS
        )
        host = MHATokenToKVPoolHost(
            dev.get_device_pool_infos()[0].buffer_info,
            2,
            0,
            P,
            layout,
            device_capacity_tokens=dev.size,
            start_layer=0,
            end_layer=LAYERS,
            write_back_staging=dev.hicache_write_back_staging,
            pin_memory=False,
        )
        device_layers = [*dev.k_buffer, *dev.v_buffer]
    else:
        dev = MLATokenToKVPool(
            TOKENS,
            P,
            torch.bfloat16,
            KV_LORA,
            ROPE,
            LAYERS,
            "cpu",
            False,
            start_layer=0,
            end_layer=LAYERS,
        )
        host = MLATokenToKVPoolHost(
            dev.get_device_pool_infos()[0].buffer_info,
            2,
            0,
            P,
            layout,
            device_capacity_tokens=dev.size,
            start_layer=0,
            end_layer=LAYERS,
            target_layer_num=LAYERS,
            pin_memory=False,
        )
        device_layers = list(dev.kv_buffer)
    for t in device_layers:
        t.view(torch.int16).copy_(
            torch.randint(-32768, 32767, t.shape, dtype=torch.int16, generator=gen).view(
                t.view(torch.int16).shape
            )
        )
    return dev, host, device_layers


def host_page(host, layer, page, kind, part=0):
    """Layer ``layer``'s page ``page`` in the host pool (K (part 0) or V (1); MLA's latent)."""
    buf = (host.k_buffer, host.v_buffer)[part] if kind == "mha" else host.kv_buffer
    if host.layout == "layer_first":
        return buf[layer, page * P : (page + 1) * P]
    return buf[page, layer]


def same(a, b):
    """Byte-equal (random bytes seen as bf16 hold NaNs, which compare unequal)."""
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def tokens(pages):
    return torch.tensor(
        np.concatenate([np.arange(p * P, (p + 1) * P) for p in pages]), dtype=torch.int64
    )


def gfd_engine():
    from gfd import sglang as gs

    ((engine, _),) = [v for k, v in gs._engines.items() if k == -1]
    return engine


@pytest.mark.parametrize("layout", ["layer_first", "page_first_direct"])
@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_write_back_then_load_layer_by_layer(plugins, kind, layout):
    from gfd import testing
    from sglang.srt.mem_cache.l2_transfer import L2Transfer, L2TransferEngine

    dev, host, device_layers = pools(kind, layout)
    l2 = L2TransferEngine("direct")
    parts = 2 if kind == "mha" else 1
    dev_layer = (
        (lambda layer, part: (dev.k_buffer, dev.v_buffer)[part][layer])
        if kind == "mha"
        else (lambda layer, part: dev.kv_buffer[layer])
    )
    # Write-back: device pages 3, 9, 4, 12 to host pages 20, 1, 7, 30, every layer.
    dpages, hpages = [3, 9, 4, 12], [20, 1, 7, 30]
    from gfd import sglang as gs

    before = gs._engines[-1][0].stats()["transfers"] if -1 in gs._engines else 0
    l2.submit_device_to_host([L2Transfer(host, dev, tokens(hpages), tokens(dpages))])
    engine = gfd_engine()
    assert engine.stats()["transfers"] == before + 1  # one gfd transfer for every layer
    # The acknowledgement: the write-back's stream (the emulated device's default one here) goes
    # past it only once every byte is in host memory; nothing else is waited for.
    testing.stream_sync(engine)
    for layer in range(LAYERS):
        for part in range(parts):
            for h, d in zip(hpages, dpages):
                assert same(
                    host_page(host, layer, h, kind, part),
                    dev_layer(layer, part)[d * P : (d + 1) * P],
                ), (layer, part, h)
    # Load, layer by layer: host pages 1, 30 to device pages 14, 2; each layer's completion after
    # its own transfer, in order.
    events, start = [], engine.stats()["transfers"]

    def on_layer_done(layer):
        events.append((layer, engine.stats()["transfers"] - start))

    l2.submit_host_to_device(
        [L2Transfer(host, dev, tokens([1, 30]), tokens([14, 2]))],
        transfer_layer_id_max=LAYERS,
        on_layer_done=on_layer_done,
    )
    assert events == [(layer, layer + 1) for layer in range(LAYERS)]
    testing.stream_sync(engine)
    for layer in range(LAYERS):
        for part in range(parts):
            for h, d in zip([1, 30], [14, 2]):
                assert same(
                    dev_layer(layer, part)[d * P : (d + 1) * P],
                    host_page(host, layer, h, kind, part),
                )


def test_what_is_not_covered_goes_sglangs_way(plugins, monkeypatch, caplog):
    """A transfer of a pool gfd does not cover (a layer mapper here; likewise other pools,
    layouts, io backends or token runs that are not whole pages) reaches the pool's own methods
    unchanged."""
    from sglang.srt.mem_cache.l2_transfer import L2Transfer, L2TransferEngine

    dev, host, _ = pools("mha", "layer_first")
    seen = []
    monkeypatch.setattr(
        host, "load_to_device_per_layer", lambda *a, **k: seen.append(("load", a[3])), raising=False
    )
    monkeypatch.setattr(
        host,
        "backup_from_device_all_layer",
        lambda *a, **k: seen.append(("backup",)),
        raising=False,
    )
    l2 = L2TransferEngine("direct")
    before = gfd_engine().stats()["transfers"]
    mapped = L2Transfer(host, dev, tokens([1]), tokens([2]), layer_mapper=lambda layer: layer)
    l2.submit_host_to_device([mapped], transfer_layer_id_max=2)
    partial = L2Transfer(host, dev, tokens([1])[:5], tokens([2])[:5])  # not whole pages
    l2.submit_device_to_host([partial])
    l2k = L2TransferEngine("kernel")  # another io backend: said once in the log
    with caplog.at_level("WARNING", logger="gfd.sglang"):
        l2k.submit_device_to_host([L2Transfer(host, dev, tokens([1]), tokens([2]))])
    assert "--hicache-io-backend kernel stays SGLang's" in caplog.text
    assert seen == [("load", 0), ("load", 1), ("backup",), ("backup",)]
    assert gfd_engine().stats()["transfers"] == before


def test_a_different_sglang_is_refused_and_left_alone(plugins, monkeypatch, caplog):
    import sglang as sg
    from gfd import sglang as gs
    from sglang.srt.plugins.hook_registry import HookRegistry

    monkeypatch.setattr(sg, "__version__", "0.6.0")
    hooks = {k: list(v) for k, v in HookRegistry._hooks.items()}
    with caplog.at_level("WARNING", logger="gfd.sglang"):
        gs.plugin()
    assert (
        "SGLang 0.6.0 is not 0.5.23" in caplog.text
        and "keeps SGLang's own transfer path" in caplog.text
    )
    assert {k: list(v) for k, v in HookRegistry._hooks.items()} == hooks
    monkeypatch.setenv("GFD_SGLANG_HICACHE", "0")  # off: nothing at all, not even the check
    caplog.clear()
    gs.plugin()
    assert caplog.text == ""


@pytest.mark.parametrize("direction", ["write_back", "load"])
def test_index_tensors_of_unequal_lengths_are_refused_by_gfd_naming_both(plugins, direction):
    """gfd refuses them itself (SGLang's path would have been taken, with its own error), and on
    the emulated device the gfd.Error reaches the caller as itself: SGLang's transfer engine
    calls synchronize() on its stream when a transfer raises, which torch's CPU streams (its
    streams there) lack; gfd gives them one."""
    import gfd
    from sglang.srt.mem_cache.l2_transfer import L2Transfer, L2TransferEngine

    dev, host, _ = pools("mha", "layer_first")
    l2 = L2TransferEngine("direct")
    bad = L2Transfer(host, dev, tokens([1, 2]), tokens([3]))
    with pytest.raises(gfd.Error, match=r"host_indices has 32 entries, device_indices 16"):
        if direction == "write_back":
            l2.submit_device_to_host([bad])
        else:
            l2.submit_host_to_device([bad], transfer_layer_id_max=LAYERS)
    assert callable(getattr(torch.cpu.Stream, "synchronize", None))
    # The engine goes on.
    l2.submit_device_to_host([L2Transfer(host, dev, tokens([5]), tokens([6]))])
    from gfd import testing

    testing.stream_sync(gfd_engine())
    assert same(host_page(host, 0, 5, "mha"), dev.k_buffer[0][6 * P : 7 * P])


# -- lifetimes: SGLang letting go of its pools with gfd's transfers in flight ------------------------
# Each scenario runs in a process of its own (a crash fails the test instead of the suite), on the
# emulated device with every copy held 200 ms, so that the transfers are still in flight when
# SGLang lets go.

SCENARIO = f"""
import gc, os, sys, weakref
import torch
from sglang.srt.plugins.hook_registry import HookRegistry
import gfd, gfd.sglang as gs
from gfd import testing
gs.plugin()
HookRegistry.apply_hooks()
from sglang.srt.mem_cache.l2_transfer import L2Transfer, L2TransferEngine
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
P, TOKENS = {P}, {TOKENS}
dev = MHATokenToKVPool(TOKENS, P, torch.bfloat16, {H}, {D}, {LAYERS}, "cpu", False, start_layer=0, end_layer={LAYERS})
host = MHATokenToKVPoolHost(dev.get_device_pool_infos()[0].buffer_info, 2, 0, P, "layer_first",
                            device_capacity_tokens=dev.size, start_layer=0, end_layer={LAYERS},
                            write_back_staging=dev.hicache_write_back_staging, pin_memory=False)
for t in [*dev.k_buffer, *dev.v_buffer]:
    t.view(torch.int16).copy_(torch.arange(t.numel(), dtype=torch.int32).view(t.view(torch.int16).shape).to(torch.int16))
def tokens(pages):
    return torch.cat([torch.arange(p * P, (p + 1) * P) for p in pages])
l2 = L2TransferEngine("direct")
l2.submit_device_to_host([L2Transfer(host, dev, tokens([20, 1, 7, 30]), tokens([3, 9, 4, 12]))])
engine = gs._engines[-1][0]
assert engine.stats()["transfers"] == 1
memory = weakref.ref(host.kv_buffer)  # the pool's host memory (it owns its mapping)
"""


def run_scenario(tail, timeout=120):
    import subprocess

    env = {
        **os.environ,
        "SGLANG_PLUGINS": "gfd",
        "GFD_SGLANG_HICACHE": "1",
        "GFD_EMULATED_DEVICE": "copy_delay_us=200000",
    }
    r = subprocess.run(
        [sys.executable, "-c", SCENARIO + tail],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    assert r.returncode == 0, f"exit status {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def test_a_pool_dropped_with_a_write_back_in_flight_keeps_its_memory_until_the_bytes_are_placed():
    """The scheduler lets go of its pools (or replaces them) while a write-back is in flight: the
    transfer holds the pool's host memory until it is done (gfd's threads write into it
    meanwhile), and lets it go once done (at the next submission, or when the engine closes)."""
    out = run_scenario("""
del host, l2
gc.collect()
assert memory() is not None, "the host memory went while gfd's write-back was in flight"
testing.stream_sync(engine)   # the write-back's stream: done once every byte is placed
engine.close()
gc.collect()
assert memory() is None, "the host memory outlived the write-back"
print("ok")
""")
    assert out.strip().endswith("ok")


def test_a_process_ending_with_a_write_back_in_flight_exits_cleanly():
    """The scheduler's objects go and the process ends at once: gfd's exit hook drains the engine
    before the interpreter goes, and the memory the write-back writes is there until then."""
    out = run_scenario("""
del host, dev, l2
print("exiting")
""")
    assert out.strip().endswith("exiting")


def test_destroy_waits_for_gfds_transfers_on_the_pool():
    """A pool's destroy() unpins its memory: gfd's transfers on it end first."""
    out = run_scenario("""
in_flight = list(host._gfd_plan[1].in_flight)
assert in_flight and not all(t.done() for t in in_flight)
host.destroy()
assert all(t.done() for t in in_flight), "destroy() returned with gfd's transfers on the pool in flight"
print("ok")
""")
    assert out.strip().endswith("ok")

"""What gfd.sglang does on a CUDA GPU, on tensors shaped as SGLang's HiCache pools are (SGLang
itself is not needed: its pool shapes are rebuilt here): device K and V per layer (tokens, heads,
dim), host pools in the ``layer_first`` (2, layers, tokens, heads, dim) and
``page_first_direct`` (2, pages, layers, page, heads, dim) layouts, pinned; MLA's latent
(kv_dim 576) the same way with one buffer.

- A load as gfd.sglang issues it: one call over every layer's cache set on a load stream, an
  event recorded after each layer; a forward stream waits on layer l's event alone and copies
  layer l out, byte-identical to a reference copy (torch indexing) of the same pages.
- A write-back with ``stream_ordered_to_host``: an event recorded on the write-back stream after
  the call fires only once every byte is in host memory (checked before any wait on gfd's
  handles), byte-identical to the reference.

Needs torch with CUDA; skips with the reason otherwise (tests/sglang covers the plugin against
real SGLang on the emulated device).
"""

import gfd
import pytest

torch = pytest.importorskip("torch", reason="the GPU suite needs torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU: the SGLang-shaped GPU suite needs one", allow_module_level=True)

PAGE, PAGES, DEV_PAGES = 64, 96, 80


@pytest.fixture(scope="module")
def engine():
    e = gfd.Engine(device=torch.cuda.current_device(), stream_ordered_to_host=True)
    yield e
    e.close()


def shapes(kind):
    """(layers, per-token shape, parts): Llama-3-8B's K and V, or an MLA latent of 576 values."""
    return (32, (8, 128), 2) if kind == "mha" else (16, (1, 576), 1)


def pools(kind, layout, seed):
    layers, token, parts = shapes(kind)
    g = torch.Generator().manual_seed(seed)
    dev = [
        [
            torch.randint(-32768, 32767, (DEV_PAGES * PAGE, *token), generator=g, dtype=torch.int16)
            .view(torch.bfloat16)
            .cuda()
            for _ in range(layers)
        ]
        for _ in range(parts)
    ]
    if layout == "layer_first":
        host = torch.empty(
            (parts, layers, PAGES * PAGE, *token), dtype=torch.bfloat16, pin_memory=True
        )
    else:
        host = torch.empty(
            (parts, PAGES, layers, PAGE, *token), dtype=torch.bfloat16, pin_memory=True
        )
    host.view(torch.int16).copy_(
        torch.randint(-32768, 32767, host.shape, generator=g, dtype=torch.int16)
    )
    return dev, host


def host_pages(host, layout, part, layer):
    """Layer ``layer``'s host pages of ``part`` as (pages, page tokens * per-token) bytes rows."""
    if layout == "layer_first":
        return host[part, layer].view(PAGES, -1).view(torch.int8)
    return host[part, :, layer].flatten(1).view(torch.int8)  # rows a whole page-first page apart


def register(engine, dev, host, layout):
    layers, parts = len(dev[0]), len(dev)
    per_layer = []
    for layer in range(layers):
        hs = [host_pages(host, layout, p, layer) for p in range(parts)]
        ds = [dev[p][layer].view(DEV_PAGES, -1).view(torch.int8) for p in range(parts)]
        per_layer.append(engine.register_caches(hs, ds))
    every = engine.register_caches(
        [host_pages(host, layout, p, layer) for layer in range(layers) for p in range(parts)],
        [
            dev[p][layer].view(DEV_PAGES, -1).view(torch.int8)
            for layer in range(layers)
            for p in range(parts)
        ],
    )
    return per_layer, every


@pytest.mark.parametrize("layout", ["layer_first", "page_first_direct"])
@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_load_layer_by_layer_and_stream_ordered_write_back(engine, kind, layout):
    dev, host = pools(kind, layout, 7)
    per_layer, every = register(engine, dev, host, layout)
    layers, parts = len(dev[0]), len(dev)
    hp = torch.randperm(PAGES)[:64]
    dp = torch.randperm(DEV_PAGES)[:64]
    ref = [
        [host_pages(host, layout, p, layer)[hp].clone() for layer in range(layers)]
        for p in range(parts)
    ]

    # Load: one call, an event per layer on the load stream; the forward stream waits on each.
    load, forward = torch.cuda.Stream(), torch.cuda.Stream()
    events = [torch.cuda.Event() for _ in range(layers)]
    torch.cuda.synchronize()
    with torch.cuda.stream(load):
        engine.copy_blocks(
            per_layer,
            "to_device",
            hp.numpy(),
            dp.numpy(),
            stream=load,
            after_each=lambda k: events[k].record(load),
        )
    out = []
    with torch.cuda.stream(forward):
        for layer in range(layers):
            forward.wait_event(events[layer])
            out.append(
                [
                    dev[p][layer].view(DEV_PAGES, -1).view(torch.int8)[dp.cuda()].clone()
                    for p in range(parts)
                ]
            )
    forward.synchronize()
    for layer in range(layers):
        for p in range(parts):
            assert torch.equal(out[layer][p].cpu(), ref[p][layer]), f"load: layer {layer}, part {p}"

    # Write-back of other device pages: the event after the call acknowledges the bytes.
    hp2 = torch.randperm(PAGES)[:64]
    dp2 = torch.randperm(DEV_PAGES)[:64]
    expect = [
        [
            dev[p][layer].view(DEV_PAGES, -1).view(torch.int8)[dp2.cuda()].cpu()
            for layer in range(layers)
        ]
        for p in range(parts)
    ]
    torch.cuda.synchronize()
    back = torch.cuda.Stream()
    ack = torch.cuda.Event()
    t = engine.copy_blocks(every, "to_host", dp2.numpy(), hp2.numpy(), stream=back)
    ack.record(back)
    ack.synchronize()
    for layer in range(layers):
        for p in range(parts):
            assert torch.equal(host_pages(host, layout, p, layer)[hp2], expect[p][layer]), (
                f"write-back: layer {layer}, part {p}: the event fired before the bytes"
            )
    t.wait()

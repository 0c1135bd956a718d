"""Swapping a paged KV cache between a GPU and pinned host memory with gfd, from PyTorch.

A vLLM-style cache: for every layer a K and a V tensor of [blocks, block_tokens, heads,
head_dim] on the GPU, and the same in pinned host memory from gfd's HostPool (huge pages, the
GPU's NUMA node). The example

1. swaps a random set of GPU blocks out to host slots (every layer's K and V in ONE transfer),
2. overwrites those GPU blocks (a kernel queued right behind the swap-out: stream order suffices),
3. swaps them back in to other GPU blocks and checks every byte,
4. times swap-in and swap-out against torch's own per-block copies and against a plain
   index_select / index_copy_ gather through a pinned staging tensor.

Run: ``python examples/python/swap_kv.py`` (``--help`` for the sizes). Needs torch and a GPU.
"""

from __future__ import annotations

import argparse
import sys
import time

import gfd
import torch


def p50(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--gpu-blocks", type=int, default=2048)
    ap.add_argument("--cpu-blocks", type=int, default=4096)
    ap.add_argument("--block-tokens", type=int, default=16)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    ap.add_argument("--swap", type=int, default=256, help="blocks swapped per transfer")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--device", type=int, default=0)
    a = ap.parse_args(argv)

    if not torch.cuda.is_available():
        print("swap_kv: needs a CUDA GPU (torch.cuda.is_available() is False)", file=sys.stderr)
        return 2
    dev = torch.device("cuda", a.device)
    torch.cuda.set_device(dev)
    dtype = getattr(torch, a.dtype)
    block = (a.block_tokens, a.heads, a.head_dim)
    block_bytes = (
        torch.empty((), dtype=dtype).element_size() * a.block_tokens * a.heads * a.head_dim
    )

    # The caches: GPU [2, blocks, ...] per layer (K = [0], V = [1]); host in one gfd HostPool.
    gpu = [torch.randn((2, a.gpu_blocks) + block, device=dev).to(dtype) for _ in range(a.layers)]
    pool = gfd.HostPool(a.layers * 2 * a.cpu_blocks * block_bytes, device=a.device)
    host_all = torch.from_dlpack(pool.view((a.layers, 2, a.cpu_blocks) + block, dtype))
    assert host_all.is_pinned()
    cpu = [host_all[layer] for layer in range(a.layers)]
    gpu_k, gpu_v = [g[0] for g in gpu], [g[1] for g in gpu]
    cpu_k, cpu_v = [c[0] for c in cpu], [c[1] for c in cpu]
    print(
        f"swap_kv: {a.layers} layers x K,V, {a.gpu_blocks} GPU / {a.cpu_blocks} host blocks of "
        f"{block_bytes} bytes ({a.dtype}); host pool: {pool}"
    )

    engine = gfd.Engine(a.device)
    # Every layer's K and V described once; each transfer then passes only block ids.
    caches = engine.register_caches(cpu_k + cpu_v, gpu_k + gpu_v)
    g = torch.Generator().manual_seed(0)
    out_ids = torch.randperm(a.gpu_blocks, generator=g)[: a.swap]
    slots = torch.randperm(a.cpu_blocks, generator=g)[: a.swap]
    in_ids = torch.randperm(a.gpu_blocks, generator=g)[: a.swap]
    saved = [g_[:, out_ids].clone() for g_ in gpu]

    # 1. Swap out: GPU block out_ids[i] -> host slot slots[i], every layer's K and V, one transfer.
    t_out = engine.copy_blocks(caches, gfd.Direction.TO_HOST, out_ids, slots)
    # 2. Overwrite the GPU blocks at once: queued on the same (current) stream, this runs only
    #    after the swap-out has read them.
    for g_ in gpu:
        g_[:, out_ids] = 0
    # The host copy is complete only when the handle says so: the gather threads read host
    # memory when a swap-in is submitted, so wait before swapping the same slots back in.
    t_out.wait()
    # 3. Swap in to other GPU blocks, check every byte.
    engine.copy_blocks(caches, gfd.Direction.TO_DEVICE, slots, in_ids).wait()
    torch.cuda.current_stream().synchronize()
    for layer, g_ in enumerate(gpu):
        if not torch.equal(g_[:, in_ids], saved[layer]):
            print(f"swap_kv: MISMATCH in layer {layer}", file=sys.stderr)
            return 1
    print(
        f"swap_kv: swapped {a.swap} blocks x {a.layers} layers x K,V out and back in: every byte matches"
    )

    # 4. Timing, swap-in and swap-out of the same set (P50 of --iters, call to stream completion).
    nbytes = 2 * a.layers * a.swap * block_bytes
    s = torch.cuda.current_stream()
    # One pinned staging tensor per layer's K and V, so no copy waits for another to finish.
    staging = [
        torch.empty((a.swap,) + block, dtype=dtype, pin_memory=True) for _ in range(2 * a.layers)
    ]
    in_dev, out_dev = in_ids.to(dev), out_ids.to(dev)

    def gfd_in():
        engine.copy_blocks(caches, gfd.Direction.TO_DEVICE, slots, in_ids)

    def gfd_out():
        engine.copy_blocks(caches, gfd.Direction.TO_HOST, out_ids, slots).wait()

    sl, ii, oi = slots.tolist(), in_ids.tolist(), out_ids.tolist()

    def torch_blocks_in():
        for src, dst in zip(cpu_k + cpu_v, gpu_k + gpu_v):
            for i in range(a.swap):
                dst[ii[i]].copy_(src[sl[i]], non_blocking=True)

    def torch_blocks_out():
        for src, dst in zip(gpu_k + gpu_v, cpu_k + cpu_v):
            for i in range(a.swap):
                dst[sl[i]].copy_(src[oi[i]], non_blocking=True)

    def index_in():
        for src, dst, st in zip(cpu_k + cpu_v, gpu_k + gpu_v, staging):
            torch.index_select(src, 0, slots, out=st)  # CPU gather into pinned staging
            dst.index_copy_(0, in_dev, st.to(dev, non_blocking=True))

    def index_out():
        for src, st in zip(gpu_k + gpu_v, staging):
            st.copy_(src.index_select(0, out_dev), non_blocking=True)
        s.synchronize()
        for dst, st in zip(cpu_k + cpu_v, staging):
            dst.index_copy_(0, slots, st)

    def measure(fn):
        for _ in range(3):
            fn()
        s.synchronize()
        us = []
        for _ in range(a.iters):
            t0 = time.perf_counter()
            fn()
            s.synchronize()
            us.append((time.perf_counter() - t0) * 1e6)
        return p50(us)

    print(
        f"\n{nbytes / 2**20:.1f} MiB per swap ({2 * a.layers * a.swap} blocks of {block_bytes} bytes), "
        f"P50 of {a.iters}:"
    )
    print(f"{'method':<36}{'swap-in GB/s':>14}{'swap-out GB/s':>15}")
    results = {}
    for name, fi, fo in (
        ("gfd copy_blocks (one transfer)", gfd_in, gfd_out),
        ("torch per-block copy_", torch_blocks_in, torch_blocks_out),
        ("torch index_select + index_copy_", index_in, index_out),
    ):
        ti, to = measure(fi), measure(fo)
        results[name] = (nbytes / (ti * 1e3), nbytes / (to * 1e3))
        print(f"{name:<36}{results[name][0]:>14.2f}{results[name][1]:>15.2f}")
    base = results["gfd copy_blocks (one transfer)"]
    for name, (gi, go) in results.items():
        if not name.startswith("gfd"):
            print(f"gfd vs {name}: {base[0] / gi:.1f}x swap-in, {base[1] / go:.1f}x swap-out")
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

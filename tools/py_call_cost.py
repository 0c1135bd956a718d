"""What one Python call costs its caller, stage by stage, in the runtime's shape: 64 caches (32
layers x K, V), 4 KB blocks, 64 ids per call (4096 blocks), torch tensors on the GPU. Prints the
median host time of: swap_blocks (set found by its tensors), the same through the compiled core
with the stream given (no Python wrapper), copy_blocks on a registered set (no lookup) with the
mapping as a torch tensor and as a numpy array, the lookup's per-tensor reads alone (data_ptr and
nbytes, and shape, which it read before), and torch's current stream. Run on a GPU machine with
torch: python tools/py_call_cost.py"""
import statistics
import time

import torch

import gfd


def median_us(f, n=200):
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = f()
        ts.append(time.perf_counter() - t0)
        if isinstance(r, gfd.Transfer):
            r.wait()
        elif r is not None and hasattr(r, "wait"):
            r.wait()
    return statistics.median(ts) * 1e6


def main():
    tensors, blocks, block = 64, 1024, 4096
    host = [torch.from_dlpack(gfd.empty_pinned((blocks, block), "int8")) for _ in range(tensors)]
    dev = [torch.empty((blocks, block), dtype=torch.int8, device="cuda") for _ in range(tensors)]
    g = torch.Generator().manual_seed(0)
    m = torch.stack([torch.randperm(blocks, generator=g)[:64], torch.randperm(blocks, generator=g)[:64]], 1)
    mn = m.numpy()
    with gfd.Engine() as e:
        cs = e.register_caches(host, dev)
        s = int(torch.cuda.current_stream().cuda_stream)
        names = [("src", len(host))], [("dst", len(dev))]
        rows = [
            ("swap_blocks (set found by its tensors)", lambda: e.swap_blocks(host, dev, m)),
            ("core swap, stream given (no Python wrapper)",
             lambda: e._core.swap(host, dev, m, None, None, s, "swap_blocks", names[0], names[1])),
            ("copy_blocks on a registered set, torch mapping", lambda: e.copy_blocks(cs, m)),
            ("copy_blocks on a registered set, numpy mapping", lambda: e.copy_blocks(cs, mn)),
            ("data_ptr() of 128 tensors", lambda: [t.data_ptr() for t in host + dev]),
            ("shape of 128 tensors", lambda: [t.shape for t in host + dev]),
            ("nbytes of 128 tensors", lambda: [t.nbytes for t in host + dev]),
            ("torch.cuda.current_stream()", lambda: torch.cuda.current_stream().cuda_stream),
        ]
        for name, f in rows:
            f()
            torch.cuda.synchronize()
            print(f"{median_us(f):9.1f} us  {name}", flush=True)


if __name__ == "__main__":
    main()

"""gfd: fast scattered KV-cache block transfers between host memory and GPUs.

One :class:`Engine` per GPU moves many small blocks between (pinned) host memory and that GPU's
memory: CPU gather threads pack the blocks into a pinned staging ring, and large DMAs on
dedicated copy-engine streams carry them, so no SM is used. Transfers are ordered on a CUDA
stream like any other work on it (torch's current stream by default).

The calls serving runtimes make::

    import torch, gfd

    engine = gfd.Engine(device=0)
    gpu_k = torch.empty(num_blocks, block_size, heads, head_dim, dtype=torch.float16, device="cuda")
    cpu_k = torch.from_dlpack(gfd.empty_pinned((num_cpu_blocks, block_size, heads, head_dim), torch.float16))
    caches = engine.register_caches([cpu_k], [gpu_k])         # once: every layer's pair
    t = engine.copy_blocks(caches, gfd.Direction.TO_DEVICE, [3, 9], [0, 1])  # host 3 -> GPU 0, 9 -> 1
    # kernels queued on torch's current stream from here on see the blocks; no host wait
    t.wait()                                                  # or t.done() to poll

Tensors come in through DLPack (``__dlpack__``) or the CUDA array interface, so torch is not
needed to build or import gfd. Every exception gfd raises is a :class:`gfd.Error` with
``.code`` and ``.block``; a bad argument is a :class:`gfd.InvalidArgument` (also a ValueError),
one of the wrong type a :class:`gfd.InvalidType` (also a TypeError), raised before anything is
written (docs/python.md, "Bad input").

The classes and calls are the compiled module's (``gfd._gfd``, python/src); the package
re-exports them.
"""

from ._direction import Direction
from ._gfd import (
    Buffer,
    CacheSet,
    Engine,
    Error,
    HostPool,
    InvalidArgument,
    InvalidType,
    Transfer,
    backends,
    cuda_device_count,
    default_options,
    empty_pinned,
    option_names,
    stats_names,
)
from ._gfd import (
    __version__ as __version__,  # project(gfd VERSION ...) in CMakeLists.txt: the one source
)

__all__ = [
    "Engine",
    "CacheSet",
    "Direction",
    "Transfer",
    "Error",
    "InvalidArgument",
    "InvalidType",
    "HostPool",
    "Buffer",
    "empty_pinned",
    "option_names",
    "stats_names",
    "default_options",
    "backends",
    "cuda_device_count",
]

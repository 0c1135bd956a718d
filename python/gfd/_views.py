"""Byte arrays as addresses: what gfd's runtime integrations hand to register_caches (a window
of a runtime's tensor, a page array of a host pool) and how they read a tensor's geometry."""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from . import _gfd
from ._errors import _error, _type_error


@dataclass(frozen=True)
class Rows:
    """A 2-D byte array as addresses: ``rows`` rows of ``width`` bytes, row r at
    ``ptr + r * stride``."""

    ptr: int
    rows: int
    width: int
    stride: int


class View:
    """A 2-D byte view (rows, width) at an address with a row stride, handed to
    register_caches through the (CUDA) array interface; keeps ``owner`` alive."""

    def __init__(self, r: Rows, device: bool, owner: Any) -> None:
        d = {
            "shape": (r.rows, r.width),
            "typestr": "|i1",
            "data": (r.ptr, False),
            "strides": (r.stride, 1),
            "version": 3,
        }
        if device:
            d["stream"] = None  # registration reads no data: no stream to wait for
            self.__cuda_array_interface__ = d
        else:
            self.__array_interface__ = d
        self._owner = owner


def interface(t: Any) -> Optional[dict]:
    """The CUDA array interface or the array interface of ``t``, if it has one."""
    for attr in ("__cuda_array_interface__", "__array_interface__"):
        d = getattr(t, attr, None)
        if isinstance(d, dict):
            return d
    return None


def rows(t: Any, name: str) -> Rows:
    """A 2-D byte array's address, rows, row bytes and row stride: a torch tensor, a gfd.Buffer,
    or an object with the CUDA array interface or the array interface (numpy); its rows must
    be contiguous."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(t, torch.Tensor):
        shape, item = tuple(t.shape), t.element_size()
        strides = tuple(s * item for s in t.stride())
        ptr = t.data_ptr()
    elif isinstance(t, _gfd.Buffer) and interface(t) is None:
        shape, item = tuple(t.shape), t.itemsize
        strides = (shape[1] * item, item) if len(shape) == 2 else ()
        ptr = t.ptr
    else:
        d = interface(t)
        if d is None:
            raise _type_error(
                f"{name}: expected a torch tensor, a gfd.Buffer or an object with the (CUDA) "
                f"array interface, got {type(t).__name__}"
            )
        shape = tuple(d.get("shape", ()))
        try:
            item = int(np.dtype(d.get("typestr")).itemsize)
        except (TypeError, ValueError) as e:
            raise _type_error(f"{name}: cannot tell its element type ({d.get('typestr')!r})") from e
        strides = d.get("strides") or ((shape[1] * item, item) if len(shape) == 2 else ())
        ptr = int(d["data"][0])
    if len(shape) != 2:
        raise _error(f"{name}: expected a 2-D (blocks, bytes) array, got shape {shape}")
    if item != 1:
        raise _error(f"{name}: expected a byte array (int8 or uint8), got {item}-byte elements")
    n, width = (_gfd._int(x, f"{name}: shape[{i}]", 0, (1 << 62)) for i, x in enumerate(shape))
    if width > 1 and strides[1] != 1:
        raise _error(f"{name}: the bytes of a row must be contiguous (strides {strides})")
    stride = int(strides[0]) if n > 1 else width
    if stride < width:
        raise _error(f"{name}: rows of {width} bytes overlap (row stride {stride})")
    return Rows(ptr, n, width, stride)

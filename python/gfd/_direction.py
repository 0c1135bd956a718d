"""gfd.Direction: which way a transfer moves blocks."""

from __future__ import annotations

import enum


class Direction(str, enum.Enum):
    """Which way a transfer moves blocks. The strings ``"to_device"`` and ``"to_host"`` are
    accepted wherever a direction is taken."""

    TO_DEVICE = "to_device"  #: host memory to the engine's GPU
    TO_HOST = "to_host"  #: the engine's GPU to host memory

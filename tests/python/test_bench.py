"""python -m gfd.bench runs end to end on the emulated device (the GPU run is in test_gpu.py)."""

import os
import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.mark.parametrize("direction", ["h2d", "d2h"])
def test_bench_on_the_emulated_device(direction):
    r = subprocess.run([sys.executable, "-m", "gfd.bench", "--emulated", "--blocks", "256", "--iters", "20",
                        "--warmup", "1", "--backends", "gather,per_block", "--pool-bytes", str(64 << 20),
                        "--direction", direction, "--dst", "scattered"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT, env=dict(os.environ))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "contiguous copy" in r.stdout and "host-only" in r.stdout
    lines = [l for l in r.stdout.splitlines() if l.startswith("gfd ")]
    assert len(lines) == 2 and all(l.rstrip().endswith("yes") for l in lines), r.stdout

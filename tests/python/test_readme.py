"""The README's Python examples run as they are written: the one without a GPU everywhere, the
one with torch and a GPU where both are present."""

import os
import re
import subprocess
import sys

import gfd
import pytest
from conftest import ROOT


def readme_examples():
    with open(os.path.join(ROOT, "README.md")) as f:
        return re.findall(r"```python\n(.*?)```", f.read(), re.DOTALL)


def example(needle):
    hits = [code for code in readme_examples() if needle in code]
    assert len(hits) == 1, f"the README has {len(hits)} Python examples with {needle!r}"
    return hits[0]


def run(code):
    r = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        env=dict(os.environ),
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_example_without_a_gpu_runs_as_written():
    run(example("gfd.testing.emulated_engine()"))


def test_the_example_with_torch_and_a_gpu_runs_as_written():
    try:
        import torch  # noqa: F401
    except ImportError:
        pytest.skip("torch is not installed: the README's GPU example needs it")
    if gfd.cuda_device_count() == 0:
        pytest.skip("no CUDA GPU here: the README's GPU example needs one")
    run(example("import torch, gfd"))

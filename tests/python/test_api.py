"""Engine construction, options, stats, lifetime and errors (emulated device; no GPU needed)."""

import os
import re
import subprocess
import sys

import gfd
import pytest
from conftest import ROOT, small_options
from gfd import testing


def header_fields(path, struct):
    """Field names of `struct` in a public header, in declaration order."""
    text = open(os.path.join(ROOT, path)).read()
    body = text[text.index("struct " + struct + " {") :]
    body = body[: body.index("\n};")]
    names = []
    for line in body.splitlines():
        line = line.split("///")[0].split("//")[0].strip()
        m = re.match(r"^(?!static|using|return)[\w:<>, ]+?\s+(\w+)\s*(=.*)?;$", line)
        if m and "(" not in line:
            names.append(m.group(1))
    return names


def test_every_option_is_covered():
    # The compiled module also checks the count at compile time; this names what is missing.
    assert list(gfd.option_names) == header_fields("include/gfd/options.hpp", "EngineOptions")
    assert set(gfd.default_options) == set(gfd.option_names)


def test_every_stat_is_covered(engine):
    assert list(gfd.stats_names) == header_fields("include/gfd/stats.hpp", "EngineStats")
    s = engine.stats()
    assert list(s) == list(gfd.stats_names)
    assert s["transfers"] == 0 and s["bytes"] == 0
    assert s["hugepages"] in ("hugetlb", "transparent", "none")
    assert isinstance(s["cpus"], list)


def test_options_by_name_round_trip():
    e = testing.emulated_engine(
        **small_options(spin_us=77, check_overlaps=False, backend="per_block", staging_bytes="2M")
    )
    with e:
        o = e.options()
        assert set(o) == set(gfd.option_names)
        assert o["spin_us"] == 77
        assert o["check_overlaps"] is False
        assert o["backend"] == "per_block"
        assert o["staging_bytes"] == 2 << 20
        assert e.device == 0
        assert "per_block" in repr(e)


def test_unknown_option_is_a_type_error():
    with pytest.raises(TypeError, match="unknown option 'spin_uss'.*spin_us"):
        testing.emulated_engine(spin_uss=1)


@pytest.mark.parametrize(
    "name,value",
    [
        ("spin_us", 1.5),
        ("check_overlaps", "yes"),
        ("check_overlaps", 1),
        ("staging_bytes", 1.5),
        ("backend", 3),
        ("cpus", 3),
    ],
)
def test_option_of_the_wrong_type(name, value):
    with pytest.raises(TypeError, match=name):
        testing.emulated_engine(**{name: value})


@pytest.mark.parametrize(
    "name,value",
    [
        ("copy_streams", 0),
        ("backend", "fastest"),
        ("staging_bytes", "12Q"),
        ("spin_us", -1),
        ("staging_writes", "sideways"),
        ("cpus", "3-x"),
        ("spin_us", "fast"),
    ],
)
def test_bad_option_value_names_it(name, value):
    with pytest.raises(gfd.Error) as info:
        testing.emulated_engine(**small_options(**{name: value}))
    assert info.value.code == "invalid_argument"
    assert info.value.block is None
    assert name.split("_")[0] in str(info.value)


def test_error_is_a_runtime_error_with_code_and_block():
    assert issubclass(gfd.Error, RuntimeError)
    from gfd._errors import _error

    e = _error("x: y")
    assert e.code == "invalid_argument" and e.block is None and str(e) == "x: y"


def test_close_is_idempotent_and_calls_after_close_fail(engine):
    with engine as e:
        assert not e.closed
    assert engine.closed
    engine.close()
    with pytest.raises(gfd.Error) as info:
        engine.stats()
    assert info.value.code == "shutdown"
    with pytest.raises(gfd.Error):
        engine.copy_to_device([], [], [])
    assert "closed" in repr(engine)


def test_backends_listed():
    assert gfd.backends() == ["gather", "batch_async", "per_block", "zero_copy_kernel"]


@pytest.mark.skipif(gfd.cuda_device_count() > 0, reason="this machine has a GPU")
def test_real_engine_without_gpu_fails_clearly():
    with pytest.raises(gfd.Error) as info:
        gfd.Engine(0)
    assert info.value.code != "invalid_argument"
    assert str(info.value)


def test_from_env_names_a_bad_variable(monkeypatch):
    monkeypatch.setenv("GFD_SPIN_US", "soon")
    with pytest.raises(gfd.Error) as info:
        gfd.Engine.from_env()
    assert "GFD_SPIN_US" in str(info.value)


def test_engines_are_closed_at_exit():
    # An engine left open with a transfer in flight: the interpreter exits cleanly.
    code = (
        "import gfd, numpy as np\n"
        "from gfd import testing as T\n"
        "e = T.emulated_engine(copy_delay_us=20000)\n"
        "src = T.pinned_buffer(e, (8, 4096))\n"
        "dst = T.device_buffer(e, (8, 4096))\n"
        "np.asarray(src)[:] = 7\n"
        "c = e.register_caches([src], [dst])\n"
        "t = e.copy_blocks(c, 'to_device', list(range(8)), list(range(8)))\n"
        "del t\n"
        "print('ok')\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_buffers_dropped_with_copies_in_flight_at_exit():
    # Blocks large enough to go to the copy engine as they are, queued on a stream of the
    # caller's behind slow emulated copies; the script ends without waiting and its buffers go in
    # whatever order the interpreter drops them: as with cudaFree, a buffer is unmapped only once
    # the copies queued on it ran, and the process exits cleanly.
    code = (
        "import numpy as np\n"
        "from gfd import testing as T\n"
        "e = T.emulated_engine(copy_delay_us=2000)\n"
        "s = T.create_stream(e)\n"
        "hosts = [T.pinned_buffer(e, (4, 1 << 20)) for _ in range(4)]\n"
        "devs = [T.device_buffer(e, (4, 1 << 20)) for _ in range(4)]\n"
        "sets = [e.register_caches([h], [d]) for h, d in zip(hosts, devs)]\n"
        "e.copy_blocks(sets, 'to_device', [0, 1, 2, 3], [3, 2, 1, 0], stream=s)\n"
        "print('ok')\n"
    )
    r = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ),
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "ok"


def test_cpus_option_places_the_gather_threads():
    with testing.emulated_engine(**small_options(cpus="0")) as e:
        assert e.options()["cpus"] == "0"
        assert e.stats()["cpus"] == [0]

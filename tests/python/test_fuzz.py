"""Property-based tests of the bad-input contract (docs/python.md, "Bad input"), with Hypothesis.

Each test builds a valid call to a public entry point, mutates it (element types and dtypes,
ranges, shapes, lengths, duplicates, overlaps, huge sizes, wrong directions and streams) and
checks the promise on the emulated device: either a gfd.Error with code 'invalid_argument' whose
message names the argument, and the sentinel bytes of every buffer untouched; or no error, the
call valid by an independent Python oracle and exactly the right bytes moved. The engine must
stay usable after every example, each call must return quickly, and memory must stay bounded.

The number of examples per test is fixed for CI (a Hypothesis profile, derandomized, so every
run tries the same calls); GFD_FUZZ_EXAMPLES=5000 runs a longer, randomized search.
"""

import os
import resource
import time

import numpy as np
import pytest

hypothesis = pytest.importorskip(
    "hypothesis", reason="hypothesis is not installed (pip install hypothesis)"
)
import gfd  # noqa: E402
from gfd import testing  # noqa: E402
from gfd.kv_worker import KVTransferWorker  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

_LONG = os.environ.get("GFD_FUZZ_EXAMPLES")
settings.register_profile(
    "gfd-ci",
    max_examples=200,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
settings.register_profile(
    "gfd-long",
    max_examples=int(_LONG or 0) or 1,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
FUZZ = settings.get_profile("gfd-long" if _LONG else "gfd-ci")

BLOCKS, BLOCK = 16, 512
# A hang guard, not a speed check: every call here touches at most 16 blocks of 512 bytes, so a
# call still running after this long is stuck or doing work in proportion to a bad size.
MAX_CALL_SECONDS = 60.0
SENTINEL = 0xEE


# ---- shared state: one engine and one set of caches for every example --------------------------


class State:
    def __init__(self):
        self.engine = testing.emulated_engine(
            staging_bytes=1 << 20,
            slot_bytes=256 << 10,
            first_chunk_bytes=64 << 10,
            piece_bytes=16 << 10,
            gather_threads=2,
            copy_streams=2,
            spin_us=20,
        )
        self.host_buf = testing.pinned_buffer(self.engine, (BLOCKS, BLOCK), "uint8")
        self.dev_buf = testing.device_buffer(self.engine, (BLOCKS, BLOCK), "uint8")
        self.host, self.dev = np.asarray(self.host_buf), np.asarray(self.dev_buf)
        self.caches = self.engine.register_caches(self.host_buf, self.dev_buf)
        self.reset()

    def reset(self):
        self.host[:] = (
            np.arange(BLOCKS, dtype=np.uint8)[:, None] * 7
            + np.arange(BLOCK, dtype=np.uint8)[None, :]
        ) | 1
        self.dev[:] = SENTINEL

    def usable(self):
        """A small valid transfer still works (the engine survived the example)."""
        self.engine.copy_blocks(self.caches, "to_device", [0], [0]).wait(timeout=30)
        assert (self.dev[0] == self.host[0]).all()


_state = None


def state():
    global _state
    if _state is None or _state.engine.closed:
        _state = State()
    _state.reset()
    return _state


@pytest.fixture(scope="module", autouse=True)
def _memory_bounded():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    yield
    grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) >> 10  # KiB -> MiB
    assert grown < 512, f"the fuzz suite grew the process by {grown} MiB"


def timed(fn, *args, **kw):
    t0 = time.perf_counter()
    try:
        return fn(*args, **kw)
    finally:
        assert time.perf_counter() - t0 < MAX_CALL_SECONDS, (
            f"{getattr(fn, '__name__', fn)} took too long"
        )


def expect_rejected(e, names):
    assert isinstance(e, gfd.Error), f"{type(e).__name__} is not a gfd.Error: {e}"
    assert e.code == "invalid_argument", e
    msg = str(e)
    assert any(n in msg for n in names), f"the message names none of {names}: {msg}"


# ---- integers as the oracle sees them ------------------------------------------------------------

BAD_SCALARS = [
    True,
    False,
    0.5,
    1.0,
    None,
    "1",
    b"1",
    2**64,
    2**63,
    2**70,
    -1,
    -(2**63) - 1,
    np.float32(1),
    np.bool_(True),
    [1],
    (1,),
    object(),
]


def int_values(value):
    """The ints of a 1-D integer array or list, or None when the binding must reject its type or
    shape (bool, float, other objects, nested)."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in "iu" or value.ndim != 1:
            return None
        return [int(x) for x in value]
    if isinstance(value, (list, tuple)):
        out = []
        for x in value:
            if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer)):
                return None
            out.append(int(x))
        return out
    return None


def as_container(values, kind):
    if kind == "list":
        return list(values)
    if kind == "tuple":
        return tuple(values)
    return np.array(values, dtype=kind)


CONTAINERS = [
    "list",
    "tuple",
    "int64",
    "int32",
    "uint64",
    "uint32",
    "int16",
    "uint8",
    "int8",
    "float64",
    "float32",
    "bool",
]


@st.composite
def id_lists(draw, n_src, n_dst):
    """A valid (src_ids, dst_ids) pair, then zero or more mutations; returns the arguments."""
    n = draw(st.integers(0, min(n_src, n_dst)))
    src = draw(st.permutations(range(n_src)))[:n]
    dst = draw(st.permutations(range(n_dst)))[:n]
    args = [list(src), list(dst)]
    for _ in range(draw(st.integers(0, 2))):
        which = draw(st.integers(0, 1))
        m = draw(st.sampled_from(["element", "value", "length", "duplicate", "shape", "none"]))
        a = args[which]
        if not isinstance(a, list):
            continue  # replaced by a non-list already
        if m == "element" and len(a):
            a[draw(st.integers(0, len(a) - 1))] = draw(st.sampled_from(BAD_SCALARS))
        elif m == "value" and len(a):
            a[draw(st.integers(0, len(a) - 1))] = draw(
                st.sampled_from(
                    [
                        BLOCKS,
                        BLOCKS + 1,
                        2**31,
                        2**32,
                        2**62,
                        -2,
                        np.int64(-5),
                        np.uint64(2**63 + 1),
                        np.int32(3),
                    ]
                )
            )
        elif m == "length":
            if len(a) and draw(st.booleans()):
                a.pop()
            else:
                a.append(draw(st.integers(0, BLOCKS - 1)))
        elif m == "duplicate" and len(a) > 1:
            a[-1] = a[0]
        elif m == "shape":
            args[which] = draw(
                st.sampled_from([None, 3, "ids", [[0, 1]], np.zeros((2, 2), np.int64), {0: 1}])
            )
    out = []
    for a in args:
        if isinstance(a, list) and all(
            isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) for x in a
        ):
            kind = draw(st.sampled_from(CONTAINERS))
            try:
                a = as_container(a, kind)
            except (OverflowError, ValueError, TypeError):
                pass  # a value the dtype cannot hold: the list stays
        out.append(a)
    return out


# ---- copy_blocks ---------------------------------------------------------------------------------


@FUZZ
@given(
    ids=id_lists(BLOCKS, BLOCKS),
    direction=st.sampled_from(
        [
            "to_device",
            "to_host",
            gfd.Direction.TO_DEVICE,
            gfd.Direction.TO_HOST,
            "sideways",
            None,
            1,
            True,
            b"to_host",
        ]
    ),
    stream=st.sampled_from([None, None, None, -1, 2**64, 1.5, "0", True]),
)
def test_copy_blocks(ids, direction, stream):
    s = state()
    src, dst = ids
    before_h, before_d = s.host.copy(), s.dev.copy()
    sv, dv = int_values(src), int_values(dst)
    way = {"to_device": 1, "to_host": -1}.get(
        direction if isinstance(direction, str) else getattr(direction, "value", None)
    )
    valid = (
        way is not None
        and stream is None
        and sv is not None
        and dv is not None
        and len(sv) == len(dv)
        and all(0 <= x < BLOCKS for x in sv + dv)
        and len(set(dv)) == len(dv)
    )
    try:
        t = timed(s.engine.copy_blocks, s.caches, direction, src, dst, stream=stream)
    except Exception as e:  # noqa: BLE001 - checked
        expect_rejected(e, ["src_ids", "dst_ids", "direction", "stream"])
        assert not valid, f"a valid call was rejected: {e}"
        assert (s.host == before_h).all() and (s.dev == before_d).all(), (
            "a rejected call wrote bytes"
        )
        s.usable()
        return
    assert valid, (
        f"an invalid call was accepted: {direction!r}, {src!r}, {dst!r}, stream={stream!r}"
    )
    t.wait(timeout=30)
    want_h, want_d = before_h.copy(), before_d.copy()
    if way > 0:
        want_d[dv] = before_h[sv]
    else:
        want_h[dv] = before_d[sv]
    assert (s.host == want_h).all() and (s.dev == want_d).all()
    s.usable()


# ---- copy_to_device / copy_to_host ---------------------------------------------------------------


@FUZZ
@given(
    ids=id_lists(BLOCKS, BLOCKS),
    to_device=st.booleans(),
    size=st.sampled_from(["block", "block", "scalar", "list_bad", "huge", "zero_one", "past_end"]),
    pointer=st.sampled_from(
        [None, None, None, 0, 0x1000, 2**47, 2**63, 2**64 - 8, "dev_as_host", "host_as_dev"]
    ),
)
def test_block_list(ids, to_device, size, pointer):
    s = state()
    src_ids, dst_ids = ids
    sv, dv = int_values(src_ids), int_values(dst_ids)
    before_h, before_d = s.host.copy(), s.dev.copy()
    host_base, dev_base = s.host_buf.ptr, s.dev_buf.ptr
    valid = (
        sv is not None
        and dv is not None
        and len(sv) == len(dv)
        and all(0 <= x < BLOCKS for x in sv + dv)
    )
    if valid:
        h_ids, d_ids = (sv, dv) if to_device else (dv, sv)
        hp = [host_base + i * BLOCK for i in h_ids]
        dp = [dev_base + i * BLOCK for i in d_ids]
        valid = len(set(dv)) == len(dv)  # destinations overlap otherwise
    else:
        hp, dp = (
            (src_ids, dst_ids) if to_device else (dst_ids, src_ids)
        )  # what the binding must reject
        hp = list(hp) if isinstance(hp, (list, tuple)) else hp
        dp = list(dp) if isinstance(dp, (list, tuple)) else dp
    sizes = BLOCK
    if size == "block":
        sizes = [BLOCK] * (len(hp) if isinstance(hp, (list, np.ndarray)) else 1)
    elif size == "list_bad":
        sizes, valid = [BLOCK, 1.5], False
    elif size == "huge":
        sizes, valid = 2**64 - 1, False  # rejected even for an empty list
    elif size == "zero_one":
        sizes = 0  # a block of no bytes is an error; no blocks at all is not
        valid = valid and isinstance(hp, list) and len(hp) == 0
    elif size == "past_end" and isinstance(hp, list) and len(hp):
        sizes, valid = BLOCK * (BLOCKS + 1), False
    if (
        isinstance(hp, list)
        and isinstance(dp, list)
        and len(hp)
        and len(dp)
        and pointer is not None
    ):
        valid = False
        if pointer == "dev_as_host":
            hp[0] = dev_base
        elif pointer == "host_as_dev":
            dp[0] = host_base
        else:
            hp[0] = pointer
    src, dst = (hp, dp) if to_device else (dp, hp)
    call = s.engine.copy_to_device if to_device else s.engine.copy_to_host
    try:
        t = timed(call, src, dst, sizes)
    except Exception as e:  # noqa: BLE001 - checked
        expect_rejected(e, ["src_ptrs", "dst_ptrs", "sizes", "block"])
        assert not valid, f"a valid call was rejected: {e}"
        assert (s.host == before_h).all() and (s.dev == before_d).all(), (
            "a rejected call wrote bytes"
        )
        s.usable()
        return
    assert valid, f"an invalid call was accepted: {src!r}, {dst!r}, {sizes!r}"
    t.wait(timeout=30)
    want_h, want_d = before_h.copy(), before_d.copy()
    if size != "zero_one":
        if to_device:
            want_d[d_ids] = before_h[h_ids]
        else:
            want_h[h_ids] = before_d[d_ids]
    assert (s.host == want_h).all() and (s.dev == want_d).all()
    s.usable()


# ---- register_caches -----------------------------------------------------------------------------


@FUZZ
@given(
    host=st.sampled_from(["host", "dev", None, 3, "str", "list2", "empty", "float"]),
    dev=st.sampled_from(["dev", "host", None, 3, "str", "list1", "empty", "other_dtype", "narrow"]),
)
def test_register_caches(host, dev):
    s = state()
    e = s.engine
    table = {
        "host": s.host_buf,
        "dev": s.dev_buf,
        "str": "cache",
        "list2": [s.host_buf, s.host_buf],
        "empty": [],
        "list1": [s.dev_buf],
        "float": 1.5,
        "other_dtype": testing.device_buffer(e, (BLOCKS, BLOCK // 2), "float16"),
        "narrow": testing.device_buffer(e, (BLOCKS, BLOCK // 2), "uint8"),
    }
    h, d = table.get(host, host), table.get(dev, dev)
    valid = (host, dev) in (("host", "dev"), ("host", "list1"))
    try:
        cs = timed(e.register_caches, h, d)
    except Exception as ex:  # noqa: BLE001 - checked
        expect_rejected(ex, ["host", "device"])
        assert not valid, f"a valid registration was rejected: {ex}"
        s.usable()
        return
    assert valid, f"an invalid registration was accepted: {host!r}, {dev!r}"
    assert cs.pairs == 1 and cs.bytes_per_id == BLOCK
    s.usable()


# ---- HostPool and view ---------------------------------------------------------------------------

SIZES = st.one_of(
    st.integers(-(2**70), 2**70).filter(lambda b: not (8 << 20 < b <= 1 << 46)),
    st.integers(1, 8 << 20),
    st.sampled_from(BAD_SCALARS),
)


@FUZZ
@given(
    nbytes=SIZES,
    numa=st.sampled_from([-2, -2, -1, 5000, -3, 1.0, None, True]),
    register=st.sampled_from([False, False, 0, None, "no"]),
)
def test_host_pool(nbytes, numa, register):
    valid = (
        type(nbytes) is int
        and 1 <= nbytes <= 1 << 46
        and numa in (-2, -1)
        and type(numa) is int
        and register is False
    )
    try:
        pool = timed(gfd.HostPool, nbytes, device=-1, numa_node=numa, register=register)
    except Exception as e:  # noqa: BLE001 - checked
        if isinstance(e, gfd.Error) and e.code != "invalid_argument":
            assert valid or numa == 5000  # the system refused the memory: still a gfd.Error
            return
        expect_rejected(e, ["bytes", "numa_node", "register"])
        assert not valid or numa == 5000, f"a valid pool was rejected: {e}"
        return
    assert valid, f"an invalid pool was accepted: {nbytes!r}, {numa!r}, {register!r}"
    assert pool.bytes >= nbytes and pool.bytes % (2 << 20) == 0 and pool.data % (2 << 20) == 0


_POOL = None


@FUZZ
@given(
    shape=st.one_of(
        st.lists(
            st.one_of(
                st.integers(-4, 4096),
                st.sampled_from([2**62, 2**63, 2**64, -(2**63)] + BAD_SCALARS),
            ),
            max_size=4,
        ),
        st.integers(-5, 1 << 22),
        st.sampled_from([None, "4", 2.0]),
    ),
    dtype=st.sampled_from(["uint8", "float16", "int64", "bfloat16", "complex64", 3, None]),
    offset=st.one_of(st.integers(-1, 3 << 20), st.sampled_from([2**64, 1.0, True, None])),
)
def test_view(shape, dtype, offset):
    global _POOL
    if _POOL is None:
        _POOL = gfd.HostPool(2 << 20, device=-1, register=False)
    item = {"uint8": 1, "float16": 2, "int64": 8, "bfloat16": 2}.get(dtype)
    dims = [shape] if isinstance(shape, int) and not isinstance(shape, bool) else shape
    ok_dims = isinstance(dims, list) and all(type(x) is int and 0 <= x < 2**63 for x in dims)
    n = item or 0
    for x in dims if ok_dims else []:
        n *= x
    valid = (
        ok_dims
        and item is not None
        and type(offset) is int
        and offset >= 0
        and offset % item == 0
        and offset + n <= _POOL.bytes
    )
    try:
        buf = timed(_POOL.view, shape, dtype, offset)
    except Exception as e:  # noqa: BLE001 - checked
        expect_rejected(e, ["shape", "dtype", "offset"])
        assert not valid, f"a valid view was rejected: {e}"
        return
    assert valid, f"an invalid view was accepted: {shape!r}, {dtype!r}, {offset!r}"
    assert buf.nbytes == n and buf.ptr == _POOL.data + offset


# ---- KVTransferWorker.submit ---------------------------------------------------------------------

_WORKER = None


def worker():
    global _WORKER
    s = state()
    if _WORKER is None or _WORKER[0] is not s.engine:
        gpu = [testing.device_buffer(s.engine, (BLOCKS, 256), "int8") for _ in range(2)]
        _WORKER = (
            s.engine,
            KVTransferWorker(s.engine, gpu, [[0, 1]], 2, 8),
            [np.asarray(g) for g in gpu],
        )
    w, gpu = _WORKER[1], _WORKER[2]
    for t in range(2):
        w.host_rows(t)[:] = (np.arange(16, dtype=np.int8)[:, None] + 1) * (t + 1)
        gpu[t][:] = -1
    return w, gpu


@FUZZ
@given(
    ids=id_lists(8, BLOCKS),
    to_device=st.sampled_from([True, False, True, 1, None, np.bool_(False)]),
    group=st.sampled_from(["none", "exact", "float", "negative", "bool", "short", "huge"]),
)
def test_submit(ids, to_device, group):
    w, gpu = worker()
    chunks, blocks = ids  # chunk i holds blocks 2i and 2i + 1 (blocks_per_chunk 2)
    cv, bv = int_values(chunks), int_values(blocks)
    host_before = [w.host_rows(t).copy() for t in range(2)]
    gpu_before = [g.copy() for g in gpu]
    n = len(bv) if bv is not None else 0
    sizes = {
        "none": None,
        "exact": [n],
        "float": [float(n)],
        "negative": [-1],
        "bool": [True],
        "short": [],
        "huge": [2**64],
    }[group]
    flag_ok = isinstance(to_device, (bool, np.bool_))
    shape_ok = (
        cv is not None and bv is not None and -(-n // 2) == len(cv) and group in ("none", "exact")
    )
    in_range = shape_ok and all(0 <= c < 8 for c in cv) and all(0 <= b < BLOCKS for b in bv)
    valid = flag_ok and in_range
    try:
        timed(w.submit, 7, to_device, chunks, blocks, sizes, None if sizes is None else [0])
    except Exception as e:  # noqa: BLE001 - checked
        expect_rejected(
            e, ["job_id", "to_device", "chunk_ids", "gpu_block_ids", "group_sizes", "block_indices"]
        )
        assert not valid, f"a valid job was rejected: {e}"
        assert all((w.host_rows(t) == b).all() for t, b in zip(range(2), host_before))
        assert all((g == b).all() for g, b in zip(gpu, gpu_before))
        return
    assert valid, f"an invalid job was accepted: {to_device!r}, {chunks!r}, {blocks!r}, {sizes!r}"
    w.wait([7])
    (r,) = w.get_finished()
    rows = [2 * c + j for c in cv for j in range(2)][:n]
    dst = bv if to_device else rows
    if len(set(dst)) != len(dst):  # a destination given twice: found by the transfer, nothing moved
        assert not r.success and isinstance(r.error, gfd.Error)
        assert all((w.host_rows(t) == b).all() for t, b in zip(range(2), host_before))
        assert all((g == b).all() for g, b in zip(gpu, gpu_before))
        return
    assert r.success, r.error
    for t in range(2):
        if to_device:
            want = gpu_before[t].copy()
            want[bv] = host_before[t][rows]
            assert (gpu[t] == want).all()
        else:
            want = host_before[t].copy()
            want[rows] = gpu_before[t][bv]
            assert (w.host_rows(t) == want).all()


# ---- Engine options ------------------------------------------------------------------------------


@settings(FUZZ, max_examples=min(FUZZ.max_examples, 25))
@given(
    name=st.sampled_from(list(gfd.option_names) + ["spin_uss", "host_direct"]),
    value=st.one_of(
        st.sampled_from(BAD_SCALARS + ["64M", "fast", "", "-1", "1G", 0, 1, 4, 2**31]),
        st.integers(-(2**40), 2**40),
    ),
)
def test_engine_options(name, value):
    if name in ("device", "cpus", "numa_node", "use_all_local_cpus") or (
        name.endswith("bytes") and type(value) is int and value > 1 << 30
    ):
        return  # options that would need a device or memory this machine may not have
    try:
        e = timed(testing.emulated_engine, **{name: value})
    except Exception as ex:  # noqa: BLE001 - checked
        expect_rejected(ex, [name, "staging", "slot", "chunk", "piece"])
        return
    try:
        assert name in gfd.option_names
        e.copy_to_device([], [], []).wait()
    finally:
        e.close()

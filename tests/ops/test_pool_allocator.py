"""The size-class pool allocator: replay against a reference model, failures,
thread safety (incl. sanitizers), the tsl::Allocator layer, GPU installation."""

import random
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

tf = pytest.importorskip("tensorflow")

from tfswap.ops import allocator as A  # noqa: E402
from tfswap.ops.build import SOURCE_DIR, SOURCES  # noqa: E402

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]


class ModelExhausted(Exception):
    def __init__(self, event_index, class_index):
        super().__init__(event_index, class_index)
        self.event_index, self.class_index = event_index, class_index


def reference_replay(alloc: A.PoolAllocation, events):
    """The pool's semantics in a few lines (what the simulator implements)."""
    stacks = [list(range(n - 1, -1, -1)) for n in alloc.class_count]
    in_use = [0] * len(stacks)
    peak = [0] * len(stacks)
    live, assignments = {}, []
    for k, (is_alloc, handle, nbytes) in enumerate(events):
        if not is_alloc:
            slot = live.pop(handle)
            if slot is not None:
                stacks[slot[0]].append(slot[1])
                in_use[slot[0]] -= 1
            continue
        if nbytes < alloc.small_threshold_bytes:
            live[handle] = None
            assignments.append(None)
            continue
        c = alloc.class_of(nbytes)
        if c is None or not stacks[c]:
            raise ModelExhausted(k, c)
        slot = (c, stacks[c].pop())
        in_use[c] += 1
        peak[c] = max(peak[c], in_use[c])
        live[handle] = slot
        assignments.append(slot)
    return tuple(assignments), tuple(peak)


def test_docstring_example_first_object_and_lifo_reuse():
    alloc = A.PoolAllocation(class_bytes=(2 * MiB, 8 * MiB), class_count=(2, 1),
                             small_pool_bytes=MiB, plan_id="demo")
    r = A.replay(alloc, [(True, "a", 3 * MiB), (True, "b", MiB), (False, "a", 0),
                         (True, "c", 7 * MiB), (True, "tiny", 100)])
    assert r.assignments == ((1, 0), (0, 0), (1, 0), None)
    assert r.per_class_peak == (1, 1)
    assert r.small_pool_peak == 256  # one power-of-two block of at least 256 bytes
    assert r.stats.classes[1].num_allocs == 2
    assert r.stats.bytes_in_use == 2 * MiB + 8 * MiB + 256


def test_lifo_returns_the_most_recently_freed_object():
    alloc = A.PoolAllocation(class_bytes=(MiB,), class_count=(3,), small_pool_bytes=0,
                             plan_id="lifo")
    ev = [(True, h, MiB) for h in "abc"] + [(False, "a", 0), (False, "c", 0),
                                            (True, "d", MiB), (True, "e", MiB)]
    r = A.replay(alloc, ev)
    assert r.assignments == ((0, 0), (0, 1), (0, 2), (0, 2), (0, 0))
    assert r.per_class_peak == (3,)


def test_threshold_boundary_and_exact_class_size():
    alloc = A.PoolAllocation(class_bytes=(MiB, 2 * MiB), class_count=(1, 1),
                             small_pool_bytes=4 * MiB, plan_id="edge")
    r = A.replay(alloc, [(True, 0, MiB - 1), (True, 1, MiB), (True, 2, MiB + 1)])
    assert r.assignments == (None, (0, 0), (1, 0))  # below threshold -> small pool


def test_one_object_short_fails_naming_the_class_request_and_plan():
    alloc = A.PoolAllocation(class_bytes=(MiB, 4 * MiB), class_count=(2, 2),
                             small_pool_bytes=MiB, plan_id="resnet-v100")
    events = [(True, i, 3 * MiB) for i in range(2)]
    assert A.replay(alloc, events).per_class_peak == (0, 2)
    short = A.PoolAllocation(class_bytes=(MiB, 4 * MiB), class_count=(2, 1),
                             small_pool_bytes=MiB, plan_id="resnet-v100")
    with pytest.raises(A.PoolExhausted) as info:
        A.replay(short, events)
    e = info.value
    assert (e.class_index, e.class_bytes, e.requested_bytes, e.plan_id, e.event_index) == (
        1, 4 * MiB, 3 * MiB, "resnet-v100", 1)
    msg = str(e)
    assert "size class 1 (4194304 bytes" in msg and "request of 3145728 bytes" in msg
    assert "plan 'resnet-v100'" in msg


def test_larger_than_every_class_and_small_pool_full_are_errors():
    alloc = A.PoolAllocation(class_bytes=(MiB,), class_count=(4,), small_pool_bytes=1024,
                             plan_id="p")
    with pytest.raises(A.PoolExhausted, match="larger than the largest size class") as info:
        A.replay(alloc, [(True, 0, MiB + 1)])
    assert info.value.class_index is None
    with pytest.raises(A.PoolExhausted, match="small-tensor pool") as info:
        A.replay(alloc, [(True, h, 300) for h in range(3)])  # 512-byte blocks, 1024 limit
    assert info.value.event_index == 2


def test_bad_events_and_bad_allocations_are_refused_clearly():
    alloc = A.PoolAllocation(class_bytes=(MiB,), class_count=(1,), small_pool_bytes=0,
                             plan_id="p")
    with pytest.raises(ValueError, match="allocated again"):
        A.replay(alloc, [(True, "x", MiB), (True, "x", MiB)])
    with pytest.raises(ValueError, match="holds no allocation"):
        A.replay(alloc, [(False, "x", 0)])
    with pytest.raises(ValueError, match="strictly increasing"):
        A.PoolAllocation(class_bytes=(2 * MiB, MiB), class_count=(1, 1), small_pool_bytes=0,
                         plan_id="p")
    with pytest.raises(ValueError, match="one count per class"):
        A.PoolAllocation(class_bytes=(MiB,), class_count=(1, 1), small_pool_bytes=0,
                         plan_id="p")
    with pytest.raises(TypeError, match="integers"):
        A.PoolAllocation(class_bytes=(1.5,), class_count=(1,), small_pool_bytes=0, plan_id="p")
    with pytest.raises(TypeError, match="PoolAllocation"):
        A.replay(object(), [])


@st.composite
def allocations_and_events(draw):
    threshold = draw(st.sampled_from([256, 4096, 65536]))
    k = draw(st.integers(0, 5))
    sizes = sorted(set(draw(st.lists(st.integers(threshold, 2 * MiB), min_size=k,
                                     max_size=k))))
    counts = draw(st.lists(st.integers(0, 4), min_size=len(sizes), max_size=len(sizes)))
    alloc = A.PoolAllocation(class_bytes=tuple(sizes), class_count=tuple(counts),
                             small_pool_bytes=draw(st.integers(0, 1 << 16)),
                             plan_id="hyp", small_threshold_bytes=threshold)
    steps = draw(st.lists(st.tuples(st.booleans(), st.integers(0, 2 ** 31)), max_size=60))
    events, live, fresh = [], [], 0
    edges = [threshold - 1, threshold] + [s for s in sizes] + [s + 1 for s in sizes]
    for want_alloc, r in steps:
        if want_alloc or not live:
            nbytes = edges[r % len(edges)] if r % 3 == 0 else r % (2 * MiB + 1)
            events.append((True, fresh, nbytes))
            live.append(fresh)
            fresh += 1
        else:
            events.append((False, live.pop(r % len(live)), 0))
    return alloc, events


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(allocations_and_events())
def test_replay_matches_the_reference_model(case):
    alloc, events = case
    # The model has no small-pool limit, so the pool may also stop earlier, at
    # a small request that does not fit; anything else must agree exactly.
    try:
        want = reference_replay(alloc, events)
    except ModelExhausted as err:
        want = err
    try:
        got = A.replay(alloc, events)
    except A.PoolExhausted as exc:
        got = exc
    if isinstance(got, A.PoolExhausted) and "small-tensor pool" in str(got):
        assert got.class_index is None
        assert isinstance(want, tuple) or got.event_index <= want.event_index
        return
    if isinstance(want, ModelExhausted):
        assert isinstance(got, A.PoolExhausted)
        assert (got.event_index, got.class_index) == (want.event_index, want.class_index)
        return
    assert isinstance(got, A.ReplayResult), got
    assert (got.assignments, got.per_class_peak) == want
    assert got.stats.small.in_use_bytes <= got.stats.small.limit_bytes


def _model_like_sequence(seed: int, n_tensors: int = 400):
    """Alloc/free events shaped like a training step: activations kept for the
    backward pass, freed in reverse, gradients short-lived, tiny shape tensors."""
    rng = random.Random(seed)
    layer_bytes = [rng.choice([1, 2, 4, 8, 16]) * MiB + rng.randrange(0, MiB)
                   for _ in range(n_tensors // 4)]
    events, h = [], 0
    acts = []
    for b in layer_bytes:                       # forward
        events.append((True, h, b))
        acts.append(h)
        events.append((True, h + 1, rng.randrange(1, 4096)))   # shape/scalar
        events.append((False, h + 1, 0))
        h += 2
    for a, b in zip(reversed(acts), reversed(layer_bytes)):   # backward
        events.append((True, h, b))             # gradient of this activation
        events.append((False, a, 0))
        events.append((False, h, 0))
        h += 1
    return events


def _size_classes(events, n_classes):
    sizes = sorted({b for a, _, b in events if a and b >= MiB})
    picks = sorted({sizes[int(q * (len(sizes) - 1))] for q in
                    [(i + 1) / n_classes for i in range(n_classes)]})
    return tuple(picks)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_model_like_plan_replays_exactly_and_one_short_fails(seed):
    events = _model_like_sequence(seed)
    classes = _size_classes(events, 4)
    roomy = A.PoolAllocation(class_bytes=classes, class_count=(10 ** 3,) * len(classes),
                             small_pool_bytes=1 << 16, plan_id=f"model-{seed}")
    _, need = reference_replay(roomy, events)
    exact = A.PoolAllocation(class_bytes=classes, class_count=need, small_pool_bytes=1 << 16,
                             plan_id=f"model-{seed}")
    want_assign, want_peak = reference_replay(exact, events)
    r = A.replay(exact, events)
    assert r.assignments == want_assign and r.per_class_peak == want_peak == need
    assert r.stats.peak_bytes_in_use <= exact.class_total_bytes + (1 << 16)
    for c, n in enumerate(need):
        if n == 0:
            continue
        short = A.PoolAllocation(class_bytes=classes,
                                 class_count=need[:c] + (n - 1,) + need[c + 1:],
                                 small_pool_bytes=1 << 16, plan_id=f"model-{seed}")
        with pytest.raises(A.PoolExhausted, match=f"size class {c} ") as info:
            A.replay(short, events)
        assert info.value.class_index == c and info.value.plan_id == f"model-{seed}"


def test_stress_many_threads_stats_consistent():
    alloc = A.PoolAllocation(class_bytes=(MiB, 3 * MiB, 3 * MiB + 4096, 16 * MiB),
                             class_count=(6, 4, 2, 2), small_pool_bytes=1 << 18,
                             plan_id="stress")
    made, stats = A.stress(alloc, threads=8, ops_per_thread=5000, seed=3)
    assert made > 8 * 1000
    assert stats.num_allocs == made
    assert stats.bytes_in_use == 0 and all(c.in_use == 0 for c in stats.classes)
    assert all(c.peak_in_use <= c.count for c in stats.classes)
    assert sum(c.num_allocs for c in stats.classes) + stats.small.num_allocs == made
    assert stats.peak_bytes_in_use <= sum(b * n for b, n in zip(alloc.class_bytes,
                                                                  alloc.class_count)) \
        + stats.small.limit_bytes


def _sanitizer_build(tmp_path, flag):
    exe = tmp_path / f"pool_{flag}"
    cmd = ["g++", "-std=c++17", "-O1", "-g", f"-fsanitize={flag}", "-fno-omit-frame-pointer",
           "-pthread", f"-I{SOURCE_DIR}", str(SOURCE_DIR / "pool_core.cc"),
           str(SOURCE_DIR / "pool_capi.cc"), str(Path(__file__).with_name("pool_asan_driver.cc")),
           "-o", str(exe)]
    if shutil.which("g++") is None:
        pytest.skip("no g++ on this machine")
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        if f"lib{flag[0]}san" in proc.stderr or "cannot find" in proc.stderr:
            pytest.skip(f"the toolchain has no lib{flag[0]}san: {proc.stderr[-300:]}")
        pytest.fail(proc.stderr)
    return exe


@pytest.mark.parametrize("flag", ["address", "thread"])
def test_stress_under_sanitizer(tmp_path, flag):
    exe = _sanitizer_build(tmp_path, flag)
    proc = subprocess.run([str(exe), "stress"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("ok")
    assert "WARNING: ThreadSanitizer" not in proc.stderr


@pytest.mark.parametrize("mode", ["uaf", "overflow"])
def test_asan_catches_use_of_free_object_and_overrun(tmp_path, mode):
    # Free objects and the bytes past a request are poisoned: the ASan build
    # must notice a write there (so the stress run above would too).
    exe = _sanitizer_build(tmp_path, "address")
    proc = subprocess.run([str(exe), mode], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "AddressSanitizer: use-after-poison" in proc.stderr


def test_tf_allocator_layer_reports_exact_stats_and_fails_loudly():
    import ctypes

    import numpy as np

    lib = A._clib()
    cb = np.array([MiB, 4 * MiB], dtype=np.uint64)
    cc = np.array([2, 1], dtype=np.uint64)
    sizes = np.array([3 * MiB, MiB, 100, MiB - 1], dtype=np.uint64)
    req = np.zeros(4, dtype=np.uint64)
    got = np.zeros(4, dtype=np.uint64)
    stats = np.zeros(5, dtype=np.int64)
    err = ctypes.create_string_buffer(1024)
    rc = lib.tfswap_tf_pool_selftest(2, A._ptr(cb), A._ptr(cc), 2 * MiB, MiB, b"tsl", 4,
                                     A._ptr(sizes), A._ptr(req), A._ptr(got), A._ptr(stats),
                                     err, 1024)
    assert rc == 0, err.value
    assert list(req) == [3 * MiB, MiB, 100, MiB - 1]
    assert list(got) == [4 * MiB, MiB, 256, MiB]  # MiB - 1: a small-pool block of MiB
    num_allocs, in_use, peak, largest, limit = stats
    assert (num_allocs, in_use, peak, largest) == (4, 5 * MiB + 256 + MiB, 5 * MiB + 256 + MiB,
                                                   3 * MiB)
    assert limit >= 6 * MiB + 2 * MiB  # classes + small pool, reserved up front
    sizes = np.array([3 * MiB, 3 * MiB], dtype=np.uint64)
    rc = lib.tfswap_tf_pool_selftest(2, A._ptr(cb), A._ptr(cc), 0, MiB, b"tsl", 2,
                                     A._ptr(sizes), A._ptr(req), A._ptr(got), A._ptr(stats),
                                     err, 1024)
    assert rc == 1 and b"size class 1" in err.value and b"plan 'tsl'" in err.value


def test_library_sources_are_all_built():
    assert set(SOURCES) == {p.name for p in SOURCE_DIR.glob("*.cc")}
    setup = (ROOT / "setup.py").read_text()
    assert all(f"tfswap/ops/{s}" in setup for s in SOURCES)


_ALLOC = ("from tfswap.ops import allocator as A\n"
          "alloc = A.PoolAllocation(class_bytes=(1 << 20,), class_count=(2,),\n"
          "                         small_pool_bytes=1 << 20, plan_id='sub')\n")


def _run_fresh(code):
    proc = subprocess.run([sys.executable, "-c", "import tensorflow as tf\n" + _ALLOC +
                           textwrap.dedent(code)], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_install_refuses_after_devices_exist():
    tf.constant(1.0) + 1.0  # this process has devices now
    alloc = A.PoolAllocation(class_bytes=(MiB,), class_count=(1,), small_pool_bytes=0,
                             plan_id="late")
    with pytest.raises(A.AllocatorInstallError, match="right after `import tensorflow`"):
        A.install_gpu_allocator(alloc)


@pytest.mark.skipif(tf.test.is_built_with_gpu_support(), reason="checks the CPU-wheel refusal")
def test_install_without_gpu_support_refuses_and_installs_nothing():
    out = _run_fresh("""
        try:
            A.install_gpu_allocator(alloc)
        except A.AllocatorInstallError as e:
            print('refused:', e)
        try:
            A.gpu_pool_stats()
        except A.AllocatorInstallError as e:
            print('stats:', e)
    """)
    assert "refused: this TensorFlow" in out and "without GPU support" in out
    assert "stats: no plan's pool is installed" in out


def test_gpu_process_state_hook_installs_once_and_detects_an_existing_one():
    # The C++ hook itself (GPUProcessState subclass registered as TF's
    # singleton), below the Python GPU checks, in throwaway processes.
    out = _run_fresh("""
        A._install(alloc, 0)
        print('installed; stats before any device:', A.gpu_pool_stats())
        try:
            A._install(alloc, 0)
        except A.AllocatorInstallError as e:
            print('second:', e)
    """)
    assert "installed; stats before any device: None" in out
    assert "second: a tfswap pool allocator is already installed" in out
    out = _run_fresh("""
        A._clib().tfswap_testonly_create_tf_gpu_process_state()
        try:
            A._install(alloc, 0)
        except A.AllocatorInstallError as e:
            print('late:', e)
    """)
    assert "late: install_gpu_allocator was called after TensorFlow created its devices" in out

"""The budget arena (tfswap/ops/pool_arena.h): the pool allocator in one process.

The arena reserves the memory budget once, serves allocations outside any plan
best-fit from its free ranges, and carves each bound plan's pool from them.
Tested here over host memory: its bookkeeping on random sequences, and a
planned step replayed inside it after the step's parameters were allocated
outside the plan, as a user's variables are, object for object as simulated.
"""

import gc
import subprocess
import sys

import pytest
from hypothesis import given, settings, strategies as st

from research import synthetic
from tfswap import pipeline
from tfswap.tf import lower as tf_lower
from tfswap.core import layout
from tfswap.core.compiled import CompiledGraph
from tfswap.core.devices import device_spec
from tfswap.core.planner import plan_swaps
from tfswap.core.program import from_plan
from tfswap.core.simulator import simulate
from tfswap.ops import allocator as A

MiB = 1 << 20
SPEC = device_spec("v100-16g-pcie3")


def _layout(counts=(2,), sizes=(4 * MiB,), small=MiB, plan_id="p"):
    return A.PoolAllocation(class_bytes=sizes, class_count=counts, small_pool_bytes=small,
                            plan_id=plan_id)


def test_outside_a_plan_requests_are_best_fit_and_freed_neighbours_coalesce():
    with A.Arena.host(16 * MiB) as arena:
        a, b, c = (arena.allocate(n) for n in (4 * MiB, 2 * MiB, 4 * MiB))
        assert (a.offset, b.offset, c.offset) == (0, 4 * MiB, 6 * MiB)
        assert a.layout is None and a.size_class is None
        arena.free(b.offset)
        # Best fit: the 2 MiB hole, not the 6 MiB tail.
        assert arena.allocate(MiB).offset == 4 * MiB
        assert arena.stats().largest_free_bytes == 6 * MiB
        for p in (a, c):
            arena.free(p.offset)
        arena.free(4 * MiB)
        arena.check()
        s = arena.stats()
        assert (s.bytes_in_use, s.largest_free_bytes) == (0, 16 * MiB)
        assert s.peak_bytes_in_use == 10 * MiB


def test_a_full_arena_refuses_and_says_what_holds_it():
    with A.Arena.host(8 * MiB) as arena:
        arena.allocate(6 * MiB)
        with pytest.raises(A.ArenaFull, match=r"no free block for a request of 4194304 bytes.*"
                                              r"6291456 in use outside any plan"):
            arena.allocate(4 * MiB)
        arena.check()


def test_a_plan_is_carved_on_first_activation_and_serves_its_step_lifo():
    with A.Arena.host(32 * MiB) as arena:
        weights = arena.allocate(8 * MiB)
        step = arena.add_layout(_layout())
        assert not arena.layout_stats(step).carved
        with arena.active(step):
            x = arena.allocate(3 * MiB)
            y = arena.allocate(4 * MiB)
            arena.free(x.offset)
            z = arena.allocate(2 * MiB)     # the object x gave back (LIFO)
            tiny = arena.allocate(100)      # the plan's small pool
        assert (x.size_class, x.object_index, y.object_index) == (0, 0, 1)
        assert (z.size_class, z.object_index) == (0, 0)
        assert tiny.layout == step and tiny.size_class is None
        place = arena.layout_stats(step)
        assert place.carved and place.offset == weights.offset + 8 * MiB
        assert place.pool.classes[0].peak_in_use == 2
        assert arena.stats().strays == 0 and arena.stats().active_layout is None
        # Outside the plan again: the free ranges, not the plan's objects.
        assert arena.allocate(MiB).layout is None
        arena.check()


def test_a_request_the_plan_cannot_serve_strays_to_the_free_ranges_and_is_counted():
    with A.Arena.host(32 * MiB) as arena:
        step = arena.add_layout(_layout(counts=(1,)))
        with arena.active(step):
            first = arena.allocate(4 * MiB)
            second = arena.allocate(4 * MiB)
        assert first.layout == step and second.layout is None
        s = arena.stats()
        assert (s.strays, s.stray_bytes) == (1, 4 * MiB)
        assert "size class 0" in s.last_stray and "'p'" in s.last_stray
        assert s.bytes_in_use <= s.arena_bytes
        arena.check()


def test_a_plan_that_does_not_fit_is_refused_and_nothing_changes():
    with A.Arena.host(12 * MiB) as arena:
        arena.allocate(8 * MiB)
        step = arena.add_layout(_layout(plan_id="big-plan"))
        before = arena.stats()
        with pytest.raises(A.ArenaFull, match=r"pool of plan 'big-plan' needs one free block"):
            arena.activate(step)
        assert arena.stats() == before
        arena.check()


def test_an_idle_plan_makes_room_for_another_but_a_busy_one_does_not():
    with A.Arena.host(12 * MiB) as arena:
        train = arena.add_layout(_layout(plan_id="train"))
        evaluate = arena.add_layout(_layout(counts=(1,), sizes=(8 * MiB,), small=0,
                                            plan_id="eval"))
        with arena.active(train):
            kept = arena.allocate(4 * MiB)   # an output the caller still holds
        with pytest.raises(A.ArenaFull):
            arena.activate(evaluate)
        arena.free(kept.offset)
        with arena.active(evaluate):
            assert arena.allocate(8 * MiB).layout == evaluate
        assert not arena.layout_stats(train).carved
        arena.check()


def test_remove_layout_waits_for_its_tensors_and_gives_the_block_back():
    with A.Arena.host(16 * MiB) as arena:
        step = arena.add_layout(_layout())
        with arena.active(step):
            x = arena.allocate(4 * MiB)
        with pytest.raises(ValueError, match="still holds 4194304 bytes"):
            arena.remove_layout(step)
        arena.free(x.offset)
        arena.remove_layout(step)
        assert arena.stats().carved_bytes == 0
        with pytest.raises(ValueError, match="no layout"):
            arena.activate(step)
        with pytest.raises(ValueError, match="no layout 0"):
            arena.layout_stats(step)


def test_bad_frees_are_refused():
    with A.Arena.host(8 * MiB) as arena:
        p = arena.allocate(MiB)
        with pytest.raises(ValueError, match="not a live allocation"):
            arena.free(p.offset + 256)
        arena.free(p.offset)
        with pytest.raises(ValueError, match="not a live allocation"):
            arena.free(p.offset)
        with pytest.raises(ValueError, match="outside the arena"):
            arena.free(8 * MiB)
        arena.check()


def test_a_binding_activates_per_block_and_is_forgotten_with_its_step():
    with A.Arena.host(16 * MiB) as arena:
        scope = arena.binding(_layout())
        with scope():
            assert arena.stats().active_layout == 0
            arena.free(arena.allocate(4 * MiB).offset)
        assert arena.layout_stats(0).carved
        del scope
        gc.collect()
        assert arena.stats().carved_bytes == 0
        with pytest.raises(ValueError, match="no layout 0"):
            arena.layout_stats(0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 3 * MiB)), max_size=120),
       st.booleans())
def test_random_sequences_keep_the_arena_consistent(ops, with_plan):
    """Live blocks never overlap, never leave the arena, and the counters agree."""
    with A.Arena.host(24 * MiB) as arena:
        if with_plan:
            arena.activate(arena.add_layout(_layout(counts=(2, 1), sizes=(MiB, 2 * MiB))))
        live: dict[int, int] = {}
        for kind, nbytes in ops:
            if kind == 0 and live:
                offset = sorted(live)[nbytes % len(live)]
                arena.free(offset)
                del live[offset]
                continue
            try:
                p = arena.allocate(nbytes)
            except A.ArenaFull:
                continue
            assert 0 <= p.offset and p.offset + nbytes <= 24 * MiB
            live[p.offset] = nbytes
        spans = sorted(live.items())
        assert all(a + n <= b for (a, n), (b, _) in zip(spans, spans[1:]))
        arena.check()
        for offset in live:
            arena.free(offset)
        assert arena.stats().bytes_in_use == 0
        arena.check()


# ---------------------------------------------------------------- a planned step


def _pinned_step(seed: int, fraction: float):
    """A synthetic training step whose parameters stay on the device (pinned, as
    the pipeline pins a user's device variables), planned at ``fraction``: the
    graph, the plan, and the resident parameters' bytes by name."""
    graph = synthetic.layered_training_step(300, seed=seed)
    cg = CompiledGraph.build(graph, 1 << 20, ())
    graph = tf_lower.pin_parameters(
        graph, [cg.buf_names[b] for b in range(cg.n_buffers) if cg.buf_persistent[b]])
    ideal = plan_swaps(graph, 1 << 50, SPEC)
    plan = plan_swaps(graph, int(fraction * ideal.prediction.peak_bytes), SPEC)
    cg = CompiledGraph.build(graph, plan.allocation.small_threshold_bytes, ())
    prog = from_plan(cg, plan.schedule, plan.swaps, plan.resident_parameters)
    resident = {cg.buf_names[b]: int(cg.buf_bytes[b]) for b in prog.resident
                if cg.buf_persistent[b]}
    return graph, plan, resident


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("seed,fraction", [(1, 0.75), (2, 0.85)])
def test_a_planned_step_runs_in_the_arena_after_its_variables_as_simulated(seed, fraction,
                                                                             shared):
    graph, plan, resident = _pinned_step(seed, fraction)
    allocation = plan.allocation
    if shared:
        allocation = layout.shared_layout(simulate(graph, plan, SPEC, events=True), allocation)
    sim = simulate(graph, plan, SPEC, events=True, allocation=allocation)
    bound = layout.without_resident(sim, allocation, resident)
    # The variables' first (and only) allocations, before the first op.
    first = {}
    for e in sim.allocation_events:
        first.setdefault(e.tensor, e)
    variables = [e for name, e in first.items() if name in resident]
    assert variables and all(e.time_s == 0 for e in variables)
    assert sum(allocation.class_count) - sum(bound.class_count) == len(variables)
    if shared:
        assert bound.pool_bytes < allocation.pool_bytes
    pool = A.PoolAllocation(bound.class_bytes, bound.class_count, bound.small_pool_bytes,
                            plan.id, bound.small_threshold_bytes, bound.object_offsets)
    # The budget: the variables and the plan's pool (as the pool lays it out), no more.
    pool_arena = A.replay(pool, []).stats.bytes_limit
    budget = sum(-(-n // 256) * 256 for n in resident.values()) + pool_arena
    simulated, got, offsets = [], [], {}
    with A.Arena.host(budget) as arena:
        for nbytes in resident.values():   # the user's variables, before any plan
            assert arena.allocate(nbytes).layout is None
        step = arena.add_layout(pool)
        with arena.active(step):   # the rest of the step, in simulated order
            for e in sim.allocation_events:
                if e.tensor in resident:
                    continue
                if e.is_alloc:
                    p = arena.allocate(e.nbytes)
                    offsets[e.tensor] = p.offset
                    simulated.append((e.size_class, e.object_index))
                    got.append((p.size_class, p.object_index))
                else:
                    arena.free(offsets.pop(e.tensor))
        arena.check()
        assert arena.stats().strays == 0
        assert arena.stats().largest_free_bytes == 0
    # The simulated objects, less the variables' objects below them.
    below = {}
    for e in variables:
        below.setdefault(e.size_class, []).append(e.object_index)
    assert got == [(c, j - sum(v < j for v in below.get(c, ()))) for c, j in simulated]


# ---------------------------------------------------------------- on a GPU


def _run_fresh(code):
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)


def test_install_gpu_arena_without_gpu_support_refuses_and_installs_nothing():
    proc = _run_fresh(
        "import tensorflow as tf\n"
        "from tfswap.ops import allocator as A\n"
        "assert A.installed_gpu_arena() is None\n"
        "try:\n    A.install_gpu_arena('1GiB')\nexcept A.AllocatorInstallError as e:\n"
        "    print('refused:', e)\n"
        "try:\n    A.gpu_arena()\nexcept A.AllocatorInstallError as e:\n    print('none:', e)\n"
        "assert A.installed_gpu_arena('/GPU:0') is None\n")
    assert proc.returncode == 0, proc.stderr
    assert "refused: this TensorFlow" in proc.stdout and "without GPU support" in proc.stdout
    assert "none: no tfswap budget arena is installed" in proc.stdout


def test_install_gpu_arena_refuses_after_devices_exist_and_bad_budgets():
    proc = _run_fresh(
        "import tensorflow as tf\n"
        "from tfswap.ops import allocator as A\n"
        "from tfswap.core.budget import BudgetError\n"
        "try:\n    A.install_gpu_arena('12')\nexcept BudgetError as e:\n    print('unit:', e)\n"
        "tf.constant(1.0) + 1\n"
        "try:\n    A.install_gpu_arena('1GiB')\nexcept A.AllocatorInstallError as e:\n"
        "    print('late:', e)\n")
    assert proc.returncode == 0, proc.stderr
    assert "unit: memory_budget '12' has no unit" in proc.stdout
    assert "late: install_gpu_arena was called after TensorFlow created its devices" in proc.stdout


@pytest.mark.parametrize("seed", [0, 1])
def test_many_threads_while_the_plan_is_switched_on_and_off(seed):
    """TF's executor threads allocate while the Python thread activates a plan."""
    with A.Arena.host(48 * MiB) as arena:
        step = arena.add_layout(_layout(counts=(6, 3), sizes=(MiB, 4 * MiB), small=2 * MiB))
        made = arena.stress(step, threads=8, ops_per_thread=5000, seed=seed)
        # Where each request landed depends on the threads' timing; that no live
        # buffer was overwritten and the books balance does not.
        s = arena.stats()
        assert made > 0 and s.num_allocs == made and s.bytes_in_use == 0
        arena.check()

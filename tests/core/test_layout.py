"""Shared pool layout (tfswap.core.layout): objects never busy together share memory."""

import functools

import pytest

from tfswap.core import layout, search, simulator
from tfswap.core.compiled import CompiledGraph
from tfswap.core.plan import Allocation, Plan
from tfswap.core.planner import plan_swaps
from tfswap.core.search import SearchConfig
from research.synthetic import layered_training_step
from tests.core.plan_checks import SPEC, budgets


@functools.lru_cache(maxsize=None)
def planned(fraction=0.5):
    g = layered_training_step(160, seed=4)
    cg = CompiledGraph.build(g)
    budget, full = budgets(cg, cg.order_of(None), fraction)
    plan = plan_swaps(g, budget, SPEC, compiled=cg)
    result = simulator.simulate(g, plan, SPEC, events=True, compiled=cg)
    return g, cg, budget, plan, result


def test_shared_layout_is_smaller_and_no_busy_objects_overlap():
    g, cg, budget, plan, result = planned()
    shared = layout.shared_layout(result, plan.allocation)
    assert shared.shared and not plan.allocation.shared
    assert shared.class_bytes == plan.allocation.class_bytes
    assert shared.class_count == result.class_peak_objects
    assert shared.pool_bytes < plan.allocation.pool_bytes
    assert layout.conflicts(result, shared) == []


def test_the_shared_pool_runs_the_same_step():
    g, cg, budget, plan, result = planned()
    shared = layout.shared_layout(result, plan.allocation)
    again = simulator.simulate(g, plan, SPEC, events=True, compiled=cg, allocation=shared)
    assert again.step_time_s == result.step_time_s
    assert again.allocation_events == result.allocation_events


def test_the_checker_sees_objects_placed_on_top_of_each_other():
    g, cg, budget, plan, result = planned()
    shared = layout.shared_layout(result, plan.allocation)
    stacked = Allocation(shared.class_bytes, shared.class_count, shared.small_pool_bytes,
                         shared.small_threshold_bytes,
                         object_offsets=tuple((0,) * n for n in shared.class_count))
    assert layout.conflicts(result, stacked)


def test_layout_needs_the_allocation_events():
    g, cg, budget, plan, _ = planned()
    bare = simulator.simulate(g, plan, SPEC, compiled=cg)
    with pytest.raises(ValueError, match="events=True"):
        layout.shared_layout(bare, plan.allocation)


def test_object_offsets_are_validated_and_survive_json(tmp_path):
    with pytest.raises(ValueError, match="one offset per object"):
        Allocation((1 << 20,), (2,), object_offsets=((0,),))
    with pytest.raises(ValueError, match="multiples of 256"):
        Allocation((1 << 20,), (1,), object_offsets=((100,),))
    a = Allocation((1 << 20, 2 << 20), (2, 1), object_offsets=((0, 1 << 20), (0,)))
    assert a.pool_bytes == 2 << 20
    p = Plan(schedule=("a",), allocation=a)
    p.save(tmp_path / "p.json")
    assert Plan.load(tmp_path / "p.json") == p


def test_shared_search_fits_the_budget_and_is_no_slower_than_disjoint():
    g, cg, budget, _, _ = planned(0.4)
    cfg = dict(population_size=10, crossovers_per_generation=3, max_generations=5,
               time_budget_s=None, workers=1, seed=1)
    disjoint = search.plan(g, budget, SPEC, config=SearchConfig(**cfg), compiled=cg)
    shared = search.plan(g, budget, SPEC, compiled=cg,
                         config=SearchConfig(pool_layout="shared", **cfg))
    a = shared.plan.allocation
    assert a.shared and a.total_bytes <= budget and shared.plan.budget_bytes == budget
    assert shared.plan.prediction.step_time_s <= disjoint.plan.prediction.step_time_s
    result = simulator.simulate(g, shared.plan, SPEC, events=True, compiled=cg)
    assert result.step_time_s == shared.plan.prediction.step_time_s
    assert layout.conflicts(result, a) == []


def test_pool_layout_is_validated():
    with pytest.raises(ValueError, match="pool_layout"):
        SearchConfig(pool_layout="packed")


def _resident(cg, plan):
    from tfswap.core.program import from_plan

    prog = from_plan(cg, plan.schedule, plan.swaps, plan.resident_parameters)
    return [cg.buf_names[b] for b in prog.resident if cg.buf_persistent[b]]


def test_without_resident_leaves_out_the_objects_parameters_hold_all_step():
    g, cg, budget, plan, result = planned()
    resident = _resident(cg, plan)
    released = {e.tensor for e in result.allocation_events
                if e.tensor in set(resident) and not e.is_alloc}
    held = {e.tensor for e in result.allocation_events
            if e.tensor in set(resident) and e.is_alloc} - released
    assert held and released   # this plan keeps some parameters and swaps others
    bound = layout.without_resident(result, plan.allocation, resident)
    assert sum(plan.allocation.class_count) - sum(bound.class_count) == len(held)
    assert bound.class_bytes == plan.allocation.class_bytes
    assert layout.without_resident(result, plan.allocation, []) == plan.allocation


def test_without_resident_replaces_a_shared_layout_without_their_memory():
    g, cg, budget, plan, result = planned()
    shared = layout.shared_layout(result, plan.allocation)
    again = simulator.simulate(g, plan, SPEC, events=True, compiled=cg, allocation=shared)
    bound = layout.without_resident(again, shared, _resident(cg, plan))
    assert bound.shared and bound.pool_bytes < shared.pool_bytes
    assert all(o % 256 == 0 for c in bound.object_offsets for o in c)


def test_the_compiled_packing_matches_the_reference():
    # layout._place packs with the native library; _place_reference is the Python
    # it follows: the same offsets for random busy sets and classes.
    import random

    from tfswap.core.layout import _place, _place_reference
    from tfswap.core.plan import Allocation

    rng = random.Random(5)
    for _ in range(200):
        n_classes = rng.randint(1, 5)
        class_bytes = tuple(sorted(rng.sample(range(1, 5000), n_classes)))
        counts = [rng.randint(0, 6) for _ in range(n_classes)]
        busy = {}
        for c in range(n_classes):
            for j in range(counts[c]):
                if rng.random() < 0.9:
                    ends = sorted(rng.sample(range(60), 2 * rng.randint(1, 3)))
                    busy[(c, j)] = list(zip(ends[::2], ends[1::2]))
        alloc = Allocation(class_bytes=class_bytes, class_count=tuple(counts))
        assert _place(busy, counts, alloc) == _place_reference(busy, counts, alloc)


@pytest.mark.parametrize("fraction", [0.35, 0.5, 0.8])
def test_the_layout_of_compiled_event_rows_is_the_layout_of_the_events(fraction):
    # shared_layout_rows reads the compiled simulation's rows with numpy; it must
    # give what shared_layout gives from the reference simulation's events, and
    # say what is wrong with rows that are not a run as the loop does.
    import numpy as np
    from tfswap.core.program import from_plan

    g = layered_training_step(160, seed=4)
    cg = CompiledGraph.build(g)
    budget, full = budgets(cg, cg.order_of(None), fraction)
    plan = plan_swaps(g, budget, SPEC, compiled=cg)
    prog = from_plan(cg, plan.schedule, plan.swaps, plan.resident_parameters)
    result, run = simulator.try_program_rows(cg, prog, plan.allocation, SPEC, allocations=True)
    reference = simulator.run_program(cg, prog, plan.allocation, SPEC, events=True)
    want = layout.shared_layout(reference, plan.allocation)
    assert layout.shared_layout_rows(run.event_rows, result.class_peak_objects,
                                     plan.allocation) == want
    assert layout._intervals_of_rows(np.asarray(run.event_rows),
                                     list(result.class_peak_objects)) is not None
    rows = np.asarray(run.event_rows).copy()
    rows[np.flatnonzero(rows[:, 0] == 0)[0], 0] = 1   # a release made a second take
    with pytest.raises(ValueError, match="twice"):
        layout.shared_layout_rows(rows, result.class_peak_objects, plan.allocation)

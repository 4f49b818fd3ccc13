"""The pool allocator replays the simulator's allocation sequence object for object.

The planner decides which pool object every buffer occupies; the allocator
library must make the same choice at run time, or a plan the simulator
accepted could run out of memory.  Plans here come from the swap planner on
synthetic training steps and random DAGs at budgets that force swapping.
"""

import dataclasses

import numpy as np
import pytest

from tfswap.core import layout
from research import synthetic
from tfswap.core.devices import device_spec
from tfswap.core.planner import plan_swaps
from tfswap.core.simulator import simulate
from tfswap.ops.allocator import PoolAllocation, PoolExhausted, as_allocation, replay

SPEC = device_spec("v100-16g-pcie3")


def planned(graph, fraction):
    ideal = plan_swaps(graph, 1 << 50, SPEC)
    budget = int(fraction * ideal.prediction.peak_bytes)
    plan = plan_swaps(graph, budget, SPEC)
    return plan, simulate(graph, plan, SPEC, events=True)


def pool_events(sim):
    events = [e for e in sim.allocation_events if e.size_class >= 0]
    return events, [(e.is_alloc, e.tensor, e.nbytes) for e in events]


GRAPHS = {
    "layered-300": lambda: synthetic.layered_training_step(300, seed=1),
    "layered-600": lambda: synthetic.layered_training_step(600, seed=2),
    "random-dag": lambda: synthetic.random_dag(np.random.default_rng(7), n_ops=80),
}


@pytest.mark.parametrize("name,fraction", [
    ("layered-300", 0.6), ("layered-300", 0.8), ("layered-600", 0.6), ("random-dag", 0.95)])
def test_replay_matches_the_simulator(name, fraction):
    graph = GRAPHS[name]()
    plan, sim = planned(graph, fraction)
    events, replay_events = pool_events(sim)
    assert events, "the plan allocates nothing from the pool"
    result = replay(as_allocation(plan), replay_events)
    simulated = [(e.size_class, e.object_index) for e in events if e.is_alloc]
    assert list(result.assignments) == simulated
    assert result.per_class_peak == sim.class_peak_objects
    print(f"\n{name} at {fraction:.0%}: {len(simulated)} allocations, {len(plan.swaps)} swaps, "
          f"per-class peaks {sim.class_peak_objects}")


def test_one_object_short_fails_naming_the_class():
    graph = GRAPHS["layered-300"]()
    plan, sim = planned(graph, 0.6)
    _, replay_events = pool_events(sim)
    peaks = sim.class_peak_objects
    short = max(range(len(peaks)), key=lambda k: plan.allocation.class_bytes[k] * (peaks[k] > 0))
    counts = list(plan.allocation.class_count)
    counts[short] = peaks[short] - 1
    tight = dataclasses.replace(plan, allocation=dataclasses.replace(
        plan.allocation, class_count=tuple(counts)))
    with pytest.raises(PoolExhausted, match=f"size class {short}") as info:
        replay(as_allocation(tight), replay_events)
    assert info.value.class_index == short
    assert info.value.plan_id == tight.id


@pytest.mark.parametrize("name,fraction", [("layered-300", 0.6), ("layered-600", 0.6),
                                           ("random-dag", 0.95)])
def test_shared_layout_replays_the_simulator_in_less_memory(name, fraction):
    graph = GRAPHS[name]()
    plan, sim = planned(graph, fraction)
    shared = layout.shared_layout(sim, plan.allocation)
    assert shared.pool_bytes < plan.allocation.pool_bytes
    events, replay_events = pool_events(sim)
    result = replay(as_allocation(dataclasses.replace(plan, allocation=shared)), replay_events)
    assert list(result.assignments) == [(e.size_class, e.object_index)
                                        for e in events if e.is_alloc]
    disjoint = replay(as_allocation(plan), replay_events)
    assert result.stats.bytes_limit <= disjoint.stats.bytes_limit
    print(f"\n{name} at {fraction:.0%}: arena {result.stats.bytes_limit} B shared, "
          f"{disjoint.stats.bytes_limit} B disjoint")


def test_shared_layout_refuses_an_object_whose_memory_is_in_use():
    # Two 1 MiB objects of class 0 and one 2 MiB object of class 1, all at offset 0:
    # the plan says they are never live together.  A run that holds one of class 0
    # and asks for class 1 must fail, not hand out the same memory twice.
    alloc = PoolAllocation(class_bytes=(1 << 20, 2 << 20), class_count=(2, 1),
                           small_pool_bytes=0, plan_id="stacked",
                           object_offsets=((0, 1 << 20), (0,)))
    ok = replay(alloc, [(True, "a", 1 << 20), (True, "b", 1 << 20), (False, "a", 0),
                        (False, "b", 0), (True, "c", 2 << 20)])
    assert ok.assignments == ((0, 0), (0, 1), (1, 0))
    assert ok.stats.bytes_limit == 2 << 20
    with pytest.raises(PoolExhausted, match="another live object") as err:
        replay(alloc, [(True, "a", 1 << 20), (True, "c", 2 << 20)])
    assert err.value.class_index == 1


def test_shared_layout_takes_the_next_free_object_when_the_top_one_is_covered():
    # Class 1's object covers class 0's object 0 only; with it live, class 0
    # hands out object 1 although object 0 is on top of its free stack.
    alloc = PoolAllocation(class_bytes=(1 << 20, 2 << 20), class_count=(2, 1),
                           small_pool_bytes=0, plan_id="partial",
                           object_offsets=((0, 2 << 20), (0,)))
    picked = replay(alloc, [(True, "c", 2 << 20), (True, "a", 1 << 20)])
    assert picked.assignments == ((1, 0), (0, 1))


def test_shared_layout_offsets_are_checked():
    with pytest.raises(ValueError, match="one offset per object"):
        PoolAllocation(class_bytes=(1 << 20,), class_count=(2,), small_pool_bytes=0,
                       plan_id="p", object_offsets=((0,),))
    with pytest.raises(ValueError, match="multiple of 256"):
        replay(PoolAllocation(class_bytes=(1 << 20,), class_count=(1,), small_pool_bytes=0,
                              plan_id="p", object_offsets=((100,),)), [])

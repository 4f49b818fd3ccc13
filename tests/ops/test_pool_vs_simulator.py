"""The pool allocator replays the simulator's allocation sequence object for object.

The planner decides which pool object every buffer occupies; the allocator
library must make the same choice at run time, or a plan the simulator
accepted could run out of memory.  Plans here come from the swap planner on
synthetic training steps and random DAGs at budgets that force swapping.
"""

import dataclasses

import numpy as np
import pytest

from tfswap.core import synthetic
from tfswap.core.devices import device_spec
from tfswap.core.planner import plan_swaps
from tfswap.core.simulator import simulate
from tfswap.ops.allocator import PoolExhausted, as_allocation, replay

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

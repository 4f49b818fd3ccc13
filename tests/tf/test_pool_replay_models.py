"""The pool allocator replays the simulator's allocations for plans of real models.

ResNet-50, a BERT-style encoder and an unrolled LSTM are captured, priced
with the analytic V100 profile, planned by the genetic search (3 generations) at
60% of their no-swap pool need,
simulated, and the allocation sequence is replayed by the allocator library
over host memory: same object for every allocation, same peak per class
(issue #8).  One object short in the busiest class fails naming that class.
"""

import dataclasses

import pytest

from tfswap import zoo
from tfswap.core.devices import device_spec
from tfswap.core import search
from tfswap.core.planner import plan_swaps
from tfswap.core.search import SearchConfig
from tfswap.core.simulator import simulate
from tfswap.ops.allocator import PoolExhausted, as_allocation, replay
from tfswap.tf import capture, ir, profile

SPEC = device_spec("v100-16g-pcie3")
SMALL = 4 << 10   # small models: tensors from 4 KiB up are pool tensors
MODELS = {
    "resnet50": lambda: zoo.resnet50(batch=8, image=64),
    "bert": lambda: zoo.bert(batch=2, seq=32, dim=64, layers=2, vocab=512),
    "lstm": lambda: zoo.lstm(batch=4, steps=12, features=16, units=32),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def planned(request):
    step = MODELS[request.param]()
    captured = capture.capture(step.concrete_fn)
    low = ir.lower(captured, profile.analytic(captured, SPEC), small_bytes=SMALL)
    keep = tuple(low.fetches) + tuple(low.assigned)
    schedule = low.schedule()
    free = plan_swaps(low.graph, 1 << 62, SPEC, schedule=schedule, keep=keep,
                      small_threshold_bytes=SMALL)
    fraction = 0.6
    config = SearchConfig(max_generations=3, time_budget_s=None, workers=1, seed=0)
    plan = search.plan(low.graph, int(fraction * free.prediction.peak_bytes), SPEC,
                       config=config, initial_schedule=schedule, keep=keep,
                       small_threshold_bytes=SMALL).plan
    assert plan.swaps
    sim = simulate(low.graph, plan, SPEC, events=True, keep=keep)
    return f"{request.param} at {fraction:.0%}", plan, sim


def _pool_events(sim):
    events = [e for e in sim.allocation_events if e.size_class >= 0]
    return events, [(e.is_alloc, e.tensor, e.nbytes) for e in events]


def test_replay_matches_the_simulator(planned):
    name, plan, sim = planned
    events, replay_events = _pool_events(sim)
    result = replay(as_allocation(plan), replay_events)
    assert list(result.assignments) == [(e.size_class, e.object_index) for e in events
                                        if e.is_alloc]
    assert result.per_class_peak == sim.class_peak_objects
    print(f"\n{name}: {len(plan.swaps)} swaps, {len(events)} pool events, "
          f"{len(sim.class_peak_objects)} classes, per-class peaks match")


def test_one_object_short_names_the_class(planned):
    _, plan, sim = planned
    _, replay_events = _pool_events(sim)
    peaks = sim.class_peak_objects
    busiest = max(range(len(peaks)), key=lambda k: (peaks[k], plan.allocation.class_bytes[k]))
    counts = list(plan.allocation.class_count)
    counts[busiest] = peaks[busiest] - 1
    short = dataclasses.replace(plan, allocation=dataclasses.replace(
        plan.allocation, class_count=tuple(counts)))
    with pytest.raises(PoolExhausted, match=f"size class {busiest}"):
        replay(as_allocation(short), replay_events)

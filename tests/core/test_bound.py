"""The lower bound (tfswap.core.bound) is below every plan any planner makes of its
schedule, equals the ops' time where the step fits, and rises as the budget falls."""

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfswap.core import planners
from tfswap.core.bound import lower_bound
from tfswap.core.infeasible import Infeasible
from tfswap.core.problem import Problem
from tfswap.core.search import SearchConfig
from research.synthetic import layered_training_step
from tests.core.plan_checks import SPEC

SLOW = dataclasses.replace(SPEC, h2d_bytes_per_s=1e9, d2h_bytes_per_s=1e9,
                           duplex_bytes_per_s=1.5e9)
PLANNERS = ("tfswap.order", "tfswap.bytes", "tfswap", "capuchin", "vdnn_all", "recompute")


def _problem(n_ops, seed):
    graph = layered_training_step(n_ops, seed=seed)
    return Problem.of(graph, recomputable=[op.name for op in graph.ops])


def _peak(problem, spec):
    return planners.run("tfswap.order", problem, 1 << 62, spec).plan.prediction.peak_bytes


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**4), n_ops=st.integers(24, 120),
       fraction=st.floats(0.35, 1.0), serial=st.booleans())
def test_no_planner_plans_below_the_bound_of_its_schedule(seed, n_ops, fraction, serial):
    spec = dataclasses.replace(SLOW, copies_on_compute=serial)
    problem = _problem(n_ops, seed)
    budget = int(fraction * _peak(problem, spec))
    config = SearchConfig(max_generations=2, time_budget_s=None, workers=1, seed=seed)
    planned = 0
    for name in PLANNERS:
        options = {"config": config} if name == "tfswap" else {}
        try:
            plan = planners.run(name, problem, budget, spec, **options).plan
        except (Infeasible, planners.UnsupportedProblem):
            continue
        if plan.prediction.peak_bytes is not None and plan.prediction.peak_bytes > budget:
            continue   # a baseline judged by live bytes: not a plan within this pool
        planned += 1
        bound = lower_bound(problem, budget, spec, schedule=plan.schedule)
        assert bound.compute_s <= bound.time_s
        assert bound.time_s <= plan.prediction.step_time_s * (1 + 1e-9), (name, bound)


def test_a_step_that_fits_is_bounded_by_its_ops_time():
    problem = _problem(60, 1)
    bound = lower_bound(problem, _peak(problem, SLOW), SLOW)
    assert bound.excess_bytes == 0 and bound.time_s == bound.compute_s
    assert "fits the budget" in bound.describe()


def test_a_smaller_budget_never_lowers_the_bound_and_swaps_cost_the_link():
    problem = _problem(90, 2)
    peak = _peak(problem, SLOW)
    bounds = [lower_bound(problem, int(f * peak), SLOW) for f in (0.9, 0.7, 0.5)]
    assert all(a.time_s <= b.time_s for a, b in zip(bounds, bounds[1:]))
    assert bounds[-1].time_s > bounds[-1].compute_s and bounds[-1].excess_bytes > 0
    # Without recomputation the excess crosses the link, which costs more.
    swaps_only = Problem.of(problem.graph)
    assert lower_bound(swaps_only, int(0.5 * peak), SLOW).time_s >= bounds[-1].time_s
    assert "must be off the device" in bounds[-1].describe()


def test_a_negative_budget_is_refused():
    with pytest.raises(ValueError, match="budget_bytes"):
        lower_bound(_problem(24, 0), -1, SLOW)

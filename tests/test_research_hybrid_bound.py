"""research.hybrid_bound: no plan the planners find beats the LP's bound, and the
bound is the ideal time where memory is not short."""

import dataclasses

import pytest

from research.hybrid_bound import NoPlanFits, step_time_bound
from research.synthetic import layered_training_step
from tfswap.core import planners
from tfswap.core.infeasible import Infeasible
from tfswap.core.problem import Problem
from tfswap.core.simulator import simulate
from tests.core.plan_checks import slow_v100

SLOW = slow_v100(2e9, 3e9)


@pytest.fixture(scope="module")
def problem():
    graph = layered_training_step(120, seed=5)
    problem = Problem.of(graph, recomputable=[op.name for op in graph.ops])
    peak = planners.run("tfswap.order", problem, 1 << 62, SLOW).plan.prediction.peak_bytes
    return problem, peak


def test_where_memory_is_not_short_the_bound_is_the_ideal_time(problem):
    problem, peak = problem
    bound = step_time_bound(problem, peak, SLOW)
    ideal = planners.run("ideal", problem, peak, SLOW).plan.prediction.ideal_time_s
    assert bound.time_s == pytest.approx(ideal) and bound.relative == pytest.approx(1.0)
    assert bound.rows == 0


@pytest.mark.parametrize("fraction", [0.7, 0.5, 0.35])
def test_no_plan_in_the_order_beats_the_bound(problem, fraction):
    problem, peak = problem
    budget = int(fraction * peak)
    bound = step_time_bound(problem, budget, SLOW)
    assert bound.time_s >= bound.ideal_s and bound.rows > 0
    swaps_only = dataclasses.replace(problem, recomputable=frozenset())
    beaten = []
    for name, p in (("tfswap.order", problem), ("capuchin", problem),
                    ("tfswap.bytes", problem), ("tfswap.order", swaps_only)):
        try:
            plan = planners.run(name, p, budget, SLOW).plan
        except Infeasible:
            continue
        from tfswap.core.recompute import with_recomputes

        for candidate in (plan, with_recomputes(problem, plan, SLOW, budget)):
            if candidate.schedule != problem.schedule and candidate.schedule:
                continue   # the bound is for the problem's order
            t = simulate(problem.graph, candidate, SLOW, keep=problem.keep,
                         compiled=problem.compiled).step_time_s
            beaten.append((name, t))
            assert t >= bound.time_s * (1 - 1e-9), (name, t, bound)
    assert beaten
    # Less memory never makes the bound lower.
    assert step_time_bound(problem, int(0.9 * budget), SLOW).time_s >= bound.time_s * (1 - 1e-9)


def test_below_what_an_op_needs_at_once_nothing_fits(problem):
    problem, peak = problem
    need = int(problem.compiled.op_working_set().max())
    with pytest.raises(NoPlanFits):
        step_time_bound(problem, need // 2, SLOW)

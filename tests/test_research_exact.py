"""research.exact: the exact optimum of small steps under tfswap's own model, and
tfswap's default planner held to it (issue #40; no TensorFlow).

The cases are research.exact_compare's; ``python -m research.exact_compare``
prints every planner's time beside the optimum's.
"""

import numpy as np
import pytest

from research.exact import SearchTooLarge, solve, topological_orders
from research.exact_compare import (BALANCED, CASES, CONFIG, MiB, mlp, named_planners,
                                    planned_time, residual_block)
from tfswap.core import layout, planners
from tfswap.core.bound import lower_bound
from tfswap.core.graph import DataflowGraph, Op, Tensor
from tfswap.core.infeasible import Infeasible, UnsupportedProblem
from tfswap.core.plan import Plan
from tfswap.core.problem import Problem
from tfswap.core.simulator import simulate

# How far above the optimum the default planner's predicted step may be.  On
# the five cases it handles (mlp3, residual, remake_segment, link_bound,
# compute_bound) it reaches the optimum to the last bit, so any slack is for a
# future change that trades a little on one small step for more on large ones;
# 1% allows that and stays far below the gap measured (5.5%, marked below).
TOLERANCE = 0.01

# Cases where the default planner is measurably slower than the optimum, and
# why (strict: when a planner change closes one, the mark has to go).
GAPS = {
    "mlp5": "real gap, 34.69 ms against 32.89 ms (1.055): the byte-cap planner drops "
            "fwd1:0 and fwd3:0 to remake both (at share 0.5) or neither (0.1), and the "
            "recomputation pass only turns round trips into remakes; the optimum "
            "round-trips fwd1:0, whose copies hide behind the backward pass, and remakes "
            "fwd3:0 alone",
}


def _cases(gaps=False):
    return [pytest.param(c, id=c.name, marks=pytest.mark.xfail(strict=True, reason=GAPS[c.name])
                         if gaps and c.name in GAPS else ()) for c in CASES]


@pytest.fixture(scope="module")
def solved():
    """case -> (problem, the exact result, every planner's predicted time or None)."""
    cache = {}

    def get(case):
        if case.name not in cache:
            problem = case.make()
            exact = solve(problem, case.budget_bytes, case.spec, orders="all")
            times = {name: planned_time(name, problem, case.budget_bytes, case.spec)
                     for name in (planners.DEFAULT_PLANNER,) + named_planners()}
            cache[case.name] = problem, exact, times
        return cache[case.name]

    return get


@pytest.mark.parametrize("case", _cases(gaps=True))
def test_the_default_planner_is_within_tolerance_of_the_exact_optimum(case, solved):
    _, exact, times = solved(case)
    default = times[planners.DEFAULT_PLANNER]
    assert default is not None, "the default planner planned nothing where a plan fits"
    assert default <= exact.step_time_s * (1 + TOLERANCE), \
        f"default {default * 1e3:.4g} ms, optimum {exact.step_time_s * 1e3:.4g} ms " \
        f"({default / exact.step_time_s:.3f})"


@pytest.mark.parametrize("case", _cases())
def test_no_planner_finds_a_plan_faster_than_the_exact_optimum(case, solved):
    # Every planner's plan that fits is one of the space searched, or the space
    # misses something tfswap plans can do: the optimum would not be one.
    _, exact, times = solved(case)
    planned = {name: t for name, t in times.items() if t is not None}
    assert planners.DEFAULT_PLANNER in planned
    for name, t in planned.items():
        assert exact.step_time_s <= t * (1 + 1e-9), (name, t, exact.step_time_s)


@pytest.mark.parametrize("case", _cases())
def test_the_exact_plan_runs_as_predicted_within_the_budget(case, solved):
    problem, exact, _ = solved(case)
    plan = exact.plan
    again = simulate(problem.graph, plan, case.spec, keep=problem.keep,
                     compiled=problem.compiled, events=True)
    assert again.step_time_s == plan.prediction.step_time_s
    assert plan.allocation.total_bytes <= case.budget_bytes
    assert layout.conflicts(again, plan.allocation) == []
    assert Plan.from_json(plan.to_json()) == plan
    order = [problem.graph.op_id(name) for name in plan.schedule]
    assert problem.graph.is_topological(order)
    bound = lower_bound(problem, case.budget_bytes, case.spec, schedule=plan.schedule)
    assert again.ideal_time_s <= bound.time_s <= again.step_time_s * (1 + 1e-9)


@pytest.mark.parametrize("name", ["mlp3", "residual", "remake_segment"])
def test_the_bounds_skip_nothing_the_full_enumeration_would_choose(name, solved):
    case = next(c for c in CASES if c.name == name)
    problem, exact, _ = solved(case)
    full = solve(problem, case.budget_bytes, case.spec, orders="all", bound=False)
    assert full.step_time_s == exact.step_time_s
    assert full.programs > exact.programs


def test_a_step_that_fits_moves_nothing_and_runs_at_its_ideal_time():
    problem = mlp(3)
    found = solve(problem, 1 << 40, BALANCED, orders="all")
    assert found.plan.swaps == ()
    assert found.step_time_s == found.plan.prediction.ideal_time_s
    assert found.programs == 1


def test_below_what_one_op_needs_no_plan_fits():
    # Each backward op of the MLP reads three 8 MiB tensors and writes a fourth.
    problem = mlp(3)
    with pytest.raises(Infeasible):
        solve(problem, 30 * MiB, BALANCED, orders="all")
    with pytest.raises(Infeasible):
        planners.run(planners.DEFAULT_PLANNER, problem, 30 * MiB, BALANCED, config=CONFIG)


def test_every_order_is_searched_tfs_first():
    problem = residual_block()
    orders = topological_orders(problem, 100)
    tf = [problem.graph.op_id(name) for name in problem.schedule]
    assert list(orders[0]) == tf
    assert len(set(orders)) == len(orders) == 4
    assert all(problem.graph.is_topological(list(o)) for o in orders)
    case = next(c for c in CASES if c.name == "residual")
    every = solve(problem, case.budget_bytes, case.spec, orders="all")
    assert every.orders == 4
    assert every.step_time_s <= solve(problem, case.budget_bytes, case.spec).step_time_s


def test_what_it_cannot_search_is_refused_not_approximated():
    problem = residual_block()
    with pytest.raises(SearchTooLarge, match="topological orders"):
        solve(problem, 32 * MiB, BALANCED, orders="all", max_orders=2)
    with pytest.raises(SearchTooLarge, match="programs"):
        solve(mlp(5), 40 * MiB, BALANCED, max_programs=10)
    with pytest.raises(ValueError, match="orders must be one of"):
        solve(problem, 32 * MiB, BALANCED, orders="some")
    ops = [Op("w", "ReadVariableOp"), Op("y", "MatMul", ("w:0",), time_s=1e-3)]
    tensors = [Tensor("w:0", 4 * MiB, kind="parameter"), Tensor("y:0", 4 * MiB)]
    on_host = Problem.of(DataflowGraph.build(ops, tensors), params_start_on_host=True)
    with pytest.raises(UnsupportedProblem):
        solve(on_host, 64 * MiB, BALANCED)


def test_the_optimum_never_rises_as_the_budget_grows():
    problem = mlp(4)
    times = [solve(problem, b * MiB, BALANCED).step_time_s for b in (32, 40, 48, 56)]
    assert all(a >= b for a, b in zip(times, times[1:]))
    assert times[-1] == pytest.approx(float(np.sum(problem.compiled.op_time)))

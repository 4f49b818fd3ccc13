"""research.paper_bench.compare on small synthetic problems: cells that do not fit,
cells a planner cannot express, and the pool label of the genetic searches."""

import pytest

from research import paper_bench
from research.synthetic import layered_training_step
from tfswap.core import planners
from tfswap.core.devices import device_spec
from tfswap.core.problem import Problem

SPEC = device_spec("v100-16g-pcie3")
POLICIES = ("ideal", "no_swap", "capuchin", "swapadvisor", "tfswap")


@pytest.fixture(scope="module")
def step():
    graph = layered_training_step(120, seed=5)
    peak = planners.run("ideal", Problem.of(graph), 1, SPEC).plan.prediction.peak_bytes
    return graph, int(peak * 0.7)


def _by_policy(problem, budget):
    rows = paper_bench.compare(problem, "syn", 4, budget, SPEC, generations=2,
                               policies=POLICIES)
    return rows, {o.policy: o for o in rows}


def test_parameters_on_the_device_every_policy_plans_or_does_not_fit(step):
    graph, budget = step
    rows, by = _by_policy(Problem.of(graph), budget)
    assert by["no_swap"].relative is None and by["no_swap"].note.startswith("does not fit")
    assert not any(o.unsupported for o in rows)
    assert by["ideal"].relative == 1.0 and by["capuchin"].relative > 0
    assert ", disjoint pool " in by["swapadvisor"].note
    assert ", shared pool " in by["tfswap"].note
    assert "| OOM |" in paper_bench.markdown(rows, POLICIES)


def test_host_homed_parameters_baselines_are_unsupported_not_oom(step, tmp_path):
    graph, budget = step
    problem = Problem.of(graph, params_start_on_host=True)
    assert problem.host_parameters
    rows, by = _by_policy(problem, budget)
    for name in ("ideal", "no_swap", "capuchin"):
        assert by[name].unsupported and by[name].relative is None
        assert by[name].note.startswith(paper_bench.UNSUPPORTED)
    for name in ("swapadvisor", "tfswap"):
        assert not by[name].unsupported and 0 < by[name].relative <= 1.0 + 1e-9
    # Ideal time is the ops back to back, wherever the parameters start.
    ideal = planners.run("ideal", Problem.of(graph), budget, SPEC).plan.prediction
    assert all(o.ideal_time_s == ideal.ideal_time_s for o in rows)
    table = paper_bench.markdown(rows, POLICIES)
    assert "n/a" in table and "OOM" not in table
    paper_bench.write_csv(rows, tmp_path / "fig6.csv")
    again = paper_bench.read_csv(tmp_path / "fig6.csv")
    assert [o.unsupported for o in again] == [o.unsupported for o in rows]

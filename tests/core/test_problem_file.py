"""Saved planning problems (issue #41): a problem written and read back plans and
simulates to the same numbers, and a file this tfswap cannot read is refused
with what to do."""

import gzip
import json

import pytest

from tfswap.core import planners, problem_file
from tfswap.core.devices import cpu_emulated, device_spec
from tfswap.core.graph import DataflowGraph
from tfswap.core.problem import Problem
from tfswap.core.problem_file import ProblemFileError, SavedProblem
from tfswap.core.search_config import SearchConfig
from tfswap.core.simulator import simulate
from research.synthetic import layered_training_step

# A short search, one thread: the same plan from the same problem.
QUICK = SearchConfig(max_generations=2, seed=0, workers=1)


def _saved(**changes):
    graph = layered_training_step(120, seed=3)
    names = [op.name for op in graph.ops]
    problem = Problem.of(graph, keep=(graph.tensors[-1].name,),
                         small_threshold_bytes=4096, recomputable=names[::2])
    spec = cpu_emulated(link_bytes_per_s=50e6)
    budget = int(0.6 * planners.run("tfswap.order", problem, 1 << 40, spec)
                 .plan.prediction.peak_bytes)
    plan = planners.run("tfswap", problem, budget, spec, config=QUICK).plan
    fields = dict(problem=problem, spec=spec, budget_bytes=budget + 1000,
                  planner_budget_bytes=budget, allocator="pool", plan=plan,
                  row={"measured_peak_bytes": budget - 5, "measured_step_s": 0.25,
                       "identical": True, "note": float("nan")})
    fields.update(changes)
    return SavedProblem(**fields)


def test_a_problem_read_back_plans_and_simulates_as_the_one_written(tmp_path):
    saved = _saved()
    path = problem_file.write(tmp_path / "p" / "cnn.0.6.json.gz", saved)
    got = problem_file.read(path)
    assert got.problem.graph == saved.problem.graph
    assert (got.problem.keep, got.problem.schedule, got.problem.small_threshold_bytes,
            got.problem.params_start_on_host, got.problem.recomputable) == \
        (saved.problem.keep, saved.problem.schedule, saved.problem.small_threshold_bytes,
         saved.problem.params_start_on_host, saved.problem.recomputable)
    assert got.spec == saved.spec and got.plan == saved.plan
    assert (got.budget_bytes, got.planner_budget_bytes, got.allocator) == \
        (saved.budget_bytes, saved.planner_budget_bytes, "pool")
    # JSON has no NaN: a value that is not a number is read back as None.
    assert got.row == {"measured_peak_bytes": saved.planner_budget_bytes - 5,
                       "measured_step_s": 0.25, "identical": True, "note": None}
    # The plan that ran simulates to its prediction, and planning again gives it again.
    again = simulate(got.problem.graph, got.plan, got.spec, keep=got.problem.keep,
                     compiled=got.problem.compiled)
    assert again.step_time_s == saved.plan.prediction.step_time_s
    replanned = planners.run("tfswap", got.problem, got.planner_budget_bytes, got.spec,
                             config=QUICK).plan
    assert replanned.prediction == saved.plan.prediction
    # The same problem, the same bytes (no time stamp): files diff cleanly in git.
    assert problem_file.write(tmp_path / "again.json.gz", saved).read_bytes() == \
        path.read_bytes()


def test_a_problem_without_a_plan_or_row_is_saved_too(tmp_path):
    saved = _saved(plan=None, row={}, spec=device_spec("h100-80g-pcie5-bf16"))
    got = problem_file.read(problem_file.write(tmp_path / "x.json.gz", saved))
    assert got.plan is None and got.row == {} and got.spec == saved.spec


def _rewritten(path, change):
    body = json.loads(gzip.decompress(path.read_bytes()))
    change(body)
    path.write_bytes(gzip.compress(json.dumps(body).encode()))


@pytest.mark.parametrize("change, match", [
    (lambda b: b.update(format_version=99), "format version 99 is not one this tfswap reads"),
    (lambda b: b.update(kind="tfswap.plan"), "not a saved tfswap problem"),
    (lambda b: b.pop("schedule"), "corrupted saved problem"),
    (lambda b: b["ops"][0].pop(), "one op row has 8 values for 9 columns"),
    (lambda b: b.update(format_version=True), "format version True is not one"),
    (lambda b: b["spec"].update(warp_drive=1), "fields this tfswap does not know"),
    (lambda b: b["schedule"].reverse(), "corrupted saved problem"),
    (lambda b: b["tensors"][0].__setitem__(5, "photon"), "corrupted saved problem"),
])
def test_a_file_this_tfswap_cannot_read_is_refused_with_what_to_do(tmp_path, change, match):
    path = problem_file.write(tmp_path / "p.json.gz", _saved(plan=None))
    _rewritten(path, change)
    with pytest.raises(ProblemFileError, match=match):
        problem_file.read(path)


def test_numpy_numbers_are_saved_and_a_time_that_is_not_one_is_refused(tmp_path):
    import dataclasses

    import numpy as np

    saved = _saved(plan=None)
    graph = saved.problem.graph
    ops = [dataclasses.replace(op, time_s=np.float64(op.time_s)) for op in graph.ops]
    tensors = [dataclasses.replace(t, nbytes=np.int64(t.nbytes)) for t in graph.tensors]
    numpy_timed = dataclasses.replace(saved, problem=Problem.of(
        DataflowGraph.build(ops, tensors), keep=saved.problem.keep,
        schedule=saved.problem.schedule, small_threshold_bytes=4096,
        recomputable=saved.problem.recomputable), row={"peak": np.int64(7)})
    got = problem_file.read(problem_file.write(tmp_path / "n.json.gz", numpy_timed))
    assert got.problem.graph == graph and got.row == {"peak": 7}
    ops[3] = dataclasses.replace(ops[3], time_s=float("inf"))
    broken = dataclasses.replace(saved, problem=Problem.of(
        DataflowGraph.build(ops, graph.tensors), keep=saved.problem.keep))
    with pytest.raises(ValueError, match=f"op {ops[3].name!r}: a field is not a finite"):
        problem_file.write(tmp_path / "b.json.gz", broken)


def test_a_file_that_is_not_compressed_json_is_refused(tmp_path):
    path = tmp_path / "p.json.gz"
    path.write_bytes(b"\x80\x04not gzip")   # a pickle, say
    with pytest.raises(ProblemFileError, match="not gzip-compressed JSON"):
        problem_file.read(path)

"""tfswap.plan_store.PlanStore without Keras: a plan per key, saved and loaded
again from its file, refused where it does not apply, against the unmodified step."""

import numpy as np
import pytest

import tfswap
from tfswap import zoo
from tfswap.plan_store import PlanStore, plan_directory
from tfswap.tf import capture, measure, runtime


@pytest.fixture(scope="module")
def step():
    s = zoo.cnn(batch=8, image=16, blocks=3)
    captured = capture.capture(s.concrete_fn)
    peak = measure.measure(captured, captured.graph_def, s.batch, inter_op_threads=1).peak_bytes
    return s, captured, int(0.6 * peak)


def _losses(fn, variables, initial, batch, runs=2):
    for v, x in zip(variables, initial):
        v.assign(x)
    return [float(fn(*batch)["loss"]) for _ in range(runs)]


def test_a_saved_plan_is_loaded_by_the_next_store_and_trains_as_the_unmodified_step(
        step, tmp_path, capsys):
    s, captured, budget = step
    options = tfswap.Options(budget, generations=1, seed=0, workers=1, parameters="device")
    key = ("train", (("x", (8, 16, 16, 3), "float32", None),))
    first = PlanStore(tmp_path, options, name="cnn")
    fast, path, planned = first.plan("train", key, s.concrete_fn, s.batch, background=False)
    assert planned and path.exists() and first.functions[key] is fast
    again = PlanStore(tmp_path, options, name="cnn")
    loaded, same_path, planned = again.plan("train", key, s.concrete_fn, s.batch,
                                            background=False)
    assert not planned and same_path == path and loaded.plan == fast.plan
    variables = captured.variables
    initial = [v.numpy() for v in variables]
    plain = runtime.bind(captured, captured.graph_def)
    assert _losses(loaded, variables, initial, s.batch) == \
        _losses(plain, variables, initial, s.batch)
    # Made for another budget: planned again, and the store says why.
    other = PlanStore(tmp_path, options.replace(memory_budget=budget + 4096), name="cnn",
                      verbose=1)
    _, _, planned = other.plan("train", key, s.concrete_fn, s.batch, background=False)
    assert planned and "was made for a budget of" in capsys.readouterr().out


def test_a_store_without_a_directory_keeps_plans_in_memory_only(step, tmp_path):
    s, _, budget = step
    store = PlanStore(None, tfswap.Options(budget, generations=1, seed=0, workers=1,
                                           parameters="device"))
    fast, path, planned = store.plan("train", "k", s.concrete_fn, s.batch, background=False)
    assert planned and path is None and store.functions == {"k": fast}
    store.forget(["k"])
    assert store.functions == {}
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="must be a directory"):
        plan_directory(tmp_path / "file")
    assert np.all(np.isfinite([float(fast(*s.batch)["loss"])]))


def test_only_the_callers_variables_make_a_plan_stale(step):
    """A step may capture variables that are not the caller's (a ``MirroredStrategy``'s
    collectives' ordering tokens): they never make its plan stale; replacing one the
    caller had when it was planned does (issue #43: every epoch planned again)."""
    s, captured, budget = step
    store = PlanStore(None, tfswap.Options(budget, generations=1, seed=0, workers=1,
                                           parameters="device"), verbose=0, background=False)
    variables = captured.variables
    theirs = {id(v) for v in variables[1:]}     # variables[0] stands for a strategy's
    fast = store.function("k", lambda: (s.concrete_fn, s.batch), live=lambda: theirs)
    assert store.bound_to("k") == theirs
    store.forget_stale(theirs)
    assert store.functions == {"k": fast}
    store.forget_stale(theirs - {id(variables[1])})
    assert store.functions == {}

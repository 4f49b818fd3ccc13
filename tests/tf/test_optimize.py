"""tfswap.optimize end to end on the emulated device, against the unmodified function.

Planner + genetic search on the lowered IR, rewrite, run on the live
variables: at 60% of the unmodified step's measured device peak the
rewritten step must measure at most the budget and train exactly like the
user's function (issue #4's integration clause, issue #5's product).
"""

import dataclasses

import numpy as np
import pytest

import tfswap
from tfswap import pipeline, zoo
from tfswap.core import planners, simulator
from tfswap.core.allocation import default_allocation
from tfswap.core.budget import BudgetError
from tfswap.core.plan import Prediction, Swap
from tfswap.core.planner import plan_swaps
from tfswap.core.simulator import simulate
from tfswap.options import Options
from tfswap.tf import capture, measure

from .equality import assert_same_training

MODELS = {"cnn": lambda: zoo.cnn(batch=32), "transformer": lambda: zoo.transformer(batch=8),
          "inception": lambda: zoo.inception(batch=8, image=16)}


@pytest.fixture(scope="module", params=sorted(MODELS))
def optimized(request):
    step = MODELS[request.param]()
    captured = capture.capture(step.concrete_fn)
    baseline = measure.measure(captured, captured.graph_def, step.batch, inter_op_threads=1)
    budget = int(0.6 * baseline.peak_bytes)
    fast = tfswap.optimize(step.concrete_fn, budget, generations=30, seed=0, workers=1,
                           inputs=step.batch)
    return step, baseline, budget, fast


def test_measured_peak_is_within_the_budget(optimized):
    step, baseline, budget, fast = optimized
    after = measure.measure(fast.captured, fast.graph_def, step.batch)
    print(f"\n{step.name}: unmodified {baseline.peak_bytes} B, budget {budget} B (60%), "
          f"rewritten {after.peak_bytes} B, predicted {fast.plan.prediction.peak_bytes} B, "
          f"{len(fast.plan.swaps)} swaps\n{fast.report()}")
    assert fast.plan.swaps
    assert after.peak_bytes <= budget


def test_trains_like_the_users_function(optimized):
    step, _, _, fast = optimized
    ref, got = assert_same_training(step.concrete_fn, fast, fast.captured.variables, step.batch)
    print(f"\n{step.name}: losses original {ref} optimized {got}")


def test_plan_round_trips_through_a_file(optimized, tmp_path):
    step, _, _, fast = optimized
    path = tmp_path / "step.plan.json"
    fast.plan.save(path)
    again = tfswap.load_plan(path, step.concrete_fn)
    assert again.plan == fast.plan
    assert_same_training(step.concrete_fn, again, again.captured.variables, step.batch)


def test_a_plan_for_another_graph_is_refused(optimized, tmp_path):
    step, _, _, fast = optimized
    other = zoo.cnn(batch=16) if step.name != "cnn" else zoo.transformer(batch=8)
    path = tmp_path / "step.plan.json"
    fast.plan.save(path)
    with pytest.raises(tfswap.PlanMismatchError, match="made for another graph"):
        tfswap.load_plan(path, other.concrete_fn)


def test_a_step_that_fits_gets_no_swaps(optimized):
    step, baseline, _, _ = optimized
    fast = tfswap.optimize(step.concrete_fn, 4 * baseline.peak_bytes, generations=1,
                           workers=1, inputs=step.batch)
    assert not fast.plan.swaps and "already fits" in fast.report()


def test_a_budget_below_the_working_set_names_the_smallest_feasible_one():
    step = MODELS["cnn"]()
    with pytest.raises(BudgetError, match="smallest budget that can work is about"):
        tfswap.optimize(step.concrete_fn, 1 << 20, generations=2, workers=1, inputs=step.batch)


def test_one_options_object_is_what_the_same_keywords_make(monkeypatch):
    # Each setting is declared once (tfswap.Options); optimize takes it as an
    # object or as keywords, and the keywords override the object.
    from tfswap import pipeline

    seen = []

    class Seen(Exception):
        pass

    def prepare(concrete_fn, options):
        seen.append(options)
        raise Seen

    monkeypatch.setattr(pipeline, "prepare", prepare)
    step = MODELS["cnn"]()
    with pytest.raises(Seen):
        tfswap.optimize(step.concrete_fn, "3MiB", generations=30, seed=0, workers=1)
    options = tfswap.Options("3MiB", generations=30, seed=1, workers=1)
    with pytest.raises(Seen):
        tfswap.optimize(step.concrete_fn, options=options, seed=0)
    assert seen[0] == seen[1] and seen[1].seed == 0
    with pytest.raises(TypeError, match="unknown setting.*'generation'"):
        tfswap.optimize(step.concrete_fn, "3MiB", generation=3)
    with pytest.raises(TypeError, match="tfswap.Options"):
        tfswap.optimize(step.concrete_fn, options={"memory_budget": "3MiB"})


def test_a_profile_given_is_planned_on_again_and_one_of_another_step_is_refused(optimized):
    step, _, budget, fast = optimized
    # The same profile and seed give the same plan (verified plans may differ: a
    # measured excess re-plans, and measurements vary).
    plans = [tfswap.optimize(step.concrete_fn, budget, profile=fast.profile, generations=5,
                             seed=0, workers=1, inputs=step.batch, verify_rounds=0)
             for _ in range(2)]
    assert plans[0].profile is fast.profile and plans[0].plan == plans[1].plan
    assert "the one given (not profiled again)" in plans[0].report()
    other = MODELS["transformer" if step.name != "transformer" else "cnn"]()
    with pytest.raises(ValueError, match="the profile given has no op .*another step"):
        tfswap.optimize(other.concrete_fn, budget, profile=fast.profile, generations=1,
                        workers=1, inputs=other.batch)


def _one_class(problem, budget_bytes, spec, **_):
    """tfswap.order's plan in a pool of one size class, the largest buffer's: a
    search's pool may lump sizes together like this (issue #44)."""
    cg = problem.compiled
    pool = default_allocation(cg, cg.order_of(problem.schedule), budget_bytes,
                              cls=[0] * len(cg.ts))
    return planners.PlanResult(plan_swaps(
        problem.graph, budget_bytes, spec, schedule=problem.schedule, keep=problem.keep,
        allocation=pool, params_start_on_host=problem.params_start_on_host, compiled=cg))


def _planned_and_measured(step, budget_factor: int, planner: str):
    """``step`` planned by ``planner`` at ``budget_factor`` times its measured peak,
    with the memory model alone, rewritten and measured with one executor thread
    (the order the model simulates): (unmodified, prepared, planned, materialized,
    measured)."""
    captured = capture.capture(step.concrete_fn)
    baseline = measure.measure(captured, captured.graph_def, step.batch, inter_op_threads=1)
    prepared = pipeline.prepare(step.concrete_fn, Options.of(
        budget_factor * baseline.peak_bytes, inputs=step.batch, profile="trace",
        parameters="device", verify_rounds=0, workers=1))
    planned = pipeline.plan(prepared, pipeline.first_attempt(prepared), planner=planner)
    made = pipeline.materialize(planned)
    after = measure.measure(prepared.captured, made.rewritten.graph_def, step.batch,
                            inter_op_threads=1)
    return baseline, prepared, planned, made, after


def test_the_predicted_peak_is_what_tensorflow_holds_not_the_pools_classes(monkeypatch):
    # Issue #44: a plan whose pool puts small buffers in a large size class was
    # predicted at the pool's objects (ResNet-50's fetched kernels in 9 MiB
    # objects: +24%), while TensorFlow's allocator gives each buffer its own bytes.
    monkeypatch.setitem(planners.PLANNERS, "test.one_class", _one_class)
    step = zoo.mlp(batch=16, features=64, hidden=128, layers=2)
    baseline, prepared, planned, made, after = _planned_and_measured(step, 4, "test.one_class")
    problem, plan = planned.attempt.step.problem, planned.plan
    assert len(plan.allocation.class_bytes) == 1
    pool_peak = simulate(problem.graph, plan, prepared.spec, keep=problem.keep,
                         compiled=problem.compiled).peak_bytes
    predicted = plan.prediction.peak_bytes
    print(f"\nunmodified {baseline.peak_bytes} B, rewritten {after.peak_bytes} B, predicted "
          f"{predicted} B, the pool's objects {pool_peak} B")
    assert pool_peak > 1.5 * after.peak_bytes   # the step exhibits the cause
    # Within the tensors under the small-tensor threshold (scalars, shapes), which
    # the model counts by static shape and the trace by what the kernels allocated.
    assert abs(predicted - after.peak_bytes) <= problem.small_threshold_bytes
    assert_same_training(step.concrete_fn, made.bound, prepared.captured.variables, step.batch)


def _wide_middle(batch=1024, features=8, hidden=128, wide=512, classes=10):
    """Two ReLU layers, a wide tanh layer, logits; plain SGD: the step's peak is
    the wide layer's backward pass (its output and its gradient, 2 MiB each),
    well after the first layers' activations (512 KiB each) leave and well
    before their gradients read them again.  The last two layers are frozen, so
    no weight gradient of theirs, which TF's order may put anywhere, keeps a
    wide tensor alive into the first layers' backward pass."""
    import keras

    keras.utils.set_random_seed(0)
    L = keras.layers
    model = keras.Sequential([keras.Input((features,)), L.Dense(hidden, activation="relu"),
                              L.Dense(hidden, activation="relu"),
                              L.Dense(wide, activation="tanh", trainable=False),
                              L.Dense(classes, trainable=False)], name="wide")
    rng = np.random.default_rng(0)
    data = (rng.standard_normal((batch, features), dtype=np.float32),
            rng.integers(0, classes, batch).astype(np.int32))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return zoo._train_step("wide", model, data, loss, optimizer="sgd")


def _early_swap_in(problem, budget_bytes, spec, **_):
    """Both ReLU activations out after their last forward reader and back for
    their gradients: the second's swap-in triggered right before its first
    reader, the first's (read later, so behind it on the link in the plan's
    stream order) as soon as its swap-out is done, long before its reader."""
    g, cg, schedule = problem.graph, problem.compiled, problem.schedule
    pos = {op: k for k, op in enumerate(schedule)}

    def trip(tensor):
        readers = sorted((g.ops[c].name for c in tensor.consumers), key=pos.__getitem__)
        back = tuple(r for r in readers if r.startswith("gradient_tape/"))
        return [r for r in readers if r not in back][-1], back

    first, second = sorted((t for t in g.tensors if t.name.endswith("/Relu:0")
                            and not t.name.startswith("gradient_tape/")),
                           key=lambda t: t.producer)
    (out1, back1), (out2, back2) = trip(first), trip(second)
    need1, need2 = (min(pos[c] for c in back) for back in (back1, back2))
    assert need2 < need1   # the second comes back first
    swaps = (Swap(second.name, out_after=out2, in_after=schedule[need2 - 1], consumers=back2,
                  bytes=second.nbytes),
             Swap(first.name, out_after=out1, in_after=out1, consumers=back1,
                  bytes=first.nbytes))
    unswapped = plan_swaps(g, 1 << 40, spec, schedule=schedule, keep=problem.keep,
                           params_start_on_host=problem.params_start_on_host, compiled=cg)
    plan = dataclasses.replace(unswapped, swaps=swaps,
                               allocation=default_allocation(cg, cg.order_of(schedule), 1 << 40))
    r = simulate(g, plan, spec, keep=problem.keep, compiled=cg)
    return planners.PlanResult(dataclasses.replace(plan, planner="test.early_swap_in",
                                                   prediction=Prediction(
        peak_bytes=r.peak_bytes, step_time_s=r.step_time_s, ideal_time_s=r.ideal_time_s)))


def test_the_predicted_peak_holds_a_swap_in_from_when_its_op_runs(monkeypatch):
    # Issue #44: TensorFlow's SwapIn op allocates its output once its trigger and
    # its swap-out are done, while the plan's copy of it waits on the link behind
    # a copy needed sooner; counted from the copy's start, the first activation's
    # 512 KiB was missing from the wide layer's backward pass, the step's peak.
    monkeypatch.setitem(planners.PLANNERS, "test.early_swap_in", _early_swap_in)
    step = _wide_middle()
    # One executor thread (_planned_and_measured): with two, TensorFlow may also
    # start the other swap-in early (5,643,324 B measured once in a fresh-clone
    # run, a second activation more), which the model, one compute stream, does
    # not bound.
    baseline, prepared, planned, made, after = _planned_and_measured(step, 2,
                                                                     "test.early_swap_in")
    problem, plan = planned.attempt.step.problem, planned.plan
    cg = problem.compiled
    run = simulate(problem.graph, plan, prepared.spec, events=True, keep=problem.keep,
                   compiled=cg)
    # The model's peak with each swap-in counted from its copy's start (the pool's
    # takes), as before: one activation short (the fed batch left out of both, as
    # the emulated device never allocates it).
    copy_start = simulator.live_peak_bytes_timed(
        dataclasses.replace(run, held_events=run.allocation_events), cg, plan.schedule,
        unheld=pipeline.fed_arguments(prepared, problem.graph))
    early = max(s.bytes for s in plan.swaps)   # both activations: 512 KiB
    predicted = plan.prediction.peak_bytes
    print(f"\nunmodified {baseline.peak_bytes} B, rewritten {after.peak_bytes} B, predicted "
          f"{predicted} B, counted from the copies' starts {copy_start} B")
    assert predicted - copy_start == early          # the model holds it from its op
    assert after.peak_bytes > copy_start + early // 2   # and so does TensorFlow
    # Never under by more than the tensors below the small-tensor threshold
    # (counted by static shape, traced as the kernels allocated them); above by
    # the step's input batch (fed, not allocated by the step) and such.
    assert after.peak_bytes - problem.small_threshold_bytes <= predicted
    assert predicted <= 1.02 * after.peak_bytes
    assert_same_training(step.concrete_fn, made.bound, prepared.captured.variables, step.batch)


def test_a_plan_made_to_the_held_bytes_that_measures_over_is_planned_again_in_its_arena():
    # Where TensorFlow's allocator serves the step and the plan is measured, it is
    # made to the bytes the step holds, with no slack for what the model misses;
    # measured over, it is planned again with its shared arena fitting the budget,
    # and still the bytes it holds.
    from tfswap.budget_arena import allocator_of
    from tfswap.planner_settings import planner_settings

    step = zoo.cnn(batch=8, image=8, channels=4, blocks=3)
    prepared = pipeline.prepare(step.concrete_fn, Options.of(
        1.0, generations=2, seed=0, workers=1, inputs=step.batch))
    prepared = pipeline.with_budget(prepared, int(0.7 * prepared.profile.peak_bytes))
    attempt = pipeline.first_attempt(prepared)
    assert planner_settings("tfswap", prepared, attempt)["allocator"] == "exact"
    verified = pipeline.verify(pipeline.materialize(pipeline.plan(prepared, attempt)))
    assert verified.within_budget
    missed = dataclasses.replace(verified, measured_peak_bytes=prepared.budget_bytes + 1)
    again = pipeline.refine(missed)
    assert not again.exact_fit and again.replans == 1 and "shared arena" in again.notes[-1]
    assert allocator_of(prepared, again) == "guarded"
    planned = pipeline.plan(prepared, again)
    assert planned.found.allocation.total_bytes <= again.planner_budget
    problem = again.step.problem
    assert simulator.held_peak_bytes(problem.graph, planned.found, prepared.spec, keep=problem.keep,
                           compiled=problem.compiled) <= again.planner_budget
    # Unmeasured (verify_rounds=0), plans keep the arena's slack from the start.
    unmeasured = dataclasses.replace(prepared, options=dataclasses.replace(
        prepared.options, verify_rounds=0))
    assert allocator_of(unmeasured, pipeline.first_attempt(unmeasured)) == "guarded"

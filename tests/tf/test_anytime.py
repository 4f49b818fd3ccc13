"""tfswap.optimize(..., background=True) and the plan switch (tfswap.anytime), on the
emulated device, against the unmodified function.

The step starts on a first plan, verified; a plan the background search found
takes over at a call boundary.  Every plan computes what the user's step
computes, so training across a switch is the unmodified step's; a plan that
fails is never used; the plan switched from is released.  No timing is asserted.
"""

import dataclasses
import gc
import threading
import weakref

import pytest

import tfswap
from tfswap import anytime, pipeline, zoo
from tfswap.tf import capture, measure

from .equality import assert_same_training


@pytest.fixture(scope="module")
def step():
    s = zoo.cnn(batch=16, blocks=8)
    captured = capture.capture(s.concrete_fn)
    peak = measure.measure(captured, captured.graph_def, s.batch, inter_op_threads=1).peak_bytes
    return s, int(0.6 * peak)


def _optimize(step, budget, **kwargs):
    options = dict(generations=0, seed=0, workers=1, inputs=step.batch)
    options.update(kwargs)
    return tfswap.optimize(step.concrete_fn, budget, **options)


def _faster(fast, than):
    """``fast`` labelled as predicted twice as fast as ``than``: a plan the switch
    must take."""
    plan = dataclasses.replace(fast.plan, prediction=dataclasses.replace(
        fast.plan.prediction, step_time_s=than.plan.prediction.step_time_s / 2))
    return dataclasses.replace(fast, plan=plan)


def test_background_optimize_starts_on_a_verified_plan_and_trains_like_the_original(step):
    s, budget = step
    fast = _optimize(s, budget, generations=3, background=True)
    assert isinstance(fast, tfswap.AnytimeFunction)
    first = fast.plan
    assert first.swaps and fast.measured_peak_bytes <= budget
    assert_same_training(s.concrete_fn, fast, fast.captured.variables, s.batch)
    assert fast.wait(300)
    assert not fast.searching and fast.error is None
    assert_same_training(s.concrete_fn, fast, fast.captured.variables, s.batch)
    spans = fast.plans
    assert spans[0].plan_id == first.id and spans[0].first_call == 1
    assert sum(1 for span in spans if span.last_call is None) == 1
    if len(spans) == 2:   # the search found a faster plan: it ran from the 4th call
        assert spans[0].last_call == 3 and spans[1].first_call == 4
        assert fast.plan.prediction.step_time_s < first.prediction.step_time_s
        assert measure.measure(fast.captured, fast.graph_def, s.batch).peak_bytes <= budget
    text = fast.report()
    assert "plans of this function (anytime mode)" in text and first.id in text


def test_a_step_that_fits_starts_unmodified_and_searches_nothing(step):
    s, budget = step
    fast = _optimize(s, 10 * budget, background=True)
    assert fast.plan.planner == pipeline.NO_SWAP and not fast.searching
    assert fast.outcome == "nothing to search"


def _switching(first, other):
    """An AnytimeFunction on ``first`` whose search hands over ``other`` (labelled
    faster) once ``release`` is set."""
    release = threading.Event()
    faster = _faster(other, first)

    def search(stop_when, between_calls):
        release.wait(60)
        with between_calls():
            return faster

    return anytime.AnytimeFunction(first, search), release


def test_a_switch_mid_training_changes_nothing_in_the_results(step):
    s, budget = step
    first = _optimize(s, budget)
    other = _optimize(s, budget, planner="swapadvisor")
    assert other.plan.id != first.plan.id
    fast, release = _switching(first, other)
    switches = []
    # The callback may read the function it is called from (its lock is reentrant).
    fast.add_switch_callback(
        lambda old, new: switches.append((old.plan.id, new.plan.id, len(calls),
                                          len(fast.plans))))
    calls = []

    def training(*batch):
        out = fast(*batch)
        calls.append(1)
        if len(calls) == 2:   # the search ends between the 2nd and 3rd call
            release.set()
            assert fast.wait(60)
        return out

    assert_same_training(s.concrete_fn, training, first.captured.variables, s.batch, steps=4)
    assert fast.error is None, fast.outcome
    spans = fast.plans
    assert [(x.plan_id, x.first_call, x.last_call) for x in spans] == [
        (first.plan.id, 1, 2), (_faster(other, first).plan.id, 3, None)]
    assert fast.plan.id == _faster(other, first).plan.id
    assert switches == [(first.plan.id, fast.plan.id, 2, 2)]   # before the 3rd call ran


def test_the_plan_switched_from_is_released(step):
    s, budget = step

    def start():
        first = _optimize(s, budget)
        other = _optimize(s, budget, planner="swapadvisor")
        fast, release = _switching(first, other)
        return fast, release, weakref.ref(first.bound), weakref.ref(first)

    fast, release, old_bound, old = start()
    fast(*s.batch)
    release.set()
    assert fast.wait(60)
    fast(*s.batch)     # the switch
    gc.collect()
    assert old() is None and old_bound() is None


def test_a_background_plan_that_fails_is_never_used(step):
    s, budget = step
    first = _optimize(s, budget)

    def failing(stop_when, between_calls):
        raise tfswap.BudgetError("measured over the budget after every remedy")

    fast = anytime.AnytimeFunction(first, failing)
    assert fast.wait(60)
    fast(*s.batch)
    assert fast.plan.id == first.plan.id and len(fast.plans) == 1
    assert isinstance(fast.error, tfswap.BudgetError) and fast.outcome.startswith("failed")
    saved = []
    fast.add_done_callback(saved.append)
    assert saved == []     # nothing is saved from a failed search


def test_a_background_plan_measured_over_the_budget_is_never_used(step, monkeypatch):
    """The real search in the background, its every verification made to measure
    over the budget: it re-plans, gives up, and the first plan stays."""
    s, budget = step
    verify = pipeline.verify

    def over_in_the_background(made):
        verified = verify(made)
        if threading.current_thread().name != "tfswap-background-search":
            return verified
        return dataclasses.replace(verified, measured_peak_bytes=budget + 1)

    monkeypatch.setattr(pipeline, "verify", over_in_the_background)
    fast = _optimize(s, budget, generations=2, background=True, verify_rounds=1)
    first = fast.plan
    assert fast.wait(300)
    fast(*s.batch)
    assert fast.plan.id == first.id and len(fast.plans) == 1
    assert isinstance(fast.error, tfswap.BudgetError)


def test_a_stopped_search_ends_before_its_verification_and_switches_nothing(step):
    s, budget = step
    first = _optimize(s, budget)
    other = _optimize(s, budget, planner="swapadvisor")
    fast, release = _switching(first, other)
    fast.stop()
    release.set()
    assert fast.wait(60)
    fast(*s.batch)
    assert fast.outcome.startswith("stopped") and fast.plan.id == first.plan.id


def test_background_must_be_a_bool(step):
    s, budget = step
    with pytest.raises(ValueError, match="background"):
        _optimize(s, budget, background="yes")

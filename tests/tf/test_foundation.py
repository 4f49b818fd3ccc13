"""The foundation end to end: capture -> hand plan -> rewrite -> run on live variables.

Every check compares the rewritten step against the unmodified function.
"""

import dataclasses

import pytest
import tensorflow as tf

from tfswap import zoo
from tfswap.tf import capture, measure, rewrite, runtime
from research import quickplan
from tfswap.tf.emulate import DEVICE, HOST

from .equality import assert_same_training


MODELS = {"cnn": lambda: zoo.cnn(batch=32), "transformer": lambda: zoo.transformer(batch=8)}


@pytest.fixture(scope="module", params=sorted(MODELS))
def planned(request):
    step = MODELS[request.param]()
    captured = capture.capture(step.concrete_fn)
    quick = quickplan.heuristic_plan(captured, step.batch, swaps=3)
    rewritten = rewrite.rewrite(captured, quick.plan, DEVICE, HOST)
    return step, captured, quick, rewritten


def test_plan_swaps_three_activations_across_forward_and_backward(planned):
    _, _, quick, _ = planned
    assert len(quick.plan.swaps) == 3
    assert all(s.bytes >= 256 * 1024 for s in quick.plan.swaps)
    assert quick.predicted_freed_bytes > 0


def test_rewritten_step_is_bit_identical_to_the_unmodified_graph(planned):
    """Same graph, same runtime settings, swaps and schedule added: not one bit changes."""
    step, captured, _, rewritten = planned
    unmodified = runtime.bind(captured, captured.graph_def)
    fn = runtime.bind(captured, rewritten.graph_def)
    ref, got = assert_same_training(unmodified, fn, captured.variables, step.batch, exact=True)
    print(f"\n{step.name}: losses unmodified {ref} rewritten {got}")


def test_rewritten_step_trains_like_the_users_function(planned):
    """Against the user's own ConcreteFunction (run by TF with Grappler on): the
    same losses and variables after 3 steps, within 1e-6 relative (equality.RTOL)."""
    step, captured, _, rewritten = planned
    fn = runtime.bind(captured, rewritten.graph_def)
    ref, got = assert_same_training(step.concrete_fn, fn, captured.variables, step.batch)
    print(f"\n{step.name}: losses original {ref} rewritten {got}")


def test_measured_peak_drops_by_at_least_80_percent_of_predicted(planned):
    """The prediction is the plan's schedule with and without its swaps, so the
    baseline runs in that schedule too (the same control chain, no swaps). The
    unmodified graph, free to run in any order, peaked anywhere from 11.20 to 12.37 MB
    on the transformer from one process to the next, more than the swaps free
    (1.96 MB: 2 of 5 runs failed); against the chained baseline the bytes freed matched
    the prediction within 0.2 MB in 6 runs of 6."""
    step, captured, quick, rewritten = planned
    chained = rewrite.rewrite(captured, dataclasses.replace(quick.plan, swaps=()), DEVICE, HOST)
    before = measure.measure(captured, chained.graph_def, step.batch, runs=5)
    after = measure.measure(captured, rewritten.graph_def, step.batch, runs=5)
    freed = before.peak_bytes - after.peak_bytes
    print(f"\n{step.name}: device peak unmodified {before.peak_bytes} B, rewritten "
          f"{after.peak_bytes} B, freed {freed} B, predicted {quick.predicted_freed_bytes} B")
    assert freed >= 0.8 * quick.predicted_freed_bytes


def test_swaps_and_schedule_survive_execution(planned):
    step, captured, quick, rewritten = planned
    m = measure.measure(captured, rewritten.graph_def, step.batch, runs=1, warmup=0)
    executed = list(m.executed_ops)
    for nodes in rewritten.swaps:
        assert nodes.swap_out in executed and nodes.swap_in in executed
        assert m.node_devices[nodes.swap_out].endswith("CPU:0")
        assert m.node_devices[nodes.swap_in].endswith("CPU:0")
    # Grappler folds shape computations into constants and bypasses redundant
    # reshapes, which then float free of the chain; the ops that hold memory
    # (outputs of 64 KiB or more) must run exactly in the planned order.
    graph = quick.graph
    ran = [op for op in quick.plan.schedule
           if m.executed_types.get(op) == graph.op(op).type
           and max((graph.tensor(t).nbytes for t in graph.op(op).outputs), default=0) >= 1 << 16]
    assert len(ran) >= 10
    for first, second in zip(ran, ran[1:]):
        assert m.ran_before(first, second), f"{second} ran before {first}"
    for swap, nodes in zip(quick.plan.swaps, rewritten.swaps):
        if swap.out_after in m.start_micros:
            assert m.ran_before(swap.out_after, nodes.swap_out)
        if swap.in_after in m.start_micros:
            assert m.ran_before(swap.in_after, nodes.swap_in)
        for consumer in swap.consumers:
            if consumer in m.start_micros:
                assert m.ran_before(nodes.swap_in, consumer)


def test_grappler_keeps_swaps_in_the_function_runtime(planned):
    """The tf.function path (not the measuring Session) also runs the swaps."""
    from tensorflow.python.eager import context

    step, captured, _, rewritten = planned
    fn = runtime.bind(captured, rewritten.graph_def)
    initial = [v.numpy() for v in captured.variables]
    context.enable_run_metadata()
    try:
        fn(*step.batch)
        metadata = context.export_run_metadata()
    finally:
        context.disable_run_metadata()
        for var, value in zip(captured.variables, initial):
            var.assign(value)
    optimized = [n for g in metadata.function_graphs for n in g.post_optimization_graph.node]
    names = {n.name: n for n in optimized}
    for nodes in rewritten.swaps:
        assert nodes.swap_out in names and nodes.swap_in in names


def test_rewrite_recomputes_only_what_may_run_twice(planned):
    """A recompute of an op not offered for recomputation is refused, saying why; one
    of an offered op is executed by a copy of it (tests/tf/test_recompute.py trains
    such plans)."""
    import dataclasses

    from tfswap.tf import recomputable

    _, captured, quick, _ = planned
    offered = recomputable.recomputable_ops(captured)
    for swap in quick.plan.swaps:
        recompute = dataclasses.replace(swap, kind="recompute", in_after="", in_wait_for=(),
                                        out_before=())
        plan = dataclasses.replace(quick.plan, swaps=(recompute,))
        if swap.tensor.rpartition(":")[0] in offered:
            rewritten = rewrite.rewrite(captured, plan, DEVICE, HOST)
            clones = [n for n in rewritten.graph_def.node if n.name.startswith("tfswap/recompute")]
            assert clones
            # The readers read the copy (directly, or through a copy of a view of it).
            assert all(any(i.startswith("tfswap/") for i in n.input)
                       for n in rewritten.graph_def.node if n.name in swap.consumers)
        else:
            with pytest.raises(rewrite.RewriteError, match="cannot be recomputed"):
                rewrite.rewrite(captured, plan, DEVICE, HOST)


def test_measure_times_untraced_runs_only_when_asked(planned):
    """Traced runs give the peak; untraced ones, asked for, the step as users run it."""
    step, captured, _, rewritten = planned
    traced = measure.measure(captured, rewritten.graph_def, step.batch, runs=1)
    both = measure.measure(captured, rewritten.graph_def, step.batch, runs=1, untraced_runs=2)
    assert traced.untraced_step_time_s is None
    assert both.untraced_step_time_s is not None and both.untraced_step_time_s > 0
    assert both.peak_bytes > 0 and both.step_time_s > 0

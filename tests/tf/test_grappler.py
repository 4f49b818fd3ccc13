"""Grappler at capture time (tfswap.tf.grappler): functional control flow stays
one op, and the step captured that way trains like the user's function."""

import pytest

from tfswap import zoo
from tfswap.tf import capture, grappler, runtime

from .equality import assert_same_training

V1_CONTROL_FLOW = {"Enter", "Exit", "Switch", "Merge", "NextIteration", "LoopCond"}


@pytest.fixture(scope="module")
def loop_step():
    step = zoo.lstm(batch=4, steps=6, features=8, units=16, unroll=False)
    return step, capture.capture(step.concrete_fn)


def test_while_loops_are_not_lowered_into_a_cycle(loop_step):
    _, captured = loop_step
    types = [n.op for n in captured.graph_def.node]
    assert captured.grappler_optimized
    assert grappler.has_functional_control_flow(captured.graph_def)
    assert sum(t in ("While", "StatelessWhile") for t in types) == 4  # 2 layers, fwd + grad
    assert not V1_CONTROL_FLOW & set(types)


def test_a_step_without_control_flow_keeps_every_pass(loop_step):
    step = zoo.cnn(batch=2, image=8, channels=4)
    captured = capture.capture(step.concrete_fn)
    assert not grappler.has_functional_control_flow(captured.graph_def)
    rewrite = grappler.rewriter_config(captured.graph_def).graph_options.rewrite_options
    assert rewrite.function_optimization == rewrite.DEFAULT
    _, loop = loop_step
    rewrite = grappler.rewriter_config(loop.graph_def).graph_options.rewrite_options
    assert rewrite.function_optimization == rewrite.OFF


def test_captured_while_step_trains_like_the_users_function(loop_step):
    """The function runtime lowers the loop itself when it runs either graph;
    skipping Grappler's function optimiser at capture changes not one bit
    (measured: losses and every variable equal after 3 steps)."""
    step, captured = loop_step
    fn = runtime.bind(captured, captured.graph_def)
    ref, got = assert_same_training(step.concrete_fn, fn, captured.variables, step.batch,
                                    exact=True)
    print(f"\nlstm_loop: losses original {ref} captured {got}")


def test_shape_dependent_rewrites_fire_as_in_the_users_function():
    """Grappler knows the arguments' and variables' shapes at capture, as the
    function runtime does: a BERT-style step's LayerNorm additions become an
    AddN there, and the captured step trains bit-identically to the function
    (before, 132 of its 137 variables differed in the last bits after 3 steps)."""
    reference, step = zoo.bert(), zoo.bert()
    captured = capture.capture(step.concrete_fn)
    assert any("AddOpsRewrite" in n.name for n in captured.graph_def.node)
    assert not any(n.name.endswith(grappler.STAND_IN_SUFFIX) or n.op == "VarHandleOp"
                   for n in captured.graph_def.node)
    bound = runtime.bind(captured, captured.graph_def)
    for _ in range(3):
        assert float(bound(*step.batch)["loss"]) == \
            float(reference.concrete_fn(*reference.batch)["loss"])
    for a, b in zip(list(reference.model.weights) + list(reference.optimizer.variables),
                    list(step.model.weights) + list(step.optimizer.variables)):
        assert (a.numpy() == b.numpy()).all(), a.path

"""The memory-greedy list schedule (tfswap.core.schedules): a topological order
that frees a gradient as soon as the op that can free it is ready, and the
default planner plans on it where TF's order holds the gradient too long."""

import numpy as np
import pytest

from research.synthetic import layered_training_step
from tfswap.core import planners
from tfswap.core.graph import DataflowGraph, Op, Tensor
from tfswap.core.problem import Problem
from tfswap.core.schedules import memory_greedy
from tfswap.core.search import SearchConfig
from tests.core.plan_checks import MB, SPEC


def _live_peak(problem, schedule):
    cg = problem.compiled
    order = cg.order_of(schedule)
    first, last = cg.buffer_intervals(order)
    delta = np.zeros(len(order) + 1, dtype=np.int64)
    used = last >= 0
    np.add.at(delta, first[used], cg.buf_bytes[used])
    np.add.at(delta, last[used] + 1, -cg.buf_bytes[used])
    return int(np.cumsum(delta).max())


def _late_weight_gradient():
    """A head and two layers' backward pass as TF's executor orders it: the head's
    weight gradient ``dw_head`` (reading the 4 MB ``dlogits``) runs after the
    layers' backward ops, so ``dlogits`` is held while they make their own
    large gradients."""
    sizes = {"x": MB, "a1": 2 * MB, "a2": 2 * MB, "logits": 4 * MB, "dlogits": 4 * MB,
             "dh2": 8 * MB, "dh1": 8 * MB, "dw_head": MB // 2, "dw2": MB // 2, "dw1": MB // 2}
    ops = [Op("x", "Const", time_s=1e-4),
           Op("a1", "MatMul", ("x:0",), time_s=1e-3),
           Op("a2", "MatMul", ("a1:0",), time_s=1e-3),
           Op("logits", "MatMul", ("a2:0",), time_s=1e-3),
           Op("dlogits", "SoftmaxGrad", ("logits:0",), time_s=1e-3),
           Op("dh2", "MatMul", ("dlogits:0",), time_s=1e-3),
           Op("dw2", "MatMul", ("dh2:0", "a1:0"), time_s=1e-3),
           Op("dh1", "MatMul", ("dh2:0",), time_s=1e-3),
           Op("dw1", "MatMul", ("dh1:0", "x:0"), time_s=1e-3),
           Op("dw_head", "MatMul", ("dlogits:0", "a2:0"), time_s=1e-3)]
    graph = DataflowGraph.build(ops, [Tensor(f"{n}:0", nbytes=s) for n, s in sizes.items()])
    tf_order = [op.name for op in ops]
    return Problem.of(graph, schedule=tf_order, small_threshold_bytes=0,
                      keep=["dw_head:0", "dw2:0", "dw1:0"])


def test_the_greedy_schedule_frees_a_gradient_tensorflow_holds():
    problem = _late_weight_gradient()
    greedy = memory_greedy(problem.compiled, problem.schedule)
    assert problem.graph.is_topological([problem.graph.op_id(n) for n in greedy])
    # dw_head reads dlogits for the last time: it runs before dh1 makes its gradient.
    assert greedy.index("dw_head") < greedy.index("dh1")
    assert _live_peak(problem, greedy) < _live_peak(problem, problem.schedule)


def test_the_default_planner_plans_on_the_greedy_schedule_where_it_moves_less():
    problem = _late_weight_gradient()
    # Each buffer its own bytes ("exact"): what must fit is the bytes held at once.
    budget = int(1.1 * _live_peak(problem, memory_greedy(problem.compiled, problem.schedule)))
    assert budget < _live_peak(problem, problem.schedule)
    on_tf = planners.run("tfswap.bytes", problem, budget, SPEC, memory="live").plan
    assert on_tf.prediction.swap_out_bytes > 0   # TF's order must move dlogits or more
    best = planners.run("tfswap", problem, budget, SPEC, allocator="exact",
                        config=SearchConfig(max_generations=0, workers=1, seed=0)).plan
    assert best.prediction.step_time_s < on_tf.prediction.step_time_s
    assert best.prediction.peak_bytes <= budget


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_the_greedy_schedule_is_a_topological_order_of_any_step(seed):
    graph = layered_training_step(80, seed=seed)
    problem = Problem.of(graph)
    greedy = memory_greedy(problem.compiled, problem.schedule)
    assert sorted(greedy) == sorted(op.name for op in graph.ops)
    assert graph.is_topological([graph.op_id(n) for n in greedy])

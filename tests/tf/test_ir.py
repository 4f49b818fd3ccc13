"""IR on real train steps: every GraphDef node accounted for, exact bytes, and the
device peak the IR predicts for the unmodified step against the measured one.

The peak is measured on the emulated device with one inter-op thread (the
trace profiler's run), and predicted from the IR in the order TF executed.
"""

import numpy as np
import pytest
import tensorflow as tf

from tfswap import zoo
from tfswap.core import liveness
from tfswap.core.costmodel import base_type
from tfswap.tf import capture, ir, profile

MODELS = {
    "resnet50": lambda: zoo.resnet50(batch=2, image=32),
    "bert": lambda: zoo.bert(batch=2, seq=32, dim=64, layers=2, vocab=512),
    "lstm": lambda: zoo.lstm(batch=4, steps=12, features=16, units=32),
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def lowered(request):
    step = MODELS[request.param]()
    captured = capture.capture(step.concrete_fn)
    prof = profile.trace(captured, step.batch, runs=2, warmup=1)
    return request.param, captured, prof, ir.lower(captured, prof)


def test_every_graphdef_node_is_an_ir_op_or_a_documented_fold(lowered):
    name, captured, _, low = lowered
    nodes = {n.name: n for n in captured.graph_def.node}
    assert set(low.node_map) | set(low.pruned) == set(nodes)
    assert not set(low.node_map) & set(low.pruned)
    ir_ops = {op.name for op in low.graph.ops}
    assert set(low.node_map.values()) <= ir_ops
    for node, target in low.folded.items():
        kind = nodes[node].op
        # folds are bookkeeping: shape queries, NoOps, handles, or constant-derived
        # nodes with tiny outputs
        assert kind in ir.ALWAYS_FOLD or kind in ("Const", "Placeholder") or \
            max((low_bytes for low_bytes in _static_output_bytes(captured, node)),
                default=0) <= ir.DEFAULT_FOLD_BYTES, (node, kind)
    print(f"\n{name}: {len(nodes)} GraphDef nodes -> {len(low.graph.ops)} IR ops, "
          f"{len(low.folded)} folded, {len(low.pruned)} pruned")


def _static_output_bytes(captured, node_name, _cache={}):
    key = id(captured)
    if key not in _cache:
        g = tf.Graph()
        with g.as_default():
            tf.graph_util.import_graph_def(captured.graph_def, name="")
        _cache[key] = g
    return [ir.tensor_bytes(t) for t in _cache[key].get_operation_by_name(node_name).outputs]


def test_tensor_bytes_are_shape_times_dtype(lowered):
    _, _, _, low = lowered
    sizes = {"float32": 4, "int32": 4, "int64": 8, "bool": 1, "float16": 2, "float64": 8}
    checked = 0
    for t in low.graph.tensors:
        if t.dtype in sizes and t.shape and all(d is not None for d in t.shape):
            assert t.nbytes == int(np.prod(t.shape)) * sizes[t.dtype], t.name
            checked += 1
    assert checked > 100


def test_predicted_device_peak_is_within_10_percent_of_measured(lowered):
    name, _, prof, low = lowered
    predicted = low.predicted_peak(low.tf_schedule(prof.executed_order))
    measured = prof.peak_bytes
    print(f"\n{name}: device peak measured {measured} B, IR predicted {predicted} B "
          f"({(predicted - measured) / measured:+.2%})")
    assert abs(predicted - measured) <= 0.10 * measured


def test_trace_aliases_and_scratch_reach_the_graph(lowered):
    _, _, _, low = lowered
    g = low.graph
    aliased = [t for t in g.tensors if t.alias_of]
    assert aliased, "TF forwards buffers in place in every train step"
    for t in aliased:
        assert liveness.buffer_root(g, t.name) == t.alias_of   # alias_of names the owner
    assert any(op.time_s > 0 for op in g.ops)


def test_phases_and_kinds_from_reachability(lowered):
    name, captured, _, low = lowered
    g = low.graph
    phases = {op.phase for op in g.ops}
    assert {"forward", "backward", "update"} <= phases
    by_type, by_base = {}, {}
    for op in g.ops:
        by_type.setdefault(op.type, set()).add(op.phase)
        # Grappler fuses Conv2D + BiasAdd (+ Relu) into _FusedConv2D; the phase
        # belongs to what the op computes, whatever it is called.
        by_base.setdefault(base_type(op.type), set()).add(op.phase)
    for t in ("AssignAddVariableOp", "AssignSubVariableOp", "AssignVariableOp"):
        assert by_type.get(t, {"update"}) == {"update"}
    if name == "resnet50":
        assert by_base["Conv2D"] == {"forward"}
        assert by_base["Conv2DBackpropFilter"] == {"backward"}
        assert by_base["Conv2DBackpropInput"] == {"backward"}
    kinds = {t.kind for t in g.tensors}
    assert "small" in kinds
    assert all(g.tensor(f).kind in ("small", "activation") for f in captured.fetches)
    for arg in captured.feeds:
        t = g.tensor(arg)
        assert t.kind in ("input", "small")


def test_small_threshold_and_unreduced_graph(lowered):
    _, captured, prof, _ = lowered
    full = ir.lower(captured, prof, reduce=False, small_bytes=0)
    assert "small" not in {t.kind for t in full.graph.tensors}
    assert not full.folded
    assert {op.name for op in full.graph.ops} == set(full.node_map)


def test_to_dataflow_graph_is_unchanged_for_existing_callers(lowered):
    _, captured, _, _ = lowered
    plain = ir.to_dataflow_graph(captured)
    assert all(op.time_s == 0 and op.phase == "" for op in plain.ops)
    assert all(t.kind == "activation" and not t.alias_of for t in plain.tensors)

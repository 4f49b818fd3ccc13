"""Phases and tensor kinds from reachability (tfswap.core.kinds), on hand-made graphs."""

import pytest

from tfswap.core.graph import DataflowGraph, Op, Tensor
from tfswap.core.kinds import classify

MB = 1 << 20


def train_step(control_from_updates=True):
    """x, w -> matmul -> loss; grad -> update of w with optimizer state m.

    The returned loss also waits (control edge) for the update, as
    tf.function's automatic control dependencies make it.
    """
    ops = [
        Op("x", "Placeholder"), Op("w", "ReadVariableOp"), Op("m", "ReadVariableOp"),
        Op("mm", "MatMul", ("x:0", "w:0")), Op("relu", "Relu", ("mm:0",)),
        Op("loss", "Sum", ("relu:0",)),
        Op("seed", "OnesLike", ("loss:0",)),
        Op("relu_grad", "ReluGrad", ("seed:0", "relu:0")),
        Op("w_grad", "MatMul", ("x:0", "relu_grad:0")),
        Op("m_new", "AddV2", ("m:0", "w_grad:0")),
        Op("update_m", "AssignVariableOp", ("m_new:0",)),
        Op("w_step", "Mul", ("m_new:0", "w:0")),
        Op("update_w", "AssignSubVariableOp", ("w_step:0",)),
        Op("out", "Identity", ("loss:0",),
           control_inputs=("update_w", "update_m") if control_from_updates else ()),
    ]
    tensors = [Tensor(f"{o.name}:0", nbytes=4 * MB) for o in ops
               if o.type not in ("AssignVariableOp", "AssignSubVariableOp")]
    tensors += [Tensor("w_alias:0", nbytes=4 * MB, alias_of="w:0")]
    ops.append(Op("w_alias", "Identity", ("w:0",)))
    return DataflowGraph.build(ops, tensors)


def classified(**kw):
    return classify(train_step(**kw), loss=["out:0"], inputs=["x:0"],
                    variables=["w:0", "m:0"], writers=["update_w", "update_m"], **{})


def test_phases_follow_data_reachability_not_control_edges():
    g = classified()
    phase = {o.name: o.phase for o in g.ops}
    assert phase["mm"] == phase["relu"] == phase["loss"] == phase["w"] == "forward"
    assert phase["seed"] == phase["relu_grad"] == phase["w_grad"] == "backward"
    assert phase["m_new"] == phase["w_step"] == phase["update_w"] == phase["update_m"] == "update"
    assert phase["m"] == "update"   # reading optimizer state is part of the update
    assert phase["x"] == "forward"


def test_tensor_kinds():
    g = classified()
    kind = {t.name: t.kind for t in g.tensors}
    assert kind["x:0"] == "input"
    assert kind["w:0"] == "parameter" and kind["w_alias:0"] == "parameter"
    assert kind["m:0"] == "optimizer_state"
    assert kind["relu:0"] == "activation"
    assert kind["relu_grad:0"] == kind["w_grad:0"] == "gradient"
    assert kind["m_new:0"] == "temporary"


def test_small_tensors_are_small_whatever_their_role():
    g = classify(train_step(), loss=["out:0"], inputs=["x:0"], variables=["w:0", "m:0"],
                 writers=["update_w", "update_m"], small_bytes=8 * MB)
    assert {t.kind for t in g.tensors} == {"small"}
    g = classify(train_step(), loss=["out:0"], inputs=["x:0"], variables=["w:0", "m:0"],
                 writers=["update_w", "update_m"], small_bytes=0)
    assert "small" not in {t.kind for t in g.tensors}


def test_unknown_names_are_reported():
    with pytest.raises(ValueError, match="loss tensor 'nope:0'"):
        classify(train_step(), loss=["nope:0"])
    with pytest.raises(ValueError, match="writer op 'nope'"):
        classify(train_step(), loss=["out:0"], writers=["nope"])
    with pytest.raises(ValueError, match="at least one loss"):
        classify(train_step(), loss=[])

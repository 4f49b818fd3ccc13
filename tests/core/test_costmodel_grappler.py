"""Cost model on the op types Grappler and oneDNN produce (fused, renamed, ref-typed)."""

import pytest

from tfswap.core import costmodel
from tfswap.core.costmodel import base_type, dtype_bytes, op_cost


@pytest.mark.parametrize("op_type, base", [
    ("_FusedConv2D", "Conv2D"), ("_MklNativeConv2D", "Conv2D"), ("_MklFusedConv2D", "Conv2D"),
    ("Conv2DBackpropFilter", "Conv2DBackpropFilter"), ("_FusedMatMul", "MatMul"),
    ("FusedBatchNormV3", "FusedBatchNorm"), ("_MklFusedBatchNormGradV3", "FusedBatchNormGrad"),
    ("AddV2", "Add"), ("Relu", "Relu"),
])
def test_base_type_sees_through_fusion_and_onednn_names(op_type, base):
    assert base_type(op_type) == base


def test_fused_conv_is_priced_as_its_convolution():
    sig = dict(attrs={}, inputs=[((8, 16, 16, 32), "float32"), ((3, 3, 32, 64), "float32"),
                                 ((64,), "float32")],
               outputs=[((8, 16, 16, 64), "float32")])
    fused, plain = op_cost("_FusedConv2D", **sig), op_cost("Conv2D", **sig)
    assert fused.rule == plain.rule == "conv"
    assert fused.flops == plain.flops == 2 * 8 * 16 * 16 * 64 * 3 * 3 * 32


def test_reference_dtypes_count_as_their_values():
    assert dtype_bytes("float32_ref") == dtype_bytes("float32") == 4
    assert dtype_bytes("int64_ref") == 8
    with pytest.raises(ValueError, match="unknown dtype 'float8_ref'"):
        dtype_bytes("float8_ref")


def test_grappler_accumulator_ops():
    """A large AddN becomes TemporaryVariable, Assign, AssignAdd..., DestroyTemporaryVariable."""
    ref = ((1024, 256), "float32_ref")
    value = ((1024, 256), "float32")
    nbytes = 1024 * 256 * 4
    assert op_cost("TemporaryVariable", {}, [], [ref]).rule == "free"
    assert op_cost("DestroyTemporaryVariable", {}, [ref], [value]).rule == "free"
    assign = op_cost("Assign", {}, [ref, value], [ref])
    assert (assign.rule, assign.bytes) == ("copy", 2 * nbytes)
    add = op_cost("AssignAdd", {}, [ref, value], [ref])
    assert add.rule == "elementwise" and add.bytes == 3 * nbytes
    assert "TemporaryVariable" in costmodel.FREE_OPS

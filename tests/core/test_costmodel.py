"""The analytic roofline (tfswap.core.costmodel): FLOPs, bytes and times from shapes."""

import pytest

from tfswap.core import costmodel
from tfswap.core.costmodel import op_cost, op_time_s
from tfswap.core.devices import device_spec

F = "float32"
V100 = device_spec("v100-16g-pcie3")


def nbytes(shape, size=4):
    n = size
    for d in shape:
        n *= d
    return n


def test_conv_and_both_backprops_cost_the_same_flops():
    x, w, y = (8, 56, 56, 64), (3, 3, 64, 128), (8, 56, 56, 128)
    flops = 2 * 8 * 56 * 56 * 128 * 3 * 3 * 64
    fwd = op_cost("Conv2D", {}, [(x, F), (w, F)], [(y, F)])
    bin_ = op_cost("Conv2DBackpropInput", {}, [((4,), "int32"), (w, F), (y, F)], [(x, F)])
    bfl = op_cost("Conv2DBackpropFilter", {}, [(x, F), ((4,), "int32"), (y, F)], [(w, F)])
    assert fwd.flops == bin_.flops == bfl.flops == flops
    assert fwd.rule == bin_.rule == bfl.rule == "conv"
    # oneDNN / Grappler-fused variants are priced like the plain op
    assert op_cost("_MklNativeConv2D", {}, [(x, F), (w, F)], [(y, F)]).flops == flops
    assert op_cost("_FusedConv2D", {}, [(x, F), (w, F), ((128,), F)], [(y, F)]).flops == flops


def test_depthwise_conv_counts_taps_only():
    cost = op_cost("DepthwiseConv2dNative", {}, [((1, 8, 8, 16), F), ((3, 3, 16, 1), F)],
                   [((1, 8, 8, 16), F)])
    assert cost.flops == 2 * 8 * 8 * 16 * 9


def test_matmul_family():
    a, b = (64, 128), (128, 32)
    assert op_cost("MatMul", {}, [(a, F), (b, F)], [((64, 32), F)]).flops == 2 * 64 * 32 * 128
    at = (128, 64)
    assert op_cost("MatMul", {"transpose_a": True}, [(at, F), (b, F)],
                   [((64, 32), F)]).flops == 2 * 64 * 32 * 128
    bmm = op_cost("BatchMatMulV2", {}, [((4, 16, 8), F), ((4, 8, 16), F)], [((4, 16, 16), F)])
    assert bmm.flops == 2 * 4 * 16 * 16 * 8
    ein = op_cost("Einsum", {"equation": "bqd,bkd->bqk"},
                  [((4, 16, 8), F), ((4, 32, 8), F)], [((4, 16, 32), F)])
    assert ein.flops == 2 * 4 * 16 * 32 * 8
    ell = op_cost("Einsum", {"equation": "...ij,jk->...ik"},
                  [((2, 3, 4, 5), F), ((5, 6), F)], [((2, 3, 4, 6), F)])
    assert ell.flops == 2 * 6 * 4 * 5 * 6


def test_memory_bound_ops_cost_their_bytes():
    x = (1024, 1024)
    relu = op_cost("Relu", {}, [(x, F)], [(x, F)])
    assert relu.rule == "elementwise" and relu.bytes == 2 * nbytes(x)
    bias = op_cost("BiasAdd", {}, [((8, 4, 4, 16), F), ((16,), F)], [((8, 4, 4, 16), F)])
    assert bias.rule == "elementwise"
    mul = op_cost("Mul", {}, [((8, 4, 4, 16), F), ((1, 1, 1, 16), F)], [((8, 4, 4, 16), F)])
    assert mul.rule == "elementwise"
    t = op_time_s(relu, V100)
    assert t == pytest.approx(2 * nbytes(x) / V100.memory_bandwidth_bytes_per_s
                              + V100.launch_overhead_s)


def test_normalisation_reduction_gather_and_default_rules():
    x = (32, 128, 768)
    assert op_cost("Mean", {}, [(x, F), ((1,), "int32")], [((32, 128, 1), F)]).rule == "reduction"
    bn = op_cost("FusedBatchNormV3", {}, [((8, 7, 7, 64), F)] + [((64,), F)] * 4,
                 [((8, 7, 7, 64), F)] + [((64,), F)] * 5)
    assert bn.rule == "normalization" and bn.flops == 10 * 8 * 7 * 7 * 64
    grad = op_cost("FusedBatchNormGradV3", {}, [((8, 7, 7, 64), F)] * 2, [((8, 7, 7, 64), F)])
    assert grad.flops == 15 * 8 * 7 * 7 * 64
    assert op_cost("Softmax", {}, [(x, F)], [(x, F)]).rule == "normalization"
    table, idx = (50000, 768), (32, 128)
    g = op_cost("GatherV2", {}, [(table, F), (idx, "int32"), ((), "int32")], [(idx + (768,), F)])
    assert g.rule == "gather_scatter" and g.bytes < nbytes(table)
    odd = op_cost("SomeCustomOp", {}, [((10, 3), F)], [((7,), F)])
    assert odd.rule == "default" and odd.bytes == nbytes((10, 3)) + nbytes((7,))


def test_free_ops_launch_nothing():
    for op in ("Const", "Identity", "Reshape", "ReadVariableOp", "Shape", "NoOp"):
        cost = op_cost(op, {}, [((1024, 1024), F)], [((1024, 1024), F)])
        assert op_time_s(cost, V100) == 0.0


def test_compute_bound_ops_are_limited_by_flops():
    cost = op_cost("MatMul", {}, [((4096, 4096), F)] * 2, [((4096, 4096), F)])
    assert op_time_s(cost, V100) == pytest.approx(cost.flops / V100.peak_flops
                                                  + V100.launch_overhead_s)


def test_fused_edges_are_not_moved():
    x = (1024, 1024)
    plain = op_cost("Mul", {}, [(x, F), (x, F)], [(x, F)])
    fused = op_cost("Mul", {}, [(x, F), (x, F)], [(x, F)], fused_inputs=[True, False],
                    fused_outputs=[True])
    assert fused.bytes == plain.bytes - 2 * nbytes(x)
    assert costmodel.fusible_edge("elementwise", ["elementwise", "reduction"])
    assert not costmodel.fusible_edge("conv", ["elementwise"])
    assert not costmodel.fusible_edge("elementwise", ["matmul"])
    assert not costmodel.fusible_edge("elementwise", [])


def test_unknown_dtype_is_an_error():
    with pytest.raises(ValueError, match="unknown dtype 'float8x'"):
        op_cost("Relu", {}, [((4,), "float8x")], [((4,), "float8x")])


def test_new_core_modules_import_no_tensorflow():
    import subprocess
    import sys
    code = ("import sys, tfswap.core.kinds, tfswap.core.costmodel, tfswap.core.profile, "
            "tfswap.core.liveness; assert 'tensorflow' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_sibling_readers_of_a_tensor_in_memory_share_one_read_per_fused_group():
    assert costmodel.memory_reads("conv", ["reduction", "elementwise", "reduction",
                                           "elementwise"]) == [True, True, False, False]
    assert costmodel.memory_reads("conv", ["matmul", "matmul"]) == [True, True]
    assert costmodel.memory_reads("elementwise", ["elementwise", "reduction"]) == [False, False]
    assert costmodel.memory_reads("elementwise", ["matmul", "elementwise"]) == [True, True]

"""Analytic op times from shapes for a DeviceSpec (roofline), no TensorFlow.

An op costs ``max(flops / peak_flops, bytes / memory_bandwidth) +
launch_overhead``: compute-bound kernels (convolutions, matrix products) are
limited by FLOP/s, everything else by the bytes it reads and writes.  Ops
that launch no kernel on an accelerator (constants, views, variable reads,
shape queries) cost nothing.  FLOPs count a multiply-add as 2.

Covered explicitly: Conv2D/Conv3D/DepthwiseConv2dNative and their input and
filter backprops (also fused and oneDNN variants), MatMul, BatchMatMul,
Einsum, elementwise ops, reductions, FusedBatchNorm(+Grad), Softmax,
LogSoftmax, softmax cross-entropy, the LayerNorm pieces (means, squared
differences, rsqrt: reductions and elementwise), Gather/Scatter families,
variable updates.  **Default for any other op** (including While/If/function
calls, whose bodies are not looked into): memory-bound, reading all inputs
and writing all outputs once, one FLOP per output element.  ``OpCost.rule``
names the rule used, so a caller can see which ops fell to the default.

Example::

    spec = device_spec("v100-16g-pcie3")
    cost = op_cost("Conv2D", {"data_format": "NHWC"},
                   inputs=[((64, 56, 56, 64), "float32"), ((3, 3, 64, 64), "float32")],
                   outputs=[((64, 56, 56, 64), "float32")])
    cost.flops                      # 2 * 64*56*56*64 * 3*3*64 = 2.77e10
    op_time_s(cost, spec)           # ~2.8 ms on a V100
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from tfswap.core.devices import DeviceSpec

DTYPE_BYTES = {
    "float16": 2, "bfloat16": 2, "half": 2, "float32": 4, "float": 4, "float64": 8, "double": 8,
    "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8,
    "uint64": 8, "bool": 1, "complex64": 8, "complex128": 16,
    "resource": 0, "variant": 0, "string": 0,
}

# No kernel on the device: metadata, views, variable reads, host bookkeeping.
FREE_OPS = frozenset({
    "Const", "HostConst", "Placeholder", "PlaceholderWithDefault", "_Arg", "_Retval", "NoOp",
    "Identity", "IdentityN", "Reshape", "Squeeze", "ExpandDims", "StopGradient",
    "PreventGradient", "EnsureShape", "Shape", "ShapeN", "Size", "Rank", "VariableShape",
    "ReadVariableOp", "VarHandleOp", "VarIsInitializedOp", "BroadcastGradientArgs",
    # Grappler's memory optimiser turns a large AddN into an accumulator:
    # TemporaryVariable (allocates), Assign, AssignAdd..., DestroyTemporaryVariable
    # (hands the buffer on); the first and last move no data.
    "TemporaryVariable", "DestroyTemporaryVariable",
})
REDUCTIONS = frozenset({"Sum", "Mean", "Max", "Min", "Prod", "ArgMax", "ArgMin", "All", "Any",
                        "L2Loss", "BiasAddGrad", "EuclideanNorm"})
GATHER_SCATTER = re.compile(r"(Gather|Scatter|SegmentSum|SegmentMean|SegmentMax|Embedding)")
TRANSCENDENTAL = frozenset({"Exp", "Log", "Log1p", "Expm1", "Tanh", "Sigmoid", "Erf", "Erfc",
                            "Pow", "Sin", "Cos", "Gelu", "Softplus", "Elu", "Selu", "Rsqrt",
                            "Sqrt", "RsqrtGrad", "SqrtGrad", "TanhGrad", "SigmoidGrad",
                            "GeluGrad", "EluGrad", "SeluGrad", "SoftplusGrad"})
# FLOPs per element of the big tensor for the normalisation / softmax kernels.
PER_ELEMENT_FLOPS = {"FusedBatchNorm": 10, "FusedBatchNormGrad": 15, "Softmax": 5,
                     "LogSoftmax": 5, "SoftmaxCrossEntropyWithLogits": 8,
                     "SparseSoftmaxCrossEntropyWithLogits": 8}

Shape = Sequence[int]
TensorSig = tuple[Shape, str]          # (shape, dtype name)


@dataclass(frozen=True)
class OpCost:
    flops: float
    bytes: float       # bytes read + written
    rule: str          # which rule of this module priced the op


def dtype_bytes(dtype: str) -> int:
    """Bytes per element of ``dtype``; a reference dtype (``float32_ref``, what
    Grappler's accumulator ``TemporaryVariable`` holds) counts as its value dtype."""
    base = dtype[:-len("_ref")] if dtype.endswith("_ref") else dtype
    try:
        return DTYPE_BYTES[base]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; known: {sorted(DTYPE_BYTES)}") from None


def _elements(shape: Shape) -> int:
    return int(math.prod(int(d) for d in shape))


def _nbytes(sig: TensorSig) -> int:
    return _elements(sig[0]) * dtype_bytes(sig[1])


def base_type(op_type: str) -> str:
    """The op a fused, oneDNN or versioned type computes at its core.

    Grappler's remapper and TF's oneDNN rewrite rename ops (``_FusedConv2D``
    is Conv2D + BiasAdd (+ activation), ``_MklNativeConv2D`` a oneDNN
    Conv2D); rules that mean "a convolution" should match them all::

        base_type("_MklFusedConv2D")      # "Conv2D"
        base_type("FusedBatchNormV3")     # "FusedBatchNorm"
        base_type("Conv2DBackpropFilter") # "Conv2DBackpropFilter"
    """
    t = op_type.lstrip("_")
    stripped = True
    while stripped:
        stripped = False
        for prefix in ("MklNative", "Mkl", "Native", "Fused"):
            rest = t[len(prefix):]
            if t.startswith(prefix) and rest and not rest.startswith("BatchNorm"):
                t, stripped = rest, True
    t = re.sub(r"V\d+$", "", t)
    return re.sub(r"Ex$", "", t) if "BatchNorm" in t else t


def _broadcasts_to(shape: Shape, out: Shape) -> bool:
    """True if ``shape`` broadcasts to ``out`` (numpy rules) or has as many elements."""
    if _elements(shape) == _elements(out):
        return True
    if len(shape) > len(out):
        return False
    return all(a == 1 or a == b for a, b in zip(reversed(tuple(shape)), reversed(tuple(out))))


def _einsum_flops(equation: str, inputs: Sequence[TensorSig]) -> float:
    lhs, _, _ = equation.replace(" ", "").partition("->")
    sizes: dict[str, int] = {}
    ellipsis = 1
    for spec, (shape, _) in zip(lhs.split(","), inputs):
        letters = spec.replace("...", "")
        n_ell = len(shape) - len(letters)
        if "..." in spec:
            head = spec.index("...")
            ell_dims = shape[head:head + n_ell]
            ellipsis = max(ellipsis, _elements(ell_dims))
            dims = list(shape[:head]) + list(shape[head + n_ell:])
        else:
            dims = list(shape)
        for letter, d in zip(letters, dims):
            sizes[letter] = max(sizes.get(letter, 1), int(d))
    return 2.0 * ellipsis * math.prod(sizes.values())


def op_cost(op_type: str, attrs: Mapping, inputs: Sequence[TensorSig],
            outputs: Sequence[TensorSig], fused_inputs: Sequence[bool] = (),
            fused_outputs: Sequence[bool] = ()) -> OpCost:
    """FLOPs and bytes moved by one op, from its type, attrs and tensor shapes.

    ``attrs``: plain values (e.g. ``{"transpose_a": True}``, ``{"equation":
    "bij,bjk->bik"}``).  ``inputs`` / ``outputs``: ``(shape, dtype)`` pairs.
    ``fused_inputs`` / ``fused_outputs``: per tensor, True where a fusing
    compiler keeps it in registers (see :func:`fusible_edge`): its bytes are
    not moved.
    """
    moved = float(
        sum(_nbytes(s) for k, s in enumerate(inputs) if not _flag(fused_inputs, k))
        + sum(_nbytes(s) for k, s in enumerate(outputs) if not _flag(fused_outputs, k)))
    out_elems = float(sum(_elements(s[0]) for s in outputs))
    if op_type in FREE_OPS:
        return OpCost(0.0, 0.0, "free")
    base = base_type(op_type)

    if "Conv" in base and ("2D" in base or "3D" in base or "Depthwise" in base):
        depthwise = "Depthwise" in base
        if "BackpropFilter" in base:
            big, flt = inputs[2][0], outputs[0][0]
        elif "BackpropInput" in base:
            big, flt = inputs[2][0], inputs[1][0]
        else:
            big, flt = outputs[0][0], inputs[1][0]
        # Per output element: one MAC per filter tap and input channel
        # (depthwise: per tap only); filter is [spatial..., in, out(or multiplier)].
        taps = _elements(flt[:-2]) * (1 if depthwise else int(flt[-2]))
        return OpCost(2.0 * _elements(big) * taps, moved, "conv")
    if base == "MatMul":
        a = inputs[0][0]
        k = a[0] if attrs.get("transpose_a") else a[1]
        return OpCost(2.0 * out_elems * k, moved, "matmul")
    if base == "BatchMatMul":
        a = inputs[0][0]
        k = a[-2] if attrs.get("adj_x") else a[-1]
        return OpCost(2.0 * out_elems * k, moved, "matmul")
    if base == "Einsum":
        return OpCost(_einsum_flops(str(attrs.get("equation", "")), inputs), moved, "einsum")
    if base in PER_ELEMENT_FLOPS:
        big = max((_elements(s[0]) for s in inputs), default=0)
        return OpCost(PER_ELEMENT_FLOPS[base] * float(big), moved, "normalization")
    if base in REDUCTIONS:
        return OpCost(float(sum(_elements(s[0]) for s in inputs[:1])), moved, "reduction")
    if GATHER_SCATTER.search(base):
        # Touches the gathered/scattered rows and the indices, not the whole table.
        touched = 2.0 * sum(_nbytes(s) for s in outputs) + sum(
            _nbytes(s) for s in inputs[1:])
        return OpCost(out_elems, min(moved, touched), "gather_scatter")
    if base in ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp"):
        value = _nbytes(inputs[1]) if len(inputs) > 1 else 0
        return OpCost(float(_elements(inputs[1][0])) if len(inputs) > 1 else 0.0,
                      3.0 * value, "variable_update")
    if base == "Assign":
        # Reference assignment: reads the value, writes the referenced buffer.
        value = _nbytes(inputs[1]) if len(inputs) > 1 else 0
        return OpCost(0.0, 2.0 * value, "copy")
    if base in TRANSCENDENTAL:
        return OpCost(4.0 * out_elems, moved, "elementwise")
    if base == "BiasAdd" or (outputs and all(
            _broadcasts_to(s[0], outputs[0][0]) for s in inputs)):
        return OpCost(out_elems, moved, "elementwise")
    return OpCost(out_elems, moved, "default")


def _flag(flags: Sequence[bool], k: int) -> bool:
    return k < len(flags) and bool(flags[k])


def fusible_edge(producer_rule: str, consumer_rules: Sequence[str]) -> bool:
    """True if a loop-fusing compiler (XLA, cuDNN's fused batch norm) would keep a
    tensor out of memory: an elementwise result read only by elementwise ops or
    reductions."""
    return producer_rule == "elementwise" and bool(consumer_rules) and all(
        r in ("elementwise", "reduction") for r in consumer_rules)


def memory_reads(producer_rule: str, consumer_rules: Sequence[str]) -> list[bool]:
    """Per consumer of one tensor, True if it reads the tensor from memory under a
    loop-fusing compiler.

    An elementwise result that only fusible ops read stays in registers
    (:func:`fusible_edge`): nobody reads it.  Otherwise (e.g. a convolution's
    output feeding batch norm) the tensor is in memory, but a compiler fuses
    siblings that share an operand (XLA's multi-output fusion): the reductions
    over it are one kernel and the elementwise ops on it are another, so each
    of those two groups reads it once.  Any other consumer reads it itself.

    Example::

        memory_reads("conv", ["reduction", "elementwise", "reduction", "elementwise"])
        # [True, True, False, False]
    """
    if fusible_edge(producer_rule, consumer_rules):
        return [False] * len(consumer_rules)
    seen: set[str] = set()
    reads = []
    for rule in consumer_rules:
        sibling = rule in ("elementwise", "reduction")
        reads.append(not sibling or rule not in seen)
        if sibling:
            seen.add(rule)
    return reads


def op_time_s(cost: OpCost, spec: DeviceSpec) -> float:
    """Roofline seconds of ``cost`` on ``spec`` (free ops: 0)."""
    if cost.rule == "free":
        return 0.0
    return max(cost.flops / spec.peak_flops, cost.bytes / spec.memory_bandwidth_bytes_per_s) \
        + spec.launch_overhead_s


def estimate_time_s(op_type: str, attrs: Mapping, inputs: Sequence[TensorSig],
                    outputs: Sequence[TensorSig], spec: DeviceSpec) -> float:
    """:func:`op_cost` then :func:`op_time_s`."""
    return op_time_s(op_cost(op_type, attrs, inputs, outputs), spec)

"""Synthetic dataflow graphs: random DAGs for property tests, and layered
training-step graphs of any size for benchmarks.

``random_dag`` makes small irregular graphs with every feature the planner
handles (parameters, an optimizer update that modifies them, aliases,
scratch, small tensors, unswappable tensors).  ``layered_training_step``
makes a CNN/RNN-like step: a forward chain of layers (with skip connections),
a loss, backward ops mirroring the forward ones (reading the saved
activations and the weights), weight gradients and optimizer updates, with
realistic sizes and op times, at any op count.

Example::

    g = layered_training_step(10_000, seed=0)
    len(g.ops)                          # 10000
    g2 = random_dag(np.random.default_rng(1), n_ops=30)
"""

from __future__ import annotations

import numpy as np

from tfswap.core.graph import DataflowGraph, Op, Tensor

MiB = 1 << 20


def random_dag(rng: np.random.Generator, n_ops: int = 20, n_params: int = 4,
               max_inputs: int = 3, unit_bytes: int = MiB) -> DataflowGraph:
    """A random DAG of ``n_ops`` compute ops plus ``n_params`` parameters.

    Sizes are 1-4 units; about one op in six has scratch, one tensor in ten
    is small (below 1 MiB when ``unit_bytes`` is 1 MiB), and one in twenty is
    not swappable; some ops output a view of their first input; the last
    ``n_params`` ops are optimizer updates that each modify one parameter.
    """
    if n_ops < 1 or n_params < 0:
        raise ValueError("n_ops must be >= 1 and n_params >= 0")
    ops, tensors = [], []
    for p in range(n_params):
        ops.append(Op(f"w{p}", "ReadVariableOp"))
        tensors.append(Tensor(f"w{p}:0", int(rng.integers(1, 5)) * unit_bytes,
                              kind="parameter"))
    produced = []  # activation tensor names
    for i in range(n_ops):
        name = f"op{i}"
        k = int(rng.integers(0, max_inputs + 1))
        ins = []
        if produced:
            ins += list(dict.fromkeys(produced[int(j)] for j in
                                      rng.integers(max(0, len(produced) - 8), len(produced),
                                                   size=max(1, k))))
        if n_params and rng.random() < 0.5:
            ins.append(f"w{int(rng.integers(0, n_params))}:0")
        r = rng.random()
        alias = ""
        if ins and not ins[0].startswith("w") and r < 0.1:
            alias = ins[0]
        size = int(rng.integers(1, 5)) * unit_bytes
        kind = "activation"
        if rng.random() < 0.1:
            size, kind = int(rng.integers(1, 1000)), "small"
        ops.append(Op(name, "Op", tuple(ins), time_s=float(rng.integers(1, 5)) * 1e-3,
                      scratch_bytes=int(rng.integers(1, 3)) * unit_bytes if rng.random() < 0.15
                      else 0, phase="forward"))
        tensors.append(Tensor(f"{name}:0", size, kind=kind, alias_of=alias,
                              swappable=rng.random() >= 0.05))
        produced.append(f"{name}:0")
    for p in range(n_params):
        grad = produced[int(rng.integers(len(produced) // 2, len(produced)))]
        ops.append(Op(f"update{p}", "AssignSub", (f"w{p}:0", grad), time_s=1e-4,
                      phase="update"))
    return DataflowGraph.build(ops, tensors)


def layered_training_step(n_ops: int, seed: int = 0, batch_bytes: int = 32 * MiB,
                          flops_per_s: float = 10e12, skip_every: int = 4) -> DataflowGraph:
    """A training step of about ``n_ops`` ops (exactly ``n_ops``) in layers.

    Each layer has 6 ops: weight and optimizer-state reads, forward (reads the previous
    activation, the weight and, every ``skip_every`` layers, an older
    activation), backward (reads the incoming gradient, the layer's input
    activation and the weight), the weight gradient (reads the incoming
    gradient and the input activation) and an optimizer update (modifies the
    weight and its optimizer state).  Activation and weight sizes vary by
    layer, as in a CNN whose feature maps shrink while channels grow; op
    times follow the bytes touched at ``flops_per_s``.  Padding ops (small
    reductions) bring the count to ``n_ops`` exactly.
    """
    if n_ops < 12:
        raise ValueError(f"n_ops must be >= 12, got {n_ops}")
    rng = np.random.default_rng(seed)
    n_layers = (n_ops - 2) // 6
    ops, tensors = [Op("input", "Placeholder", phase="forward")], [
        Tensor("input:0", batch_bytes, kind="input")]
    act = ["input:0"]
    w_names, s_names, w_bytes = [], [], []
    for i in range(n_layers):
        stage = 4 * i // max(1, n_layers)
        a_bytes = max(MiB, (batch_bytes >> stage) + int(rng.integers(0, 4)) * MiB)
        wb = max(MiB, (MiB << stage) * int(rng.integers(1, 4)))
        w_bytes.append(wb)
        ops.append(Op(f"w{i}", "ReadVariableOp", phase="forward"))
        tensors.append(Tensor(f"w{i}:0", wb, kind="parameter"))
        ops.append(Op(f"m{i}", "ReadVariableOp", phase="forward"))
        tensors.append(Tensor(f"m{i}:0", wb, kind="optimizer_state"))
        w_names.append(f"w{i}:0")
        s_names.append(f"m{i}:0")
        ins = [act[-1], f"w{i}:0"]
        if i >= skip_every and i % skip_every == 0:
            ins.append(act[-skip_every])
        t = (a_bytes * 600) / flops_per_s + 5e-6  # ~600 FLOP per output byte (3x3 conv)
        ops.append(Op(f"fwd{i}", "Conv2D", tuple(ins), time_s=t, phase="forward",
                      scratch_bytes=a_bytes // 2 if i % 3 == 0 else 0))
        tensors.append(Tensor(f"fwd{i}:0", a_bytes))
        act.append(f"fwd{i}:0")
    ops.append(Op("loss", "SoftmaxCrossEntropy", (act[-1],), time_s=1e-4, phase="forward"))
    tensors.append(Tensor("loss:0", act_bytes := tensors[-1].nbytes, kind="gradient"))
    del act_bytes
    grad = "loss:0"
    for i in reversed(range(n_layers)):
        a_in = act[i]
        a_bytes = next(t.nbytes for t in tensors if t.name == a_in)
        t = (a_bytes * 1200) / flops_per_s + 5e-6
        ops.append(Op(f"bwd{i}", "Conv2DBackpropInput", (grad, w_names[i]), time_s=t,
                      phase="backward"))
        tensors.append(Tensor(f"bwd{i}:0", a_bytes, kind="gradient"))
        ops.append(Op(f"dw{i}", "Conv2DBackpropFilter", (grad, a_in), time_s=t,
                      phase="backward"))
        tensors.append(Tensor(f"dw{i}:0", w_bytes[i], kind="gradient"))
        ops.append(Op(f"upd{i}", "ResourceApplyAdam", (w_names[i], s_names[i], f"dw{i}:0"),
                      time_s=w_bytes[i] * 4 / 900e9 + 5e-6, phase="update"))
        tensors.append(Tensor(f"upd{i}:0", 8, kind="small"))
        grad = f"bwd{i}:0"
    k = 0
    while len(ops) < n_ops:
        src = act[1 + k % n_layers]
        ops.append(Op(f"stat{k}", "Mean", (src,), time_s=2e-6, phase="forward"))
        tensors.append(Tensor(f"stat{k}:0", 4, kind="small"))
        k += 1
    return DataflowGraph.build(ops, tensors)

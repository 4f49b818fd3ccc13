"""Core graph, liveness and heuristic on hand-made graphs (no TensorFlow)."""

import sys

import pytest

from tfswap.core import liveness
from research import heuristic
from tfswap.core.graph import DataflowGraph, Op, Tensor

MB = 1 << 20


def chain_with_skip():
    """f1 -> f2 -> f3 -> b3 -> b2 -> b1, where b1 also reads f1 (a long-lived activation)."""
    ops = [Op("f1", "Conv"), Op("f2", "Conv", ("f1:0",)), Op("f3", "Conv", ("f2:0",)),
           Op("b3", "Grad", ("f3:0",)), Op("b2", "Grad", ("b3:0", "f2:0")),
           Op("b1", "Grad", ("b2:0", "f1:0"))]
    tensors = [Tensor(f"{o.name}:0", nbytes=MB) for o in ops]
    return DataflowGraph.build(ops, tensors)


def test_core_imports_no_tensorflow():
    import subprocess
    # Every module of the core, in a fresh process: none may pull TensorFlow in.
    code = ("import importlib, pkgutil, sys, tfswap.core as core\n"
            "names = [m.name for m in pkgutil.walk_packages(core.__path__, 'tfswap.core.')\n"
            "         if not m.name.rpartition('.')[2].startswith('_')]  # ctypes libraries\n"
            "for name in names: importlib.import_module(name)\n"
            "assert len(names) > 20, names\n"
            "assert 'tensorflow' not in sys.modules, 'tensorflow imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_build_links_producers_and_consumers():
    g = chain_with_skip()
    assert g.tensor("f1:0").consumers == (g.op_id("f2"), g.op_id("b1"))
    assert g.ops[g.op_id("f1")].outputs == ("f1:0",)
    assert g.topological_order() == list(range(6))


def test_build_rejects_unknown_inputs():
    with pytest.raises(ValueError, match="unknown tensor"):
        DataflowGraph.build([Op("a", "X", ("zz:0",))], [Tensor("a:0", 1)])


def test_order_following_keeps_observed_order_and_completes_it():
    g = chain_with_skip()
    order = g.order_following(["f1", "f2", "f3", "b3", "b2", "b1"])
    assert [g.ops[i].name for i in order] == ["f1", "f2", "f3", "b3", "b2", "b1"]
    assert g.is_topological(order)


def test_liveness_counts_each_tensor_from_producer_to_last_reader():
    g = chain_with_skip()
    names = [o.name for o in g.ops]
    curve = liveness.live_bytes(g, names)
    # at b3: f1, f2, f3 and b3's output are live
    assert curve[3] == 4 * MB
    assert liveness.peak(g, names) == 4 * MB


def test_heuristic_swap_frees_its_bytes_at_the_peak():
    g = chain_with_skip()
    names = [o.name for o in g.ops]
    swaps = heuristic.swap_across_peak(g, names, count=1, lead=1)
    assert [s.tensor for s in swaps] == ["f1:0"]
    assert swaps[0].consumers == ("b1",) and swaps[0].out_after == "f2"
    peak_at = int(liveness.live_bytes(g, names).argmax())
    before = liveness.live_bytes(g, names)
    after = liveness.live_bytes(g, names, swaps)
    assert after[peak_at] == before[peak_at] - MB
    assert (after <= before).all()  # the copy returns only after f1 is gone


def test_swap_in_trigger_is_after_the_peak():
    g = chain_with_skip()
    names = [o.name for o in g.ops]
    (swap,) = heuristic.swap_across_peak(g, names, count=1, lead=1)
    peak_at = int(liveness.live_bytes(g, names).argmax())
    assert names.index(swap.in_after) > peak_at

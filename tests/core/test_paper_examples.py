"""The examples of SwapAdvisor (ASPLOS'20) §3 and §4.2 as tests.

Units: one tensor unit is 1 MiB; one op takes 1 s; the link moves 1 MiB/s
each way and is fully duplex, so "one time unit per op and per MB moved".
"""

import pytest

from tfswap.core.devices import DeviceSpec
from tfswap.core.graph import DataflowGraph, Op, Tensor
from tfswap.core.plan import Allocation
from tfswap.core.planner import augmented_edges, plan_swaps
from tfswap.core.simulator import simulate

U = 1 << 20
UNIT_LINK = DeviceSpec("unit-link", memory_bytes=10 * U, peak_flops=1.0,
                       memory_bandwidth_bytes_per_s=1.0, h2d_bytes_per_s=U,
                       d2h_bytes_per_s=U, duplex_bytes_per_s=2 * U, launch_overhead_s=0.0)


def params(*names):
    """Variable-read ops (free) and their 1-unit parameter tensors."""
    return ([Op(n, "ReadVariableOp") for n in names],
            [Tensor(f"{n}:0", U, kind="parameter") for n in names])


def fig3_graph():
    """Fig. 3(a): op1 reads W1, op2 reads W2, op3 joins A1 and A2 with W3.

    The figure's text fixes the structure: op1 and op2 fit in 4 units
    together (W1 A1 W2 A2), and op3 needs room for both W3 and A3, so its
    inputs A1 and A2 stay and two units must be evicted.
    """
    pops, pts = params("W1", "W2", "W3")
    ops = pops + [Op("op1", "MatMul", ("W1:0",), time_s=1.0),
                  Op("op2", "MatMul", ("W2:0",), time_s=1.0),
                  Op("op3", "MatMul", ("op1:0", "op2:0", "W3:0"), time_s=1.0)]
    ts = pts + [Tensor("op1:0", U), Tensor("op2:0", U), Tensor("op3:0", U)]
    return DataflowGraph.build(ops, ts)


def test_fig3_swap_pairs_and_control_edges():
    g = fig3_graph()
    plan = plan_swaps(g, 4 * U, UNIT_LINK, schedule=["W1", "W2", "W3", "op1", "op2", "op3"],
                      allocation=Allocation((U,), (4,), small_threshold_bytes=U))
    by_id = {s.id: s for s in plan.swaps}
    # Parameters start on the host: W1 and W2 are swapped in before their use.
    assert {(s.tensor, s.kind) for s in plan.swaps if s.kind == "prefetch"} == {
        ("W1:0", "prefetch"), ("W2:0", "prefetch"), ("W3:0", "prefetch")}
    # The pairs "evicted -> for": W1 -> W3 (a swap-in waits for W1's swap-out)
    # and W2 -> A3 (op3, which creates A3, waits for W2's swap-out).
    w3_in = next(s for s in plan.swaps if s.tensor == "W3:0" and s.kind == "prefetch")
    assert [by_id[w].tensor for w in w3_in.in_wait_for] == ["W1:0"]
    frees_for_op3 = [s.tensor for s in plan.swaps if "op3" in s.out_before]
    assert frees_for_op3 == ["W2:0"]
    # The parameters are not modified, so they are dropped, not copied back.
    assert {s.kind for s in plan.swaps if s.out_after} == {"drop"}
    edges = set(augmented_edges(plan))
    w1_out = next(w for w in w3_in.in_wait_for)
    w2_out = next(s.id for s in plan.swaps if "op3" in s.out_before)
    assert {("op1", f"out:{w1_out}"), (f"out:{w1_out}", f"in:{w3_in.id}"),
            (f"in:{w3_in.id}", "op3"),
            ("op2", f"out:{w2_out}"), (f"out:{w2_out}", "op3")} <= edges
    assert plan.resident_parameters == ()
    assert plan.prediction.peak_bytes == 4 * U


def fig1_graph():
    """Fig. 1(a), reconstructed from the figure's tables and §3's text.

    Forward: Data -> A0; left branch Conv1(A0, W1) -> A1; right branch
    Conv2(A0, W2) -> A2 (2 MB) -> Conv3(A2, W3) -> A3 -> Conv4(A3, W4) -> A4;
    Concat(A1, A4) -> A5 (2 MB).  All other tensors are 1 MB; 12 MB in all.
    The figure omits the backward pass; it matters only because it reads the
    activations again (that is why the tables swap A0, A2, A3 out instead of
    freeing them).  It is modelled by ops that read them in the mirrored
    order: Loss(A5), dConv4(A3), dConv3(A2), dConv2(A0), dConv1(A0).  The
    weights are not read again in the step, and not modified, so they are
    dropped, not copied back (the tables never swap a W out).
    """
    pops, pts = params("W1", "W2", "W3", "W4")
    fwd = [Op("Data", "Placeholder", time_s=1.0),
           Op("Conv1", "Conv2D", ("Data:0", "W1:0"), time_s=1.0),
           Op("Conv2", "Conv2D", ("Data:0", "W2:0"), time_s=1.0),
           Op("Conv3", "Conv2D", ("Conv2:0", "W3:0"), time_s=1.0),
           Op("Conv4", "Conv2D", ("Conv3:0", "W4:0"), time_s=1.0),
           Op("Concat", "ConcatV2", ("Conv1:0", "Conv4:0"), time_s=1.0)]
    bwd = [Op("Loss", "Loss", ("Concat:0",), time_s=1.0),
           Op("dConv4", "Grad", ("Conv3:0",), time_s=1.0),
           Op("dConv3", "Grad", ("Conv2:0",), time_s=1.0),
           Op("dConv2", "Grad", ("Data:0",), time_s=1.0),
           Op("dConv1", "Grad", ("Data:0",), time_s=1.0)]
    ts = pts + [Tensor("Data:0", U), Tensor("Conv1:0", U), Tensor("Conv2:0", 2 * U),
                Tensor("Conv3:0", U), Tensor("Conv4:0", U), Tensor("Concat:0", 2 * U)]
    return DataflowGraph.build(pops + fwd + bwd, ts)


PARAMS = ["W1", "W2", "W3", "W4"]
LEFT_FIRST = PARAMS + ["Data", "Conv1", "Conv2", "Conv3", "Conv4", "Concat"]
RIGHT_FIRST = PARAMS + ["Data", "Conv2", "Conv3", "Conv4", "Conv1", "Concat"]
BACKWARD = ["Loss", "dConv4", "dConv3", "dConv2", "dConv1"]
COARSE = Allocation((2 * U,), (5,), small_threshold_bytes=U)        # 5 x 2 MB
FINE = Allocation((U, 2 * U), (8, 1), small_threshold_bytes=U)      # 8 x 1 MB + 1 x 2 MB


def fig1_run(schedule, allocation):
    """One iteration as the figure shows it: every weight starts on the host."""
    g = fig1_graph()
    plan = plan_swaps(g, 10 * U, UNIT_LINK, schedule=schedule + BACKWARD, allocation=allocation,
                      params_start_on_host=True)
    result = simulate(g, plan, UNIT_LINK, events=True)
    compute = {e.name: (e.start_s, e.end_s) for e in result.events if e.stream == "compute"}
    return plan, result, compute


@pytest.mark.parametrize("name, schedule, allocation, concat_end", [
    ("b", LEFT_FIRST, COARSE, 6.0), ("c", RIGHT_FIRST, COARSE, 7.0),
    ("d", RIGHT_FIRST, FINE, 6.0), ("e", LEFT_FIRST, FINE, 7.0)])
def test_fig1_forward_times(name, schedule, allocation, concat_end):
    plan, result, compute = fig1_run(schedule, allocation)
    assert compute["Concat"][1] == concat_end, name
    assert result.peak_bytes <= 10 * U


def test_fig1_c_is_one_unit_slower_than_d_because_w1_cannot_be_prefetched_at_t4():
    _, rc, cc = fig1_run(RIGHT_FIRST, COARSE)
    _, rd, cd = fig1_run(RIGHT_FIRST, FINE)
    assert cc["Concat"][1] == cd["Concat"][1] + 1
    w1_in = lambda r: next(e for e in r.events if e.stream == "h2d" and e.name == "W1:0")  # noqa
    # (d): the fine pool has room, W1 comes in during t4 and Conv1 runs at t5.
    assert (w1_in(rd).start_s, cd["Conv1"][0]) == (3.0, 4.0)
    # (c): the five 2 MB objects are full at t4; W1 can only come in during t5
    # (when Conv4 is done with W4), and the GPU idles in t5.
    assert (w1_in(rc).start_s, cc["Conv4"][1], cc["Conv1"][0]) == (4.0, 4.0, 5.0)


def test_fig1_e_is_one_unit_slower_than_d_because_concat_waits_for_a2():
    _, rd, cd = fig1_run(RIGHT_FIRST, FINE)
    _, re, ce = fig1_run(LEFT_FIRST, FINE)
    assert ce["Concat"][1] == cd["Concat"][1] + 1
    a2_out = lambda r: next(e for e in r.events if e.stream == "d2h" and e.name == "Conv2:0")  # noqa
    # (e): A2 (2 MB) can leave only after Conv3 at t4; it takes t5 and t6, and
    # Concat, whose 2 MB output needs A2's object, idles in t6.
    assert (a2_out(re).start_s, a2_out(re).end_s) == (4.0, 6.0)
    assert ce["Conv4"][1] == 5.0 and ce["Concat"][0] == 6.0
    # (d): Conv3 runs at t3, so A2 leaves during t4-t5 and Concat does not wait.
    assert (a2_out(rd).start_s, a2_out(rd).end_s) == (3.0, 5.0)
    assert cd["Concat"][0] == cd["Conv1"][1] == 5.0

"""Two replicas' steps matched op by op, and a plan of one carried to the other
(issue #43 item 4): :mod:`tfswap.core.graph_match`, :mod:`tfswap.core.carry`."""

import dataclasses

import pytest

from tfswap.core import carry, graph_match, planners, simulator
from tfswap.core.devices import DeviceSpec
from tfswap.core.graph import DataflowGraph, Op, Tensor
from tfswap.core.problem import Problem

MB = 1 << 20
SPEC = DeviceSpec("test", memory_bytes=1 << 30, peak_flops=1e12,
                  memory_bandwidth_bytes_per_s=1e11, h2d_bytes_per_s=1e9, d2h_bytes_per_s=1e9,
                  duplex_bytes_per_s=2e9, launch_overhead_s=0.0)
LAYERS = 4


def step(prefix="", extra_sink=False, outputs_sink=True, rename=None, bytes_scale=1,
         reversed_list=False, swap_inputs=False, rewritten=None):
    """A small training step: ``LAYERS`` layers forward (each a MatMul of the
    previous activation and a weight read, then a Relu), a loss, and backward
    (each gradient reads the next one, the layer's activation and its weight).
    The weights are alike (one shape), so only what reads them tells them apart.
    ``prefix``: put before every name (another replica's); ``swap_inputs``: the
    MatMuls read their inputs the other way round (Grappler orders a commutative
    op's inputs by name); ``outputs_sink``: the step's output Identity;
    ``extra_sink``: a NoOp the other replica has instead; ``rewritten``: the layer
    whose backward Mul reads the activation's input instead of the activation
    (what Grappler did to one replica of the BERT-style step)."""
    n = (rename or (lambda s: prefix + s))
    ops = [Op(n("x"), "Placeholder")]
    act = n("x") + ":0"
    for k in range(LAYERS):
        ops.append(Op(n(f"w{k}"), "ReadVariableOp", phase="forward"))
        pair = (act, n(f"w{k}") + ":0")
        ops.append(Op(n(f"mm{k}"), "MatMul", pair[::-1] if swap_inputs else pair,
                      phase="forward", time_s=1e-3))
        ops.append(Op(n(f"relu{k}"), "Relu", (n(f"mm{k}") + ":0",), phase="forward",
                      time_s=1e-4))
        act = n(f"relu{k}") + ":0"
    ops.append(Op(n("loss"), "Sum", (act,), phase="forward", time_s=1e-4))
    grad = n("loss") + ":0"
    for k in reversed(range(LAYERS)):
        reads = n(f"mm{k}") + ":0" if rewritten == k else n(f"relu{k}") + ":0"
        ops.append(Op(n(f"gmul{k}"), "Mul", (grad, reads), phase="backward", time_s=1e-4))
        ops.append(Op(n(f"gw{k}"), "MatMul", (n(f"gmul{k}") + ":0", n(f"w{k}") + ":0"),
                      phase="backward", time_s=1e-3))
        grad = n(f"gw{k}") + ":0"
    if outputs_sink:
        ops.append(Op(n("out"), "Identity", (n("loss") + ":0",)))
    if extra_sink:
        ops.append(Op(n("group"), "NoOp", control_inputs=(n("loss"),)))
    if reversed_list:   # another op order in the GraphDef (still topological in build)
        head, tail = ops[:1], ops[1:]
        ops = head + tail[::-1]
    sizes = {"Placeholder": MB, "ReadVariableOp": MB // 4, "Sum": 4, "NoOp": 0}
    tensors = [Tensor(f"{op.name}:0", sizes.get(op.type, MB) * bytes_scale,
                      shape=(sizes.get(op.type, MB) * bytes_scale // 4,),
                      kind="parameter" if op.type == "ReadVariableOp" else "activation")
               for op in ops if op.type != "NoOp"]
    return DataflowGraph.build(ops, tensors)


def problem(graph):
    keep = tuple(t.name for t in graph.tensors if t.name.rpartition(":")[0].endswith(
        ("loss", "gw0")))
    return Problem.of(graph, keep=keep, small_threshold_bytes=1024)


def planned(p, budget=int(4.5 * MB)):
    return planners.run("tfswap.order", p, budget, SPEC).plan


def test_replicas_alike_up_to_names_match_exactly_and_carry_the_same_plan():
    a = problem(step())
    b = problem(step("replica_1/", reversed_list=True, swap_inputs=True))
    m = graph_match.match(a.graph, b.graph)
    # Every op paired with its own counterpart, although the names differ, the
    # ops come in another order, the weights are alike and the MatMuls read their
    # inputs the other way round.
    assert m.ops == {op.name: "replica_1/" + op.name for op in a.graph.ops}
    assert m.exact == frozenset(m.ops) and m.coverage == 1.0 and not m.only_a + m.only_b
    plan = planned(a)
    assert plan.swaps, "the budget must make the plan swap"
    got = carry.carry(plan, a, b, m, int(4.5 * MB), SPEC)
    assert not (got.dropped or got.laid_out or got.retimed or got.replanned)
    assert got.plan.schedule == tuple("replica_1/" + n for n in plan.schedule)
    renamed = tuple(dataclasses.replace(
        sw, tensor="replica_1/" + sw.tensor, id="replica_1/" + sw.id,
        out_after="replica_1/" + sw.out_after if sw.out_after else "",
        in_after="replica_1/" + sw.in_after if sw.in_after else "",
        consumers=tuple("replica_1/" + c for c in sw.consumers),
        in_wait_for=tuple("replica_1/" + w for w in sw.in_wait_for),
        out_before=tuple("replica_1/" + o for o in sw.out_before),
        ops=tuple("replica_1/" + o for o in sw.ops)) for sw in plan.swaps)
    assert got.plan.swaps == renamed
    assert got.plan.allocation == plan.allocation
    assert got.plan.prediction.step_time_s == pytest.approx(plan.prediction.step_time_s)
    assert got.plan.prediction.peak_bytes == plan.prediction.peak_bytes
    # What carry checks it by: the plan runs there.
    sim = simulator.simulate(b.graph, got.plan, SPEC, keep=b.keep, compiled=b.compiled)
    assert sim.peak_bytes <= int(4.5 * MB)


def test_ops_one_replica_alone_has_are_left_out_and_the_rest_still_carries():
    """The first replica holds the step's output, the other a NoOp grouping its
    control edges (as MirroredStrategy's replicas do)."""
    a = problem(step())
    b = problem(step("replica_1/", outputs_sink=False, extra_sink=True))
    m = graph_match.match(a.graph, b.graph)
    assert m.only_a == ("out",) and m.only_b == ("replica_1/group",)
    assert 0.95 < m.coverage < 1.0
    got = carry.carry(planned(a), a, b, m, int(4.5 * MB), SPEC)
    assert "replica_1/group" in got.plan.schedule and "out" not in got.plan.schedule
    assert "1 only on the first, 1 only here" in got.describe()


def test_an_op_computed_otherwise_on_one_replica_is_paired_by_its_neighbours():
    """Grappler associated one product differently on one replica (it reads the
    MatMul, not the Relu): everything after it hashes differently there, yet it
    and what follows are paired by their place among the exact pairs."""
    a = problem(step())
    b = problem(step("replica_1/", rewritten=2))
    m = graph_match.match(a.graph, b.graph)
    assert m.ops == {op.name: "replica_1/" + op.name for op in a.graph.ops}
    loose = set(m.ops) - m.exact
    assert "gmul2" in loose and "relu3" not in loose and "gmul3" not in loose
    assert f"{len(loose)} of them by their neighbours" in m.describe()


def test_a_replica_that_differs_beyond_a_match_is_not_carried():
    """Another model on the other device (every tensor twice the size): nothing
    matches, and carry says so instead of guessing."""
    a = problem(step())
    b = problem(step("replica_1/", bytes_scale=2))
    m = graph_match.match(a.graph, b.graph)
    assert m.coverage < graph_match.MIN_COVERAGE
    with pytest.raises(carry.NotCarried, match="differ beyond a match"):
        carry.carry(planned(a), a, b, m, int(4.5 * MB), SPEC)


def test_a_carried_plan_that_does_not_fit_the_budget_there_is_not_carried():
    a = problem(step())
    b = problem(step("replica_1/"))
    m = graph_match.match(a.graph, b.graph)
    plan = planned(a)
    with pytest.raises(carry.NotCarried, match="more than the planner's budget"):
        carry.carry(plan, a, b, m, plan.allocation.total_bytes - 1, SPEC)


def test_where_the_carried_plan_does_not_fit_its_schedule_still_serves_the_other_step():
    """The other replica's first layer reads the MatMul in backward, which the first
    replica's plan lets die: carried as it is, the plan needs more than the budget
    there; its schedule, with the swaps planned again for it, fits."""
    a = problem(step())
    b = problem(step("replica_1/", rewritten=0))
    m = graph_match.match(a.graph, b.graph)
    budget = int(4.5 * MB)
    plan = planned(a, budget)
    with pytest.raises(carry.NotCarried, match="more than the planner's budget"):
        carry.carry(plan, a, b, m, budget, SPEC)
    got = carry.carry_schedule(plan, a, b, m, budget, SPEC)
    assert got.replanned and "its schedule carried" in got.describe()
    order = [n for n in got.plan.schedule]
    assert [n for n in order if not n.startswith("replica_1/")] == []
    sim = simulator.simulate(b.graph, got.plan, SPEC, keep=b.keep, compiled=b.compiled)
    assert sim.peak_bytes <= budget and got.plan.allocation.total_bytes <= budget


def test_a_rewritten_op_whose_inputs_stay_on_the_device_still_carries_the_plan():
    """Rewritten in the last layer (its MatMul, not its Relu, read in backward), the
    other replica runs the first's plan within the budget."""
    a = problem(step())
    b = problem(step("replica_1/", rewritten=LAYERS - 1))
    m = graph_match.match(a.graph, b.graph)
    budget = int(3.6 * MB)
    got = carry.carry(planned(a, budget), a, b, m, budget, SPEC)
    sim = simulator.simulate(b.graph, got.plan, SPEC, keep=b.keep, compiled=b.compiled)
    assert sim.peak_bytes <= budget and not got.replanned


def test_a_copy_the_other_step_no_longer_reads_is_not_brought_back():
    """Mapped onto the step rewritten in its first layer, the first's round trip of
    relu0 (back for gmul0, which there reads mm0 instead) would bring back what no
    op reads: it is left out, swap-out and all (the buffer dies after its last use);
    the others stay as they were."""
    from tfswap.core import program

    a = problem(step())
    b = problem(step("replica_1/", rewritten=0))
    plan = planned(a, int(4.5 * MB))
    assert any(sw.tensor == "relu0:0" and sw.kind == "round_trip" for sw in plan.swaps)
    mapped, _ = graph_match.map_plan(plan, a.graph, b.graph, graph_match.match(a.graph, b.graph))
    cg = b.compiled
    prog = program.from_plan(cg, mapped.schedule, mapped.swaps, mapped.resident_parameters)
    fixed = program.needs_from_uses(cg, prog)
    relu0 = cg.buf_names.index("replica_1/relu0:0")
    assert any(r.buf == relu0 for r in prog.ins) and not any(r.buf == relu0 for r in fixed.ins)
    assert not any(o.buf == relu0 for o in fixed.outs)
    assert len(fixed.ins) == len(prog.ins) - 1 and len(fixed.outs) == len(prog.outs) - 1
    # A program whose copies come back for their first readers is left as it is.
    own = program.from_plan(a.compiled, plan.schedule, plan.swaps, plan.resident_parameters)
    assert program.needs_from_uses(a.compiled, own) is own

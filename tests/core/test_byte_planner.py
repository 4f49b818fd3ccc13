"""The byte-cap planner on synthetic graphs: its plans are what the simulator runs,
the live bytes stay under the cap, the shared layout fits the budget (no
TensorFlow; how the default planner weighs its plans: test_best_of.py)."""

import pytest

from tfswap.core import baselines, byte_planner, layout
from tfswap.core.compiled import CompiledGraph
from tfswap.core.plan import Plan
from tfswap.core.infeasible import InfeasibleAllocation
from tfswap.core.simulator import simulate
from research.synthetic import layered_training_step
from tests.core.plan_checks import SPEC


@pytest.fixture(scope="module")
def step():
    g = layered_training_step(300, seed=5)
    return g, baselines.ideal(g, 1, SPEC).prediction.peak_bytes


@pytest.mark.parametrize("fraction", [0.6, 0.75, 0.9])
@pytest.mark.parametrize("lookahead", [None, 2.0])
def test_live_bytes_stay_under_the_cap_and_the_plan_is_what_runs(step, fraction, lookahead):
    g, peak = step
    budget = int(peak * fraction)
    p = byte_planner.plan(g, budget, SPEC, lookahead=lookahead)
    result = simulate(g, p, SPEC)
    assert result.peak_bytes <= budget
    assert result.step_time_s == p.prediction.step_time_s
    assert result.step_time_s >= result.ideal_time_s
    assert p.swaps and all(s.kind == "round_trip" for s in p.swaps)
    assert Plan.from_json(p.to_json()) == p


def test_the_cap_is_held_at_every_position_of_the_scan(step):
    g, peak = step
    cg = CompiledGraph.build(g)
    order = cg.order_of(None)
    cap = int(peak * 0.6) - cg.small_pool_peak(order)
    scan = byte_planner._ByteScan(cg, order, SPEC, None, 0.0)
    prog = scan.run(cap)
    assert scan.occ.max() <= cap
    # Every swap-in starts after its own swap-out's op and waits for what it evicted.
    for r in prog.ins:
        assert r.own_out >= 0 and prog.outs[r.own_out].out_after <= r.trigger < r.need
        assert all(prog.outs[j].out_after <= r.trigger for j in r.waits)


def test_a_looser_cap_swaps_less_and_runs_no_slower(step):
    g, peak = step
    tight = byte_planner.plan(g, int(peak * 0.6), SPEC)
    loose = byte_planner.plan(g, int(peak * 0.9), SPEC)
    assert loose.swapped_bytes < tight.swapped_bytes
    assert loose.prediction.step_time_s <= tight.prediction.step_time_s


def test_a_step_that_fits_gets_no_swaps(step):
    g, peak = step
    p = byte_planner.plan(g, peak, SPEC)
    assert p.swaps == ()
    assert p.prediction.step_time_s == p.prediction.ideal_time_s


def test_shared_memory_fits_its_arena_in_the_budget_without_conflicts(step):
    g, peak = step
    budget = int(peak * 0.7)
    p = byte_planner.plan(g, budget, SPEC, memory="shared")
    assert p.allocation.shared and p.allocation.total_bytes <= budget
    result = simulate(g, p, SPEC, events=True)
    assert result.step_time_s == p.prediction.step_time_s
    assert layout.conflicts(result, p.allocation) == []


def test_below_what_one_op_needs_it_says_to_raise_the_budget(step):
    g, _ = step
    cg = CompiledGraph.build(g)
    need = int(cg.op_working_set().max())
    with pytest.raises(InfeasibleAllocation, match="raise the budget"):
        byte_planner.plan(g, need // 2, SPEC)


@pytest.mark.parametrize("bad, match", [
    (dict(memory="pool"), "memory must be one of"),
    (dict(lookahead=-1.0), "lookahead must be None or >= 0"),
])
def test_bad_options_are_refused(step, bad, match):
    g, peak = step
    with pytest.raises(ValueError, match=match):
        byte_planner.plan(g, peak, SPEC, **bad)


def test_bad_cap_is_refused(step):
    g, _ = step
    cg = CompiledGraph.build(g)
    with pytest.raises(ValueError, match="cap_bytes must be an int > 0"):
        byte_planner.build_program(cg, cg.order_of(None), SPEC, 0)


def _slow_link():
    import dataclasses

    return dataclasses.replace(SPEC, h2d_bytes_per_s=1e9, d2h_bytes_per_s=1e9,
                               duplex_bytes_per_s=1.5e9)


@pytest.mark.parametrize("memory", ["live", "shared"])
def test_what_is_cheaper_to_make_again_is_dropped_and_made_again(memory):
    """On a slow link the plan drops what its ops make again for less than a share
    of the copies, and is faster than copying alone; the simulator runs it within
    the budget, and the saved plan reads back to the same program."""
    from tfswap.core.program import from_plan
    from tfswap.core.problem import Problem

    spec = _slow_link()
    graph = layered_training_step(300, seed=4)
    problem = Problem.of(graph, recomputable=[op.name for op in graph.ops])
    peak = byte_planner.plan(graph, 1 << 62, spec).prediction.peak_bytes
    budget = int(0.7 * peak)
    copies = byte_planner.plan(graph, budget, spec, compiled=problem.compiled, memory=memory)
    hybrid = byte_planner.plan(graph, budget, spec, compiled=problem.compiled, memory=memory,
                               recomputable=problem.recomputable)
    remade = [s for s in hybrid.swaps if s.kind == "recompute"]
    assert remade and all(s.ops for s in remade)
    assert hybrid.prediction.step_time_s < copies.prediction.step_time_s
    assert hybrid.prediction.swap_in_bytes < copies.prediction.swap_in_bytes
    again = simulate(graph, hybrid, spec, compiled=problem.compiled)
    assert again.step_time_s == pytest.approx(hybrid.prediction.step_time_s)
    assert again.peak_bytes <= budget
    cg = problem.compiled
    prog = from_plan(cg, hybrid.schedule, hybrid.swaps, hybrid.resident_parameters)
    loaded = Plan.from_json(hybrid.to_json())
    assert from_plan(cg, loaded.schedule, loaded.swaps, loaded.resident_parameters) == prog
    # A remake that reads a buffer remade at the same position comes after it.
    for i, rec in enumerate(prog.recomputes):
        reads = {int(x) for op in rec.ops
                 for x in cg.op_in[cg.op_in_ptr[op]:cg.op_in_ptr[op + 1]]}
        assert all(j < i for j, r in enumerate(prog.recomputes)
                   if r.buf in reads and r.need == rec.need)


def test_only_the_ops_named_may_run_again():
    spec = _slow_link()
    graph = layered_training_step(300, seed=4)
    peak = byte_planner.plan(graph, 1 << 62, spec).prediction.peak_bytes
    named = {op.name for op in graph.ops[: len(graph.ops) // 3]}
    plan = byte_planner.plan(graph, int(0.7 * peak), spec, recomputable=named)
    for s in plan.swaps:
        if s.kind == "recompute":
            assert set(s.ops) <= named


def test_the_registered_byte_planner_recomputes_what_the_problem_allows():
    from tfswap.core import planners
    from tfswap.core.problem import Problem

    spec = _slow_link()
    graph = layered_training_step(300, seed=4)
    peak = byte_planner.plan(graph, 1 << 62, spec).prediction.peak_bytes
    allowed = Problem.of(graph, recomputable=[op.name for op in graph.ops])
    plan = planners.run("tfswap.bytes", allowed, int(0.7 * peak), spec).plan
    assert any(s.kind == "recompute" for s in plan.swaps)
    swaps_only = planners.run("tfswap.bytes", Problem.of(graph), int(0.7 * peak), spec).plan
    assert not any(s.kind == "recompute" for s in swaps_only.swaps)
    assert plan.prediction.step_time_s < swaps_only.prediction.step_time_s


def _two_ways_to_make_room():
    """x, then a (slow to make again) and b (fast), both 8 MB; an op at f1 passes a
    22 MB cap while both are held; b is read next at rb, a later at ra."""
    from tfswap.core.graph import DataflowGraph, Op, Tensor

    mb = 1 << 20
    ops = [Op("x", "Placeholder", time_s=1e-4),
           Op("a", "Slow", ("x:0",), time_s=10e-3),
           Op("b", "Fast", ("x:0",), time_s=1e-4),
           Op("f1", "Fill", ("x:0",), time_s=1e-3),
           Op("f2", "Fill", ("f1:0",), time_s=1e-3),
           Op("rb", "Read", ("b:0", "f2:0"), time_s=1e-3),
           Op("ra", "Read", ("a:0", "rb:0", "x:0"), time_s=1e-3)]
    sizes = {"x": mb, "a": 8 * mb, "b": 8 * mb, "f1": 6 * mb, "f2": 2 * mb, "rb": 2 * mb,
             "ra": 2 * mb}
    graph = DataflowGraph.build(ops, [Tensor(f"{n}:0", nbytes=s) for n, s in sizes.items()])
    return graph, 22 * mb


def test_both_drop_orders_are_tried_and_the_cheaper_remake_wins():
    """Farthest-first drops ``a`` (used last) and makes it again for 10 ms; the
    cheapest-per-byte order drops ``b`` (0.1 ms).  The planner tries both and
    keeps the faster, so the plan remakes ``b``."""
    import dataclasses

    from tfswap.core.problem import Problem
    from tfswap.core.program import from_plan

    spec = dataclasses.replace(SPEC, h2d_bytes_per_s=1e8, d2h_bytes_per_s=1e8,
                               duplex_bytes_per_s=1.5e8)
    graph, cap = _two_ways_to_make_room()
    problem = Problem.of(graph, small_threshold_bytes=0, recomputable=["a", "b"])
    cg = problem.compiled
    order = cg.order_of(None)
    made = {}
    for drop_order in byte_planner.DROP_ORDERS:
        prog = byte_planner.build_program(cg, order, spec, cap, recompute={1, 2},
                                          drop_order=drop_order)
        made[drop_order] = {graph.ops[op].name for rec in prog.recomputes for op in rec.ops}
    assert made == {"farthest": {"a"}, "cheapest": {"b"}}
    plan = byte_planner.plan(graph, cap, spec, compiled=cg, small_threshold_bytes=0,
                             recomputable=problem.recomputable)
    prog = from_plan(cg, plan.schedule, plan.swaps, plan.resident_parameters)
    assert [graph.ops[op].name for rec in prog.recomputes for op in rec.ops] == ["b"]
    assert simulate(graph, plan, spec, compiled=cg).peak_bytes <= cap


def test_a_tensor_that_cannot_be_swapped_is_never_moved():
    """``a`` (used farthest ahead: Belady's choice) is not swappable (a variant, say):
    the planner moves ``b`` instead, and never drops ``a`` either."""
    import dataclasses

    from tfswap.core.graph import DataflowGraph

    graph, cap = _two_ways_to_make_room()
    tensors = [dataclasses.replace(t, swappable=t.name != "a:0", producer=-1, consumers=())
               for t in graph.tensors]
    pinned = DataflowGraph.build([dataclasses.replace(op, outputs=()) for op in graph.ops],
                                 tensors)
    for recomputable in ((), ("a", "b")):
        plan = byte_planner.plan(pinned, cap, SPEC, small_threshold_bytes=0,
                                 recomputable=recomputable)
        moved = {s.tensor for s in plan.swaps}
        assert moved and "a:0" not in moved, plan.swaps
    free = byte_planner.plan(graph, cap, SPEC, small_threshold_bytes=0)
    assert "a:0" in {s.tensor for s in free.swaps}   # what it would move otherwise


def test_each_program_the_variants_make_is_simulated_once(monkeypatch):
    """The variants' scans often make the same program (a recomputing scan that
    dropped nothing at some cap); each is simulated once, and every variant's
    plan is still what the simulator runs."""
    from tfswap.core.problem import Problem

    spec = _slow_link()
    graph = layered_training_step(300, seed=4)
    problem = Problem.of(graph, recomputable=[op.name for op in graph.ops])
    budget = int(0.7 * byte_planner.plan(graph, 1 << 62, spec).prediction.peak_bytes)
    seen = []
    real = byte_planner._simulated

    def counting(cg, order, prog, spec, shared):
        seen.append(prog)
        return real(cg, order, prog, spec, shared)

    monkeypatch.setattr(byte_planner, "_simulated", counting)
    plans = byte_planner.variants(graph, budget, spec, memory="shared",
                                  compiled=problem.compiled, recomputable=problem.recomputable,
                                  checkpoints=False)
    # Some of its ops have planned scratch: each variant also scans with chains
    # that run them.
    assert any(op.scratch_bytes for op in graph.ops)
    # Where the fastest of those still copies, the retrying variants too.
    first = 1 + 2 * len(byte_planner.RECOMPUTE_VARIANTS)
    copies = min(plans[:first], key=lambda p: p.prediction.step_time_s).prediction.swap_out_bytes
    assert len(plans) == first + (2 * (len(byte_planner.RETRY_VARIANTS)
                                       + len(byte_planner.SHARED_VARIANTS)) if copies else 0)
    held = byte_planner.variants(graph, budget, spec, memory="shared",
                                 compiled=problem.compiled, recomputable=problem.recomputable,
                                 swaps_alone=False, checkpoints="only")
    assert len(held) == len(byte_planner.CHECKPOINT_VARIANTS)
    plans += held
    assert seen and len(seen) == len(set(seen))
    for p in plans:
        assert p.allocation.total_bytes <= budget
        again = simulate(graph, p, spec, compiled=problem.compiled)
        assert again.step_time_s == pytest.approx(p.prediction.step_time_s)


def test_a_remade_buffer_makes_the_value_its_later_readers_read_not_a_view_of_it():
    """A view of a buffer made and read before the gap (``bv = Reshape(b)``) is no
    part of what the reader after the gap (``rb`` reads ``b:0``) needs: the remake
    runs ``b`` alone.  The scan used to remake ``(b, bv)``, and the rewrite then
    found no reader of ``bv:0`` (fuzz seeds 5362, 7354, 7946, ...: "recompute of
    Reshape_1:0: needs out_after ... and consumers" inside optimize)."""
    import dataclasses

    from tfswap.core.graph import DataflowGraph, Op, Tensor
    from tfswap.core.problem import Problem

    mb = 1 << 20
    ops = [Op("x", "Placeholder", time_s=1e-4),
           Op("a", "Slow", ("x:0",), time_s=10e-3),
           Op("b", "Fast", ("x:0",), time_s=1e-4),
           Op("bv", "Reshape", ("b:0",), time_s=1e-6),       # a view of b:0 (same buffer)
           Op("r1", "Read", ("bv:0",), time_s=1e-4),         # reads the view, before the gap
           Op("f1", "Fill", ("x:0",), time_s=1e-3),          # passes the cap: b is dropped
           Op("f2", "Fill", ("f1:0",), time_s=1e-3),
           Op("rb", "Read", ("b:0", "f2:0"), time_s=1e-3),   # after the gap: reads b:0
           Op("ra", "Read", ("a:0", "rb:0", "x:0", "r1:0"), time_s=1e-3)]
    sizes = {"x": mb, "a": 8 * mb, "b": 8 * mb, "f1": 6 * mb, "f2": 2 * mb, "rb": 2 * mb,
             "ra": 2 * mb, "r1": 1024}
    tensors = [Tensor(f"{n}:0", nbytes=s) for n, s in sizes.items()]
    tensors.append(Tensor("bv:0", nbytes=8 * mb, alias_of="b:0"))
    graph = DataflowGraph.build(ops, tensors)
    spec = dataclasses.replace(SPEC, h2d_bytes_per_s=1e8, d2h_bytes_per_s=1e8,
                               duplex_bytes_per_s=1.5e8)
    schedule = [op.name for op in ops]
    problem = Problem.of(graph, small_threshold_bytes=0, schedule=schedule,
                         recomputable=["b", "bv"])
    plan = byte_planner.plan(graph, 22 * mb, spec, compiled=problem.compiled,
                             schedule=schedule, small_threshold_bytes=0,
                             recomputable=problem.recomputable)
    remade = [s for s in plan.swaps if s.kind == "recompute"]
    assert remade, "the budget should make the planner drop and remake b"
    for swap in remade:
        made = graph.op(swap.ops[-1]).outputs
        assert all(any(t in graph.op(c).inputs for t in made) for c in swap.consumers), swap
    assert any(s.ops == ("b",) for s in remade)


def _scan_cases():
    import numpy as np
    from research.synthetic import random_dag
    graphs = [("layered", layered_training_step(300, seed=4)),
              ("layered-skip", layered_training_step(200, seed=9, skip_every=2))]
    graphs += [(f"random{s}", random_dag(np.random.default_rng(s), n_ops=60, n_params=6))
               for s in range(6)]
    # Random training steps (a forward pass its backward pass reads in reverse):
    # with every op allowed to run again, some caps make the scans remake segments.
    graphs += [(f"layered-random{s}", layered_training_step(120, seed=s, skip_every=s % 3 + 1))
               for s in (11, 12, 13)]
    return graphs


# The cases test_the_compiled_scan_makes_the_reference_scans_programs must see a
# segment in (a remake whose ops read a buffer another remake makes first).
SEGMENTED_CASES = ("layered", "layered-skip", "layered-random11", "layered-random12",
                   "layered-random13")


@pytest.mark.parametrize("name, graph", _scan_cases(), ids=lambda x: x if isinstance(x, str)
                         else "")
def test_the_compiled_scan_makes_the_reference_scans_programs(name, graph):
    """tfswap.core.native's byte scan follows _ByteScan exactly: the same program
    (or the same refusal) at every cap, both prefetch rules, with and without ops
    that may run again, at each share and drop order."""
    spec = _slow_link()
    cg = CompiledGraph.build(graph)
    order = cg.order_of(None)
    peak = byte_planner.plan(graph, 1 << 62, spec, compiled=cg).prediction.peak_bytes
    everything = frozenset(range(cg.n_ops))
    some = frozenset(range(0, cg.n_ops, 2))
    compared = remade = refused = segmented = 0
    for fraction in (0.15, 0.3, 0.45, 0.6, 0.8, 1.0):
        cap = max(1, int(fraction * peak))
        for lookahead in (None, 2.0):
            for recompute, shares, drops in ((frozenset(), (0.1,), ("farthest",)),
                                             (everything, byte_planner.RECOMPUTE_SHARES,
                                              byte_planner.DROP_ORDERS),
                                             (some, (0.5,), byte_planner.DROP_ORDERS)):
                for share in shares:
                    for drop in drops:
                        args = dict(lookahead=lookahead, recompute=recompute,
                                    recompute_share=share, drop_order=drop)
                        got = want = None
                        try:
                            want = byte_planner.build_program(cg, order, spec, cap,
                                                              reference=True, **args)
                        except InfeasibleAllocation as err:
                            want = str(err)
                        try:
                            got = byte_planner.build_program(cg, order, spec, cap, **args)
                        except InfeasibleAllocation as err:
                            got = str(err)
                        assert got == want, (fraction, lookahead, len(recompute), share, drop)
                        compared += 1
                        refused += isinstance(want, str)
                        remade += not isinstance(want, str) and bool(want.recomputes)
                        segmented += not isinstance(want, str) and bool(_segments(cg, want))
    assert compared > refused
    if name.startswith("layered"):
        assert remade
    if name in SEGMENTED_CASES:
        assert segmented, "a segment should be made again at some cap"



def _forward_backward(n: int = 12, input_mb: int = 8, loss_reads_input: bool = False):
    """A forward chain of ``n`` cheap 8 MB ops, a loss and a backward pass that reads
    them in reverse (``g{i}`` reads ``f{i}`` and ``g{i+1}``): gradient checkpointing's
    textbook case.  The step's input ``x`` (``input_mb``) is read by ``f0`` (and the
    loss, with ``loss_reads_input``), never in the backward pass."""
    from tfswap.core.graph import DataflowGraph, Op, Tensor

    mb = 1 << 20
    ops = [Op("x", "Placeholder", time_s=1e-5)]
    prev = "x:0"
    for i in range(n):
        ops.append(Op(f"f{i}", "Tanh", (prev,), time_s=1e-5))
        prev = f"f{i}:0"
    ops.append(Op("loss", "Sum", (prev, "x:0") if loss_reads_input else (prev,), time_s=1e-5))
    grad = "loss:0"
    for i in reversed(range(n)):
        ops.append(Op(f"g{i}", "TanhGrad", (f"f{i}:0", grad), time_s=1e-4))
        grad = f"g{i}:0"
    sizes = {op.name: 8 * mb for op in ops}
    sizes["loss"] = mb
    sizes["x"] = input_mb * mb
    graph = DataflowGraph.build(ops, [Tensor(f"{k}:0", nbytes=v) for k, v in sizes.items()])
    return graph, [op.name for op in ops if op.type == "Tanh"]


def _both_scans(cg, order, spec, cap, **args) -> list:
    """The Python reference scan's and the native scan's program (or refusal) at ``cap``."""
    got = []
    for reference in (True, False):
        try:
            got.append(byte_planner.build_program(cg, order, spec, cap, reference=reference,
                                                  **args))
        except InfeasibleAllocation as err:
            got.append(str(err))
    return got


def _segments(cg, prog):
    """(reader, read) pairs of recomputations at one position where the reader's
    ops read the other's buffer."""
    found = []
    for rec in prog.recomputes:
        reads = {int(x) for op in rec.ops
                 for x in cg.op_in[cg.op_in_ptr[op]:cg.op_in_ptr[op + 1]]}
        found += [(rec, r) for r in prog.recomputes
                  if r is not rec and r.need == rec.need and r.buf in reads]
    return found


@pytest.mark.parametrize("drop_order", byte_planner.DROP_ORDERS)
@pytest.mark.parametrize("share", byte_planner.RECOMPUTE_SHARES)
def test_a_segment_is_dropped_and_made_again_forward_within_the_cap(drop_order, share):
    """With a slow link, the forward activations are dropped, including ones that
    another dropped one's ops read: a remake that finds its input dropped makes it
    again first, at its own position, with the chain for that position, and the
    input then stays for its own reader (gradient checkpointing).  The simulator
    runs the program within the cap, each remake runs the chain worked out for
    the position it runs at, the one read comes first, and the plan reads back to
    the same program."""
    import dataclasses

    from tfswap.core.program import from_plan, to_plan_swaps
    from tfswap.core.simulator import run_program
    from tfswap.core.planner import default_allocation

    spec = dataclasses.replace(SPEC, h2d_bytes_per_s=1e8, d2h_bytes_per_s=1e8,
                               duplex_bytes_per_s=1.5e8)
    graph, remakeable = _forward_backward()
    cg = CompiledGraph.build(graph, small_threshold_bytes=0)
    order = cg.order_of(None)
    allowed = {i for i, op in enumerate(graph.ops) if op.name in remakeable}
    cap = 72 << 20   # 9 of the 14 8 MB activations and gradients the step holds at its peak
    prog = byte_planner.build_program(cg, order, spec, cap, recompute=allowed,
                                      recompute_share=share, drop_order=drop_order)
    segments = _segments(cg, prog)
    assert segments, "the cap should make the planner remake a segment"
    for i, rec in enumerate(prog.recomputes):
        chain = byte_planner._chains(cg, list(map(int, order)), frozenset(allowed))
        assert rec.ops == chain.at(rec.buf, rec.need)[0]
    for reader, read in segments:
        assert prog.recomputes.index(read) < prog.recomputes.index(reader)
    result = run_program(cg, prog, default_allocation(cg, order, 1 << 62), spec)
    assert result.peak_bytes <= cap
    swaps, resident = to_plan_swaps(cg, prog)
    names = [graph.ops[int(o)].name for o in order]
    assert from_plan(cg, names, swaps, resident) == prog


def test_checkpointing_beats_dropping_every_other_activation():
    """The planner's plan of the same step remakes segments, fits the budget as
    simulated, and is faster than copying alone."""
    import dataclasses

    from tfswap.core.program import from_plan

    spec = dataclasses.replace(SPEC, h2d_bytes_per_s=1e8, d2h_bytes_per_s=1e8,
                               duplex_bytes_per_s=1.5e8)
    graph, remakeable = _forward_backward()
    budget = 72 << 20
    cg = CompiledGraph.build(graph, small_threshold_bytes=0)
    copies = byte_planner.plan(graph, budget, spec, compiled=cg, small_threshold_bytes=0)
    hybrid = byte_planner.plan(graph, budget, spec, compiled=cg, small_threshold_bytes=0,
                               recomputable=remakeable)
    prog = from_plan(cg, hybrid.schedule, hybrid.swaps, hybrid.resident_parameters)
    assert _segments(cg, prog)
    again = simulate(graph, hybrid, spec, compiled=cg)
    assert again.peak_bytes <= budget
    assert again.step_time_s == pytest.approx(hybrid.prediction.step_time_s)
    assert hybrid.prediction.step_time_s < 0.5 * copies.prediction.step_time_s


def test_the_compiled_scan_remakes_the_reference_scans_segments():
    """The checkpointing step of the tests above, at caps from where nothing fits
    to where nothing need be dropped, each share, drop order and prefetch rule:
    the native scan (segments included: its chains for a segment's positions
    come from Python as it meets them) makes the reference's programs."""
    import dataclasses

    spec = dataclasses.replace(SPEC, h2d_bytes_per_s=1e8, d2h_bytes_per_s=1e8,
                               duplex_bytes_per_s=1.5e8)
    graph, remakeable = _forward_backward()
    cg = CompiledGraph.build(graph, small_threshold_bytes=0)
    order = cg.order_of(None)
    allowed = frozenset(i for i, op in enumerate(graph.ops) if op.name in remakeable)
    compared = segmented = 0
    for cap in range(40 << 20, 130 << 20, 4 << 20):
        for share in byte_planner.RECOMPUTE_SHARES:
            for drop in byte_planner.DROP_ORDERS:
                for lookahead in (None, 2.0):
                    got = _both_scans(cg, order, spec, cap, lookahead=lookahead,
                                      recompute=allowed, recompute_share=share,
                                      drop_order=drop)
                    assert got[1] == got[0], (cap, share, drop, lookahead)
                    compared += 1
                    segmented += not isinstance(got[0], str) and bool(_segments(cg, got[0]))
    assert segmented > 10 and compared > segmented


@pytest.mark.parametrize("reference", [False, True], ids=["compiled", "reference"])
def test_a_drop_whose_remake_leaves_its_reader_no_room_is_refused(reference):
    """b = relu(a) is cheap to make again from a (dead by then, so a temporary),
    but the op that reads it again also reads x and g and makes p: at a 36 MiB
    cap the remake's a and b beside those pass the cap.  The scan copies b out
    instead of dropping it, and plans; dropping it would have left no room for
    that op later (the scan failed: InfeasibleAllocation)."""
    import dataclasses

    from tfswap.core.graph import DataflowGraph, Op, Tensor

    mib = 1 << 20
    spec = dataclasses.replace(SPEC, h2d_bytes_per_s=1e9, d2h_bytes_per_s=1e9,
                               duplex_bytes_per_s=1.5e9)
    ops = [Op("x", "Placeholder", outputs=("x:0",), time_s=1e-5, phase="forward"),
           Op("a", "MatMul", inputs=("x:0",), time_s=1e-4, phase="forward"),
           Op("b", "Relu", inputs=("a:0",), time_s=1e-5, phase="forward"),
           Op("d", "Conv2D", inputs=("b:0",), time_s=1e-3, phase="forward"),
           Op("e", "Loss", inputs=("d:0",), time_s=1e-4, phase="forward"),
           Op("g", "Grad", inputs=("e:0", "d:0"), time_s=1e-3, phase="backward"),
           Op("p", "GradB", inputs=("g:0", "b:0", "x:0"), time_s=1e-3, phase="backward")]
    tensors = [Tensor("x:0", 8 * mib), Tensor("a:0", 8 * mib), Tensor("b:0", 8 * mib),
               Tensor("d:0", 16 * mib), Tensor("e:0", 8 * mib, kind="gradient"),
               Tensor("g:0", 8 * mib, kind="gradient"), Tensor("p:0", 8 * mib, kind="gradient")]
    graph = DataflowGraph.build(ops, tensors)
    cg = CompiledGraph.build(graph, keep=["p:0"])
    order = cg.order_of(None)
    remakable = frozenset(i for i, op in enumerate(graph.ops) if op.name in ("a", "b"))
    prog = byte_planner.build_program(cg, order, spec, 36 * mib, recompute=remakable,
                                      recompute_share=0.5, reference=reference)
    assert not prog.recomputes
    assert {cg.buf_names[o.buf] for o in prog.outs if o.copy} == {"x:0", "b:0"}


def test_activations_whose_ops_have_planned_scratch_are_made_again_with_it(monkeypatch):
    """Ops with planned scratch (an Einsum's, making attention scores) may run
    again in a chain of their own variants: their scratch is made with the chain
    and held while it runs, and the plan, simulated, fits.  Without those
    variants the slow link is the only way and the plan moves the activations."""
    import dataclasses

    from tfswap.core.graph import DataflowGraph

    graph, tanh = _forward_backward()
    ops = [dataclasses.replace(op, scratch_bytes=1 << 20) if op.name in tanh else op
           for op in graph.ops]
    graph = DataflowGraph.build(ops, graph.tensors)
    cg = CompiledGraph.build(graph, small_threshold_bytes=0)
    spec = _slow_link()
    peak = byte_planner.plan(graph, 1 << 62, spec, compiled=cg).prediction.peak_bytes
    budget = int(0.6 * peak)

    def planned():
        plan = byte_planner.plan(graph, budget, spec, compiled=cg, memory="shared",
                                 recomputable=tanh)
        assert plan.allocation.total_bytes <= budget
        again = simulate(graph, plan, spec, compiled=cg)
        assert again.step_time_s == pytest.approx(plan.prediction.step_time_s)
        return {s.kind for s in plan.swaps}, plan

    kinds, plan = planned()
    assert "recompute" in kinds, plan.swaps
    monkeypatch.setattr(byte_planner, "_with_scratch", lambda cg, allowed: False)
    kinds, without = planned()
    assert kinds == {"round_trip"}   # every op that may run again has scratch
    assert plan.prediction.step_time_s < without.prediction.step_time_s


# Steps where the largest cap that fits plans slower than a lower one tried
# (by 13%, 3% and 10%).
@pytest.mark.parametrize("seed, fraction", [(3, 0.7), (15, 0.7), (19, 0.75)])
def test_the_fastest_plan_of_the_caps_tried_that_fit_is_kept(monkeypatch, seed, fraction):
    """The shared arena's cap is bisected towards the largest that fits, but a
    lower cap can drop what a larger one moves: of every program simulated whose
    arena fits, the plan is the fastest."""
    from tfswap.core.problem import Problem

    spec = _slow_link()
    graph = layered_training_step(120, seed=seed)
    problem = Problem.of(graph, recomputable=[op.name for op in graph.ops])
    budget = int(fraction * byte_planner.plan(graph, 1 << 62, spec).prediction.peak_bytes)
    fitting = []
    real = byte_planner._simulated

    def recording(cg, order, prog, spec, shared):
        result, pool = real(cg, order, prog, spec, shared)
        if pool.total_bytes <= budget:
            fitting.append(result.step_time_s)
        return result, pool

    monkeypatch.setattr(byte_planner, "_simulated", recording)
    plan = byte_planner.plan(graph, budget, spec, memory="shared", compiled=problem.compiled,
                             recomputable=problem.recomputable)
    assert len(fitting) > 1
    assert plan.prediction.step_time_s == pytest.approx(min(fitting))


def _checkpoint_reads(cg, prog):
    """(recomputation, buffer) pairs where the recomputation's ops read a buffer
    the step no longer holds at its position (a checkpoint)."""
    from tfswap.core.program import last_uses

    last = last_uses(cg, prog.order)
    found = []
    for rec in prog.recomputes:
        made = {int(x) for op in rec.ops
                for x in cg.op_out[cg.op_out_ptr[op]:cg.op_out_ptr[op + 1]]}
        for op in rec.ops:
            for x in cg.op_in[cg.op_in_ptr[op]:cg.op_in_ptr[op + 1]]:
                x = int(x)
                if x not in made and not cg.buf_persistent[x] and 0 <= last[x] < rec.need:
                    found.append((rec, x))
    return found


@pytest.mark.parametrize("drop_order", byte_planner.DROP_ORDERS)
def test_a_chain_reads_a_checkpoint_held_until_its_remake(drop_order):
    """With ``checkpoints``, ``f0`` (8 MB) is dropped and made again in the
    backward pass from the step's 1 MB input, which the step reads only in the
    forward pass: the plan holds the input until the remake (gradient
    checkpointing's trade) where without checkpoints no chain makes ``f0`` (its
    input comes from a Placeholder, which may not run again) and it is copied.
    (The input is read by the loss too: a drop is decided while the forward
    pass runs, and a checkpoint must still be on the device then.)
    The compiled scan makes the reference's program, both simulators run it
    alike within the cap, and the plan reads back to the same program."""
    import dataclasses

    from tfswap.core.planner import default_allocation
    from tfswap.core.program import from_plan, to_plan_swaps
    from tfswap.core.simulator import run_program
    from tests.core.test_native import program_agrees

    spec = dataclasses.replace(SPEC, h2d_bytes_per_s=1e8, d2h_bytes_per_s=1e8,
                               duplex_bytes_per_s=1.5e8)
    graph, remakeable = _forward_backward(input_mb=1, loss_reads_input=True)
    cg = CompiledGraph.build(graph, small_threshold_bytes=0)
    order = cg.order_of(None)
    allowed = frozenset(i for i, op in enumerate(graph.ops) if op.name in remakeable)
    f0 = int(cg.tensor_buffer[[t.name for t in graph.tensors].index("f0:0")])
    x = int(cg.tensor_buffer[[t.name for t in graph.tensors].index("x:0")])
    found = 0
    for cap in range(40 << 20, 100 << 20, 4 << 20):
        progs = _both_scans(cg, order, spec, cap, recompute=allowed, drop_order=drop_order,
                            checkpoints=True, segment_share=1.0)
        assert progs[1] == progs[0], cap
        prog = progs[0]
        if isinstance(prog, str):
            continue
        held = _checkpoint_reads(cg, prog)
        if not held:
            continue
        found += 1
        assert {b for _, b in held} == {x}
        assert any(rec.buf == f0 for rec, _ in held)
        pool = default_allocation(cg, order, 1 << 62)
        result = run_program(cg, prog, pool, spec)
        assert result.peak_bytes <= cap
        assert program_agrees(cg, prog, pool, spec)
        swaps, resident = to_plan_swaps(cg, prog)
        names = [graph.ops[int(o)].name for o in order]
        assert from_plan(cg, names, swaps, resident) == prog
        # Without checkpoints f0 has no chain: nothing reads a checkpoint.
        plain = byte_planner.build_program(cg, order, spec, cap, recompute=allowed,
                                           drop_order=drop_order, segment_share=1.0)
        assert not _checkpoint_reads(cg, plain)
        assert all(r.buf != f0 for r in plain.recomputes)
    assert found


def test_the_simulators_hold_a_checkpoint_until_the_op_its_remake_runs_before():
    """A recomputation reading a value past the step's last reader of it holds
    that buffer until the op it runs before ends (then gives it back), in the
    reference and the compiled simulator alike; without the recomputation the
    buffer goes after its last reader."""
    from tfswap.core.program import OutRec, Program, RecomputeRec
    from tfswap.core.simulator import run_program
    from tests.core.test_native import program_agrees

    graph, remakeable = _forward_backward(n=4, input_mb=1)
    cg = CompiledGraph.build(graph, small_threshold_bytes=0)
    order = tuple(int(o) for o in cg.order_of(None))
    names = [graph.ops[o].name for o in order]
    buf = {t.name: int(cg.tensor_buffer[i]) for i, t in enumerate(graph.tensors)}
    f0, x = buf["f0:0"], buf["x:0"]
    at = {name: k for k, name in enumerate(names)}
    op_id = {op.name: i for i, op in enumerate(graph.ops)}
    resident = tuple(b for b in range(cg.n_buffers) if cg.buf_persistent[b])
    base = Program(order, resident, (), (), (), ())
    held = Program(order, resident, (OutRec(f0, at["f1"], False),), (), (),
                   (RecomputeRec(f0, 0, at["g0"], (op_id["f0"],)),))
    pool = byte_planner._unlimited_pool(cg, list(order))   # an object for every buffer
    for prog in (base, held):
        assert program_agrees(cg, prog, pool, spec=SPEC)
    events = run_program(cg, held, pool, SPEC, events=True).allocation_events
    gone = [e for e in events if not e.is_alloc and e.tensor == cg.buf_names[x]]
    assert len(gone) == 1
    plain = run_program(cg, base, pool, SPEC, events=True).allocation_events
    # Held past f0 (its last reader in the step) until g0 (f0's remake's op) ends.
    assert gone[0].time_s > next(e.time_s for e in plain
                                  if not e.is_alloc and e.tensor == cg.buf_names[x])


# The cases test_the_compiled_scan_holds_the_reference_scans_checkpoints must see
# a checkpoint in.
CHECKPOINT_CASES = ("layered", "layered-random12")


@pytest.mark.parametrize("name, graph", _scan_cases(), ids=lambda x: x if isinstance(x, str)
                         else "")
def test_the_compiled_scan_holds_the_reference_scans_checkpoints(name, graph):
    """With chains that read checkpoints (``checkpoints``) and segments up to the
    whole cap, tfswap.core.native's byte scan still makes _ByteScan's program (or
    its refusal) at every cap, both prefetch rules and drop orders; two of the
    layered training steps hold some checkpoint at some cap."""
    spec = _slow_link()
    cg = CompiledGraph.build(graph)
    order = cg.order_of(None)
    peak = byte_planner.plan(graph, 1 << 62, spec, compiled=cg).prediction.peak_bytes
    everything = frozenset(range(cg.n_ops))
    compared = refused = held = 0
    for fraction in (0.15, 0.3, 0.45, 0.6, 0.8):
        cap = max(1, int(fraction * peak))
        for lookahead in (None, 2.0):
            for drop in byte_planner.DROP_ORDERS:
                for segment_share in (byte_planner.SEGMENT_SHARE, 1.0):
                    got = _both_scans(cg, order, spec, cap, lookahead=lookahead,
                                      recompute=everything, drop_order=drop,
                                      checkpoints=True, segment_share=segment_share)
                    assert got[1] == got[0], (fraction, lookahead, drop, segment_share)
                    compared += 1
                    refused += isinstance(got[0], str)
                    held += not isinstance(got[0], str) and bool(_checkpoint_reads(cg, got[0]))
    assert compared > refused
    if name in CHECKPOINT_CASES:
        assert held, "some cap should make the scan hold a checkpoint"


def _two_halves(n: int = 6, x_held: bool = False):
    """A forward pass whose layers each make a temporary ``a{i}`` (8 MB, not
    swappable) of the step's input ``x`` (1 MB, read by the loss too), read by
    two halves, ``p{i}`` and ``q{i}``, whose product with the previous layer's
    is the layer's output; the backward op of each layer reads both halves (a
    GELU's shape).  Made again for that op, each half runs ``a{i}``'s op first:
    two chains making one temporary there.  ``x_held``: the last backward op
    reads ``x`` too, so the step holds it and a chain reads it without a
    checkpoint."""
    from tfswap.core.graph import DataflowGraph, Op, Tensor

    mb = 1 << 20
    ops = [Op("x", "Placeholder", time_s=1e-5)]
    prev = "x:0"
    for i in range(n):
        ops += [Op(f"a{i}", "Square", ("x:0",), time_s=1e-5),
                Op(f"p{i}", "Tanh", (f"a{i}:0",), time_s=1e-5),
                Op(f"q{i}", "Sigmoid", (f"a{i}:0",), time_s=1e-5),
                Op(f"h{i}", "Mul", (f"p{i}:0", f"q{i}:0", prev), time_s=1e-5)]
        prev = f"h{i}:0"
    ops.append(Op("loss", "Sum", (prev, "x:0"), time_s=1e-5))
    grad = "loss:0"
    for i in reversed(range(n)):
        extra = ("x:0",) if x_held and i == 0 else ()
        ops.append(Op(f"g{i}", "GeluGrad", (f"p{i}:0", f"q{i}:0", grad) + extra, time_s=1e-4))
        grad = f"g{i}:0"
    sizes = {op.name: 8 * mb for op in ops}
    sizes["loss"] = sizes["x"] = mb
    # The temporary may not be moved (nor so held as a checkpoint): made again.
    graph = DataflowGraph.build(ops, [Tensor(f"{k}:0", nbytes=v, swappable=k[0] != "a")
                                      for k, v in sizes.items()])
    return graph, [op.name for op in ops if op.type not in ("Placeholder", "GeluGrad")]


def test_remakes_before_one_op_share_a_temporary_their_chains_both_make():
    """Where chains read checkpoints, two halves dropped and made again for the same
    backward op make their shared temporary once, as the simulator and the
    rewrite run remakes before one op (an op an earlier chain there ran is not
    run again): the scan counts it once and drops both, where refusing the
    second drop (the rule without sharing) copies it over the link.  The
    compiled scan makes the reference's program, both simulators run it alike
    within the cap, and it reads back from its swaps."""
    import dataclasses

    from tfswap.core.program import from_plan, to_plan_swaps
    from tfswap.core.simulator import run_program
    from tests.core.test_native import program_agrees

    spec = dataclasses.replace(SPEC, h2d_bytes_per_s=1e8, d2h_bytes_per_s=1e8,
                               duplex_bytes_per_s=1.5e8)
    graph, remakeable = _two_halves()
    cg = CompiledGraph.build(graph, small_threshold_bytes=0)
    order = cg.order_of(None)
    allowed = frozenset(i for i, op in enumerate(graph.ops) if op.name in remakeable)
    a_ops = {i for i, op in enumerate(graph.ops) if op.name.startswith("a")}
    names = [graph.ops[int(o)].name for o in order]
    peak = byte_planner.plan(graph, 1 << 62, spec, compiled=cg).prediction.peak_bytes
    shared_found = 0
    for fraction in (0.3, 0.4, 0.5, 0.6, 0.7):
        cap = int(fraction * peak)
        args = dict(recompute=allowed, drop_order="cheapest", checkpoints=True,
                    segment_share=1.0)
        progs = _both_scans(cg, order, spec, cap, **args)
        assert progs[1] == progs[0], fraction
        prog = progs[0]
        if isinstance(prog, str):
            continue
        twice = [(r, s) for r in prog.recomputes for s in prog.recomputes
                 if r.buf < s.buf and r.need == s.need and a_ops & set(r.ops) & set(s.ops)]
        if not twice:
            continue
        shared_found += 1
        pool = byte_planner._unlimited_pool(cg, list(order))
        result = run_program(cg, prog, pool, spec)
        assert result.peak_bytes <= cap
        assert program_agrees(cg, prog, pool, spec)
        swaps, resident = to_plan_swaps(cg, prog)
        assert from_plan(cg, names, swaps, resident) == prog
        # Each drop refused that would make a temporary made there already: copied.
        alone = _both_scans(cg, order, spec, cap, shared_temps=False, **args)
        assert alone[1] == alone[0], fraction
        assert not any(r.need == s.need and a_ops & set(r.ops) & set(s.ops)
                       for r in alone[0].recomputes for s in alone[0].recomputes
                       if r.buf < s.buf)
        moved = sum(int(cg.buf_bytes[o.buf]) for o in alone[0].outs if o.copy)
        assert moved > sum(int(cg.buf_bytes[o.buf]) for o in prog.outs if o.copy)
    assert shared_found


def test_the_shared_variants_share_temporaries_without_checkpoints():
    """:data:`byte_planner.SHARED_VARIANTS`: with chains that read no checkpoint
    (the step holds the input), two halves made again for one op make their
    temporary once, where the same variant without sharing copies one over
    the link; compiled and reference scans agree, and :func:`variants` scans
    it where the fastest of the others copies and keeps its faster plan."""
    import dataclasses

    from tfswap.core.simulator import run_program

    from tests.core.test_native import program_agrees

    spec = dataclasses.replace(SPEC, h2d_bytes_per_s=1e8, d2h_bytes_per_s=1e8,
                               duplex_bytes_per_s=1.5e8)
    graph, remakeable = _two_halves(x_held=True)
    cg = CompiledGraph.build(graph, small_threshold_bytes=0)
    order = cg.order_of(None)
    allowed = frozenset(i for i, op in enumerate(graph.ops) if op.name in remakeable)
    a_ops = {i for i, op in enumerate(graph.ops) if op.name.startswith("a")}
    peak = byte_planner.plan(graph, 1 << 62, spec, compiled=cg).prediction.peak_bytes
    (share, drop_order, segment_share), = byte_planner.SHARED_VARIANTS
    shared_found = 0
    for fraction in (0.3, 0.4, 0.5, 0.6, 0.7):
        cap = int(fraction * peak)
        args = dict(recompute=allowed, recompute_share=share, drop_order=drop_order,
                    segment_share=segment_share)
        shared = _both_scans(cg, order, spec, cap, shared_temps=True, **args)
        alone = _both_scans(cg, order, spec, cap, shared_temps=False, **args)
        assert shared[1] == shared[0] and alone[1] == alone[0], fraction
        prog = shared[0]
        if isinstance(prog, str):
            continue
        if not any(r.buf < s.buf and r.need == s.need and a_ops & set(r.ops) & set(s.ops)
                   for r in prog.recomputes for s in prog.recomputes):
            continue
        shared_found += 1
        pool = byte_planner._unlimited_pool(cg, list(order))
        assert run_program(cg, prog, pool, spec).peak_bytes <= cap
        assert program_agrees(cg, prog, pool, spec)
        moved = sum(int(cg.buf_bytes[o.buf]) for o in alone[0].outs if o.copy)
        assert moved > sum(int(cg.buf_bytes[o.buf]) for o in prog.outs if o.copy)
    assert shared_found
    budget = int(0.5 * peak)
    plans = byte_planner.variants(graph, budget, spec, compiled=cg, recomputable=remakeable,
                                  checkpoints=False)
    fastest = min(plans, key=lambda p: p.prediction.step_time_s)
    with pytest.MonkeyPatch.context() as m:
        m.setattr(byte_planner, "SHARED_VARIANTS", ())
        without = byte_planner.variants(graph, budget, spec, compiled=cg,
                                        recomputable=remakeable, checkpoints=False)
    assert len(plans) == len(without) + len(byte_planner.SHARED_VARIANTS)
    assert fastest.prediction.step_time_s < min(
        p.prediction.step_time_s for p in without)

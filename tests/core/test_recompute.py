"""Recomputation in a plan (tfswap.core.recompute): round trips made recomputations
where the simulator says the step gets faster, and what a plan records of them."""

import pytest

from research.synthetic import layered_training_step
from tfswap.core import planners
from tfswap.core.devices import device_spec
from tfswap.core.plan import Plan, Swap
from tfswap.core.problem import Problem
from tfswap.core.program import from_plan, recompute_ops
from tfswap.core.recompute import candidates, with_recomputes
from tfswap.core.simulator import run_program, simulate
from tests.core.plan_checks import slow_v100

# A V100 whose link moves 200 MB/s: copies cost far more than elementwise ops.
SLOW = slow_v100(200e6, 400e6)


@pytest.fixture(scope="module")
def swapped():
    graph = layered_training_step(400, seed=3)
    problem = Problem.of(graph, recomputable=[op.name for op in graph.ops])
    budget = int(0.45 * planners.run("tfswap.order", problem, 1 << 62, SLOW).plan
                 .prediction.peak_bytes)
    plan = planners.run("tfswap.order", problem, budget, SLOW).plan
    assert any(s.kind == "round_trip" for s in plan.swaps)
    return problem, plan, budget


def test_round_trips_cheaper_to_compute_again_become_recomputations(swapped):
    problem, plan, budget = swapped
    hybrid = with_recomputes(problem, plan, SLOW, budget)
    recomputed = [s for s in hybrid.swaps if s.kind == "recompute"]
    assert recomputed and all(s.ops for s in recomputed)
    assert hybrid.prediction.step_time_s < plan.prediction.step_time_s
    assert hybrid.prediction.swap_in_bytes < plan.prediction.swap_in_bytes
    # What the plan says is what the simulator gives for it, within the budget.
    again = simulate(problem.graph, hybrid, SLOW, keep=problem.keep, compiled=problem.compiled)
    assert again.step_time_s == pytest.approx(hybrid.prediction.step_time_s)
    assert again.peak_bytes <= budget


def test_a_saved_hybrid_plan_gives_the_same_program(swapped, tmp_path):
    problem, plan, budget = swapped
    hybrid = with_recomputes(problem, plan, SLOW, budget)
    path = tmp_path / "hybrid.plan.json"
    hybrid.save(path)
    loaded = Plan.load(path)
    assert loaded == hybrid
    cg = problem.compiled
    a = from_plan(cg, hybrid.schedule, hybrid.swaps, hybrid.resident_parameters)
    b = from_plan(cg, loaded.schedule, loaded.swaps, loaded.resident_parameters)
    assert a == b and a.recomputes
    for rec in a.recomputes:
        assert rec.ops == recompute_ops(cg, rec)
    assert run_program(cg, a, hybrid.allocation, SLOW).step_time_s == \
        pytest.approx(hybrid.prediction.step_time_s)


def test_nothing_changes_where_nothing_may_be_recomputed_or_nothing_pays(swapped):
    problem, plan, budget = swapped
    swaps_only = Problem.of(problem.graph, keep=problem.keep, schedule=problem.schedule)
    assert with_recomputes(swaps_only, plan, SLOW, budget) is plan
    fast_link = device_spec("v100-16g-pcie3")   # 12 GB/s: a copy costs less than most ops
    cg = problem.compiled
    prog = from_plan(cg, plan.schedule, plan.swaps, plan.resident_parameters)
    slow_gain = {i: g for g, i, _ in candidates(problem, prog, SLOW)}
    for gain, i, _ in candidates(problem, prog, fast_link):
        assert gain < slow_gain[i]


def test_the_published_swapadvisor_never_recomputes(swapped):
    problem, _, budget = swapped
    from tfswap.core.search import SearchConfig

    config = SearchConfig(time_budget_s=None, max_generations=1, seed=0, workers=1)
    published = planners.run("swapadvisor", problem, budget, SLOW, config=config).plan
    assert not any(s.kind == "recompute" for s in published.swaps)


def test_ops_belong_to_recomputations_only():
    with pytest.raises(ValueError, match="only a recompute runs ops again"):
        Swap("a:0", out_after="x", in_after="", consumers=("y",), ops=("a",))


def test_recomputable_must_name_ops_of_the_graph(swapped):
    problem, _, _ = swapped
    with pytest.raises(ValueError, match="recomputable names ops that are not in the graph"):
        Problem.of(problem.graph, recomputable=["no such op"])


def _attention_like(blocks: int = 6, mib: int = 64):
    """x_i -> scores_i (read only by the softmax) -> probs_i -> x_{i+1}; the backward
    reads probs_i and x_i: probs_i can be made again only through scores_i."""
    from tfswap.core.graph import DataflowGraph, Op, Tensor

    nbytes = mib << 20
    ops, tensors = [Op("x0", "Placeholder", outputs=("x0:0",))], [
        Tensor("x0:0", nbytes, kind="input")]
    for i in range(blocks):
        x = f"x{i}:0"
        ops += [Op(f"scores{i}", "MatMul", inputs=(x, x), time_s=1e-3, phase="forward"),
                Op(f"probs{i}", "Softmax", inputs=(f"scores{i}:0",), time_s=2e-4,
                   phase="forward"),
                Op(f"x{i + 1}", "MatMul", inputs=(f"probs{i}:0", x), time_s=1e-3,
                   phase="forward")]
        tensors += [Tensor(f"scores{i}:0", nbytes), Tensor(f"probs{i}:0", nbytes),
                    Tensor(f"x{i + 1}:0", nbytes)]
    grad = f"x{blocks}:0"
    for i in reversed(range(blocks)):
        ops.append(Op(f"grad{i}", "MatMulGrad", inputs=(grad, f"probs{i}:0", f"x{i}:0"),
                      time_s=2e-3, phase="backward"))
        tensors.append(Tensor(f"grad{i}:0", nbytes, kind="gradient"))
        grad = f"grad{i}:0"
    return DataflowGraph.build(ops, tensors), grad


def test_a_value_is_made_again_through_a_buffer_the_step_no_longer_holds():
    graph, loss = _attention_like()
    recomputable = [op.name for op in graph.ops if op.type in ("MatMul", "Softmax")]
    problem = Problem.of(graph, keep=[loss], recomputable=recomputable)
    peak = planners.run("tfswap.order", problem, 1 << 62, SLOW).plan.prediction.peak_bytes
    budget = int(0.6 * peak)
    plan = planners.run("tfswap.order", problem, budget, SLOW).plan
    hybrid = with_recomputes(problem, plan, SLOW, budget)
    through = [s for s in hybrid.swaps if s.kind == "recompute" and len(s.ops) > 1]
    assert through, [(s.tensor, s.kind, s.ops) for s in hybrid.swaps]
    for s in through:   # the scores first, then the softmax that makes the tensor
        i = s.tensor.removeprefix("probs").removesuffix(":0")
        assert s.ops == (f"scores{i}", f"probs{i}")
    assert hybrid.prediction.step_time_s < plan.prediction.step_time_s
    again = simulate(graph, hybrid, SLOW, keep=problem.keep, compiled=problem.compiled)
    assert again.step_time_s == pytest.approx(hybrid.prediction.step_time_s)
    assert again.peak_bytes <= budget


def test_a_chain_never_makes_again_what_the_step_still_holds():
    # x_i is read again by the backward: a chain that made it again would hold
    # two copies, so probs_i's chain stops at x_i (an input, read where it is).
    graph, loss = _attention_like()
    problem = Problem.of(graph, keep=[loss], recomputable=[op.name for op in graph.ops])
    plan = planners.run("tfswap.order", problem, 1 << 62, SLOW).plan
    cg = problem.compiled
    from tfswap.core.program import InRec, OutRec, canonical
    from tfswap.core.recompute import ChainIndex, _chain

    prog = from_plan(cg, plan.schedule, (), plan.resident_parameters)
    order = [cg.graph.ops[o].name for o in prog.order]
    b = int(cg.tensor_buffer[[t.name for t in cg.graph.tensors].index("probs2:0")])
    outs = [OutRec(b, order.index("x3"), True)]
    ins = [InRec(b, order.index("x3"), (0,), 0, order.index("grad2"))]
    prog = canonical(prog.order, prog.resident, outs, ins, ())
    ops = _chain(cg, prog, prog.ins[0], ChainIndex(cg, prog.order))
    assert [cg.graph.ops[o].name for o in ops] == ["scores2", "probs2"]


@pytest.mark.parametrize("lookahead", [None, 4.0])
def test_a_round_trip_brought_back_early_for_another_recomputation_stays_a_round_trip(
        lookahead):
    # The byte planner remakes fwd29 before dw30 from fwd28, whose swap-in is
    # therefore brought back for that remake, earlier than for its own reader.
    # Made a recomputation, fwd28 would be made again right before its own reader
    # (a plan has no other place for it), too late for fwd29: the saved plan did
    # not run (the simulator: "reads 'fwd28:0', which is not on the device").
    from tfswap.core import byte_planner

    graph = layered_training_step(300, seed=1)
    problem = Problem.of(graph, recomputable=[op.name for op in graph.ops])
    peak = planners.run("tfswap.order", problem, 1 << 62, SLOW).plan.prediction.peak_bytes
    budget = int(0.6 * peak)
    variants = byte_planner.variants(graph, budget, SLOW, compiled=problem.compiled,
                                     memory="shared", recomputable=problem.recomputable,
                                     lookahead=lookahead)
    assert any(s.kind == "recompute" for v in variants for s in v.swaps)
    for plan in variants:
        hybrid = with_recomputes(problem, plan, SLOW, budget)
        again = simulate(graph, hybrid, SLOW, keep=problem.keep, compiled=problem.compiled)
        assert again.step_time_s == pytest.approx(hybrid.prediction.step_time_s)
        assert again.peak_bytes <= budget


@pytest.mark.parametrize("in_place", [False, True], ids=["own buffer", "written in place"])
def test_a_chain_never_reads_a_value_its_buffer_no_longer_holds(in_place):
    """b = 2a is recomputed for the backward, which also reads a's buffer.  Where
    relu(a) was written into that buffer after b (in place), a's value is gone:
    the chain makes a again too, in the buffer's fresh copy (reading the buffer
    would read relu's value), and holds that copy while it runs."""
    from tfswap.core.graph import DataflowGraph, Op, Tensor
    from tfswap.core.program import RecomputeRec, fresh_copies
    from tfswap.core.recompute import ChainIndex, value_chain

    nbytes = 2 << 20
    ops = [Op("x", "Placeholder", outputs=("x:0",)),
           Op("a", "MatMul", inputs=("x:0",), time_s=1e-3, phase="forward"),
           Op("b", "Mul", inputs=("a:0",), time_s=1e-4, phase="forward"),
           Op("c", "Relu", inputs=("a:0",), time_s=1e-4, phase="forward"),
           Op("d", "Grad", inputs=("b:0", "c:0", "a:0", "x:0"), time_s=1e-3,
              phase="backward")]
    tensors = [Tensor("x:0", nbytes, kind="input"), Tensor("a:0", nbytes),
               Tensor("b:0", nbytes), Tensor("c:0", nbytes, alias_of="a:0" if in_place else ""),
               Tensor("d:0", nbytes, kind="gradient")]
    graph = DataflowGraph.build(ops, tensors)
    problem = Problem.of(graph, keep=["d:0"], recomputable=[op.name for op in graph.ops])
    cg = problem.compiled
    order = cg.order_of(("x", "a", "b", "c", "d"))
    index = ChainIndex(cg, order)
    b = int(cg.tensor_buffer[[t.name for t in graph.tensors].index("b:0")])
    chain = value_chain(cg, index, b, upto=2, need=4)
    assert [graph.ops[o].name for o in chain] == (["a", "b"] if in_place else ["b"])
    a = int(cg.tensor_buffer[[t.name for t in graph.tensors].index("a:0")])
    rec = RecomputeRec(b, 0, 4, chain)
    assert fresh_copies(cg, order, rec) == ({a: int(cg.buf_fresh[a])} if in_place else {})


def test_trial_programs_built_in_place_equal_the_canonical_ones(swapped):
    # with_recomputes builds each trial from the plan's program without sorting it
    # again (it is in stream order already); that must be the program canonical
    # gives, recomputations already in it included.
    from tfswap.core.recompute import _in_stream_order, _recomputed
    problem, plan, budget = swapped
    cg = problem.compiled
    prog = from_plan(cg, plan.schedule, plan.swaps, plan.resident_parameters)
    assert _in_stream_order(prog)
    found = candidates(problem, prog, SLOW)
    assert len(found) >= 4
    chosen = {}
    for _, i, ops in found:
        chosen[i] = ops
        quick = _recomputed(cg, prog, dict(chosen), True)
        assert quick == _recomputed(cg, prog, dict(chosen), False)
        # Again from a program that already recomputes (a hybrid plan polished again).
        if len(chosen) == 2:
            again = _recomputed(cg, prog, dict(chosen), False)
            assert _in_stream_order(again)
            more = candidates(problem, again, SLOW)
            for _, j, ops2 in more[:6]:
                assert _recomputed(cg, again, {j: ops2}, True) == \
                    _recomputed(cg, again, {j: ops2}, False)


def test_a_round_trip_made_a_recomputation_keeps_the_swap_outs_it_waited_for(swapped):
    # A swap-in that waited for swap-outs took the room they made; made again
    # instead, the value takes that room before the same op, so the op (and the
    # remake's copies) wait for them: without a waiter TensorFlow may run such a
    # swap-out late and hold both (fuzz seed 7180, 3% over its budget).
    from tfswap.core.recompute import _recomputed
    problem, plan, _ = swapped
    cg = problem.compiled
    prog = from_plan(cg, plan.schedule, plan.swaps, plan.resident_parameters)
    found = [(i, ops) for _, i, ops in candidates(problem, prog, SLOW) if prog.ins[i].waits]
    assert found, "the fixture has no waiting round trip that may be made again"
    for in_order in (True, False):
        for i, ops in found:
            made = _recomputed(cg, prog, {i: ops}, in_order)
            rec = next(r for r in made.recomputes if r.buf == prog.ins[i].buf
                       and r.need == prog.ins[i].need)
            waited = {made.outs[j].buf for k, j in made.op_waits if k == rec.need}
            assert {prog.outs[w].buf for w in prog.ins[i].waits} <= waited


def _inputs_back_reference(cg, prog):
    """program.inputs_back as first written (every swap-in scanned per input), after
    a segment's recomputations are moved to where the ones that read them run."""
    from tfswap.core.program import InRec, Program, remade_for_remakes
    if not prog.recomputes:
        return prog
    prog = Program(prog.order, prog.resident, prog.outs, prog.ins, prog.op_waits,
                   remade_for_remakes(cg, prog))
    ins = list(prog.ins)
    for rec in prog.recomputes:
        inputs = {int(x) for p in recompute_ops(cg, rec)
                  for x in cg.op_in[cg.op_in_ptr[p]:cg.op_in_ptr[p + 1]]} - {rec.buf}
        for x in sorted(inputs):
            for i, r in enumerate(ins):
                if r.buf == int(x) and r.own_out >= 0 and r.need > rec.need and \
                        prog.outs[r.own_out].out_after < rec.need:
                    ins[i] = InRec(r.buf, min(r.trigger, rec.need - 1), r.waits, r.own_out,
                                   rec.need)
    return Program(prog.order, prog.resident, prog.outs,
                   tuple(sorted(ins, key=lambda r: (r.need, r.buf))), prog.op_waits,
                   prog.recomputes)


def test_inputs_back_matches_its_reference(swapped):
    from tfswap.core.program import Program, inputs_back
    problem, plan, budget = swapped
    cg = problem.compiled
    prog = from_plan(cg, plan.schedule, plan.swaps, plan.resident_parameters)
    found = candidates(problem, prog, SLOW)
    moved = 0
    for n in range(1, len(found) + 1):
        dropped = {prog.ins[i].own_out for _, i, _ in found[:n]}
        from tfswap.core.program import OutRec, RecomputeRec
        outs = tuple(OutRec(o.buf, o.out_after, False) if j in dropped else o
                     for j, o in enumerate(prog.outs))
        recs = tuple(sorted((RecomputeRec(prog.ins[i].buf, prog.ins[i].own_out,
                                          prog.ins[i].need, ops) for _, i, ops in found[:n]),
                            key=lambda r: (r.need, r.buf)))
        # The swap-ins kept, the recomputed ones too (more inputs to move).
        trial = Program(prog.order, prog.resident, outs, prog.ins, prog.op_waits, recs)
        got = inputs_back(cg, trial)
        assert got == _inputs_back_reference(cg, trial)
        moved += got.ins != trial.ins
    assert moved


def _chain_reference(cg, prog, r, index):
    """recompute._chain as first written (every op after the reader scanned)."""
    from tfswap.core.recompute import value_chain
    graph, b = cg.graph, r.buf
    names = {graph.tensors[i].name: i for i in index.members[b]}
    after = [o.out_after for o in prog.outs if o.buf == b and o.out_after >= r.need]
    end = min(after) if after else len(prog.order)
    read = set()
    for k in range(r.need, end + 1 if after else end):
        for name in graph.ops[prog.order[k]].inputs:
            i = names.get(name)
            if i is not None and index.made_at[i] < r.need:
                read.add(i)
    if len(read) != 1:
        return None
    return value_chain(cg, index, b, index.made_at[next(iter(read))], r.need)


def test_the_chain_of_each_round_trip_matches_its_reference():
    from tfswap.core.recompute import ChainIndex, _chain
    graph = layered_training_step(300, seed=7)
    problem = Problem.of(graph, recomputable=[op.name for op in graph.ops])
    peak = planners.run("tfswap.order", problem, 1 << 62, SLOW).plan.prediction.peak_bytes
    compared = found = 0
    for fraction in (0.3, 0.45, 0.6):
        plan = planners.run("tfswap.order", problem, int(fraction * peak), SLOW).plan
        cg = problem.compiled
        prog = from_plan(cg, plan.schedule, plan.swaps, plan.resident_parameters)
        index = ChainIndex(cg, prog.order)
        for r in prog.ins:
            want = _chain_reference(cg, prog, r, index)
            assert _chain(cg, prog, r, index) == want
            compared += 1
            found += want is not None
    assert compared and found


def _gate_step():
    """An LSTM gate's shape: one MatMul, its Split into two gates read by the forward
    (a Mul) and each by its own backward op, ``ga`` then ``gb``.  (problem, the
    schedule's names, each op's id, each tensor's buffer, a pool with an object for
    every buffer.)"""
    from tfswap.core import byte_planner
    from tfswap.core.graph import DataflowGraph, Op, Tensor

    nbytes = 2 << 20
    ops = [Op("x", "Placeholder", outputs=("x:0",)),
           Op("mm", "MatMul", inputs=("x:0",), time_s=1e-3, phase="forward"),
           Op("sp", "Split", inputs=("mm:0",), outputs=("sp:0", "sp:1"), time_s=2e-4,
              phase="forward"),
           Op("h", "Mul", inputs=("sp:0", "sp:1"), time_s=1e-4, phase="forward"),
           Op("ga", "Grad", inputs=("h:0", "sp:0"), time_s=1e-3, phase="backward"),
           Op("gb", "Grad", inputs=("ga:0", "sp:1"), time_s=1e-3, phase="backward")]
    tensors = [Tensor("x:0", nbytes, kind="input"), Tensor("mm:0", nbytes),
               Tensor("sp:0", nbytes), Tensor("sp:1", nbytes), Tensor("h:0", nbytes),
               Tensor("ga:0", nbytes), Tensor("gb:0", nbytes, kind="gradient")]
    graph = DataflowGraph.build(ops, tensors)
    problem = Problem.of(graph, keep=["gb:0"], recomputable=[op.name for op in graph.ops])
    cg = problem.compiled
    names = ("x", "mm", "sp", "h", "ga", "gb")
    order = cg.order_of(names)
    buf = {t.name: int(cg.tensor_buffer[i]) for i, t in enumerate(graph.tensors)}
    op_id = {op.name: i for i, op in enumerate(graph.ops)}
    return problem, names, op_id, buf, byte_planner._unlimited_pool(cg, list(order))


def _gate_program(problem, names, op_id, buf, need_of_sp1: str):
    """Both gates dropped after ``h`` and made again through the MatMul and the
    Split: sp:0 before ``ga``, sp:1 before ``need_of_sp1``."""
    from tfswap.core.program import OutRec, RecomputeRec, canonical, inputs_back

    cg = problem.compiled
    at = {name: k for k, name in enumerate(names)}
    chain = (op_id["mm"], op_id["sp"])
    resident = tuple(b for b in range(cg.n_buffers) if cg.buf_persistent[b])
    outs = [OutRec(buf["sp:0"], at["h"], False), OutRec(buf["sp:1"], at["h"], False)]
    recs = [RecomputeRec(buf["sp:0"], 0, at["ga"], chain),
            RecomputeRec(buf["sp:1"], 1, at[need_of_sp1], chain)]
    order = tuple(int(o) for o in cg.order_of(names))
    return inputs_back(cg, canonical(order, resident, outs, (), (), recs))


def test_remakes_before_one_op_run_the_ops_they_share_once():
    """Two gates remade through one MatMul and Split before the same op run those
    two ops once (the second gate, which the first chain made in the Split
    output's fresh copy, becomes that chain's value); before different ops, twice.
    The reference and the compiled simulator agree on both."""
    from tests.core.test_native import program_agrees

    problem, names, op_id, buf, pool = _gate_step()
    cg = problem.compiled
    apart = _gate_program(problem, names, op_id, buf, "gb")
    shared = _gate_program(problem, names, op_id, buf, "ga")
    for prog in (apart, shared):
        assert program_agrees(cg, prog, pool, SLOW)
    ideal = run_program(cg, apart, pool, SLOW).ideal_time_s
    chain_s = float(cg.op_time[op_id["mm"]] + cg.op_time[op_id["sp"]])
    assert run_program(cg, apart, pool, SLOW).step_time_s == pytest.approx(ideal + 2 * chain_s)
    got = run_program(cg, shared, pool, SLOW, events=True)
    assert got.step_time_s == pytest.approx(ideal + chain_s)
    remade = [e.name for e in got.events if e.name.startswith("recompute:")]
    assert remade == ["recompute:mm", "recompute:sp"]
    # sp:1 is held from its remake before ga until gb, its reader, ends; its fresh
    # copy, which the shared Split made it in first, is given back at once.
    again = cg.buf_names[int(cg.buf_fresh[buf["sp:1"]])]
    taken = [e.tensor for e in got.allocation_events if e.is_alloc]
    assert taken.count(cg.buf_names[buf["sp:1"]]) == 2 and again in taken


def test_a_remake_named_earlier_than_its_reader_round_trips_through_a_plan():
    """A recomputation made before an op ahead of its first reader is written as
    its swap's ``in_after`` and read back as the same program; one that names an
    op before its own drop is refused, saying so."""
    from dataclasses import replace as replaced

    from tfswap.core.program import to_plan_swaps

    problem, names, op_id, buf, pool = _gate_step()
    cg = problem.compiled
    for need_of_sp1, in_after in (("gb", ""), ("ga", "h")):
        prog = _gate_program(problem, names, op_id, buf, need_of_sp1)
        swaps, resident = to_plan_swaps(cg, prog)
        sp1 = next(s for s in swaps if s.tensor == "sp:1")
        assert (sp1.kind, sp1.in_after, sp1.consumers) == ("recompute", in_after, ("gb",))
        assert from_plan(cg, names, swaps, resident) == prog
        plan = Plan(schedule=names, swaps=swaps, resident_parameters=resident,
                    allocation=pool)
        assert Plan.from_json(plan.to_json()) == plan
    early = tuple(replaced(s, in_after="mm") if s.tensor == "sp:1" else s for s in swaps)
    with pytest.raises(ValueError, match="in_after must be at or after its out_after"):
        from_plan(cg, names, early, resident)
    # Right after the op it was dropped after (the share pass moved the zoo
    # LSTM-4's gates there at 40%): the remake's position, in the program too.
    sp1 = next(s for s in swaps if s.tensor == "sp:1")
    at_drop = tuple(replaced(s, in_after=s.out_after) if s is sp1 else s for s in swaps)
    moved = from_plan(cg, names, at_drop, resident)
    assert any(r.need == names.index(sp1.out_after) + 1 for r in moved.recomputes)


def test_the_share_pass_moves_a_remake_to_the_one_it_shares_ops_with():
    """with_recomputes' last pass moves sp:1's remake to sp:0's position, where the
    two share the MatMul and the Split: the step is one chain faster, and the
    plan says where (``in_after``)."""
    from tfswap.core.program import to_plan_swaps
    from tfswap.core.recompute import share_moves, shared_remakes

    problem, names, op_id, buf, pool = _gate_step()
    cg = problem.compiled
    apart = _gate_program(problem, names, op_id, buf, "gb")
    assert share_moves(cg, apart) == [(1, names.index("ga"))]
    swaps, resident = to_plan_swaps(cg, apart)
    base = run_program(cg, apart, pool, SLOW)
    plan = Plan(schedule=names, swaps=swaps, resident_parameters=resident, allocation=pool)
    moved = shared_remakes(problem, plan, SLOW, 1 << 40)
    sp1 = next(s for s in moved.swaps if s.tensor == "sp:1")
    assert sp1.in_after == "h"
    chain_s = float(cg.op_time[op_id["mm"]] + cg.op_time[op_id["sp"]])
    assert moved.prediction.step_time_s == pytest.approx(base.step_time_s - chain_s)
    assert simulate(problem.graph, moved, SLOW, keep=problem.keep,
                    compiled=cg).step_time_s == pytest.approx(moved.prediction.step_time_s)

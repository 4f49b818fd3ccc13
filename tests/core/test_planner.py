"""Swap planner properties on random DAGs (hypothesis) and plan conversions."""

from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tfswap.core import genetics, native
from tfswap.core.compiled import CompiledGraph
from tfswap.core.plan import Plan
from tfswap.core import planner
from tfswap.core.planner import InfeasibleAllocation, build_program, default_allocation, plan_swaps
from tfswap.core.program import from_plan, to_plan_swaps
from tfswap.core.simulator import run_program, simulate
from research.synthetic import layered_training_step, random_dag
from tfswap.core.infeasible import Infeasible
from tests.core.plan_checks import MB, SPEC, budgets

CASES = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def planned(seed, n_ops, n_params, fraction, host=False):
    g = random_dag(np.random.default_rng(seed), n_ops=n_ops, n_params=n_params)
    cg = CompiledGraph.build(g)
    order = cg.order_of(None)
    budget, full = budgets(cg, order, fraction)
    alloc = default_allocation(cg, order, budget)
    try:
        prog = build_program(cg, order, alloc, SPEC, params_start_on_host=host)
    except InfeasibleAllocation:
        assume(False)  # e.g. unswappable tensors fill a class; the planner says so
    return g, cg, order, alloc, prog, budget, full


@CASES
@given(seed=st.integers(0, 10**6), n_ops=st.integers(1, 40), n_params=st.integers(0, 6),
       fraction=st.floats(0.2, 1.0), host=st.booleans())
def test_plans_respect_memory_order_and_residency(seed, n_ops, n_params, fraction, host):
    g, cg, order, alloc, prog, budget, _ = planned(seed, n_ops, n_params, fraction, host)
    res = run_program(cg, prog, alloc, SPEC, events=True)  # raises PlanError on a violation
    assert res.peak_bytes <= budget
    assert all(p <= c for p, c in zip(res.class_peak_objects, alloc.class_count))
    compute = [e for e in res.events if e.stream == "compute"]
    h2d = [e for e in res.events if e.stream == "h2d"]
    d2h = [e for e in res.events if e.stream == "d2h"]
    copies = [j for j, o in enumerate(prog.outs) if o.copy]
    out_end = {j: d2h[i].end_s for i, j in enumerate(copies)}
    start_of = [e.start_s for e in compute]
    for i, r in enumerate(prog.ins):
        # every swap-in has arrived before the op that needs it starts ...
        assert h2d[i].end_s <= start_of[r.need]
        # ... and a round trip's swap-in starts after its swap-out has finished.
        if r.own_out >= 0:
            assert h2d[i].start_s >= out_end[r.own_out]
        if r.trigger >= 0:
            assert h2d[i].start_s >= compute[r.trigger].end_s
    # Resident parameters at the end equal those at the start: every
    # persistent buffer comes onto the device as often as it leaves.
    for b in range(cg.n_buffers):
        if cg.buf_persistent[b]:
            n_in = sum(r.buf == b for r in prog.ins)
            n_out = sum(o.buf == b for o in prog.outs)
            assert n_in == n_out, cg.buf_names[b]
    if host:
        assert not [b for b in prog.resident if not cg.buf_pinned[b]]


@CASES
@given(seed=st.integers(0, 10**6), n_ops=st.integers(1, 40), n_params=st.integers(0, 6),
       extra=st.floats(1.0, 2.0))
def test_enough_memory_means_no_swaps_and_ideal_time(seed, n_ops, n_params, extra):
    g = random_dag(np.random.default_rng(seed), n_ops=n_ops, n_params=n_params)
    cg = CompiledGraph.build(g)
    full = default_allocation(cg, cg.order_of(None), 1 << 62)
    plan = plan_swaps(g, int(full.total_bytes * extra) + 1, SPEC, compiled=cg)
    assert plan.swaps == ()
    assert plan.prediction.step_time_s == plan.prediction.ideal_time_s
    assert sorted(plan.resident_parameters) == sorted(
        cg.buf_names[b] for b in range(cg.n_buffers) if cg.buf_persistent[b])


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 10**6), fraction=st.floats(0.2, 0.9))
def test_plan_round_trips_through_names_and_json(seed, fraction):
    g, cg, order, alloc, prog, budget, _ = planned(seed, 30, 4, fraction)
    swaps, resident = to_plan_swaps(cg, prog)
    back = from_plan(cg, [g.ops[o].name for o in order], swaps, resident)
    assert back == prog
    plan = plan_swaps(g, budget, SPEC, allocation=alloc, compiled=cg)
    assert Plan.from_json(plan.to_json()) == plan
    again = simulate(g, Plan.from_json(plan.to_json()), SPEC)
    assert again.step_time_s == plan.prediction.step_time_s


def test_updated_parameters_are_written_back_and_clean_ones_dropped():
    checked = 0
    for seed in range(30):
        g = random_dag(np.random.default_rng(seed), n_ops=30, n_params=5)
        cg = CompiledGraph.build(g)
        budget, _ = budgets(cg, cg.order_of(None), 0.5)
        try:
            plan = plan_swaps(g, budget, SPEC, compiled=cg, params_start_on_host=True)
        except InfeasibleAllocation:
            continue
        modified = {cg.buf_names[b] for b in range(cg.n_buffers) if cg.buf_modified[b]}
        for s in plan.swaps:
            if s.kind == "writeback":
                assert s.tensor in modified
            if s.kind == "drop":
                assert g.tensor(s.tensor).kind in ("parameter", "optimizer_state")
        # Parameters start on the host and end there: every one that was
        # updated on the device is copied back, none is just dropped after it.
        loaded = {s.tensor for s in plan.swaps if s.kind == "prefetch"}
        assert modified & loaded <= {s.tensor for s in plan.swaps
                                     if s.kind in ("writeback", "round_trip")}
        checked += bool(modified & loaded)
    assert checked >= 5


def test_bad_inputs_say_what_to_do():
    g = random_dag(np.random.default_rng(1), n_ops=10, n_params=2)
    with pytest.raises(ValueError, match="budget_bytes must be > 0"):
        plan_swaps(g, 0, SPEC)
    with pytest.raises(ValueError, match="not a topological order"):
        plan_swaps(g, 1 << 40, SPEC, schedule=[op.name for op in reversed(g.ops)])
    with pytest.raises(Infeasible, match="raise the memory budget"):
        plan_swaps(g, 2 * MB, SPEC)


def some_schedule(g, cg, kind, rng):
    dag = genetics.Precedence.of(g)
    tf_order = cg.order_of(None)
    if kind == "tf":
        return tf_order
    if kind == "random":
        return genetics.random_schedule(dag, rng).astype(np.int32)
    greedy = genetics.memory_greedy_schedule(g, dag, tie_break=tf_order).astype(np.int32)
    if kind == "greedy":
        return greedy
    return genetics.mutate_schedule(greedy, dag, 0.1, rng).astype(np.int32)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), layered=st.booleans(), n_ops=st.integers(1, 60),
       n_params=st.integers(0, 12), fraction=st.floats(0.1, 1.1),
       kind=st.sampled_from(["tf", "random", "greedy", "mutated"]), host=st.booleans(),
       margin=st.sampled_from([0.0, 2e-3]))
def test_every_feasible_plan_runs_in_the_reference_simulator(seed, layered, n_ops, n_params,
                                                             fraction, kind, host, margin):
    """Whatever the order and budget, a plan the planner calls feasible is one the
    reference simulator accepts (no copy into a buffer whose previous device copy
    is still there, no copy before the swap-out or drop it waits for), and the
    native library scores it with exactly the reference's time."""
    rng = np.random.default_rng(seed)
    if layered:  # a training step: every parameter read forward, backward and updated
        g = layered_training_step(12 + 4 * n_ops, seed=seed)
    else:
        g = random_dag(rng, n_ops=n_ops, n_params=n_params)
    cg = CompiledGraph.build(g)
    order = some_schedule(g, cg, kind, rng)
    assert g.is_topological(order.tolist())
    budget, _ = budgets(cg, order, fraction)
    alloc = default_allocation(cg, order, budget)
    ev = native.evaluate(cg, order, alloc, SPEC, detail=True, params_start_on_host=host,
                         recency_margin_s=margin)
    try:
        prog = build_program(cg, order, alloc, SPEC, recency_margin_s=margin,
                             params_start_on_host=host)
    except InfeasibleAllocation:
        assert not ev.feasible
        return
    res = run_program(cg, prog, alloc, SPEC)  # raises PlanError on a bad plan
    assert ev.feasible and ev.program == prog
    assert ev.step_time_s == res.step_time_s
    assert ev.peak_bytes == res.peak_bytes <= budget


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), layered=st.booleans(), n_ops=st.integers(1, 60),
       n_params=st.integers(0, 12), fraction=st.floats(0.1, 1.1),
       kind=st.sampled_from(["tf", "random", "greedy", "mutated"]), host=st.booleans())
def test_feasible_plans_also_run_with_copies_in_issue_order(seed, layered, n_ops, n_params,
                                                            fraction, kind, host):
    """The executor's order (copies as their swap ops become ready, the fidelity
    model) runs every plan the planner builds for its own order: no deadlock, no
    object taken twice, the pool's peak within the budget."""
    rng = np.random.default_rng(seed)
    g = layered_training_step(12 + 4 * n_ops, seed=seed) if layered \
        else random_dag(rng, n_ops=n_ops, n_params=n_params)
    cg = CompiledGraph.build(g)
    order = some_schedule(g, cg, kind, rng)
    budget, _ = budgets(cg, order, fraction)
    alloc = default_allocation(cg, order, budget)
    try:
        prog = build_program(cg, order, alloc, SPEC, params_start_on_host=host)
    except InfeasibleAllocation:
        return
    planned = run_program(cg, prog, alloc, SPEC)
    ready = run_program(cg, prog, alloc, SPEC, copy_order="ready")
    assert ready.peak_bytes <= budget
    assert (ready.h2d_bytes, ready.d2h_bytes) == (planned.h2d_bytes, planned.d2h_bytes)


def test_a_parameter_comes_back_only_after_its_previous_copy_is_dropped():
    """The memory-greedy order of this step makes the planner drop a parameter and
    bring it back three times in a few ops (the bug of issue #4's follow-up)."""
    g = layered_training_step(240, seed=2)
    cg = CompiledGraph.build(g)
    budget, _ = budgets(cg, cg.order_of(None), 0.35)
    order = some_schedule(g, cg, "greedy", None)
    alloc = default_allocation(cg, order, budget)
    prog = build_program(cg, order, alloc, SPEC)
    run_program(cg, prog, alloc, SPEC)  # raises PlanError on a bad plan
    back_again = 0
    for r in prog.ins:
        before = [o for o in prog.outs if o.buf == r.buf and o.out_after < r.need]
        if before:
            assert r.trigger >= max(o.out_after for o in before)
            back_again += not before[-1].copy
    assert back_again >= 2


def choose_by_scanning(scan, c, k, incoming, swap_in):
    """The eviction rule of the planner's docstring as a scan of every candidate:
    the oracle for the heaps the planner (and the native library) use."""
    cands = [b for b in range(scan.cg.n_buffers) if scan.resident[b] and scan.buf_class[b] == c
             and scan.stamp[b] != k and not scan.pinned[b]]
    if scan.removable:
        fresh = [b for b in cands if scan.initial[b] and not scan.touched[b]]
        if fresh:
            return max(fresh, key=lambda b: (scan.next_use[b], -b)), True
    if not cands:
        raise InfeasibleAllocation(f"class {c} is full at position {k}")
    in_t = float(scan.nbytes[incoming]) / scan.h2d if swap_in else 0.0

    def key(b):
        copy = (not scan.pers[b]) or scan.dirty[b]
        out_t = float(scan.nbytes[b]) / scan.d2h if copy else 0.0
        recent = scan.iend[scan.last_use[b]] + out_t + in_t > scan.istart[k] + scan.margin
        return (not recent, scan.next_use[b], -scan.last_use[b], -b)
    return max(cands, key=key), False


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), layered=st.booleans(), n_ops=st.integers(1, 60),
       n_params=st.integers(0, 12), fraction=st.floats(0.1, 1.1),
       kind=st.sampled_from(["tf", "random", "greedy", "mutated"]), host=st.booleans(),
       margin=st.sampled_from([0.0, 2e-3]))
def test_eviction_heaps_choose_what_a_full_scan_chooses(seed, layered, n_ops, n_params, fraction,
                                                        kind, host, margin):
    rng = np.random.default_rng(seed)
    if layered:
        g = layered_training_step(12 + 4 * n_ops, seed=seed)
    else:
        g = random_dag(rng, n_ops=n_ops, n_params=n_params)
    cg = CompiledGraph.build(g)
    order = some_schedule(g, cg, kind, rng)
    budget, _ = budgets(cg, order, fraction)
    alloc = default_allocation(cg, order, budget)

    def plan():
        try:
            return build_program(cg, order, alloc, SPEC, recency_margin_s=margin,
                                 params_start_on_host=host)
        except InfeasibleAllocation:
            return None
    fast = plan()
    with mock.patch.object(planner._Scan, "_choose", choose_by_scanning):
        slow = plan()
    assert fast == slow


def test_default_allocation_merges_classes_when_per_size_maxima_exceed_the_peak():
    # Three ops in a chain, each with its own kernel scratch of a slightly
    # different size: one class per size would hold all three scratch objects
    # at once (the floor sums each class's maximum), far above the real peak.
    from tfswap.core.graph import DataflowGraph, Op, Tensor
    ops = [Op(f"op{i}", "Conv", inputs=(f"op{i - 1}:0",) if i else (), time_s=1e-3,
              scratch_bytes=(20 + i) * MB) for i in range(3)]
    tensors = [Tensor(f"op{i}:0", 2 * MB) for i in range(3)]
    cg = CompiledGraph.build(DataflowGraph.build(ops, tensors))
    order = cg.order_of(None)
    peak = plan_swaps(DataflowGraph.build(ops, tensors), 1 << 40, SPEC).prediction.peak_bytes
    assert peak < 30 * MB
    alloc = default_allocation(cg, order, peak + MB)  # one class per size would need 60+ MB
    assert alloc.pool_bytes + alloc.small_pool_bytes <= peak + MB
    assert len(alloc.class_bytes) < len(cg.ts)

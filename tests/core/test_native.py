"""The native planner + simulator agree exactly with the reference Python."""

from dataclasses import replace

import numpy as np
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from tfswap.core import native
from tfswap.core.compiled import CompiledGraph
from tfswap.core.planner import InfeasibleAllocation, build_program, default_allocation
from tfswap.core.program import buffer_classes
from tfswap.core.simulator import run_program
from research.synthetic import layered_training_step, random_dag
from tests.core.plan_checks import SPEC, budgets


def agree(cg, order, alloc, host=False, margin=0.0, spec=SPEC):
    try:
        prog = build_program(cg, order, alloc, spec, recency_margin_s=margin,
                             params_start_on_host=host)
    except InfeasibleAllocation:
        ev = native.evaluate(cg, order, alloc, spec, params_start_on_host=host,
                             recency_margin_s=margin)
        assert not ev.feasible
        return None
    ref = run_program(cg, prog, alloc, spec)
    ev = native.evaluate(cg, order, alloc, spec, detail=True, params_start_on_host=host,
                         recency_margin_s=margin)
    assert ev.feasible
    assert ev.program == prog                      # same swaps, triggers, waits, residents
    assert ev.step_time_s == ref.step_time_s       # same operations, so bit-identical
    assert ev.ideal_time_s == ref.ideal_time_s
    assert ev.stall_s == ref.stall_s
    assert (ev.peak_bytes, ev.h2d_bytes, ev.d2h_bytes) == (ref.peak_bytes, ref.h2d_bytes,
                                                           ref.d2h_bytes)
    assert ev.class_peak_objects == ref.class_peak_objects
    return prog


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n_ops=st.integers(1, 50), n_params=st.integers(0, 6),
       fraction=st.floats(0.15, 1.1), host=st.booleans(), margin=st.sampled_from([0.0, 2e-3]),
       shuffle=st.booleans())
def test_native_matches_reference_on_random_dags(seed, n_ops, n_params, fraction, host, margin,
                                                 shuffle):
    rng = np.random.default_rng(seed)
    g = random_dag(rng, n_ops=n_ops, n_params=n_params)
    cg = CompiledGraph.build(g)
    order = cg.order_of(None)
    if shuffle:  # another topological order: Kahn's with random tie-breaks
        order = np.asarray(g.order_following(list(rng.permutation([o.name for o in g.ops]))),
                           dtype=np.int32)
    budget, _ = budgets(cg, order, fraction)
    agree(cg, order, default_allocation(cg, order, budget), host, margin)


def test_native_matches_reference_on_a_layered_step():
    g = layered_training_step(600, seed=3)
    cg = CompiledGraph.build(g)
    order = cg.order_of(None)
    for fraction in (0.4, 0.7):
        budget, _ = budgets(cg, order, fraction)
        prog = agree(cg, order, default_allocation(cg, order, budget))
        assert prog is not None and prog.outs


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n_ops=st.integers(1, 40), fraction=st.floats(0.15, 1.1),
       host=st.booleans(), latency=st.sampled_from([1e-5, 3e-4, 2e-3]),
       on_compute=st.booleans())
def test_native_matches_reference_with_copy_latency(seed, n_ops, fraction, host, latency,
                                                    on_compute):
    """Per-copy latency, and copies on the compute stream: still bit-identical."""
    rng = np.random.default_rng(seed)
    g = random_dag(rng, n_ops=n_ops, n_params=3)
    cg = CompiledGraph.build(g)
    order = cg.order_of(None)
    budget, _ = budgets(cg, order, fraction)
    spec = replace(SPEC, copy_latency_s=latency, copies_on_compute=on_compute)
    agree(cg, order, default_allocation(cg, order, budget), host, 0.0, spec)


def test_copies_on_compute_add_their_time_to_the_step():
    """One stream never idles: the step is the ops plus every copy, latency included."""
    g = layered_training_step(300, seed=5)
    cg = CompiledGraph.build(g)
    order = cg.order_of(None)
    budget, _ = budgets(cg, order, 0.5)
    alloc = default_allocation(cg, order, budget)
    spec = replace(SPEC, copy_latency_s=1e-4, copies_on_compute=True)
    ev = native.evaluate(cg, order, alloc, spec, detail=True)
    copies = ev.n_swap_ins + sum(1 for r in ev.program.outs if r.copy)
    assert copies > 0
    expected = (ev.ideal_time_s + copies * spec.copy_latency_s
                + ev.h2d_bytes / spec.h2d_bytes_per_s + ev.d2h_bytes / spec.d2h_bytes_per_s)
    assert np.isclose(ev.step_time_s, expected, rtol=1e-9)
    streams = native.evaluate(cg, order, alloc, replace(spec, copies_on_compute=False))
    assert streams.step_time_s < ev.step_time_s


def test_infeasible_allocation_is_infinite_time():
    g = random_dag(np.random.default_rng(0), n_ops=20, n_params=3)
    cg = CompiledGraph.build(g)
    order = cg.order_of(None)
    alloc = default_allocation(cg, order, 1 << 62)
    tight = type(alloc)(alloc.class_bytes, tuple(0 for _ in alloc.class_count),
                        alloc.small_pool_bytes)
    ev = native.evaluate(cg, order, tight, SPEC)
    assert not ev.feasible and ev.step_time_s == float("inf")


def test_planner_modules_import_no_tensorflow():
    import subprocess
    import sys
    code = ("import sys, tfswap.core.allocation, tfswap.core.planner, tfswap.core.simulator, "
            "tfswap.core.native, research.synthetic; tfswap.core.native.library(); "
            "assert 'tensorflow' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_compiled_graph_evaluated_here_evaluates_the_same_after_a_pickle_elsewhere(tmp_path):
    """What ``benchmarks/gpu_validate.py`` saves (a GPU row's planning problem) is
    searched again in another process: the native arguments cached on the compiled
    graph hold this process's addresses and must not travel (they crashed
    ``tfswap_plan_simulate`` there)."""
    import pickle
    import subprocess
    import sys
    from pathlib import Path

    g = layered_training_step(200, seed=5)
    cg = CompiledGraph.build(g)
    order = cg.order_of(None)
    alloc = default_allocation(cg, order, budgets(cg, order, 0.5)[0])
    here = native.evaluate(cg, order, alloc, SPEC)   # caches the native arguments
    path = tmp_path / "cg.pkl"
    path.write_bytes(pickle.dumps((cg, order, alloc, SPEC)))
    # A problem saved before the cache was left out carries it: loading drops it.
    stale = object.__new__(CompiledGraph)
    stale.__setstate__(dict(cg.__dict__, _native_args=([], (0,))))
    assert native.evaluate(stale, order, alloc, SPEC).step_time_s == here.step_time_s
    code = ("import pickle, sys; from tfswap.core import native; "
            "cg, order, alloc, spec = pickle.load(open(sys.argv[1], 'rb')); "
            "ev = native.evaluate(cg, order, alloc, spec); print(repr(ev.step_time_s))")
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True,
                         text=True, cwd=root, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.strip()) == here.step_time_s


def _reference(cg, prog, alloc, spec):
    """The reference simulator's answer for ``prog``: its result, or its error's type."""
    from tfswap.core import simulator

    buf_class = buffer_classes(cg, alloc).tolist()
    try:
        return simulator._simulate(cg, prog, buf_class, alloc, spec, True)
    except simulator.PlanError as err:
        return type(err)


def program_agrees(cg, prog, alloc, spec):
    ref = _reference(cg, prog, alloc, spec)
    got = native.simulate_program(cg, prog, alloc, spec, buffer_classes(cg, alloc))
    if isinstance(ref, type):
        assert got.status != 0, ref
        return False
    assert got.status == 0
    assert got.step_time_s == ref["step_time_s"]   # same operations: bit-identical
    assert got.stall_s == ref["stall_s"]
    assert (got.peak_bytes, got.h2d_bytes, got.d2h_bytes) == (
        ref["peak_bytes"], ref["h2d_bytes"], ref["d2h_bytes"])
    assert got.class_peak_objects == ref["class_peak_objects"]
    # The pool's allocation events, what a shared layout is made from: the same
    # objects taken and given back in the same order at the same times.
    from tfswap.core import simulator

    assert simulator.try_program(cg, prog, alloc, spec, allocations=True).allocation_events \
        == ref["allocation_events"]
    return True


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), fraction=st.floats(0.3, 0.95), share=st.sampled_from(
    [0.1, 0.5]), latency=st.sampled_from([0.0, 2e-5]), serial=st.booleans())
# A plan whose swaps, read back, are not the scan's records: its pool was the scan's, one
# object short for what it runs.
@example(seed=432455, fraction=0.65625, share=0.1, latency=0.0, serial=False)
def test_the_compiled_program_simulation_matches_the_reference_with_recomputations(
        seed, fraction, share, latency, serial):
    # The byte-cap planner's hybrid programs (drops, chains of ops made again,
    # swap-ins waiting for several swap-outs), then the same with records
    # removed or moved, which the two must reject alike.
    from tfswap.core import byte_planner
    from tfswap.core.problem import Problem
    from tfswap.core.program import from_plan
    from tfswap.core.recompute import _moved, share_moves

    spec = replace(SPEC, h2d_bytes_per_s=1e9, d2h_bytes_per_s=1e9, duplex_bytes_per_s=1.5e9,
                   copy_latency_s=latency, copies_on_compute=serial)
    rng = np.random.default_rng(seed)
    graph = layered_training_step(int(rng.integers(30, 160)), seed=seed % 1000)
    problem = Problem.of(graph, recomputable=[op.name for op in graph.ops])
    cg = problem.compiled
    peak = byte_planner.plan(graph, 1 << 62, spec, compiled=cg).prediction.peak_bytes
    try:
        plans = byte_planner.variants(graph, int(fraction * peak), spec, compiled=cg,
                                      memory="live", recomputable=problem.recomputable)
    except InfeasibleAllocation:
        return
    for plan in plans:
        prog = from_plan(cg, plan.schedule, plan.swaps, plan.resident_parameters)
        assert program_agrees(cg, prog, plan.allocation, spec)
        for _ in range(3):
            broken = _perturbed(prog, rng)
            program_agrees(cg, broken, plan.allocation, spec)
        # Remakes moved to run before another's op, sharing the ops they both run.
        for i, need in share_moves(cg, prog)[:3]:
            program_agrees(cg, _moved(cg, prog, {i: need}), plan.allocation, spec)


def _perturbed(prog, rng):
    """``prog`` with one record dropped or one swap-in's reader moved earlier."""
    pick = int(rng.integers(3))
    if pick == 0 and prog.ins:
        i = int(rng.integers(len(prog.ins)))
        return replace(prog, ins=prog.ins[:i] + prog.ins[i + 1:])
    if pick == 1 and prog.recomputes:
        i = int(rng.integers(len(prog.recomputes)))
        return replace(prog, recomputes=prog.recomputes[:i] + prog.recomputes[i + 1:])
    if prog.ins:
        i = int(rng.integers(len(prog.ins)))
        r = prog.ins[i]
        moved = replace(r, need=max(0, r.need - int(rng.integers(1, 4))))
        ins = sorted(prog.ins[:i] + (moved,) + prog.ins[i + 1:], key=lambda x: (x.need, x.buf))
        return replace(prog, ins=tuple(ins))
    return prog

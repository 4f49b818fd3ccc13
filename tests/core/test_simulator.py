"""The three-stream simulator on hand-made plans."""

import dataclasses

import pytest

from tfswap.core.devices import DeviceSpec
from tfswap.core.graph import DataflowGraph, Op, Tensor
from tfswap.core.plan import Allocation, Plan, Swap
from tfswap.core.simulator import PlanError, live_peak_bytes, simulate

MB = 1 << 20
LINK = DeviceSpec("link", memory_bytes=1 << 30, peak_flops=1.0, memory_bandwidth_bytes_per_s=1.0,
                  h2d_bytes_per_s=MB, d2h_bytes_per_s=MB, duplex_bytes_per_s=MB,
                  launch_overhead_s=0.0)


def chain():
    """a -> b -> c -> d, d also reads a (a is live across b and c)."""
    ops = [Op("a", "X", time_s=1.0), Op("b", "X", ("a:0",), time_s=1.0),
           Op("c", "X", ("b:0",), time_s=4.0), Op("d", "X", ("c:0", "a:0"), time_s=1.0)]
    return DataflowGraph.build(ops, [Tensor(f"{o.name}:0", MB) for o in ops])


def test_no_swaps_runs_at_ideal_time_and_allocates_lifo():
    g = chain()
    plan = Plan(schedule=("a", "b", "c", "d"), allocation=Allocation((MB,), (3,)))
    r = simulate(g, plan, LINK, events=True)
    assert r.step_time_s == r.ideal_time_s == 7.0 and r.stall_s == 0.0
    assert r.peak_bytes == 3 * MB and r.class_peak_objects == (3,)
    first = r.allocation_events[0]
    assert (first.tensor, first.is_alloc, first.object_index) == ("a:0", True, 0)
    # b is freed after c, so d's output reuses b's object (LIFO)
    by = {(e.tensor, e.is_alloc): e.object_index for e in r.allocation_events}
    assert by[("d:0", True)] == by[("b:0", False)]


def test_round_trip_swap_in_waits_for_its_swap_out():
    """a:0 leaves after b (alone on the link: 1 s) and comes back for d."""
    g = chain()
    swap = Swap("a:0", out_after="b", in_after="b", consumers=("d",), bytes=MB)
    plan = Plan(schedule=("a", "b", "c", "d"), swaps=(swap,), allocation=Allocation((MB,), (3,)))
    r = simulate(g, plan, LINK, events=True)
    out = next(e for e in r.events if e.stream == "d2h")
    back = next(e for e in r.events if e.stream == "h2d")
    assert (out.start_s, out.end_s) == (2.0, 3.0)        # alone on the link: 1 s
    assert back.start_s == 3.0 and back.end_s == 4.0     # waits for its own swap-out
    assert r.step_time_s == 7.0 and r.d2h_bytes == r.h2d_bytes == MB


def prefetch_and_swap():
    """w (a parameter) comes in after x while x:0 goes out: both copies start at 0.5 s."""
    ops = [Op("w", "ReadVariableOp"), Op("x", "X", time_s=0.5),
           Op("y", "X", ("x:0",), time_s=10.0), Op("z", "X", ("y:0", "w:0", "x:0"), time_s=1.0)]
    g = DataflowGraph.build(ops, [Tensor("w:0", MB, kind="parameter"), Tensor("x:0", MB),
                                  Tensor("y:0", MB), Tensor("z:0", MB)])
    swaps = (Swap("w:0", out_after="", in_after="x", consumers=("z",), bytes=MB, kind="prefetch"),
             Swap("x:0", out_after="x", in_after="y", consumers=("z",), bytes=MB))
    plan = Plan(schedule=("w", "x", "y", "z"), swaps=swaps,
                allocation=Allocation((MB,), (4,)), resident_parameters=())
    return g, plan


def test_concurrent_copies_run_at_half_rate():
    g, plan = prefetch_and_swap()
    r = simulate(g, plan, LINK, events=True)
    w_in = next(e for e in r.events if e.stream == "h2d" and e.name == "w:0")
    x_out = next(e for e in r.events if e.stream == "d2h")
    # both start at 0.5 and share the 1 MB/s duplex link: 2 s each
    assert (w_in.start_s, w_in.end_s, x_out.start_s, x_out.end_s) == (0.5, 2.5, 0.5, 2.5)


def test_reading_data_that_is_not_on_the_device_is_an_error():
    ops = [Op("w", "ReadVariableOp"), Op("x", "X", ("w:0",), time_s=1.0)]
    g = DataflowGraph.build(ops, [Tensor("w:0", MB, kind="parameter"), Tensor("x:0", MB)])
    with pytest.raises(PlanError, match="not on the device"):
        simulate(g, Plan(schedule=("w", "x"), allocation=Allocation((MB,), (2,)),
                         resident_parameters=(), swaps=()), LINK)


def test_version1_plans_still_simulate():
    g = chain()
    text = Plan(schedule=("a", "b", "c", "d")).to_json().replace(
        '"format_version": 2', '"format_version": 1')
    r = simulate(g, Plan.from_json(text), LINK)
    assert r.step_time_s == 7.0


def test_live_peak_counts_buffers_at_their_own_size_not_their_class():
    """Three 1 MB buffers live at once in 4 MB objects: the pool holds 12 MB, the
    buffers 3 MB (what an allocator without classes would hold)."""
    g = chain()
    plan = Plan(schedule=("a", "b", "c", "d"), allocation=Allocation((4 * MB,), (3,), 100))
    r = simulate(g, plan, LINK, events=True)
    assert r.peak_bytes == 12 * MB + 100
    assert live_peak_bytes(r, 100) == 3 * MB + 100
    with pytest.raises(ValueError, match="events=True"):
        live_peak_bytes(simulate(g, plan, LINK), 0)


def test_copy_latency_holds_each_copy_before_its_bytes_move():
    """Round trip of a:0 with 1.5 s per copy on top of 1 s of bytes: d waits."""
    g = chain()
    spec = DeviceSpec("slow-start", memory_bytes=1 << 30, peak_flops=1.0,
                      memory_bandwidth_bytes_per_s=1.0, h2d_bytes_per_s=MB,
                      d2h_bytes_per_s=MB, duplex_bytes_per_s=MB, launch_overhead_s=0.0,
                      copy_latency_s=1.5)
    swap = Swap("a:0", out_after="b", in_after="b", consumers=("d",), bytes=MB)
    plan = Plan(schedule=("a", "b", "c", "d"), swaps=(swap,), allocation=Allocation((MB,), (3,)))
    r = simulate(g, plan, spec, events=True)
    out = next(e for e in r.events if e.stream == "d2h")
    back = next(e for e in r.events if e.stream == "h2d")
    assert (out.start_s, out.end_s) == (2.0, 4.5)
    assert (back.start_s, back.end_s) == (4.5, 7.0)
    d = next(e for e in r.events if e.name == "d")
    assert d.start_s == 7.0 and r.step_time_s == 8.0 and r.stall_s == 1.0


def test_latency_of_concurrent_copies_is_not_shared():
    """Both copies hold the link 0.5 s, then share its rate: 0.5 + 2 s each."""
    g, plan = prefetch_and_swap()
    spec = DeviceSpec("link", memory_bytes=1 << 30, peak_flops=1.0,
                      memory_bandwidth_bytes_per_s=1.0, h2d_bytes_per_s=MB,
                      d2h_bytes_per_s=MB, duplex_bytes_per_s=MB, copy_latency_s=0.5)
    r = simulate(g, plan, spec, events=True)
    copies = {(e.stream, e.name, e.start_s, e.end_s) for e in r.events if e.stream != "compute"}
    # x:0 comes back alone after y: 0.5 s, then 1 s at the full rate
    assert copies == {("h2d", "w:0", 0.5, 3.0), ("d2h", "x:0", 0.5, 3.0),
                      ("h2d", "x:0", 10.5, 12.0)}


def test_copies_on_the_compute_stream_run_between_ops():
    """One stream: b's swap-out and the swap-in run before c, and add to the step."""
    g = chain()
    spec = DeviceSpec("one-thread", memory_bytes=1 << 30, peak_flops=1.0,
                      memory_bandwidth_bytes_per_s=1.0, h2d_bytes_per_s=MB,
                      d2h_bytes_per_s=MB, duplex_bytes_per_s=MB, launch_overhead_s=0.0,
                      copy_latency_s=0.25, copies_on_compute=True)
    swap = Swap("a:0", out_after="b", in_after="b", consumers=("d",), bytes=MB)
    plan = Plan(schedule=("a", "b", "c", "d"), swaps=(swap,), allocation=Allocation((MB,), (3,)))
    r = simulate(g, plan, spec, events=True)
    spans = [(e.stream, e.name, e.start_s, e.end_s) for e in r.events]
    assert sorted(spans, key=lambda s: s[2]) == [
        ("compute", "a", 0.0, 1.0), ("compute", "b", 1.0, 2.0), ("d2h", "a:0", 2.0, 3.25),
        ("h2d", "a:0", 3.25, 4.5), ("compute", "c", 4.5, 8.5), ("compute", "d", 8.5, 9.5)]
    assert r.step_time_s == r.ideal_time_s + 2 * 1.25 and r.stall_s == 2.5
    # Without the flag the same copies overlap c and cost nothing.
    free = simulate(g, plan, DeviceSpec(**{**spec.__dict__, "copies_on_compute": False}))
    assert free.step_time_s == 7.0


def test_copy_bytes_prices_a_copy_at_what_it_moves_and_keeps_the_memory():
    """The same round trip moving half its buffer (a slice read after the gap):
    each copy takes 0.5 s instead of 1 s; the buffer still holds its MB."""
    g = chain()
    swap = Swap("a:0", out_after="b", in_after="b", consumers=("d",), bytes=MB)
    plan = Plan(schedule=("a", "b", "c", "d"), swaps=(swap,), allocation=Allocation((MB,), (3,)))
    whole = simulate(g, plan, LINK, events=True)
    assert simulate(g, plan, LINK, events=True, copy_bytes={swap.id: MB}) == whole
    half = simulate(g, plan, LINK, events=True, copy_bytes={swap.id: MB // 2})
    out = next(e for e in half.events if e.stream == "d2h")
    back = next(e for e in half.events if e.stream == "h2d")
    assert (out.start_s, out.end_s, back.start_s, back.end_s) == (2.0, 2.5, 2.5, 3.0)
    assert half.d2h_bytes == half.h2d_bytes == MB // 2
    assert live_peak_bytes(half) == live_peak_bytes(whole)
    # three copies each way (three values of the buffer), each paying the latency
    slow = DeviceSpec(**{**LINK.__dict__, "copy_latency_s": 0.25})
    parts = simulate(g, plan, slow, events=True, copy_bytes={swap.id: MB // 2},
                     copy_parts={swap.id: 3})
    out = next(e for e in parts.events if e.stream == "d2h")
    assert (out.start_s, out.end_s) == (2.0, 3.25)


def test_timed_live_peak_counts_small_buffers_only_while_they_live():
    """Two 100-byte (small-pool) values, one live early and one late, beside 1 MB
    pool buffers: the timed peak adds the small bytes live at the pool's peak,
    never more than the small pool's peak added throughout."""
    from tfswap.core.compiled import CompiledGraph
    from tfswap.core.simulator import live_peak_bytes_timed

    ops = [Op("s1", "X", time_s=1.0), Op("a", "X", ("s1:0",), time_s=1.0),
           Op("b", "X", ("a:0",), time_s=1.0), Op("s2", "X", ("b:0",), time_s=1.0),
           Op("c", "X", ("s2:0",), time_s=1.0)]
    g = DataflowGraph.build(ops, [Tensor("s1:0", 100), Tensor("a:0", MB), Tensor("b:0", MB),
                                  Tensor("s2:0", 100), Tensor("c:0", MB)])
    plan = Plan(schedule=("s1", "a", "b", "s2", "c"),
                allocation=Allocation((MB,), (3,), small_pool_bytes=100,
                                      small_threshold_bytes=1000))
    cg = CompiledGraph.build(g, 1000)
    r = simulate(g, plan, LINK, events=True, compiled=cg)
    assert live_peak_bytes(r, 100) == 2 * MB + 100
    # a and b (2 MB) live at b's start, when s1 is dead and s2 not yet made
    assert live_peak_bytes_timed(r, cg, plan.schedule) == 2 * MB
    with pytest.raises(ValueError, match="events=True"):
        live_peak_bytes_timed(simulate(g, plan, LINK, compiled=cg), cg, plan.schedule)


def test_timed_live_peak_of_a_step_whose_buffers_are_all_small():
    """No pool buffer, so no allocation event: the small buffers' peak (a step of
    scalars, such as a lone all-reduce, planned with the analytic profile)."""
    from tfswap.core.compiled import CompiledGraph
    from tfswap.core.simulator import held_peak_bytes, live_peak_bytes_timed

    ops = [Op("s1", "X", time_s=1.0), Op("s2", "X", ("s1:0",), time_s=1.0),
           Op("s3", "X", ("s2:0",), time_s=1.0)]
    g = DataflowGraph.build(ops, [Tensor(f"{o.name}:0", 100) for o in ops])
    plan = Plan(schedule=("s1", "s2", "s3"),
                allocation=Allocation((), (), small_pool_bytes=200, small_threshold_bytes=1000))
    cg = CompiledGraph.build(g, 1000)
    r = simulate(g, plan, LINK, events=True, compiled=cg)
    assert r.events and not r.allocation_events
    assert live_peak_bytes_timed(r, cg, plan.schedule) == 200
    assert held_peak_bytes(g, plan, LINK, compiled=cg) == 200


def later_need_ready_first():
    """Two parameter prefetches, 1 s each on the link: w1 is needed first (by y)
    but its trigger is q; w2 is needed later (by z) and triggered earlier (p)."""
    ops = [Op("w1", "ReadVariableOp"), Op("w2", "ReadVariableOp"), Op("p", "X", time_s=0.5),
           Op("q", "X", ("p:0",), time_s=0.5), Op("y", "X", ("q:0", "w1:0"), time_s=1.0),
           Op("z", "X", ("y:0", "w2:0"), time_s=1.0)]
    g = DataflowGraph.build(ops, [Tensor("w1:0", MB, kind="parameter"),
                                  Tensor("w2:0", MB, kind="parameter")]
                            + [Tensor(f"{n}:0", MB) for n in "pqyz"])
    swaps = (Swap("w1:0", out_after="", in_after="q", consumers=("y",), bytes=MB,
                  kind="prefetch"),
             Swap("w2:0", out_after="", in_after="p", consumers=("z",), bytes=MB,
                  kind="prefetch"))
    return g, Plan(schedule=("w1", "w2", "p", "q", "y", "z"), swaps=swaps,
                   allocation=Allocation((MB,), (6,)), resident_parameters=())


def copies(result):
    return {e.name: (e.start_s, e.end_s) for e in result.events if e.stream == "h2d"}


def test_plan_order_holds_a_ready_copy_behind_the_one_needed_first():
    g, plan = later_need_ready_first()
    r = simulate(g, plan, LINK, events=True)
    assert copies(r) == {"w1:0": (1.0, 2.0), "w2:0": (2.0, 3.0)}
    assert r.step_time_s == 4.0


def test_issue_order_runs_copies_as_they_become_ready_like_the_executor():
    """TF runs a swap-in as soon as its trigger is done: w2's copy takes the link
    first and w1's, needed first, queues behind it."""
    g, plan = later_need_ready_first()
    r = simulate(g, plan, LINK, events=True, copy_order="ready")
    assert copies(r) == {"w2:0": (0.5, 1.5), "w1:0": (1.5, 2.5)}
    assert r.step_time_s == 4.5
    # The swap-in allocates when it is issued, not when its bytes start moving.
    w1 = next(e for e in r.allocation_events if e.tensor == "w1:0" and e.is_alloc)
    assert w1.time_s == 1.0


def test_issue_order_latency_delays_completion_not_the_next_copy():
    g, plan = later_need_ready_first()
    spec = dataclasses.replace(LINK, copy_latency_s=0.25)
    ready = simulate(g, plan, spec, events=True, copy_order="ready")
    assert copies(ready) == {"w2:0": (0.5, 1.75), "w1:0": (1.5, 2.75)}
    assert ready.step_time_s == 4.75
    # The planner's model: the latency holds the stream before the bytes.
    planned = simulate(g, plan, spec, events=True)
    assert copies(planned) == {"w1:0": (1.0, 2.25), "w2:0": (2.25, 3.5)}
    assert planned.step_time_s == 4.5


def test_issue_order_equals_plan_order_where_they_agree():
    g = chain()
    swap = Swap("a:0", out_after="b", in_after="b", consumers=("d",), bytes=MB)
    plan = Plan(schedule=("a", "b", "c", "d"), swaps=(swap,), allocation=Allocation((MB,), (3,)))
    planned, ready = (simulate(g, plan, LINK, events=True, copy_order=o)
                      for o in ("plan", "ready"))
    assert planned.step_time_s == ready.step_time_s == 7.0
    assert set(planned.events) == set(ready.events)
    assert set(planned.allocation_events) == set(ready.allocation_events)
    assert planned.peak_bytes == ready.peak_bytes


def test_copy_order_is_validated():
    g, plan = later_need_ready_first()
    with pytest.raises(ValueError, match="copy_order"):
        simulate(g, plan, LINK, copy_order="fifo")
    with pytest.raises(ValueError, match="compute stream"):
        simulate(g, plan, dataclasses.replace(LINK, copies_on_compute=True), copy_order="ready")


def test_issue_cost_slows_the_op_running_and_is_absorbed_by_a_wait():
    """Each issued copy costs the compute 0.1 s: q, starting as w2's copy is
    issued, pays it; y waits for w1's copy anyway, so w1's cost is absorbed."""
    g, plan = later_need_ready_first()
    r = simulate(g, plan, LINK, events=True, copy_order="ready", issue_cost_s=0.1)
    ran = {e.name: (e.start_s, e.end_s) for e in r.events if e.stream == "compute"}
    assert ran["q"] == (0.5, 1.1) and ran["y"] == (2.5, 3.5)
    assert copies(r) == {"w2:0": (0.5, 1.5), "w1:0": (1.5, 2.5)}
    assert r.step_time_s == 4.5
    with pytest.raises(ValueError, match="copy_order='ready'"):
        simulate(g, plan, LINK, issue_cost_s=0.1)
    with pytest.raises(ValueError, match="issue_cost_s"):
        simulate(g, plan, LINK, copy_order="ready", issue_cost_s=-1.0)


def test_a_buffer_moved_as_its_slices_simulates_as_the_buffer_swap():
    """A finished plan moves the slices an Unpack made of a buffer as one swap each
    (tfswap.tf.tensor_swaps); simulated, they leave and come back as the one buffer
    swap the planner planned, each slice a copy of its own."""
    ops = [Op("a", "X", time_s=1.0), Op("u", "Unpack", ("a:0",), outputs=("u:0", "u:1")),
           Op("b", "X", time_s=4.0), Op("c0", "X", ("u:0", "b:0"), time_s=1.0),
           Op("c1", "X", ("u:1", "c0:0"), time_s=1.0)]
    g = DataflowGraph.build(ops, [Tensor("a:0", 2 * MB), Tensor("u:0", MB, alias_of="a:0"),
                                  Tensor("u:1", MB, alias_of="a:0"), Tensor("b:0", 2 * MB),
                                  Tensor("c0:0", 2 * MB), Tensor("c1:0", 2 * MB)])
    schedule = ("a", "u", "b", "c0", "c1")
    pool = Allocation((2 * MB,), (3,))
    whole = Plan(schedule=schedule, allocation=pool, swaps=(
        Swap("a:0", out_after="u", in_after="b", consumers=("c0", "c1"), bytes=2 * MB),))
    slices = Plan(schedule=schedule, allocation=pool, swaps=tuple(
        Swap(t, out_after="u", in_after="b", consumers=(c,), bytes=MB, id=f"a:0|{t}")
        for t, c in (("u:0", "c0"), ("u:1", "c1"))))
    planned, finished = simulate(g, whole, LINK), simulate(g, slices, LINK)
    assert (finished.step_time_s, finished.peak_bytes, finished.h2d_bytes) == (
        planned.step_time_s, planned.peak_bytes, planned.h2d_bytes)
    latency = dataclasses.replace(LINK, copy_latency_s=0.25)
    # Two copies each way: the swap-out and swap-in each pay the latency twice.
    assert simulate(g, slices, latency).step_time_s == \
        simulate(g, whole, latency, copy_parts={whole.swaps[0].id: 2}).step_time_s


def test_held_peak_counts_buffers_at_their_own_sizes_not_their_classes():
    """Issue #44: a pool of one 4 MB class holds each 1 MB buffer of the chain in a
    4 MB object; TensorFlow's allocator holds 1 MB for it."""
    from tfswap.core import liveness
    from tfswap.core.simulator import held_peak_bytes

    ops = [Op("a", "X", time_s=1.0), Op("b", "X", ("a:0",), time_s=1.0),
           Op("c", "X", ("b:0",), time_s=4.0), Op("d", "X", ("c:0", "a:0"), time_s=1.0)]
    g = DataflowGraph.build(ops, [Tensor("a:0", MB), Tensor("b:0", MB), Tensor("c:0", MB),
                                  Tensor("d:0", 4 * MB)])
    plan = Plan(schedule=("a", "b", "c", "d"), allocation=Allocation((4 * MB,), (3,)))
    assert simulate(g, plan, LINK).peak_bytes == 3 * 4 * MB
    held = held_peak_bytes(g, plan, LINK)
    assert held == liveness.peak(g, plan.schedule) == 4 * MB + 2 * MB



@pytest.mark.parametrize("update_first", [False, True], ids=["update-after", "update-before"])
def test_a_remake_reading_a_variable_after_its_update_holds_the_variable_once_more(
        update_first):
    """Issue #44: ``y = x @ w`` is made again for ``h``; the optimizer's update of
    ``w`` waits for ``y``'s op (a control edge, as the TF lowering orders a
    variable's update after its readers).  Scheduled before the remake, the
    update finds the value read for it still referenced and writes a copy of
    the variable (TensorFlow's copy-on-write): 3 MB more held until ``h``.
    After the remake, nothing more; nor without the remake."""
    from tfswap.core.problem import Problem
    from tfswap.core.simulator import held_peak_bytes

    ops = [Op("x", "Placeholder"), Op("w", "ReadVariableOp"),
           Op("y", "MatMul", ("x:0", "w:0"), time_s=1e-4, phase="forward"),
           Op("loss", "Sum", ("y:0",), time_s=1e-5, phase="forward"),
           Op("g", "Grad", ("loss:0",), time_s=1e-4, phase="backward"),
           Op("update", "AssignSubVariableOp", ("g:0",), control_inputs=("y",), time_s=1e-5,
              phase="update"),
           Op("h", "Grad", ("g:0", "y:0", "x:0"), time_s=1e-4, phase="backward")]
    graph = DataflowGraph.build(ops, [
        Tensor("x:0", 2 * MB, kind="input"), Tensor("w:0", 3 * MB, kind="parameter"),
        Tensor("y:0", 2 * MB), Tensor("loss:0", 4, kind="small"),
        Tensor("g:0", 2 * MB, kind="gradient"), Tensor("h:0", 2 * MB, kind="gradient")])
    problem = Problem.of(graph, keep=["h:0"], small_threshold_bytes=64, recomputable=["y"])
    schedule = ("x", "w", "y", "loss", "g") + (("update", "h") if update_first
                                               else ("h", "update"))
    remade = (Swap("y:0", out_after="loss", in_after="", consumers=("h",), kind="recompute",
                   ops=("y",), bytes=2 * MB, id="y"),)
    held = {swaps: held_peak_bytes(graph, Plan(schedule=schedule, swaps=swaps), LINK,
                                   keep=problem.keep, compiled=problem.compiled)
            for swaps in ((), remade)}
    # At h: x, w, y (remade), g and h (and 4 B of loss); and w's copy where the
    # update ran before.
    assert held[()] // MB == 11
    assert held[remade] // MB == (14 if update_first else 11)

def test_held_peak_holds_a_swap_in_from_its_trigger_not_from_its_copy():
    """Issue #44: TensorFlow's SwapIn op allocates its output when it runs, once
    its trigger (here: none, the step's start) is done, while its copy waits on
    the link behind the copy the plan's stream order puts first (w1's, needed
    sooner, triggered after b).  w2's megabyte is held from the start, beside a's
    3 MB and b's 1 MB; counted from its copy's start the peak was 4 MB."""
    from tfswap.core.compiled import CompiledGraph
    from tfswap.core.simulator import held_peak_bytes, live_peak_bytes_timed

    ops = [Op("w1", "ReadVariableOp"), Op("w2", "ReadVariableOp"), Op("a", "X", time_s=2.0),
           Op("b", "X", ("a:0",), time_s=2.0), Op("r1", "X", ("w1:0", "b:0"), time_s=1.0),
           Op("r2", "X", ("w2:0", "r1:0"), time_s=1.0)]
    g = DataflowGraph.build(ops, [Tensor("w1:0", MB, kind="parameter"),
                                  Tensor("w2:0", MB, kind="parameter"), Tensor("a:0", 3 * MB),
                                  Tensor("b:0", MB), Tensor("r1:0", MB), Tensor("r2:0", MB)])
    swaps = (Swap("w1:0", out_after="", in_after="b", consumers=("r1",), bytes=MB,
                  kind="prefetch"),
             Swap("w2:0", out_after="", in_after="", consumers=("r2",), bytes=MB,
                  kind="prefetch"))
    plan = Plan(schedule=("w1", "w2", "a", "b", "r1", "r2"), swaps=swaps,
                allocation=Allocation((MB, 3 * MB), (4, 1)), resident_parameters=())
    r = simulate(g, plan, LINK, events=True)
    # The plan's timing: w1 moves 4-5 s, w2 behind it 5-6 s; r2 waits for w2.
    copies = {e.name: (e.start_s, e.end_s) for e in r.events if e.stream == "h2d"}
    assert copies == {"w1:0": (4.0, 5.0), "w2:0": (5.0, 6.0)} and r.step_time_s == 7.0
    # The pool takes w2's object when its copy starts; TF's allocator holds it
    # from the start (the same object, as the pool gives it).
    taken = {e.tensor: e for e in r.allocation_events if e.is_alloc}
    held = {e.tensor: e for e in r.held_events if e.is_alloc}
    assert taken["w2:0"].time_s == 5.0 and held["w2:0"].time_s == 0.0
    assert held["w2:0"].object_index == taken["w2:0"].object_index
    assert {k: e.time_s for k, e in held.items() if k != "w2:0"} == \
        {k: e.time_s for k, e in taken.items() if k != "w2:0"}
    assert r.peak_bytes == 4 * MB     # the pool's objects, w2 from 5 s
    assert held_peak_bytes(g, plan, LINK) == 5 * MB    # a, b and w2 during b
    cg = CompiledGraph.build(g, 1 << 20)
    assert live_peak_bytes_timed(r, cg, plan.schedule) == 5 * MB
    # A swap op issued where it becomes ready (the "ready" copy order) takes
    # its object then: what TF's allocator holds is what the pool holds.
    ready = simulate(g, plan, LINK, events=True, copy_order="ready")
    assert ready.held_events == ready.allocation_events
    assert next(e for e in ready.allocation_events if e.tensor == "w2:0").time_s == 0.0


def test_a_swap_in_is_held_from_its_own_swap_outs_end_not_its_trigger():
    """A SwapIn op reads its swap-out's host copy: a:0, triggered by b (done at
    2 s), comes back only once its own swap-out is done (3 s), and is held from
    then, not from b's end; nothing waits on the link before it, so what TF's
    allocator holds is what the pool holds."""
    g = chain()
    swap = Swap("a:0", out_after="b", in_after="b", consumers=("d",), bytes=MB)
    plan = Plan(schedule=("a", "b", "c", "d"), swaps=(swap,), allocation=Allocation((MB,), (3,)))
    r = simulate(g, plan, LINK, events=True)
    out = next(e for e in r.events if e.stream == "d2h")
    back = next(e for e in r.events if e.stream == "h2d")
    assert (out.start_s, out.end_s) == (2.0, 3.0) and back.start_s == 3.0
    takes = [e.time_s for e in r.held_events if e.is_alloc and e.tensor == "a:0"]
    assert takes == [0.0, 3.0]
    assert r.held_events == r.allocation_events


def test_a_fetched_parameter_is_held_from_its_read_not_before():
    """A prefetch's SwapIn reads the parameter's read op, an op of the schedule:
    w2 fetched "with the step" but read after a is held from a's end (2 s), not
    from the start, though the plan's copy moves it from 0 s."""
    ops = [Op("a", "X", time_s=2.0), Op("w2", "ReadVariableOp"),
           Op("b", "X", ("a:0", "w2:0"), time_s=1.0)]
    g = DataflowGraph.build(ops, [Tensor("a:0", MB), Tensor("w2:0", MB, kind="parameter"),
                                  Tensor("b:0", MB)])
    swaps = (Swap("w2:0", out_after="", in_after="", consumers=("b",), bytes=MB,
                  kind="prefetch"),)
    plan = Plan(schedule=("a", "w2", "b"), swaps=swaps, allocation=Allocation((MB,), (3,)),
                resident_parameters=())
    r = simulate(g, plan, LINK, events=True)
    assert [(e.start_s, e.end_s) for e in r.events if e.stream == "h2d"] == [(0.0, 1.0)]
    pool = next(e for e in r.allocation_events if e.tensor == "w2:0")
    held = next(e for e in r.held_events if e.tensor == "w2:0")
    assert (pool.time_s, held.time_s) == (0.0, 2.0)
    assert held.object_index == pool.object_index


def test_a_swap_ins_copy_read_last_by_a_forwarding_op_becomes_its_output():
    """Issue #44: an elementwise kernel writes its output into an input's buffer
    when it holds the only reference, which a swap-in's copy read for the last
    time is: d (``forwards``: it may write into a:0) allocates nothing, and a's
    copy lives on as d's output."""
    g = chain()
    swap = Swap("a:0", out_after="b", in_after="b", consumers=("d",), bytes=MB)
    plan = Plan(schedule=("a", "b", "c", "d"), swaps=(swap,), allocation=Allocation((MB,), (3,)))
    plain = simulate(g, plan, LINK, events=True)
    fwd = simulate(g, plan, LINK, events=True, forwards={"d": ("a:0",)})
    assert plain.allocation_events == fwd.allocation_events   # the pool is the plan's
    assert any(e.tensor == "d:0" and e.is_alloc for e in plain.held_events)
    assert not any(e.tensor == "d:0" and e.is_alloc for e in fwd.held_events)
    # The copy's release at d's end is d's output's: a's only release is its
    # first buffer's (its swap-out done, 3 s).
    assert [e.time_s for e in fwd.held_events if e.tensor == "a:0" and not e.is_alloc] == [3.0]

    def held_at(result, t):
        return sum(e.nbytes if e.is_alloc else -e.nbytes
                   for e in result.held_events if e.time_s <= t)
    assert held_at(plain, 6.0) == 3 * MB   # while d runs: c, a's copy, d
    assert held_at(fwd, 6.0) == 2 * MB     # d writes into a's copy
    assert held_at(fwd, 7.0) == held_at(plain, 7.0) == 0
    # Not where the copy is read again later (c reads b's buffer, not a's): b's
    # output is no swap-in's copy, so b still allocates.
    other = simulate(g, plan, LINK, events=True, forwards={"b": ("a:0",)})
    assert other.held_events == plain.held_events


def test_held_peak_leaves_out_what_the_device_never_allocates_but_counts_its_swap_in():
    """Issue #44: on the emulated device the step's arguments are the caller's
    host memory: ``unheld`` leaves out x's own buffer, held by the model from
    its Placeholder to its last reader, but not its copy brought back."""
    from tfswap.core.simulator import held_peak_bytes

    ops = [Op("x", "Placeholder"), Op("b", "X", ("x:0",), time_s=1.0),
           Op("c", "X", ("b:0",), time_s=4.0), Op("d", "X", ("c:0", "x:0"), time_s=1.0)]
    g = DataflowGraph.build(ops, [Tensor("x:0", 2 * MB, kind="input"), Tensor("b:0", MB),
                                  Tensor("c:0", MB), Tensor("d:0", MB)])
    plan = Plan(schedule=("x", "b", "c", "d"), allocation=Allocation((MB, 2 * MB), (3, 1)))
    assert held_peak_bytes(g, plan, LINK) == 2 * MB + 2 * MB    # x, b, c during c
    assert held_peak_bytes(g, plan, LINK, unheld=("x:0",)) == 2 * MB   # c and d
    swap = Swap("x:0", out_after="b", in_after="c", consumers=("d",), bytes=2 * MB)
    swapped = dataclasses.replace(plan, swaps=(swap,))
    # Its copy back is the device's: x's 2 MB with c and d.
    assert held_peak_bytes(g, swapped, LINK, unheld=("x:0",)) == 4 * MB

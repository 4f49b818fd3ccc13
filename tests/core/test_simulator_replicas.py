"""The simulator's replicated step (issue #31): several devices on one clock, their
copies sharing the host's link, their collectives meeting."""

import dataclasses

import pytest

from tfswap.core.devices import DeviceSpec
from tfswap.core.graph import DataflowGraph, Op, Tensor
from tfswap.core.plan import Allocation, Plan, Swap
from tfswap.core.simulator import Deadlock, PlanError, Replica, simulate, simulate_replicas

MB = 1 << 20
# Each device's link moves 1 MB/s each way (both ways at once); all devices' copies
# in one direction move 1 MB/s together.
SHARED = DeviceSpec("shared", memory_bytes=1 << 30, peak_flops=1.0,
                    memory_bandwidth_bytes_per_s=1.0, h2d_bytes_per_s=MB, d2h_bytes_per_s=MB,
                    duplex_bytes_per_s=2 * MB, launch_overhead_s=0.0,
                    shared_link_bytes_per_s=MB)
OWN = dataclasses.replace(SHARED, shared_link_bytes_per_s=None)
SCHEDULE = ("a", "b", "c", "d")


def chain(c_time=2.0, d_name="d", b_time=1.0):
    """a -> b -> c -> d, d also reads a."""
    ops = [Op("a", "X", time_s=1.0), Op("b", "X", ("a:0",), time_s=b_time),
           Op("c", "X", ("b:0",), time_s=c_time), Op(d_name, "X", ("c:0", "a:0"), time_s=1.0)]
    return DataflowGraph.build(ops, [Tensor(f"{o.name}:0", MB) for o in ops])


def plan(swapped=True, d_name="d"):
    """a:0 out after b (1 s alone on the link), back in for d (1 s): a 5 s step alone."""
    swaps = (Swap("a:0", out_after="b", in_after="b", consumers=(d_name,), bytes=MB),) \
        if swapped else ()
    return Plan(schedule=SCHEDULE[:3] + (d_name,), swaps=swaps,
                allocation=Allocation((MB,), (3,)))


def test_one_replica_is_the_single_device_simulation():
    g, p = chain(), plan()
    alone = simulate(g, p, SHARED, events=True)
    both = simulate_replicas([Replica(g, p)], SHARED, events=True)
    assert both.step_time_s == alone.step_time_s == 5.0
    assert both.devices == (alone,)


def test_copies_at_the_same_time_share_the_link():
    """Both devices move a:0 out at 2 s and back at once: each copy at half the rate."""
    g, p = chain(), plan()
    both = simulate_replicas([Replica(g, p), Replica(g, p)], SHARED, events=True)
    for device in both.devices:
        out = next(e for e in device.events if e.stream == "d2h")
        back = next(e for e in device.events if e.stream == "h2d")
        assert (out.start_s, out.end_s, back.start_s, back.end_s) == (2.0, 4.0, 4.0, 6.0)
        assert device.step_time_s == 7.0
    assert both.step_time_s == 7.0
    # As the planner prices a plan for its share of the link (the whole step).
    assert simulate(g, p, SHARED.shared_by(2)).step_time_s == 7.0


def test_a_copy_alone_on_the_shared_link_has_it_all():
    """The other device copies nothing: the sharing costs the copying one nothing,
    where its share of the link (shared_by) would price it at half the rate."""
    g = chain()
    both = simulate_replicas([Replica(g, plan()), Replica(g, plan(swapped=False))], SHARED)
    assert [d.step_time_s for d in both.devices] == [5.0, 5.0]
    assert simulate(g, plan(), SHARED.shared_by(2)).step_time_s == 7.0


def test_copies_that_overlap_in_part_share_the_link_while_they_overlap():
    """Device 1's b ends 0.5 s later: each copy has the link alone for half of its
    megabyte and shares it for the other half (2 x 0.5 MB/s)."""
    g0, g1 = chain(), chain(b_time=1.5)
    both = simulate_replicas([Replica(g0, plan()), Replica(g1, plan())], SHARED, events=True)
    copies = [{e.stream: (e.start_s, e.end_s) for e in d.events if e.stream != "compute"}
              for d in both.devices]
    assert copies == [{"d2h": (2.0, 3.5), "h2d": (3.5, 5.0)},
                      {"d2h": (2.5, 4.0), "h2d": (4.0, 5.5)}]
    assert [d.step_time_s for d in both.devices] == [6.0, 6.5] and both.step_time_s == 6.5


FIFO = dataclasses.replace(SHARED, shared_link_order="fifo")


def test_a_fifo_link_moves_one_copy_at_a_time_at_the_full_rate():
    """The emulated link: both swap-outs ask at 2 s, device 0 goes first (ties: the
    lower device); each swap-in follows its own swap-out, device 1's after device
    0's.  Device 0 ends as alone, device 1 a second later (even shares: 7 s)."""
    g, p = chain(), plan()
    both = simulate_replicas([Replica(g, p), Replica(g, p)], FIFO, events=True)
    copies = [{e.stream: (e.start_s, e.end_s) for e in d.events if e.stream != "compute"}
              for d in both.devices]
    assert copies == [{"d2h": (2.0, 3.0), "h2d": (3.0, 4.0)},
                      {"d2h": (3.0, 4.0), "h2d": (4.0, 5.0)}]
    assert [d.step_time_s for d in both.devices] == [5.0, 6.0]


def test_a_fifo_link_serves_the_copy_that_asked_first():
    """Device 1's b ends at 1.5 s, so its swap-out asks first and device 0's waits."""
    g0, g1 = chain(), chain(b_time=0.5)
    for copy_order in ("plan", "ready"):
        both = simulate_replicas([Replica(g0, plan()), Replica(g1, plan())], FIFO,
                                 events=True, copy_order=copy_order)
        copies = [{e.stream: (e.start_s, e.end_s) for e in d.events if e.stream != "compute"}
                  for d in both.devices]
        assert copies == [{"d2h": (2.5, 3.5), "h2d": (3.5, 4.5)},
                          {"d2h": (1.5, 2.5), "h2d": (2.5, 3.5)}], copy_order
        assert [d.step_time_s for d in both.devices] == [5.5, 4.5]


def test_each_device_on_its_own_link_runs_as_alone():
    g, p = chain(), plan()
    both = simulate_replicas([Replica(g, p), Replica(g, p)], OWN)
    assert [d.step_time_s for d in both.devices] == [5.0, 5.0]


def test_a_collective_starts_when_every_member_can():
    """Device 1's c takes 2 s longer: device 0's all-reduce (d) waits for device 1's."""
    g0, g1 = chain(d_name="reduce"), chain(c_time=4.0, d_name="reduce_1")
    p0, p1 = plan(False, "reduce"), plan(False, "reduce_1")
    apart = simulate_replicas([Replica(g0, p0), Replica(g1, p1)], OWN)
    assert [d.step_time_s for d in apart.devices] == [5.0, 7.0]
    met = simulate_replicas([Replica(g0, p0), Replica(g1, p1)], OWN, events=True,
                            rendezvous=[("reduce", "reduce_1")])
    starts = [next(e.start_s for e in d.events if e.name.startswith("reduce"))
              for d in met.devices]
    assert starts == [6.0, 6.0]
    assert [d.step_time_s for d in met.devices] == [7.0, 7.0] and met.step_time_s == 7.0


def test_a_collective_a_member_never_reaches_deadlocks():
    """Each device's all-reduce waits for the other's, which comes after its own."""
    ops = [Op("r0", "X", time_s=1.0), Op("r1", "X", ("r0:0",), time_s=1.0)]
    g = DataflowGraph.build(ops, [Tensor("r0:0", MB), Tensor("r1:0", MB)])
    p = Plan(schedule=("r0", "r1"), allocation=Allocation((MB,), (2,)))
    with pytest.raises(Deadlock, match="deadlocks"):
        simulate_replicas([Replica(g, p), Replica(g, p)], OWN,
                          rendezvous=[("r0", "r1"), ("r1", "r0")])
    assert issubclass(Deadlock, PlanError)


def test_bad_rendezvous_say_what_is_wrong():
    g, p = chain(), plan()
    with pytest.raises(ValueError, match="one op per replica"):
        simulate_replicas([Replica(g, p), Replica(g, p)], OWN, rendezvous=[("d",)])
    with pytest.raises(ValueError, match="'x' is not among replica 1"):
        simulate_replicas([Replica(g, p), Replica(g, p)], OWN, rendezvous=[("d", "x")])
    with pytest.raises(ValueError, match="at least one replica"):
        simulate_replicas([], OWN)


def test_a_fifo_link_serves_devices_that_asked_at_once_lowest_first():
    """Three devices' swap-outs ask at 2 s: devices 1 and 2 wait together, and 1 goes
    next (ties: the lower device)."""
    g, p = chain(), plan()
    three = simulate_replicas([Replica(g, p)] * 3, FIFO, events=True)
    outs = [next((e.start_s, e.end_s) for e in d.events if e.stream == "d2h")
            for d in three.devices]
    assert outs == [(2.0, 3.0), (3.0, 4.0), (4.0, 5.0)]

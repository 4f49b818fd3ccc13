"""Work next to host-homed variables: gathers of their rows and their updates (issue #29).

Every check trains a model planned by ``tfswap.optimize`` (or rewritten by
:mod:`tfswap.tf.host_side`) and the same model built again (same seed) with
its unmodified function, and compares losses, ``get_weights`` and the
optimizer's state bit for bit.
"""

import dataclasses

import numpy as np
import pytest

import tfswap
from tfswap import zoo
from tfswap.core.plan import Plan, UpdatePlace
from tfswap.tf import capture, emulate, homes, host_side, measure, runtime, update_places
from tests.tf.test_homes import assert_trains_like_the_unmodified_step, device_peak, state

TABLE = "embeddings"


def host_captured(step):
    """``step`` (variables created in host memory) captured as optimize plans it."""
    captured = capture.capture(step.concrete_fn, device=emulate.DEVICE)
    captured, _ = homes.updates_on_device(captured, emulate.DEVICE)
    return host_side.gathers_on_host(captured)[0]


def table_group(captured):
    return next(g for g in host_side.update_groups(captured, emulate.DEVICE)
                if any(TABLE in n for n in g.names))


def test_a_table_larger_than_the_budget_trains_by_gathering_its_rows_on_the_host():
    # The case: 100000 x 64 (25.6 MB), plain SGD, a fifth of the peak.
    reference, step = zoo.embedding(vocab=100000, optimizer="sgd"), \
        zoo.embedding(vocab=100000, optimizer="sgd")
    budget = device_peak(reference) // 5
    table = next(v for v in step.model.weights if TABLE in v.path)
    assert budget < int(np.prod(table.shape)) * 4
    fast = tfswap.optimize(step.concrete_fn, budget, generations=2, workers=1,
                           inputs=step.batch)
    assert fast.relocation is not None
    assert fast.measured_peak_bytes <= budget
    rows = step.batch[0].size * table.shape[1] * 4
    fetched = sum(s.bytes for s in fast.plan.swaps if s.kind == "prefetch")
    assert fetched <= rows + (64 << 10)   # the gathered rows and the small dense head
    assert "gather(s) of their rows run on the host" in fast.report()
    assert fast.plan.update_places == ()   # SGD's update is sparse: already on the host
    assert_trains_like_the_unmodified_step(reference, step, fast)
    fast.restore_parameters()


def test_an_adam_update_that_cannot_fit_the_device_runs_where_the_simulator_says():
    # The case: 20000 x 64 with Adam at 55% of the peak; the update
    # needs three table-sized tensors at once, more than the budget.
    reference, step = zoo.embedding(), zoo.embedding()
    budget = int(0.55 * device_peak(reference))
    fast = tfswap.optimize(step.concrete_fn, budget, generations=2, workers=1,
                           inputs=step.batch)
    assert fast.measured_peak_bytes <= budget
    (placed,) = fast.plan.update_places
    assert placed.place in ("host", "pieces") and len(placed.variables) == 3
    assert "simulated step" in placed.why and "on the host" in placed.why
    assert "embeddings" in fast.report() and update_places.describe(
        placed.place, placed.pieces) in fast.report()
    assert_trains_like_the_unmodified_step(reference, step, fast)
    fast.restore_parameters()


@pytest.mark.parametrize("optimizer", ["adam", "momentum"])
def test_updates_on_the_host_and_in_pieces_compute_what_the_device_update_computes(optimizer):
    reference = zoo.embedding(vocab=2000, optimizer=optimizer)
    step = zoo.embedding(vocab=2000, optimizer=optimizer, variables_on=emulate.HOST)
    captured = host_captured(step)
    group = table_group(captured)
    assert group.rows == 2000
    variables = list(step.model.weights) + list(step.optimizer.variables)
    initial = state(step)
    want = [float(reference.concrete_fn(*reference.batch)["loss"]) for _ in range(3)]
    for rewritten in (host_side.updates_on_host(captured, group),
                      host_side.updates_in_pieces(captured, emulate.DEVICE, group, 3)[0]):
        for v, x in zip(variables, initial):
            v.assign(x)
        fn = runtime.bind(rewritten, rewritten.graph_def)
        assert [float(fn(*step.batch)["loss"]) for _ in range(3)] == want
        for a, b in zip(state(reference), state(step)):
            np.testing.assert_array_equal(b, a)


def test_each_table_is_one_group_with_its_slots_and_shared_scalars_stay_apart():
    step = zoo.embedding(vocab=2000, variables_on=emulate.HOST)
    groups = host_side.update_groups(host_captured(step), emulate.DEVICE)
    table = next(g for g in groups if any(TABLE in n for n in g.names))
    assert len(table.variables) == 3   # the table, Adam's momentum and velocity
    assert table.device_bytes >= 3 * 2000 * 64 * 4
    assert groups[0] == table   # the largest first
    # The step counter's bias correction is shared by every update: it joins none.
    assert all(len(g.variables) <= 3 for g in groups)


def test_pieces_hold_one_slice_at_a_time_on_the_device():
    step = zoo.embedding(vocab=2000, variables_on=emulate.HOST)
    captured = host_captured(step)
    group = table_group(captured)
    pieces, costs = host_side.updates_in_pieces(captured, emulate.DEVICE, group, 4)
    names = {n.name: n for n in pieces.graph_def.node}
    assert not set(group.ops) & set(names)   # every update op replaced by its pieces
    writes = [n for n in names.values() if n.op == "ResourceStridedSliceAssign"]
    assert len(writes) == 4 * 3 and all(not w.device.endswith("CPU:0") for w in writes)
    shapes = measure_shapes(pieces)
    for name in names:
        original, _, piece = name.rpartition(host_side.PIECE_SUFFIX)
        if piece.isdigit() and original in group.ops:
            assert shapes[name + ":0"][0] == 500
    assert all(share <= 0.25 for _, share in costs.values())


def measure_shapes(captured):
    from tfswap.tf.shapes import static_shapes

    return {k: v.as_list() for k, v in static_shapes(captured, captured.graph_def).items()
            if v.rank}


def test_pieces_are_refused_where_an_update_does_not_work_row_by_row():
    step = zoo.embedding(vocab=2000, variables_on=emulate.HOST)
    captured = host_captured(step)
    group = dataclasses.replace(table_group(captured), rows=0)
    with pytest.raises(ValueError, match="cannot run in pieces"):
        host_side.updates_in_pieces(captured, emulate.DEVICE, group, 2)
    with pytest.raises(ValueError, match="pieces must be in"):
        host_side.updates_in_pieces(captured, emulate.DEVICE, table_group(captured), 1)


def test_the_fastest_place_is_chosen_and_small_updates_stay_on_the_device():
    step = zoo.embedding(vocab=2000, variables_on=emulate.HOST)
    captured = host_captured(step)
    group = table_group(captured)
    seen = []

    def price(candidate, _profile):   # pieces cost least, the device most
        names = {n.name for n in candidate.graph_def.node}
        on_host = any(not n.device.endswith("CPU:0") for n in candidate.graph_def.node
                      if n.name in group.ops)
        seen.append(names)
        return 1.0 if any(host_side.PIECE_SUFFIX in n for n in names) else \
            2.0 if on_host else 3.0

    placed = update_places.choose(captured, None, emulate.DEVICE, group.device_bytes, price)
    (place,) = placed.places
    assert place.place == "pieces" and place.pieces >= 2 and len(seen) == 3
    assert "on the device in" in place.why and "on the host 2000.00 ms" in place.why
    roomy = update_places.choose(captured, None, emulate.DEVICE, 4 * group.device_bytes, price)
    assert roomy.places == () and roomy.captured is captured


def test_a_saved_plan_runs_its_updates_where_they_were_planned(tmp_path):
    reference, step = zoo.embedding(vocab=20000), zoo.embedding(vocab=20000)
    budget = int(0.55 * device_peak(reference))
    fast = tfswap.optimize(step.concrete_fn, budget, generations=1, workers=1,
                           inputs=step.batch)
    path = tmp_path / "step.plan.json"
    fast.plan.save(path)
    assert Plan.load(path).update_places == fast.plan.update_places != ()
    fast.restore_parameters()   # back on the device, untrained: load_plan moves them again
    loaded = tfswap.load_plan(path, step.concrete_fn)
    assert loaded.relocation is not None and loaded.plan == fast.plan
    assert_trains_like_the_unmodified_step(reference, step, loaded)
    loaded.restore_parameters()


def test_an_update_place_is_checked():
    with pytest.raises(ValueError, match="place must be one of"):
        UpdatePlace(("v",), "gpu")
    with pytest.raises(ValueError, match="pieces >= 2"):
        UpdatePlace(("v",), "pieces", 1)
    with pytest.raises(ValueError, match="pieces >= 2"):
        UpdatePlace(("v",), "host", 4)


def test_work_on_the_host_is_priced_at_the_hosts_speed_and_its_reads_leave_the_device():
    from tfswap import pipeline
    from tfswap.tf import lower as tf_lower
    from tfswap.core.devices import cpu_emulated, device_spec

    step = zoo.embedding(vocab=2000, variables_on=emulate.HOST)
    captured = host_side.updates_on_host(host_captured(step),
                                         table_group(host_captured(step)))
    lowered = tf_lower.lower(captured, None, cpu_emulated(), 4096).lowered
    group = table_group(host_captured(step))
    gather = next(n.name for n in captured.graph_def.node if n.op == "GatherV2")
    assert set(group.ops) | {gather} <= set(lowered.host_ops)
    ops = {op.name: op for op in lowered.graph.ops}
    # The host's work reads only device values (the ids, the gradient's rows) ...
    for name in lowered.host_ops:
        assert all(not any(i.startswith(h + ":") for h in lowered.host_ops)
                   for i in ops[name].inputs)
    assert lowered.writebacks[gather] == step.batch[0].nbytes
    # ... and what it makes is a host value the plan fetches, like a variable's read.
    rows = lowered.graph.tensor(f"{gather}:0")
    assert rows.kind == "parameter" and rows.nbytes == step.batch[0].size * 64 * 4
    h100 = device_spec("h100-80g-pcie5")
    priced = tf_lower.price_host_work(lowered.graph, lowered.host_ops, h100)
    for name, nbytes in lowered.host_ops.items():
        assert priced.op(name).time_s == pytest.approx(
            max(ops[name].time_s, nbytes / h100.host_memory_bandwidth_bytes_per_s))
    assert tf_lower.price_host_work(lowered.graph, lowered.host_ops, cpu_emulated()) \
        is lowered.graph


def test_a_step_whose_table_another_plan_moved_moves_the_rest_on_the_users_graph():
    # Issue #44: a Keras validation plan had moved the table; the training step's
    # re-plan then moved the rest and rewrote its own host gather again
    # ("Node '.../GatherV2/tfswap_axis' is not unique").
    reference, step = zoo.embedding(vocab=2000), zoo.embedding(vocab=2000)
    table = next(v for v in step.model.weights if TABLE in v.path)
    earlier = homes.move_to_host([table.value], emulate.HOST)   # what the other plan did
    try:
        fast = tfswap.optimize(step.concrete_fn, 1 << 30, parameters="host", generations=1,
                               workers=1, inputs=step.batch)
        assert fast.relocation is not None and all(
            m.variable is not table.value for m in fast.relocation.moved)
        gathers = [n.name for n in fast.captured.graph_def.node if n.op == "GatherV2"]
        assert gathers and all(
            sum(n.name == f"{g}/tfswap_axis" for n in fast.captured.graph_def.node) == 1
            for g in gathers)
        assert "gather(s) of their rows run on the host" in fast.report()
        assert_trains_like_the_unmodified_step(reference, step, fast)
        fast.restore_parameters()
    finally:
        earlier.undo()

"""Baseline policies on synthetic graphs: plans the simulator accepts within budget,
and each policy's defining rule (no TensorFlow)."""

from dataclasses import replace

import pytest

from tfswap.core import baselines
from tfswap.core.baselines import BASELINES, Infeasible, topological_levels
from tfswap.core.compiled import CompiledGraph
from tfswap.core.graph import DataflowGraph, Op, Tensor
from tfswap.core.plan import Plan, Swap
from tfswap.core.search import SearchConfig, plan as ga_plan
from tfswap.core.simulator import simulate
from research.synthetic import layered_training_step
from tests.core.plan_checks import MB, SPEC


@pytest.fixture(scope="module")
def step():
    g = layered_training_step(200, seed=3)
    ideal = baselines.ideal(g, 1, SPEC)
    return g, ideal.prediction.peak_bytes


def _live_peak(graph, plan):
    return simulate(graph, plan, SPEC).peak_bytes


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_plan_is_what_the_simulator_runs_within_budget(step, name):
    g, peak = step
    budget = int(peak * 0.8)
    try:
        p = BASELINES[name](g, budget, SPEC)
    except Infeasible as err:
        # Recomputation alone keeps every input it recomputes from: on this
        # step it gets to 83% of the peak (43% of which is parameters), not 80%.
        assert name in ("no_swap", "vdnn_conv", "vdnn_all", "recompute"), f"{name}: {err}"
        assert err.need_bytes is None or err.need_bytes > budget
        return
    result = simulate(g, p, SPEC)
    assert result.step_time_s == p.prediction.step_time_s
    assert result.ideal_time_s == p.prediction.ideal_time_s
    if name == "ideal":
        assert result.peak_bytes == peak
    elif name == "odswap":
        assert p.allocation.total_bytes <= budget
    else:
        assert result.peak_bytes <= budget
    assert result.step_time_s >= result.ideal_time_s
    assert Plan.from_json(p.to_json()) == p


def test_ideal_is_the_ops_back_to_back_and_no_swap_reports_the_fit(step):
    g, peak = step
    p = baselines.ideal(g, 1, SPEC)
    total = 0.0
    for name in p.schedule:
        total += g.op(name).time_s
    assert p.prediction.step_time_s == pytest.approx(total, rel=1e-12)
    assert p.swaps == ()
    assert baselines.no_swap(g, peak, SPEC).prediction.step_time_s == p.prediction.step_time_s
    with pytest.raises(Infeasible, match="more than the budget") as err:
        baselines.no_swap(g, peak - 1, SPEC)
    assert err.value.need_bytes == peak


def test_vdnn_swaps_the_inputs_of_convolutions_and_only_them(step):
    g, peak = step
    p = baselines.vdnn(g, peak, SPEC)
    conv_inputs = {t for op in g.ops if op.type == "Conv2D" for t in op.inputs
                   if g.tensor(t).kind in ("activation", "input")}
    swapped = {s.tensor for s in p.swaps}
    assert swapped and swapped <= conv_inputs
    # Every conv input read again in the backward pass is swapped.
    reread = {t for t in conv_inputs if any(g.ops[c].phase == "backward"
                                            for c in g.tensor(t).consumers)}
    assert reread <= swapped
    assert all(s.kind == "round_trip" for s in p.swaps)
    # Prefetch one layer ahead: a swap-in starts before its consumer, after its swap-out.
    pos = {n: k for k, n in enumerate(p.schedule)}
    for s in p.swaps:
        assert pos[s.out_after] <= pos[s.in_after] < min(pos[c] for c in s.consumers)


def test_tflms_swaps_only_gaps_wider_than_n_and_swaps_in_k_levels_ahead(step):
    g, peak = step
    n, k = 6, 2
    p = baselines.tflms(g, peak, SPEC, n_levels=n, k_levels=k)
    assert p.planner == f"baseline.tflms(N={n},K={k})"
    level = topological_levels(g)
    assert p.swaps
    for s in p.swaps:
        first = min(s.consumers, key=lambda c: p.schedule.index(c))
        gap = level[g.op_id(first)] - level[g.op_id(s.out_after)]
        assert gap > n
        trigger_level = level[g.op_id(s.in_after)]
        assert trigger_level <= level[g.op_id(first)] - k or s.in_after == s.out_after
    # A larger N swaps fewer tensors.
    wider = baselines.tflms(g, peak, SPEC, n_levels=4 * n, k_levels=k)
    assert len(wider.swaps) < len(p.swaps)


def test_tflms_tunes_n_and_k_to_fit(step):
    g, peak = step
    budget = int(peak * 0.8)
    p = baselines.tflms(g, budget, SPEC)
    assert _live_peak(g, p) <= budget
    with pytest.raises(ValueError, match="n_levels"):
        baselines.tflms(g, budget, SPEC, n_levels=-1)


def _chain(times_s, nbytes, link_bytes_per_s=None):
    """x -> f1 -> f2 -> f3 -> loss -> b3 -> b2 -> b1; b_i reads a_i, so a1's gap is
    the longest.  All activations ``nbytes``."""
    ops = [Op("x", "Placeholder", phase="forward")]
    tensors = [Tensor("x:0", nbytes, kind="input")]
    prev = "x:0"
    for i in (1, 2, 3):
        ops.append(Op(f"f{i}", "Conv2D", (prev,), time_s=times_s, phase="forward"))
        tensors.append(Tensor(f"f{i}:0", nbytes))
        prev = f"f{i}:0"
    ops.append(Op("loss", "Loss", (prev,), time_s=times_s, phase="forward"))
    tensors.append(Tensor("loss:0", nbytes, kind="gradient"))
    grad = "loss:0"
    for i in (3, 2, 1):
        ops.append(Op(f"b{i}", "Conv2DBackpropInput", (grad, f"f{i}:0"), time_s=times_s,
                      phase="backward"))
        tensors.append(Tensor(f"b{i}:0", nbytes, kind="gradient"))
        grad = f"b{i}:0"
    return DataflowGraph.build(ops, tensors)


def test_capuchin_swaps_the_tensor_with_the_most_free_time_first():
    g = _chain(times_s=0.05, nbytes=64 * MB)
    peak = baselines.ideal(g, 1, SPEC).prediction.peak_bytes
    p = baselines.capuchin(g, peak - 32 * MB, SPEC)
    assert [(s.tensor, s.kind) for s in p.swaps] == [("f1:0", "round_trip")]
    assert _live_peak(g, p) <= peak - 32 * MB
    # Copies this slow leave no free time: Capuchin recomputes instead, by MSPS.
    slow = replace(SPEC, h2d_bytes_per_s=1e8, d2h_bytes_per_s=1e8, duplex_bytes_per_s=2e8)
    r = baselines.capuchin(g, peak - 32 * MB, slow)
    assert [s.kind for s in r.swaps] == ["recompute"]
    result = simulate(g, r, slow)
    assert result.peak_bytes <= peak - 32 * MB
    recomputed = g.op(r.swaps[0].tensor.rpartition(":")[0]).time_s
    assert result.step_time_s == pytest.approx(result.ideal_time_s + recomputed)
    assert Plan.from_json(r.to_json()) == r
    no_rec = baselines.capuchin(g, peak - 32 * MB, slow, recompute=False)
    assert no_rec.swaps and {s.kind for s in no_rec.swaps} == {"round_trip"}
    assert no_rec.prediction.step_time_s > result.step_time_s


def test_recompute_only_moves_nothing_and_pays_in_compute():
    g = _chain(times_s=0.05, nbytes=64 * MB)
    peak = baselines.ideal(g, 1, SPEC).prediction.peak_bytes
    # Capuchin swaps here (the link hides the copy); recomputation alone does not.
    r = baselines.recompute_only(g, peak - 32 * MB, SPEC)
    assert {s.kind for s in r.swaps} == {"recompute"} and r.planner == "baseline.recompute"
    result = simulate(g, r, SPEC)
    assert result.peak_bytes <= peak - 32 * MB
    assert result.d2h_bytes == result.h2d_bytes == 0
    recomputed = sum(g.op(s.tensor.rpartition(":")[0]).time_s for s in r.swaps)
    assert result.step_time_s == pytest.approx(result.ideal_time_s + recomputed)
    # What recomputation cannot free (every forward output dropped at once would
    # leave no inputs to recompute from) is refused with what it still needs.
    with pytest.raises(Infeasible, match="recompute: the step still needs") as err:
        baselines.recompute_only(g, peak // 3, SPEC)
    assert err.value.need_bytes > peak // 3


def test_recompute_swap_validation():
    with pytest.raises(ValueError, match="in_wait_for"):
        Swap("a:0", out_after="f", in_after="", in_wait_for=("b:0",), consumers=("h",),
             kind="recompute")
    # An earlier remake position, where it shares ops with another recomputation.
    assert Swap("a:0", out_after="f", in_after="g", consumers=("h",),
                kind="recompute").in_after == "g"
    with pytest.raises(ValueError, match="consumers"):
        Swap("a:0", out_after="f", in_after="", consumers=(), kind="recompute")
    v2 = Plan(schedule=("a",)).to_json().replace('"format_version": 3', '"format_version": 2')
    assert Plan.from_json(v2) == Plan(schedule=("a",))


def test_odswap_evicts_least_recently_used_and_fits_its_pool(step):
    g, peak = step
    budget = int(peak * 0.6)
    p = baselines.odswap(g, budget, SPEC)
    assert p.allocation.total_bytes <= budget
    assert p.swaps
    assert p.planner == "baseline.odswap"


def test_genetic_search_is_at_least_as_fast_as_every_baseline_that_fits():
    g = layered_training_step(120, seed=5)
    cg = CompiledGraph.build(g)
    peak = baselines.ideal(g, 1, SPEC, compiled=cg).prediction.peak_bytes
    budget = int(peak * 0.7)
    ga = ga_plan(g, budget, SPEC, compiled=cg, config=SearchConfig(
        max_generations=15, time_budget_s=None, workers=1, seed=0)).plan
    assert simulate(g, ga, SPEC).peak_bytes <= budget
    fitted = 0
    for name, policy in BASELINES.items():
        if name == "ideal":
            continue
        try:
            p = policy(g, budget, SPEC, compiled=cg, memory="pool")
        except Infeasible:
            continue
        fitted += 1
        assert ga.prediction.step_time_s <= p.prediction.step_time_s * (1 + 1e-9), name
    assert fitted >= 1


def test_bad_arguments_say_what_to_do(step):
    g, peak = step
    with pytest.raises(ValueError, match="positive int"):
        baselines.capuchin(g, 0, SPEC)
    with pytest.raises(TypeError, match="DeviceSpec"):
        baselines.vdnn(g, peak, "v100")
    with pytest.raises(ValueError, match="'conv' or 'all'"):
        baselines.vdnn(g, peak, SPEC, layers="every")
    with pytest.raises(ValueError, match="memory"):
        baselines.ideal(g, peak, SPEC, memory="bfc")


def test_recompute_only_skips_a_buffer_written_in_place_since_its_producer():
    """f1's buffer is overwritten in place by r1 (a ReLU, not recomputable) before
    its longest gap: running f1 again would not make the value b1 reads (a CNN's
    gradient Tile, then its ReluGrad in the same buffer: the rewrite refused it)."""
    nbytes, t = 64 * MB, 0.05
    ops = [Op("x", "Placeholder", phase="forward"),
           Op("f1", "Conv2D", ("x:0",), time_s=t, phase="forward"),
           Op("r1", "Relu", ("f1:0",), time_s=t, phase="forward"),
           Op("f2", "Conv2D", ("r1:0",), time_s=t, phase="forward"),
           Op("f3", "Conv2D", ("f2:0",), time_s=t, phase="forward"),
           Op("loss", "Loss", ("f3:0",), time_s=t, phase="forward"),
           Op("b3", "Conv2DBackpropInput", ("loss:0", "f3:0"), time_s=t, phase="backward"),
           Op("b2", "Conv2DBackpropInput", ("b3:0", "f2:0"), time_s=t, phase="backward"),
           Op("b1", "Conv2DBackpropInput", ("b2:0", "r1:0", "x:0"), time_s=t,
              phase="backward")]
    tensors = [Tensor("x:0", nbytes, kind="input"), Tensor("f1:0", nbytes),
               Tensor("r1:0", nbytes, alias_of="f1:0"), Tensor("f2:0", nbytes),
               Tensor("f3:0", nbytes), Tensor("loss:0", nbytes, kind="gradient"),
               Tensor("b3:0", nbytes, kind="gradient"), Tensor("b2:0", nbytes, kind="gradient"),
               Tensor("b1:0", nbytes, kind="gradient")]
    g = DataflowGraph.build(ops, tensors)
    peak = baselines.ideal(g, 1, SPEC).prediction.peak_bytes
    allowed = frozenset(op.name for op in g.ops if op.name != "r1")
    for recomputable in (allowed, None):
        try:
            plan = baselines.recompute_only(g, peak - 32 * MB, SPEC, recomputable=recomputable)
        except Infeasible:
            continue
        assert not [s for s in plan.swaps if s.kind == "recompute"
                    and s.tensor in ("f1:0", "r1:0")], plan.swaps

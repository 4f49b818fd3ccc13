"""The genetic operators of SwapAdvisor §5 (tfswap.core.genetics)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfswap.core import allocation as al
from tfswap.core import genetics as ge
from tfswap.core.graph import DataflowGraph, Op, Tensor
from tfswap.core.native import schedule_ops
from research.synthetic import layered_training_step, random_dag

MB = 1 << 20
SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def fig4_graph() -> DataflowGraph:
    """Five nodes (ids 1..5 in the paper, 0..4 here): 2 -> 3, 1 -> 5, 4 -> 5."""
    def op(i, *ins):
        return Op(f"n{i}", "Op", tuple(f"n{j}:0" for j in ins), time_s=1e-3)
    ops = [op(1), op(2), op(3, 2), op(4), op(5, 1, 4)]
    return DataflowGraph.build(ops, [Tensor(f"n{i}:0", MB) for i in range(1, 6)])


def test_fig4_schedule_crossover_worked_example():
    dag = ge.Precedence.of(fig4_graph())
    sch1 = np.array([1, 2, 3, 4, 5]) - 1
    sch2 = np.array([2, 3, 4, 1, 5]) - 1
    assert dag.is_topological(sch1) and dag.is_topological(sch2)
    c1, c2 = ge.crossover_schedules(sch1, sch2, np.random.default_rng(0), cut=3)
    # SCH_C1 = SCH2[1..3] = [2, 3, 4], then 1 and 5 in SCH1's order.
    assert (c1 + 1).tolist() == [2, 3, 4, 1, 5]
    assert (c2 + 1).tolist() == [1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="cut"):
        ge.crossover_schedules(sch1, sch2, np.random.default_rng(0), cut=5)


def dags(draw_seed, n_ops):
    return random_dag(np.random.default_rng(draw_seed), n_ops=n_ops)


@SETTINGS
@given(seed=st.integers(0, 10**6), n_ops=st.integers(1, 40), p=st.floats(0.0, 1.0))
def test_schedule_operators_give_topological_orders(seed, n_ops, p):
    g = dags(seed, n_ops)
    dag = ge.Precedence.of(g)
    rng = np.random.default_rng(seed)
    a, b = ge.random_schedule(dag, rng), ge.random_schedule(dag, rng)
    assert dag.is_topological(a) and dag.is_topological(b)
    for child in ge.crossover_schedules(a, b, rng):
        assert dag.is_topological(child)
    assert dag.is_topological(ge.mutate_schedule(a, dag, p, rng))
    assert dag.is_topological(ge.memory_greedy_schedule(g, dag))
    assert dag.is_topological(ge.memory_greedy_schedule(g, dag, tie_break=b))


@SETTINGS
@given(seed=st.integers(0, 10**6), n_ops=st.integers(1, 40), p=st.floats(0.0, 1.0))
def test_native_mutation_equals_reference_for_the_same_draws(seed, n_ops, p):
    g = dags(seed, n_ops)
    dag = ge.Precedence.of(g)
    rng = np.random.default_rng(seed + 1)
    sched = ge.random_schedule(dag, rng)
    draw, pick = rng.random(dag.n_ops), rng.random(dag.n_ops)
    ref = ge.mutate_schedule_reference(sched, dag, p, draw, pick)
    fast = schedule_ops.mutate(sched, dag.indegree, dag.succ_start, dag.succ, p, draw, pick)
    assert fast.tolist() == ref.tolist()
    # mutate_schedule draws exactly these arrays from the generator.
    again = np.random.default_rng(seed + 1)
    ge.random_schedule(dag, again)
    assert ge.mutate_schedule(sched, dag, p, again).tolist() == ref.tolist()


def test_native_mutation_on_a_large_step_and_edge_probabilities():
    g = layered_training_step(3000, seed=1)
    dag = ge.Precedence.of(g)
    order = np.asarray(g.topological_order())
    rng = np.random.default_rng(5)
    draw, pick = rng.random(dag.n_ops), rng.random(dag.n_ops)
    for p in (0.0, 0.01, 0.3, 1.0):
        ref = ge.mutate_schedule_reference(order, dag, p, draw, pick)
        fast = schedule_ops.mutate(order, dag.indegree, dag.succ_start, dag.succ, p, draw, pick)
        assert fast.tolist() == ref.tolist()
        assert dag.is_topological(fast)
    # P = 0 replays the schedule; P > 0 moves ops.
    assert ge.mutate_schedule(order, dag, 0.0, rng).tolist() == order.tolist()
    assert ge.mutate_schedule(order, dag, 0.3, rng).tolist() != order.tolist()
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        ge.mutate_schedule(order, dag, 1.5, rng)


def naive_memory_greedy(g, dag, tie_break=None):
    """The definition: scan all ready ops for the least (bytes added, rank)."""
    n = dag.n_ops
    rank = np.arange(n) if tie_break is None else np.argsort(tie_break)
    remaining = [len(t.consumers) for t in g.tensors]
    produced = [0] * n
    reads = [[] for _ in range(n)]
    for i, t in enumerate(g.tensors):
        produced[t.producer] += t.nbytes
        for c in t.consumers:
            reads[c].append(i)
    indeg = dag.indegree.copy()
    ready = {int(i) for i in np.flatnonzero(indeg == 0)}
    out = []
    while ready:
        def key(o):
            return (produced[o] - sum(g.tensors[t].nbytes for t in reads[o]
                                      if remaining[t] == 1), rank[o])
        op = min(ready, key=key)
        ready.remove(op)
        out.append(op)
        for t in reads[op]:
            remaining[t] -= 1
        for s in dag.succ[dag.succ_start[op]:dag.succ_start[op + 1]]:
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.add(int(s))
    return out


@SETTINGS
@given(seed=st.integers(0, 10**6), n_ops=st.integers(1, 40))
def test_memory_greedy_matches_its_definition(seed, n_ops):
    g = dags(seed, n_ops)
    dag = ge.Precedence.of(g)
    tie = ge.random_schedule(dag, np.random.default_rng(seed))
    assert ge.memory_greedy_schedule(g, dag).tolist() == naive_memory_greedy(g, dag)
    assert ge.memory_greedy_schedule(g, dag, tie).tolist() == naive_memory_greedy(g, dag, tie)


def test_fig5_allocation_crossover_worked_example():
    # Paper (1-based): CLS1 = [1,1,1,1], CNT1 = [4]; CLS2 = [1,2,2,2], CNT2 = [8,1]; CR = 2.
    first, second = ((0, 0, 0, 0), (4,)), ((0, 1, 1, 1), (8, 1))
    c1, c2 = ge.crossover_allocations(first, second, np.random.default_rng(0), cut=2)
    # CLS_C1 = [1,2,1,1] repaired to [1,2,2,2]; CNT_EXT_C1 = [8,1,4,4] -> CNT_C1 = [8,3].
    assert c1 == ((0, 1, 1, 1), (8, 3))
    # CLS_C2 = [1,1,2,2]; CNT_EXT_C2 = [4,4,1,1] -> [4,1].
    assert c2 == ((0, 0, 1, 1), (4, 1))
    ts = (MB, 2 * MB, 3 * MB, 4 * MB)
    # 8 x 1 MB + 3 x 4 MB = 20 MB > 12 MB: repaired inverse-proportionally to [4, 2].
    assert al.repair_counts(al.class_sizes(ts, c1[0]), c1[1], 12 * MB) == (4, 2)
    assert al.repair_counts(al.class_sizes(ts, c2[0]), c2[1], 12 * MB) == (4, 1)


def valid_cls(cls):
    return cls[0] == 0 and all(0 <= b - a <= 1 for a, b in zip(cls, cls[1:]))


cls_lists = st.lists(st.booleans(), min_size=1, max_size=12).map(
    lambda steps: tuple(np.cumsum([0] + [int(s) for s in steps[1:]]).tolist()))


@SETTINGS
@given(a=cls_lists, data=st.data(), seed=st.integers(0, 10**6), p=st.floats(0, 1))
def test_allocation_operators_keep_cls_monotone(a, data, seed, p):
    m = len(a)
    b = data.draw(cls_lists.filter(lambda c: len(c) == m) if m > 1 else st.just(a))
    if len(b) != m:
        b = a
    cnt_a = tuple(data.draw(st.lists(st.integers(0, 50), min_size=max(a) + 1,
                                     max_size=max(a) + 1)))
    cnt_b = tuple(data.draw(st.lists(st.integers(0, 50), min_size=max(b) + 1,
                                     max_size=max(b) + 1)))
    rng = np.random.default_rng(seed)
    for cls, cnt in ge.crossover_allocations((a, cnt_a), (b, cnt_b), rng):
        assert valid_cls(cls) and len(cls) == m and len(cnt) == max(cls) + 1
    moved = ge.mutate_classes(a, p, rng)
    assert valid_cls(moved) and len(moved) == m
    remapped = ge.remap_counts(a, cnt_a, moved)
    assert len(remapped) == max(moved) + 1


def test_cls_mutation_rule():
    rng = np.random.default_rng(0)
    # With P = 1 every entry moves: equal to its predecessor -> up (and the tail with it).
    assert ge.mutate_classes((0, 0, 0), 1.0, rng) == (0, 1, 2)
    # One above its predecessor -> down, tail with it: (0,1,2) -> (0,0,1) -> (0,0,0).
    assert ge.mutate_classes((0, 1, 2), 1.0, rng) == (0, 0, 0)
    assert ge.mutate_classes((0, 1, 1, 2), 0.0, rng) == (0, 1, 1, 2)


@SETTINGS
@given(cnt=st.lists(st.integers(0, 1000), min_size=1, max_size=10),
       seed=st.integers(0, 10**6), p=st.floats(0, 1))
def test_count_mutation_is_gaussian_around_the_count_and_non_negative(cnt, seed, p):
    out = ge.mutate_counts(cnt, p, np.random.default_rng(seed))
    assert len(out) == len(cnt) and min(out) >= 0
    assert ge.mutate_counts(cnt, 0.0, np.random.default_rng(seed)) == tuple(cnt)
    assert out == ge.mutate_counts(cnt, p, np.random.default_rng(seed))  # same draws


def test_count_mutation_spread():
    rng = np.random.default_rng(1)
    samples = np.array([ge.mutate_counts((100,), 1.0, rng, relative_sigma=0.25)[0]
                        for _ in range(4000)])
    assert abs(samples.mean() - 100) < 2 and 22 < samples.std() < 28


@SETTINGS
@given(sizes=st.lists(st.integers(1, 64), min_size=1, max_size=8, unique=True),
       data=st.data(), budget=st.integers(1, 4000))
def test_count_repair_fits_the_budget(sizes, data, budget):
    sizes = sorted(sizes)
    cnt = data.draw(st.lists(st.integers(0, 100), min_size=len(sizes), max_size=len(sizes)))
    out = al.repair_counts(sizes, cnt, budget)
    assert sum(s * c for s, c in zip(sizes, out)) <= budget
    assert all(0 <= o <= c for o, c in zip(out, cnt))


def test_softmax_selection_probabilities_follow_eq1():
    times = np.array([1.0, 1.1, 2.0, np.inf])
    probs = ge.selection_probabilities(times)
    t_norm = np.array([0.0, -0.1, -1.0])
    want = np.exp(t_norm) / np.exp(t_norm).sum()
    assert np.allclose(probs[:3], want) and probs[3] == 0
    # T_best is the best time seen so far, not only in this population.
    probs = ge.selection_probabilities(times[:3], best_time=0.5)
    t_norm = (0.5 - times[:3]) / 0.5
    assert np.allclose(probs, np.exp(t_norm) / np.exp(t_norm).sum())
    # A lower temperature selects harder.
    hot = ge.selection_probabilities(times[:3], temperature=0.1)
    assert hot[0] > probs[0] and hot[2] < 1e-3
    # Single draws follow the probabilities.
    rng = np.random.default_rng(0)
    counts = np.bincount([ge.softmax_select(times, 1, rng)[0] for _ in range(6000)],
                         minlength=4)
    assert counts[3] == 0
    assert np.allclose(counts[:3] / 6000, ge.selection_probabilities(times)[:3], atol=0.02)


def test_softmax_select_distinct_and_infeasible_last():
    rng = np.random.default_rng(0)
    times = np.array([1.0, np.inf, 1.5, np.inf, 1.2])
    got = ge.softmax_select(times, 3, rng)
    assert sorted(got.tolist()) == [0, 2, 4]
    got = ge.softmax_select(times, 4, rng)
    assert len(set(got.tolist())) == 4 and {0, 2, 4} <= set(got.tolist())
    with pytest.raises(ValueError, match="survivors"):
        ge.softmax_select(times, 6, rng)
    with pytest.raises(ValueError, match="temperature"):
        ge.softmax_select(times, 2, rng, temperature=0)


def test_feasible_individuals_whose_chance_underflows_survive_before_infeasible_ones():
    # On a slow link times differ by orders of magnitude: at the search's
    # temperature eq. 1 gives the slow ones a probability of exactly 0.
    rng = np.random.default_rng(0)
    times = np.array([1.0, 400.0, np.inf, 900.0, 1.1])
    p = ge.selection_probabilities(times, temperature=0.05)
    assert (p[[1, 3]] == 0).all()
    assert sorted(ge.softmax_select(times, 3, rng, temperature=0.05).tolist()) == [0, 1, 4]
    got = ge.softmax_select(times, 5, rng, temperature=0.05)
    assert got.tolist()[:4] == [0, 4, 1, 3] and got[4] == 2


def test_a_generation_with_no_feasible_individual_is_drawn_without_weights(recwarn):
    # A tight budget's early generations can hold no feasible individual while the
    # search's best time is known: the draw is uniform, with no NaN weights.
    times = np.full(10, np.inf)
    chosen = ge.softmax_select(times, 4, np.random.default_rng(3), best_time=1.0)
    assert len(set(chosen.tolist())) == 4 and not [w for w in recwarn
                                                   if issubclass(w.category, RuntimeWarning)]

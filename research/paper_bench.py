"""The comparison of SwapAdvisor's Fig. 6 and Capuchin's Table 2, as a library.

For a lowered graph and a memory budget, :func:`compare` runs every policy of
:data:`tfswap.core.baselines.BASELINES` and tfswap's genetic search
(:func:`tfswap.core.search.plan`, a fixed number of generations so the result
does not depend on the machine's speed) and returns one :class:`Outcome` per
policy: simulated step time, samples per second, throughput relative to
ideal, or why it does not fit (or, for a planner that cannot express the
problem, such as a baseline given host-homed parameters, that it is
unsupported).  :func:`fig6` loops over models and batch
sizes and writes a CSV, a Markdown table and a bar chart;
:func:`max_batch` finds the largest batch each policy runs within the budget
at no more than a given slowdown over ideal.  ``benchmarks/paper_fig6.py``,
``benchmarks/max_batch.py`` and ``tfswap bench`` call these.

Example::

    rows = fig6(["rnn_8_2k"], spec="v100-16g-pcie3", generations=10, out_dir="out")
"""

from __future__ import annotations

import csv
import dataclasses
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tfswap.core import planners
from tfswap.core.devices import device_spec
from tfswap.core.infeasible import Infeasible
from tfswap.core.search import SearchConfig

TFSWAP = "tfswap"
# The genetic search with the paper's pool (every object has memory of its own):
# SwapAdvisor as published.  tfswap's own column lets objects share memory and
# is the default planner (the fastest of all of tfswap's, planners.default).
SWAPADVISOR = "swapadvisor"
# tfswap's search without recomputation, the hybrid's swap-only column.
TFSWAP_SWAPS = "tfswap.swaps"
SEARCHES = (SWAPADVISOR, TFSWAP_SWAPS, TFSWAP)   # registry planners that take a SearchConfig
UNSUPPORTED = "unsupported: "      # Outcome.note of a planner that cannot express the problem
POLICIES = planners.BASELINE_NAMES + SEARCHES


@dataclass(frozen=True)
class Outcome:
    """One policy on one model and batch (seconds, bytes); ``step_time_s`` None: it does
    not fit, or the planner cannot express the problem (``note`` says which and why:
    "does not fit: ..." or "unsupported: ...")."""
    model: str
    batch: int
    policy: str
    budget_bytes: int
    ideal_time_s: float
    step_time_s: float | None
    peak_bytes: int | None
    swapped_bytes: int | None
    plan_seconds: float
    note: str = ""

    @property
    def unsupported(self) -> bool:
        """The planner cannot express this problem (not the same as not fitting)."""
        return self.note.startswith(UNSUPPORTED)

    @property
    def samples_per_s(self) -> float | None:
        return None if self.step_time_s is None else self.batch / self.step_time_s

    @property
    def relative(self) -> float | None:
        """Throughput relative to ideal (ideal time / step time)."""
        return None if self.step_time_s is None else self.ideal_time_s / self.step_time_s


def compare(problem, model: str, batch: int, budget_bytes: int, spec, *,
            generations: int = 10, workers: int = 1, seed: int = 0,
            memory: str = "live", policies=POLICIES) -> list[Outcome]:
    """Every planner in ``policies`` (names of :data:`tfswap.core.planners.PLANNERS`) on
    ``problem`` under ``budget_bytes`` (see module doc).

    ``memory``: how the baselines' fit is judged (:mod:`tfswap.core.baselines`),
    and tfswap's default planner's (``allocator`` "exact" for "live", else
    "pool": :func:`tfswap.core.planners.default`); the genetic search's plans
    always fit their size-class pool in the budget: "swapadvisor" with the
    paper's disjoint pool, "tfswap" with a shared one (:mod:`tfswap.core.layout`).
    """
    spec = device_spec(spec) if isinstance(spec, str) else spec
    # The ops back to back: the bound is the same wherever parameters start the step
    # (the ideal baseline, like every baseline, refuses host-homed parameters).
    on_device = dataclasses.replace(problem, params_start_on_host=False)
    ideal_time = planners.run("ideal", on_device, budget_bytes, spec).plan.prediction.ideal_time_s
    config = SearchConfig(max_generations=generations, time_budget_s=None, workers=workers,
                          seed=seed)
    out = []
    for name in policies:
        t0 = time.monotonic()
        options = {"config": config} if name in SEARCHES else {"memory": memory}
        if name == TFSWAP:
            # Judged as the baselines are: by live bytes, what TensorFlow's
            # allocator holds (optimize's default on a GPU), or by the pool.
            options["allocator"] = "exact" if memory == "live" else "pool"
        try:
            res = planners.run(name, problem, budget_bytes, spec, **options)
        except (Infeasible, planners.UnsupportedProblem) as err:
            why = "does not fit: " if isinstance(err, Infeasible) else UNSUPPORTED
            out.append(Outcome(model, batch, name, budget_bytes, ideal_time, None, None, None,
                               time.monotonic() - t0, f"{why}{err}"[:300]))
            continue
        p, note = res.plan, ""
        if res.search is not None:
            note = (f"{p.planner}, {res.search.config.pool_layout} pool "
                    f"{p.allocation.total_bytes} B, {res.search.generations} "
                    f"generations, {res.search.evaluations} simulations")
        elif p.planner.startswith("baseline.tflms"):
            note = p.planner.removeprefix("baseline.")
        pred = p.prediction
        out.append(Outcome(model, batch, name, budget_bytes, ideal_time, pred.step_time_s,
                           pred.peak_bytes, p.swapped_bytes, time.monotonic() - t0, note))
    return out


def read_csv(path: Path) -> list[Outcome]:
    """The outcomes :func:`write_csv` wrote (to redraw the table and the chart)."""
    def num(v, kind):
        return None if v in ("", "None") else kind(v)

    with open(path, newline="") as f:
        return [Outcome(r["model"], int(r["batch"]), r["policy"], int(r["budget_bytes"]),
                        float(r["ideal_time_s"]), num(r["step_time_s"], float),
                        num(r["peak_bytes"], int), num(r["swapped_bytes"], int),
                        float(r["plan_seconds"]), r["note"]) for r in csv.DictReader(f)]


def write_csv(outcomes: list[Outcome], path: Path) -> None:
    fields = list(Outcome.__dataclass_fields__) + ["samples_per_s", "relative"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        for o in outcomes:
            w.writerow({**asdict(o), "samples_per_s": o.samples_per_s, "relative": o.relative})


def markdown(outcomes: list[Outcome], policies=POLICIES) -> str:
    """One row per model and batch: ideal samples/s, then each policy's throughput
    relative to ideal ("OOM": does not fit; "n/a": the planner cannot express the
    problem)."""
    rows: dict[tuple[str, int], dict[str, Outcome]] = {}
    for o in outcomes:
        rows.setdefault((o.model, o.batch), {})[o.policy] = o
    head = ["model", "batch", "ideal GB", "budget GB", "ideal samples/s"] + \
        [p for p in policies if p != "ideal"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (model, batch), by in rows.items():
        ideal, first = by.get("ideal"), next(iter(by.values()))
        cells = [model, str(batch),
                 f"{ideal.peak_bytes / 1e9:.1f}" if ideal and ideal.peak_bytes else "?",
                 f"{first.budget_bytes / 1e9:.1f}", f"{batch / first.ideal_time_s:.1f}"]
        best = max((o.relative for p, o in by.items() if p != "ideal" and o.relative), default=0)
        for p in policies:
            if p == "ideal":
                continue
            o = by.get(p)
            if o is None:
                cells.append("-")
            elif o.relative is None:
                cells.append("n/a" if o.unsupported else "OOM")
            else:
                text = f"{o.relative:.2f}"
                cells.append(f"**{text}**" if o.relative == best else text)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def bar_chart(outcomes: list[Outcome], path: Path, policies=POLICIES) -> bool:
    """Grouped bars of throughput relative to ideal; False if matplotlib is missing."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    shown = [p for p in policies if p != "ideal"]
    groups = list(dict.fromkeys((o.model, o.batch) for o in outcomes))
    value = {(o.model, o.batch, o.policy): o.relative or 0.0 for o in outcomes}
    fig, ax = plt.subplots(figsize=(max(8, 1.1 * len(groups)), 4))
    width = 0.8 / len(shown)
    for i, p in enumerate(shown):
        xs = [g + i * width for g in range(len(groups))]
        ax.bar(xs, [value.get((m, b, p), 0.0) for m, b in groups], width, label=p)
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))])
    ax.set_xticklabels([f"{m}\nb{b}" for m, b in groups], fontsize=7)
    ax.set_ylabel("throughput / ideal (0 = does not fit)")
    ax.set_ylim(0, 1.05)
    ax.legend(fontsize=7, ncol=4)
    budget = outcomes[0].budget_bytes if outcomes else 0
    ax.set_title(f"Simulated throughput relative to ideal (analytic profile, budget "
                 f"{budget / 2**30:.3g} GiB)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def progress_cell(o: Outcome) -> str:
    if o.relative is not None:
        return f"{o.policy} {o.relative:.2f}"
    return f"{o.policy} {'n/a' if o.unsupported else 'OOM'}"


def fig6(models, *, spec: str = "v100-16g-pcie3", budget_bytes: int | None = None,
         generations: int = 10, workers: int = 1, out_dir: str | Path = "benchmarks/out",
         cache_dir: str | Path = ".bench_cache", memory: str = "live", batches=None,
         policies=POLICIES, progress=print) -> list[Outcome]:
    """Every policy on ``models`` at their paper batch sizes
    (:data:`research.paper_models.PAPER_BATCHES`, or ``batches``), under ``budget_bytes``
    (default: the device's memory); writes fig6.csv, fig6.md and fig6.png in ``out_dir``."""
    from research import paper_models

    dev = device_spec(spec)
    budget = int(budget_bytes or dev.memory_bytes)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    outcomes = []
    for model in models:
        for batch in (batches or paper_models.PAPER_BATCHES[model]):
            try:
                problem = paper_models.lowered(model, batch, spec, cache_dir)
            except RuntimeError as err:  # a model that cannot be built here: say so, go on
                if progress:
                    progress(f"{model} b{batch}: not built: {str(err)[-500:]}")
                continue
            rows = compare(problem, model, batch, budget, dev, generations=generations,
                           workers=workers, memory=memory, policies=policies)
            outcomes += rows
            if progress:
                progress(f"{model} b{batch}: " + ", ".join(
                    progress_cell(o) for o in rows))
            write_csv(outcomes, out_dir / "fig6.csv")
            (out_dir / "fig6.md").write_text(markdown(outcomes, policies) + "\n")
            bar_chart(outcomes, out_dir / "fig6.png", policies)
    return outcomes


def max_batch(model: str, *, spec: str = "v100-16g-pcie3", budget_bytes: int | None = None,
              slowdown: float = 2.0, start: int = 16, limit: int = 4096, generations: int = 10,
              workers: int = 1, cache_dir: str | Path = ".bench_cache", memory: str = "live",
              progress=print) -> dict[str, int]:
    """The largest batch (doubling from ``start``, up to ``limit``) at which each policy
    fits ``budget_bytes`` with a step time at most ``slowdown`` x ideal; 0: not even
    ``start``.  A policy is not tried again once a batch fails it."""
    from research import paper_models

    dev = device_spec(spec)
    budget = int(budget_bytes or dev.memory_bytes)
    best = {p: 0 for p in POLICIES if p != "ideal"}
    alive = set(best)
    batch = start
    while alive and batch <= limit:
        problem = paper_models.lowered(model, batch, spec, cache_dir)
        rows = compare(problem, model, batch, budget, dev, generations=generations,
                       workers=workers, memory=memory,
                       policies=["ideal"] + sorted(alive))
        for o in rows:
            if o.policy == "ideal":
                continue
            if o.relative is not None and o.relative >= 1.0 / slowdown:
                best[o.policy] = batch
            else:
                alive.discard(o.policy)
        if progress:
            progress(f"{model} b{batch}: " + ", ".join(
                progress_cell(o) for o in rows))
        batch *= 2
    return best

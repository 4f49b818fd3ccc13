"""``tfswap.optimize``: plan, rewrite and bind a step so it fits a memory budget.

Example::

    import tfswap
    from tfswap.tf import emulate
    emulate.setup()                          # no GPU here: CPU:0 plays the device
    cf = tf.function(train_step).get_concrete_function(x_spec, y_spec)
    fast = tfswap.optimize(cf, memory_budget="12MiB", search_time=30)
    fast(x, y)                               # same results as cf(x, y)
    print(fast.report())
    fast.plan.save("step.plan.json")
    again = tfswap.load_plan("step.plan.json", cf)
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tfswap.core import search as ga
from tfswap.core.budget import BudgetError, parse_budget
from tfswap.core.devices import DeviceSpec, cpu_emulated, device_spec as resolve_spec
from tfswap.core.graph import DataflowGraph
from tfswap.core.plan import Plan, Prediction
from tfswap.core.planner import InfeasibleAllocation, plan_swaps

PROFILES = ("auto", "trace", "isolated", "analytic")


class PlanMismatchError(ValueError):
    """A saved plan was made for a different graph than the one given."""


@dataclass(frozen=True)
class OptimizedFunction:
    """A step rewritten to fit ``budget_bytes``; call it like the original function.

    ``plan``: what runs (schedule, swaps, pool, prediction).  ``graph_def``,
    ``feeds``, ``fetches``: the rewritten graph, to inspect or measure it
    independently (``tfswap.tf.measure.measure(fast.captured, fast.graph_def, inputs)``).
    ``search``: the genetic search's result (history, heuristic time), None
    when nothing had to be searched.
    """

    plan: Plan
    captured: Any
    lowered: Any
    rewritten: Any
    bound: Any
    spec: DeviceSpec
    budget_bytes: int
    device: str
    host: str
    search: ga.SearchResult | None = None
    profile: Any = None
    notes: tuple[str, ...] = ()

    def __call__(self, *args, **kwargs):
        return self.bound(*args, **kwargs)

    @property
    def graph_def(self):
        return self.rewritten.graph_def

    @property
    def feeds(self) -> tuple[str, ...]:
        return self.captured.feeds

    @property
    def fetches(self) -> tuple[str, ...]:
        return self.captured.fetches

    @property
    def graph(self) -> DataflowGraph:
        return self.lowered.graph

    def report(self) -> str:
        """A readable summary: budget, predicted peak and time against ideal, swaps."""
        p, pred = self.plan, self.plan.prediction
        kinds: dict[str, int] = {}
        for s in p.swaps:
            kinds[s.kind] = kinds.get(s.kind, 0) + 1
        lines = [f"tfswap plan {p.id} ({p.planner}) for {self.captured.name} on {self.device}",
                 f"  budget            {_mib(self.budget_bytes)}  (device spec {self.spec.name})"]
        if pred.peak_bytes is not None:
            lines.append(f"  predicted peak    {_mib(pred.peak_bytes)}")
        if pred.step_time_s is not None and pred.ideal_time_s:
            lines.append(f"  predicted time    {pred.step_time_s * 1e3:.2f} ms "
                         f"({pred.step_time_s / pred.ideal_time_s:.3f} x ideal "
                         f"{pred.ideal_time_s * 1e3:.2f} ms)")
        lines.append(f"  swaps             {len(p.swaps)} "
                     f"({', '.join(f'{n} {k}' for k, n in sorted(kinds.items())) or 'none'})")
        if pred.swap_out_bytes is not None:
            lines.append(f"  device -> host    {_mib(pred.swap_out_bytes or 0)}")
            lines.append(f"  host -> device    {_mib(pred.swap_in_bytes or 0)}")
        if self.search is not None:
            s = self.search
            lines.append(f"  search            {s.generations} generations, {s.evaluations} "
                         f"simulations, stopped on {s.stopped_because}; heuristic plan "
                         f"{s.heuristic_time_s * 1e3:.2f} ms")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f} MiB"


def _placement(device: str | None, host: str | None) -> tuple[str, str]:
    from tfswap.tf import emulate

    import tensorflow as tf

    if device is not None or host is not None:
        if device is None or host is None:
            raise ValueError("pass both device and host (e.g. '/device:GPU:0' and "
                             "'/device:CPU:0'), or neither")
        return device, host
    if emulate.is_active():
        return emulate.DEVICE, emulate.HOST
    gpus = tf.config.list_logical_devices("GPU")
    if gpus:
        return gpus[0].name, "/device:CPU:0"
    raise RuntimeError(
        "tfswap found no GPU and the emulated device is not set up. On a machine without "
        "a GPU call tfswap.tf.emulate.setup() before TensorFlow creates its devices (before "
        "building models), or pass device= and host= explicitly.")


def _sample_inputs(captured, seed: int):
    """Inputs of the right shapes and dtypes for profiling runs (never the user's data)."""
    rng = np.random.default_rng(seed)
    values = []
    for arg in captured.args:
        dtype = arg.dtype.as_numpy_dtype
        if arg.dtype.is_floating:
            values.append(rng.standard_normal(arg.shape).astype(dtype))
        else:  # integer ids and labels: zeros are in range for any vocabulary
            values.append(np.zeros(arg.shape, dtype=dtype))
    return values


def _profile(captured, kind: str, spec: DeviceSpec, inputs, device: str, seed: int):
    from tfswap.tf import profile as profiler

    import tensorflow as tf

    if kind == "analytic":
        return profiler.analytic(captured, spec)
    if kind == "isolated":
        return profiler.isolated(captured, device=device)
    feed = list(inputs) if inputs is not None else _sample_inputs(captured, seed)
    try:
        return profiler.trace(captured, feed, device=device)
    except tf.errors.ResourceExhaustedError:
        if kind == "trace":
            raise
        # "auto": the unmodified step does not fit; time each op alone instead.
        return profiler.isolated(captured, device=device)


def pin_parameters(graph: DataflowGraph, resident) -> DataflowGraph:
    """Mark the variables' value tensors unswappable: they stay on the device.

    The rewrite moves activations only; moving a variable's home to the host
    (SwapAdvisor's parameter swapping) is not implemented for TF variables yet.
    """
    pinned = set(resident)
    tensors = [dataclasses.replace(t, swappable=False) if t.name in pinned else t
               for t in graph.tensors]
    return DataflowGraph.build(
        [dataclasses.replace(op, outputs=()) for op in graph.ops],
        [dataclasses.replace(t, producer=-1, consumers=()) for t in tensors])


def optimize(concrete_fn, memory_budget, *, device: str | None = None, host: str | None = None,
             device_spec: str | DeviceSpec | None = None, profile: str = "auto",
             search_time: float = 60.0, seed: int = 0, workers: int | None = None,
             executor=None, mode: str = "joint", inputs=None, safety_margin: float = 0.05,
             progress: bool = False) -> OptimizedFunction:
    """Plan swaps for ``concrete_fn`` so it runs within ``memory_budget`` of device memory.

    ``memory_budget``: bytes (int), a string such as "12GiB", or a fraction
    of the device's memory (float in (0, 1]).  ``device``/``host``: where the
    step runs and where swapped tensors wait (default: the emulated device if
    set up, else the first GPU and CPU:0).  ``device_spec``: the device's
    figures for the simulator (default "cpu-emulated" on the emulated device;
    required on a GPU unless ``profile`` measures it, then its link figures
    default to "v100-16g-pcie3").  ``profile``: "trace" (run the step),
    "isolated" (time each op alone; for steps that do not fit), "analytic"
    (roofline from ``device_spec``), or "auto" (trace, else isolated).
    ``search_time``: seconds of genetic search.  ``seed``: the search's seed
    (same seed, same workers: same plan).  ``workers`` / ``executor``: local
    processes, or a ``concurrent.futures.Executor`` (e.g. Dask's).  ``mode``:
    "joint", "schedule" or "allocation" (ablations).  ``inputs``: sample
    arguments for the traced profile (default: random of the right shape).
    ``safety_margin``: fraction of the budget kept free for what the memory
    model does not see (kernel workspaces TF allocates outside the profile).

    Returns an :class:`OptimizedFunction`.  If the step already fits, it has
    no swaps and its report says so.
    """
    from tfswap.tf import capture as capture_mod
    from tfswap.tf import ir, rewrite, runtime

    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
    if not 0.0 <= safety_margin < 1.0:
        raise ValueError(f"safety_margin must be a fraction in [0, 1), got {safety_margin!r}")
    if not (isinstance(search_time, (int, float)) and search_time > 0):
        raise ValueError(f"search_time must be > 0 seconds, got {search_time!r}")
    device, host = _placement(device, host)
    captured = capture_mod.capture(concrete_fn, device=device)
    spec = _spec_for(device_spec, device)
    budget = parse_budget(memory_budget, spec.memory_bytes)

    started = time.perf_counter()
    prof = _profile(captured, profile, spec, inputs, device, seed)
    lowered = ir.lower(captured, prof)
    graph = pin_parameters(lowered.graph, lowered.resident)
    keep = tuple(lowered.fetches) + tuple(lowered.assigned)
    schedule = lowered.schedule()
    planner_budget, outside = _planner_budget(budget, lowered, safety_margin)
    notes = [f"profile: {prof.source}, {time.perf_counter() - started:.1f} s"]

    unconstrained = plan_swaps(graph, 1 << 62, spec, schedule=schedule, keep=keep)
    if unconstrained.prediction.peak_bytes <= planner_budget:
        plan = dataclasses.replace(unconstrained, budget_bytes=budget, planner="tfswap.no-swap")
        notes.append("the step already fits the budget: no swaps")
        result = None
    else:
        config = ga.SearchConfig(time_budget_s=float(search_time), seed=seed, workers=workers,
                                 executor=executor, mode=mode, progress=progress)
        try:
            result = ga.plan(graph, planner_budget, spec, config=config,
                             initial_schedule=schedule, keep=keep)
        except (ValueError, InfeasibleAllocation) as err:
            raise BudgetError(
                f"memory_budget {memory_budget!r} ({budget} bytes) is below what this step "
                f"needs at once: {err}. The smallest budget that can work is about "
                f"{_minimum_budget(graph, spec, schedule, keep, outside, safety_margin)} "
                "bytes.") from err
        plan = dataclasses.replace(result.plan, budget_bytes=budget)
    plan = dataclasses.replace(
        plan, graph_fingerprint=capture_mod.fingerprint(captured),
        prediction=_with_outside(plan.prediction, outside))
    return _bind(captured, lowered, plan, spec, budget, device, host, result, prof, notes)


def _spec_for(device_spec, device: str) -> DeviceSpec:
    if device_spec is not None:
        return resolve_spec(device_spec)
    if "CPU" in device.upper():
        return cpu_emulated()
    return resolve_spec("v100-16g-pcie3")


def _planner_budget(budget: int, lowered, safety_margin: float) -> tuple[int, int]:
    """Bytes the planner may use, and the device bytes it does not see.

    Variables that the step never reads are not in the graph but live on the
    device; the planner sees every variable the step reads (as resident
    buffers).
    """
    seen = sum(lowered.graph.tensor(t).nbytes for t in _roots(lowered))
    outside = max(0, lowered.variable_bytes - seen)
    usable = int(budget * (1.0 - safety_margin)) - outside
    if usable <= 0:
        raise BudgetError(f"memory_budget of {budget} bytes does not even hold the step's "
                          f"variables ({lowered.variable_bytes} bytes); raise it")
    return usable, outside


def _roots(lowered) -> set[str]:
    from tfswap.core import liveness

    return {liveness.buffer_root(lowered.graph, t) for t in lowered.resident}


def _with_outside(prediction: Prediction, outside: int) -> Prediction:
    if prediction.peak_bytes is None:
        return prediction
    return dataclasses.replace(prediction, peak_bytes=prediction.peak_bytes + outside)


def _minimum_budget(graph, spec, schedule, keep, outside, safety_margin) -> int:
    """Bisect the smallest planner budget the default plan accepts."""
    lo, hi = 1, plan_swaps(graph, 1 << 62, spec, schedule=schedule, keep=keep
                           ).prediction.peak_bytes
    while hi - lo > max(1, hi // 200):
        mid = (lo + hi) // 2
        try:
            plan_swaps(graph, mid, spec, schedule=schedule, keep=keep)
            hi = mid
        except (ValueError, InfeasibleAllocation):
            lo = mid
    return int((hi + outside) / (1.0 - safety_margin)) + 1


def _bind(captured, lowered, plan, spec, budget, device, host, result, prof, notes):
    from tfswap.tf import rewrite, runtime

    rewritten = rewrite.rewrite(captured, plan, device, host)
    bound = runtime.bind(captured, rewritten.graph_def)
    return OptimizedFunction(plan=plan, captured=captured, lowered=lowered, rewritten=rewritten,
                             bound=bound, spec=spec, budget_bytes=budget, device=device,
                             host=host, search=result, profile=prof, notes=tuple(notes))


def load_plan(path: str | Path, concrete_fn, *, device: str | None = None,
              host: str | None = None, device_spec: str | DeviceSpec | None = None
              ) -> OptimizedFunction:
    """Apply a plan saved with ``plan.save(path)`` to ``concrete_fn`` without searching.

    Raises :class:`PlanMismatchError` if the plan was made for another graph
    (a different model, batch shape or TensorFlow version).
    """
    from tfswap.tf import capture as capture_mod
    from tfswap.tf import ir

    plan = Plan.load(path)
    device, host = _placement(device, host)
    captured = capture_mod.capture(concrete_fn, device=device)
    found = capture_mod.fingerprint(captured)
    if plan.graph_fingerprint and plan.graph_fingerprint != found:
        raise PlanMismatchError(
            f"the plan in {path} was made for another graph (fingerprint "
            f"{plan.graph_fingerprint}, this function's is {found}): a different model, batch "
            "shape or TensorFlow version. Re-plan with tfswap.optimize and save again.")
    lowered = ir.lower(captured, None)
    spec = _spec_for(device_spec, device)
    budget = plan.budget_bytes or spec.memory_bytes
    return _bind(captured, lowered, plan, spec, budget, device, host, None, None,
                 [f"plan loaded from {path}"])


__all__ = ["OptimizedFunction", "PlanMismatchError", "load_plan", "optimize", "pin_parameters"]

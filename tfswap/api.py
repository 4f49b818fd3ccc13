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
from tfswap.core.compiled import CompiledGraph
from tfswap.core.devices import DeviceSpec, cpu_emulated, device_spec as resolve_spec
from tfswap.core.graph import DataflowGraph
from tfswap.core.plan import Plan, PlanFormatError, Prediction
from tfswap.core.planner import InfeasibleAllocation, plan_swaps

PROFILES = ("auto", "trace", "isolated", "analytic")


class PlanMismatchError(ValueError):
    """A saved plan was made for a different graph than the one given."""


class NoDeviceError(RuntimeError):
    """Neither a GPU nor the emulated device is there to run the step on."""


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
    measured_peak_bytes: int | None = None   # when optimize verified the plan by running it

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

    @property
    def keep(self) -> tuple[str, ...]:
        """Tensors live to the end of the step (outputs, assigned variables)."""
        return tuple(self.lowered.fetches) + tuple(self.lowered.assigned)

    def report(self) -> str:
        """A readable table: budget, predicted peak and time against ideal, swaps, search.

        Example::

            print(fast.report())
        """
        from tfswap import report

        name = self.captured.name
        name = name.decode() if isinstance(name, bytes) else name
        return report.summary(
            self.plan, search=self.search, graph=self.graph,
            title=f"tfswap plan {self.plan.id} ({self.plan.planner}) for {name} on "
                  f"{self.device} (device spec {self.spec.name})",
            budget_bytes=self.budget_bytes, measured_peak_bytes=self.measured_peak_bytes,
            notes=self.notes)

    def timeline(self):
        """The plan simulated on this step's graph: :class:`tfswap.report.Timeline`."""
        from tfswap import report

        return report.simulate_timeline(pin_parameters(self.graph, self.lowered.resident),
                                        self.plan, self.spec, keep=self.keep)

    def to_chrome_trace(self, path: str | Path) -> Path:
        """Write the simulated step (compute, H2D, D2H tracks, device memory) as a
        Chrome trace; open it in ui.perfetto.dev or chrome://tracing.

        Example::

            fast.to_chrome_trace("step.trace.json")
        """
        from tfswap import report

        return report.write_chrome_trace(path, self.timeline())

    def plot_memory(self, path: str | Path) -> Path:
        """Write a PNG of simulated device memory over the step against the budget.
        Needs matplotlib (``pip install tfswap[plot]``).

        Example::

            fast.plot_memory("step.memory.png")
        """
        from tfswap import report

        return report.plot_memory(path, self.timeline(), budget_bytes=self.budget_bytes)


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
    raise NoDeviceError(
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
    """Mark the device variables' value tensors (``resident``) unswappable.

    A variable the user created on the device stays there.  One created in
    host memory (under ``tf.device(host)``) is read on the host; each read is
    a parameter the plan fetches before its first use on the device.  Every
    plan here is made with ``params_start_on_host=True``: TensorFlow keeps no
    device copy of a host variable between steps, so none can start resident.
    """
    pinned = set(resident)
    tensors = [dataclasses.replace(t, swappable=False) if t.name in pinned else t
               for t in graph.tensors]
    return DataflowGraph.build(
        [dataclasses.replace(op, outputs=()) for op in graph.ops],
        [dataclasses.replace(t, producer=-1, consumers=()) for t in tensors])


SMALLEST_SMALL_BYTES = 4 << 10   # the default small-tensor threshold's floor
# Sessions the rewritten step is measured in before optimize returns it (emulated device).
VERIFY_SESSIONS = 2


def _small_threshold(step_peak_bytes: int) -> int:
    """Default small-tensor threshold: 1/1024 of the step's no-swap peak, 4 KiB to 1 MiB."""
    return int(min(1 << 20, max(SMALLEST_SMALL_BYTES, step_peak_bytes // 1024)))


@dataclass(frozen=True)
class _Stage:
    """The lowered step as the planner sees it, at one small-tensor threshold."""

    lowered: Any
    graph: DataflowGraph
    keep: tuple[str, ...]
    schedule: tuple[str, ...]
    small: int
    unconstrained: Plan   # TF's order, no memory limit

    @classmethod
    def lower(cls, captured, prof, spec: DeviceSpec, small: int) -> "_Stage":
        from tfswap.tf import ir

        lowered = ir.lower(captured, prof, small_bytes=small)
        graph = pin_parameters(lowered.graph, lowered.resident)
        keep = tuple(lowered.fetches) + tuple(lowered.assigned)
        schedule = tuple(lowered.schedule())
        unconstrained = plan_swaps(graph, 1 << 62, spec, schedule=schedule, keep=keep,
                                   small_threshold_bytes=small, params_start_on_host=True)
        return cls(lowered, graph, keep, schedule, small, unconstrained)


def optimize(concrete_fn, memory_budget, *, device: str | None = None, host: str | None = None,
             device_spec: str | DeviceSpec | None = None, profile: str = "auto",
             search_time: float = 60.0, generations: int | None = None, seed: int = 0,
             workers: int | None = None,
             executor=None, mode: str = "joint", inputs=None, safety_margin: float = 0.05,
             small_tensor_bytes: int | None = None, verify_rounds: int = 3,
             pool_layout: str = "shared", byte_planner: bool = False,
             progress: bool = False) -> OptimizedFunction:
    """Plan swaps for ``concrete_fn`` so it runs within ``memory_budget`` of device memory.

    ``memory_budget``: bytes (int), a string such as "12GiB", or a fraction
    of the device's memory (float in (0, 1]).  ``device``/``host``: where the
    step runs and where swapped tensors wait (default: the emulated device if
    set up, else the first GPU and CPU:0).  Variables stay where they live:
    a model and optimizer created under ``tf.device(host)`` keep their
    parameters and optimizer state in host memory, and the plan fetches each
    read before its use on the device (SwapAdvisor's parameter swapping; the
    updates run on the host).  ``device_spec``: the device's
    figures for the simulator (default "cpu-emulated" on the emulated device;
    required on a GPU unless ``profile`` measures it, then its link figures
    default to "v100-16g-pcie3").  ``profile``: "trace" (run the step),
    "isolated" (time each op alone; for steps that do not fit), "analytic"
    (roofline from ``device_spec``), or "auto" (trace, else isolated).
    ``search_time``: seconds of genetic search; ``generations``: stop after
    this many generations instead (then the same seed gives the same plan on
    any machine; a time limit depends on the machine's speed).  ``seed``: the
    search's seed.  ``workers`` / ``executor``: local
    processes, or a ``concurrent.futures.Executor`` (e.g. Dask's).  ``mode``:
    "joint", "schedule" or "allocation" (ablations).  ``inputs``: sample
    arguments for the traced profile (default: random of the right shape).
    ``safety_margin``: fraction of the budget kept free for what the memory
    model does not see (kernel workspaces TF allocates outside the profile).
    ``small_tensor_bytes``: tensors below this live in a small pool and are
    never swapped (default: 1/1024 of the step's no-swap device peak, between
    4 KiB and 1 MiB, so that small models still have tensors worth moving;
    if no plan fits with it, 4 KiB).
    ``pool_layout``: "shared" (pool objects never in use together share
    memory, so fewer tensors move) or "disjoint" (every object has memory of
    its own, SwapAdvisor's pool; needs more memory, but its allocator never
    depends on the run following the plan's order).  Where the peak is
    verified, a shared plan that measures over the budget is re-planned with
    the disjoint pool, whose rounding leaves room for what the model misses.
    ``byte_planner``: with the shared layout, also try the byte-cap planner
    (:mod:`tfswap.core.byte_planner`), which moves far less on steps several
    times the device; off by default (see ``SearchConfig.byte_planner``).
    ``verify_rounds``: where the device's peak can be measured (the emulated
    device), the rewritten step is measured (3 runs in each of 2 sessions) and,
    if it needs more than the budget, planned again with the excess taken off,
    up to this many times (0: trust the model).

    Returns an :class:`OptimizedFunction`.  If the step already fits, it has
    no swaps and its report says so.
    """
    from tfswap.tf import capture as capture_mod

    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
    if pool_layout not in ga.POOL_LAYOUTS:
        raise ValueError(f"pool_layout must be one of {ga.POOL_LAYOUTS}, got {pool_layout!r}")
    if not 0.0 <= safety_margin < 1.0:
        raise ValueError(f"safety_margin must be a fraction in [0, 1), got {safety_margin!r}")
    if not (isinstance(search_time, (int, float)) and search_time > 0):
        raise ValueError(f"search_time must be > 0 seconds, got {search_time!r}")
    device, host = _placement(device, host)
    captured = capture_mod.capture(concrete_fn, device=device)
    spec = _spec_for(device_spec, device)
    budget = parse_budget(memory_budget, spec.memory_bytes)
    _warn_legacy_random(captured)

    if small_tensor_bytes is not None and (isinstance(small_tensor_bytes, bool) or not
                                           isinstance(small_tensor_bytes, int)
                                           or small_tensor_bytes < 0):
        raise ValueError(f"small_tensor_bytes must be an int >= 0 (bytes), got "
                         f"{small_tensor_bytes!r}")
    threshold_given = small_tensor_bytes is not None
    minimum_before = float("inf")   # the smallest budget at the default threshold, if tried
    started = time.perf_counter()
    prof = _profile(captured, profile, spec, inputs, device, seed)
    if small_tensor_bytes is not None:
        stage = _Stage.lower(captured, prof, spec, small_tensor_bytes)
    else:
        # From the step, not the budget: a budget-dependent threshold would
        # make the smallest feasible budget a BudgetError names infeasible
        # again when passed back (other tensors become small).
        # Without a measured peak (analytic, isolated), the unconstrained plan's.
        stage = _Stage.lower(captured, prof, spec, _small_threshold(prof.peak_bytes or 0))
        if not prof.peak_bytes:
            wanted = _small_threshold(stage.unconstrained.prediction.peak_bytes)
            if wanted != stage.small:
                stage = _Stage.lower(captured, prof, spec, wanted)
    lowered, graph, keep, schedule = stage.lowered, stage.graph, stage.keep, stage.schedule
    small_tensor_bytes, unconstrained = stage.small, stage.unconstrained
    if prof.source != "trace":
        _refuse_unsized(captured, lowered, prof.source)
    planner_budget, outside = _planner_budget(budget, lowered, safety_margin)
    notes = [f"profile: {prof.source}, {time.perf_counter() - started:.1f} s"]

    # A traced profile measured the unmodified step: if that is above the
    # budget, the model's "fits" is wrong and the step is planned (and verified).
    measured_over = prof.source == "trace" and (prof.peak_bytes or 0) > budget
    if unconstrained.prediction.peak_bytes <= planner_budget and not measured_over:
        notes.append("the step already fits the budget: no swaps" if not unconstrained.swaps
                     else "the step already fits the budget: it only fetches the host-homed "
                     "variables it reads")
        plan = _finish(dataclasses.replace(unconstrained, planner="tfswap.no-swap"), budget,
                       captured, lowered, outside)
        return _bind(captured, lowered, plan, spec, budget, device, host, None, prof, notes)

    config = ga.SearchConfig(
        time_budget_s=None if generations is not None else float(search_time),
        max_generations=generations, seed=seed, workers=workers, executor=executor,
        mode=mode, progress=progress, pool_layout=pool_layout, byte_planner=byte_planner)
    verify = _measurable(device) and verify_rounds > 0
    feed = list(inputs) if inputs is not None else _sample_inputs(captured, seed)
    rounds = 1 + (verify_rounds if verify else 0)
    attempt = 0
    while attempt < rounds:
        try:
            result = ga.plan(graph, planner_budget, spec, config=config,
                             initial_schedule=schedule, keep=keep,
                             small_threshold_bytes=small_tensor_bytes, params_start_on_host=True)
            found = result.plan
        except (ValueError, InfeasibleAllocation) as err:
            # The search's pools round sizes up to classes; the planner on TF's
            # order with exact sizes is what the named smallest budget is
            # computed from, so a budget at or above it still gets a plan.
            result, found = None, _order_plan(graph, planner_budget, spec, schedule, keep,
                                              small_tensor_bytes)
            if found is None and attempt:
                raise BudgetError(
                    f"memory_budget {budget} bytes: the rewritten step measured "
                    f"{measured.peak_bytes} bytes on the emulated device (more than the memory "
                    f"model predicted), and with that much less room no plan fits. Pass at "
                    f"least about {int(1.05 * measured.peak_bytes) + 1} bytes (what that plan "
                    f"measured, plus 5%), or "
                    f"raise safety_margin. (Planner: {err})") from err
            if found is None and not threshold_given and small_tensor_bytes > SMALLEST_SMALL_BYTES:
                # Tensors under the threshold share one small pool that nothing
                # swaps; at a tight budget that pool is what does not fit.  (Or
                # not: more tensors in size classes can also need more.  The
                # budget named if both fail is the smaller of the two minimums.)
                minimum_before = _minimum_budget(graph, spec, schedule, keep, outside,
                                                 safety_margin, small_tensor_bytes)
                stage = _Stage.lower(captured, prof, spec, SMALLEST_SMALL_BYTES)
                lowered, graph, keep, schedule = (stage.lowered, stage.graph, stage.keep,
                                                  stage.schedule)
                notes.append(f"no plan with tensors under {small_tensor_bytes} B kept in the "
                             f"small pool: planned with {stage.small} B")
                small_tensor_bytes = stage.small
                planner_budget, outside = _planner_budget(budget, lowered, safety_margin)
                continue
            if found is None:
                minimum = min(minimum_before, _minimum_budget(
                    graph, spec, schedule, keep, outside, safety_margin, small_tensor_bytes))
                raise BudgetError(
                    f"memory_budget {memory_budget!r} ({budget} bytes) is below what this step "
                    f"needs at once: {_working_set_text(graph, schedule, keep, small_tensor_bytes)}"
                    f". The smallest budget that can work is about {minimum} bytes "
                    f"({minimum / 2**20:.2f} MiB); pass at least that. (Planner: {err})") from err
            notes.append("the genetic search found no size-class pool within the budget: "
                         "planned on TensorFlow's order with exact sizes")
        plan = _finish(found, budget, captured, lowered, outside)
        optimized = _bind(captured, lowered, plan, spec, budget, device, host, result, prof,
                          notes)
        if not verify:
            return optimized
        from tfswap.tf import measure

        # The worst of 3 runs: how soon a swap-in starts after its trigger depends
        # on the executor's threads, which moves the measured peak below the
        # plan's bound from run to run (fuzz seed 1058: 624656 to 690192 B for
        # one plan predicted at 690204 B).  In 2 sessions: runs within a session
        # agree, sessions need not (fuzz seed 1271's byte-cap plan: 394764 B in
        # the first session, 427532 B in the next four, 443916 B in another run).
        measured = max((measure.measure(captured, optimized.graph_def, feed, runs=3, warmup=1)
                        for _ in range(VERIFY_SESSIONS)), key=lambda m: m.peak_bytes)
        if measured.peak_bytes <= budget:
            if attempt:
                notes.append(f"verified on the emulated device after {attempt} re-plan(s): "
                             f"measured peak {measured.peak_bytes} B <= budget")
            return dataclasses.replace(optimized, notes=tuple(notes),
                                       measured_peak_bytes=measured.peak_bytes)
        excess = measured.peak_bytes - budget
        if config.pool_layout == "shared":
            # A shared arena is packed to the planner's budget, so what the model
            # misses shows at once; the disjoint pool's rounding leaves room for it.
            notes.append(f"measured peak {measured.peak_bytes} B exceeded the budget by "
                         f"{excess} B with the shared pool layout: re-planned with the "
                         "disjoint one")
            config = dataclasses.replace(config, pool_layout="disjoint")
            attempt += 1
            continue
        # The memory model missed what TF did (e.g. an in-place forward that an
        # extra reader prevented): plan again with that much less room.
        notes.append(f"measured peak {measured.peak_bytes} B exceeded the budget by {excess} B; "
                     "re-planned with that much less")
        planner_budget -= excess + budget // 100
        attempt += 1
    raise BudgetError(
        f"after {verify_rounds} re-plans the measured peak ({measured.peak_bytes} B) still "
        f"exceeds memory_budget {budget} B; raise the budget or the safety_margin")


def _warn_legacy_random(captured) -> None:
    """Say that legacy stateful random ops draw a stream of their own here."""
    import warnings

    from tfswap.tf import capture as capture_mod

    found = capture_mod.legacy_random_ops(captured)
    if found:
        warnings.warn(
            f"this step uses {len(found)} legacy stateful random op(s) ({', '.join(found[:3])}"
            f"{' ...' if len(found) > 3 else ''}). Their random stream lives in the kernel of "
            "each function, so the optimized function draws its own stream from the start: its "
            "first call draws what the user's function drew on its first call, not what the "
            "user's function would draw next. For one shared stream use Keras layers (seed "
            "generators), tf.random.Generator or the tf.random.stateless_* ops.",
            RuntimeWarning, stacklevel=3)


def _refuse_unsized(captured, lowered, source: str) -> None:
    """Refuse tensors whose size only the running step knows (e.g. a boolean_mask's
    output): a profile that does not run the whole step would count them as 0 bytes."""
    from tfswap.tf import capture as capture_mod
    from tfswap.tf.shapes import import_with_shapes

    import tensorflow as tf

    unsized = {t.name for t in lowered.graph.tensors if t.nbytes == 0}
    found = [f"{t.name} (shape {t.shape})"
             for op in import_with_shapes(captured, captured.graph_def).get_operations()
             for t in op.outputs
             if t.name in unsized and not t.shape.is_fully_defined()
             and t.dtype not in (tf.resource, tf.variant, tf.string)]
    if found:
        raise capture_mod.CaptureError(
            f"{len(found)} tensor(s) of this step have unknown dimensions, so the {source} "
            f"profile cannot count their bytes: {', '.join(found[:3])}"
            f"{' ...' if len(found) > 3 else ''}. Use profile='trace' (it runs the step once "
            "and measures every tensor; the sizes must not change between steps), or make "
            "the shapes static (e.g. multiply by a mask instead of tf.boolean_mask).")


def _measurable(device: str) -> bool:
    """Whether this machine can measure the device's peak (the emulated device)."""
    from tfswap.tf import emulate

    return emulate.is_active() and device == emulate.DEVICE


def _finish(plan: Plan, budget: int, captured, lowered, outside: int) -> Plan:
    from tfswap.tf import capture as capture_mod

    plan = _tensor_swaps(plan, lowered.graph)
    return dataclasses.replace(plan, budget_bytes=budget,
                               graph_fingerprint=capture_mod.fingerprint(captured),
                               prediction=_with_outside(plan.prediction, outside))


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


def _minimum_budget(graph, spec, schedule, keep, outside, safety_margin, small) -> int:
    """The smallest budget (with 5% headroom) whose planner budget the default plan accepts."""
    lo, hi = 1, plan_swaps(graph, 1 << 62, spec, schedule=schedule, keep=keep,
                           small_threshold_bytes=small,
                           params_start_on_host=True).prediction.peak_bytes
    while hi - lo > max(1, hi // 200):
        mid = (lo + hi) // 2
        try:
            plan_swaps(graph, mid, spec, schedule=schedule, keep=keep,
                       small_threshold_bytes=small, params_start_on_host=True)
            hi = mid
        except (ValueError, InfeasibleAllocation):
            lo = mid
    # 5% headroom: the default schedule is TF's traced order, which varies from
    # run to run, and the bisection is for this run's order only.
    return int(1.05 * (hi + outside) / (1.0 - safety_margin)) + 1


def _order_plan(graph, budget, spec, schedule, keep, small) -> Plan | None:
    """The planner's plan on TF's order with exact sizes, or None if it does not fit."""
    try:
        plan = plan_swaps(graph, budget, spec, schedule=schedule, keep=keep,
                          small_threshold_bytes=small, params_start_on_host=True)
    except (ValueError, InfeasibleAllocation):
        return None
    return dataclasses.replace(plan, planner="tfswap.order")


def _working_set_text(graph, schedule, keep, small) -> str:
    """Which op needs the most device memory at once, and what else is always there."""
    cg = CompiledGraph.build(graph, small, keep)
    per_op = cg.op_working_set()
    k = int(np.argmax(per_op))
    op = graph.ops[k]
    pinned = int(cg.buf_bytes[(cg.buf_pinned & cg.buf_persistent).astype(bool)].sum())
    small_peak = cg.small_pool_peak(cg.order_of(schedule))
    return (f"op {op.name!r} ({op.type}) needs {int(per_op[k])} bytes at once for its inputs, "
            f"outputs and scratch, while the parameters that stay on the device take {pinned} "
            f"bytes and small tensors up to {small_peak} bytes")


def _tensor_swaps(plan: Plan, graph: DataflowGraph) -> Plan:
    """The planner's buffer swaps as swaps of the tensors TensorFlow holds.

    The planner moves buffers; a buffer can hold several tensors in turn (TF
    forwards a dead input's buffer to an op's output) or at once (views, or
    the slices an Unpack or Split makes of one buffer).  Each consumer after
    the gap is sent the copy of the value it actually reads: the member it
    reads, or the member that a chain of views it reads starts from.  A
    member produced after the gap was written by an op that ran on the copy,
    so reading it needs nothing.  One value read: the swap carries it, as
    planned.  Several (slices, or a forward that this schedule breaks
    because a later reader still holds the earlier value): one swap per
    value, each of that value's bytes, and a swap-in that waited for this
    swap-out waits for all of them.
    """
    from tfswap.core import liveness
    from tfswap.tf.rewrite import VIEW_OPS

    position = {name: k for k, name in enumerate(plan.schedule)}
    groups = liveness.buffers(graph)
    swaps, parts_of = [], {}
    for swap in plan.swaps:
        if swap.kind != "round_trip":
            swaps.append(swap)
            continue
        members = {graph.tensors[m].name for m in groups[liveness.buffer_root(graph, swap.tensor)]}
        out_at = position[swap.out_after]
        readers: dict[str, list[str]] = {}
        for consumer in swap.consumers:
            for name in graph.op(consumer).inputs:
                if name not in members or _produced_at(graph, name, position) > out_at:
                    continue
                value = _viewed_value(graph, name, members, VIEW_OPS)
                if consumer not in readers.setdefault(value, []):
                    readers[value].append(consumer)
        if not readers:
            raise RuntimeError(f"swap {swap.id!r}: no consumer after the gap reads a value its "
                               "buffer held before the swap-out; this is a tfswap bug")
        split = len(readers) > 1
        values = sorted(readers, key=lambda v: (_produced_at(graph, v, position),
                                                graph.tensor_id(v)))
        parts = [dataclasses.replace(swap, tensor=v, consumers=tuple(readers[v]),
                                     id=f"{swap.id}|{v}" if split else swap.id,
                                     bytes=graph.tensor(v).nbytes if split else swap.bytes)
                 for v in values]
        parts_of[swap.id] = tuple(p.id for p in parts)
        swaps.extend(parts)
    # A swap-in waiting for a split swap-out waits for every part: the buffer is
    # free only once all its values have left.
    swaps = [dataclasses.replace(s, in_wait_for=tuple(
        i for w in s.in_wait_for for i in parts_of.get(w, (w,)))) for s in swaps]
    return dataclasses.replace(plan, swaps=tuple(swaps))


def _produced_at(graph: DataflowGraph, tensor: str, position: dict) -> int:
    return position[graph.ops[graph.tensor(tensor).producer].name]


def _viewed_value(graph: DataflowGraph, tensor: str, members: set, view_ops) -> str:
    """The member of the buffer whose value ``tensor`` is (through views of it)."""
    while True:
        op = graph.ops[graph.tensor(tensor).producer]
        if op.type not in view_ops or not op.inputs or op.inputs[0] not in members:
            return tensor
        tensor = op.inputs[0]


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

    try:
        plan = Plan.load(path)
    except PlanFormatError as err:
        raise PlanFormatError(f"{path}: {err}") from err
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


__all__ = ["NoDeviceError", "OptimizedFunction", "PlanMismatchError", "load_plan", "optimize", "pin_parameters"]

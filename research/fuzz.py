"""Random TensorFlow training steps, and the property tfswap must hold on them.

:func:`random_step` builds, from a seed, a random DAG of real ops (matmul,
conv, add/mul, relu/tanh/sigmoid, concat/split, reshape + reduce, a
batch-norm-like normalisation) on random shapes, with a few variables and
one SGD step on them, so each graph has a forward and a backward part.
:func:`check` runs one of them through ``tfswap.optimize`` at a random
budget between the smallest feasible one (which a ``BudgetError`` names)
and the unmodified step's measured peak, and compares: the rewritten step
must measure at most the budget and train bit for bit like the captured
step without swaps.  The tests run a few seeds; ``benchmarks/fuzz.py``
runs hundreds.

Example::

    from tfswap.tf import emulate
    from research import fuzz
    emulate.setup()
    outcome = fuzz.check(seed=7)
    outcome.status, outcome.detail      # ("passed", "budget 812345 B ...")
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf

STATUSES = ("passed", "order-sensitive", "fits", "infeasible", "refused", "failed")


@dataclass
class RandomStep:
    """A random step: its ConcreteFunction, a batch, and the variables it updates
    (held here: a ConcreteFunction keeps only weak references to them)."""

    seed: int
    concrete_fn: object
    batch: tuple
    variables: list
    ops: list = field(default_factory=list)     # what was drawn, for the report


def random_step(seed: int, max_ops: int = 12) -> RandomStep:
    """A random training step of up to ``max_ops`` drawn ops (see the module doc)."""
    if max_ops < 1:
        raise ValueError(f"max_ops must be >= 1, got {max_ops}")
    rng = np.random.default_rng(seed)
    batch = int(rng.choice([64, 128, 256]))
    width = int(rng.choice([32, 64, 128]))
    use_image = bool(rng.random() < 0.4)
    variables, drawn = [], []

    def variable(shape):
        init = rng.standard_normal(shape) / np.sqrt(max(1, shape[0] if len(shape) == 2
                                                        else int(np.prod(shape[:-1]))))
        v = tf.Variable(init.astype(np.float32), name=f"v{len(variables)}")
        variables.append(v)
        return v

    # Decide the program first (plain data), then trace it: the same seed
    # always gives the same ops, shapes and variables.
    program = []
    widths = [width]                       # width of each 2-D value, by index
    if use_image:
        channels = int(rng.choice([4, 8]))
        out_channels = int(rng.choice([4, 8]))
        program.append(("conv", channels, out_channels))
        widths.append(8 * 8 * out_channels)
    n_ops = int(rng.integers(max(1, max_ops // 2), max_ops + 1))
    for _ in range(n_ops):
        kind = str(rng.choice(["matmul", "matmul", "unary", "binary", "concat", "split",
                               "reduce", "norm"]))
        a = int(rng.integers(len(widths)))
        if kind == "matmul":
            out = int(rng.choice([32, 64, 128, 256]))
            program.append(("matmul", a, out))
            widths.append(out)
        elif kind == "unary":
            program.append(("unary", a, str(rng.choice(["relu", "tanh", "sigmoid"]))))
            widths.append(widths[a])
        elif kind == "binary":
            same = [k for k, w in enumerate(widths) if w == widths[a]]
            b = int(rng.choice(same))
            program.append(("binary", a, b, str(rng.choice(["add", "mul"]))))
            widths.append(widths[a])
        elif kind == "concat":
            b = int(rng.integers(len(widths)))
            program.append(("concat", a, b))
            widths.append(widths[a] + widths[b])
        elif kind == "split" and widths[a] % 2 == 0:
            program.append(("split", a))
            widths.extend([widths[a] // 2, widths[a] // 2])
        elif kind == "reduce" and widths[a] % 2 == 0:
            program.append(("reduce", a))
            widths.append(widths[a] // 2)
        else:
            program.append(("norm", a))
            widths.append(widths[a])
    drawn.extend(p[0] for p in program)

    weights = {}
    for k, p in enumerate(program):        # variables exist before tracing
        if p[0] == "conv":
            # Forward only, from constants: TF's CPU Conv2DBackpropFilter and
            # Conv2DBackpropInput each keep a fixed ~23-28 MB working set on this
            # machine's CPU, which would make every such graph's peak that one op
            # (no budget below it is feasible).  The rest of the step trains.
            filters = rng.standard_normal((3, 3, p[1], p[2])) / np.sqrt(9 * p[1])
            project = rng.standard_normal((widths[0], 8 * 8 * p[1])) / np.sqrt(widths[0])
            weights[k] = (tf.constant(filters.astype(np.float32)),
                          tf.constant(project.astype(np.float32)))
        elif p[0] == "matmul":
            weights[k] = variable((widths[p[1]], p[2]))
        elif p[0] == "norm":
            weights[k] = variable((1, widths[p[1]]))

    def forward(x):
        values = [x]
        for k, p in enumerate(program):
            op = p[0]
            if op == "conv":
                filters, project = weights[k]
                image = tf.reshape(tf.tanh(tf.matmul(x, project)), (batch, 8, 8, p[1]))
                h = tf.nn.relu(tf.nn.conv2d(image, filters, 1, "SAME"))
                values.append(tf.reshape(h, (batch, -1)))
            elif op == "matmul":
                values.append(tf.matmul(values[p[1]], weights[k]))
            elif op == "unary":
                values.append({"relu": tf.nn.relu, "tanh": tf.tanh,
                               "sigmoid": tf.sigmoid}[p[2]](values[p[1]]))
            elif op == "binary":
                a, b = values[p[1]], values[p[2]]
                values.append(a + b if p[3] == "add" else a * b)
            elif op == "concat":
                values.append(tf.concat([values[p[1]], values[p[2]]], axis=1))
            elif op == "split":
                values.extend(tf.split(values[p[1]], 2, axis=1))
            elif op == "reduce":
                v = values[p[1]]
                values.append(tf.reduce_sum(tf.reshape(v, (batch, -1, 2)), axis=2))
            else:
                v = values[p[1]]
                mean, var = tf.nn.moments(v, axes=[0], keepdims=True)
                values.append((v - mean) * tf.math.rsqrt(var + 1e-3) * weights[k])
        used = {i for p in program for i in p[1:] if isinstance(i, int) and p[0] != "conv"}
        sinks = [v for i, v in enumerate(values) if i not in used] or values[-1:]
        return tf.add_n([tf.reduce_mean(tf.square(s)) for s in sinks])

    @tf.function
    def step(x):
        with tf.GradientTape() as tape:
            loss = forward(x)
        grads = tape.gradient(loss, variables)
        for v, g in zip(variables, grads):
            if g is not None:
                v.assign_sub(0.01 * g)
        return {"loss": loss}

    x = rng.standard_normal((batch, width)).astype(np.float32)
    cf = step.get_concrete_function(tf.TensorSpec(x.shape, tf.float32))
    return RandomStep(seed, cf, (x,), variables, drawn)


@dataclass(frozen=True)
class Outcome:
    """What :func:`check` found for one seed.  ``status``: "passed";
    "order-sensitive" (the rewritten step trains as the unmodified step run in
    the plan's op order, bit for bit, and that differs from the unmodified step
    run freely: the step's own result depends on the order its ops run in, e.g.
    an ``AddN`` accumulating into whichever input nothing else still reads;
    seed 4156); "fits" (the
    step already fits at the drawn budget: nothing to swap); "infeasible" (the
    smallest feasible budget is not below the unmodified peak); "refused"
    (``optimize`` raised a BudgetError at a budget at or above the smallest it
    named: it measured more than it planned and said so); "failed" (a wrong
    result, a measured peak above the budget, or an unexpected error)."""

    seed: int
    status: str
    detail: str
    budget_bytes: int = 0
    swaps: int = 0
    predicted_peak_bytes: int | None = None   # the plan's, where one ran
    measured_peak_bytes: int | None = None    # the rewritten step's, 3 runs
    plan_id: str | None = None                # the plan's, where one ran


def _steps(fn, variables, initial, batch, steps):
    for v, x in zip(variables, initial):
        v.assign(x)
    losses = [fn(*batch)["loss"].numpy() for _ in range(steps)]
    return losses, [v.numpy() for v in variables]


def same_values(expected, actual) -> bool:
    """Equal element for element, NaN equal to NaN: a random step whose training
    diverges (seed 2380: the loss goes to inf and a variable to NaN, in the user's
    function too) is the same result when it diverges the same way."""
    return np.array_equal(np.asarray(expected), np.asarray(actual), equal_nan=True)


def same_results(expected, actual) -> bool:
    """(losses, variables) equal element for element (:func:`same_values`)."""
    return same_values(expected[0], actual[0]) and all(
        same_values(a, b) for a, b in zip(expected[1], actual[1]))


def _peak_and_profile(seed: int, captured, batch, profiles):
    """The unmodified step's measured peak, its traced profile and the device's
    figures for the simulator (:func:`tfswap.core.devices.cpu_emulated`): from
    ``profiles`` (a directory) where a check of ``seed`` kept them, else
    measured, traced and kept there.  The figures are kept too because the
    memcpy bandwidth in them is measured once per cache directory (each test
    has its own), and the plans follow it."""
    import dataclasses
    import json
    from pathlib import Path

    from tfswap.core.devices import DeviceSpec, cpu_emulated
    from tfswap.core.profile import Profile
    from tfswap.tf import emulate, measure
    from tfswap.tf import profile as profiler

    kept = Path(profiles) / f"seed-{seed}.profile.json" if profiles is not None else None
    figures = kept.parent / f"seed-{seed}.spec.json" if kept is not None else None
    if figures is not None and figures.exists():
        spec = DeviceSpec(**json.loads(figures.read_text()))
    else:
        spec = cpu_emulated()
        if figures is not None:
            figures.parent.mkdir(parents=True, exist_ok=True)
            figures.write_text(json.dumps(dataclasses.asdict(spec)))
    if kept is not None and kept.exists():
        prof = Profile.load(kept)
        return int((kept.parent / f"seed-{seed}.peak").read_text()), prof, spec
    peak = measure.measure(captured, captured.graph_def, batch, runs=1,
                           inter_op_threads=1).peak_bytes
    prof = profiler.trace(captured, batch, device=emulate.DEVICE)
    if kept is not None:
        prof.save(kept)
        (kept.parent / f"seed-{seed}.peak").write_text(str(peak))
    return peak, prof, spec


def _named_minimum(err) -> int | None:
    """The budget a ``BudgetError`` names (its ``smallest_bytes``), if it names one."""
    return getattr(err, "smallest_bytes", None)


def check(seed: int, max_ops: int = 12, generations: int = 2, steps: int = 2, *,
          planner: str = "tfswap", verify_rounds: int = 3, profiles=None) -> Outcome:
    """Build ``random_step(seed)`` and check tfswap's property on it (module doc).
    ``planner``, ``verify_rounds``: passed to ``optimize`` (its defaults; another
    planner, e.g. "tfswap.ga", for an ablation).  The step is traced once and every
    ``optimize`` of the check plans on that profile; ``profiles``: a directory
    keeping each seed's profile, unmodified peak and device figures, read again
    by a later check of the seed, which then draws the same budget and makes the
    same plans (a traced profile's timings differ from run to run, and with them
    the plans).

    Never raises for a property violation: the outcome says ``failed`` with
    the reason (and the traceback for an unexpected error).
    """
    import dataclasses

    import tfswap
    from tfswap.core.budget import BudgetError
    from tfswap.tf import capture, emulate, measure, rewrite, runtime

    rng = np.random.default_rng([seed, 1])
    try:
        step = random_step(seed, max_ops)
        captured = capture.capture(step.concrete_fn)
        peak, prof, spec = _peak_and_profile(seed, captured, step.batch, profiles)
        # Device-homed: the check runs the captured graph on the same variables.
        kwargs = dict(generations=generations, seed=seed, workers=1, inputs=step.batch,
                      profile=prof, device_spec=spec, parameters="device", planner=planner,
                      verify_rounds=verify_rounds)
        try:
            tfswap.optimize(step.concrete_fn, max(1, peak // 8), **kwargs)
            return Outcome(seed, "fits", f"fits in 1/8 of its peak {peak} B")
        except BudgetError as err:
            minimum = _named_minimum(err)
            if minimum is None:   # the variables alone exceed peak // 8
                return Outcome(seed, "infeasible", f"peak {peak} B: {err}")
        if minimum >= peak:
            return Outcome(seed, "infeasible",
                           f"smallest feasible budget {minimum} B >= unmodified peak {peak} B")
        budget = int(rng.integers(minimum, peak))
        try:
            fast = tfswap.optimize(step.concrete_fn, budget, **kwargs)
        except BudgetError as err:
            return Outcome(seed, "refused", f"budget {budget} B (named minimum {minimum} B, "
                                            f"peak {peak} B): {err}", budget)
        after = measure.measure(fast.captured, fast.graph_def, step.batch, runs=3).peak_bytes
        initial = [v.numpy() for v in step.variables]
        plain = runtime.bind(captured, captured.graph_def)
        ref_losses, ref_vars = _steps(plain, step.variables, initial, step.batch, steps)
        losses, got = _steps(fast, step.variables, initial, step.batch, steps)
        detail = (f"budget {budget} B in [{minimum}, {peak}), measured {after} B, "
                  f"{len(fast.plan.swaps)} swaps ({fast.plan.planner}), ops {'/'.join(step.ops)}")
        status = "passed"
        if not same_results((ref_losses, ref_vars), (losses, got)):
            # The swaps must change nothing: the unmodified step run in the plan's
            # order (its schedule chained, no swaps) is the reference then.
            in_order = runtime.bind(captured, rewrite.rewrite(
                captured, dataclasses.replace(fast.plan, swaps=()), emulate.DEVICE,
                emulate.HOST).graph_def)
            if not same_results(_steps(in_order, step.variables, initial, step.batch, steps),
                                (losses, got)):
                return Outcome(seed, "failed", "results differ from the unmodified step, also "
                               "run in the plan's order; " + detail, budget,
                               len(fast.plan.swaps))
            status = "order-sensitive"
        peaks = dict(predicted_peak_bytes=fast.plan.prediction.peak_bytes,
                     measured_peak_bytes=after, plan_id=fast.plan.id)
        if after > budget:
            return Outcome(seed, "failed", "measured peak above the budget; " + detail, budget,
                           len(fast.plan.swaps), **peaks)
        status = status if fast.plan.swaps else "fits"
        return Outcome(seed, status, detail, budget, len(fast.plan.swaps), **peaks)
    except Exception:  # noqa: BLE001 - every unexpected error is a finding
        return Outcome(seed, "failed", traceback.format_exc())

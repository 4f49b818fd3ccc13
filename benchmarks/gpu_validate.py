"""Does the optimised step stay within its budget on a GPU, and compute the same? (issue #19)

    python benchmarks/gpu_validate.py [--models cnn,resnet50,resnet50_host,resnet50_auto,bert,...]
        [--verify-rounds 3] [--generations 5] [--workers N] [--out benchmarks/out/gpu_validate_h100.csv]
    python benchmarks/gpu_validate.py --emulated --small ...      # the same, small, on the CPU
    python benchmarks/gpu_validate.py --arena --models resnet50 --out benchmarks/out/gpu_arena_h100.csv
    python benchmarks/gpu_validate.py --merge a.csv b.csv --out benchmarks/out/gpu_validate_h100.csv

Rows (fractions of the unmodified step's measured device peak):

| model | step | fractions |
|---|---|---|
| cnn | ``zoo.cnn`` b64 64px | 0.5 |
| resnet50 | ``zoo.resnet50`` b64 128px | 0.6, 0.4 |
| resnet50_host | ``zoo.resnet50`` b32 128px, variables created in host memory | 0.3 of the device-homed peak |
| resnet50_auto | ``zoo.resnet50`` b32 128px, variables on the device, ``parameters="auto"`` moves them (issue #20) | 0.3 |
| bert | ``zoo.bert`` b32 seq 256 dim 256, 4 layers | 0.6, 0.4 |
| transformer | ``zoo.transformer`` b32 seq 256 dim 256, 4 layers, vocab 4096 | 0.6, 0.4 |
| lstm4 | ``zoo.lstm`` b256, 24 steps, 128 features, 512 units, 4 layers | 0.6, 0.4 |

Each model runs in a subprocess of its own (its rows share it; each measurement
subtracts the bytes in use before it), under
``tf.config.experimental.enable_op_determinism()`` and with
``TF_FORCE_GPU_ALLOW_GROWTH=true``.  Per row: the unmodified step's peak and time
(the user's ``tf.function``), the budget, ``tfswap.optimize`` (``generations``,
``seed=0``, ``verify_rounds``) and its planning seconds, the plan's predicted
peak and step time, the optimised step's measured peak and time, and whether
3 steps of it from the same variables give bit-identical losses and variables
to 3 steps of the user's function.

Measured peak: on a GPU the BFC allocator's (``reset_memory_stats``, run,
``get_memory_info(device)["peak"]``, less the bytes in use before, plus the
step's device-homed variables; worst of 3 runs after a warm-up:
:func:`tfswap.tf.measure.allocator_peak`); on the emulated device the step
stats' (:func:`tfswap.tf.measure.measure`, worst of 2 sessions).  Step time: the
median of 3 timings of 10 consecutive steps (one scalar read at the end of
each 10), variables put back afterwards.  With ``--verify-rounds 0`` optimize
trusts its memory model, so the predicted and measured columns are the
model's accuracy.

Per row the jsonl also says what tells a model error from a run-time effect
(:func:`explain`): ``stats_peak_bytes``, the rewritten step's peak from its
step stats (allocation records in host order: no allocator rounding, no frees
waiting for a copy), ``profile_peak_bytes`` the unmodified step's the same
way, and ``executed_added_types``, the op types the run executed that the
rewritten graph does not hold (layout transposes, fusions).  A measured peak
over the stats peak points at the allocator or at timing; a stats peak over
the prediction, at the memory model or at a graph the device changed.  Which:
``stats_live_at_peak``, what one traced run held at its peak by allocating node,
set beside the saved plan's simulated live set at the same op (the problem file).

``--arena`` (issue #19, point 6): the pool allocator in one process.  Each row
runs in a process of its own whose GPU allocates everything from a budget arena
of the row's budget (``tfswap.ops.allocator.install_gpu_arena``, before
TensorFlow creates the device), so the step cannot use more than the budget:
it fits or fails out of memory.  The unmodified step cannot run there, so a
first process per model measures it and saves its training (the initial
variables, the batch, 3 steps' losses and final variables) beside the CSV;
each row's process starts the optimised step from those variables and compares.
The row adds the arena's figures (``arena_*``: strays, the plan's pool).  On
the emulated device (no GPU to install an arena on) ``--arena`` runs the same
processes and comparisons without one.

Writes the CSV (``--out``; columns :data:`COLUMNS`) after each model, and beside it
``<out>.jsonl`` (each row with its notes, the plan's report, errors) and
``<out>.log`` (the subprocesses' stderr).
"""

import argparse
import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from research.trials import emit, read_rows, run_child, step_time, sync, write_rows  # noqa: E402

COLUMNS = ("model", "batch", "fraction", "budget_bytes", "predicted_peak_bytes",
           "measured_peak_bytes", "predicted_step_s", "measured_step_s", "unmodified_step_s",
           "identical", "plan_s")


def _zoo(builder, **sizes):
    def build(variables_on=None):
        from tfswap import zoo

        return getattr(zoo, builder)(variables_on=variables_on, **sizes)
    return build


# name -> (builder, batch, fractions, homes): homes "device" (the model as built, parameters
# kept there), "host" (built under tf.device(host)) or "auto" (built on the device;
# optimize's parameters="auto" moves them, and an identical second model is the reference).
FULL = {
    "cnn": (_zoo("cnn", batch=64, image=64), 64, (0.5,), "device"),
    "resnet50": (_zoo("resnet50", batch=64, image=128), 64, (0.6, 0.4), "device"),
    "resnet50_host": (_zoo("resnet50", batch=32, image=128), 32, (0.3,), "host"),
    "resnet50_auto": (_zoo("resnet50", batch=32, image=128), 32, (0.3,), "auto"),
    "bert": (_zoo("bert", batch=32, seq=256, dim=256, heads=4, layers=4), 32, (0.6, 0.4),
             "device"),
    "transformer": (_zoo("transformer", batch=32, seq=256, dim=256, heads=4, layers=4,
                         vocab=4096), 32, (0.6, 0.4), "device"),
    "lstm4": (_zoo("lstm", batch=256, steps=24, features=128, units=512, layers=4), 256,
              (0.6, 0.4), "device"),
}
# --small: sizes that plan and run in seconds on a 2-core CPU.
SMALL = {
    "cnn": (_zoo("cnn", batch=16, image=16, channels=8, blocks=4), 16, (0.5,), "device"),
    "resnet50": (_zoo("resnet50", batch=2, image=32), 2, (0.6, 0.4), "device"),
    "resnet50_host": (_zoo("resnet50", batch=2, image=32), 2, (0.3,), "host"),
    "resnet50_auto": (_zoo("resnet50", batch=2, image=32), 2, (0.3,), "auto"),
    "bert": (_zoo("bert", batch=16, seq=64, dim=64, heads=4, layers=2, vocab=256), 16,
             (0.6, 0.4), "device"),
    "transformer": (_zoo("transformer", batch=16, seq=64, dim=64, heads=4, layers=2,
                         vocab=256), 16, (0.6, 0.4), "device"),
    "lstm4": (_zoo("lstm", batch=64, steps=8, features=16, units=32, layers=4), 64,
              (0.6, 0.4), "device"),
    # Parameters and Adam state are most of its peak: at 0.25 "auto" must move them.
    "mlp_auto": (_zoo("mlp", batch=16), 16, (0.25,), "auto"),
}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(FULL))
    parser.add_argument("--emulated", action="store_true",
                        help="run on the emulated device (CPU:0 the device, CPU:1 the host)")
    parser.add_argument("--small", action="store_true", help="small sizes (see SMALL)")
    parser.add_argument("--fractions", default=None,
                        help="override every model's fractions (comma-separated)")
    parser.add_argument("--verify-rounds", type=int, default=3,
                        help="optimize's verify_rounds; 0: the memory model's accuracy")
    parser.add_argument("--generations", type=int, default=5)
    parser.add_argument("--planner", default="tfswap",
                        help="optimize's planner: tfswap (the default, the fastest of them "
                             "all) or a registered one for an ablation, e.g. tfswap.ga (the "
                             "genetic search alone)")
    parser.add_argument("--workers", type=int, default=None,
                        help="optimize's scoring threads (default: all cores)")
    parser.add_argument("--timeout-s", type=float, default=None,
                        help="seconds each model's subprocess may take (default: no limit)")
    parser.add_argument("--out", default="benchmarks/out/gpu_validate_h100.csv")
    parser.add_argument("--problems", default=None, metavar="DIR",
                        help="where each row's planning problem is written "
                             "(tfswap.core.problem_file; `benchmarks/replan.py` plans them "
                             "again); default: benchmarks/problems on a GPU, "
                             "<out>_problems beside --out with --emulated")
    parser.add_argument("--merge", nargs="+", default=None, metavar="CSV",
                        help="only merge these CSVs (and their .jsonl) into --out")
    parser.add_argument("--arena", action="store_true",
                        help="each row in a process whose GPU allocates from a budget arena "
                             "of the row's budget (install_gpu_arena); device-homed models")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--arena-base", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--arena-row", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.problems is None:
        args.problems = str(Path(args.out).with_suffix("")) + "_problems" if args.emulated \
            else str(ROOT / "benchmarks" / "problems")
    table = SMALL if args.small else FULL
    args.models = [m for m in args.models.split(",") if m]
    unknown = [m for m in args.models if m not in table]
    if unknown:
        parser.error(f"unknown model(s) {unknown}; choose from {sorted(table)}")
    if args.verify_rounds < 0:
        parser.error("--verify-rounds must be >= 0")
    if args.arena:
        homed = [m for m in args.models if table[m][3] != "device"]
        if homed:
            parser.error(f"--arena runs device-homed models; {homed} move or home their "
                         "variables elsewhere")
    return args


# ---------------------------------------------------------------- the child: one model

def peak(fn, graph_def, batch, captured, device, method) -> tuple[int, str]:
    """(measured device peak, how)."""
    from tfswap.tf import measure

    if method == measure.ALLOCATOR:   # GPU
        m = measure.allocator_peak(fn, batch, captured, device, runs=3, warmup=1)
        return m.peak_bytes, m.describe()
    if method == measure.STEP_STATS:  # the emulated device
        value = max(measure.measure(captured, graph_def, batch).peak_bytes for _ in range(2))
        return value, f"step stats of the emulated device {device}, worst of 2 sessions"
    raise RuntimeError(f"this process cannot measure the peak of {device}")


# Nodes holding less at the step stats' peak are summed, not listed.
LIVE_LISTED_BYTES = 4096


def explain(fast, batch, device) -> dict:
    """What tells the memory model's error from a run-time effect, per row: the
    rewritten step's peak from its step stats (the executor's allocation records,
    in the order the host made them, so no allocator rounding and no frees that
    wait for a copy stream), the unmodified step's the same way (the profile's),
    and the op types the run executed that the rewritten graph does not hold
    (what Grappler and the runtime add on this device: layout transposes,
    fusions, sends); and what one run's step stats held at its peak, by the node
    that allocated it (``stats_live_at_peak``, nodes of at least
    :data:`LIVE_LISTED_BYTES`; the rest in ``stats_live_small_bytes``), and the
    unmodified step's the same way (``profile_live_at_peak``)."""
    from collections import Counter

    from tfswap.tf import measure

    m = measure.measure(fast.captured, fast.graph_def, batch, runs=2, device=device)
    # The measuring session feeds the step's placeholders from variables and
    # arguments of its own: those nodes are the harness's, not the step's.
    harness = {"VarHandleOp", "_Arg", "_Retval", "Placeholder"}
    names = {n.name for n in fast.graph_def.node if n.op not in harness}
    added = Counter(t for n, t in m.executed_types.items() if n not in names and t not in harness)
    # What was live at one run's peak, by allocating node: beside the saved problem's
    # simulated live set at the same op, it names what the memory model missed.
    # The unmodified step's too: beside the model's peak on TF's order, what the
    # memory model misses before any plan (on the H200 it was 0.955-0.98 of the step
    # stats' peak for ResNet-50 and BERT-style, about 1.0 on the emulated device).
    live = {}
    for key, graph_def in (("stats", fast.graph_def), ("profile", fast.captured.graph_def)):
        one = measure.run_traced(fast.captured, graph_def, batch, runs=1, device=device)
        peak, held, node = measure.live_at_peak(one.metadata[0].step_stats, device)
        large = {name: b for name, b in sorted(held.items(), key=lambda kv: -kv[1])
                 if b >= LIVE_LISTED_BYTES}
        live.update({f"{key}_live_at_peak": large, f"{key}_live_peak_bytes": peak,
                     f"{key}_live_peak_node": node,
                     f"{key}_live_small_bytes": sum(b for name, b in held.items()
                                                    if name not in large)})
    return dict(stats_peak_bytes=m.peak_bytes, **live,
                profile_peak_bytes=fast.lowered.profile.peak_bytes,
                executed_added_types=dict(added.most_common(12)),
                executed_added_nodes=sum(added.values()),
                rewritten_nodes_not_executed=sum(1 for n in names
                                                 if n not in m.executed_types))


def plan_fields(fast) -> dict:
    """What a row says of the plan ``optimize`` made and of its verification."""
    return dict(predicted_peak_bytes=fast.plan.prediction.peak_bytes,
                predicted_step_s=fast.plan.prediction.step_time_s, spec=fast.spec.name,
                swaps=len(fast.plan.swaps), planner=fast.plan.planner,
                recomputes=sum(1 for swap in fast.plan.swaps if swap.kind == "recompute"),
                update_places=[f"{', '.join(p.variables)}: {p.place}"
                               for p in fast.plan.update_places],
                optimize_measured_peak_bytes=fast.measured_peak_bytes,
                optimize_measured_on=fast.measured_on, notes=list(fast.notes),
                report=fast.report())


def _compared(ref_losses, losses, expected, got) -> tuple[bool, float]:
    """(bit-identical, worst relative difference) of two runs' losses and states."""
    import numpy as np

    from tests.tf.equality import worst_relative_difference

    exact = losses == ref_losses and all(np.array_equal(a, b) for a, b in zip(expected, got))
    worst, _ = worst_relative_difference(expected, got)
    worst = max([worst] + [abs(a - b) / max(1.0, abs(a)) for a, b in zip(ref_losses, losses)])
    return bool(exact), float(worst)


def same_training(reference, candidate, variables, batch, steps: int = 3):
    """(bit-identical, worst relative difference) of ``steps`` steps of each from the
    same variables (put back afterwards)."""
    from tests.tf.equality import run_steps

    initial = [v.numpy() for v in variables]
    try:
        ref_losses, ref_vars = run_steps(reference, variables, initial, batch, steps)
        losses, got_vars = run_steps(candidate, variables, initial, batch, steps)
    finally:
        for v, value in zip(variables, initial):
            v.assign(value)
    return _compared(ref_losses, losses, ref_vars, got_vars)


def same_as_reference(reference, step, fast, steps: int = 3):
    """(bit-identical, worst relative difference) of ``steps`` steps of ``reference``'s
    own function on its variables and of ``fast`` on ``step``'s, the same model
    built twice (model weights and optimizer state compared), both starting from
    ``step``'s current values."""
    def variables(s):
        return list(s.model.weights) + list(s.optimizer.variables)

    saved = [v.numpy() for v in variables(step)]
    for v, value in zip(variables(reference), saved):   # from the planned model's state
        v.assign(value)
    try:
        ref_losses = [float(reference.concrete_fn(*reference.batch)["loss"]) for _ in range(steps)]
        losses = [float(fast(*step.batch)["loss"]) for _ in range(steps)]
        expected = [v.numpy() for v in variables(reference)]
        got = [v.numpy() for v in variables(step)]
    finally:
        for v, value in zip(variables(step), saved):
            v.assign(value)
    return _compared(ref_losses, losses, expected, got)


def run_model(name: str, args) -> None:
    """Measure every row of ``name`` and emit each for the parent (trials.emit)."""
    arena_row = json.loads(args.arena_row) if args.arena_row else None
    if arena_row is not None and not args.emulated:
        from tfswap.ops import allocator   # before anything creates the GPU

        allocator.install_gpu_arena(arena_row["budget_bytes"])
    if args.emulated:
        from tfswap.tf import emulate

        emulate.setup()
    import tensorflow as tf

    tf.random.set_seed(0)
    tf.config.experimental.enable_op_determinism()
    import tfswap
    from tfswap.tf import capture, emulate, measure, runtime

    if args.emulated:
        device, host = emulate.DEVICE, emulate.HOST
    else:
        gpus = tf.config.list_logical_devices("GPU")
        if not gpus:
            raise SystemExit("no GPU is visible to TensorFlow; pass --emulated to run on "
                             "the emulated device")
        device, host = gpus[0].name, "/device:CPU:0"
    method = measure.peak_method(device, emulate.is_active())
    build, batch, fractions, homes = (SMALL if args.small else FULL)[name]
    if args.fractions:
        fractions = tuple(float(f) for f in args.fractions.split(","))
    timing = dict(steps=3, repeats=1) if args.emulated else dict(steps=10, repeats=3)
    device_name = ""
    if not args.emulated:
        from tfswap.tf import gpu

        device_name = gpu.device_name(device)

    if arena_row is not None:
        return arena_rows(name, args, arena_row, build(), device, method, timing)
    step = build()
    if args.arena_base:
        return arena_base(name, args, step, device, method, timing)
    captured = capture.capture(step.concrete_fn, device=device)
    sync(step.concrete_fn(*step.batch))   # traced, and (GPU) autotuned once
    base_peak, base_how = peak(step.concrete_fn, captured.graph_def, step.batch, captured,
                               device, method)
    base_time = step_time(step.concrete_fn, step.batch, captured.variables, **timing)
    print(f"{name}: unmodified peak {base_peak} B, {base_time * 1e3:.2f} ms/step "
          f"({base_how})", flush=True)
    host_time = None
    if homes == "host":
        del step, captured
        gc.collect()
        step = build(host)
        captured = capture.capture(step.concrete_fn, device=device)
        host_time = step_time(step.concrete_fn, step.batch, captured.variables, **timing)
    unmodified = runtime.bind(captured, captured.graph_def)
    if len(fractions) > 1 and homes == "auto":
        raise SystemExit(f"{name}: an 'auto' model moves its variables once; give one fraction")
    for fraction in fractions:
        budget = int(fraction * base_peak)
        row = dict(model=name, batch=batch, fraction=fraction, budget_bytes=budget,
                   unmodified_step_s=base_time, unmodified_peak_bytes=base_peak,
                   host_variables_unmodified_step_s=host_time, device=device,
                   device_name=device_name, verify_rounds=args.verify_rounds,
                   generations=args.generations, optimize_planner=args.planner,
                   measured_how=base_how)
        fast = None
        try:
            start = time.perf_counter()
            # "auto": a second model from the same seed is the unmodified reference,
            # since the planned one's variables may move to host memory.
            reference = build() if homes == "auto" else None
            fast = tfswap.optimize(step.concrete_fn, budget, generations=args.generations,
                                   seed=0, workers=args.workers, inputs=step.batch,
                                   verify_rounds=args.verify_rounds,
                                   planner=args.planner,
                                   parameters="auto" if homes == "auto" else "device")
            row["plan_s"] = time.perf_counter() - start
            row.update(plan_fields(fast))
            row["measured_peak_bytes"], row["measured_how"] = peak(
                fast, fast.graph_def, step.batch, fast.captured, device, method)
            row["measured_step_s"] = step_time(fast, step.batch, fast.captured.variables,
                                               **timing)
            try:
                row.update(explain(fast, step.batch, device))
            except Exception as err:   # a diagnostic; the row stands without it
                row["explain_error"] = f"{type(err).__name__}: {err}"[:1000]
            variables = fast.captured.variables
            if reference is not None:
                row["moved_bytes"] = fast.relocation.nbytes if fast.relocation else 0
                row["identical"], row["worst_relative_difference"] = same_as_reference(
                    reference, step, fast)
                # The unmodified graph with the variables where the plan has them.
                unmodified = runtime.bind(fast.captured, fast.captured.graph_def)
            else:
                row["identical"], row["worst_relative_difference"] = same_training(
                    step.concrete_fn, fast, variables, step.batch)
            row["identical_to_captured_graph"], _ = same_training(
                unmodified, fast, variables, step.batch)
        except Exception as err:   # one row's failure (BudgetError, OOM) is a result
            row["error"] = f"{type(err).__name__}: {err}"[:2000]
            row["traceback"] = traceback.format_exc()[-4000:]
        if fast is not None:
            row["problem_file"] = save_problem(args, name, fraction, fast, row)
        emit(row)
        del fast
        gc.collect()


# ---------------------------------------------------------------- --arena


def problem_path(args, name: str, fraction: float) -> Path:
    """Where the row of ``name`` at ``fraction`` writes its planning problem."""
    return Path(args.problems) / f"{Path(args.out).stem}.{name}.{fraction:g}.json.gz"


def save_problem(args, name: str, fraction: float, fast, row: dict) -> str:
    """Write this row's planning problem (the lowered step with the device's profile),
    the device's figures, the budgets, the plan that ran and the measured row
    (:mod:`tfswap.core.problem_file`), so a machine without the device plans it
    again: ``python benchmarks/replan.py benchmarks/problems/*.json.gz``.  Its
    path, or why it was not written."""
    from tfswap.core import problem_file

    try:
        saved = problem_file.SavedProblem(
            fast.problem, fast.spec, budget_bytes=fast.budget_bytes,
            planner_budget_bytes=fast.planner_budget_bytes, allocator=fast.allocator,
            plan=fast.plan, row={k: v for k, v in row.items() if k != "traceback"})
        return str(problem_file.write(problem_path(args, name, fraction), saved))
    except Exception as err:   # the row stands without it
        return f"not written: {type(err).__name__}: {err}"


def reference_path(out, name: str) -> Path:
    return Path(out).with_suffix(f".{name}.reference.npz")


def arena_base(name: str, args, step, device, method, timing) -> None:
    """The unmodified step, measured and trained without an arena: its peak, its
    time, and 3 steps from its initial variables saved for the rows to compare."""
    import numpy as np

    from tests.tf.equality import run_steps
    from tfswap.tf import capture

    captured = capture.capture(step.concrete_fn, device=device)
    variables = captured.variables
    initial = [v.numpy() for v in variables]
    batch = [np.asarray(t) for t in step.batch]
    sync(step.concrete_fn(*step.batch))
    base_peak, base_how = peak(step.concrete_fn, captured.graph_def, step.batch, captured,
                               device, method)
    base_time = step_time(step.concrete_fn, step.batch, variables, **timing)
    losses, final = run_steps(step.concrete_fn, variables, initial, step.batch, steps=3)
    arrays = {f"initial_{k}": a for k, a in enumerate(initial)}
    arrays.update({f"final_{k}": a for k, a in enumerate(final)})
    arrays.update({f"batch_{k}": a for k, a in enumerate(batch)})
    np.savez(reference_path(args.out, name), losses=np.array(losses),
             names=np.array([v.name for v in variables]), **arrays)
    emit(dict(model=name, arena_base=True, unmodified_peak_bytes=base_peak,
              unmodified_step_s=base_time, measured_how=base_how))


def arena_rows(name: str, args, given: dict, step, device, method, timing) -> None:
    """One row inside the budget arena: optimize at its budget, measure, and compare
    3 steps with the unmodified step's saved ones."""
    import numpy as np
    import tensorflow as tf

    import tfswap
    from tfswap.ops import allocator

    saved = np.load(reference_path(args.out, name))
    row = dict(model=name, batch=given["batch"], fraction=given["fraction"],
               budget_bytes=given["budget_bytes"], unmodified_step_s=given["unmodified_step_s"],
               unmodified_peak_bytes=given["unmodified_peak_bytes"], device=device,
               verify_rounds=args.verify_rounds, generations=args.generations,
               optimize_planner=args.planner)
    arena = allocator.installed_gpu_arena(device)
    row["arena"] = "installed" if arena is not None else "none (the emulated device)"
    fast = None
    try:
        batch = [tf.constant(saved[f"batch_{k}"]) for k in range(len(step.batch))]
        variables = None
        start = time.perf_counter()
        fast = tfswap.optimize(step.concrete_fn, given["budget_bytes"],
                               generations=args.generations, seed=0, workers=args.workers,
                               inputs=batch, verify_rounds=args.verify_rounds,
                               planner=args.planner)
        row["plan_s"] = time.perf_counter() - start
        variables = fast.captured.variables
        names = [v.name for v in variables]
        if names != [str(n) for n in saved["names"]]:
            raise RuntimeError(f"{name}: the model's variables differ from the saved "
                               "reference's; re-run without --arena-row")
        row.update(plan_fields(fast))
        row["measured_peak_bytes"], row["measured_how"] = peak(
            fast, fast.graph_def, batch, fast.captured, device, method)
        row["measured_step_s"] = step_time(fast, batch, variables, **timing)
        from tests.tf.equality import run_steps

        initial = [saved[f"initial_{k}"] for k in range(len(variables))]
        losses, got = run_steps(fast, variables, initial, batch, steps=3)
        row["identical"], row["worst_relative_difference"] = _compared(
            [float(x) for x in saved["losses"]], losses,
            [saved[f"final_{k}"] for k in range(len(variables))], got)
    except Exception as err:   # out of memory inside the arena is a result
        row["error"] = f"{type(err).__name__}: {err}"[:2000]
        row["traceback"] = traceback.format_exc()[-4000:]
    if arena is not None:
        s = arena.stats()
        row.update(arena_bytes=s.arena_bytes, arena_peak_bytes=s.peak_bytes_in_use,
                   arena_strays=s.strays, arena_stray_bytes=s.stray_bytes,
                   arena_last_stray=s.last_stray, arena_carved_bytes=s.carved_bytes)
    emit(row)


# ---------------------------------------------------------------- the parent

def write(rows, out: Path) -> None:
    write_rows(rows, out, COLUMNS)


def merge(paths, out: Path) -> None:
    """Concatenate the rows (and the .jsonl details) of CSVs written by this script."""
    rows = [row for path in paths for row in read_rows(Path(path))]
    write(rows, out)
    print(f"wrote {out} ({len(rows)} rows)")


def summary(row) -> str:
    if row.get("error"):
        # A subprocess that failed before its first fraction gives no fraction.
        return f"{row['model']} {row.get('fraction', '')}: {row['error'][:300]}".replace(
            "  ", " ")
    over = row["measured_peak_bytes"] / row["budget_bytes"] - 1
    model = row["predicted_peak_bytes"] / row["measured_peak_bytes"] - 1
    return (f"{row['model']} b{row['batch']} {row['fraction']:.0%}: budget "
            f"{row['budget_bytes'] / 2**20:.1f} MiB, predicted {row['predicted_peak_bytes'] / 2**20:.1f}, "
            f"measured {row['measured_peak_bytes'] / 2**20:.1f} ({over:+.1%} of the budget; "
            f"prediction {model:+.1%}), {row['measured_step_s'] * 1e3:.1f} ms vs unmodified "
            f"{row['unmodified_step_s'] * 1e3:.1f} ms (predicted "
            f"{row['predicted_step_s'] * 1e3:.1f}), identical {row['identical']}, "
            f"plan {row['plan_s']:.1f} s")


def _child_rows(name: str, cmd, env, log: Path, timeout_s) -> list:
    rows, failure = run_child(cmd, env, log, timeout_s, cwd=str(ROOT))
    if failure and not rows:
        rows.append(dict(model=name, error=f"the model's subprocess failed: {failure} "
                                            f"(see {log.name})"))
    elif failure:
        rows[-1].setdefault("error", f"the model's subprocess then failed: {failure}")
    return rows


def arena_children(name: str, args, cmd, env, log: Path) -> list:
    """--arena: the unmodified step in one process, then each fraction in its own."""
    base = _child_rows(name, cmd + ["--arena-base"], env, log, args.timeout_s)
    if not base or base[0].get("error") or not base[0].get("arena_base"):
        return base
    base = base[0]
    _, batch, fractions, _ = (SMALL if args.small else FULL)[name]
    if args.fractions:
        fractions = tuple(float(f) for f in args.fractions.split(","))
    rows = []
    for fraction in fractions:
        given = dict(batch=batch, fraction=fraction,
                     budget_bytes=int(fraction * base["unmodified_peak_bytes"]),
                     unmodified_peak_bytes=base["unmodified_peak_bytes"],
                     unmodified_step_s=base["unmodified_step_s"])
        rows += _child_rows(name, cmd + ["--arena-row", json.dumps(given)], env, log,
                            args.timeout_s)
    return rows


def main(argv=None):
    args = parse_args(argv)
    out = Path(args.out)
    if args.merge:
        return merge(args.merge, out)
    if args.child:
        return run_model(args.child, args)
    env = dict(os.environ)
    env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    # The children run in the repository's root: paths as this process sees them.
    passed = [a for a in (argv if argv is not None else sys.argv[1:])] + [
        "--out", str(out.resolve()), "--problems", str(Path(args.problems).resolve())]
    rows = []
    out.parent.mkdir(parents=True, exist_ok=True)
    log = out.with_suffix(".log")
    log.write_text("")
    for name in args.models:
        started = time.perf_counter()
        cmd = [sys.executable, str(Path(__file__).resolve()), *passed, "--child", name]
        if args.arena:
            mine = arena_children(name, args, cmd, env, log)
        else:
            mine = _child_rows(name, cmd, env, log, args.timeout_s)
        rows += mine
        for row in mine:
            print(summary(row), flush=True)
        print(f"{name}: {time.perf_counter() - started:.0f} s", flush=True)
        write(rows, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

"""The ``tfswap`` command (also ``python -m tfswap.cli``).

Subcommands, one function each:

* ``tfswap demo``: train a built-in Keras CNN with a memory budget of 60% of
  what it needs, check it trains exactly like the unmodified step, and write
  a Chrome trace and a memory picture of the plan.
* ``tfswap plan MODULE:FUNCTION --budget 8GiB``: plan a step of your own,
  print the plan's summary and write the plan (and optionally its trace and
  picture).

SwapAdvisor's Fig. 6 comparison is a benchmark, not a command of the library:
``python benchmarks/paper_fig6.py`` (research/paper_bench.py).

Example::

    tfswap demo --out demo-output
    tfswap plan examples.mlp_step:train_step --budget 24MiB --out step.plan.json
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
from pathlib import Path

DESCRIPTION = """\
tfswap trains TensorFlow steps that need more device memory than the
accelerator has: it plans which tensors to move to host memory and back, and
when, so the copies overlap computation (SwapAdvisor, ASPLOS'20). Without a GPU
it runs on an emulated device (one CPU plays the accelerator, another the host).

Start with `tfswap demo`. Then plan your own step with
`tfswap plan my_module:my_step --budget 8GiB` (see `tfswap plan --help`)."""

PLAN_EPILOG = """\
FUNCTION may be a ConcreteFunction, a tf.function with an input_signature, an
object with a `concrete_fn` attribute, or a function taking no arguments that
returns one of these (useful when building the model should wait until tfswap
has set up the device). MODULE is imported as Python imports it (the current
directory is searched first); a path such as examples/mlp_step.py works too.

Budgets: bytes (123456789), a size with a unit (8GiB, 800MB, 2.5 GB), or a
fraction of the device's memory (0.5).

Examples:
  tfswap plan examples.mlp_step:train_step --budget 24MiB
  tfswap plan my_model.py:make_step --budget 12GiB --device-spec v100-16g-pcie3 \\
      --out step.plan.json --trace step.trace.json --plot step.memory.png"""


def _mib(nbytes: int) -> str:
    return f"{nbytes / (1 << 20):.2f} MiB"


def _setup_device():
    """The device to run on: the first GPU, else the emulated one (CPU:0 / CPU:1).

    Must run before anything creates TensorFlow's devices (importing the
    user's module may build a model).
    """
    import tensorflow as tf

    if tf.config.list_physical_devices("GPU"):
        return "gpu"
    from tfswap.tf import emulate

    emulate.setup()
    return "emulated"


def _write_reports(fast, out_dir: Path, stem: str, trace: bool = True, plot: bool = True):
    """Write the plan, its Chrome trace and memory PNG under ``out_dir``; say where."""
    from tfswap import report

    out_dir.mkdir(parents=True, exist_ok=True)
    written = {}
    plan_path = out_dir / f"{stem}.plan.json"
    fast.plan.save(plan_path)
    written["plan"] = plan_path
    if trace:
        written["trace"] = fast.to_chrome_trace(out_dir / f"{stem}.trace.json")
    if plot:
        try:
            written["memory plot"] = fast.plot_memory(out_dir / f"{stem}.memory.png")
        except report.PlotUnavailable as err:
            print(f"memory plot skipped: {err}")
    return written


def _say_written(written: dict) -> None:
    for what, path in written.items():
        hint = {"trace": " (open in https://ui.perfetto.dev or chrome://tracing)",
                "plan": " (tfswap.load_plan(path, concrete_fn) applies it)"}.get(what, "")
        print(f"  {what:12s} {path}{hint}")


def demo(args) -> int:
    """Swap a built-in Keras CNN at a fraction of its memory; check training is unchanged."""
    import numpy as np

    from tfswap.tf import emulate

    emulate.setup()
    import tfswap
    from tfswap import zoo
    from tfswap.tf import capture, measure

    step = zoo.cnn(batch=args.batch)
    captured = capture.capture(step.concrete_fn)
    print(f"model: Keras CNN (16x Conv/BN/ReLU, Dense), Adam, batch {args.batch}, "
          f"{len(captured.graph_def.node)} graph nodes, on the emulated device")
    before = measure.measure(captured, captured.graph_def, step.batch, inter_op_threads=1)
    budget = int(args.fraction * before.peak_bytes)
    print(f"unmodified step needs {_mib(before.peak_bytes)} of device memory; "
          f"budget {_mib(budget)} ({args.fraction:.0%})")
    # `generations` bounds each search: the shared pool layout searches once per
    # pool size it tries, and the report counts the generations of all of them.
    print(f"planning: the fastest plan of tfswap's planners (genetic search, "
          f"{args.generations} generations for each pool size tried, which the report below "
          "counts all together; the byte-cap planner; TensorFlow's order; recomputation "
          "alone) ...", flush=True)
    try:
        fast = tfswap.optimize(step.concrete_fn, budget, generations=args.generations,
                               seed=args.seed, workers=1, inputs=step.batch)
    except tfswap.BudgetError as err:
        print(f"tfswap demo: {err} (try a larger --fraction or --batch)", file=sys.stderr)
        return 1
    print(fast.report())

    variables = captured.variables
    initial = [v.numpy() for v in variables]
    results = []
    for fn in (step.concrete_fn, fast):   # the user's own function first, then tfswap's
        for v, x in zip(variables, initial):
            v.assign(x)
        losses = [float(fn(*step.batch)["loss"]) for _ in range(3)]
        results.append((losses, [v.numpy() for v in variables]))
    worst = max(float(np.linalg.norm(a.astype(np.float64) - b))
                / max(1.0, float(np.linalg.norm(a.astype(np.float64))))
                for a, b in zip(results[0][1], results[1][1]))
    same_losses = results[0][0] == results[1][0]
    weights = "bit-identical" if worst == 0 else f"within {worst:.2g} of their norm"
    print(f"3 training steps: losses {results[1][0]} -- "
          f"{'identical to' if same_losses else 'DIFFERENT from'} the unmodified tf.function; "
          f"weights {weights}")

    after = measure.measure(captured, fast.graph_def, step.batch)
    saved = before.peak_bytes - after.peak_bytes
    print(f"device peak (measured on the emulated device): unmodified "
          f"{_mib(before.peak_bytes)}, with swaps {_mib(after.peak_bytes)} "
          f"(budget {_mib(budget)}), saved {_mib(saved)} "
          f"({100 * saved / before.peak_bytes:.1f}%)")
    print(f"step time: unmodified {before.step_time_s * 1e3:.1f} ms, with swaps "
          f"{after.step_time_s * 1e3:.1f} ms (CPU emulation, not a GPU figure)")
    print("wrote:")
    _say_written(_write_reports(fast, Path(args.out), "demo"))
    ok = same_losses and worst <= 1e-6 and after.peak_bytes <= budget
    return 0 if ok else 1


class UsageError(Exception):
    """The command line names something that cannot be used; the message says why."""


def load_function(target: str):
    """The ConcreteFunction that ``MODULE:FUNCTION`` names (see ``tfswap plan --help``),
    and the object it came from (keep it: it may own the function's variables)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise UsageError(f"expected MODULE:FUNCTION (e.g. examples.mlp_step:train_step), "
                         f"got {target!r}")
    if module_name.endswith(".py") or "/" in module_name:
        path = Path(module_name)
        if not path.is_file():
            raise UsageError(f"no such file: {path}")
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[path.stem] = module
        spec.loader.exec_module(module)
    else:
        if "" not in sys.path and "." not in sys.path:
            sys.path.insert(0, "")  # the current directory, as `python -m` would
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            raise UsageError(f"cannot import module {module_name!r} ({err}); run tfswap from "
                             "the folder that holds it, or give a path such as "
                             "path/to/module.py:FUNCTION") from err
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise UsageError(f"module {module_name!r} has no attribute {attr!r}")
        obj = getattr(obj, part)
    return _concrete(obj, target)


def _concrete(obj, target: str, depth: int = 0):
    if hasattr(obj, "structured_input_signature") and hasattr(obj, "captured_inputs"):
        return obj, obj
    if hasattr(obj, "concrete_fn"):
        return obj.concrete_fn, obj
    if hasattr(obj, "get_concrete_function"):
        if getattr(obj, "input_signature", None) is None:
            raise UsageError(f"{target} is a tf.function without an input_signature; give it "
                             "one (tf.function(input_signature=[tf.TensorSpec([32, ...])])) or "
                             "name a function that returns fn.get_concrete_function(specs...)")
        return obj.get_concrete_function(), obj
    if callable(obj) and depth == 0:
        return _concrete(obj(), target, depth + 1)
    raise UsageError(f"{target} is a {type(obj).__name__}, not a ConcreteFunction, a "
                     "tf.function with an input_signature, or a function returning one")


def plan(args) -> int:
    """Plan a user's step for a budget; print the summary; write the plan and reports."""
    import tfswap
    from tfswap.core.budget import BudgetError
    from tfswap.core.devices import device_spec
    from tfswap.tf.capture import CaptureError

    try:
        spec = device_spec(args.device_spec) if args.device_spec else None
    except ValueError as err:
        raise UsageError(str(err)) from err
    where = _setup_device()
    concrete_fn, owner = load_function(args.function)  # noqa: F841 (owner keeps variables alive)
    profile = args.profile
    if profile == "auto" and where == "emulated" and spec is not None:
        profile = "analytic"   # time the ops as the named device would, not as this CPU does
    print(f"planning {args.function} for {args.budget} on "
          f"{'the emulated device' if where == 'emulated' else 'the GPU'}"
          f"{f' as a {spec.name}' if spec else ''} (profile {profile}) ...", flush=True)
    try:
        fast = tfswap.optimize(concrete_fn, args.budget, device_spec=spec, profile=profile,
                               search_time=args.search_time, generations=args.generations,
                               seed=args.seed, workers=args.workers)
    except (BudgetError, CaptureError) as err:
        print(f"tfswap plan: {err}", file=sys.stderr)
        return 1
    print(fast.report())
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fast.plan.save(out)
    written = {"plan": out}
    if args.trace:
        written["trace"] = fast.to_chrome_trace(args.trace)
    if args.plot:
        written["memory plot"] = fast.plot_memory(args.plot)
    print("wrote:")
    _say_written(written)
    return 0


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"must be a fraction in (0, 1), got {value}")
    return value


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0 seconds, got {value}")
    return value


def _add_demo(sub) -> None:
    p = sub.add_parser(
        "demo",
        help="try tfswap on a built-in Keras CNN (1-2 minutes on 2 CPU cores, no GPU needed)",
        description="Train a built-in Keras CNN on the emulated device with a memory budget "
                    "below what it needs, check that it trains exactly like the unmodified "
                    "step, print the plan and the memory saved, and write a Chrome trace and "
                    "a memory plot of the plan.")
    p.add_argument("--batch", type=_positive_int, default=32, help="batch size (default 32)")
    p.add_argument("--fraction", type=_fraction, default=0.6,
                   help="budget as a fraction of the unmodified step's peak (default 0.6)")
    p.add_argument("--generations", type=_positive_int, default=20,
                   help="generations of genetic search for each pool size it tries "
                        "(default 20)")
    p.add_argument("--seed", type=int, default=0, help="search seed (default 0)")
    p.add_argument("--out", default="tfswap-demo",
                   help="folder for the plan, trace and plot (default ./tfswap-demo)")
    p.set_defaults(run=demo)


def _add_plan(sub) -> None:
    p = sub.add_parser(
        "plan", help="plan swaps for your own step: tfswap plan MODULE:FUNCTION --budget 8GiB",
        description="Plan which tensors of a TensorFlow step move to host memory so the step "
                    "fits a memory budget; print the plan's summary and write it as JSON.",
        epilog=PLAN_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("function", metavar="MODULE:FUNCTION", help="the step to plan (see below)")
    p.add_argument("--budget", required=True,
                   help="device memory the step may use, e.g. 8GiB, 800MB or 0.5")
    p.add_argument("--device-spec", default=None, metavar="NAME",
                   help="the accelerator to plan for: v100-16g-pcie3, a100-40g-pcie4, "
                        "h100-80g-pcie5 or cpu-emulated (default: the device found; without "
                        "a GPU, naming one prices ops for it analytically)")
    p.add_argument("--profile", choices=("auto", "trace", "isolated", "analytic"),
                   default="auto", help="how op times are found (default auto)")
    p.add_argument("--search-time", type=_positive_seconds, default=60.0, metavar="SECONDS",
                   help="seconds of genetic search (default 60)")
    p.add_argument("--generations", type=_positive_int, default=None,
                   help="stop after this many generations instead (same result on any machine)")
    p.add_argument("--seed", type=int, default=0, help="search seed (default 0)")
    p.add_argument("--workers", type=_positive_int, default=None,
                   help="processes for the search (default: all cores)")
    p.add_argument("--out", default="step.plan.json",
                   help="where to write the plan (default step.plan.json)")
    p.add_argument("--trace", default=None, metavar="PATH",
                   help="also write a Chrome trace of the simulated step")
    p.add_argument("--plot", default=None, metavar="PATH",
                   help="also write a PNG of device memory over the step (needs matplotlib)")
    p.set_defaults(run=plan)


# One entry per subcommand: a function that adds its parser (which sets `run`).
SUBCOMMANDS = (_add_demo, _add_plan)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="tfswap", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for add in SUBCOMMANDS:
        add(sub)
    return p


def main(argv=None) -> int:
    # TensorFlow's C++ start-up and profiler chatter would bury the report; a
    # user who wants it sets the variable.  (The command's own process only.)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    p = parser()
    args = p.parse_args(argv)
    try:
        return args.run(args)
    except UsageError as err:
        p.exit(2, f"tfswap {args.command}: {err}\n")


if __name__ == "__main__":
    sys.exit(main())

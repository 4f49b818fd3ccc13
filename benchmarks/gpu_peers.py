"""With this card, how large a batch trains, and how fast? tfswap against what a
TensorFlow user does instead (issue #23).

    python benchmarks/gpu_peers.py [--models resnet50,bert,lstm4]
        [--policies tf,checkpoint,tf_swap,tfswap] [--cap 4GiB] [--generations 5]
        [--deadline-s 540] [--resume] [--out benchmarks/out/gpu_peers_h100.csv]
    python benchmarks/gpu_peers.py --emulated --small ...   # a stand-in on the CPU
    python benchmarks/gpu_peers.py --merge a.csv b.csv --out benchmarks/out/gpu_peers_h100.csv

Policies, each on the same Keras model and Adam (:mod:`tfswap.zoo`):

| policy | what runs |
|---|---|
| tf | the user's ``tf.function`` step, TensorFlow's defaults |
| checkpoint | gradient checkpointing: ``tf.recompute_grad`` around each block (``tf_peers.checkpointed``) |
| tf_swap | the user's step with Grappler's memory optimizer set to its swapping heuristics (``tf_peers.swapping_config``), the only swapping TF 2.21 has |
| tfswap | ``tfswap.optimize(step, memory_budget=cap, parameters="auto")`` |

The card: on a GPU, device memory capped at ``--cap`` with
``tf.config.set_logical_device_configuration(..., memory_limit=...)`` (every
policy; tfswap's budget is the same bytes), one process per trial so each
starts with a fresh allocator; a trial trains if a warm-up step and the timed
steps run without ``ResourceExhaustedError``.  On the emulated device
(``--emulated``: CPU:0 the device, nothing caps it) a trial trains if its
measured device peak (step stats) is at most the cap; trials run in this
process; Grappler's swapping never acts there (it swaps tensors of GPU
devices only), so tf_swap's rows say so instead.

Per model:

1. **Largest batch that trains**, per policy: batches doubling from the
   model's start until one does not train, then halving the gap until it is
   under 1/``--resolution`` of the batch.  tfswap, checkpointing and TF's
   swapping start from plain TensorFlow's largest batch.
2. **Throughput at 2x and 4x** plain TensorFlow's largest batch
   (``--oversubscription``): each policy's samples per second over the ideal,
   the same batch's plain step with no memory limit.

Writes ``--out`` (one row per model and policy, columns :data:`COLUMNS`), every
trial in ``<out>.trials.csv`` / ``.trials.jsonl`` (``--resume`` reuses them, so
a run cut off by ``--deadline-s`` or a device call's time limit goes on where it
stopped), the children's stderr in ``<out>.log`` and the bar chart
``<out>.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import os
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from research.trials import emit, read_rows, run_child, step_time, sync, write_rows  # noqa: E402

POLICIES = ("tf", "checkpoint", "tf_swap", "tfswap")
COLUMNS = ("model", "policy", "cap_bytes", "largest_batch", "largest_vs_tf",
           "per_sample_s", "throughput_2x_vs_ideal", "throughput_4x_vs_ideal", "note")
TRIAL_COLUMNS = ("model", "policy", "batch", "capped", "cap_bytes", "trains", "out_of_memory",
                 "step_s", "samples_per_s", "peak_bytes", "plan_s", "error")


@dataclasses.dataclass(frozen=True)
class Model:
    builder: str
    sizes: dict
    start: int        # the first batch tried
    limit: int        # no batch above this is tried
    cap: int | None = None   # the emulated table's own cap (bytes); the GPU's is --cap


# ResNet-50 224px, BERT-base-like encoder, 4-layer LSTM: issue #23's models.
FULL = {
    "resnet50": Model("resnet50", dict(image=224, classes=1000), 16, 4096),
    "bert": Model("bert", dict(seq=128, dim=768, heads=12, layers=12, vocab=30522), 8, 2048),
    "lstm4": Model("lstm", dict(steps=32, features=512, units=1024, layers=4), 64, 1 << 15),
}
# --emulated --small: sizes whose trials take seconds on a 2-core CPU.
SMALL = {
    "bert": Model("bert", dict(seq=64, dim=64, heads=4, layers=2, vocab=256), 4, 256,
                  cap=12 << 20),
    "lstm4": Model("lstm", dict(steps=8, features=16, units=64, layers=4), 8, 1024,
                   cap=5 << 20),
    "resnet50": Model("resnet50", dict(image=64), 2, 64, cap=420 << 20),
}


def parse_bytes(text: str) -> int:
    units = {"": 1, "B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30}
    t = text.strip().upper()
    number = t.rstrip("KMGIB")
    unit = t[len(number):]
    if unit not in units or not number:
        raise argparse.ArgumentTypeError(f"{text!r}: give bytes, e.g. 4GiB, 512MiB or 1048576")
    return int(float(number) * units[unit])


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet50,bert,lstm4")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--cap", type=parse_bytes, default=None,
                        help="device memory of the card (default: 4GiB on a GPU, each "
                             "model's own with --emulated --small)")
    parser.add_argument("--emulated", action="store_true",
                        help="the emulated device (CPU:0 the device, CPU:1 the host)")
    parser.add_argument("--small", action="store_true", help="small sizes (see SMALL)")
    parser.add_argument("--oversubscription", default="2,4",
                        help="multiples of plain TF's largest batch for the throughput rows")
    parser.add_argument("--max-batch", type=int, default=None,
                        help="try no batch above this (default: each model's limit)")
    parser.add_argument("--resolution", type=int, default=8,
                        help="stop bisecting when the gap is under batch/resolution")
    parser.add_argument("--generations", type=int, default=5)
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--timeout-s", type=float, default=300,
                        help="seconds one trial's process may take (GPU)")
    parser.add_argument("--deadline-s", type=float, default=None,
                        help="start no trial after this many seconds; the rest is for --resume")
    parser.add_argument("--resume", action="store_true",
                        help="reuse the trials in <out>.trials.jsonl")
    parser.add_argument("--out", default="benchmarks/out/gpu_peers_h100.csv")
    parser.add_argument("--merge", nargs="+", default=None, metavar="CSV",
                        help="merge the trials of these runs' CSVs into --out, and summarise")
    parser.add_argument("--trial", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    table = SMALL if args.small else FULL
    args.models = [m for m in args.models.split(",") if m]
    args.policies = [p for p in args.policies.split(",") if p]
    bad = [m for m in args.models if m not in table] + \
        [p for p in args.policies if p not in POLICIES]
    if bad:
        parser.error(f"unknown {bad}; models {sorted(table)}, policies {list(POLICIES)}")
    if "tf" not in args.policies:
        parser.error("the tf policy is the yardstick (largest batch, oversubscription): keep it")
    args.oversubscription = [int(k) for k in args.oversubscription.split(",") if k]
    if args.resolution < 1:
        parser.error("--resolution must be >= 1")
    if args.small and not args.emulated:
        parser.error("--small sizes are for the emulated device: add --emulated")
    return args


def cap_of(args, model: str) -> int:
    table = SMALL if args.small else FULL
    if args.cap is not None:
        return args.cap
    if table[model].cap is not None:
        return table[model].cap
    return 4 << 30


# ---------------------------------------------------------------- one trial

def _build(args, model: str, batch: int):
    from tfswap import zoo

    spec = (SMALL if args.small else FULL)[model]
    return getattr(zoo, spec.builder)(batch=batch, **spec.sizes)


def _variables(model, optimizer):
    return list(model.weights) + list(optimizer.variables)


def _gpu_peak(fn, batch, variables, device: str) -> int:
    """BFC's peak during one step, less what was in use before, plus the variables."""
    import tensorflow as tf

    name = device.rsplit("device:", 1)[-1]
    sync(())
    tf.config.experimental.reset_memory_stats(name)
    before = int(tf.config.experimental.get_memory_info(name)["current"])
    sync(fn(*batch))
    held = sum(int(v.shape.num_elements()) * v.dtype.size for v in variables)
    return int(tf.config.experimental.get_memory_info(name)["peak"]) - before + held


def _emulated_peak(fn, batch) -> int:
    from tfswap.tf import capture, measure

    # One inter-op thread: the executor's order, hence the peak, is the same in
    # every run (with two, an unrolled LSTM's peak moved by 20% between runs).
    captured = capture.capture(fn)
    return measure.measure(captured, captured.graph_def, batch, inter_op_threads=1).peak_bytes


def _swapping(fn):
    """``fn`` called under Grappler's swapping heuristics."""
    from research import tf_peers
    from tfswap.tf.runtime import function_config

    config = tf_peers.swapping_config()

    def call(*batch):
        with function_config(config):
            return fn(*batch)
    return call


def run_trial(args, model: str, policy: str, batch: int, capped: bool, device: str) -> dict:
    """One trial's row: does ``policy`` train ``model`` at ``batch`` on the card?"""
    import tensorflow as tf

    from research import tf_peers

    cap = cap_of(args, model)
    row = dict(model=model, policy=policy, batch=batch, capped=capped, cap_bytes=cap,
               device=device, emulated=args.emulated)
    timing = dict(steps=2, repeats=1) if args.emulated else dict(steps=5, repeats=3)
    started = time.perf_counter()
    try:
        step = _build(args, model, batch)
        if policy == "tf_swap" and args.emulated:
            from tfswap.tf import capture

            captured = capture.capture(step.concrete_fn)
            row["grappler_swaps"] = tf_peers.grappler_swaps(
                captured.graph_def, captured.fetches, (), device, cap)
            row["error"] = ("not applicable on the emulated device: Grappler's memory "
                            "optimizer swaps tensors of GPU devices only (memory_optimizer.cc, "
                            f"IdentifySwappingCandidates); it inserted {row['grappler_swaps']} "
                            "swap nodes")
            return row
        if policy == "tfswap":
            import tfswap
            from tfswap.core.budget import BudgetError

            try:
                fn = tfswap.optimize(step.concrete_fn, cap, generations=args.generations,
                                     seed=0, workers=args.workers, inputs=step.batch,
                                     parameters="auto")
            except BudgetError as err:
                row.update(trains=False, out_of_memory=True, error=f"BudgetError: {err}"[:1500],
                           plan_s=time.perf_counter() - started)
                return row
            row.update(plan_s=time.perf_counter() - started, swaps=len(fn.plan.swaps),
                       planner=fn.plan.planner, predicted_peak_bytes=fn.plan.prediction.peak_bytes,
                       moved_bytes=fn.relocation.nbytes if fn.relocation else 0,
                       optimize_measured_peak_bytes=fn.measured_peak_bytes)
            variables = fn.captured.variables
        elif policy == "checkpoint":
            fn, optimizer = tf_peers.checkpointed(step)
            variables = _variables(step.model, optimizer)
        else:
            fn = step.concrete_fn if policy == "tf" else _swapping(step.concrete_fn)
            variables = _variables(step.model, step.optimizer)
        sync(fn(*step.batch))   # traced, autotuned; out of memory here: does not train
        if args.emulated:
            if policy == "tfswap":
                row["peak_bytes"] = fn.measured_peak_bytes or fn.plan.prediction.peak_bytes
            else:
                row["peak_bytes"] = _emulated_peak(fn, step.batch)
            row["trains"] = not capped or row["peak_bytes"] <= cap
            row["out_of_memory"] = not row["trains"]
            if not row["trains"]:
                row["error"] = f"measured peak {row['peak_bytes']} B > the card's {cap} B"
                return row
        else:
            row["peak_bytes"] = _gpu_peak(fn, step.batch, variables, device)
            row["trains"], row["out_of_memory"] = True, False
        row["step_s"] = step_time(fn, step.batch, variables, **timing)
        row["samples_per_s"] = batch / row["step_s"]
    except tf.errors.ResourceExhaustedError as err:
        row.update(trains=False, out_of_memory=True,
                   error=f"ResourceExhaustedError: {str(err).splitlines()[0][:500]}")
    except Exception as err:   # a failure other than memory is reported, not counted as OOM
        row.update(trains=False, out_of_memory=False, error=f"{type(err).__name__}: {err}"[:1500],
                   traceback=traceback.format_exc()[-3000:])
    finally:
        row["trial_s"] = time.perf_counter() - started
    return row


def child(args) -> None:
    """One trial in a fresh process (GPU): the card capped before anything runs."""
    model, policy, batch, capped = args.trial.split(":")
    capped = capped == "1"
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        raise SystemExit("no GPU is visible to TensorFlow; pass --emulated for the CPU stand-in")
    if capped:
        tf.config.set_logical_device_configuration(
            gpus[0], [tf.config.LogicalDeviceConfiguration(
                memory_limit=cap_of(args, model) // (1 << 20))])
    device = tf.config.list_logical_devices("GPU")[0].name
    emit(run_trial(args, model, policy, int(batch), capped, device))


# ---------------------------------------------------------------- the search

class Trials:
    """Every trial once: cached by (model, policy, batch, capped), saved as it goes."""

    def __init__(self, args, out: Path):
        self.args, self.out = args, out
        self.path = out.with_name(out.stem + ".trials.csv")
        self.log = out.with_suffix(".log")
        self.rows: dict[tuple, dict] = {}
        self.started = time.monotonic()
        if args.resume and self.path.with_suffix(".jsonl").exists():
            for row in read_rows(self.path):
                self.rows[self._key(row)] = row
        if args.emulated:
            from tfswap.tf import emulate

            emulate.setup()

    @staticmethod
    def _key(row):
        return row["model"], row["policy"], int(row["batch"]), bool(row["capped"])

    def out_of_time(self) -> bool:
        deadline = self.args.deadline_s
        return deadline is not None and time.monotonic() - self.started > deadline

    def get(self, model, policy, batch, capped=True) -> dict | None:
        key = (model, policy, batch, capped)
        if key in self.rows:
            return self.rows[key]
        if self.out_of_time():
            return None
        if self.args.emulated:
            row = run_trial(self.args, model, policy, batch, capped, "/device:CPU:0")
            import keras

            keras.backend.clear_session()
            gc.collect()
        else:
            row = self._in_child(model, policy, batch, capped)
        self.rows[key] = row
        print(describe(row), flush=True)
        write_rows(list(self.rows.values()), self.path, TRIAL_COLUMNS)
        return row

    def _in_child(self, model, policy, batch, capped) -> dict:
        env = dict(os.environ)
        env.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
        env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
        cmd = [sys.executable, str(Path(__file__).resolve()), "--models", model,
               "--policies", f"tf,{policy}", "--generations", str(self.args.generations),
               "--trial", f"{model}:{policy}:{batch}:{int(capped)}"]
        if self.args.cap is not None:
            cmd += ["--cap", str(self.args.cap)]
        if self.args.workers is not None:
            cmd += ["--workers", str(self.args.workers)]
        rows, failure = run_child(cmd, env, self.log, self.args.timeout_s, cwd=str(ROOT))
        if rows:
            return rows[-1]
        # A process killed by CUDA's out-of-memory abort leaves no row.
        return dict(model=model, policy=policy, batch=batch, capped=capped,
                    cap_bytes=cap_of(self.args, model), trains=False, out_of_memory=False,
                    error=f"the trial's process failed: {failure} (see {self.log.name})")


def describe(row) -> str:
    cap = "capped" if row["capped"] else "no limit"
    if row.get("trains"):
        return (f"{row['model']} {row['policy']} b{row['batch']} ({cap}): trains, "
                f"{row['step_s'] * 1e3:.1f} ms/step, peak {row['peak_bytes'] / 2**20:.1f} MiB")
    why = "out of memory" if row.get("out_of_memory") else "error"
    return f"{row['model']} {row['policy']} b{row['batch']} ({cap}): {why}: " \
           f"{(row.get('error') or '')[:200]}"


def largest_batch(trials: Trials, model: str, policy: str, start: int, limit: int):
    """(largest batch that trained or None, why the search stopped)."""
    resolution = trials.args.resolution
    good, bad, batch = 0, None, start
    while batch <= limit:
        row = trials.get(model, policy, batch)
        if row is None:
            return good or None, "deadline"
        if row.get("trains"):
            good, batch = batch, batch * 2
            continue
        if not row.get("out_of_memory"):
            return good or None, row.get("error") or "failed"
        bad = batch
        break
    if bad is None:
        return good, f"trains at the limit, {limit}"
    while bad - good > max(1, good // resolution):
        batch = (good + bad) // 2
        row = trials.get(model, policy, batch)
        if row is None:
            return good or None, "deadline"
        if row.get("trains"):
            good = batch
        elif row.get("out_of_memory"):
            bad = batch
        else:
            return good or None, row.get("error") or "failed"
    return good or None, None


def run(args) -> list[dict]:
    out = Path(args.out)
    trials = Trials(args, out)
    table = SMALL if args.small else FULL
    summary = []
    for model in args.models:
        spec = table[model]
        if args.max_batch is not None:
            spec = dataclasses.replace(spec, limit=min(spec.limit, args.max_batch))
        cap = cap_of(args, model)
        largest, notes = {}, {}
        largest["tf"], notes["tf"] = largest_batch(trials, model, "tf", spec.start, spec.limit)
        for policy in args.policies:
            if policy == "tf":
                continue
            largest[policy], notes[policy] = largest_batch(
                trials, model, policy, largest["tf"] or spec.start, spec.limit)
        ideal = {}
        if largest["tf"]:
            for k in args.oversubscription:
                row = trials.get(model, "tf", k * largest["tf"], capped=False)
                if row and row.get("trains"):
                    ideal[k] = row["samples_per_s"]
        for policy in args.policies:
            best = largest[policy]
            # A policy that failed otherwise than for memory (or cannot run here) has
            # no throughput to measure.
            failed = notes[policy] not in (None, "deadline") and \
                not notes[policy].startswith("trains at the limit")
            at = trials.rows.get((model, policy, best, True)) if best else None
            row = dict(model=model, policy=policy, cap_bytes=cap, largest_batch=best,
                       note=notes[policy])
            if best and largest["tf"]:
                row["largest_vs_tf"] = best / largest["tf"]
            if at and at.get("trains"):
                row["per_sample_s"] = at["step_s"] / best
            for k in args.oversubscription:
                if k not in ideal or failed:
                    continue
                got = trials.get(model, policy, k * largest["tf"])
                if got is not None:
                    rate = got["samples_per_s"] if got.get("trains") else 0.0
                    row[f"throughput_{k}x_vs_ideal"] = rate / ideal[k]
            summary.append(row)
            print(summarise(row), flush=True)
        write_rows(summary, out, COLUMNS)
    plot(summary, out.with_suffix(".png"), args)
    return summary


def summarise(row) -> str:
    parts = [f"{row['model']} {row['policy']}: largest batch {row['largest_batch']}"]
    if row.get("largest_vs_tf") is not None:
        parts.append(f"{row['largest_vs_tf']:.2f}x TF's")
    for key in ("throughput_2x_vs_ideal", "throughput_4x_vs_ideal"):
        if row.get(key) is not None:
            parts.append(f"{key.split('_')[1]}: {row[key]:.2f} of ideal")
    if row.get("note"):
        parts.append(f"({row['note'][:160]})")
    return ", ".join(parts)


def plot(summary, path: Path, args) -> bool:
    """Two panels: largest batch over plain TF's, throughput at 2x over ideal."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    models = list(dict.fromkeys(r["model"] for r in summary))
    policies = list(dict.fromkeys(r["policy"] for r in summary))
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    panels = (("largest_vs_tf", "largest batch / plain TF's"),
              (f"throughput_{args.oversubscription[0]}x_vs_ideal" if args.oversubscription
               else "throughput_2x_vs_ideal",
               f"throughput at {args.oversubscription[0] if args.oversubscription else 2}x "
               "TF's batch / ideal"))
    width = 0.8 / max(1, len(policies))
    for ax, (key, title) in zip(axes, panels):
        for j, policy in enumerate(policies):
            values = []
            for m in models:
                row = next((r for r in summary if r["model"] == m and r["policy"] == policy), {})
                values.append(row.get(key) or 0.0)
            ax.bar([i + j * width for i in range(len(models))], values, width, label=policy)
        ax.set_xticks([i + width * (len(policies) - 1) / 2 for i in range(len(models))])
        ax.set_xticklabels(models)
        ax.set_title(title, fontsize=10)
    axes[0].legend(fontsize=8)
    where = "emulated device (CPU)" if args.emulated else "GPU"
    fig.suptitle(f"tfswap and what a TF user does instead, {where}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def merge(args) -> None:
    """The trials of several runs (their --out CSVs) into --out's, then the summary."""
    out = Path(args.out)
    rows = {}
    for path in map(Path, args.merge):
        for row in read_rows(path.with_name(path.stem + ".trials.csv")):
            rows[Trials._key(row)] = row
    write_rows(list(rows.values()), out.with_name(out.stem + ".trials.csv"), TRIAL_COLUMNS)
    args.resume, args.deadline_s = True, 0   # summarise what is there, run nothing new
    run(args)


def main(argv=None):
    args = parse_args(argv)
    if args.trial:
        return child(args)
    if args.merge:
        return merge(args)
    run(args)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()

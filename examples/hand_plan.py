"""Write a swap plan by hand, apply it to a Keras training step and run it.

    python examples/hand_plan.py

Runs on the emulated device (CPU:0 = accelerator, CPU:1 = host).
"""

import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # research/ beside tfswap/
from tfswap.tf import emulate

emulate.setup()  # before TensorFlow creates its devices

from tfswap import zoo  # noqa: E402
from tfswap.core.plan import Plan, Swap  # noqa: E402
from tfswap.tf import capture, ir, measure, rewrite, runtime  # noqa: E402
from research import quickplan  # noqa: E402

step = zoo.transformer(batch=8)
captured = capture.capture(step.concrete_fn)
graph = ir.to_dataflow_graph(captured)
baseline = measure.measure(captured, captured.graph_def, step.batch)
schedule = quickplan.observed_schedule(graph, baseline)

# Swap the largest tensor that is read once in the forward pass and once in the
# backward pass: out after its forward reader, in two ops before its backward one.
position = {op: k for k, op in enumerate(schedule)}
best = None
for t in graph.tensors:
    readers = sorted(position[graph.ops[c].name] for c in t.consumers)
    if t.swappable and len(readers) >= 2 and readers[-1] - readers[0] > 50:
        if best is None or t.nbytes > best[0].nbytes:
            best = (t, readers)
tensor, readers = best
swap = Swap(tensor=tensor.name, out_after=schedule[readers[0]],
            in_after=schedule[readers[-1] - 2], bytes=tensor.nbytes,
            consumers=tuple(schedule[r] for r in readers[1:]))
plan = Plan(schedule=tuple(schedule), swaps=(swap,))
print("swapping", swap.tensor, swap.bytes, "bytes")

rewritten = rewrite.rewrite(captured, plan, emulate.DEVICE, emulate.HOST)
fn = runtime.bind(captured, rewritten.graph_def)
print("loss", float(fn(*step.batch)["loss"]))
after = measure.measure(captured, rewritten.graph_def, step.batch)
print("device peak", baseline.peak_bytes, "->", after.peak_bytes)

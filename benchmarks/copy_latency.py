"""What one SwapOut / SwapIn costs on the emulated device, beyond its bytes.

    .venv/bin/python benchmarks/copy_latency.py [--sizes 4096,65536,262144,1048576]
        [--count 64] [--repeats 31] [--inter-op-threads 1]

One session on the emulated device (CPU:0 the device, CPU:1 the host) holds
a device tensor of each size and three sets of targets per size: the tensor
alone, ``--count`` SwapOuts of it (to the host), and ``--count`` SwapOut +
SwapIn pairs.  The three are run untraced, alternating (so the machine's
changing load touches them alike), ``--repeats`` times each; a swap-out's
cost is (outs - alone) / count and a swap-in's (pairs - outs) / count, from
the medians ("isolated").  A line of cost against bytes over the sizes (least squares on
relative residuals, so the small sizes count as much as the large) gives
for each direction the per-copy latency (its intercept,
``DeviceSpec.copy_latency_s``) and the copy rate (its slope), printed next to
``cpu_emulated()``'s memcpy bandwidth.

"In a chain": what a swap adds to a step wired as ``tfswap.tf.rewrite``
wires one.  A chain of ``4 * --count`` adds on the device; in one copy of
it every fourth op's output is swapped out (a SwapOut on the host, which the
next op waits for), swapped back in after the op after that (its trigger),
and read by the op after the trigger; in the other copy that op reads the
original.  (swapped - plain) / count is one swap's cost, a swap-out and a
swap-in, with their cross-device edges; less the bytes at the memcpy rate,
halved, it is the per-copy latency the simulator should charge; the same
line fit over the sizes gives a latency and the rate the copies move at there.
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tfswap.tf import emulate  # noqa: E402

emulate.setup()

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.protobuf import config_pb2  # noqa: E402

from tfswap import ops  # noqa: E402
from research import fidelity  # noqa: E402
from tfswap.core.devices import cpu_emulated  # noqa: E402


def build(sizes, count):
    """The graph, its variable initialisers, and per size the three target sets."""
    lib = ops.load()
    graph = tf.Graph()
    targets = {}
    with graph.as_default():
        inits = []
        for nbytes in sizes:
            with tf.device(emulate.DEVICE):
                var = tf.compat.v1.Variable(tf.zeros([nbytes // 4], tf.float32),
                                            use_resource=True, name=f"x{nbytes}")
                inits.append(var.initializer)
                x = var.read_value()
            outs, ins = [], []
            for _ in range(count):
                with tf.device(emulate.HOST):
                    host = lib.swap_out(x)
                with tf.device(emulate.DEVICE):
                    back = lib.swap_in(host)
                outs.append(host.op)
                ins.append(back.op)
            targets[nbytes] = ([x.op], [x.op] + outs, [x.op] + outs + ins)
    return graph, inits, targets


def build_chain(graph, nbytes, count):
    """Two chains of ``4 * count`` adds (plain, swapped): their last ops."""
    lib = ops.load()
    with graph.as_default():
        with tf.device(emulate.DEVICE):
            var = tf.compat.v1.Variable(tf.ones([nbytes // 4], tf.float32),
                                        use_resource=True, name=f"c{nbytes}")
            start = var.read_value()
        ends = []
        for swapped in (False, True):
            y, host = [start], None
            for i in range(4 * count):
                # Op i % 4 == 3 reads the output of op i - 3 (swapped: through the
                # host); op i - 2 waits for the swap-out, op i - 1 triggers the swap-in.
                b = start
                if swapped and i % 4 == 3:
                    with tf.device(emulate.DEVICE), tf.control_dependencies([y[i - 1].op]):
                        b = lib.swap_in(host)
                elif i % 4 == 3:
                    b = y[i - 2]
                deps = [host.op] if swapped and i % 4 == 1 else []
                with tf.device(emulate.DEVICE), tf.control_dependencies(deps):
                    y.append(y[-1] + b)
                if swapped and i % 4 == 0:
                    with tf.device(emulate.HOST):
                        host = lib.swap_out(y[-1])
            ends.append(y[-1].op)
    return var.initializer, ends


def measure_chain(sizes, count, repeats, threads):
    """Per size: (median seconds one swap adds to the chain, run spread)."""
    graph = tf.Graph()
    inits, chains = [], {}
    for nbytes in sizes:
        init, chains[nbytes] = build_chain(graph, nbytes, count)
        inits.append(init)
    result = {}
    with tf.compat.v1.Session(graph=graph, config=_config(threads)) as sess:
        sess.run(inits)
        for nbytes in sizes:
            times = _alternate(sess, chains[nbytes], repeats)
            plain, swapped = (float(np.median(x)) for x in times)
            result[nbytes] = ((swapped - plain) / count, fidelity.spread(times[1]))
    return result


def _config(threads):
    cfg = config_pb2.ConfigProto()
    cfg.device_count["CPU"] = 2
    cfg.inter_op_parallelism_threads = threads
    cfg.use_per_session_threads = True
    return cfg


def _alternate(sess, target_sets, repeats):
    """Wall times of ``repeats`` runs of each target set, alternating, after a warm-up."""
    for t in target_sets:
        sess.run(t)
    times = [[] for _ in target_sets]
    for _ in range(repeats):
        for k, t in enumerate(target_sets):
            start = time.perf_counter()
            sess.run(t)
            times[k].append(time.perf_counter() - start)
    return times


def measure(sizes, count, repeats, threads):
    """Per size: (median seconds per swap-out, per swap-in, run spread IQR/median)."""
    graph, inits, targets = build(sizes, count)
    result = {}
    with tf.compat.v1.Session(graph=graph, config=_config(threads)) as sess:
        sess.run(inits)
        for nbytes in sizes:
            times = _alternate(sess, targets[nbytes], repeats)
            alone, outs, pairs = (float(np.median(x)) for x in times)
            result[nbytes] = ((outs - alone) / count, (pairs - outs) / count,
                              fidelity.spread(times[2]))
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="4096,65536,262144,1048576",
                        help="tensor sizes in bytes, comma-separated (multiples of 4)")
    parser.add_argument("--count", type=int, default=64, help="swaps per run")
    parser.add_argument("--repeats", type=int, default=31, help="timed runs per target set")
    parser.add_argument("--inter-op-threads", type=int, default=1)
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    if any(s <= 0 or s % 4 for s in sizes) or args.count < 1 or args.repeats < 1:
        parser.error("sizes must be positive multiples of 4, count and repeats >= 1")
    result = measure(sizes, args.count, args.repeats, args.inter_op_threads)
    print("Isolated:\n")
    print("| bytes | swap-out (us) | swap-in (us) | spread of a run |")
    print("|---|---|---|---|")
    for nbytes in sizes:
        o, i, spread = result[nbytes]
        print(f"| {nbytes} | {o * 1e6:.1f} | {i * 1e6:.1f} | {spread:.0%} |")
    x = np.array([float(s) for s in sizes])
    bw = cpu_emulated().h2d_bytes_per_s
    print(f"\ncpu_emulated() memcpy bandwidth: {bw / 1e9:.2f} GB/s")
    for k, direction in enumerate(("swap-out (d2h)", "swap-in (h2d)")):
        y = np.array([result[s][k] for s in sizes])
        slope, intercept = np.polyfit(x, y, 1, w=1 / y)   # relative residuals
        rate = f"{1 / slope / 1e9:.2f} GB/s" if slope > 0 else "no slope"
        print(f"{direction}: latency {intercept * 1e6:.1f} us, {rate}; smallest size less "
              f"its bytes at the memcpy rate: {(y[0] - sizes[0] / bw) * 1e6:.1f} us")
    chain = measure_chain(sizes, args.count, args.repeats, args.inter_op_threads)
    print("\nIn a chain (one swap = a swap-out and a swap-in):\n")
    print("| bytes | one swap adds (us) | per copy less its bytes (us) | spread of a run |")
    print("|---|---|---|---|")
    for nbytes in sizes:
        cost, spread = chain[nbytes]
        print(f"| {nbytes} | {cost * 1e6:.1f} | {(cost / 2 - nbytes / bw) * 1e6:.1f} "
              f"| {spread:.0%} |")
    y = np.array([chain[s][0] / 2 for s in sizes])
    slope, intercept = np.polyfit(x, y, 1, w=1 / y)
    rate = f"{1 / slope / 1e9:.2f} GB/s" if slope > 0 else "no slope"
    print(f"\nfit, per copy in a chain: latency {intercept * 1e6:.1f} us, {rate} "
          "(DeviceSpec.copy_latency_s and the link rate the fidelity benchmark can take)")

if __name__ == "__main__":
    main()

"""Per-copy cost of the emulated link beyond its bytes (for the simulator's copy_latency_s).

    .venv/bin/python benchmarks/link_latency.py [--bandwidth 200e6] [--bytes 16384 65536]
        [--copies 200] [--threads 2] [--repeats 7] [--overhead]

A chain of ``--copies`` dependent copies (swap-out, swap-in, swap-out, ...: each
copy reads the previous one's output, so nothing overlaps and the link is never
idle by the plan's choice) of one tensor of ``--bytes`` on the emulated device,
run in a ``tf.compat.v1.Session`` with ``--threads`` inter-op threads as
``tfswap.tf.measure`` runs the fidelity study.  The chain's step time less
copies * bytes / bandwidth, over the copies, is what one copy costs beyond its
bytes: the executor's dispatch of the op, the timer thread's wake-up and the
hand-back to the executor.  Median of ``--repeats`` runs after a warm-up.

``--overhead``: what a copy costs the compute beside it.  A chain of 2000
small MatMuls (an LSTM cell's, 16x64 by 64x256, each reading the previous
one) runs alone, then with ``--copies`` swap-outs of its intermediate results
spread along it (each followed by its swap-in, read only by a sum after the
chain, so no MatMul waits for a copy).  The chain's extra time over the
copies is the CPU the executor spends on a swap op (dispatch, allocation,
memcpy, the timer thread's hand-back) taken from the compute on this 2-core
machine.  Median of ``--repeats`` alternating runs of each.
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

from tfswap import ops  # noqa: E402


def _config(threads: int):
    """A session on the emulated device (2 CPUs) with ``threads`` inter-op threads of
    its own, as ``tfswap.tf.measure`` runs the fidelity study."""
    cfg = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=threads,
                                   use_per_session_threads=True)
    cfg.device_count["CPU"] = 2
    return cfg


def chain_time(nbytes: int, copies: int, bw: float, threads: int, repeats: int) -> float:
    graph = tf.Graph()
    with graph.as_default():
        with tf.device(emulate.DEVICE):
            x = tf.compat.v1.placeholder(tf.float32, [nbytes // 4])
            t = x
            for k in range(copies):
                f = ops.swap_out if k % 2 == 0 else ops.swap_in
                t = f(t, link_bytes_per_s=bw)
            out = tf.reduce_sum(t)
    feed = {x: np.ones(nbytes // 4, np.float32)}
    with tf.compat.v1.Session(graph=graph, config=_config(threads)) as sess:
        sess.run(out, feed)
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            sess.run(out, feed)
            times.append(time.perf_counter() - start)
    return float(np.median(times))


BUSY_SHAPES = ((16, 64), (64, 256))   # an LSTM cell's input projection, batch 16
CHAIN = 2000


def overhead_per_copy(nbytes: int, copies: int, bw: float, threads: int,
                      repeats: int) -> tuple[float, float]:
    """(chain alone, extra time per copy) in seconds: module docstring."""
    graph = tf.Graph()
    with graph.as_default(), tf.device(emulate.DEVICE):
        w = tf.constant(np.full(BUSY_SHAPES[1], 1e-3, np.float32))
        x = tf.compat.v1.placeholder(tf.float32, BUSY_SHAPES[0])
        h = x
        payload = tf.compat.v1.placeholder(tf.float32, [nbytes // 4])
        every = max(1, CHAIN // max(1, copies))
        back = []
        for k in range(CHAIN):
            h = tf.matmul(h, w)[:, :BUSY_SHAPES[0][1]]
            if k % every == 0 and len(back) < copies // 2:
                # The copy's bytes: the payload, made ready by this MatMul.
                with tf.control_dependencies([h]):
                    src = tf.identity(payload)
                back.append(ops.swap_in(ops.swap_out(src, link_bytes_per_s=bw),
                                        link_bytes_per_s=bw))
        alone = tf.reduce_sum(h)
        with_copies = [alone] + [tf.reduce_sum(b) for b in back]
    feed = {x: np.ones(BUSY_SHAPES[0], np.float32), payload: np.ones(nbytes // 4, np.float32)}
    t_alone, t_with = [], []
    with tf.compat.v1.Session(graph=graph, config=_config(threads)) as sess:
        sess.run(with_copies, feed)
        for _ in range(repeats):
            for fetch, times in ((alone, t_alone), (with_copies, t_with)):
                start = time.perf_counter()
                sess.run(fetch, feed)
                times.append(time.perf_counter() - start)
    base = float(np.median(t_alone))
    return base, (float(np.median(t_with)) - base) / (2 * len(back))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bandwidth", type=float, default=200e6)
    parser.add_argument("--bytes", type=int, nargs="+", default=[4096, 16384, 65536, 262144])
    parser.add_argument("--copies", type=int, default=200)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--overhead", action="store_true",
                        help="measure what a copy costs the compute beside it instead")
    args = parser.parse_args()
    ops.load()
    if args.overhead:
        print("| bytes | copies | MatMul chain alone (ms) | extra per copy (us) |")
        print("|---|---|---|---|")
        for nbytes in args.bytes:
            base, extra = overhead_per_copy(nbytes, args.copies, args.bandwidth,
                                            args.threads, args.repeats)
            print(f"| {nbytes} | {args.copies} | {base * 1e3:.2f} | {extra * 1e6:.1f} |",
                  flush=True)
        return
    print("| bytes | copies | chain (ms) | bytes / bandwidth (ms) | per copy beyond its bytes (us) |")
    print("|---|---|---|---|---|")
    for nbytes in args.bytes:
        t = chain_time(nbytes, args.copies, args.bandwidth, args.threads, args.repeats)
        ideal = args.copies * nbytes / args.bandwidth
        print(f"| {nbytes} | {args.copies} | {t * 1e3:.2f} | {ideal * 1e3:.2f} "
              f"| {(t - ideal) / args.copies * 1e6:.1f} |", flush=True)


if __name__ == "__main__":
    main()

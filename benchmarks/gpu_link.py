"""SwapOut / SwapIn bandwidth and per-copy latency on the GPU (issue #19, point 5).

    python benchmarks/gpu_link.py [--sizes 4096,...,268435456] [--short 2] [--long 10]
        [--repeats 5] [--modes chained,pipelined] [--out benchmarks/out/gpu_link_h100.csv]
    python benchmarks/gpu_link.py --emulated [--link-bytes-per-s 2e9] ...   # no GPU

For each size and direction (d2h: ``SwapOut``, h2d: ``SwapIn``, duplex: one of
each at once, from 1 MiB up), a chain of copies of one tensor runs inside one
``tf.function`` (each copy waits for the previous one; the call returns when
the last is done; nothing is read back with ``.numpy()``): one copy's time is
(t(long chain) - t(short chain)) / (long - short), the median of ``--repeats``
alternating runs after one untimed run of each (tracing, and the first pinned
allocations).  ``pipelined`` rows run the same copies without the chain's control
edges: all issued at once, they queue on the direction's stream as a plan's copies
do, and one copy's time leaves out the chain's completion hand-back (the figure
``tfswap.tf.gpu.measured_spec`` fits).  The host buffers are the kernels' own: a GPU ``SwapOut``
allocates its output pinned (``on_host`` + ``gpu_compatible``), and the h2d chain
copies from one such buffer (:mod:`tfswap.tf.link`).

Prints a table, then per direction the line per-copy time = latency + bytes /
rate fitted over the sizes (the figures ``DeviceSpec`` takes: ``copy_latency_s``,
``h2d_bytes_per_s``, ``d2h_bytes_per_s``, ``duplex_bytes_per_s``), and the GPU's
PCIe link as nvidia-smi reports it.  Writes the rows as CSV (``--out``).

On the GPU machine (``../shared/gpu/README.md``)::

    source .gpu/kit/env.sh; python3 benchmarks/gpu_link.py --out $OUT/gpu_link_h100.csv
"""

import argparse
import csv
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

COLUMNS = ("device", "direction", "mode", "bytes", "short", "long", "per_copy_s", "spread_s",
           "bytes_per_s")
MODES = ("chained", "pipelined")
SIZES = tuple(4096 * 4 ** k for k in range(10))   # 4 KiB .. 1 GiB; default stops at 256 MiB
DUPLEX_FROM = 1 << 20


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--emulated", action="store_true",
                        help="run on the emulated device (CPU:0 the device, CPU:1 the host)")
    parser.add_argument("--link-bytes-per-s", type=float, default=0.0,
                        help="emulated device only: the emulated link's rate (0: memcpy)")
    parser.add_argument("--sizes", default=",".join(str(s) for s in SIZES[:-1]),
                        help="bytes per copy, comma-separated (default 4 KiB .. 256 MiB)")
    parser.add_argument("--directions", default="d2h,h2d,duplex")
    parser.add_argument("--short", type=int, default=2)
    parser.add_argument("--long", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--modes", default=",".join(MODES),
                        help="chained (each copy after the previous one's completion), "
                             "pipelined (all issued at once), or both")
    parser.add_argument("--out", default="benchmarks/out/gpu_link_h100.csv")
    args = parser.parse_args(argv)
    args.sizes = [int(float(s)) for s in args.sizes.split(",") if s]
    args.directions = [d for d in args.directions.split(",") if d]
    args.modes = [m for m in args.modes.split(",") if m]
    if not args.modes or set(args.modes) - set(MODES):
        parser.error(f"--modes takes {', '.join(MODES)}, got {','.join(args.modes)}")
    return args


def pcie_link() -> str:
    """The GPU's PCIe link as nvidia-smi reports it, or why not."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return "nvidia-smi not found"
    query = "name,pcie.link.gen.current,pcie.link.gen.max,pcie.link.width.current," \
            "pcie.link.width.max"
    try:
        out = subprocess.run([smi, f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"nvidia-smi failed: {err}"
    return (f"{query}: {out.stdout.strip()}" if out.returncode == 0
            else f"nvidia-smi exit {out.returncode}: {out.stderr.strip()}")


def main(argv=None):
    args = parse_args(argv)
    if args.emulated:
        from tfswap.tf import emulate

        emulate.setup()
        device, host = emulate.DEVICE, emulate.HOST
    import tensorflow as tf

    from tfswap.tf import link

    if not args.emulated:
        gpus = tf.config.list_logical_devices("GPU")
        if not gpus:
            sys.exit("no GPU is visible to TensorFlow; pass --emulated to measure the "
                     "emulated device")
        device, host = gpus[0].name, "/device:CPU:0"
        if args.link_bytes_per_s:
            sys.exit("--link-bytes-per-s is for the emulated device only")
        from tfswap.tf import gpu

        print(f"GPU: {gpu.device_name(device)}; {pcie_link()}", flush=True)
    rows = []
    print("| direction | mode | bytes | per copy (us) | spread (us) | GB/s |\n"
          "|---|---|---|---|---|---|", flush=True)
    for mode in args.modes:
        for direction in args.directions:
            for nbytes in args.sizes:
                if direction == "duplex" and nbytes < DUPLEX_FROM:
                    continue
                s = link.sample(direction, nbytes, device, host, short=args.short,
                                long=args.long, repeats=args.repeats,
                                link_bytes_per_s=args.link_bytes_per_s,
                                chained=mode == "chained")
                rows.append(s)
                print(f"| {direction} | {mode} | {s.nbytes} | {s.per_copy_s * 1e6:.1f} "
                      f"| {s.spread_s * 1e6:.1f} | {s.bytes_per_s / 1e9:.2f} |", flush=True)
    print()
    for mode in args.modes:
        for direction in args.directions:
            mine = [s for s in rows if s.direction == direction and s.chained == (mode == "chained")]
            if len({s.nbytes for s in mine}) < 2:
                continue
            try:
                latency, rate = link.fit(mine)
            except ValueError as err:   # too few sizes timed above the noise
                print(f"{direction} {mode}: no line fitted ({err})")
                continue
            field = {"d2h": "d2h_bytes_per_s", "h2d": "h2d_bytes_per_s",
                     "duplex": "duplex_bytes_per_s (both ways together)"}[direction]
            print(f"{direction} {mode}: latency {latency * 1e6:.1f} us per copy "
                  f"(copy_latency_s), {rate / 1e9:.2f} GB/s ({field})")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(COLUMNS)
        for s in rows:
            writer.writerow((device, s.direction, "chained" if s.chained else "pipelined",
                             s.nbytes, s.short, s.long,
                             f"{s.per_copy_s:.9g}", f"{s.spread_s:.9g}",
                             f"{s.bytes_per_s:.6g}"))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

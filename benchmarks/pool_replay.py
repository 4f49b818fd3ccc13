"""Throughput of the pool allocator over host memory: replay and multithreaded stress.

Command: python benchmarks/pool_replay.py   (prints seconds; machine-dependent)
"""

import ctypes
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tfswap.ops import allocator as A  # noqa: E402

MiB = 1 << 20


def events(n, seed=0):
    """Random alloc/free mix, at most ~60 live, sizes hitting every class and the small pool."""
    rng = random.Random(seed)
    ev, live, h = [], [], 0
    for _ in range(n):
        if live and (len(live) > 60 or rng.random() < 0.5):
            ev.append((False, live.pop(rng.randrange(len(live))), 0))
        else:
            ev.append((True, h, rng.choice([100, 5000, MiB, 2 * MiB - 7, 3 * MiB])))
            live.append(h)
            h += 1
    return ev


def main():
    alloc = A.PoolAllocation(class_bytes=(MiB, 2 * MiB, 4 * MiB), class_count=(64, 64, 64),
                             small_pool_bytes=8 * MiB, plan_id="bench")
    ev = events(1_000_000)
    A.replay(alloc, ev[:10])  # loads TensorFlow and the library first
    t = time.perf_counter()
    r = A.replay(alloc, ev)
    total = time.perf_counter() - t
    # The C replay alone, on pre-encoded arrays.
    lib = A._clib()
    is_alloc, handles, nbytes = A._encode_events(ev)
    pool = A._create(lib, alloc)
    n = len(ev)
    out_c, out_o = np.zeros(n, np.int32), np.zeros(n, np.int64)
    failed, info = ctypes.c_int64(), np.zeros(3, np.int64)
    err = ctypes.create_string_buffer(512)
    t = time.perf_counter()
    rc = lib.tfswap_pool_replay(pool, n, A._ptr(is_alloc), A._ptr(handles), A._ptr(nbytes),
                                A._ptr(out_c), A._ptr(out_o), ctypes.byref(failed),
                                A._ptr(info), err, 512)
    core = time.perf_counter() - t
    lib.tfswap_pool_destroy(pool)
    assert rc == 0, err.value
    print(f"{n} events: replay() {total:.2f} s end to end, C replay {core * 1e3:.0f} ms "
          f"({core / n * 1e9:.0f} ns/event); per-class peaks {r.per_class_peak}")
    t = time.perf_counter()
    made, _ = A.stress(alloc, threads=8, ops_per_thread=100_000, seed=1)
    print(f"stress, 8 threads x 100000 ops: {made} allocations, "
          f"{time.perf_counter() - t:.2f} s, stats consistent")


if __name__ == "__main__":
    main()

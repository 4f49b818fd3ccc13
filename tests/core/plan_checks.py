"""Helpers shared by the planner, simulator and native tests (no TensorFlow)."""

import dataclasses

import numpy as np

from tfswap.core.compiled import CompiledGraph
from tfswap.core.devices import DeviceSpec, device_spec
from tfswap.core.planner import default_allocation

MB = 1 << 20
SPEC = DeviceSpec("test-link", memory_bytes=1 << 40, peak_flops=1e12,
                  memory_bandwidth_bytes_per_s=1e11, h2d_bytes_per_s=2e9,
                  d2h_bytes_per_s=1.5e9, duplex_bytes_per_s=2.5e9, launch_overhead_s=0.0)


def slow_v100(each_way_bytes_per_s: float, duplex_bytes_per_s: float) -> DeviceSpec:
    """The paper's V100 with a slower link: copies cost more than elementwise ops,
    so recomputation has something to win."""
    return dataclasses.replace(device_spec("v100-16g-pcie3"), h2d_bytes_per_s=each_way_bytes_per_s,
                               d2h_bytes_per_s=each_way_bytes_per_s,
                               duplex_bytes_per_s=duplex_bytes_per_s)


def budgets(cg: CompiledGraph, order: np.ndarray, fraction: float) -> int:
    """``fraction`` of the no-swap need, but never below what one op needs."""
    full = default_allocation(cg, order, 1 << 62)
    buf_class = np.arange(len(cg.ts), dtype=np.int64)[cg.buf_size_index]
    need = cg.op_class_need(buf_class, len(cg.ts))
    least = int(sum(int(n) * s for n, s in zip(need, cg.ts))) + full.small_pool_bytes
    return max(least, int(full.total_bytes * fraction)), full.total_bytes

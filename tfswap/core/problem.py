"""The planning problem: what every planner and baseline is given.

A :class:`Problem` is the lowered step as the planners see it: the dataflow
graph, the tensors that must stay on the device to the end, TensorFlow's
own order, the small-tensor threshold, where parameters start the step, and
the flattened arrays (:class:`~tfswap.core.compiled.CompiledGraph`) built
once from those.  The TensorFlow adapter builds it with
:func:`tfswap.tf.lower.lower`; framework-free code (tests, research)
builds it from a graph with :meth:`Problem.of`.

Example::

    problem = Problem.of(graph, keep=("loss:0",), small_threshold_bytes=4096)
    planners.run("tfswap.order", problem, 8 << 30, device_spec("v100-16g-pcie3"))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tfswap.core.compiled import CompiledGraph
from tfswap.core.graph import DataflowGraph

DEFAULT_SMALL_BYTES = 1 << 20


@dataclass(frozen=True, eq=False)
class Problem:
    """One step to plan.

    ``graph``: ops and tensors with times and bytes.  ``keep``: tensors live
    to the end of the step (fetches, assigned variables).  ``schedule``:
    TensorFlow's executed order (op names), the baselines' order and the
    search's starting point.  ``small_threshold_bytes``: tensors below it
    live in a small pool and are never swapped.  ``params_start_on_host``:
    parameters that are not pinned start the step in host memory (a variable
    TensorFlow keeps on the host).  ``compiled``: the flattened arrays.
    ``recomputable``: names of the ops that compute the same value when run
    again on the same inputs, which a planner may recompute instead of
    swapping their output (:mod:`tfswap.core.recompute`); empty: swaps only.
    """

    graph: DataflowGraph
    keep: tuple[str, ...]
    schedule: tuple[str, ...]
    small_threshold_bytes: int
    params_start_on_host: bool
    compiled: CompiledGraph = field(repr=False)
    recomputable: frozenset = frozenset()

    @classmethod
    def of(cls, graph: DataflowGraph, *, keep: Sequence[str] = (),
           schedule: Sequence[str] | None = None,
           small_threshold_bytes: int = DEFAULT_SMALL_BYTES,
           params_start_on_host: bool = False, recomputable=()) -> "Problem":
        """The problem of ``graph`` (``schedule`` None: its topological order)."""
        if isinstance(small_threshold_bytes, bool) or not isinstance(small_threshold_bytes, int) \
                or small_threshold_bytes < 0:
            raise ValueError(f"small_threshold_bytes must be an int >= 0 (bytes), got "
                             f"{small_threshold_bytes!r}")
        keep = tuple(keep)
        compiled = CompiledGraph.build(graph, small_threshold_bytes, keep)
        order = compiled.order_of(schedule)   # checks the schedule is a topological order
        names = tuple(graph.ops[int(o)].name for o in order)
        unknown = set(recomputable) - {op.name for op in graph.ops}
        if unknown:
            raise ValueError(f"recomputable names ops that are not in the graph: "
                             f"{sorted(unknown)[:3]}")
        return cls(graph, keep, names, int(small_threshold_bytes), bool(params_start_on_host),
                   compiled, frozenset(recomputable))

    @property
    def pinned_bytes(self) -> int:
        """Bytes of the parameters that stay on the device for the whole step."""
        cg = self.compiled
        return int(cg.buf_bytes[(cg.buf_pinned & cg.buf_persistent).astype(bool)].sum())

    @property
    def host_parameters(self) -> bool:
        """Whether some parameter starts the step in host memory and must be fetched."""
        cg = self.compiled
        return self.params_start_on_host and bool(
            (cg.buf_persistent.astype(bool) & ~cg.buf_pinned.astype(bool)).any())


__all__ = ["DEFAULT_SMALL_BYTES", "Problem"]

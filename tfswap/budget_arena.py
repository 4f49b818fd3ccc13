"""The plan's pool in a GPU's budget arena (opt-in,
:func:`tfswap.ops.allocator.install_gpu_arena`): the pool as the arena binds it
(:func:`arena_allocation`), its registration for the bound step
(:func:`arena_scope`, what :func:`tfswap.pipeline.materialize` binds with) and
the arena a bound step allocates from (:func:`arena_of`, what verification
reads the requests outside the pool from).  Elsewhere (no arena installed,
the emulated device) each is None.

Example::

    bound = runtime.bind(captured, graph_def, memory_scope=arena_scope(planned))
"""

from __future__ import annotations

import dataclasses

from tfswap.core import layout
from tfswap.core.plan import Allocation
from tfswap.core.program import from_plan
from tfswap.core.simulator import simulate
from tfswap.ops import allocator
from tfswap.tf import measure


def arena_allocation(planned) -> Allocation:
    """The plan's pool as a budget arena binds it (``planned``: a
    :class:`tfswap.pipeline.Planned`): without the objects of the parameters that
    stay on the device, which the user's variables already hold in the arena
    (:func:`tfswap.core.layout.without_resident`)."""
    problem, plan = planned.attempt.step.problem, planned.plan
    cg = problem.compiled
    prog = from_plan(cg, plan.schedule, plan.swaps, plan.resident_parameters)
    result = simulate(problem.graph, plan, planned.prepared.spec, events=True,
                      keep=problem.keep, compiled=cg)
    resident = [cg.buf_names[b] for b in prog.resident if cg.buf_persistent[b]]
    bound = layout.without_resident(result, plan.allocation, resident)
    # The small device variables the small pool counts all step (pinned,
    # persistent: tfswap.tf.lower.pin_parameters) are the user's too.
    small_variables = int(cg.small_bytes[cg.small_persistent.astype(bool)].sum())
    return dataclasses.replace(bound, small_pool_bytes=max(
        0, bound.small_pool_bytes - small_variables))


def serves_pool(prepared) -> bool:
    """Whether the step's buffers will come from the plan's pool, each an object of
    its size class (``prepared``: a :class:`tfswap.pipeline.Prepared`): on a GPU
    that allocates from a budget arena.  Elsewhere TensorFlow's allocator gives
    each buffer its own bytes."""
    return prepared.peak_method == measure.ALLOCATOR and \
        allocator.installed_gpu_arena(prepared.device) is not None


def allocator_of(prepared, attempt=None) -> str:
    """What a plan of the step must fit within its budget
    (:data:`tfswap.core.best_of.ALLOCATORS`): "pool" where the plan's pool serves
    the step (:func:`serves_pool`); elsewhere TensorFlow's allocator gives each
    buffer its own bytes, and the bytes the step holds at once must fit:
    "exact" where the rewritten step is measured (``prepared.verifiable``), else
    "guarded", where the plan's shared arena must fit too, its slack absorbing
    what the memory model misses: where nothing measures the plan (random steps
    at ``verify_rounds=0`` planned to the bytes held: 1 of 137 measured 4% over
    its budget, seeds 7000-7499), for a replicated step, whose joint model
    misses more (``benchmarks/replicas.py``, unverified: the zoo CNN's replicas
    predicted 4.51 MB and held 5.53 MB, over their 5.29 MB budget already with
    the arena's plan; issue #44), and for an ``attempt`` (a
    :class:`tfswap.pipeline.Attempt`) after such a plan measured over
    (``exact_fit`` False)."""
    if serves_pool(prepared):
        return "pool"
    exact = prepared.verifiable and not prepared.replicas and \
        (attempt is None or attempt.exact_fit)
    return "exact" if exact else "guarded"


def arena_scope(planned):
    """On a GPU that allocates from a budget arena: the plan's pool registered with
    it, and what makes it serve each call; else None."""
    prepared, plan = planned.prepared, planned.plan
    if plan.allocation is None or not serves_pool(prepared):
        return None
    arena = allocator.installed_gpu_arena(prepared.device)
    pool = arena_allocation(planned)
    return arena.binding(allocator.PoolAllocation(
        class_bytes=pool.class_bytes, class_count=pool.class_count,
        small_pool_bytes=pool.small_pool_bytes, plan_id=plan.id,
        small_threshold_bytes=pool.small_threshold_bytes, object_offsets=pool.object_offsets))


def arena_of(made):
    """The budget arena the bound step's pool is registered with, if any (``made``:
    a :class:`tfswap.pipeline.Materialized`)."""
    if made.bound.memory_scope is None:
        return None
    return allocator.installed_gpu_arena(made.planned.prepared.device)


__all__ = ["allocator_of", "arena_allocation", "arena_of", "arena_scope", "serves_pool"]

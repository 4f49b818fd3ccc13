"""How :func:`tfswap.pipeline.verify` measures a rewritten step's device peak
before the plan is accepted: on the emulated device from step stats
(:func:`by_step_stats`), on a GPU from its allocator (:func:`by_allocator`).
A replicated step's devices are measured by :func:`tfswap.replicas.measure_replicas`.

Example::

    peak, how = by_step_stats(made)       # made: a tfswap.pipeline.Materialized
"""

from __future__ import annotations

from tfswap.budget_arena import arena_of
from tfswap.tf import measure

# Sessions the rewritten step is measured in (3 runs each) before it is accepted.
SESSIONS = 2


def by_step_stats(made) -> tuple[int, str]:
    """(peak, how it was measured): the step stats of a traced Session run on the
    emulated device, the worst of 3 runs in each of :data:`SESSIONS` sessions."""
    prepared = made.planned.prepared
    # The worst of 3 runs: how soon a swap-in starts after its trigger depends
    # on the executor's threads, which moves the measured peak below the
    # plan's bound from run to run (fuzz seed 1058: 624656 to 690192 B for
    # one plan predicted at 690204 B).  In 2 sessions: runs within a session
    # agree, sessions need not (fuzz seed 1271's byte-cap plan: 394764 B in
    # the first session, 427532 B in the next four, 443916 B in another run).
    peak = max(measure.measure(prepared.captured, made.rewritten.graph_def, prepared.feed,
                               runs=3, warmup=1).peak_bytes for _ in range(SESSIONS))
    return peak, (f"the step stats of the emulated device {prepared.device} (allocation "
                  f"records), worst of 3 runs in each of {SESSIONS} sessions")


def by_allocator(made) -> tuple[int, str, bool]:
    """(peak, how it was measured, whether the device ran out of memory): the bound
    step itself on a GPU, the allocator's peak of the worst of 3 runs after a
    warm-up, the user's variables put back afterwards
    (:func:`tfswap.tf.measure.allocator_peak`); with a budget arena, how many of
    the step's requests fell outside the plan's pool."""
    prepared = made.planned.prepared
    arena = arena_of(made)
    strays = arena.stats().strays if arena is not None else 0
    m = measure.allocator_peak(made.bound, prepared.feed, prepared.captured, prepared.device,
                               runs=3, warmup=1)
    described = m.describe()
    if arena is not None:
        stats = arena.stats()
        described += (f"; the device allocates from a budget arena of {stats.arena_bytes} "
                      f"bytes, {stats.strays - strays} of the step's requests fell outside "
                      "the plan's pool" + (f" (last: {stats.last_stray})"
                                           if stats.strays > strays else ""))
    return m.peak_bytes, described, m.out_of_memory


__all__ = ["SESSIONS", "by_allocator", "by_step_stats"]

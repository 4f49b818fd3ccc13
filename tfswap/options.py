"""The settings of :func:`tfswap.optimize` and :class:`tfswap.keras.SwapCallback`,
declared and checked in one place: :class:`Options`, validated on construction.

Example::

    options = tfswap.Options("12MiB", generations=5, seed=1)
    fast = tfswap.optimize(cf, options=options)
    cb = tfswap.keras.SwapCallback(options=options)
    options.replace(seed=2)                 # another, checked again
"""

from __future__ import annotations

from concurrent.futures import Executor
from dataclasses import dataclass, fields
from typing import Any

from tfswap.core import planners, search
from tfswap.core.devices import DeviceSpec
from tfswap.core.profile import Profile

PROFILES = ("auto", "trace", "isolated", "analytic")   # how the step is profiled
PARAMETERS = ("auto", "device", "host")   # where variables live between steps


@dataclass(frozen=True)
class Options:
    """Every setting of :func:`tfswap.optimize` (and of the plans
    :class:`tfswap.keras.SwapCallback` makes), with its unit and default;
    checked on construction (a ``ValueError`` names the setting and what it
    takes).  :func:`tfswap.optimize` takes these as keywords too.

    ``memory_budget``: bytes (int), a string such as "12GiB", or a fraction
    of the device's memory (float in (0, 1]).  ``device``/``host``: where the
    step runs and where swapped tensors wait (default: the emulated device if
    set up, else the first GPU and CPU:0); both or neither, except for a step a
    ``tf.distribute`` strategy replicates, whose devices are the strategy's
    (``host`` alone, or nothing, is enough).  Variables stay where they live:
    a model and optimizer created under ``tf.device(host)`` keep their
    parameters and optimizer state in host memory, and the plan fetches each
    read before its use on the device (SwapAdvisor's parameter swapping; the
    updates run on the host).  ``device_spec``: the device's
    figures for the simulator (default "cpu-emulated" on the emulated device;
    on a GPU the preset for its name, e.g. "h100-80g-pcie5" for an "NVIDIA H100
    80GB HBM3", or for a GPU no preset describes its figures measured once and
    cached; a note in the report says which).  ``profile``: "trace" (run the step),
    "isolated" (time each op alone; for steps that do not fit), "analytic"
    (roofline from ``device_spec``), "auto" (trace, else isolated), or a
    :class:`~tfswap.core.profile.Profile` of this step made before
    (``OptimizedFunction.profile``, or ``Profile.load`` of one saved): planned on
    it, not profiled again, so the same profile and seed give the same plan.
    ``search_time``: seconds the whole call may take (profiling, every search
    and verification together); ``generations``: stop each search after this
    many generations instead, with no time limit (then the same seed gives
    the same plan on any machine).  ``seed``: the search's seed.
    ``workers``: threads that score candidates (default: all cores; no
    process is started, so a script without a main guard is safe), or with
    ``executor`` (any ``concurrent.futures.Executor``: a process pool, Dask's
    ``Client.get_executor()``) chunks per batch.  ``inputs``: sample
    arguments for the traced profile (default: random of the right shape).
    ``safety_margin``: fraction of the budget kept free for what the memory
    model does not see (kernel workspaces TF allocates outside the profile).
    ``small_tensor_bytes``: tensors below this live in a small pool and are
    never swapped (default: 1/1024 of the step's no-swap device peak, between
    4 KiB and 1 MiB, so that small models still have tensors worth moving;
    if no plan fits with it, 4 KiB).
    ``planner``: the registered planner (:mod:`tfswap.core.planners`) that
    plans the step: "tfswap" (default) keeps the fastest plan, as simulated,
    of the genetic search, the byte-cap planner, TensorFlow's order and
    recomputation alone (:func:`tfswap.core.planners.default`); another name
    (e.g. "tfswap.ga", the search alone) runs that planner only, for
    ablations.  Where TensorFlow's allocator serves the step (no budget
    arena installed) and the plan is measured (``verify_rounds`` > 0), a
    plan fits when the bytes it holds at once do; otherwise when its pool
    does (objects never in use together share memory; where the pool serves
    the step, a plan that measures over the budget is planned again with a
    disjoint pool, each object its own memory, whose rounding leaves room for
    what the model misses).
    ``verify_rounds``: where the device's peak can be measured (the emulated
    device: 3 runs in each of 2 sessions; a GPU: its allocator's peak over 3
    runs of the rewritten step), the rewritten step is measured and, if it
    needs more than the budget, planned again with the excess taken off, up to
    this many times (0: trust the model).
    ``parameters``: where the step's variables live between steps (one of
    :data:`PARAMETERS`; :mod:`tfswap.tf.homes`): "device" keeps them where
    the user created them; "host" moves every one to host memory, and the plan
    fetches each value read before its use; "auto" keeps them on the device
    when the step can be planned within the budget that way, else moves the
    variables of at least the small-tensor threshold.  Moved variables stay
    the user's objects (``get_weights``, checkpoints and ``save`` see every
    update); they are put back if planning fails.
    ``recompute``: the plan may recompute a tensor instead of swapping it where
    the simulator says that is faster (elementwise ops, normalizations and the
    like, :mod:`tfswap.tf.recomputable`; :mod:`tfswap.core.recompute`); False:
    swaps only.
    """

    memory_budget: Any
    device: str | None = None
    host: str | None = None
    device_spec: str | DeviceSpec | None = None
    profile: str = "auto"
    search_time: float = 60.0
    generations: int | None = None
    seed: int = 0
    workers: int | None = None
    executor: Executor | None = None
    inputs: Any = None
    safety_margin: float = 0.05
    small_tensor_bytes: int | None = None
    verify_rounds: int = 3
    planner: str = planners.DEFAULT_PLANNER
    progress: bool = False
    parameters: str = "auto"
    recompute: bool = True

    def __post_init__(self):
        self.check()

    @classmethod
    def of(cls, memory_budget, **kwargs) -> "Options":
        """``Options(memory_budget, **kwargs)``, with a ``TypeError`` naming the
        settings there are where a keyword is not one of them."""
        unknown = sorted(set(kwargs) - {f.name for f in fields(cls)})
        if unknown:
            raise TypeError(f"unknown setting(s) {', '.join(map(repr, unknown))}; the settings "
                            f"are {', '.join(f.name for f in fields(cls))} (tfswap.Options)")
        return cls(memory_budget, **kwargs)

    def replace(self, **changes) -> "Options":
        """These options with ``changes`` (checked again)."""
        if "memory_budget" in changes and changes["memory_budget"] is None:
            del changes["memory_budget"]
        return Options.of(**{**{f.name: getattr(self, f.name) for f in fields(self)}, **changes})

    def check(self) -> None:
        budget = self.memory_budget
        if budget is None or isinstance(budget, bool) or not isinstance(budget, (int, float, str)):
            raise ValueError(f"memory_budget must be bytes (int), a size string such as "
                             f"'12GiB' or a fraction of the device's memory, got {budget!r}")
        if not isinstance(self.profile, Profile) and self.profile not in PROFILES:
            raise ValueError(f"profile must be one of {PROFILES} or a tfswap Profile of "
                             f"the step, got {self.profile!r}")
        if self.parameters not in PARAMETERS:
            raise ValueError(f"parameters must be one of {PARAMETERS} (where the step's "
                             f"variables live between steps), got {self.parameters!r}")
        if self.planner not in planners.PLANNERS:
            raise ValueError(f"planner must be one of the registered planners "
                             f"{sorted(planners.PLANNERS)}, got {self.planner!r} (the default, "
                             f"{planners.DEFAULT_PLANNER!r}, keeps the fastest of them)")
        if not 0.0 <= self.safety_margin < 1.0:
            raise ValueError(f"safety_margin must be a fraction in [0, 1), got "
                             f"{self.safety_margin!r}")
        if isinstance(self.search_time, bool) or not (
                isinstance(self.search_time, (int, float)) and self.search_time > 0):
            raise ValueError(f"search_time must be > 0 seconds, got {self.search_time!r}")
        small = self.small_tensor_bytes
        if small is not None and (isinstance(small, bool) or not isinstance(small, int)
                                  or small < 0):
            raise ValueError(f"small_tensor_bytes must be an int >= 0 (bytes), got {small!r}")
        if not isinstance(self.recompute, bool):
            raise ValueError(f"recompute must be True or False, got {self.recompute!r}")
        if isinstance(self.verify_rounds, bool) or not isinstance(self.verify_rounds, int) \
                or self.verify_rounds < 0:
            raise ValueError(f"verify_rounds must be an int >= 0, got {self.verify_rounds!r}")
        # The search's own arguments are checked where they are defined.
        search.SearchConfig(time_budget_s=None, max_generations=self.generations or 0,
                            seed=self.seed, workers=self.workers, executor=self.executor,
                            progress=self.progress)


__all__ = ["Options", "PARAMETERS", "PROFILES"]

"""Research and benchmark helpers, kept out of the ``tfswap`` package.

* ``paper_models`` / ``paper_bench``: SwapAdvisor's Fig. 6 models and the
  comparison of every planner of :mod:`tfswap.core.planners` on them.
* ``synthetic``: random and layered dataflow graphs for tests and benchmarks.
* ``fuzz``: random TF steps optimized and compared against the unmodified step.
* ``quickplan`` / ``heuristic``: hand-rolled swap plans for rewrite experiments.
* ``fidelity``: statistics of the simulator against measurement.
* ``exact`` / ``exact_compare``: the fastest plan of a small step by exhaustive
  search under the planners' own simulator, and the planners measured against it.

Import them from the repository root (``pytest`` and the scripts in
``benchmarks/`` put it on ``sys.path``).
"""

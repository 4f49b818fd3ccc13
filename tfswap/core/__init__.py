"""The framework-free core of tfswap: graph model, plans, liveness.

Nothing under ``tfswap.core`` imports TensorFlow; it runs (and is tested)
with numpy and deap alone.
"""

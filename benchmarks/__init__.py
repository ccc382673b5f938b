"""dhmc's benchmarks, run from the repository root as ``python -m benchmarks.<name>`` (see README.md here).

Shared pieces: :mod:`benchmarks.harness` (child processes, JSON, tables), :mod:`benchmarks.machine`
(what makes a number interpretable), :mod:`benchmarks.targets` (the benchmark densities),
:mod:`benchmarks.samplers` (the peers' fixed-step HMC) and :mod:`benchmarks.probe` (where a
``dhmc.sample`` call's time went, told as an observer).
"""

__all__: list[str] = []

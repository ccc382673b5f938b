"""Scaling studies: how sampling time changes with the number of workers (strong, weak) or of chains.

:func:`run_study` times fixed-cost HMC sampling (``kernel="hmc"``, ``adapt=False``, ``warmup=0``, a fixed
step size and number of leapfrog steps per model, so that every draw costs the same) on clusters of
growing size, writes ``DIR/scaling.json`` and PNG plots, and returns the record.

- ``strong``: a fixed ensemble (``chains``) on 1, 2, 4, ... workers.
- ``weak``: ``chains_per_worker * workers`` chains on each point; the work grows with the workers.
- ``chains``: one worker, ensembles of growing size (``chains_list``), one block per segment, showing
  where the per-task and per-iteration overhead stops dominating.

The package is a driver above :mod:`dhmc.api`: ``plan`` checks the study and chooses its points,
``clusters`` gives each point fresh workers, ``measure`` times a point, ``report`` derives speedups, flags
suspect points and writes ``scaling.json``, ``study`` runs them in turn, ``plots`` draws them (what
they show: ``plot_data``). It imports only the standard library at import time; JAX, Dask and matplotlib
are imported when a study runs.
"""

from __future__ import annotations

from dhmc.scaling.plan import DEFAULT_SETTINGS, KINDS, ScalingError
from dhmc.scaling.report import machine_info
from dhmc.scaling.study import run_study

__all__ = ["run_study", "machine_info", "DEFAULT_SETTINGS", "KINDS", "ScalingError"]

"""Type aliases shared across dhmc."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax

Array = jax.Array
ArrayTree = Any
PRNGKey = jax.Array
LogDensityFn = Callable[[Array], Array]



class SampleStats(NamedTuple):
    """One kept draw's statistics per chain, named as ArviZ's ``sample_stats`` (the one list of their names)."""

    lp: Array
    acceptance_rate: Array
    diverging: Array
    energy: Array
    n_steps: Array
    step_size: Array


SAMPLE_STAT_DTYPES = {"diverging": "bool", "n_steps": "int32"}  # the others have the run's float dtype

__all__ = ["Array", "ArrayTree", "PRNGKey", "LogDensityFn", "SampleStats", "SAMPLE_STAT_DTYPES"]

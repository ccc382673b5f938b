"""Type aliases shared across dhmc, and the names of the sample statistics (a leaf: it imports no JAX at run time,
so that storage, which takes the names from here, stays light to import)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import jax

    Array = jax.Array
    PRNGKey = jax.Array
else:  # annotations only: the aliases need no JAX at run time
    Array = PRNGKey = Any
ArrayTree = Any
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

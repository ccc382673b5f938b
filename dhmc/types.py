"""Type aliases shared across dhmc, the names of the sample statistics, and what a block sends back (a leaf: it
imports no JAX at run time, so that storage, which takes the names from here, stays light to import)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple

if TYPE_CHECKING:
    import jax
    import numpy as np

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

__all__ = ["Array", "ArrayTree", "PRNGKey", "LogDensityFn", "SampleStats", "SAMPLE_STAT_DTYPES", "BlockResult"]


@dataclass(frozen=True, kw_only=True)
class BlockResult:
    """What a block sends back to the driver (and what observers are told of it)."""

    position: np.ndarray = field(repr=False)  # the chains' end positions
    seconds: float  # running the program (compile excluded)
    compile_seconds: float
    grad_evals: int  # gradient evaluations, all chains together
    where: dict  # ``{"host": ..., "worker": ...}``: who ran it
    stats: dict | None = field(default=None, repr=False)  # cold and warmup: the round's statistics
    warmup_draws: dict | None = field(default=None, repr=False)  # ``save_warmup``: ``{name: draws}``
    draws: dict | None = field(default=None, repr=False)  # sample, no store: ``{group: {name: draws}}``
    written: dict | None = None  # sample, with a store: the shapes the worker wrote there
    write_seconds: float = 0.0
    head: dict | None = field(default=None, repr=False)  # with a store: the first chains' posterior draws
    program: str = "cached"  # its program: "loaded" (the driver's executable), "compiled" here, or "cached"

    @property
    def head_draws(self) -> dict | None:
        """The block's posterior draws the convergence monitor reads (the head chains, or all of them)."""
        return self.head if self.head is not None else (self.draws or {}).get("posterior")

"""What every target becomes: a flat unconstrained log density plus a way back to named variables."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from dhmc.types import Array

__all__ = ["FlatModel", "Target", "TRACING", "flat_variables"]

#: Held while a model is traced or run on the driver. NumPyro keeps its effect-handler stack in one global list,
#: so two threads tracing a NumPyro model at once (the driver compiling block programs while it checks the initial
#: points; two runs started from two threads) corrupt each other's traces; tracing is cheap next to compiling, which
#: runs unlocked. Re-entrant: preparing a run holds it across steps that take it themselves.
TRACING = threading.RLock()


@dataclass(frozen=True)
class FlatModel:
    """A target as the core sees it.

    Attributes
    ----------
    logdensity_fn
        Log density of one chain's flat unconstrained position of shape ``(dim,)``.
    constrain_fn
        Flat position -> dict of named, constrained variables (deterministic sites included).
    dim
        Length of the flat position.
    dtype
        Floating dtype of the position.
    centre, radius
        Chains start at ``centre + U(-radius, radius)`` unless an explicit init is given.
    observed_data, constant_data
        Arrays for ArviZ's groups of those names.
    dims, coords
        Names of each variable's axes beyond ``(chain, draw)``, and the coordinates of named dims.
    log_likelihood_fn
        Flat position -> dict of each observed site's pointwise log-likelihood, or None.
    predictive_fn
        ``(flat position, PRNG key)`` -> dict of a draw of each observed site, or None.
    variables
        Each unconstrained variable's ``(start, stop)`` in the flat position, where the target names them.
    to_flat
        The target's own flat position -> the sampled one, where they differ (:mod:`dhmc.models.laplace`).
    """

    logdensity_fn: Callable[[Array], Array]
    constrain_fn: Callable[[Array], dict[str, Array]]
    dim: int
    dtype: Any
    centre: np.ndarray
    radius: float
    observed_data: dict[str, np.ndarray] = field(default_factory=dict)
    dims: dict[str, list[str]] = field(default_factory=dict)
    coords: dict[str, list] = field(default_factory=dict)
    log_likelihood_fn: Callable[[Array], dict[str, Array]] | None = None
    predictive_fn: Callable[[Array, Array], dict[str, Array]] | None = None
    constant_data: dict[str, np.ndarray] = field(default_factory=dict)
    variables: dict[str, tuple[int, int]] = field(default_factory=dict)
    to_flat: Callable[[Array], Array] | None = None


class Target(Protocol):
    """A picklable description of a model that workers turn into a :class:`FlatModel`."""

    name: str

    def build(self) -> FlatModel:
        """Build the flat model (jax arrays, closures) in the current process."""


def flat_variables(names, template) -> dict[str, tuple[int, int]]:
    """``{name: (start, stop)}`` of each leaf of ``template`` (named ``names``, in leaf order) in its
    ``ravel_pytree``."""
    import jax

    stops = np.cumsum([np.size(leaf) for leaf in jax.tree.leaves(template)])
    return {name: (int(stop - np.size(leaf)), int(stop))
            for name, leaf, stop in zip(names, jax.tree.leaves(template), stops, strict=True)}

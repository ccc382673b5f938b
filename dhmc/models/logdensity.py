"""A plain JAX log density of one chain's position (an array or a dict of arrays)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from dhmc.models.base import FlatModel, flat_variables

__all__ = ["LogDensityTarget"]


@dataclass(frozen=True)
class LogDensityTarget:
    """``logdensity_fn(position) -> scalar`` with ``template``, one chain's position (a pytree).

    Chains start at the template plus ``U(-jitter, jitter)`` in every coordinate.
    """

    logdensity_fn: Callable
    template: Any
    jitter: float = 0.5
    name: str = ""

    def build(self) -> FlatModel:
        template = jax.tree.map(lambda a: jnp.asarray(a, dtype=jnp.result_type(float)), self.template)
        flat, unravel = ravel_pytree(template)
        names = variable_names(template)

        def logdensity(x):
            value = jnp.asarray(self.logdensity_fn(unravel(x)))
            if value.shape != ():
                raise ValueError(f"it must return a scalar, got an array of shape {value.shape}")
            if not jnp.issubdtype(value.dtype, jnp.floating):
                raise ValueError(f"it returns {value.dtype}, not a float: its gradient is zero everywhere (return a "
                                 "floating-point log density)")
            return value.astype(flat.dtype)

        def constrain(x):
            return dict(zip(names, jax.tree.leaves(unravel(x)), strict=True))

        return FlatModel(logdensity, constrain, flat.size, flat.dtype, np.asarray(flat), self.jitter,
                         variables=flat_variables(names, template))


def variable_names(template) -> list[str]:
    """The result's variable of each leaf of one chain's position, in leaf order: ``x`` for one array, a dict's
    keys, and for nested or sequence positions the path joined by ``_`` (``{"a": {"b": ...}}``: ``a_b``;
    ``(mu, theta)``: ``x_0``, ``x_1``). Two leaves that would share a name are a one-line ``ValueError``."""
    paths = [path for path, _ in jax.tree_util.tree_flatten_with_path(template)[0]]
    if paths == [()]:
        return ["x"]
    part = lambda key: str(getattr(key, "key", getattr(key, "idx", getattr(key, "name", key))))
    names = [("x_" if not isinstance(path[0], jax.tree_util.DictKey) else "") + "_".join(map(part, path))
             for path in paths]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"init: two leaves of the position would both be named {twice[0]!r}; rename one")
    return names

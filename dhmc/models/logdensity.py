"""A plain JAX log density of one chain's position (an array or a dict of arrays)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.flatten_util import ravel_pytree

from dhmc.models.base import FlatModel

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
        names = _names(template)

        def logdensity(x):
            value = jnp.asarray(self.logdensity_fn(unravel(x)), flat.dtype)
            if value.shape != ():
                raise ValueError(f"it must return a scalar, got an array of shape {value.shape}")
            return value

        def constrain(x):
            tree = unravel(x)
            if isinstance(tree, dict):
                return dict(tree)
            return {names[0]: tree}

        return FlatModel(logdensity, constrain, flat.size, flat.dtype, np.asarray(flat), self.jitter)


def _names(template) -> list[str]:
    if isinstance(template, dict):
        return list(template)
    return ["x"]

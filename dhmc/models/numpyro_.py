"""A NumPyro model turned into a flat unconstrained log density, log-Jacobians included."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.flatten_util import ravel_pytree

from dhmc.models.base import FlatModel


def is_numpyro_model(obj: Callable, init: Any, model_args: tuple, model_kwargs: dict | None) -> bool:
    """Route a callable: a log density takes exactly one position and needs ``init``.

    Anything given model arguments, marked with :func:`numpyro_model`, taking other than one
    required positional argument, or passed without ``init`` is treated as a NumPyro model.
    """
    import inspect

    if model_args or model_kwargs or getattr(obj, "_dhmc_numpyro", False):
        return True
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return init is None
    required = [p for p in params if p.default is inspect.Parameter.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(required) != 1 or init is None


@dataclass(frozen=True)
class NumPyroTarget:
    """A NumPyro model function with its arguments.

    The flat position is the model's unconstrained latent sites; ``potential_energy`` supplies the
    log density with every transform's log-Jacobian, ``constrain_fn`` maps back to the constrained
    sites plus deterministic sites. Chains start as ``init_to_uniform``: ``U(-2, 2)``.
    """

    model: Callable
    model_args: tuple = ()
    model_kwargs: dict = field(default_factory=dict)
    name: str = ""
    radius: float = 2.0

    def build(self) -> FlatModel:
        from numpyro.infer.util import constrain_fn, initialize_model, potential_energy

        info = initialize_model(jax.random.PRNGKey(0), self.model, model_args=self.model_args,
                                model_kwargs=self.model_kwargs, dynamic_args=False)
        template = info.param_info.z
        flat, unravel = ravel_pytree(template)
        args, kwargs, model = self.model_args, self.model_kwargs, self.model

        def logdensity(x):
            return -potential_energy(model, args, kwargs, unravel(x))

        def constrain(x):
            return constrain_fn(model, args, kwargs, unravel(x), return_deterministic=True)

        observed = {name: np.asarray(site["value"]) for name, site in info.model_trace.items()
                    if site["type"] == "sample" and site.get("is_observed")}
        centre = np.zeros(flat.size, dtype=flat.dtype)
        return FlatModel(logdensity, constrain, int(flat.size), flat.dtype, centre, self.radius, observed)


def numpyro_model(fn: Callable) -> Callable:
    """Mark ``fn`` as a NumPyro model (needed only for a model with exactly one required argument)."""
    fn._dhmc_numpyro = True
    return fn


__all__ = ["NumPyroTarget", "is_numpyro_model", "numpyro_model"]

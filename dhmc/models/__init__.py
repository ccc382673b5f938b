"""Targets: a JAX log density, a NumPyro model, or a built-in example model by name."""

from dhmc.models.base import FlatModel, Target
from dhmc.models.examples import EXAMPLES, example
from dhmc.models.logdensity import LogDensityTarget
from dhmc.models.numpyro_ import NumPyroTarget, is_numpyro_model

__all__ = ["FlatModel", "Target", "LogDensityTarget", "NumPyroTarget", "EXAMPLES", "example",
           "is_numpyro_model"]

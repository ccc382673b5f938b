"""Targets: a JAX log density, a NumPyro model, a PyMC (or Bambi) model, a built-in example model by name, or a
target the workers make themselves (:func:`by_reference`)."""

from dhmc.models.base import FlatModel, Target
from dhmc.models.examples import EXAMPLES, example
from dhmc.models.logdensity import LogDensityTarget
from dhmc.models.numpyro_ import NumPyroTarget, is_numpyro_model
from dhmc.models.pymc_ import PyMCTarget
from dhmc.models.reference import ReferenceTarget, by_reference

__all__ = ["FlatModel", "Target", "LogDensityTarget", "NumPyroTarget", "PyMCTarget", "ReferenceTarget", "by_reference",
           "EXAMPLES", "example", "is_numpyro_model"]

"""Import this to get the JAX targets; their modules exist only once this module ran."""

import sys
import types

import jax.numpy as jnp


def _module(name: str, source: str, **names) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(names)
    sys.modules[name] = module
    exec(source, module.__dict__)
    return module


_base = _module("dynlib.dynamic.base", """
class Model:
    def __call__(self, x):
        return self.log_prob(x)
""")
_targets = _module("dynlib.dynamic.targets", """
class Gaussian(Model):
    def __init__(self, mean, sd):
        self.mean, self.sd = mean, sd

    def log_prob(self, x):
        return -0.5 * jnp.sum(((x - self.mean) / self.sd) ** 2)
""", Model=_base.Model, jnp=jnp)

Gaussian = _targets.Gaussian

"""Built-in example models, by name, with their exact posterior moments where known."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import jax.numpy as jnp
import numpy as np

from dhmc.models.base import FlatModel
from dhmc.models.logdensity import LogDensityTarget
from dhmc.models.numpyro_ import NumPyroTarget

__all__ = ["EXAMPLES", "DESCRIPTIONS", "Labelled", "example", "coin_toss_model", "harmonic_oscillator_logdensity",
           "gaussian_2d_logdensity", "linear_acceleration_data", "linear_acceleration_model", "eight_schools_model"]


def coin_toss_model(heads=(20, 30), tosses=(40, 40)):
    """Two coins with uniform priors; posteriors Beta(21, 21) and Beta(31, 11) for the defaults."""
    import numpyro
    import numpyro.distributions as dist

    with numpyro.plate("coin", len(heads)):  # names the dim of p, heads and each coin's log-likelihood
        p = numpyro.sample("p", dist.Uniform(0.0, 1.0))
        numpyro.sample("heads", dist.Binomial(jnp.asarray(tosses), p), obs=jnp.asarray(heads))


def harmonic_oscillator_logdensity(position):
    """Gaussian potential of two independent oscillators with stiffness 1 and 4."""
    return -0.5 * jnp.sum(jnp.array([1.0, 4.0]) * position["x"] ** 2)


GAUSSIAN_2D_MEAN = np.array([5.0, 5.0])
GAUSSIAN_2D_COV = np.array([[4.0, -3.0], [-3.0, 4.0]])


def gaussian_2d_logdensity(position):
    """Correlated 2-D Gaussian: mean (5, 5), covariance [[4, -3], [-3, 4]]."""
    d = position["x"] - jnp.asarray(GAUSSIAN_2D_MEAN)
    return -0.5 * d @ jnp.asarray(np.linalg.inv(GAUSSIAN_2D_COV)) @ d


def linear_acceleration_data(n: int = 200, seed: int = 2022):
    """Noisy heights ``h + v0 t + g t^2`` at ``n`` times in [1, 21] with noise sd 3."""
    rng = np.random.default_rng(seed)
    t = np.linspace(1.0, 21.0, n)
    truth = {"h": 50.0, "v0": 12.0, "g": -0.6}
    y = truth["h"] + truth["v0"] * t + truth["g"] * t**2 + rng.normal(0.0, 3.0, n)
    return t, y, truth


def linear_acceleration_model(t, y=None, noise=3.0):
    """Weakly informative normal priors on height, initial velocity and acceleration."""
    import numpyro
    import numpyro.distributions as dist

    h = numpyro.sample("h", dist.Normal(0.0, 100.0))
    v0 = numpyro.sample("v0", dist.Normal(0.0, 20.0))
    g = numpyro.sample("g", dist.Normal(0.0, 5.0))
    numpyro.sample("y", dist.Normal(h + v0 * t + g * t**2, noise), obs=y)


EIGHT_SCHOOLS_Y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
EIGHT_SCHOOLS_SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])


def eight_schools_model(sigma, y=None):
    """Non-centred eight schools: theta = mu + tau * theta_tilde."""
    import numpyro
    import numpyro.distributions as dist

    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("school", len(sigma)):
        theta_tilde = numpyro.sample("theta_tilde", dist.Normal(0.0, 1.0))
        theta = numpyro.deterministic("theta", mu + tau * theta_tilde)
        numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)


class Labelled:
    """Wrap a target so that its flat model carries dims and coordinates for the posterior."""

    def __init__(self, target, dims, coords):
        self.target, self.dims, self.coords, self.name = target, dims, coords, target.name

    def build(self) -> FlatModel:
        model = self.target.build()
        return replace(model, dims={**model.dims, **self.dims}, coords={**model.coords, **self.coords})

    def with_outputs(self, **outputs) -> Labelled:
        return Labelled(self.target.with_outputs(**outputs), self.dims, self.coords)

    def sample_prior(self, draws: int, seed: int):
        return self.target.sample_prior(draws, seed)


def _coin_toss():
    return Labelled(NumPyroTarget(coin_toss_model, name="coin_toss"), {"p": ["coin"]}, {"coin": [0, 1]})


def _harmonic_oscillator():
    target = LogDensityTarget(harmonic_oscillator_logdensity, {"x": np.zeros(2)}, 2.0, "harmonic_oscillator")
    return Labelled(target, {"x": ["oscillator"]}, {"oscillator": [0, 1]})


def _gaussian_2d():
    target = LogDensityTarget(gaussian_2d_logdensity, {"x": np.zeros(2)}, 2.0, "gaussian_2d")
    return Labelled(target, {"x": ["axis"]}, {"axis": ["x1", "x2"]})


def _linear_acceleration():
    t, y, _ = linear_acceleration_data()
    return NumPyroTarget(linear_acceleration_model, (jnp.asarray(t), jnp.asarray(y)), name="linear_acceleration")


def _eight_schools():
    target = NumPyroTarget(eight_schools_model, (jnp.asarray(EIGHT_SCHOOLS_SIGMA), jnp.asarray(EIGHT_SCHOOLS_Y)),
                           name="eight_schools")
    return Labelled(target, {"theta_tilde": ["school"], "theta": ["school"], "obs": ["school"]},
                    {"school": list(range(8))})


EXAMPLES: dict[str, Callable] = {
    "coin_toss": _coin_toss,
    "harmonic_oscillator": _harmonic_oscillator,
    "gaussian_2d": _gaussian_2d,
    "linear_acceleration": _linear_acceleration,
    "eight_schools": _eight_schools,
}

DESCRIPTIONS = {
    "coin_toss": "two coins, uniform priors, 20/40 and 30/40 heads: Beta(21,21), Beta(31,11)",
    "harmonic_oscillator": "Gaussian potential of two oscillators, stiffness 1 and 4",
    "gaussian_2d": "2-D Gaussian, mean (5,5), covariance [[4,-3],[-3,4]]",
    "linear_acceleration": "h + v0 t + g t^2 fitted to 200 noisy points (NumPyro)",
    "eight_schools": "non-centred eight schools (NumPyro)",
}


def example(name: str):
    """Return the target of the built-in model ``name``; raises ``ValueError`` listing the choices."""
    if name not in EXAMPLES:
        raise ValueError(f"unknown model {name!r}; choose one of: {', '.join(EXAMPLES)}")
    return EXAMPLES[name]()

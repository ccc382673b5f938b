"""The benchmark targets: one chain's log density, its NumPyro twin and the same starting points for every sampler.

``TARGETS`` names those ``throughput`` and ``dhmc_overhead`` run; :func:`eight_schools_logdensity` is dhmc's
built-in eight schools model as a plain JAX log density (``ess``).
"""

from __future__ import annotations

__all__ = ["Target", "TARGETS", "logistic_regression", "coin_toss", "gaussian", "eight_schools_logdensity",
           "COIN_HEADS", "COIN_TOSSES"]


class Target:
    """A benchmark target: one chain's log density on a dict position, its NumPyro twin, start points.

    ``logdensity(position_dict)``; ``flat(q)`` the same on one flat vector (name ``key``);
    ``numpyro_model`` samples site ``key`` whose unconstrained value is that vector, so NumPyro's
    ``init_params={key: init}`` starts at the same points.
    """

    def __init__(self, name, key, dim, logdensity, numpyro_model, init_scale=0.1, seed=0, init_fn=None,
                 numpyro_site=None):
        self.name, self.key, self.dim = name, key, dim
        self.logdensity, self.numpyro_model = logdensity, numpyro_model
        self.init_scale, self.seed, self.init_fn = init_scale, seed, init_fn
        self.numpyro_site = numpyro_site or key

    def flat(self, q):
        return self.logdensity({self.key: q})

    def init(self, chains: int):
        """Starting points ``(chains, dim)``, float32, the same for every sampler."""
        import numpy as np

        if self.init_fn is not None:
            return self.init_fn(chains)
        rng = np.random.default_rng(self.seed + 1)
        return (rng.normal(size=(chains, self.dim)) * self.init_scale).astype(np.float32)


def logistic_regression(n: int = 1000, d: int = 10, seed: int = 0) -> Target:
    """The contract's target: Bayesian logistic regression, N(0, 1) prior on the weights."""
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).astype(np.float32)
    w = rng.normal(size=d).astype(np.float32)
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-X @ w))).astype(np.float32)
    Xj, yj = jnp.asarray(X), jnp.asarray(y)

    def logdensity(p):
        lg = Xj @ p["w"]
        return jnp.sum(yj * lg - jnp.logaddexp(0.0, lg)) - 0.5 * jnp.sum(p["w"] ** 2)

    def model():
        import numpyro
        import numpyro.distributions as dist

        wv = numpyro.sample("w", dist.Normal(jnp.zeros(d), 1.0).to_event(1))
        numpyro.sample("y", dist.Bernoulli(logits=Xj @ wv).to_event(1), obs=yj)

    # the contract's init: rng.normal(size=(C, D)) * 0.1 drawn after the data from the same generator
    init_fn = lambda chains: (rng_after_data(seed, n, d).normal(size=(chains, d)) * 0.1).astype(np.float32)
    return Target(f"logistic_regression_n{n}_d{d}", "w", d, logdensity, model, 0.1, seed, init_fn)


def rng_after_data(seed, n, d):
    """The generator state the contract script uses for its init (after drawing X, w, y)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rng.normal(size=(n, d))
    rng.normal(size=d)
    rng.uniform(size=n)
    return rng


COIN_HEADS = (20, 30)
COIN_TOSSES = (40, 40)


def coin_toss() -> Target:
    """The seed project's two coins with uniform priors, in logit space (log-Jacobian included).

    Posterior: Beta(21, 21) and Beta(31, 11) on p = sigmoid(u).
    """
    import jax
    import jax.numpy as jnp

    h = jnp.asarray(COIN_HEADS, jnp.float32)
    n = jnp.asarray(COIN_TOSSES, jnp.float32)

    def logdensity(p):
        u = p["u"]
        # binomial likelihood + uniform prior + log |dp/du| = log p + log(1 - p)
        return jnp.sum((h + 1.0) * jax.nn.log_sigmoid(u) + (n - h + 1.0) * jax.nn.log_sigmoid(-u))

    def model():
        from dhmc.models.examples import coin_toss_model

        coin_toss_model(COIN_HEADS, COIN_TOSSES)

    # NumPyro's site is p in (0, 1); its unconstrained value is u = logit(p), the same coordinates
    return Target("coin_toss", "u", 2, logdensity, model, 0.1, numpyro_site="p")


def gaussian(d: int = 100) -> Target:
    """A standard normal in ``d`` dimensions (cheap gradient, wide position)."""
    import jax.numpy as jnp

    def logdensity(p):
        return -0.5 * jnp.sum(p["x"] ** 2)

    def model():
        import numpyro
        import numpyro.distributions as dist

        numpyro.sample("x", dist.Normal(jnp.zeros(d), 1.0).to_event(1))

    return Target(f"gaussian_{d}d", "x", d, logdensity, model, 1.0)


TARGETS = {"logistic": logistic_regression, "coin_toss": coin_toss, "gaussian100": gaussian}


def eight_schools_logdensity(sigma, y):
    """Unconstrained log density of dhmc's ``eight_schools_model``: (mu, log_tau, theta_tilde).

    mu ~ N(0, 5), tau ~ HalfCauchy(5) (sampled as log tau, log-Jacobian included), theta_tilde ~ N(0, 1),
    y ~ N(mu + tau theta_tilde, sigma).
    """
    import jax.numpy as jnp

    sigma, y = jnp.asarray(sigma, jnp.float32), jnp.asarray(y, jnp.float32)

    def normal(x, loc, scale):
        return -0.5 * ((x - loc) / scale) ** 2 - jnp.log(scale) - 0.5 * jnp.log(2 * jnp.pi)

    def logdensity(p):
        mu, log_tau, tt = p["mu"], p["log_tau"], p["theta_tilde"]
        tau = jnp.exp(log_tau)
        half_cauchy = jnp.log(2.0 / (jnp.pi * 5.0)) - jnp.log1p((tau / 5.0) ** 2)
        return (normal(mu, 0.0, 5.0) + half_cauchy + log_tau + jnp.sum(normal(tt, 0.0, 1.0))
                + jnp.sum(normal(y, mu + tau * tt, sigma)))

    return logdensity

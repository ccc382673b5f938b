"""Laplace reparameterisation: a hierarchy's latent variables whitened by their conditional mode and curvature.

A centred hierarchy is a funnel: given its scales ``u`` the latent variables ``x`` sit in a Gaussian-like
conditional whose width follows the scales, so no one step size serves its neck and its mouth. Non-centring
(``noncentered=True``) undoes the prior's scale but not the data's (a Brownian motion's observation noise squeezes
its path just as its innovation scale does). This module samples ``(u, z)`` instead of ``(u, x)``, with

    x = m(u) + L(u)^-T z,

``L(u) L(u)^T`` the negative Hessian of the log density in ``x`` at a fixed point (the chains' centre), and ``m(u)``
a Newton step with it from there towards the conditional mode of ``x`` given ``u`` (and a second, refining). Given
``u``, ``z`` is standard normal wherever the conditional is Gaussian (exactly: the curvature is constant, the step
lands on the mode), whatever the scales; the scales' own posterior is unchanged. The map is a bijection for every
``u`` with log-Jacobian ``-sum log diag L(u)``, added to the log density, so the sampler stays exact for any model;
where the conditional is not Gaussian the whitening is approximate, never the posterior. Its price: each log
density evaluation takes the Hessian of ``x``'s block (``len(x)`` Hessian-vector products) and a Cholesky factor,
and its gradient differentiates through both.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dhmc.models.base import FlatModel

__all__ = ["LaplaceTarget", "laplace", "latent_indices"]


@dataclass(frozen=True)
class LaplaceTarget:
    """``inner`` (a target whose flat model names its variables) with the variables ``latent`` Laplace-whitened."""

    inner: Any
    latent: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.inner.name

    def build(self) -> FlatModel:
        model = self.inner.build()
        return laplace(model, latent_indices(model, self.latent, self.name))

    def sample_prior(self, draws: int, seed: int) -> tuple[dict, dict]:
        """The model's prior draws (``prior=``): a change of variables leaves the model as it was."""
        return self.inner.sample_prior(draws, seed)


def latent_indices(model: FlatModel, latent, name: str = "") -> np.ndarray:
    """The flat indices of the variables ``latent`` (names of ``model.variables``), in flat order."""
    if not model.variables:
        raise ValueError(f"laplace: the model {name!r} does not name its flat variables; laplace= takes a JAX log "
                         "density, a NumPyro model or a PyMC model")
    unknown = [v for v in latent if v not in model.variables]
    if unknown:
        raise ValueError(f"laplace names {unknown[0]!r}, which is not a variable of {name!r}; its variables are "
                         f"{', '.join(model.variables)}")
    if not latent:
        raise ValueError("laplace: name at least one latent variable")
    return np.sort(np.concatenate([np.arange(*model.variables[v]) for v in latent]))


def laplace(model: FlatModel, latent: np.ndarray) -> FlatModel:
    """``model`` sampled in ``(u, z)``: the flat coordinates ``latent`` replaced by their whitened ``z`` (see the
    module's docstring), the rest (``u``) unchanged. Results, log-likelihoods and predictive draws are the
    model's, of ``x``; the chains' centre is mapped to ``(u, z)``, and ``to_flat`` maps the model's own flat
    positions there (a batched init)."""
    latent = np.asarray(latent, np.int64)
    given = np.setdiff1d(np.arange(model.dim), latent)
    inverse = np.argsort(np.concatenate([given, latent]))  # [x_u, x_latent][inverse] is the flat position
    start = jnp.asarray(model.centre[latent], model.dtype)  # Newton's fixed starting point
    inner = model.logdensity_fn

    def joint(u, x):
        return inner(jnp.concatenate([u, x])[inverse])

    def whitening(u):
        """``(m(u), L(u))``: the Cholesky factor of the curvature at ``start``, and two Newton steps with it (the
        second refines the first's round-off: float32 and curvatures ``e^14`` apart)."""
        factor = scaled_cholesky(-jax.hessian(joint, 1)(u, start))
        newton = lambda x: x + jax.scipy.linalg.cho_solve((factor, True), jax.grad(joint, 1)(u, x))
        return newton(newton(start)), factor

    def to_model(y):
        """``(x, log-Jacobian)`` of a sampled position ``y``."""
        u = y[given]
        mode, factor = whitening(u)
        x = mode + jax.scipy.linalg.solve_triangular(factor, y[latent], lower=True, trans=1)
        return jnp.concatenate([u, x])[inverse], -jnp.sum(jnp.log(jnp.diag(factor)))

    def logdensity(y):
        x, log_jacobian = to_model(y)
        return inner(x) + log_jacobian

    def to_flat(x):
        mode, factor = whitening(x[given])
        return x.at[latent].set(factor.T @ (x[latent] - mode))

    centre = np.asarray(jax.jit(to_flat)(jnp.asarray(model.centre, model.dtype)))
    if not np.isfinite(centre).all():  # no Cholesky factor at the start: nothing to whiten with
        raise ValueError(f"laplace: the log density is not concave in its {latent.size} latent coordinates at the "
                         "chains' start (its Hessian there is not negative definite), so they cannot be whitened; "
                         "laplace= suits latent variables whose conditional is Gaussian-like (a hierarchy's "
                         "effects)")
    to_x = lambda y: to_model(y)[0]
    return replace(
        model, logdensity_fn=logdensity, constrain_fn=lambda y: model.constrain_fn(to_x(y)), centre=centre,
        log_likelihood_fn=model.log_likelihood_fn and (lambda y: model.log_likelihood_fn(to_x(y))),
        predictive_fn=model.predictive_fn and (lambda y, key: model.predictive_fn(to_x(y), key)),
        to_flat=to_flat)


def scaled_cholesky(a):
    """The Cholesky factor of ``a`` through its unit-diagonal scaling, ``a = D^1/2 A D^1/2``, with a ridge on ``A``:
    ``10 n eps``, or in float32 ``eps`` where that factors. A hierarchy's curvature spans its scales' ratios (a
    Brownian motion's, observed against missing positions: ``exp(2 (log innovation - log observation))``), past
    what float32 factors. Any factor keeps the transform exact (its Jacobian is this factor's); a ridge only
    widens the whitened variables, by ``sqrt(1 + ridge / lambda)`` along an eigenvalue ``lambda`` of ``A``, so
    float32 takes the smaller one where it can: the Brownian's whitened steps had sds up to 5 where its
    observation scale is ``e^-7`` under ``10 n eps``, 1.1 under ``eps`` (float64's ``10 n eps``, 7e-15 for 30
    coordinates, widens nothing that matters and needs no trial factor)."""
    scale = jnp.sqrt(jnp.diagonal(a))
    unit = a / jnp.outer(scale, scale)
    eps, eye = jnp.finfo(a.dtype).eps, jnp.eye(a.shape[0], dtype=a.dtype)
    ridge = 10 * a.shape[0] * eps
    if a.dtype == jnp.float32:  # the smaller ridge where it factors (a trial factor, no gradient through it)
        factors = jnp.all(jnp.isfinite(jnp.linalg.cholesky(jax.lax.stop_gradient(unit) + eps * eye)))
        ridge = jnp.where(factors, eps, ridge)
    return scale[:, None] * jnp.linalg.cholesky(unit + ridge * eye)

"""Moments of positions *and gradients* across chains, merged like Welford's, and the metric they give.

For a Gaussian coordinate of variance ``s^2`` the gradient of the log density is ``-(x - mu) / s^2``,
so across an ensemble of any spread ``Var x / Var g = s^4``: ``sqrt(Var x / Var g)`` is the
posterior variance exactly, however far the ensemble is from it, where ``Var x`` alone is the
ensemble's spread (Seyboldt, Carlson & Carpenter 2026, "Preconditioning HMC by minimizing Fisher
divergence"; nutpie's default). ``Cov(x, -g)`` is the equipartition of each coordinate, 1 at
stationarity whatever the target (integration by parts): how far it is from 1 says how far the
ensemble is from the typical set.

The same ``merge`` combines chains within a block and blocks on the driver (``xp=numpy``).
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from dhmc.types import Array

__all__ = ["CrossMoments", "cross_moments", "merge", "variances", "equipartition", "fisher_variance"]


class CrossMoments(NamedTuple):
    """Count, means and summed centred (cross) products of positions ``x`` and gradients ``g`` per coordinate."""

    count: Array
    mean_x: Array
    mean_g: Array
    m2_x: Array
    m2_g: Array
    m_xg: Array


def cross_moments(x: Array, g: Array, weight: Array | None = None, xp=jnp) -> CrossMoments:
    """Moments of a batch ``(n, d)`` of positions and their gradients; rows of ``weight`` 0 are left out."""
    w = xp.ones(x.shape[0], x.dtype) if weight is None else weight.astype(x.dtype)
    x, g = xp.where(w[:, None] > 0, x, 0), xp.where(w[:, None] > 0, g, 0)
    count = xp.sum(w)
    safe = xp.maximum(count, 1)
    mean_x, mean_g = (w @ x) / safe, (w @ g) / safe
    dx, dg = (x - mean_x) * w[:, None], (g - mean_g) * w[:, None]
    return CrossMoments(count, mean_x, mean_g, xp.sum(dx * (x - mean_x), 0), xp.sum(dg * (g - mean_g), 0),
                        xp.sum(dx * (g - mean_g), 0))


def merge(a: CrossMoments, b: CrossMoments, xp=jnp) -> CrossMoments:
    """Chan's parallel merge: the moments of both batches together."""
    count = a.count + b.count
    share = b.count / xp.where(count > 0, count, 1)
    dx, dg = b.mean_x - a.mean_x, b.mean_g - a.mean_g
    both = a.count * share
    return CrossMoments(count, a.mean_x + dx * share, a.mean_g + dg * share, a.m2_x + b.m2_x + dx * dx * both,
                        a.m2_g + b.m2_g + dg * dg * both, a.m_xg + b.m_xg + dx * dg * both)


def variances(m: CrossMoments, xp=jnp) -> tuple[Array, Array, Array]:
    """``(Var x, Var g, Cov(x, g))`` per coordinate."""
    n = xp.maximum(m.count - 1, 1)
    return m.m2_x / n, m.m2_g / n, m.m_xg / n


def equipartition(m: CrossMoments, xp=jnp) -> Array:
    """``mean_i (1 - Cov(x_i, -g_i))^2``: 0 at stationarity (up to the ensemble's noise, ``~2 / n``)."""
    _, _, cov = variances(m, xp)
    return xp.mean((1.0 + cov) ** 2)


def fisher_variance(m: CrossMoments, xp=jnp) -> Array:
    """``sqrt(Var x / Var g)`` per coordinate, ``Var x`` where the gradient does not vary (a flat coordinate)."""
    var_x, var_g, _ = variances(m, xp)
    ok = (var_g > 0) & (var_x > 0) & xp.isfinite(var_g) & xp.isfinite(var_x)
    return xp.where(ok, xp.sqrt(xp.where(ok, var_x, 1.0) / xp.where(ok, var_g, 1.0)), var_x)

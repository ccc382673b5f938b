"""Streaming mean and (co)variance with Chan's parallel merge.

The same ``merge`` combines a batch of chains into a running estimate inside a block and
combines blocks from different workers on the driver, so merging equals one pass.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from dhmc.types import Array

__all__ = ["WelfordState", "Welford", "welford"]


class WelfordState(NamedTuple):
    """Count, mean and summed squared deviations of the positions seen so far."""

    count: Array
    mean: Array
    m2: Array  # sum of squared deviations: (d,) diagonal or (d, d) dense


class Welford(NamedTuple):
    """The pure functions :func:`welford` returns."""

    init: callable
    update: callable
    merge: callable
    final: callable


def welford(dense: bool = False, xp=jnp) -> Welford:
    """Return ``(init, update, merge, final)`` for the mean and (co)variance of positions.

    ``update(state, batch)`` folds a batch of positions of shape ``(n, d)`` in; ``final`` returns
    the regularised (co)variance used as an inverse mass matrix (Stan's shrinkage towards 1e-3).
    ``xp`` is the array module: ``jax.numpy`` inside blocks, ``numpy`` on the driver.
    """

    def init(dim: int, dtype) -> WelfordState:
        m2 = xp.zeros((dim, dim) if dense else (dim,), dtype)
        return WelfordState(xp.zeros((), dtype), xp.zeros((dim,), dtype), m2)

    def moments(batch: Array) -> WelfordState:
        count = xp.asarray(batch.shape[0], batch.dtype)
        mean = batch.mean(axis=0)
        centred = batch - mean
        m2 = centred.T @ centred if dense else (centred**2).sum(axis=0)
        return WelfordState(count, mean, m2)

    def merge(a: WelfordState, b: WelfordState) -> WelfordState:
        count = a.count + b.count
        safe = xp.where(count > 0, count, 1)
        delta = b.mean - a.mean
        mean = a.mean + delta * (b.count / safe)
        outer = xp.outer(delta, delta) if dense else delta**2
        m2 = a.m2 + b.m2 + outer * (a.count * b.count / safe)
        return WelfordState(count, mean, m2)

    def update(state: WelfordState, batch: Array) -> WelfordState:
        return merge(state, moments(batch))

    def final(state: WelfordState) -> Array:
        n = state.count
        cov = state.m2 / xp.maximum(n - 1, 1)
        shrink = 5.0 / (n + 5.0)
        jitter = 1e-3 * shrink
        if dense:
            return (1.0 - shrink) * cov + jitter * xp.eye(cov.shape[0], dtype=cov.dtype)
        return (1.0 - shrink) * cov + jitter

    return Welford(init, update, merge, final)

"""Velocity-Verlet (leapfrog) integration with a diagonal or dense inverse mass matrix."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from dhmc.types import Array, LogDensityFn


class IntegratorState(NamedTuple):
    """Phase-space point: flat position, momentum, and the log density with its gradient there."""

    position: Array
    momentum: Array
    logdensity: Array
    logdensity_grad: Array


def velocity(inverse_mass_matrix: Array, momentum: Array) -> Array:
    """Return ``M^-1 p`` for a diagonal (1-D) or dense (2-D) inverse mass matrix."""
    if inverse_mass_matrix.ndim == 1:
        return inverse_mass_matrix * momentum
    return inverse_mass_matrix @ momentum


def kinetic_energy(inverse_mass_matrix: Array, momentum: Array) -> Array:
    """Return ``p^T M^-1 p / 2``."""
    return 0.5 * jnp.dot(momentum, velocity(inverse_mass_matrix, momentum))


def sample_momentum(rng_key: Array, inverse_mass_matrix: Array, like: Array) -> Array:
    """Draw ``p ~ N(0, M)`` where ``M`` is the inverse of ``inverse_mass_matrix``."""
    z = jax.random.normal(rng_key, like.shape, like.dtype)
    if inverse_mass_matrix.ndim == 1:
        return z / jnp.sqrt(inverse_mass_matrix)
    chol = jnp.linalg.cholesky(inverse_mass_matrix)
    return jax.scipy.linalg.solve_triangular(chol, z, lower=True, trans=1)


def leapfrog(
    logdensity_fn: LogDensityFn,
    state: IntegratorState,
    step_size: Array,
    inverse_mass_matrix: Array,
    num_steps: Array,
) -> IntegratorState:
    """Integrate ``num_steps`` velocity-Verlet steps; one gradient evaluation per step.

    ``num_steps`` may be traced; it must be the same for every chain of a vmapped ensemble
    so that the loop stays a loop rather than a masked while.
    """
    value_and_grad = jax.value_and_grad(logdensity_fn)

    def one_step(_, s: IntegratorState) -> IntegratorState:
        p = s.momentum + 0.5 * step_size * s.logdensity_grad
        x = s.position + step_size * velocity(inverse_mass_matrix, p)
        logdensity, grad = value_and_grad(x)
        p = p + 0.5 * step_size * grad
        return IntegratorState(x, p, logdensity, grad)

    return jax.lax.fori_loop(0, num_steps, one_step, state)

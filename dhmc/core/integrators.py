"""Velocity-Verlet (leapfrog) integration with a diagonal or dense inverse mass matrix."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from dhmc.types import Array, LogDensityFn

__all__ = ["IntegratorState", "velocity", "kinetic_energy", "sample_momentum", "leapfrog"]


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
    """Integrate ``num_steps`` velocity-Verlet steps: one gradient per step, one log density at the end.

    Only gradients drive the trajectory, so the log density itself (often the dearer half: a
    log1p per likelihood term where the gradient needs only a sigmoid) is evaluated once, at the
    end point, for the Metropolis test. ``num_steps`` may be traced; it must be the same for every
    chain of a vmapped ensemble so that the loop stays a loop rather than a masked while.
    """
    grad_fn = jax.grad(logdensity_fn)

    def one_step(_, s):
        x, p, grad = s
        p = p + 0.5 * step_size * grad
        x = x + step_size * velocity(inverse_mass_matrix, p)
        grad = grad_fn(x)
        return x, p + 0.5 * step_size * grad, grad

    x, p, grad = jax.lax.fori_loop(0, num_steps, one_step, (state.position, state.momentum, state.logdensity_grad))
    return IntegratorState(x, p, logdensity_fn(x), grad)

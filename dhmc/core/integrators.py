"""Velocity-Verlet (leapfrog) integration with a diagonal or dense inverse mass matrix."""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from dhmc.types import Array, LogDensityFn

__all__ = ["IntegratorState", "velocity", "kinetic_energy", "momentum_from", "trajectory", "leapfrog"]


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


def momentum_from(noise: Array, inverse_mass_matrix: Array) -> Array:
    """``p ~ N(0, M)``, ``M`` the inverse of ``inverse_mass_matrix``, from standard normal ``noise``."""
    if inverse_mass_matrix.ndim == 1:
        return noise / jnp.sqrt(inverse_mass_matrix)
    chol = jnp.linalg.cholesky(inverse_mass_matrix)
    return jax.scipy.linalg.solve_triangular(chol, noise, lower=True, trans=1)


def trajectory(logdensity_fn: LogDensityFn, step, start, num_steps: Array):
    """Apply ``step(state, evaluate)`` ``num_steps`` times (at least once), where ``evaluate(x)`` gives
    ``(log density, gradient)`` at the step's new position; ``state`` has a ``logdensity`` field.

    Only gradients drive a trajectory, so inside it ``evaluate`` computes the gradient alone (its
    log density is a placeholder zero); the last step evaluates both together, so the end point's
    log density for the Metropolis test shares the gradient's forward pass instead of costing a
    separate evaluation (a 1000-point logistic regression: a gradient 4.3 us per chain, a log density
    alone 2.7 us, both together 4.6 us). ``num_steps`` may be traced; it must be the same for every
    chain of a vmapped ensemble so that the loop stays a loop rather than a masked while.
    """
    grad_fn = jax.grad(logdensity_fn)
    placeholder = jnp.zeros_like(start.logdensity)
    gradient_only = lambda x: (placeholder, grad_fn(x))
    state = jax.lax.fori_loop(0, num_steps - 1, lambda _, s: step(s, gradient_only), start)
    return step(state, jax.value_and_grad(logdensity_fn))


def leapfrog(
    logdensity_fn: LogDensityFn,
    state: IntegratorState,
    step_size: Array,
    inverse_mass_matrix: Array,
    num_steps: Array,
) -> IntegratorState:
    """Integrate ``num_steps`` (at least 1) velocity-Verlet steps: one gradient per step (see :func:`trajectory`)."""

    def one_step(s: IntegratorState, evaluate) -> IntegratorState:
        p = s.momentum + 0.5 * step_size * s.logdensity_grad
        x = s.position + step_size * velocity(inverse_mass_matrix, p)
        logdensity, grad = evaluate(x)
        return IntegratorState(x, p + 0.5 * step_size * grad, logdensity, grad)

    return trajectory(logdensity_fn, one_step, state, num_steps)

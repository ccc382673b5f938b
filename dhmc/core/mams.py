"""Metropolis-adjusted microcanonical sampling (MAMS; Robnik, Cohn-Gordon & Seljak 2025, arXiv:2503.01707).

Each transition draws a fresh unit velocity ``u`` in the preconditioned coordinates ``y = S^-1 x``
(``S S^T`` the inverse mass matrix), follows the isokinetic (ESH) dynamics ``dy/dt = u`` for
``num_steps`` velocity-Verlet steps, and accepts the end point with probability
``min(1, exp(-(energy error)))``, where the energy error is the change in ``-log p`` plus the
kinetic-energy change that the velocity updates report. The speed is fixed, so a trajectory of
length ``T`` always travels ``T`` in whitened units: the step size and trajectory length mean the same
thing in every chain and every dimension, which lets a vmapped ensemble run in lock-step.

``build_kernel`` has HMC's signature and returns HMC's state and info, so the ensemble layer and its
adaptation (dual averaging on acceptance, ChEES on the trajectory length, Welford on the mass) serve
both kernels unchanged. Needs at least two dimensions (the velocity lives on the sphere ``S^{d-1}``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dhmc.core.hmc import HMCInfo, HMCState
from dhmc.types import Array, LogDensityFn, PRNGKey

__all__ = ["build_kernel", "velocity_update"]


def velocity_update(u: Array, grad: Array, step_size: Array) -> tuple[Array, Array]:
    """Exact isokinetic velocity update for a step of ``step_size`` under a constant ``grad`` (of log p).

    Returns the new unit velocity and the kinetic-energy change ``(d - 1) log(...)`` that enters the
    Metropolis test (Ver Steeg & Galstyan's ESH dynamics, as written in the MAMS paper, eq. 9).
    """
    dims = u.shape[-1]
    norm = jnp.sqrt(jnp.sum(grad**2))
    e = grad / jnp.where(norm > 0, norm, 1.0)
    ue = jnp.dot(u, e)
    delta = step_size * norm / (dims - 1)
    zeta = jnp.exp(-delta)
    new = e * (1 - zeta) * (1 + zeta + ue * (1 - zeta)) + 2 * zeta * u
    new = new / jnp.sqrt(jnp.sum(new**2))
    kinetic_change = (delta - jnp.log(2.0) + jnp.log(1 + ue + (1 - ue) * zeta**2)) * (dims - 1)
    return new, kinetic_change


def _preconditioner(inverse_mass_matrix: Array):
    """``(to_x, to_y_grad)``: ``x``-step from a whitened step, and the whitened gradient ``S^T g``."""
    if inverse_mass_matrix.ndim == 1:
        scale = jnp.sqrt(inverse_mass_matrix)
        return (lambda v: scale * v), (lambda g: scale * g)
    chol = jnp.linalg.cholesky(inverse_mass_matrix)
    return (lambda v: chol @ v), (lambda g: chol.T @ g)


def build_kernel(divergence_threshold: float = 1000.0):
    """Return ``kernel(rng_key, state, logdensity_fn, step_size, inverse_mass_matrix, num_steps)``.

    The signature and the returned ``(HMCState, HMCInfo)`` are those of :func:`dhmc.core.hmc.build_kernel`;
    ``info.energy`` is ``-log p`` of the kept point (MAMS has no kinetic energy to add), and
    ``info.proposal_velocity`` is ``dx/dt = S u`` at the end of the trajectory, for ChEES.
    """

    def kernel(
        rng_key: PRNGKey,
        state: HMCState,
        logdensity_fn: LogDensityFn,
        step_size: Array,
        inverse_mass_matrix: Array,
        num_steps: Array,
    ) -> tuple[HMCState, HMCInfo]:
        key_velocity, key_accept = jax.random.split(rng_key)
        to_x, whiten = _preconditioner(inverse_mass_matrix)
        grad_fn = jax.grad(logdensity_fn)
        u = jax.random.normal(key_velocity, state.position.shape, state.position.dtype)
        u = u / jnp.sqrt(jnp.sum(u**2))
        half = 0.5 * step_size

        def one_step(_, carry):
            x, u, grad, kinetic = carry
            u, k1 = velocity_update(u, whiten(grad), half)
            x = x + step_size * to_x(u)
            grad = grad_fn(x)
            u, k2 = velocity_update(u, whiten(grad), half)
            return x, u, grad, kinetic + k1 + k2

        zero = jnp.zeros((), state.position.dtype)
        x, u, grad, kinetic = jax.lax.fori_loop(
            0, num_steps, one_step, (state.position, u, state.logdensity_grad, zero))
        logdensity = logdensity_fn(x)

        delta = state.logdensity - logdensity + kinetic
        delta = jnp.where(jnp.isfinite(delta), delta, jnp.inf)  # as in HMC: a divergence, never a free accept
        diverging = delta > divergence_threshold
        acceptance_rate = jnp.exp(jnp.minimum(0.0, -delta))
        accept = (jax.random.uniform(key_accept, dtype=delta.dtype) < acceptance_rate) & ~diverging
        new_state = jax.tree.map(lambda new, old: jnp.where(accept, new, old),
                                 HMCState(x, logdensity, grad), state)
        info = HMCInfo(
            acceptance_rate=acceptance_rate,
            diverging=diverging,
            energy=-new_state.logdensity,
            n_steps=jnp.asarray(num_steps, jnp.int32),
            step_size=jnp.asarray(step_size, delta.dtype),
            proposal=x,
            proposal_velocity=to_x(u),
        )
        return new_state, info

    return kernel

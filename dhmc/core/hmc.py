"""Hamiltonian Monte Carlo with a Metropolis correction, in BlackJAX's three layers.

``init`` builds the state, ``build_kernel`` returns a pure transition whose tunable parameters
(``step_size``, ``inverse_mass_matrix``, ``num_steps``) are arguments, so that adaptation can
change them between transitions.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from dhmc.core.integrators import (
    IntegratorState,
    kinetic_energy,
    leapfrog,
    sample_momentum,
    velocity,
)
from dhmc.types import Array, LogDensityFn, PRNGKey

__all__ = ["HMCState", "HMCInfo", "init", "build_kernel"]


class HMCState(NamedTuple):
    """Carried per chain: flat position with its log density and gradient."""

    position: Array
    logdensity: Array
    logdensity_grad: Array


class HMCInfo(NamedTuple):
    """Emitted per transition, named as ArviZ's ``sample_stats``.

    ``proposal`` and ``proposal_velocity`` are the end of the trajectory before the
    Metropolis test; ensemble adaptation (ChEES) needs them.
    """

    acceptance_rate: Array
    diverging: Array
    energy: Array
    n_steps: Array
    step_size: Array
    proposal: Array
    proposal_velocity: Array


def init(position: Array, logdensity_fn: LogDensityFn) -> HMCState:
    """Evaluate the log density and its gradient at ``position``."""
    logdensity, grad = jax.value_and_grad(logdensity_fn)(position)
    return HMCState(position, logdensity, grad)


def build_kernel(divergence_threshold: float = 1000.0):
    """Return ``kernel(rng_key, state, logdensity_fn, step_size, inverse_mass_matrix, num_steps)``.

    A transition refreshes the momentum, integrates ``num_steps`` leapfrog steps, and accepts the
    end point with probability ``min(1, exp(-energy error))``. An energy error above
    ``divergence_threshold``, or not finite either way, is flagged as a divergence and rejected.
    """

    def kernel(
        rng_key: PRNGKey,
        state: HMCState,
        logdensity_fn: LogDensityFn,
        step_size: Array,
        inverse_mass_matrix: Array,
        num_steps: Array,
    ) -> tuple[HMCState, HMCInfo]:
        key_momentum, key_accept = jax.random.split(rng_key)
        momentum = sample_momentum(key_momentum, inverse_mass_matrix, state.position)
        start = IntegratorState(state.position, momentum, state.logdensity, state.logdensity_grad)
        end = leapfrog(logdensity_fn, start, step_size, inverse_mass_matrix, num_steps)

        energy0 = -state.logdensity + kinetic_energy(inverse_mass_matrix, momentum)
        energy1 = -end.logdensity + kinetic_energy(inverse_mass_matrix, end.momentum)
        delta = energy1 - energy0
        # not finite (a log density that overflowed to +inf or NaN, e.g. a float32 trajectory flung far
        # out): a divergence, never an acceptance with delta = -inf
        delta = jnp.where(jnp.isfinite(delta), delta, jnp.inf)
        diverging = delta > divergence_threshold
        acceptance_rate = jnp.exp(jnp.minimum(0.0, -delta))
        accept = (jax.random.uniform(key_accept, dtype=delta.dtype) < acceptance_rate) & ~diverging

        new_state = jax.tree.map(
            lambda new, old: jnp.where(accept, new, old),
            HMCState(end.position, end.logdensity, end.logdensity_grad),
            state,
        )
        info = HMCInfo(
            acceptance_rate=acceptance_rate,
            diverging=diverging,
            energy=jnp.where(accept, energy1, energy0),
            n_steps=jnp.asarray(num_steps, jnp.int32),
            step_size=jnp.asarray(step_size, delta.dtype),
            proposal=end.position,
            proposal_velocity=velocity(inverse_mass_matrix, end.momentum),
        )
        return new_state, info

    return kernel

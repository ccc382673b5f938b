"""The Metropolis-adjusted transition every kernel shares: chain state, transition info, accept/reject.

A kernel is a deterministic proposal (HMC's leapfrog, MAMS's isokinetic dynamics) wrapped by
:func:`metropolis_kernel`, which accepts the proposal's end point with probability
``min(1, exp(-energy error))`` and reports the transition as :class:`HMCInfo`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from dhmc.types import Array, LogDensityFn, PRNGKey

__all__ = ["HMCState", "HMCInfo", "Proposal", "Propose", "init", "metropolis_kernel"]


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


class Proposal(NamedTuple):
    """The end of a trajectory, before the Metropolis test.

    ``energy_change`` is the energy error whose ``exp(-.)`` is the acceptance probability;
    ``energy_start`` and ``energy_end`` are the energies reported when the proposal is rejected or
    accepted; ``velocity`` is ``dx/dt`` at the end point.
    """

    state: HMCState
    velocity: Array
    energy_change: Array
    energy_start: Array
    energy_end: Array


#: ``propose(rng_key, state, logdensity_fn, step_size, inverse_mass_matrix, num_steps) -> Proposal``
Propose = Callable[[PRNGKey, HMCState, LogDensityFn, Array, Array, Array], Proposal]


def init(position: Array, logdensity_fn: LogDensityFn) -> HMCState:
    """Evaluate the log density and its gradient at ``position``."""
    logdensity, grad = jax.value_and_grad(logdensity_fn)(position)
    return HMCState(position, logdensity, grad)


def metropolis_kernel(propose: Propose, divergence_threshold: float):
    """Return ``kernel(rng_key, state, logdensity_fn, step_size, inverse_mass_matrix, num_steps)``.

    The transition runs ``propose`` and accepts its end point with probability
    ``min(1, exp(-energy_change))``. An energy error above ``divergence_threshold``, or not finite
    either way, is flagged as a divergence and rejected.
    """

    def kernel(
        rng_key: PRNGKey,
        state: HMCState,
        logdensity_fn: LogDensityFn,
        step_size: Array,
        inverse_mass_matrix: Array,
        num_steps: Array,
    ) -> tuple[HMCState, HMCInfo]:
        key_proposal, key_accept = jax.random.split(rng_key)
        end = propose(key_proposal, state, logdensity_fn, step_size, inverse_mass_matrix, num_steps)
        # not finite (a log density that overflowed to +inf or NaN, e.g. a float32 trajectory flung far
        # out): a divergence, never an acceptance with delta = -inf
        delta = jnp.where(jnp.isfinite(end.energy_change), end.energy_change, jnp.inf)
        diverging = delta > divergence_threshold
        acceptance_rate = jnp.exp(jnp.minimum(0.0, -delta))
        accept = (jax.random.uniform(key_accept, dtype=delta.dtype) < acceptance_rate) & ~diverging
        new_state = jax.tree.map(lambda new, old: jnp.where(accept, new, old), end.state, state)
        info = HMCInfo(
            acceptance_rate=acceptance_rate,
            diverging=diverging,
            energy=jnp.where(accept, end.energy_end, end.energy_start),
            n_steps=jnp.asarray(num_steps, jnp.int32),
            step_size=jnp.asarray(step_size, delta.dtype),
            proposal=end.state.position,
            proposal_velocity=end.velocity,
        )
        return new_state, info

    return kernel

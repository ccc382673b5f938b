"""Hamiltonian Monte Carlo: a leapfrog trajectory with a Metropolis correction.

``build_kernel`` returns a pure transition whose tunable parameters (``step_size``,
``inverse_mass_matrix``, ``num_steps``) are arguments, so that adaptation can change them between
transitions; its state and info are :mod:`dhmc.core.metropolis`'s.
"""

from __future__ import annotations

from dhmc.core.integrators import IntegratorState, kinetic_energy, leapfrog, momentum_from, velocity
from dhmc.core.metropolis import HMCState, Proposal, metropolis_kernel

__all__ = ["DIVERGENCE_THRESHOLD", "propose", "build_kernel"]

DIVERGENCE_THRESHOLD = 1000.0  # Stan's


def propose(noise, state: HMCState, logdensity_fn, step_size, inverse_mass_matrix, num_steps) -> Proposal:
    """Refresh the momentum from standard normal ``noise`` and integrate ``num_steps`` leapfrog steps; the
    energy is the Hamiltonian."""
    momentum = momentum_from(noise, inverse_mass_matrix)
    start = IntegratorState(state.position, momentum, state.logdensity, state.logdensity_grad)
    end = leapfrog(logdensity_fn, start, step_size, inverse_mass_matrix, num_steps)
    energy0 = -state.logdensity + kinetic_energy(inverse_mass_matrix, momentum)
    energy1 = -end.logdensity + kinetic_energy(inverse_mass_matrix, end.momentum)
    return Proposal(HMCState(end.position, end.logdensity, end.logdensity_grad),
                    velocity(inverse_mass_matrix, end.momentum), energy1 - energy0, energy0, energy1)


def build_kernel(divergence_threshold: float = DIVERGENCE_THRESHOLD):
    """Return ``kernel(rng_key, state, logdensity_fn, step_size, inverse_mass_matrix, num_steps)``.

    A transition refreshes the momentum, integrates ``num_steps`` leapfrog steps, and accepts the
    end point with probability ``min(1, exp(-energy error))``. An energy error above
    ``divergence_threshold``, or not finite either way, is flagged as a divergence and rejected.
    """
    return metropolis_kernel(propose, divergence_threshold)

"""ChEES trajectory-length adaptation (Hoffman, Radul & Sountsov 2021).

The trajectory length ``T`` is tuned by Adam *ascent* on ``log T`` of the Change in the
Estimator of the Expected Square across an ensemble of chains; each draw uses ``u * T`` with
``u`` from a Halton sequence shared by all chains, so a vmapped ensemble stays in lock-step.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from dhmc.types import Array


def halton(index: Array, max_bits: int = 32) -> Array:
    """Van der Corput (base-2 Halton) number of ``index + 1``, in (0, 1)."""
    index = jnp.asarray(index, jnp.uint32) + 1
    bits = jnp.arange(max_bits, dtype=jnp.uint32)
    digits = (index >> bits) & 1
    return jnp.sum(digits.astype(jnp.float32) * 0.5 ** (bits.astype(jnp.float32) + 1))


class CheesState(NamedTuple):
    log_length: Array
    log_length_avg: Array
    adam_m: Array
    adam_v: Array
    step: Array


class Chees(NamedTuple):
    init: callable
    update: callable
    final: callable


def chees_trajectory(
    learning_rate: float = 0.05, beta1: float = 0.0, beta2: float = 0.95, decay: float = 0.5
) -> Chees:
    """Return ``(init, update, final)`` adapting the trajectory length of jittered HMC.

    ``update(state, jitter, start, proposal, proposal_velocity, acceptance, diverging,
    inverse_mass_matrix)`` takes the ensemble's arrays of shape ``(chains, d)`` for one
    transition; positions are whitened by the mass matrix so the criterion matches the metric.
    """

    def init(trajectory_length: Array) -> CheesState:
        log_t = jnp.log(trajectory_length)
        zero = jnp.zeros_like(log_t)
        return CheesState(log_t, log_t, zero, zero, zero)

    def update(state, jitter, start, proposal, proposal_velocity, acceptance, diverging, inv_mass):
        scale = jnp.sqrt(jnp.diagonal(inv_mass) if inv_mass.ndim == 2 else inv_mass)
        weight = jnp.where(diverging, 0.0, acceptance)
        total = jnp.sum(weight) + 1e-10
        proposal_mean = jnp.sum(weight[:, None] * proposal, axis=0) / total
        start_centred = (start - start.mean(axis=0)) / scale
        proposal_centred = (proposal - proposal_mean) / scale
        velocity = proposal_velocity / scale
        change = jnp.sum(proposal_centred**2, axis=1) - jnp.sum(start_centred**2, axis=1)
        per_chain = jitter * jnp.exp(state.log_length) * change * jnp.sum(proposal_centred * velocity, axis=1)
        per_chain = jnp.where(diverging | ~jnp.isfinite(per_chain), 0.0, per_chain)
        grad = jnp.sum(weight * per_chain) / total

        step = state.step + 1
        m = beta1 * state.adam_m + (1 - beta1) * grad
        v = beta2 * state.adam_v + (1 - beta2) * grad**2
        m_hat = m / (1 - beta1**step)
        v_hat = v / (1 - beta2**step)
        log_t = state.log_length + jnp.clip(learning_rate * m_hat / (jnp.sqrt(v_hat) + 1e-8), -0.35, 0.35)
        log_t = jnp.where(jnp.isfinite(log_t), log_t, state.log_length)
        avg_weight = step ** (-decay)
        log_t_avg = (1 - avg_weight) * state.log_length_avg + avg_weight * log_t
        return CheesState(log_t, log_t_avg, m, v, step)

    def final(state: CheesState) -> Array:
        return jnp.exp(state.log_length_avg)

    return Chees(init, update, final)

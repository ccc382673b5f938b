"""Trajectory-length adaptation: ChEES per unit of integration time (Hoffman, Radul & Sountsov 2021;
Sountsov & Hoffman 2021's per-gradient form).

Each draw integrates for ``u * T``, ``u`` from a Halton sequence shared by all chains, so a vmapped
ensemble stays in lock-step. ``log T`` follows Adam *ascent* on the ensemble's estimate of

    ChEES(T) / T,    ChEES = 1/4 E[(||x' - E x'||^2 - ||x - E x||^2)^2],

the change in the estimator of the expected square *per unit of trajectory*, which is
proportional to per gradient for a fixed step size. Plain ChEES is flat beyond its first maximum
on a well-preconditioned target (its jittered average tends to a constant), so nothing pulled an
over-long trajectory back: dhmc spent up to 1000 leapfrog steps per draw where 2 would do. Divided
by ``T`` it has one maximum, near ``4.5 sqrt(lambda_max)`` on a Gaussian whose largest whitened
variance is ``lambda_max`` (a mean of ``2.25 sqrt(lambda_max)`` per draw), and a gradient that
points back to it from either side.

Positions and velocities are whitened by the metric (``x -> L^-1 x`` with ``L L^T`` the inverse
mass matrix), so the criterion measures distances in the units the sampler moves in.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax.numpy as jnp

from dhmc.types import Array

__all__ = ["halton", "whitener", "leave_one_out_mean", "chees_gradient", "CheesState", "Chees",
           "chees_trajectory"]


def halton(index: Array, base: int = 2) -> Array:
    """Van der Corput number of ``index + 1`` in ``base`` (the Halton sequence's first dimension for 2), in (0, 1)."""
    index = jnp.asarray(index, jnp.uint32) + 1
    places = jnp.arange(math.ceil(32 / math.log2(base)), dtype=jnp.uint32)  # every digit of a uint32
    digits = (index // jnp.asarray(base, jnp.uint32) ** places) % base
    return jnp.sum(digits.astype(jnp.float32) * (1.0 / base) ** (places.astype(jnp.float32) + 1))


def whitener(inverse_mass_matrix: Array):
    """``x -> L^-1 x`` for the inverse mass matrix ``L L^T`` (diagonal: ``x / sqrt(diag)``), batched over rows."""
    if inverse_mass_matrix.ndim == 1:
        scale = 1.0 / jnp.sqrt(inverse_mass_matrix)
        return lambda x: x * scale
    chol = jnp.linalg.cholesky(inverse_mass_matrix)
    inverse = jnp.linalg.inv(chol)  # once per block: applying it is then a matrix product
    return lambda x: x @ inverse.T


def leave_one_out_mean(x: Array) -> Array:
    """Each row's centre: the mean of the other rows ``(n, d)`` (one row: itself).

    ChEES measures each chain's squared distance from the ensemble's mean. A block's mean that counts the chain
    itself moves with it: ``||x' - c||^2 - ||x - c||^2`` gains ``2 (1 - rho) d / n`` on average for a chain whose
    end decorrelates from its start by ``rho``, which grows with the trajectory. With blocks of 16 chains in 501
    dimensions (an item-response model's: a dense metric leaves 16 chains a core's cache) that bias, 60 against
    the statistic's spread of 45, pushed ``T`` up round after round (2.5, 3.2, 2.9 where blocks of 64 or more
    chains settled at 1.5-1.8). Without the chain, the centre is independent of it, and the bias is gone.
    """
    n = x.shape[0]
    if n == 1:
        return x
    return (jnp.sum(x, axis=0) - x) / (n - 1)


class CheesState(NamedTuple):
    """The adapted ``log T``, its running average (what ``final`` returns) and Adam's moments."""

    log_length: Array
    log_length_avg: Array
    adam_m: Array
    adam_v: Array
    step: Array


class Chees(NamedTuple):
    """The pure functions :func:`chees_trajectory` returns."""

    init: callable
    update: callable
    final: callable


def chees_gradient(log_length, time, step_size, start, proposal, proposal_velocity, acceptance, diverging, whiten):
    """d/d(log T) of the ensemble's ChEES per gradient, times the gradients per draw (Adam drops the scale), from
    one transition of a block of chains (arrays ``(chains, d)``; each chain centred on :func:`leave_one_out_mean`).

    ``time`` is the transition's integration time ``n eps``, ``n = ceil(u T / eps)``: the pathwise
    derivative of the end point in ``log T`` is its velocity times ``time`` (``u T`` undercounts
    it by up to half when ``T`` is a step or two), and a draw costs ``E n = T / (2 eps) + 1/2``
    gradients, whose log-derivative is ``T / (T + eps)``.
    """
    ok = jnp.isfinite(proposal).all(axis=1) & jnp.isfinite(proposal_velocity).all(axis=1)
    weight = jnp.where(diverging | ~ok, 0.0, acceptance)
    total = jnp.sum(weight) + 1e-10
    proposal = jnp.where(ok[:, None], proposal, start)
    centre = leave_one_out_mean(start)
    start_centred = whiten(start - centre)
    proposal_centred = whiten(proposal - centre)
    velocity = whiten(jnp.where(ok[:, None], proposal_velocity, 0.0))
    change = jnp.sum(proposal_centred**2, axis=1) - jnp.sum(start_centred**2, axis=1)
    d_chees = time * change * jnp.sum(proposal_centred * velocity, axis=1)
    length = jnp.exp(log_length)
    per_chain = d_chees - 0.25 * change**2 * length / (length + step_size)
    per_chain = jnp.where(jnp.isfinite(per_chain), per_chain, 0.0)
    return jnp.sum(weight * per_chain) / total


def chees_trajectory(
    learning_rate: float = 0.1, beta1: float = 0.8, beta2: float = 0.95, decay: float = 0.5, max_update: float = 0.35
) -> Chees:
    """Return ``(init, update, final)`` adapting the trajectory length ``T`` of jittered HMC.

    ``update(state, time, step_size, start, proposal, proposal_velocity, acceptance, diverging,
    whiten, longest)`` takes one transition of the ensemble (arrays ``(chains, d)``): its integration
    time and step size, the metric's :func:`whitener` and the longest ``T`` allowed (the step cap);
    ``T`` stays between one step and that. Adam's first moment
    (``beta1``) averages the noisy per-draw gradients, so ``log T`` moves by about ``learning_rate``
    per draw while the gradient keeps its sign and little once it only fluctuates; each move is
    clipped to ``max_update`` (TFP's and BlackJAX's 0.35).
    """

    def init(trajectory_length: Array) -> CheesState:
        log_t = jnp.log(trajectory_length)
        zero = jnp.zeros_like(log_t)
        return CheesState(log_t, log_t, zero, zero, zero)

    def update(state, time, step_size, start, proposal, proposal_velocity, acceptance, diverging, whiten, longest):
        grad = chees_gradient(state.log_length, time, step_size, start, proposal, proposal_velocity, acceptance,
                              diverging, whiten)
        step = state.step + 1
        m = beta1 * state.adam_m + (1 - beta1) * grad
        v = beta2 * state.adam_v + (1 - beta2) * grad**2
        m_hat = m / (1 - beta1**step)
        v_hat = v / (1 - beta2**step)
        move = jnp.clip(learning_rate * m_hat / (jnp.sqrt(v_hat) + 1e-30), -max_update, max_update)
        log_t = jnp.where(jnp.isfinite(move), state.log_length + move, state.log_length)
        # kept inside what can be integrated: a length past the step cap is never run, so its
        # gradient says nothing and must not push the state further out
        log_t = jnp.clip(log_t, jnp.log(step_size), jnp.log(longest))
        avg_weight = step ** (-decay)
        log_t_avg = (1 - avg_weight) * state.log_length_avg + avg_weight * log_t
        return CheesState(log_t, log_t_avg, m, v, step)

    def final(state: CheesState) -> Array:
        return jnp.exp(state.log_length_avg)

    return Chees(init, update, final)

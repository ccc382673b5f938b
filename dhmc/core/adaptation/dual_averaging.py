"""Nesterov dual averaging of the log step size (Hoffman & Gelman 2014, as in Stan)."""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp

from dhmc.types import Array

__all__ = ["DualAveragingState", "DualAveraging", "dual_averaging"]


class DualAveragingState(NamedTuple):
    """The current and averaged log step size, the averaged error, the update count and the shrink target."""

    log_step_size: Array
    log_step_size_avg: Array
    error_avg: Array
    step: Array
    mu: Array


class DualAveraging(NamedTuple):
    """The pure functions :func:`dual_averaging` returns."""

    init: callable
    update: callable
    final: callable


def dual_averaging(
    target: float = 0.8, t0: float = 10.0, gamma: float = 0.05, kappa: float = 0.75, shrink_to: float = 1.0
) -> DualAveraging:
    """Return ``(init, update, final)`` steering an acceptance statistic towards ``target``.

    ``init(step_size)`` starts at ``step_size`` shrinking towards ``shrink_to * step_size``. Stan's
    10 sends the second transition out at about 14 times the first step (one divergence per chain
    on a 100-D Gaussian, every round); dhmc starts each round from a step size that is already
    about right (a search, or the last round's), so it shrinks towards that;
    ``update(state, acceptance)`` takes one acceptance statistic (for an ensemble, one number
    summarising all chains); ``final(state)`` is the averaged step size to keep.
    """

    def init(step_size: Array) -> DualAveragingState:
        log_eps = jnp.log(step_size)
        zero = jnp.zeros_like(log_eps)
        return DualAveragingState(log_eps, log_eps, zero, zero, jnp.log(shrink_to) + log_eps)

    def update(state: DualAveragingState, acceptance: Array) -> DualAveragingState:
        step = state.step + 1
        eta = 1.0 / (step + t0)
        error_avg = (1.0 - eta) * state.error_avg + eta * (target - acceptance)
        log_eps = state.mu - jnp.sqrt(step) / gamma * error_avg
        weight = step ** (-kappa)
        log_eps_avg = weight * log_eps + (1.0 - weight) * state.log_step_size_avg
        return DualAveragingState(log_eps, log_eps_avg, error_avg, step, state.mu)

    def final(state: DualAveragingState) -> Array:
        return jnp.exp(state.log_step_size_avg)

    return DualAveraging(init, update, final)

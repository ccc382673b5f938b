"""The ensemble's acceptance statistic and the step-size search that starts a warmup round."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dhmc.core.metropolis import HMCState
from dhmc.types import Array, LogDensityFn

__all__ = ["ACCEPTANCE_GROUP", "SEARCH_STEPS", "harmonic_mean", "find_step_size"]

ACCEPTANCE_GROUP = 64  # chains per term of the acceptance statistic (see harmonic_mean)
SEARCH_STEPS = 7  # one-step trials of a step-size search (bisection of 69 grid points): gradients, counted


def harmonic_mean(acceptance: Array, diverging: Array) -> Array:
    """The chains' acceptance statistic: per group of :data:`ACCEPTANCE_GROUP` consecutive chains the
    harmonic mean, a divergence counting as 0, and the groups' mean (weighted by their sizes).

    The harmonic mean is dominated by a group's worst chains: one chain stuck where every trajectory
    diverges (NumPyro's uniform start put 20 of kidiq's 128 chains where the gradient is 1e7) zeroes
    its group's term and shrinks the step size until it moves; counted only by its share, such chains
    stayed stuck through a whole warmup. Over a whole ensemble, though, the worst chain gets worse as
    the ensemble grows: one GPU block of 4096 chains of the centred eight schools always had one deep
    in the funnel's neck, and its step size fell to a tenth of what 64-chain blocks chose, until no
    chain moved. Groups make a block of any size adapt like blocks of 64 chains.
    """
    chains = acceptance.shape[0]
    groups = -(-chains // ACCEPTANCE_GROUP)
    member = jnp.arange(chains) // ACCEPTANCE_GROUP
    inverse = jnp.where(diverging, 1e10, 1.0 / jnp.maximum(acceptance, 1e-10))
    size = jax.ops.segment_sum(jnp.ones_like(inverse), member, groups)
    per_group = size / jax.ops.segment_sum(inverse, member, groups)
    value = jnp.sum(size * per_group) / chains
    return jnp.where(jnp.isfinite(value), value, 0.0)


def find_step_size(logdensity_fn: LogDensityFn, kernel, states: HMCState, inverse_mass_matrix: Array,
                   target_accept: float, around: Array | float = 0.0) -> Array:
    """A step size on a sqrt(2) grid where ``kernel``'s one-step harmonic-mean acceptance crosses the target.

    Bisection over ``2^-30 .. 2^4``, or ``around / 16 .. 64 around`` once a round has adapted one
    (``around > 0``): 7 one-step evaluations. The harmonic mean is what dual averaging steers, and it
    falls to ~0 where the leapfrog turns unstable in the stiffest direction, while the arithmetic
    mean can still read 0.5 there: a start at that edge sent every chain's first trajectory of a
    round into a divergence. If even the grid's first point misses the target, it is returned.
    """
    dtype = states.position.dtype
    keys = jax.random.split(jax.random.PRNGKey(0), states.position.shape[0])
    around = jnp.asarray(around, dtype)
    known = around > 0
    base = jnp.where(known, around, 1.0)
    step = lambda k: base * 2.0 ** (k.astype(dtype) / 2)  # k: powers of sqrt(2)

    def passes(k):
        _, info = jax.vmap(lambda key, s: kernel(key, s, logdensity_fn, step(k), inverse_mass_matrix, 1))(keys, states)
        return harmonic_mean(info.acceptance_rate, info.diverging) >= target_accept

    def bisect(_, bounds):  # every k above ``high`` failed; ``low`` passed, or is the grid's first point
        low, high = bounds
        middle = (low + high + 1) // 2
        ok = passes(middle)
        return jnp.where(ok, middle, low), jnp.where(ok, high, middle - 1)

    bounds = (jnp.where(known, -8, -60).astype(jnp.int32), jnp.where(known, 12, 8).astype(jnp.int32))
    low, _ = jax.lax.fori_loop(0, SEARCH_STEPS, bisect, bounds)
    return step(low)

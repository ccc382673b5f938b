"""The ensemble's acceptance statistic and the step-size search that starts a warmup round."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dhmc.core.metropolis import HMCState
from dhmc.types import Array, LogDensityFn

__all__ = ["ACCEPTANCE_GROUP", "SEARCH_STEPS", "FIRST_GRID", "ROUND_GRID", "harmonic_mean", "find_step_size"]

ACCEPTANCE_GROUP = 64  # chains per term of the acceptance statistic (see harmonic_mean)
SEARCH_STEPS = 7  # one-step trials of a step-size search (bisection of at most 128 grid points): gradients, counted
FIRST_GRID = 2  # grid points per octave of a first search (no step size to start from): 2^-30 .. 2^4 (69 points)
ROUND_GRID = 12  # ... and of a search around a round's step size: around / 16 .. 64 around (121 points)


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
    """A step size on a grid where ``kernel``'s one-step harmonic-mean acceptance crosses the target.

    Bisection over ``2^-30 .. 2^4`` in steps of sqrt(2), or ``around / 16 .. 64 around`` in steps of
    2^(1/12) once a round has adapted one (``around > 0``): 7 one-step evaluations. A sqrt(2) grid
    anchored at the last round's step size made the rounds seesaw: a crossing just above ``around``
    returned ``around``, one just below returned ``around / sqrt(2)``, and dual averaging, which moves
    about 20% in a round, ended alternately above and below (the centred eight schools: 0.458, 0.554,
    0.481, 0.580, 0.491, ... in seven rounds, each change past what the stop rule allows).

    The harmonic mean is what dual averaging steers, and it falls to ~0 where the leapfrog turns
    unstable in the stiffest direction, while the arithmetic mean can still read 0.5 there: a start
    at that edge sent every chain's first trajectory of a round into a divergence. If even the
    grid's first point misses the target, it is returned.
    """
    dtype = states.position.dtype
    keys = jax.random.split(jax.random.PRNGKey(0), states.position.shape[0])
    around = jnp.asarray(around, dtype)
    known = around > 0
    base = jnp.where(known, around, 1.0)
    per_octave = jnp.where(known, ROUND_GRID, FIRST_GRID).astype(dtype)
    step = lambda k: base * 2.0 ** (k.astype(dtype) / per_octave)

    def passes(k):
        _, info = jax.vmap(lambda key, s: kernel(key, s, logdensity_fn, step(k), inverse_mass_matrix, 1))(keys, states)
        return harmonic_mean(info.acceptance_rate, info.diverging) >= target_accept

    def bisect(_, bounds):  # every k above ``high`` failed; ``low`` passed, or is the grid's first point
        low, high = bounds
        middle = (low + high + 1) // 2
        ok = passes(middle)
        return jnp.where(ok, middle, low), jnp.where(ok, high, middle - 1)

    bounds = (jnp.where(known, -4 * ROUND_GRID, -30 * FIRST_GRID).astype(jnp.int32),
              jnp.where(known, 6 * ROUND_GRID, 4 * FIRST_GRID).astype(jnp.int32))
    low, _ = jax.lax.fori_loop(0, SEARCH_STEPS, bisect, bounds)
    return step(low)

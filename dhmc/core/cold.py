"""The cold phase: unadjusted isokinetic (microcanonical Langevin) dynamics, one gradient an iteration,
its step size re-estimated from the ensemble after every gradient.

From a cold start the chains are far from the typical set and the ensemble's spread is no measure of
the posterior's, so a Metropolis-adjusted kernel tuned on it takes long trajectories of small steps
(Zhang, Altschuler & Chewi 2026: Omega(d^1/2) from a cold start, against O~(d^1/4) without the test).
This phase follows LAPS's burn-in (Robnik & Seljak 2026; BlackJAX's ``laps_burn_in``): every chain
takes one velocity-Verlet step of the isokinetic dynamics, its unit velocity partially refreshed
(decoherence length ``L``), with no accept/reject; after each step the block's chains set the next
step size from the variance of their energy errors per dimension against a bias budget that shrinks
as the ensemble approaches equipartition:

    EEVPD = Var(dE) / d,    wanted = C * D^(3/8),    D = mean_i (1 - Cov(x_i, -g_i))^2,
    eps <- eps * clip((wanted / EEVPD)^(1/6), 0.3, 3)   (halved when a chain's step was not finite)

and ``L = alpha sqrt(sum_i Var y_i)``, both in the metric's whitened coordinates ``y`` (``Cov(y_i, -dlogp/dy_i)`` is
1 at stationarity in any linear coordinates). A step that is not finite is undone. The metric, diagonal or dense, is
fixed within a block; the driver re-estimates it between blocks from the whole ensemble's positions and gradients
(:mod:`dhmc.distributed.cold_rounds`). The bias of the unadjusted dynamics does not reach the draws: the
Metropolis-adjusted warmup follows.

Each chain's randomness is ``fold_in(fold_in(chain key, COLD_STREAM), iteration)``, apart from the
adjusted kernels' iterations; every ensemble statistic is over the block's chains in a fixed order, so
a block's result depends on its chains and the seed only.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from dhmc.core.adaptation.chees import whitener
from dhmc.core.adaptation.fisher import CrossMoments, cross_moments, equipartition
from dhmc.core.mams import preconditioner, velocity_update
from dhmc.core.metropolis import transition_noise
from dhmc.types import Array, LogDensityFn

__all__ = ["COLD_STREAM", "ALPHA", "BIAS_SCALE", "ColdParams", "ColdStats", "cold_chunk"]

START_NOISE = 2**31  # fold_in data of a chain's start direction where it has no gradient (iterations stay below)
COLD_STREAM = 2**32 - 3  # fold_in data no adjusted iteration reaches (predictive draws: 2**32 - 1)
ALPHA = 1.9  # L = ALPHA sqrt(sum of whitened variances): BlackJAX's laps default (the paper's 2)
BIAS_SCALE = 0.1  # C of the step-size law (BlackJAX's laps default)
MAX_FACTOR = 3.0  # the step size changes by at most this factor per gradient, either way


class ColdParams(NamedTuple):
    """A cold block's inputs shared by its chains: the step size (whitened units) and the metric."""

    step_size: Array
    inverse_mass_matrix: Array  # (d,) variances, or (d, d) = F F^T: the whitened coordinates are F^-1 x


class ColdStats(NamedTuple):
    """What a cold block reports for the driver to merge: its last step size, the moments of its end
    positions and gradients, and counts."""

    step_size: Array
    moments: CrossMoments  # of the chains that end finite and were not stuck (the driver reseats the others)
    energy_variance: Array  # Var(dE) / d of the last step
    logdensity: Array  # (chains,): each chain's log density at its end (-inf: its steps mostly failed)
    nans: Array  # steps undone (not finite), all chains
    grad_evals: Array  # gradients of all chains, the block's start included
    gradient: Array  # (chains, d): each chain's gradient at its end (the driver's dense metric needs them)


class _Chain(NamedTuple):
    position: Array
    velocity: Array  # unit, in whitened coordinates
    logdensity: Array
    logdensity_grad: Array
    whitened_grad: Array  # F^T g (M^-1 = F F^T): the velocity update's and the equipartition's gradient


def _unit(v: Array) -> Array:
    return v / jnp.sqrt(jnp.sum(v**2, axis=-1, keepdims=True))


def _finite(logdensity: Array, position: Array, grad: Array) -> Array:
    """Which chains have a finite log density, position and gradient: the ensemble's moments count only them (one
    chain's infinite gradient made every coordinate's gradient mean NaN)."""
    return jnp.isfinite(logdensity) & jnp.all(jnp.isfinite(position), 1) & jnp.all(jnp.isfinite(grad), 1)


def _step(logdensity_fn, chain: _Chain, step_size, to_x, to_y_grad):
    """One isokinetic velocity-Verlet step (MAMS's, :mod:`dhmc.core.mams`, in its metric's
    :func:`~dhmc.core.mams.preconditioner`); returns the chain and its energy error."""
    half = 0.5 * step_size
    u, k1 = velocity_update(chain.velocity, chain.whitened_grad, half)
    x = chain.position + step_size * to_x(u)
    logdensity, grad = jax.value_and_grad(logdensity_fn)(x)
    whitened = to_y_grad(grad)
    u, k2 = velocity_update(u, whitened, half)
    return _Chain(x, u, logdensity, grad, whitened), chain.logdensity - logdensity + k1 + k2


def cold_chunk(logdensity_fn: LogDensityFn, alpha: float = ALPHA, bias_scale: float = BIAS_SCALE):
    """Return ``run(keys, positions, params, first_iteration, num_iterations) -> (positions, ColdStats)``.

    ``keys`` are the chains' keys (:func:`dhmc.core.ensemble.chain_keys`), ``positions`` ``(chains, d)``.
    A block starts each chain's velocity along its whitened gradient, towards the mode on coordinates
    where the block is wider than equipartition and away from it where narrower (LAPS's start), and
    runs ``num_iterations`` steps (traced: one compiled program serves every block).
    """

    def run(keys, positions, params: ColdParams, first_iteration, num_iterations):
        chains, dim = positions.shape
        dtype = positions.dtype
        metric = params.inverse_mass_matrix.astype(dtype)
        to_x, to_y_grad = preconditioner(metric)
        whiten = whitener(metric)  # positions, batched over chains
        keys = jax.vmap(lambda k: jax.random.fold_in(k, COLD_STREAM))(keys)
        logdensity, grad = jax.vmap(jax.value_and_grad(logdensity_fn))(positions)
        whitened = jax.vmap(to_y_grad)(grad)
        y = whiten(positions)
        start = cross_moments(y, whitened, _finite(logdensity, positions, grad))
        wide = jnp.where(-start.m_xg / jnp.maximum(start.count - 1, 1) >= 1.0, 1.0, -1.0)
        direction = jnp.where(jnp.isfinite(whitened), wide * whitened, 0.0)
        size = jnp.sqrt(jnp.sum(direction**2, axis=1, keepdims=True))
        anywhere = jax.vmap(lambda k: transition_noise(jax.random.fold_in(k, START_NOISE), positions[0])[0])(keys)
        velocity = jnp.where(size > 0, direction / jnp.where(size > 0, size, 1.0), _unit(anywhere))  # no gradient:
        chain = _Chain(positions, velocity, logdensity, grad, whitened)  # a random direction
        eps0 = params.step_size.astype(dtype)
        dims = jnp.asarray(dim, dtype)

        def body(i, carry):
            chain, y, eps, _, nans, fails = carry  # y: the chains' whitened positions
            length = alpha * jnp.sqrt(jnp.sum(jnp.var(y, axis=0)))
            new, d_energy = jax.vmap(lambda c: _step(logdensity_fn, c, eps, to_x, to_y_grad))(chain)
            ok = (_finite(new.logdensity, new.position, new.logdensity_grad) & jnp.isfinite(d_energy)
                  & jnp.all(jnp.isfinite(new.velocity), 1))
            new = jax.tree.map(lambda a, b: jnp.where(ok.reshape(-1, *([1] * (a.ndim - 1))), a, b), new, chain)
            noise = jax.vmap(lambda k: transition_noise(jax.random.fold_in(k, first_iteration + i), y[0])[0])(keys)
            nu = jnp.sqrt(jnp.expm1(2.0 * eps / jnp.maximum(length, eps)) / dims)
            new = new._replace(velocity=_unit(new.velocity + nu * noise))
            good = ok.astype(dtype)
            n_ok = jnp.maximum(jnp.sum(good), 1.0)
            d_energy = jnp.where(ok, d_energy, 0.0)
            mean_de = jnp.sum(d_energy) / n_ok
            eevpd = jnp.sum(good * (d_energy - mean_de) ** 2) / n_ok / dims
            y = whiten(new.position)
            bias = equipartition(cross_moments(y, new.whitened_grad, good))
            wanted = bias_scale * bias ** (3.0 / 8.0)
            factor = jnp.clip((wanted / jnp.maximum(eevpd, jnp.finfo(dtype).tiny)) ** (1.0 / 6.0),
                              1.0 / MAX_FACTOR, MAX_FACTOR)
            failed = jnp.sum(1.0 - good)
            factor = jnp.where(jnp.sum(good) < 2, 1.0, factor)  # one chain has no energy-error variance
            factor = jnp.where((failed > 0) | ~jnp.isfinite(factor), 0.5, factor)
            return new, y, eps * factor, eevpd, nans + failed.astype(jnp.int32), fails + (~ok).astype(jnp.int32)

        carry = (chain, y, eps0, jnp.zeros((), dtype), jnp.zeros((), jnp.int32), jnp.zeros((chains,), jnp.int32))
        chain, _, eps, eevpd, nans, fails = jax.lax.fori_loop(0, num_iterations, body, carry)
        grads = (chains * (num_iterations + 1)).astype(jnp.int32)
        # a chain whose steps mostly failed (a gradient that is not finite where it sits) reports no log density:
        # the driver reseats it (dhmc.distributed.cold_rounds.reseat_strays)
        stuck = 2 * fails > num_iterations
        counted = _finite(chain.logdensity, chain.position, chain.logdensity_grad) & ~stuck
        stats = ColdStats(eps, cross_moments(chain.position, chain.logdensity_grad, counted), eevpd,
                          jnp.where(stuck, -jnp.inf, chain.logdensity), nans, grads, chain.logdensity_grad)
        return chain.position, stats

    return run


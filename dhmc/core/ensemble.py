"""The unit of distributed work: an ensemble chunk of chains, vmapped over chains, scanned over draws.

Each chain's randomness is ``fold_in(fold_in(base, chain_index), iteration_index)``: it depends on
the seed, the global chain index and the global iteration, never on which chunk, worker or
segment ran it. The trajectory jitter depends on the iteration index only and is shared by all
chains, so a vmapped chunk integrates the same number of steps in lock-step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp

from dhmc.core import hmc, mams, metropolis
from dhmc.core.adaptation.chees import CheesState, chees_trajectory, halton, whitener
from dhmc.core.adaptation.dual_averaging import DualAveragingState, dual_averaging
from dhmc.core.adaptation.welford import WelfordState, welford
from dhmc.core.step_size import SEARCH_STEPS, find_step_size, harmonic_mean
from dhmc.types import Array, LogDensityFn, SampleStats

__all__ = ["KERNELS", "JITTERED", "MAMS_MAX_LENGTH", "KernelConfig", "Params", "WarmupStats", "WarmupCarry",
           "max_trajectory_length", "chain_keys", "initial_positions", "num_steps_for", "kernel_for", "step_size_for",
           "transition", "init_states", "sample_chunk", "warmup_chunk"]

KERNELS = {"chees": hmc.build_kernel, "hmc": hmc.build_kernel, "mams": mams.build_kernel}  # kind -> its kernel
JITTERED = ("chees", "mams")  # trajectory lengths u * T, T adapted by ChEES
MAMS_MAX_LENGTH = 3.0  # MAMS trajectories at most 3 sqrt(d) whitened units: see max_trajectory_length


@dataclass(frozen=True)
class KernelConfig:
    """Host-side kernel settings (never traced).

    ``kind`` is ``"chees"`` (HMC with jittered trajectories ``u * T``, ``u`` in (0, 1)), ``"mams"``
    (isokinetic dynamics, see :mod:`dhmc.core.mams`, jittered the same way) or ``"hmc"`` (fixed
    ``num_steps``, or ``trajectory_length / step_size`` steps when ``num_steps`` is None).
    """

    kind: str = "chees"
    num_steps: int | None = None
    max_num_steps: int = 1000
    target_accept: float = 0.8
    dense_mass: bool = False
    divergence_threshold: float | None = None  # None: the kernel's DIVERGENCE_THRESHOLD (HMC 1000, MAMS 20)
    thinning: int = 1  # sampling keeps every ``thinning``-th transition (warmup ignores it)
    step_jitter: float = 0.0  # each transition's step size is eps * (1 + step_jitter * (2u - 1)), u shared
    record_warmup: int = 0  # warmup also returns the positions of its first this many iterations


class Params(NamedTuple):
    """Tunable parameters shared by every chain of the ensemble."""

    step_size: Array
    inverse_mass_matrix: Array
    trajectory_length: Array


class WarmupStats(NamedTuple):
    """What one warmup block reports back for merging across blocks."""

    step_size: Array
    trajectory_length: Array
    mass: WelfordState
    acceptance_rate: Array
    divergences: Array
    grad_evals: Array


class WarmupCarry(NamedTuple):
    """What a warmup block carries from one iteration to the next."""

    states: metropolis.HMCState
    dual_averaging: DualAveragingState
    chees: CheesState
    mass: WelfordState
    acceptance_sum: Array
    divergences: Array
    grad_evals: Array
    recorded: Array | None = None  # ``record_warmup``: positions after each iteration, (chains, R, d)


def max_trajectory_length(config: KernelConfig, dim: int, step_size: Array) -> Array:
    """The longest trajectory adaptation may pick: ``max_num_steps`` steps; for MAMS also ``3 sqrt(d)``.

    MAMS moves at unit speed in whitened coordinates, so ``sqrt(d)`` is the typical set's radius. ChEES
    alone picked 18 sqrt(d) on a 50-D Gaussian, where 2-3 sqrt(d) gave 13x more ESS of x^2 per gradient;
    on curved targets (a banana, eight schools) it picks about 3 sqrt(d), near their best (measured here).
    """
    longest = config.max_num_steps * step_size
    if config.kind == "mams":
        longest = jnp.minimum(longest, MAMS_MAX_LENGTH * jnp.sqrt(jnp.asarray(dim, step_size.dtype)))
    return longest


def chain_keys(seed: int, chain_indices: Array) -> Array:
    """Per-chain keys derived from the seed and the global chain index only."""
    base = jax.random.fold_in(jax.random.PRNGKey(seed), 0)
    return jax.vmap(lambda i: jax.random.fold_in(base, i))(chain_indices)


def initial_positions(seed: int, chain_indices: Array, centre: Array, radius: float) -> Array:
    """``centre + U(-radius, radius)`` per chain, keyed by the global chain index."""
    base = jax.random.fold_in(jax.random.PRNGKey(seed), 1)

    def one(i):
        u = jax.random.uniform(jax.random.fold_in(base, i), centre.shape, centre.dtype, -radius, radius)
        return centre + u

    return jax.vmap(one)(chain_indices)


def num_steps_for(config: KernelConfig, iteration: Array, step_size: Array, trajectory_length: Array):
    """Leapfrog steps for one transition: fixed, or the jittered ``ceil(u T / eps)``."""
    if config.kind == "hmc" and config.num_steps is not None:
        return jnp.asarray(config.num_steps, jnp.int32)
    length = trajectory_length / step_size
    if config.kind in JITTERED:
        length = jnp.ceil(halton(iteration) * length)
    else:
        length = jnp.round(length)
    return jnp.clip(length, 1, config.max_num_steps).astype(jnp.int32)


def kernel_for(config: KernelConfig):
    """The per-chain transition of ``config.kind`` (HMC's or MAMS's: same signature, state and info)."""
    build = KERNELS[config.kind]
    return build() if config.divergence_threshold is None else build(config.divergence_threshold)


def step_size_for(config: KernelConfig, iteration: Array, step_size: Array) -> Array:
    """The transition's step size: ``step_size``, jittered by ``config.step_jitter`` (same for every chain).

    Fixed-step HMC with an adapted step size can lock onto a Gaussian's period: 10 steps of 0.90 make
    3 pi, ``x' = -x``, and ``x^2`` never moves (its ESS was 191 of 19200 draws, its sd 4% off). The
    jitter follows a Halton sequence of the iteration other than the trajectory's (base 3).
    """
    if not config.step_jitter:
        return step_size
    u = halton(iteration, base=3)
    return step_size * (1.0 + config.step_jitter * (2.0 * u - 1.0)).astype(step_size.dtype)


def transition(logdensity_fn: LogDensityFn, config: KernelConfig, keys: Array, states: metropolis.HMCState,
               params: Params, iteration: Array):
    """One transition of every chain at ``iteration``, vmapped: each chain's key is folded with the iteration."""
    kernel = kernel_for(config)
    eps = step_size_for(config, iteration, params.step_size)
    n = num_steps_for(config, iteration, eps, params.trajectory_length)
    draw_keys = jax.vmap(lambda k: jax.random.fold_in(k, iteration))(keys)
    step = lambda k, s: kernel(k, s, logdensity_fn, eps, params.inverse_mass_matrix, n)
    return jax.vmap(step)(draw_keys, states)


def init_states(logdensity_fn: LogDensityFn, positions: Array) -> metropolis.HMCState:
    """Vmapped :func:`dhmc.core.metropolis.init` over a chunk of flat positions ``(chains, d)``."""
    return jax.vmap(lambda x: metropolis.init(x, logdensity_fn))(positions)


def sample_chunk(logdensity_fn: LogDensityFn, config: KernelConfig, num_draws: int):
    """Return ``run(keys, positions, params, first_iteration) -> (positions, trace)``.

    ``trace`` holds the flat positions ``(chains, draws, d)`` and the per-draw ``sample_stats``
    (``lp``, ``acceptance_rate``, ``diverging``, ``energy``, ``n_steps``, ``step_size``), each with
    leading axes ``(chains, draws)``. With ``config.thinning = k`` a draw is every ``k``-th
    transition (iterations ``first_iteration + k * draw + j``): its ``n_steps`` and ``diverging``
    cover the ``k`` transitions, its ``acceptance_rate`` is their mean.
    """
    thin = config.thinning

    def run(keys, positions, params: Params, first_iteration):
        states = init_states(logdensity_fn, positions)

        def thinned(states, iteration):
            if thin == 1:
                return transition(logdensity_fn, config, keys, states, params, iteration)
            states, infos = jax.lax.scan(
                lambda s, j: transition(logdensity_fn, config, keys, s, params, iteration + j), states,
                jnp.arange(thin))
            last = jax.tree.map(lambda a: a[-1], infos)
            return states, last._replace(acceptance_rate=infos.acceptance_rate.mean(0),
                                         diverging=infos.diverging.any(0), n_steps=infos.n_steps.sum(0))

        def body(states, i):
            states, info = thinned(states, first_iteration + (i if thin == 1 else thin * i))
            stats = SampleStats(lp=states.logdensity, acceptance_rate=info.acceptance_rate, diverging=info.diverging,
                                energy=info.energy, n_steps=info.n_steps, step_size=info.step_size)
            return states, (states.position, stats._asdict())

        states, (draws, stats) = jax.lax.scan(body, states, jnp.arange(num_draws))
        stats = {k: jnp.swapaxes(v, 0, 1) for k, v in stats.items()}  # (draws, chains) -> (chains, draws)
        return states.position, {"position": jnp.swapaxes(draws, 0, 1), **stats}

    return run


def warmup_chunk(logdensity_fn: LogDensityFn, config: KernelConfig):
    """Return ``run(keys, positions, params, first_iteration, num_iterations, adapt, collect_mass, find_step)``.

    The result is ``(positions, WarmupStats)``, and with ``config.record_warmup = R`` the positions
    after each of the first ``R`` iterations, ``(chains, R, d)``, as a third element. With ``adapt``,
    the step size follows dual averaging on the chunk's harmonic-mean acceptance and (for ``"chees"``
    and ``"mams"``) the trajectory length follows ChEES; with ``collect_mass``, positions from the
    second half of the round are accumulated for the mass matrix. All counts and flags are traced,
    so one compiled program serves every round.
    ``"mams"`` adapts exactly as ``"chees"``: its proposal velocity ``dx/dt`` enters the same criterion.
    """
    da = dual_averaging(config.target_accept)
    ch = chees_trajectory()
    wf = welford(config.dense_mass)

    def run(keys, positions, params: Params, first_iteration, num_iterations, adapt, collect_mass, find_step):
        states = init_states(logdensity_fn, positions)
        chains, dim = positions.shape
        whiten = whitener(params.inverse_mass_matrix)
        previous = params.step_size.astype(positions.dtype)
        searched = find_step | (params.step_size <= 0)
        search = lambda: find_step_size(logdensity_fn, kernel_for(config), states, params.inverse_mass_matrix,
                                        config.target_accept, previous)
        eps0 = jax.lax.cond(searched, search, lambda: previous)
        traj0 = jnp.where(params.trajectory_length > 0, params.trajectory_length, eps0).astype(positions.dtype)
        record = config.record_warmup
        # gradients beyond the trajectories': the block's start (init_states) and the step-size search
        searched_grads = (chains * (1 + jnp.where(searched, SEARCH_STEPS, 0))).astype(jnp.int32)
        carry = WarmupCarry(states=states, dual_averaging=da.init(eps0), chees=ch.init(traj0),
                            mass=wf.init(dim, positions.dtype), acceptance_sum=jnp.zeros((), positions.dtype),
                            divergences=jnp.zeros((), jnp.int32), grad_evals=searched_grads,
                            recorded=jnp.zeros((chains, record, dim), positions.dtype) if record else None)
        keep = lambda flag, new, old: jax.tree.map(lambda a, b: jnp.where(flag, a, b), new, old)

        # dual averaging probes larger steps; more than sqrt(2) past a searched eps0 (on a first search's grid,
        # the point above it, whose one-step harmonic acceptance already missed the target) the leapfrog may be
        # unstable: every chain diverged there once per round on a 2-D Gaussian of condition 2000 (sds 1 and
        # 1000, correlation 0.999)
        largest = jnp.where(searched, eps0 * jnp.sqrt(2.0).astype(positions.dtype), jnp.inf)
        capped = lambda log_eps: jnp.minimum(jnp.exp(log_eps), largest)

        def body(i, carry: WarmupCarry) -> WarmupCarry:
            eps = capped(carry.dual_averaging.log_step_size)
            length = jnp.clip(jnp.exp(carry.chees.log_length), eps, max_trajectory_length(config, dim, eps))
            p = Params(eps, params.inverse_mass_matrix, length)
            start = carry.states.position
            states, info = transition(logdensity_fn, config, keys, carry.states, p, first_iteration + i)
            time = info.n_steps[0] * eps
            acceptance = harmonic_mean(info.acceptance_rate, info.diverging)
            da_state = keep(adapt, da.update(carry.dual_averaging, acceptance), carry.dual_averaging)
            ch_state = carry.chees
            if config.kind in JITTERED:
                new_eps = capped(da_state.log_step_size)
                cap = max_trajectory_length(config, dim, new_eps)
                new = ch.update(ch_state, time, new_eps, start, info.proposal, info.proposal_velocity,
                                info.acceptance_rate, info.diverging, whiten, cap)
                ch_state = keep(adapt, new, ch_state)
            in_window = collect_mass & (i >= num_iterations // 2)
            recorded = carry.recorded
            if record:  # a round has at most ``record`` iterations: i < record
                recorded = jax.lax.dynamic_update_slice_in_dim(recorded, states.position[:, None], i, axis=1)
            return WarmupCarry(states=states, dual_averaging=da_state, chees=ch_state,
                               mass=keep(in_window, wf.update(carry.mass, states.position), carry.mass),
                               acceptance_sum=carry.acceptance_sum + jnp.mean(info.acceptance_rate),
                               divergences=carry.divergences + jnp.sum(info.diverging, dtype=jnp.int32),
                               grad_evals=carry.grad_evals + info.n_steps[0] * chains, recorded=recorded)

        final = jax.lax.fori_loop(0, num_iterations, body, carry)
        eps = jnp.where(adapt, jnp.minimum(da.final(final.dual_averaging), largest), eps0)
        length = ch.final(final.chees) if config.kind in JITTERED else params.trajectory_length
        if config.kind == "mams":
            length = jnp.clip(length, eps, max_trajectory_length(config, dim, eps))
        stats = WarmupStats(eps, length, final.mass, final.acceptance_sum / jnp.maximum(num_iterations, 1),
                            final.divergences, final.grad_evals)
        end = final.states.position
        return (end, stats, final.recorded) if record else (end, stats)

    return run

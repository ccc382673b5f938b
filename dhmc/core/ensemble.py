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

from dhmc.core import hmc, mams
from dhmc.core.adaptation import chees_trajectory, dual_averaging, halton, welford
from dhmc.core.adaptation.chees import whitener
from dhmc.core.adaptation.welford import WelfordState
from dhmc.types import Array, LogDensityFn

KERNELS = ("chees", "hmc", "mams")
JITTERED = ("chees", "mams")  # trajectory lengths u * T, T adapted by ChEES
ACCEPTANCE_GROUP = 64  # chains per term of the acceptance statistic (see harmonic_mean)
SEARCH_STEPS = 7  # one-step trials of a step-size search (bisection of 69 grid points): gradients, counted
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
    divergence_threshold: float | None = None  # None: 1000 for HMC (Stan's), 20 for MAMS (see build_kernel)
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


def build_kernel(config: KernelConfig):
    """The per-chain transition of ``config.kind``: HMC's or MAMS's (same signature, state and info).

    A divergence is an energy error above the threshold. MAMS's bounded speed keeps its errors far
    below HMC's 1000 even where the integrator fails: in the centred eight schools' funnel it reported
    none at 1000 while missing the neck (log tau's mean 5 MC errors off), and 119 at 20 (acceptance
    2e-9); on Gaussians, a banana and the reference posteriors, 20 flagged nothing.
    """
    threshold = config.divergence_threshold
    if config.kind == "mams":
        return mams.build_kernel(20.0 if threshold is None else threshold)
    return hmc.build_kernel(1000.0 if threshold is None else threshold)


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


def _transition(logdensity_fn, config, keys, states, params, iteration):
    kernel = build_kernel(config)
    eps = step_size_for(config, iteration, params.step_size)
    n = num_steps_for(config, iteration, eps, params.trajectory_length)
    draw_keys = jax.vmap(lambda k: jax.random.fold_in(k, iteration))(keys)
    step = lambda k, s: kernel(k, s, logdensity_fn, eps, params.inverse_mass_matrix, n)
    return jax.vmap(step)(draw_keys, states)


def init_states(logdensity_fn: LogDensityFn, positions: Array) -> hmc.HMCState:
    """Vmapped ``hmc.init`` over a chunk of flat positions ``(chains, d)``."""
    return jax.vmap(lambda x: hmc.init(x, logdensity_fn))(positions)


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

        def transition(states, iteration):
            if thin == 1:
                return _transition(logdensity_fn, config, keys, states, params, iteration)
            states, infos = jax.lax.scan(
                lambda s, j: _transition(logdensity_fn, config, keys, s, params, iteration + j), states,
                jnp.arange(thin))
            last = jax.tree.map(lambda a: a[-1], infos)
            return states, last._replace(acceptance_rate=infos.acceptance_rate.mean(0),
                                         diverging=infos.diverging.any(0), n_steps=infos.n_steps.sum(0))

        def body(states, i):
            states, info = transition(states, first_iteration + (i if thin == 1 else thin * i))
            stats = {
                "lp": states.logdensity,
                "acceptance_rate": info.acceptance_rate,
                "diverging": info.diverging,
                "energy": info.energy,
                "n_steps": info.n_steps,
                "step_size": info.step_size,
            }
            return states, (states.position, stats)

        states, (draws, stats) = jax.lax.scan(body, states, jnp.arange(num_draws))
        swap = lambda a: jnp.swapaxes(a, 0, 1) if a.ndim >= 2 else jnp.broadcast_to(a, (a.shape[0],))
        stats = {k: swap(v) if v.ndim >= 2 else jnp.broadcast_to(v[None], (keys.shape[0], num_draws))
                 for k, v in stats.items()}
        return states.position, {"position": jnp.swapaxes(draws, 0, 1), **stats}

    return run


def find_step_size(logdensity_fn: LogDensityFn, states: hmc.HMCState, inverse_mass_matrix: Array,
                   config: KernelConfig = KernelConfig(), around: Array | float = 0.0) -> Array:
    """A step size on a sqrt(2) grid where the one-step harmonic-mean acceptance crosses the target.

    Bisection over ``2^-30 .. 2^4``, or ``around / 16 .. 64 around`` once a round has adapted one
    (``around > 0``): 7 one-step evaluations. The harmonic mean is what dual averaging steers, and it
    falls to ~0 where the leapfrog turns unstable in the stiffest direction, while the arithmetic
    mean can still read 0.5 there: a start at that edge sent every chain's first trajectory of a
    round into a divergence. If even the grid's first point misses the target, it is returned.
    """
    kernel = build_kernel(config)
    dtype = states.position.dtype
    keys = jax.random.split(jax.random.PRNGKey(0), states.position.shape[0])
    around = jnp.asarray(around, dtype)
    known = around > 0
    base = jnp.where(known, around, 1.0)
    step = lambda k: base * 2.0 ** (k.astype(dtype) / 2)  # k: powers of sqrt(2)

    def passes(k):
        _, info = jax.vmap(lambda key, s: kernel(key, s, logdensity_fn, step(k), inverse_mass_matrix, 1))(keys, states)
        return harmonic_mean(info.acceptance_rate, info.diverging) >= config.target_accept

    def bisect(_, bounds):  # every k above ``high`` failed; ``low`` passed, or is the grid's first point
        low, high = bounds
        middle = (low + high + 1) // 2
        ok = passes(middle)
        return jnp.where(ok, middle, low), jnp.where(ok, high, middle - 1)

    bounds = (jnp.where(known, -8, -60).astype(jnp.int32), jnp.where(known, 12, 8).astype(jnp.int32))
    low, _ = jax.lax.fori_loop(0, SEARCH_STEPS, bisect, bounds)
    return step(low)


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
        dim = positions.shape[1]
        whiten = whitener(params.inverse_mass_matrix)
        previous = params.step_size.astype(positions.dtype)
        searched = find_step | (params.step_size <= 0)
        eps0 = jax.lax.cond(
            searched, lambda: find_step_size(logdensity_fn, states, params.inverse_mass_matrix, config, previous),
            lambda: previous)
        traj0 = jnp.where(params.trajectory_length > 0, params.trajectory_length, eps0).astype(positions.dtype)
        zero = jnp.zeros((), positions.dtype)
        record = config.record_warmup
        # gradients beyond the trajectories': the block's start (init_states) and the step-size search
        searched_grads = (positions.shape[0] * (1 + jnp.where(searched, SEARCH_STEPS, 0))).astype(jnp.int32)
        carry = (states, da.init(eps0), ch.init(traj0), wf.init(positions.shape[1], positions.dtype),
                 zero, jnp.zeros((), jnp.int32), searched_grads)
        if record:
            carry += (jnp.zeros((positions.shape[0], record, dim), positions.dtype),)
        keep = lambda flag, new, old: jax.tree.map(lambda a, b: jnp.where(flag, a, b), new, old)

        # dual averaging probes larger steps; past the grid point above a searched eps0, whose one-step
        # harmonic acceptance already missed the target, the leapfrog may be unstable: every chain diverged
        # there once per round on a 2-D Gaussian of condition 2000 (sds 1 and 1000, correlation 0.999)
        largest = jnp.where(searched, eps0 * jnp.sqrt(2.0).astype(positions.dtype), jnp.inf)
        capped = lambda log_eps: jnp.minimum(jnp.exp(log_eps), largest)

        def body(i, carry):
            states, da_state, ch_state, wf_state, acc_sum, div_sum, grads = carry[:7]
            eps = capped(da_state.log_step_size)
            length = jnp.clip(jnp.exp(ch_state.log_length), eps, max_trajectory_length(config, dim, eps))
            p = Params(eps, params.inverse_mass_matrix, length)
            iteration = first_iteration + i
            start = states.position
            states, info = _transition(logdensity_fn, config, keys, states, p, iteration)
            time = info.n_steps[0] * eps
            da_state = keep(adapt, da.update(da_state, harmonic_mean(info.acceptance_rate, info.diverging)), da_state)
            if config.kind in JITTERED:
                new_eps = capped(da_state.log_step_size)
                cap = max_trajectory_length(config, dim, new_eps)
                new = ch.update(ch_state, time, new_eps, start, info.proposal, info.proposal_velocity,
                                info.acceptance_rate, info.diverging, whiten, cap)
                ch_state = keep(adapt, new, ch_state)
            in_window = collect_mass & (i >= num_iterations // 2)
            wf_state = keep(in_window, wf.update(wf_state, states.position), wf_state)
            acc_sum = acc_sum + jnp.mean(info.acceptance_rate)
            div_sum = div_sum + jnp.sum(info.diverging, dtype=jnp.int32)
            grads = grads + info.n_steps[0] * keys.shape[0]
            out = (states, da_state, ch_state, wf_state, acc_sum, div_sum, grads)
            if record:  # a round has at most ``record`` iterations: i < record
                out += (jax.lax.dynamic_update_slice_in_dim(carry[7], states.position[:, None], i, axis=1),)
            return out

        final = jax.lax.fori_loop(0, num_iterations, body, carry)
        states, da_state, ch_state, wf_state, acc_sum, div_sum, grads = final[:7]
        eps = jnp.where(adapt, jnp.minimum(da.final(da_state), largest), eps0)
        length = ch.final(ch_state) if config.kind in JITTERED else params.trajectory_length
        if config.kind == "mams":
            length = jnp.clip(length, eps, max_trajectory_length(config, dim, eps))
        stats = WarmupStats(eps, length, wf_state, acc_sum / jnp.maximum(num_iterations, 1), div_sum, grads)
        return (states.position, stats, final[7]) if record else (states.position, stats)

    return run

"""Adaptation without Dask: the ChEES-per-gradient criterion, the step search, and carrying a trajectory length."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dhmc.core import hmc
from dhmc.core.adaptation import chees_trajectory
from dhmc.core.adaptation.chees import chees_gradient, whitener
from dhmc.core.ensemble import KernelConfig, Params, chain_keys, init_states, transition
from dhmc.core.step_size import find_step_size
from dhmc.distributed import warmup


def _mean_gradient(length: float, step_size: float = 0.05, chains: int = 512, iterations: int = 64) -> float:
    """The criterion's gradient at a fixed ``T`` on exact draws of N(0, I_4), averaged over the jitter."""
    return float(_gradients(jnp.float32(length), jnp.float32(step_size), chains, iterations).mean())


@functools.partial(jax.jit, static_argnums=(2, 3))  # T and the step are arguments: one compile for every T
def _gradients(length, step_size, chains: int, iterations: int):
    f = lambda x: -0.5 * jnp.sum(x**2)
    keys = chain_keys(0, jnp.arange(chains, dtype=jnp.uint32))
    params = Params(step_size, jnp.ones(4), length)
    ch = chees_trajectory()

    def body(states, i):
        start = states.position
        states, info = transition(f, KernelConfig(), keys, states, params, i)
        new = ch.update(ch.init(params.trajectory_length), info.n_steps[0] * params.step_size, params.step_size,
                        start, info.proposal, info.proposal_velocity, info.acceptance_rate, info.diverging,
                        whitener(params.inverse_mass_matrix), jnp.float32(1e6))
        return states, new.adam_m / (1 - 0.8)  # Adam's first moment after one step: (1 - beta1) * gradient

    states = init_states(f, jax.random.normal(jax.random.PRNGKey(1), (chains, 4)))
    _, gradients = jax.lax.scan(body, states, jnp.arange(iterations))
    return gradients


def test_the_criterion_per_gradient_pulls_a_trajectory_back_from_either_side():
    """Plain ChEES is flat past its first maximum on a Gaussian: nothing brought an over-long T back
    (1000 steps a draw where 2 would do). Per unit of T it rises below ~4.5 sds and falls beyond."""
    assert _mean_gradient(1.0) > 0
    assert _mean_gradient(12.0) < 0


def _block_gradients(chains: int, blocks: int, time: float, dim: int = 200) -> np.ndarray:
    """The criterion's gradient of ``blocks`` blocks of ``chains`` exact draws of N(0, I) moved by the exact flow for
    ``time`` (no jitter, every proposal accepted)."""
    x, p = np.random.default_rng(5).normal(size=(2, blocks, chains, dim)).astype(np.float32)
    end, velocity = x * np.cos(time) + p * np.sin(time), p * np.cos(time) - x * np.sin(time)
    one = lambda x, end, velocity: chees_gradient(jnp.log(time), time, 0.1, x, end, velocity, jnp.ones(chains),
                                                  jnp.zeros(chains, bool), lambda y: y)
    return np.asarray(jax.jit(jax.vmap(one))(x, end, velocity))


def test_a_small_blocks_criterion_points_where_the_ensembles_does():
    """Blocks of 16 chains in 200 dimensions (a dense metric leaves a core's cache room for no more): centred on
    their own mean, which moves with each chain, they read the gradient at T = 1.5 and 2 as +200 and +140 where
    the whole ensemble's is -140 and -460, and pushed T up round after round. Centred on the other chains' mean
    they point the same way as 4096 chains, within a third (what is left: the centre's own noise, d / (n - 1))."""
    for time in (0.5, 1.5, 2.0):
        whole = _block_gradients(4096, 4, time).mean()
        small = _block_gradients(16, 512, time).mean()
        assert np.sign(small) == np.sign(whole)
        assert abs(small - whole) < 0.35 * abs(whole)


def test_the_step_search_stays_below_the_leapfrog_stability_edge():
    """sd 0.0316 along the narrow axis: the leapfrog is unstable past eps = 0.063, where the one-step
    arithmetic-mean acceptance still reads 0.5. The search must land below the edge."""
    cov = np.array([[1.0, 0.999], [0.999, 1.0]])
    precision = jnp.asarray(np.linalg.inv(cov), jnp.float32)
    f = lambda x: -0.5 * x @ precision @ x
    x = np.random.default_rng(0).multivariate_normal(np.zeros(2), cov, size=128)
    states = init_states(f, jnp.asarray(x, jnp.float32))
    # jitted, as in a block program: one compile for both searches
    search = functools.partial(jax.jit(find_step_size, static_argnums=(0, 1, 4)), f, hmc.build_kernel())
    eps = float(search(states, jnp.ones(2), 0.8, jnp.float32(0.0)))
    assert 0.02 < eps < 0.0632
    around = float(search(states, jnp.ones(2), 0.8, jnp.float32(0.3)))
    assert 0.02 < around < 0.0632


def test_a_rounds_search_lands_on_the_crossing_whatever_step_it_starts_around():
    """Searched around nine last-round step sizes an octave apart in all, the same ensemble gets the same step
    within one grid point (2^(1/12)). On a sqrt(2) grid anchored at the last step, a crossing just above it
    returned it and one just below returned it / sqrt(2): warmup's rounds seesawed by up to 41%."""
    f = lambda x: -0.5 * jnp.sum(x**2)
    x = np.random.default_rng(0).normal(size=(256, 10))
    states = init_states(f, jnp.asarray(x, jnp.float32))
    search = functools.partial(jax.jit(find_step_size, static_argnums=(0, 1, 4)), f, hmc.build_kernel())
    found = [float(search(states, jnp.ones(10), 0.8, jnp.float32(a))) for a in np.geomspace(0.4, 0.8, 9)]
    assert max(found) / min(found) <= 2 ** (1 / 12) * 1.0001, found


def test_a_trajectory_length_is_carried_into_a_new_metrics_units():
    rng = np.random.default_rng(1)
    positions = rng.normal(size=(512, 2)) * np.array([1.0, 1000.0])
    carried = warmup.carry_length(3000.0, positions, np.ones(2), np.array([1.0, 1e6]))
    assert carried == pytest.approx(3.0, rel=0.1)

"""The cold phase's pieces without Dask: moments of positions and gradients, the Fisher metric, and the
unadjusted block (``dhmc.core.cold``) bringing a far-off ensemble to a Gaussian's typical set."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dhmc.core.adaptation import fisher
from dhmc.core.cold import ColdParams, cold_chunk
from dhmc.core.ensemble import chain_keys

SDS = np.array([0.01, 0.3, 1.0, 30.0])
MEAN = np.array([5.0, -2.0, 0.0, 100.0])


def _gaussian(x):
    return -0.5 * jnp.sum(((x - jnp.asarray(MEAN, x.dtype)) / jnp.asarray(SDS, x.dtype)) ** 2)


_GRADS = jax.jit(jax.vmap(jax.grad(_gaussian)))  # one compile per number of chains, not one per operation


def _moments(x: np.ndarray) -> fisher.CrossMoments:
    g = np.asarray(_GRADS(jnp.asarray(x)))
    return fisher.cross_moments(x, g, xp=np)


def test_merging_blocks_equals_one_pass():
    x = np.random.default_rng(0).normal(size=(300, 4)) * SDS + MEAN
    g = np.asarray(_GRADS(jnp.asarray(x)))  # the same gradients for the blocks as for the whole: only merge differs
    block = lambda rows: fisher.cross_moments(x[rows], g[rows], xp=np)
    whole = block(slice(None))
    merged = fisher.merge(fisher.merge(block(slice(0, 17)), block(slice(17, 200)), xp=np), block(slice(200, None)),
                          xp=np)
    for a, b in zip(whole, merged, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-9)


def test_the_fisher_metric_is_the_posterior_variance_whatever_the_ensemble_spread():
    """An ensemble 1000x too wide, or 100x too narrow and off-centre: Var x / Var g gives sd^4 all the same,
    where the ensemble's own variance is off by 10^6."""
    rng = np.random.default_rng(1)
    for spread, centre in ((1000.0, 0.0), (0.01, 3.0)):
        x = MEAN + centre + spread * rng.normal(size=(256, 4))
        m = _moments(x)
        np.testing.assert_allclose(fisher.fisher_variance(m, xp=np), SDS**2, rtol=1e-4)  # float32 gradients
        assert not np.allclose(fisher.variances(m, xp=np)[0], SDS**2, rtol=0.5)
        assert fisher.equipartition(m, xp=np) > 0.5  # far from equipartition, and it says so


def test_equipartition_is_near_zero_at_the_posterior():
    x = np.random.default_rng(2).normal(size=(4096, 4)) * SDS + MEAN
    assert fisher.equipartition(_moments(x), xp=np) < 0.01


_RUN = jax.jit(cold_chunk(_gaussian))  # one program for every test: each shape of block compiles once


def _cold(x0: np.ndarray, iterations: int, step: float = 0.1):
    run = _RUN
    keys = chain_keys(0, jnp.arange(x0.shape[0], dtype=jnp.uint32))
    metric = fisher.fisher_variance(_moments(x0), xp=np)  # the start's gradient metric, as warmup's round 0
    params = ColdParams(jnp.float32(step), jnp.asarray(metric, jnp.float32))
    return run(keys, jnp.asarray(x0, jnp.float32), params, jnp.int32(0), jnp.int32(iterations))


def test_a_cold_block_brings_a_far_off_ensemble_to_the_typical_set():
    """Chains started 100 sds away (in the stiffest coordinate) reach the posterior's means and sds within
    the unadjusted bias, one gradient an iteration, without a non-finite step."""
    x0 = np.float32(MEAN - 100 * SDS[0] + np.random.default_rng(3).uniform(-0.5, 0.5, (512, 4)))
    end, stats = _cold(x0, 150)
    end = np.asarray(end, np.float64)
    assert int(stats.grad_evals) == 512 * 151
    assert int(stats.nans) == 0
    np.testing.assert_array_less(np.abs(end.mean(0) - MEAN) / SDS, 0.3)
    np.testing.assert_allclose(end.std(0) / SDS, 1.0, atol=0.25)
    assert float(stats.step_size) > 0.1  # the step grew from its cautious start


def test_a_cold_block_is_deterministic_and_its_steps_stay_finite():
    """A step size far too large: every non-finite step is undone and halves the step, no chain is lost."""
    x0 = np.float32(MEAN + np.random.default_rng(4).uniform(-0.5, 0.5, (512, 4)))  # the shape above: no compile
    end, stats = _cold(x0, 30, step=1e30)
    assert np.all(np.isfinite(np.asarray(end)))
    assert float(stats.step_size) < 1e30
    again, _ = _cold(x0, 30, step=1e30)
    np.testing.assert_array_equal(np.asarray(end), np.asarray(again))


def test_a_block_of_one_chain_keeps_its_step_and_a_chain_without_gradient_still_moves():
    """One chain has no energy-error variance: its step must not grow 3x a gradient (it reached 3.5e8 in 20).
    Chains at the mode (gradient 0) start in a random direction instead of not at all."""
    end, stats = _cold(np.float32(MEAN[None] + 0.1 * SDS), 20)
    assert float(stats.step_size) <= 0.1 and np.all(np.isfinite(np.asarray(end)))
    at_mode = np.float32(np.repeat(MEAN[None], 512, axis=0))  # 512 chains: the block shape compiled above
    keys = chain_keys(0, jnp.arange(512, dtype=jnp.uint32))
    params = ColdParams(jnp.float32(0.1), jnp.asarray(SDS**2, jnp.float32))
    moved, stats = _RUN(keys, jnp.asarray(at_mode), params, jnp.int32(0), jnp.int32(5))
    assert int(stats.nans) == 0 and not np.allclose(np.asarray(moved), at_mode)

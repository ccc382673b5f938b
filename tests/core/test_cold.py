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


def _kinked(x):
    """The Gaussian with a kink of no mass at ``x[2] = 0.25``, where the gradient is NaN."""
    return _gaussian(x) - 1e-3 * jnp.sqrt(jnp.abs(x[2] - 0.25))


def test_a_chain_without_a_finite_gradient_is_left_out_of_the_blocks_moments():
    """One chain starts where the gradient is not finite (an ARMA model's chains at a start out of its stationary
    region): it cannot move, and the block's end moments are those of the other chains, not NaN (one infinite
    gradient made every coordinate's gradient mean NaN, and the driver's metric a guess)."""
    x0 = np.float32(MEAN + np.random.default_rng(5).uniform(-0.5, 0.5, (64, 4)) * SDS)
    x0[7, 2] = 0.25
    keys = chain_keys(0, jnp.arange(64, dtype=jnp.uint32))
    params = ColdParams(jnp.float32(0.1), jnp.asarray(SDS**2, jnp.float32))
    end, stats = jax.jit(cold_chunk(_kinked))(keys, jnp.asarray(x0), params, jnp.int32(0), jnp.int32(5))
    end, others = np.asarray(end, np.float64), np.delete(np.arange(64), 7)
    assert np.all(end[7] == x0[7]) and not np.isfinite(float(stats.logdensity[7]))
    gradients = jax.vmap(jax.grad(_kinked))(jnp.asarray(end[others], jnp.float32))
    expected = fisher.cross_moments(end[others], np.asarray(gradients, np.float64), xp=np)
    moments = fisher.CrossMoments(*(np.asarray(m, np.float64) for m in stats.moments))
    assert float(moments.count) == 63
    for got, want in zip(moments, expected, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.max(np.abs(want)))


def test_a_dense_metric_that_is_diagonal_runs_as_the_diagonal_one():
    x0 = np.float32(MEAN + np.random.default_rng(5).uniform(-0.5, 0.5, (512, 4)) * SDS)
    keys = chain_keys(0, jnp.arange(512, dtype=jnp.uint32))
    diagonal = ColdParams(jnp.float32(0.3), jnp.asarray(SDS**2, jnp.float32))
    dense = ColdParams(jnp.float32(0.3), jnp.asarray(np.diag(SDS**2), jnp.float32))
    end, stats = _RUN(keys, jnp.asarray(x0), diagonal, jnp.int32(0), jnp.int32(20))
    again, dense_stats = jax.jit(cold_chunk(_gaussian))(keys, jnp.asarray(x0), dense, jnp.int32(0), jnp.int32(20))
    # the same steps but for float32 rounding (a triangular solve for a division), which 20 steps amplify a little
    np.testing.assert_allclose((np.asarray(again) - np.asarray(end)) / SDS, 0.0, atol=1e-3)
    np.testing.assert_allclose(float(dense_stats.step_size), float(stats.step_size), rtol=1e-3)


ROTATED = np.linalg.qr(np.random.default_rng(6).normal(size=(4, 4)))[0]
COVARIANCE = (ROTATED * np.array([1e-4, 1e-2, 1.0, 1e2])) @ ROTATED.T  # condition number 1e6, rotated


def _rotated(x):
    return -0.5 * x @ jnp.asarray(np.linalg.inv(COVARIANCE), x.dtype) @ x


def test_a_dense_cold_block_brings_a_rotated_ensemble_to_its_typical_set():
    """In the posterior's own covariance as metric, chains started 30 sds out along the narrowest direction reach
    the rotated Gaussian's covariance, which the diagonal metric's whitening would leave at condition 1e6."""
    rng = np.random.default_rng(7)
    x0 = np.float32(30 * 1e-2 * ROTATED[:, 0] + rng.uniform(-0.01, 0.01, (512, 4)))
    keys = chain_keys(0, jnp.arange(512, dtype=jnp.uint32))
    params = ColdParams(jnp.float32(0.1), jnp.asarray(COVARIANCE, jnp.float32))
    end, stats = jax.jit(cold_chunk(_rotated))(keys, jnp.asarray(x0), params, jnp.int32(0), jnp.int32(100))
    assert int(stats.nans) == 0
    whitened = np.asarray(end, np.float64) @ np.linalg.inv(np.linalg.cholesky(COVARIANCE)).T
    np.testing.assert_array_less(np.abs(whitened.mean(0)), 0.3)
    np.testing.assert_allclose(np.cov(whitened, rowvar=False), np.eye(4), atol=0.3)

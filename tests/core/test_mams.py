"""MAMS (dhmc.core.mams): the isokinetic velocity update, invariance of the target, ensemble sampling."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from mc_checks import within_correlation_error, within_mc_error

from dhmc.core import mams, metropolis
from dhmc.core.adaptation import welford
from dhmc.core.ensemble import KernelConfig, Params, chain_keys, sample_chunk, warmup_chunk

SD = np.array([1.0, 10.0, 0.1])  # badly scaled and strongly correlated
COV = np.array([[1.0, 0.9, 0.0], [0.9, 1.0, -0.3], [0.0, -0.3, 1.0]]) * np.outer(SD, SD)
PRECISION = jnp.asarray(np.linalg.inv(COV))


def correlated(x):
    return -0.5 * x @ PRECISION @ x


def test_the_velocity_stays_unit_and_turns_towards_the_gradient():
    u = jnp.array([1.0, 0.0, 0.0])
    g = jnp.array([0.0, 3.0, 0.0])
    new, kinetic = mams.velocity_update(u, g, 0.5)
    assert abs(float(jnp.linalg.norm(new)) - 1) < 1e-6
    assert float(new[1]) > 0 and float(new[0]) < 1
    # no force, no change; along the gradient the velocity cannot turn, and the kinetic change balances
    # the rise in log p over the step: eps * |g|
    same, k0 = mams.velocity_update(u, jnp.zeros(3), 0.5)
    np.testing.assert_allclose(same, u, atol=1e-7)
    assert abs(float(k0)) < 1e-6
    along, k1 = mams.velocity_update(jnp.array([0.0, 1.0, 0.0]), g, 0.5)
    np.testing.assert_allclose(along, [0.0, 1.0, 0.0], atol=1e-6)
    assert abs(float(k1) - 0.5 * 3.0) < 1e-5


def test_isokinetic_steps_conserve_energy_as_step_size_shrinks():
    """The Metropolis energy error falls as O(eps^2) over a fixed time: the integrator is second order."""
    state = metropolis.init(jnp.array([0.5, 2.0, -0.05]), correlated)
    kernel = mams.build_kernel()
    inv_mass = jnp.asarray(np.diag(COV))
    errors = []
    for eps in (0.2, 0.1, 0.05):
        _, info = kernel(jax.random.PRNGKey(3), state, correlated, eps, inv_mass, int(round(2.0 / eps)))
        errors.append(-np.log(max(float(info.acceptance_rate), 1e-30)) if float(info.acceptance_rate) < 1 else 0.0)
    assert errors[2] < 0.05, errors


@pytest.mark.parametrize("dense", [pytest.param(False, marks=pytest.mark.slow), True])  # a diagonal metric: slow
def test_exact_draws_stay_exact_under_the_kernel(dense):
    """Start 4096 chains at exact draws; after 20 MAMS transitions they still have the exact moments."""
    n = 4096
    x0 = jnp.asarray(np.random.default_rng(0).multivariate_normal(np.zeros(3), COV, n), jnp.float32)
    inv_mass = jnp.asarray(COV) if dense else jnp.asarray(np.diag(COV))
    config = KernelConfig(kind="mams", dense_mass=dense)
    params = Params(jnp.float32(0.6), inv_mass, jnp.float32(3.0))
    _, trace = jax.jit(sample_chunk(correlated, config, 20))(chain_keys(0, jnp.arange(n, dtype=jnp.uint32)),
                                                             x0, params, 0)
    last = np.asarray(trace["position"][:, -1:, :]).reshape(1, n, 3)  # 4096 independent chains, one draw each
    for i in range(3):
        within_mc_error(last[..., i], 0.0, np.sqrt(COV[i, i]))
    assert 0.5 < float(trace["acceptance_rate"].mean()) < 1.0


# Slow: test_options_matrix.py samples the same kind of target with MAMS adapted by dhmc.sample, in the quick suite.
@pytest.mark.slow
@pytest.mark.parametrize("dense", [False, True])
def test_adapted_ensemble_recovers_a_correlated_badly_scaled_gaussian(dense):
    config = KernelConfig(kind="mams", target_accept=0.9, dense_mass=dense)
    chains = 128
    keys = chain_keys(0, jnp.arange(chains, dtype=jnp.uint32))
    pos = jax.random.uniform(jax.random.PRNGKey(1), (chains, 3), minval=-2, maxval=2)
    w = jax.jit(warmup_chunk(correlated, config))
    params = Params(jnp.float32(-1), jnp.eye(3) if dense else jnp.ones(3), jnp.float32(-1))
    first = 0
    for n, collect in ((150, True), (150, True), (300, True), (100, False)):
        pos, stats = w(keys, pos, params, first, n, True, collect, first == 0)
        first += n
        mass = welford(dense=dense).final(stats.mass) if collect else params.inverse_mass_matrix
        params = Params(stats.step_size, mass, stats.trajectory_length)
    acceptance = float(stats.acceptance_rate)
    assert 0.8 < acceptance < 0.97, acceptance
    _, trace = jax.jit(sample_chunk(correlated, config, 400))(keys, pos, params, first)
    x = np.asarray(trace["position"])
    for i in range(3):
        within_mc_error(x[..., i], 0.0, np.sqrt(COV[i, i]))
    within_correlation_error(x, np.zeros(3), COV)
    assert np.asarray(trace["diverging"]).mean() < 0.01


def test_a_one_dimensional_model_is_refused_with_a_clear_error():
    from dhmc.distributed.spec import check_kernel_fits

    with pytest.raises(ValueError, match="kernel='mams' needs at least 2"):
        check_kernel_fits("mams", 1)
    check_kernel_fits("chees", 1)

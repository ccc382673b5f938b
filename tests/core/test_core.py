"""The pure JAX core, without Dask: kernels leave the target invariant, adaptation pieces merge exactly."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dhmc.core import hmc, metropolis
from dhmc.core.adaptation import dual_averaging, halton, welford
from dhmc.core.ensemble import KernelConfig, Params, chain_keys, sample_chunk, warmup_chunk
from dhmc.core.integrators import IntegratorState, kinetic_energy, leapfrog


def gaussian(scales):
    scales = jnp.asarray(scales)
    return lambda x: -0.5 * jnp.sum((x / scales) ** 2)


def test_leapfrog_is_reversible_and_nearly_conserves_energy():
    f = gaussian([1.0, 3.0])
    inv_mass = jnp.array([1.0, 2.0])
    x = jnp.array([0.5, -1.0])
    lp, g = jax.value_and_grad(f)(x)
    s0 = IntegratorState(x, jnp.array([0.3, 0.2]), lp, g)
    s1 = leapfrog(f, s0, 0.1, inv_mass, 20)
    back = leapfrog(f, s1._replace(momentum=-s1.momentum), 0.1, inv_mass, 20)
    np.testing.assert_allclose(back.position, s0.position, atol=1e-5)
    h = lambda s: -s.logdensity + kinetic_energy(inv_mass, s.momentum)
    assert abs(h(s1) - h(s0)) < 1e-2


def test_a_trajectory_evaluates_the_log_density_once_at_its_end():
    evaluations = []

    def f(x):
        jax.debug.callback(lambda: evaluations.append(1))  # runs once per forward evaluation, not per gradient
        return gaussian([1.0, 3.0])(x)

    x, inv_mass = jnp.array([0.5, -1.0]), jnp.array([1.0, 2.0])
    lp, g = jax.value_and_grad(f)(x)
    evaluations.clear()
    for steps in (1, 2, 7):
        end = jax.jit(leapfrog, static_argnums=0)(f, IntegratorState(x, jnp.array([0.3, 0.2]), lp, g), 0.1,
                                                   inv_mass, steps)
        manual = IntegratorState(x, jnp.array([0.3, 0.2]), lp, g)
        for _ in range(steps):
            p = manual.momentum + 0.05 * manual.logdensity_grad
            y = manual.position + 0.1 * inv_mass * p
            value, grad = jax.value_and_grad(gaussian([1.0, 3.0]))(y)
            manual = IntegratorState(y, p + 0.05 * grad, value, grad)
        for a, b in zip(end, manual, strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-6)
    assert len(evaluations) == 1 + 2 + 7  # one forward pass per step (a gradient runs one), none more


def test_transition_noise_is_a_standard_normal_and_a_uniform_from_one_key():
    keys = jax.random.split(jax.random.PRNGKey(0), 100_000)
    noise, uniform = jax.jit(jax.vmap(lambda k: metropolis.transition_noise(k, jnp.zeros((2, 3)))))(keys)  # one compile
    assert noise.shape == (100_000, 2, 3) and uniform.shape == (100_000,)
    np.testing.assert_allclose(noise.reshape(-1, 6).mean(0), 0.0, atol=0.02)
    np.testing.assert_allclose(noise.reshape(-1, 6).std(0), 1.0, atol=0.02)
    assert 0.0 < float(uniform.min()) and float(uniform.max()) < 1.0
    np.testing.assert_allclose(np.quantile(np.asarray(uniform), [0.1, 0.5, 0.9]), [0.1, 0.5, 0.9], atol=0.01)
    same = metropolis.transition_noise(keys[0], jnp.zeros(6))[0]
    np.testing.assert_array_equal(same, jax.random.normal(keys[0], (7,))[:6])  # jax.random.normal's numbers


def test_kernel_flags_divergences_and_rejects_them():
    f = gaussian([1.0])
    state = metropolis.init(jnp.array([1.0]), f)
    kernel = hmc.build_kernel(divergence_threshold=10.0)
    new, info = kernel(jax.random.PRNGKey(0), state, f, 50.0, jnp.ones(1), 5)
    assert bool(info.diverging) and float(info.acceptance_rate) < 1e-3
    assert np.array_equal(new.position, state.position)


def test_a_proposal_whose_log_density_overflows_to_plus_inf_is_a_divergence():
    """delta = -inf used to be accepted: float32 chains flung to 1e20 stayed there, and warmup collapsed."""

    def overflowing(x):  # +inf past |x| = 2, as a float32 quadratic form of mixed signs can give
        return jnp.where(jnp.abs(x[0]) > 2.0, jnp.inf, -0.5 * jnp.sum(x**2))

    state = metropolis.init(jnp.array([1.5]), overflowing)
    kernel = hmc.build_kernel()
    for seed in range(20):
        new, info = kernel(jax.random.PRNGKey(seed), state, overflowing, 3.0, jnp.ones(1), 1)
        if abs(float(info.proposal[0])) > 2.0:
            assert bool(info.diverging) and float(info.acceptance_rate) == 0.0
            assert np.array_equal(new.position, state.position)
            break
    else:
        raise AssertionError("no proposal left the region")


@pytest.mark.slow  # quick, test_options_matrix.py recovers a correlated Gaussian with ChEES and a dense metric
def test_ensemble_sampling_recovers_a_badly_scaled_gaussian_with_dense_mass():
    cov = np.array([[1.0, 0.95 * 30], [0.95 * 30, 900.0]])
    prec = jnp.asarray(np.linalg.inv(cov))
    f = lambda x: -0.5 * x @ prec @ x
    config = KernelConfig(dense_mass=True)
    chains = jnp.arange(128, dtype=jnp.uint32)
    keys = chain_keys(0, chains)
    pos = jax.random.normal(jax.random.PRNGKey(1), (128, 2))
    w = jax.jit(warmup_chunk(f, config))
    params = Params(jnp.float32(-1), jnp.eye(2), jnp.float32(-1))
    pos, stats = w(keys, pos, params, 0, 300, True, True, True)
    inv_mass = welford(dense=True).final(stats.mass)
    np.testing.assert_allclose(inv_mass, cov, rtol=0.25)
    params = Params(stats.step_size, inv_mass, stats.trajectory_length)
    pos, stats = w(keys, pos, params, 300, 200, True, False, False)
    params = Params(stats.step_size, inv_mass, stats.trajectory_length)
    _, trace = jax.jit(sample_chunk(f, config, 300))(keys, pos, params, 500)
    x = np.asarray(trace["position"]).reshape(-1, 2)
    np.testing.assert_allclose(np.cov(x.T), cov, rtol=0.1)
    assert np.asarray(trace["diverging"]).mean() < 0.01


def test_chain_streams_do_not_depend_on_the_chunk():
    f = gaussian([1.0, 2.0])
    config = KernelConfig(kind="hmc", num_steps=3)
    params = Params(jnp.float32(0.4), jnp.ones(2), jnp.float32(1.2))
    run = jax.jit(sample_chunk(f, config, 20))
    pos = jnp.zeros((8, 2))
    _, whole = run(chain_keys(7, jnp.arange(8, dtype=jnp.uint32)), pos, params, 0)
    _, tail = run(chain_keys(7, jnp.arange(4, 8, dtype=jnp.uint32)), pos[4:], params, 0)
    np.testing.assert_allclose(whole["position"][4:], tail["position"], rtol=1e-6)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=6), st.booleans())
def test_welford_merge_equals_one_pass(sizes, dense):
    rng = np.random.default_rng(sum(sizes))
    batches = [rng.normal(size=(n, 3)) * [1.0, 10.0, 0.1] + 5.0 for n in sizes]
    wf = welford(dense, xp=np)
    merged = wf.init(3, np.float64)
    for b in batches:
        merged = wf.merge(merged, wf.update(wf.init(3, np.float64), b))
    everything = np.concatenate(batches)
    one = wf.update(wf.init(3, np.float64), everything)
    np.testing.assert_allclose(merged.mean, one.mean, rtol=1e-10)
    np.testing.assert_allclose(merged.m2, one.m2, rtol=1e-8, atol=1e-10)
    if len(everything) > 1:
        expected = np.cov(everything.T) if dense else everything.var(axis=0, ddof=1)
        np.testing.assert_allclose(merged.m2 / (len(everything) - 1), expected, rtol=1e-8)


def test_dual_averaging_finds_the_step_size_for_a_target():
    da = dual_averaging(target=0.8)
    state = da.init(jnp.float32(1.0))
    for _ in range(300):  # acceptance falls with the step size as exp(-eps^2)
        eps = jnp.exp(state.log_step_size)
        state = da.update(state, jnp.exp(-eps**2))
    assert abs(float(da.final(state)) - np.sqrt(-np.log(0.8))) < 0.05


def test_halton_jitter_is_in_the_open_unit_interval_and_spread():
    u = np.asarray(jax.vmap(halton)(jnp.arange(1024)))
    assert u.min() > 0 and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.01 and len(np.unique(u)) == 1024

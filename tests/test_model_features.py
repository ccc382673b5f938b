"""Models using JAX and NumPyro features that end up in the workers' programs, on the embedded cluster.

The embedded cluster (``cluster=None``) runs executables the driver compiled: a LAPACK call in them
(Cholesky, triangular solve, determinant, eigendecomposition) once crashed every worker. Each model
is checked against a known answer: closed-form moments, or the prior's own draws.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from correlated_gaussian import COV, MEAN, SD
from jax import lax
from jax.scipy.linalg import solve_triangular
from jax.scipy.special import gammaln, logsumexp
from mc_checks import within_correlation_error, within_mc_error
from scipy import special, stats

import dhmc

SIZES = dict(chains=64, draws=400, warmup=300, chains_per_task=16, progress=False)


@pytest.fixture(scope="module", autouse=True)
def _on_the_sessions_embedded_cluster(embedded):
    """``cluster=None``, as everywhere here: the driver compiles, the embedded workers load (one cluster a session)."""


@pytest.fixture(autouse=True)
def _numpyro_handler_stack_left_empty():
    """NumPyro's handler stack is one global list: a handler left on it breaks every later model in the process.

    Emptied after each test, so that one failure stays in its test; a leftover fails that test's teardown.
    """
    yield
    from numpyro.primitives import _PYRO_STACK

    leftover = [type(h).__name__ for h in _PYRO_STACK]
    _PYRO_STACK.clear()
    assert not leftover, f"NumPyro handlers left on numpyro.primitives._PYRO_STACK: {leftover}"


def _lp(trace):
    return trace["sample_stats"]["lp"].values


# -- JAX log densities ----------------------------------------------------------------------------------


# Quick, LAPACK in the programs the driver compiles runs in test_embedded.py: a dense metric's Cholesky in every block
# (test_driver_compiled_executables_give_bitwise_the_same_draws[dense-x64]), a Cholesky model's executable loaded in
# a fresh process (test_an_executable_with_lapack_calls_runs_in_a_fresh_process).
@pytest.mark.slow
def test_cholesky_solve_triangular_slogdet():
    """x | s ~ N(MEAN, s^2 COV), log s ~ N(0, 0.3^2), the normal log pdf by hand.

    The covariance depends on the position, so the Cholesky, the triangular solve and the
    determinant run in every step; without the log-determinant log s would be wrong.
    """
    tau = 0.3

    def logdensity(p):
        cov = jnp.exp(2 * p["log_s"]) * jnp.asarray(COV)
        chol = jnp.linalg.cholesky(cov)
        w = solve_triangular(chol, p["x"] - jnp.asarray(MEAN), lower=True)
        _, logdet = jnp.linalg.slogdet(cov)
        return -0.5 * w @ w - 0.5 * logdet - 0.5 * (p["log_s"] / tau) ** 2

    trace = dhmc.sample(logdensity, init={"x": jnp.asarray(MEAN), "log_s": jnp.zeros(())}, seed=201, **SIZES)
    post = trace["posterior"]
    within_mc_error(post["log_s"].values, 0.0, tau)
    x = post["x"].values
    for i in range(3):  # E[s^2] = exp(2 tau^2)
        within_mc_error(x[..., i], MEAN[i], SD[i] * np.exp(tau**2))


@pytest.mark.slow
def test_eigh_precision_with_dense_mass():
    """Precision Q diag(1/w) Q^T from the eigendecomposition of a fixed covariance A: x ~ N(m, A)."""
    b = np.random.default_rng(7).normal(size=(4, 4))
    cov = b @ b.T / 4 + 0.5 * np.eye(4)
    mean = np.array([0.5, -1.0, 2.0, 0.0])

    def logdensity(p):
        w, q = jnp.linalg.eigh(jnp.asarray(cov))
        d = q.T @ (p["x"] - jnp.asarray(mean))
        return -0.5 * jnp.sum(d**2 / w)

    trace = dhmc.sample(logdensity, init={"x": jnp.zeros(4)}, dense_mass=True, seed=202, **SIZES)
    x = trace["posterior"]["x"].values
    for i in range(4):
        within_mc_error(x[..., i], mean[i], np.sqrt(cov[i, i]))
    within_correlation_error(x, mean, cov)


@pytest.mark.slow
def test_gammaln_and_logsumexp():
    """exp(u) ~ Gamma(3, 2) written on the log scale with gammaln; m ~ 0.3 N(-1, 1) + 0.7 N(1, 1) with logsumexp."""
    a, b = 3.0, 2.0
    w, mu = np.array([0.3, 0.7]), np.array([-1.0, 1.0])

    def logdensity(p):
        u, m = p["u"], p["m"]
        gamma = a * u - b * jnp.exp(u) + a * jnp.log(b) - gammaln(a)
        mixture = logsumexp(jnp.log(jnp.asarray(w)) - 0.5 * (m - jnp.asarray(mu)) ** 2 - 0.5 * jnp.log(2 * jnp.pi))
        return gamma + mixture

    trace = dhmc.sample(logdensity, init={"u": jnp.zeros(()), "m": jnp.zeros(())}, seed=203, **SIZES)
    u, m = trace["posterior"]["u"].values, trace["posterior"]["m"].values
    within_mc_error(u, special.digamma(a) - np.log(b), np.sqrt(special.polygamma(1, a)))
    within_mc_error(np.exp(u), a / b, np.sqrt(a) / b)
    mix_mean = w @ mu
    within_mc_error(m, mix_mean, np.sqrt(w @ (1 + mu**2) - mix_mean**2))
    # lp is the log density itself, gammaln's constant included: both normalised, so it is exact.
    exact = (stats.gamma(a, scale=1 / b).logpdf(np.exp(u)) + u
             + np.log(w[0] * stats.norm(mu[0]).pdf(m) + w[1] * stats.norm(mu[1]).pdf(m)))
    assert np.allclose(_lp(trace), exact, atol=2e-4, rtol=1e-4)


@pytest.mark.slow  # quick, test_sample.py and test_cli.py check bad log densities
def test_while_loop_on_the_position_is_a_clear_error():
    """Reverse-mode derivatives do not go through ``while_loop``: JAX's own message, not a crash or a hang."""

    def logdensity(p):
        x = p["x"]
        _, s = lax.while_loop(lambda c: c[0] < 3, lambda c: (c[0] + 1, c[1] + x[c[0]] ** 2), (0, jnp.zeros(())))
        return -0.5 * s

    with pytest.raises(ValueError, match="Reverse-mode differentiation does not work for lax.while_loop"):
        dhmc.sample(logdensity, init={"x": jnp.zeros(3)}, seed=205, **SIZES)


@jax.custom_jvp
def softplus(v):
    return jnp.logaddexp(v, 0.0)


@softplus.defjvp
def _softplus_jvp(primals, tangents):
    (v,), (dv,) = primals, tangents
    return softplus(v), jax.nn.sigmoid(v) * dv


LOOP_MEAN, LOOP_SD = np.array([1.0, -1.0, 3.0, 0.0]), np.array([0.5, 1.0, 2.0, 1.5])
GAMMA_A, GAMMA_B = 4.0, 2.0


def _series():
    """sum_{k>=1} 2^-k = 1 by a ``while_loop`` on constants, summed until the term is below 1e-7."""

    def cond(c):
        return c[1] > 1e-7

    def body(c):
        total, term = c
        return total + term, term / 2

    return lax.while_loop(cond, body, (jnp.zeros(()), jnp.full((), 0.5)))[0]


def _loops(x):
    """x ~ N(LOOP_MEAN, LOOP_SD^2): a sum of squares by ``fori_loop``, plus the series (1) from a ``while_loop``."""
    z = (x - jnp.asarray(LOOP_MEAN)) / jnp.asarray(LOOP_SD)
    squares = lax.fori_loop(0, 4, lambda i, s: s + z[i] ** 2, jnp.zeros(()))
    return -0.5 * squares + _series()


def _softplus_gamma(v):
    """softplus(v) ~ Gamma(4, 2), with softplus a ``custom_jvp`` and log-Jacobian log sigmoid(v) = -softplus(-v)."""
    x = softplus(v)
    return jnp.sum((GAMMA_A - 1) * jnp.log(x) - GAMMA_B * x - softplus(-v))


@pytest.fixture(scope="module")
def loops_and_custom_jvp():
    """One run of both features' independent parts (``x`` and ``v``): one compile and one run for the two tests."""
    return dhmc.sample(lambda p: _loops(p["x"]) + _softplus_gamma(p["v"]), init={"x": jnp.zeros(4), "v": jnp.ones(2)},
                       seed=204, **SIZES)


def test_fori_loop_and_a_constant_while_loop(loops_and_custom_jvp):
    """A sum of squares by ``fori_loop``; a ``while_loop`` (on constants) adding a series to the log density: the
    moments, and lp the log density itself (the series' 1 and the custom_jvp part included)."""
    trace = loops_and_custom_jvp
    x, v = trace["posterior"]["x"].values, np.asarray(trace["posterior"]["v"].values, float)
    for i in range(4):
        within_mc_error(x[..., i], LOOP_MEAN[i], LOOP_SD[i])
    gamma = np.sum((GAMMA_A - 1) * np.log(np.logaddexp(v, 0.0)) - GAMMA_B * np.logaddexp(v, 0.0)
                   - np.logaddexp(-v, 0.0), -1)  # the custom_jvp part's log density, by numpy
    assert np.allclose(_lp(trace), -0.5 * np.sum(((x - LOOP_MEAN) / LOOP_SD) ** 2, -1) + 1.0 + gamma, atol=1e-4,
                       rtol=1e-5)


def test_custom_jvp(loops_and_custom_jvp):
    """softplus(v) ~ Gamma(4, 2): a wrong derivative rule, or a missing log-Jacobian, moves these moments."""
    x = np.logaddexp(loops_and_custom_jvp["posterior"]["v"].values, 0.0)
    for i in range(2):
        within_mc_error(x[..., i], GAMMA_A / GAMMA_B, np.sqrt(GAMMA_A) / GAMMA_B)


# -- NumPyro models --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_numpyro_multivariate_normal_scale_tril_dense_mass():
    import numpyro
    import numpyro.distributions as dist

    scale_tril = jnp.asarray(np.linalg.cholesky(COV))

    def model():
        numpyro.sample("x", dist.MultivariateNormal(jnp.asarray(MEAN), scale_tril=scale_tril))

    trace = dhmc.sample(model, dense_mass=True, seed=207, **SIZES)
    x = trace["posterior"]["x"].values
    assert x.shape == (64, 400, 3)
    for i in range(3):
        within_mc_error(x[..., i], MEAN[i], SD[i])
    within_correlation_error(x, MEAN, COV)


@pytest.mark.slow
def test_numpyro_lkj_cholesky():
    """Off-diagonal correlations of LKJ(eta) in d dimensions: (r + 1) / 2 ~ Beta(eta - 1 + d/2, eta - 1 + d/2)."""
    import numpyro
    import numpyro.distributions as dist

    d, eta = 3, 2.0
    exact_sd = np.sqrt(1 / (2 * eta + d - 1))
    prior = dist.LKJCholesky(d, concentration=eta).sample(jax.random.PRNGKey(0), (100_000,))
    prior_corr = np.asarray(prior @ jnp.swapaxes(prior, -1, -2))
    for i, j in [(0, 1), (0, 2), (1, 2)]:  # the formula, against the prior's own draws
        assert abs(prior_corr[:, i, j].mean()) < 0.01 and abs(prior_corr[:, i, j].std() / exact_sd - 1) < 0.01

    def model():
        numpyro.sample("L", dist.LKJCholesky(d, concentration=eta))

    trace = dhmc.sample(model, seed=208, **SIZES)
    chol = trace["posterior"]["L"].values
    assert chol.shape == (64, 400, d, d)
    assert np.allclose(np.triu(chol, 1), 0.0)
    corr = chol @ np.swapaxes(chol, -1, -2)
    assert np.allclose(np.diagonal(corr, axis1=-2, axis2=-1), 1.0, atol=1e-4)
    for i, j in [(0, 1), (0, 2), (1, 2)]:
        within_mc_error(corr[..., i, j], 0.0, exact_sd)


@pytest.mark.slow
def test_numpyro_gaussian_random_walk():
    """x_t = the sum of t + 1 N(0, s^2) steps: x_t ~ N(0, (t + 1) s^2), increments iid N(0, s^2)."""
    import numpyro
    import numpyro.distributions as dist

    scale, steps = 0.5, 8

    def model():
        numpyro.sample("w", dist.GaussianRandomWalk(scale=scale, num_steps=steps))

    trace = dhmc.sample(model, seed=209, **SIZES)
    w = trace["posterior"]["w"].values
    assert w.shape == (64, 400, steps)
    for t in range(steps):
        within_mc_error(w[..., t], 0.0, scale * np.sqrt(t + 1))
    within_mc_error(np.diff(w, axis=-1)[..., -1], 0.0, scale)


@pytest.mark.slow
def test_numpyro_plate_with_observations():
    """Normal mean, known sigma: mu ~ N(0, 10^2), y_i ~ N(mu, 2^2) in a plate; a conjugate normal posterior."""
    import numpyro
    import numpyro.distributions as dist

    y = np.random.default_rng(3).normal(1.5, 2.0, size=25)

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 10.0))
        numpyro.deterministic("twice_mu", 2 * mu)
        with numpyro.plate("data", y.shape[0]):
            numpyro.sample("y", dist.Normal(mu, 2.0), obs=y)

    trace = dhmc.sample(model, model_args=(jnp.asarray(y),), seed=210, **SIZES)
    var = 1 / (1 / 10.0**2 + len(y) / 2.0**2)
    mu = trace["posterior"]["mu"].values
    within_mc_error(mu, var * y.sum() / 2.0**2, np.sqrt(var))
    assert np.allclose(trace["posterior"]["twice_mu"].values, 2 * mu)
    assert np.allclose(trace["observed_data"]["y"].values, y)


# -- plain scripts, no __main__ guard ---------------------------------------------------------------------

GP_X = np.linspace(0.0, 1.0, 8)
GP_Y = np.sin(2 * np.pi * GP_X)
GP_NOISE = 0.2

SCRIPTS = {
    "dense_mass": """
        import jax.numpy as jnp, numpy as np, dhmc
        tr = dhmc.sample(lambda p: -0.5 * jnp.sum(p["z"] ** 2), init={"z": jnp.zeros(3)}, chains=16, draws=50,
                         warmup=50, dense_mass=True)
        z = tr["posterior"]["z"].values
        np.save("draws.npy", z)
        print("RESULT", z.shape, np.round(z.mean((0, 1)), 3).tolist())
    """,
    "gp": f"""
        import jax.numpy as jnp, numpy as np, dhmc
        x = np.linspace(0.0, 1.0, 8)
        y = jnp.asarray(np.sin(2 * np.pi * x))
        K = jnp.asarray(np.exp(-(x[:, None] - x[None]) ** 2 / (2 * 0.3 ** 2)) + 1e-4 * np.eye(8))

        def logdensity(p):
            f = jnp.linalg.cholesky(K) @ p["z"]
            return -0.5 * jnp.sum(p["z"] ** 2) - 0.5 * jnp.sum((y - f) ** 2) / {GP_NOISE} ** 2

        tr = dhmc.sample(logdensity, init={{"z": jnp.zeros(8)}}, chains=64, draws=200, warmup=300)
        f = tr["posterior"]["z"].values @ np.linalg.cholesky(np.asarray(K, float)).T
        np.save("draws.npy", f)
        print("RESULT", f.shape, np.round(f.mean((0, 1)), 3).tolist())
    """,
}


@pytest.mark.parametrize("name", list(SCRIPTS))
@pytest.mark.slow
def test_plain_script_without_main_guard(tmp_path, name):
    script = tmp_path / f"{name}.py"
    script.write_text(textwrap.dedent(SCRIPTS[name]))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, f"exit {out.returncode}\n{out.stdout[-2000:]}\n{out.stderr[-4000:]}"
    (line,) = [line for line in out.stdout.splitlines() if line.startswith("RESULT")]
    draws = np.load(tmp_path / "draws.npy")
    if name == "dense_mass":
        assert line.startswith("RESULT (16, 50, 3)")
        for i in range(3):
            within_mc_error(draws[..., i], 0.0, 1.0)
    else:
        assert line.startswith("RESULT (64, 200, 8)")
        # f = L z with z ~ N(0, I) a priori: f ~ N(0, K); y ~ N(f, noise^2): a Gaussian posterior.
        k = np.exp(-(GP_X[:, None] - GP_X[None]) ** 2 / (2 * 0.3**2)) + 1e-4 * np.eye(8)
        gain = k @ np.linalg.inv(k + GP_NOISE**2 * np.eye(8))
        mean, cov = gain @ GP_Y, k - gain @ k
        for i in range(8):
            within_mc_error(draws[..., i], mean[i], np.sqrt(cov[i, i]))

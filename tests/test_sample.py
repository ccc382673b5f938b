"""End to end: dhmc.sample on real multi-process clusters, checked against exact posteriors."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import arviz as az
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr
from mc_checks import within_mc_error
from scipy import stats

import dhmc


def test_coin_toss_matches_exact_beta_posteriors(client2):
    trace = dhmc.sample("coin_toss", chains=256, draws=400, warmup=400, seed=1, cluster=client2, progress=False)
    p = trace["posterior"]["p"]
    assert p.dims == ("chain", "draw", "coin")
    for coin, (a, b) in enumerate([(21, 21), (31, 11)]):
        exact = stats.beta(a, b)
        within_mc_error(p.isel(coin=coin).values, exact.mean(), exact.std())
    # The posterior mean, not the MAP (0.75) the seed project reported.
    assert abs(float(p.isel(coin=1).mean()) - 31 / 42) < 0.005
    assert set(trace["sample_stats"].data_vars) == {"lp", "acceptance_rate", "diverging", "energy", "n_steps",
                                                   "step_size"}
    assert "observed_data" in trace.children
    attrs = trace["posterior"].attrs
    assert attrs["inference_library"] == "dhmc" and "created_at" in attrs and "dhmc_timing" in attrs


def test_logdensity_with_client_gaussian_2d(client2):
    mean, cov = np.array([5.0, 5.0]), np.array([[4.0, -3.0], [-3.0, 4.0]])
    precision = jnp.asarray(np.linalg.inv(cov))

    def logdensity(position):
        d = position["x"] - jnp.asarray(mean)
        return -0.5 * d @ precision @ d

    trace = dhmc.sample(logdensity, init={"x": jnp.zeros(2)}, chains=256, draws=400, warmup=400, seed=2,
                        cluster=client2, progress=False)
    x = trace["posterior"]["x"].values
    assert x.shape == (256, 400, 2)
    for i in range(2):
        within_mc_error(x[..., i], mean[i], np.sqrt(cov[i, i]))
    flat = x.reshape(-1, 2)
    assert abs(np.corrcoef(flat.T)[0, 1] + 0.75) < 0.02


# The default (ChEES, automatic warmup) runs quick; MAMS (ChEES's block programs and automatic warmup) and a fixed
# warmup in the slow suite.
# A correlated target too: its cold phase turns dense midway (a metric from the whole ensemble's positions and
# gradients, merged on the driver).
CORRELATED = np.linalg.inv(np.array([[1.0, 0.95, 0.0], [0.95, 1.0, 0.0], [0.0, 0.0, 0.1]]))


@pytest.mark.parametrize("kernel, warmup, correlated", [
    ("chees", "auto", False), ("chees", "auto", True), pytest.param("mams", "auto", False, marks=pytest.mark.slow),
    pytest.param("chees", 150, False, marks=pytest.mark.slow)])
def test_bitwise_identical_on_one_and_two_workers(client1, client2, kernel, warmup, correlated):
    kw = dict(init={"x": jnp.zeros(3)}, chains=64, draws=120, warmup=warmup, seed=5, chains_per_task=16,
              progress=False, kernel=kernel)
    if correlated:
        logdensity = lambda p: -0.5 * (p["x"] - 1.0) @ jnp.asarray(CORRELATED, p["x"].dtype) @ (p["x"] - 1.0)
    else:
        logdensity = lambda p: -0.5 * jnp.sum((p["x"] - 1.0) ** 2 * jnp.array([1.0, 4.0, 9.0]))
    one = dhmc.sample(logdensity, cluster=client1, **kw)
    two = dhmc.sample(logdensity, cluster=client2, **kw)
    cold = [r for r in json.loads(one["posterior"].attrs["dhmc_warmup"]) if r.get("phase") == "cold"]
    assert bool(cold) is (warmup == "auto") and any(r["dense"] for r in cold) is correlated
    for group in ("posterior", "sample_stats"):
        for name in one[group].data_vars:
            assert np.array_equal(one[group][name].values, two[group][name].values), (group, name)


def test_a_capped_auto_warmup_warns_and_summary_flags_it(client2):
    """Two adjusted rounds cannot end warmup (it needs three): max_warmup=30 (two rounds of 15 after the cold
    phase) ends unconverged, and says so twice, with the tests its last round measured and its verdict (a test it
    failed, or the second passing round in a row it lacks: `tests/distributed/test_stopping.py` has each)."""
    logdensity = lambda p: -0.5 * jnp.sum(p["x"] ** 2)
    with pytest.warns(dhmc.ConvergenceWarning, match=r"reached max_warmup=30 before the ensemble converged "
                                                     r"\(the last round's drift \|z\| .*; (failed: [a-z ,]+|passed, "
                                                     r"but warmup stops only at the second passing round in a row)\)"):
        trace = dhmc.sample(logdensity, init={"x": jnp.zeros(2)}, chains=32, draws=50, max_warmup=30, seed=1,
                            chains_per_task=16, progress=False, cluster=client2)
    assert trace["posterior"].sizes["draw"] == 50
    flags = dhmc.diagnostics.check(trace)
    assert any(f.startswith("warmup='auto' reached its cap (30 iterations)") and "displacement" in f for f in flags)


def test_divergent_draws_warn_and_are_kept(client2):
    """A leapfrog step 5 sds long diverges on every transition: the run returns its draws and says so, as Stan and
    PyMC do; a stable step says nothing."""
    import warnings

    logdensity = lambda p: -0.5 * jnp.sum((p["x"] / 0.1) ** 2)
    kw = dict(init={"x": jnp.zeros(2)}, chains=16, draws=20, warmup=0, adapt=False, kernel="hmc", num_steps=5,
              seed=3, chains_per_task=8, progress=False, cluster=client2)
    with pytest.warns(dhmc.ConvergenceWarning, match=r"^320 divergent transitions after warmup \(100% of draws\)"):
        trace = dhmc.sample(logdensity, step_size=0.5, **kw)
    assert int(trace["sample_stats"]["diverging"].values.sum()) == 320
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", dhmc.ConvergenceWarning)
        dhmc.sample(logdensity, step_size=0.02, **kw)
    assert not [w for w in caught if "divergent" in str(w.message)]


def test_a_funnel_warns_of_its_energy_and_a_gaussian_does_not(client2):
    """Neal's funnel, centred: each momentum refresh moves the energy by far less than its spread (E-BFMI about
    0.1), so the neck fills slowly and the sds come out small; the run says so. A Gaussian's E-BFMI is about 1."""
    import warnings

    from jax.scipy.stats import norm

    funnel = lambda p: norm.logpdf(p["v"], 0.0, 3.0) + jnp.sum(norm.logpdf(p["x"], 0.0, jnp.exp(p["v"] / 2)))
    gaussian = lambda p: -0.5 * (p["v"] ** 2 + jnp.sum(p["x"] ** 2))
    kw = dict(init={"v": jnp.zeros(()), "x": jnp.zeros(9)}, chains=32, draws=30, warmup=200, seed=2,
              chains_per_task=16, progress=False, cluster=client2)
    energy = []
    for logdensity in (funnel, gaussian):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", dhmc.ConvergenceWarning)
            trace = dhmc.sample(logdensity, **kw)
        energy.append([str(w.message) for w in caught if str(w.message).startswith("E-BFMI")])
        fraction = dhmc.diagnostics.ebfmi(trace)
        assert (fraction < 0.3) == (logdensity is funnel), fraction
        assert any(f.startswith("E-BFMI") for f in dhmc.diagnostics.check(trace)) == (logdensity is funnel)
    assert len(energy[0]) == 1 and "below 0.3" in energy[0][0] and "noncentered=True" in energy[0][0]
    assert energy[1] == []


# Quick, the coin toss above samples a constrained NumPyro site (its uniform prior's logit) against its exact
# posterior, and test_arviz_groups.py a model's deterministic sites and the observed data of its model_args.
@pytest.mark.slow
def test_numpyro_constrained_site_includes_log_jacobian(client2):
    """Precision of a zero-mean normal: Gamma(a, b) prior -> Gamma(a + n/2, b + sum y^2 / 2) posterior."""
    import numpyro
    import numpyro.distributions as dist

    y = np.random.default_rng(0).normal(0.0, 2.0, size=20)

    def model(y):
        tau = numpyro.sample("tau", dist.Gamma(2.0, 1.0))
        numpyro.deterministic("sigma", 1.0 / jnp.sqrt(tau))
        numpyro.sample("y", dist.Normal(0.0, 1.0 / jnp.sqrt(tau)), obs=y)

    trace = dhmc.sample(model, model_args=(jnp.asarray(y),), chains=128, draws=400, warmup=400, seed=3,
                        cluster=client2, progress=False)
    exact = stats.gamma(2.0 + len(y) / 2, scale=1.0 / (1.0 + np.sum(y**2) / 2))
    within_mc_error(trace["posterior"]["tau"].values, exact.mean(), exact.std())
    assert np.allclose(trace["posterior"]["sigma"].values, 1 / np.sqrt(trace["posterior"]["tau"].values), rtol=1e-5)
    assert np.array_equal(trace["observed_data"]["y"].values, y.astype(np.float32))


def test_store_round_trips_into_arviz(client2, tmp_path):
    path = tmp_path / "coin.zarr"
    trace = dhmc.sample("coin_toss", chains=64, draws=100, warmup=100, chains_per_task=16, cluster=client2,
                        store=path, progress=False)
    opened = xr.open_datatree(path, engine="zarr")
    assert {"posterior", "sample_stats", "observed_data"} <= set(opened.children)
    assert np.array_equal(opened["posterior"]["p"].values, trace["posterior"]["p"].values)
    assert opened["posterior"]["p"].encoding["chunks"][:2] == (16, 100)
    lazy = dhmc.open_trace(path)
    assert "dhmc" not in lazy.children
    table = az.summary(az.InferenceData.from_datatree(lazy))
    assert {"p[0]", "p[1]"} <= set(table.index)
    assert table["r_hat"].max() < 1.05


@pytest.mark.slow
def test_float64_on_the_client_means_float64_on_workers(tmp_path):
    script = tmp_path / "x64.py"
    script.write_text(textwrap.dedent("""
        import jax
        jax.config.update("jax_enable_x64", True)
        import jax.numpy as jnp, dhmc
        tr = dhmc.sample(lambda p: -0.5 * jnp.sum(p["x"] ** 2), init={"x": jnp.zeros(2)}, chains=16, draws=20,
                         warmup=20, progress=False, cluster_options={"n_workers": 1})
        print("DTYPE", tr["posterior"]["x"].dtype, tr["sample_stats"]["lp"].dtype)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert "DTYPE float64 float64" in out.stdout, out.stderr[-2000:]


# Its quick counterpart: test_the_embedded_driver_imports_no_dashboard_zarr_or_arviz_until_asked, whose script (no
# main guard either) starts the embedded cluster and samples on it.
@pytest.mark.slow
def test_script_without_main_guard_runs_on_embedded_cluster(tmp_path):
    script = tmp_path / "noguard.py"
    script.write_text(textwrap.dedent("""
        import jax.numpy as jnp, dhmc
        tr = dhmc.sample(lambda p: -0.5 * jnp.sum(p["x"] ** 2), init={"x": jnp.zeros(2)}, chains=32, draws=50,
                         warmup=50, progress=False)
        print("NOGUARD_OK", tr["posterior"]["x"].shape)
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert "NOGUARD_OK (32, 50, 2)" in out.stdout, out.stderr[-2000:]


@pytest.mark.parametrize("kernel", ["hmc", pytest.param("chees", marks=pytest.mark.slow),
                                    pytest.param("mams", marks=pytest.mark.slow)])
def test_fixed_parameters_without_adaptation(client2, kernel):
    trace = dhmc.sample(lambda p: -0.5 * jnp.sum(p["x"] ** 2), init={"x": jnp.zeros(2)}, chains=32, draws=50,
                        warmup=10, kernel=kernel, step_size=0.3, num_steps=5, adapt=False, cluster=client2,
                        progress=False)
    stats_ = trace["sample_stats"]
    assert np.all(stats_["step_size"].values == np.float32(0.3))
    steps = stats_["n_steps"].values
    if kernel == "hmc":
        assert np.all(steps == 5)
    else:  # jittered (chees, mams): ceil(u * 5) with u in (0, 1), shared by all chains
        assert steps.min() >= 1 and steps.max() <= 5 and len(np.unique(steps)) > 1
        assert np.all(steps == steps[:1])


# Slow: a cluster of its own. Quick, test_delivery.py samples on an embedded cluster over TLS (where the machine has
# an address off loopback).
@pytest.mark.slow
def test_tls_cluster(tmp_path):
    """A cluster whose every connection is TLS: dhmc only needs its Client."""
    from distributed import Client, LocalCluster
    from distributed.security import Security

    security = Security.temporary()
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1", protocol="tls://",
                      security=security, dashboard_address=None) as cluster, Client(cluster, security=security) as c:
        assert c.scheduler.address.startswith("tls://")
        trace = dhmc.sample("gaussian_2d", chains=32, draws=100, warmup=100, cluster=c, progress=False)
    assert trace["posterior"]["x"].shape == (32, 100, 2)


@pytest.mark.parametrize("options, message", [
    (dict(seed=-1), r"^seed must be a non-negative integer, got -1$"),
    (dict(seed=2**40), r"^seed must be below 2\*\*32 \(it seeds 32-bit random streams\), got 1099511627776$"),
    (dict(step_size=float("inf")), r"^step_size must be a positive finite number, got inf$"),
    (dict(trajectory_length=-1.0), r"^trajectory_length must be a positive finite number, got -1.0$"),
    (dict(num_steps=2.5, step_size=0.1), r"^num_steps must be a positive integer, got 2.5$"),
    (dict(init=None), r"<lambda> takes one argument and no init= was given: a log density needs init= "),
    (dict(chains=10**10), r"^10000000000 chains' positions would take .* GiB in the driver, more than the .* GiB "
                          r"free: take fewer chains$"),
    (dict(store="memory://run.zarr"), r"^store='memory://run.zarr' would live in this process's memory, which the "
                                      r"workers cannot write"),
    (dict(store="r" * 250 + ".zarr"), r"^the store's name is 255 bytes long; its lock file beside it \(r{20}\.\.\."
                                      r"\.dhmc-lock\) allows at most 245: choose a shorter name$"),
])
def test_bad_input_is_one_line_before_any_cluster(options, message, monkeypatch):
    from dhmc.distributed import startup

    monkeypatch.setattr(startup.Startup, "__init__", lambda *a, **k: pytest.fail("a cluster was started"))
    kw = dict(target=lambda p: -0.5 * jnp.sum(p["x"] ** 2), init={"x": jnp.zeros(2)}, chains=8, draws=10,
              progress=False) | options
    with pytest.raises(ValueError, match=message) as e:
        dhmc.sample(kw.pop("target"), **kw)
    assert "\n" not in str(e.value)


def test_an_integer_log_density_is_refused_before_any_block():
    """Its gradient is zero everywhere: the chains would random-walk (checked on one chain's position, before dhmc
    connects: the scheduler is unreachable, and no embedded cluster starts in the background only to be abandoned)."""
    with pytest.raises(ValueError, match=r"failed on one chain's position .*: ValueError: it returns int32, not a "
                                         r"float: its gradient is zero everywhere"):
        dhmc.sample(lambda p: jnp.sum(p["x"] > 0), init={"x": jnp.zeros(2)}, chains=8, draws=10, progress=False,
                    cluster="tcp://127.0.0.1:1")

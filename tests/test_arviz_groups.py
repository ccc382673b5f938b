"""What ArviZ users expect of a result: pointwise log-likelihoods, dims from plates and arguments, NumPyro inits."""

from __future__ import annotations

import arviz as az
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest
from mc_checks import within_mc_error
from numpyro.infer import init_to_median
from numpyro.infer.util import log_likelihood

import dhmc
from dhmc.models.examples import EIGHT_SCHOOLS_SIGMA, EIGHT_SCHOOLS_Y, eight_schools_model
from dhmc.models.numpyro_ import NumPyroTarget

Y, SIGMA = EIGHT_SCHOOLS_Y, EIGHT_SCHOOLS_SIGMA
schools = eight_schools_model  # non-centred, with a plate "school"


def grouped(y=None):
    """Nested plates: ``z`` has axes (group, item); a MultivariateNormal's event axis keeps ArviZ's name."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    corr = numpyro.sample("corr", dist.MultivariateNormal(jnp.zeros(2), jnp.eye(2)))
    with numpyro.plate("item", 4):
        with numpyro.plate("group", 3, dim=-2):
            z = numpyro.sample("z", dist.Normal(mu, 1.0))
        numpyro.sample("y", dist.Normal(z.sum(0) + corr.sum(), 1.0), obs=y)


@pytest.mark.parametrize("store", [pytest.param(False, marks=pytest.mark.slow), True], ids=["memory", "store"])
def test_log_likelihood_group_matches_numpyro_and_feeds_loo(client2, tmp_path, store):
    path = tmp_path / "s.zarr" if store else None
    tree = dhmc.sample(schools, model_args=(SIGMA, Y), chains=32, draws=100, warmup=150, cluster=client2,
                       log_likelihood=True, coords={"school": list("ABCDEFGH")}, store=path, progress=False)
    pointwise = tree["log_likelihood"]["obs"]
    assert pointwise.dims == ("chain", "draw", "school") and pointwise.shape == (32, 100, 8)
    assert list(tree["observed_data"]["obs"].dims) == ["school"]
    assert list(tree["posterior"]["school"].values) == list("ABCDEFGH")
    post = tree["posterior"]
    draws = {k: jnp.asarray(post[k].values[:4, :10]) for k in ("mu", "tau", "theta_tilde")}
    expected = log_likelihood(schools, draws, SIGMA, Y, batch_ndims=2)["obs"]
    np.testing.assert_allclose(pointwise.values[:4, :10], expected, rtol=1e-4, atol=1e-4)
    idata = az.InferenceData.from_datatree(tree)
    loo = az.loo(idata)
    assert np.isfinite(loo.elpd_loo) and -33 < loo.elpd_loo < -29  # eight schools: about -30.7
    assert np.isfinite(az.waic(idata).elpd_waic)
    if store:
        reopened = dhmc.open_trace(path)
        np.testing.assert_array_equal(reopened["log_likelihood"]["obs"].values, pointwise.values)


@pytest.mark.slow  # quick, test_store_safety.py resumes a store bitwise and the test above checks the group's values
def test_log_likelihood_resumes_bitwise(client2, tmp_path):
    """A resumed run's log-likelihoods, like its draws, are those of an uninterrupted one."""
    from dhmc.storage import zarr_

    kwargs = dict(model_args=(SIGMA, Y), chains=16, draws=60, warmup=60, chains_per_task=8, cluster=client2,
                  log_likelihood=True, progress=False)
    whole = dhmc.sample(schools, store=tmp_path / "whole.zarr", **kwargs)
    dhmc.sample(schools, store=tmp_path / "cut.zarr", **kwargs)
    root, _ = zarr_.open_store(tmp_path / "cut.zarr")
    root["dhmc/done"][1, :] = 0  # as if the run had stopped before the second chunk's blocks were marked
    resumed = dhmc.resume(tmp_path / "cut.zarr", cluster=client2, target=schools, model_args=(SIGMA, Y),
                          progress=False)
    np.testing.assert_array_equal(resumed["log_likelihood"]["obs"].values, whole["log_likelihood"]["obs"].values)


@pytest.mark.slow
def test_plates_name_dims_and_arguments_override(client2):
    y = np.arange(4.0)
    tree = dhmc.sample(grouped, model_kwargs={"y": y}, chains=8, draws=20, warmup=20, cluster=client2,
                       dims={"corr": ["component"]}, coords={"item": ["a", "b", "c", "d"]}, progress=False)
    post = tree["posterior"]
    assert post["z"].dims == ("chain", "draw", "group", "item")
    assert post["corr"].dims == ("chain", "draw", "component")
    assert list(post["item"].values) == ["a", "b", "c", "d"] and list(post["group"].values) == [0, 1, 2]
    assert tree["observed_data"]["y"].dims == ("item",)


def test_dims_for_a_log_density(client2):
    tree = dhmc.sample(lambda p: -0.5 * jnp.sum(p["x"] ** 2), init={"x": jnp.zeros(3)}, chains=8, draws=10,
                       warmup=10, cluster=client2, dims={"x": "axis"}, coords={"axis": ["u", "v", "w"]},
                       progress=False)
    assert tree["posterior"]["x"].dims == ("chain", "draw", "axis")
    assert list(tree["posterior"]["axis"].values) == ["u", "v", "w"]


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(dims={"x": ["a", "b"]}), "dims for 'x' name 2 axes"),
    (dict(dims={"nope": ["a"]}), "dims names 'nope', which is not a variable"),
    (dict(dims={"x": ["a"]}, coords={"a": [1, 2]}), "coords for 'a' have 2 values"),
    (dict(dims={"x": ["draw"]}), "'draw', which dhmc names itself"),
    (dict(dims=["x"]), "dims must be a dict"),
    (dict(log_likelihood=True), "log_likelihood=True needs a NumPyro or PyMC model"),
])
def test_bad_labels_are_one_line_errors_before_any_cluster(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        dhmc.sample(lambda p: -0.5 * jnp.sum(p["x"] ** 2), init={"x": jnp.zeros(3)}, chains=4, draws=5, warmup=5,
                    cluster="tcp://127.0.0.1:1", progress=False, **kwargs)


def test_log_likelihood_needs_observed_sites():
    def prior_only():
        numpyro.sample("a", dist.Normal())

    with pytest.raises(ValueError, match="needs observed sites"):
        dhmc.sample(prior_only, chains=4, draws=5, warmup=5, log_likelihood=True, cluster="tcp://127.0.0.1:1")


def test_numpyro_init_sets_where_chains_start():
    model = NumPyroTarget(schools, (SIGMA, Y), init={"tau": 2.0, "mu": 1.0}).build()
    flat = dict(zip(["mu", "tau"], model.centre[:2], strict=True))  # ravel order: sorted site names
    assert flat["mu"] == pytest.approx(1.0) and flat["tau"] == pytest.approx(np.log(2.0), rel=1e-5)
    assert model.radius == 0.5
    median = NumPyroTarget(schools, (SIGMA, Y), init=init_to_median(num_samples=51)).build()
    assert abs(median.centre[0]) < 1.5  # the prior median of mu, N(0, 5): near 0
    with pytest.raises(ValueError, match="init names 'sigma', which is not a latent site"):
        NumPyroTarget(schools, (SIGMA, Y), init={"sigma": 1.0}).build()
    with pytest.raises(TypeError, match="init for a NumPyro model must be"):
        NumPyroTarget(schools, (SIGMA, Y), init=3.0).build()


def test_numpyro_init_reaches_the_run(client2):
    """No warmup and tiny fixed steps: the draws stay next to the init."""
    tree = dhmc.sample(schools, model_args=(SIGMA, Y), init={"mu": 40.0}, chains=8, draws=5, warmup=0,
                       adapt=False, step_size=1e-4, num_steps=1, kernel="hmc", cluster=client2, progress=False)
    assert np.all(np.abs(tree["posterior"]["mu"].values - 40.0) < 1.0)


def test_posterior_predictive_and_prior_groups(client2, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    path = tmp_path / "ppc.zarr"
    tree = dhmc.sample(schools, model_args=(SIGMA, Y), chains=64, draws=200, warmup=200, chains_per_task=32,
                       cluster=client2, predictive=True, prior=4000, store=path, progress=False)
    ppc = tree["posterior_predictive"]["obs"]
    assert ppc.dims == ("chain", "draw", "school") and ppc.shape == (64, 200, 8)
    theta = tree["posterior"]["theta"].values
    # y_rep = theta + sigma * e: its mean is theta's and its variance theta's plus sigma^2
    residual = (ppc.values - theta) / SIGMA
    for school in range(8):
        within_mc_error(residual[..., school], 0.0, 1.0)
    prior = tree["prior"]
    assert prior["mu"].dims == ("chain", "draw") and prior["theta"].dims == ("chain", "draw", "school")
    within_mc_error(prior["mu"].values, 0.0, 5.0)  # independent draws: ESS = 4000
    assert tree["prior_predictive"]["obs"].shape == (1, 4000, 8)
    idata = az.InferenceData.from_datatree(tree)
    az.plot_ppc(idata, num_pp_samples=50)
    az.plot_ppc(idata, group="prior", num_pp_samples=50)
    # extended, the predictive draws of the first draws stay (their keys are the chain's and the iteration's)
    longer = dhmc.extend(path, 50, cluster=client2, target=schools, model_args=(SIGMA, Y), progress=False)
    np.testing.assert_array_equal(longer["posterior_predictive"]["obs"].values[:, :200], ppc.values)
    assert np.isfinite(longer["posterior_predictive"]["obs"].values).all()


def test_predictive_and_prior_need_a_numpyro_or_pymc_model():
    for kwargs in (dict(predictive=True), dict(prior=10)):
        with pytest.raises(ValueError, match=r"(predictive=True|prior=10) needs a NumPyro or PyMC model"):
            dhmc.sample(lambda p: -0.5 * jnp.sum(p["x"] ** 2), init={"x": jnp.zeros(3)}, chains=4, draws=5, warmup=5,
                        cluster="tcp://127.0.0.1:1", progress=False, **kwargs)
    with pytest.raises(ValueError, match="prior must be a non-negative integer"):
        dhmc.sample(schools, model_args=(SIGMA, Y), prior=-1, cluster="tcp://127.0.0.1:1")

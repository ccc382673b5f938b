"""A NumPyro model's hierarchy non-centred by dhmc (``NumPyroTarget(noncentered=True)``), without a cluster."""

from __future__ import annotations

import re

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import pytest

import dhmc
from dhmc.models.numpyro_ import NumPyroTarget

SIGMA = jnp.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])
Y = jnp.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])


def centred(sigma, y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("school", y.shape[0]):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("y", dist.Normal(theta, sigma), obs=y)


def test_the_non_centred_model_reports_the_site_and_its_standard_normal():
    model = NumPyroTarget(centred, (SIGMA, Y), noncentered=True).build()
    assert model.dim == 10
    position = np.zeros(model.dim, np.float32)
    position[-8:] = 1.0  # theta_decentered (sites in name order: mu, tau, theta_decentered)
    out = model.constrain_fn(jnp.asarray(position))
    assert set(out) == {"mu", "tau", "theta", "theta_decentered"}
    np.testing.assert_allclose(out["theta"], out["mu"] + out["tau"] * out["theta_decentered"], rtol=1e-6)
    assert model.dims["theta"] == ["school"] and model.dims["theta_decentered"] == ["school"]


def test_noncentered_needs_a_model_and_says_so_before_any_work():
    with pytest.raises(ValueError, match=r"noncentered=True needs a NumPyro or PyMC model; .* is a log density"):
        dhmc.sample(lambda p: -0.5 * jnp.sum(p["x"] ** 2), init={"x": jnp.zeros(2)}, noncentered=True,
                    cluster="tcp://127.0.0.1:1")  # never reached


def test_an_init_naming_a_non_centred_site_says_what_to_give_instead():
    with pytest.raises(ValueError, match=r"init names 'theta', which noncentered=True samples as theta_decentered"):
        NumPyroTarget(centred, (SIGMA, Y), noncentered=True, init={"theta": np.zeros(8)}).build()


@pytest.mark.parametrize("value", [0.0, np.zeros(1), np.zeros((2, 8))], ids=["scalar", "one", "two-d"])
def test_an_init_of_another_shape_than_its_site_is_refused_not_sampled(value):
    """NumPyro's init_to_value starts a site at whatever shape it is given, and the model is then sampled with it: a
    scalar theta was one effect shared by the eight schools, silently."""
    with pytest.raises(ValueError, match=rf"init for 'theta' has shape {re.escape(str(np.shape(value)))}, the site "
                                         r"has shape \(8,\)"):
        NumPyroTarget(centred, (SIGMA, Y), init={"theta": value}).build()
    assert NumPyroTarget(centred, (SIGMA, Y), init={"theta": np.zeros(8), "mu": 1.0}).build().dim == 10


@pytest.mark.parametrize("init, message", [
    ({"tau": -1.0}, r"init for 'tau' is outside its support Positive\(lower_bound=0.0\): -1\."),
    ({"theta": np.full(8, np.inf)}, r"init for 'theta' is outside its support Real\(\): \[inf inf"),
], ids=["negative scale", "infinite"])
def test_an_init_outside_its_sites_support_names_the_site(init, message):
    """NumPyro's own message named a distribution downstream ("Normal distribution got invalid scale parameter")."""
    with pytest.raises(ValueError, match=message):
        NumPyroTarget(centred, (SIGMA, Y), init=init).build()


def test_an_init_outside_a_support_set_by_another_site_names_the_site():
    def model():
        low = numpyro.sample("low", dist.Normal(0.0, 1.0))
        numpyro.sample("p", dist.Uniform(low, low + 1.0))

    with pytest.raises(ValueError, match=r"init for 'p' is outside its support Interval: 3\."):
        NumPyroTarget(model, init={"low": 0.0, "p": 3.0}).build()
    assert NumPyroTarget(model, init={"low": 0.0, "p": 0.5}).build().dim == 2


def test_numpyro_models_sampled_from_two_threads_at_once_give_their_solo_draws(client2):
    """NumPyro keeps its effect handlers in one global stack: two runs preparing a model at once failed with
    'all sites must have unique names'. Each now gets bitwise what it gets alone."""
    import threading

    import dhmc
    from dhmc.models.examples import EIGHT_SCHOOLS_SIGMA, EIGHT_SCHOOLS_Y, eight_schools_model

    run = lambda seed: dhmc.sample(eight_schools_model, model_args=(EIGHT_SCHOOLS_SIGMA, EIGHT_SCHOOLS_Y), chains=16,
                                   draws=20, warmup=20, seed=seed, chains_per_task=8, cluster=client2,
                                   progress=False)["posterior"]["mu"].values
    together, errors = {}, []

    def in_thread(seed):
        try:
            together[seed] = run(seed)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    threads = [threading.Thread(target=in_thread, args=(seed,)) for seed in (1, 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for seed in (1, 2):
        np.testing.assert_array_equal(together[seed], run(seed))


def test_observations_computed_in_the_model_are_its_observed_data():
    """The build traces the model abstractly; an observation the model computes is still stored as its value."""

    def model(raw):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        with numpyro.plate("obs", raw.shape[0]):
            numpyro.sample("y", dist.Normal(mu, 1.0), obs=jnp.log(raw) * 2.0)

    raw = np.array([1.0, 2.0, 3.0])
    built = NumPyroTarget(model, (raw,)).build()
    np.testing.assert_allclose(built.observed_data["y"], np.log(raw) * 2.0, rtol=1e-6)
    assert built.dims == {"y": ["obs"]}


def test_an_init_with_no_finite_log_density_is_numpyros_message():
    def model():
        s = numpyro.sample("s", dist.HalfNormal(1.0))
        numpyro.factor("nowhere", jnp.where(s > 0, -jnp.inf, 0.0))

    with pytest.raises(RuntimeError, match="Cannot find valid initial parameters"):
        NumPyroTarget(model, init={"s": 1.0}).build()


BUILD_IN_A_FRESH_PROCESS = """
import logging
import jax
from dhmc.models.numpyro_ import NumPyroTarget
from tests.models.test_numpyro_ import SIGMA, Y, centred
compiles = []
handler = logging.Handler()
handler.emit = lambda record: compiles.append(record.getMessage())
logging.getLogger("jax").addHandler(handler)
logging.getLogger("jax").setLevel(logging.DEBUG)
jax.config.update("jax_log_compiles", True)
NumPyroTarget(centred, (SIGMA, Y), noncentered={noncentered}).build()
print("compiles", sum("Finished XLA compilation" in m for m in compiles))
"""


@pytest.mark.slow
@pytest.mark.parametrize("noncentered", [False, True])
def test_building_a_numpyro_model_compiles_almost_nothing(noncentered):
    """The build traces NumPyro's initialisation once: it ran it op by op, 174 one-op XLA compiles and 3 s of CPU in
    every process (driver and each worker) that built the eight schools; ``noncentered=True``'s search for the
    sites to non-centre ran the model op by op too (1.2 s of CPU; 26 compiles counted this way, 7 now)."""
    import subprocess
    import sys

    script = BUILD_IN_A_FRESH_PROCESS.replace("{noncentered}", str(noncentered))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    compiles = int(out.stdout.split("compiles")[-1])
    assert 0 < compiles <= 20, out.stdout

"""PyMC (and Bambi) models as dhmc targets: the flat model PyMC's JAX backend gives, the trace named as
``pm.sample(nuts_sampler="numpyro")`` names it, refusals before any cluster starts, resume, the CLI, Bambi."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

pm = pytest.importorskip("pymc")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import dhmc  # noqa: E402
from dhmc.models.pymc_ import PyMCTarget, is_pymc_model, pymc_target  # noqa: E402
from dhmc.models.pymc_jax import jax_backend  # noqa: E402
from tests.validation.pymc_models import eight_schools_noncentered  # noqa: E402

NOWHERE = "tcp://127.0.0.1:9"  # a cluster that is never reached: the errors below come before any connection


def schools():
    """The non-centred eight schools with ``pm.Data`` (sigma) and coords (school names), as PyMC users write it."""
    return eight_schools_noncentered()


def test_the_flat_model_is_pymcs_log_density_on_the_unconstrained_scale():
    model = schools()
    flat = pymc_target(model).build()
    assert jax.config.jax_enable_x64 and flat.dtype == np.float64 and flat.dim == 10  # mu, tau_log__, theta_trans
    logp = model.compile_logp()
    rng = np.random.default_rng(1)
    for _ in range(3):
        x = rng.normal(size=flat.dim)
        point = {"mu": x[0], "tau_log__": x[1], "theta_trans": x[2:]}
        np.testing.assert_allclose(float(flat.logdensity_fn(jnp.asarray(x))), logp(point), rtol=1e-10)
    values = flat.constrain_fn(jnp.asarray(x))
    assert set(values) == {"mu", "tau", "theta_trans", "theta"}
    np.testing.assert_allclose(values["tau"], np.exp(x[1]))
    np.testing.assert_allclose(values["theta"], x[0] + np.exp(x[1]) * x[2:])
    assert flat.dims["theta"] == ["school"] and flat.coords["school"][0] == "Choate"
    assert set(flat.observed_data) == {"y"} and set(flat.constant_data) == {"sigma"}
    np.testing.assert_array_equal(flat.centre, np.r_[0.0, np.log(5.0), np.zeros(8)])  # model.initial_point()


def test_pymc_is_told_without_importing_it_and_its_jax_backend_leaves_this_process_as_it_was(monkeypatch):
    assert is_pymc_model(pm.Model()) and not is_pymc_model(object())
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    jax.config.update("jax_enable_x64", False)
    jax_backend()
    assert "XLA_FLAGS" not in __import__("os").environ and not jax.config.jax_enable_x64


def test_a_discrete_free_variable_is_one_line_before_any_cluster():
    with pm.Model() as model:
        k = pm.Poisson("k", 3.0)
        pm.Normal("y", k, 1.0, observed=[1.0, 2.0])
    with pytest.raises(ValueError, match=r"^the PyMC model's free variable 'k' is discrete \(int64\)") as e:
        dhmc.sample(model, chains=4, draws=10, progress=False, cluster=NOWHERE)
    assert "\n" not in str(e.value)


def test_an_op_without_a_jax_implementation_is_one_line_naming_the_variable():
    import pytensor.tensor as pt
    from pytensor.graph.basic import Apply
    from pytensor.graph.op import Op

    class Twice(Op):  # computes in Python only: PyTensor has no JAX implementation of it
        def make_node(self, x):
            x = pt.as_tensor_variable(x)
            return Apply(self, [x], [x.type()])

        def perform(self, node, inputs, outputs):
            outputs[0][0] = 2 * inputs[0]

        def grad(self, inputs, gradients):
            return [2 * gradients[0]]

    with pm.Model() as model:
        x = pm.Normal("x", 0.0, 1.0)
        pm.Normal("y", Twice()(x), 1.0, observed=[0.5])
    with pytest.raises(ValueError, match=r"cannot run in JAX: variable 'y' uses an Op with no JAX implementation") as e:
        dhmc.sample(model, chains=4, draws=10, progress=False, cluster=NOWHERE)
    assert "\n" not in str(e.value)


def test_options_for_numpyro_models_only_are_refused_for_a_pymc_model():
    with pytest.raises(ValueError, match="model_args and model_kwargs are for NumPyro models"):
        dhmc.sample(schools(), model_args=(1,), chains=4, draws=10, progress=False, cluster=NOWHERE)
    with pytest.raises(ValueError, match="init names 'nope', which is not a free variable"):
        dhmc.sample(schools(), init={"nope": 1.0}, chains=4, draws=10, progress=False, cluster=NOWHERE)


@pytest.mark.parametrize(("init", "message"), [
    ({"theta_trans": np.zeros(3)}, r"init for 'theta_trans' has shape \(3,\), the variable has shape \(8,\)"),
    ({"theta_trans": 0.0}, r"init for 'theta_trans' has shape \(\), the variable has shape \(8,\)"),
    ({"tau": np.ones(1)}, r"init for 'tau' has shape \(1,\), the variable has shape \(\)"),
])
def test_an_init_of_another_shape_than_its_variable_is_one_line_before_any_cluster(init, message):
    with pytest.raises(ValueError, match=message):
        dhmc.sample(schools(), init=init, chains=4, draws=10, progress=False, cluster=NOWHERE)


def _layout(tree) -> dict:
    """Per group: each variable's dims, and each dim's coordinates (as strings)."""
    out = {}
    for group in tree.children:
        ds = tree[group].to_dataset() if hasattr(tree[group], "to_dataset") else tree[group]
        out[group] = {"vars": {k: list(v.dims) for k, v in ds.data_vars.items()},
                      "coords": {k: [str(c) for c in v.values] for k, v in ds.coords.items()
                                 if k not in ("chain", "draw")}}
    return out


def test_a_pymc_model_samples_on_the_embedded_cluster_with_its_names_and_data(client1):
    """The basic path, quick: ``dhmc.sample(model)``, the posterior constrained and named with the model's dims and
    coords, ``pm.Data`` in ``constant_data``, the pointwise log-likelihood computed on the worker."""
    trace = dhmc.sample(schools(), chains=8, draws=30, warmup=0, kernel="hmc", step_size=0.3, num_steps=5,
                        adapt=False, cluster=client1, progress=False, log_likelihood=True)  # one program to compile
    post = trace["posterior"]
    assert set(post.data_vars) == {"mu", "tau", "theta_trans", "theta"} and post["mu"].dtype == np.float64
    assert post["theta"].dims == ("chain", "draw", "school") and list(post["school"].values)[-1] == "Mt. Hermon"
    assert (post["tau"].values > 0).all()
    assert list(trace["constant_data"]["sigma"].values) == [15, 10, 16, 11, 9, 11, 10, 18]
    assert trace["log_likelihood"]["y"].dims == ("chain", "draw", "school")
    assert trace["observed_data"]["y"].dims == ("school",)


# Slow (a NumPyro NUTS run, a posterior predictive compiled by PyMC, ~60 s on two quiet cores; 120 s loaded).
@pytest.mark.slow
def test_the_trace_is_named_as_pm_samples_and_feeds_pymc_and_arviz(client2):
    """Group, variable, dim and coord names equal those of ``pm.sample(nuts_sampler="numpyro")`` on the same model
    (sample_stats: NUTS's ``tree_depth`` aside); the posterior is constrained with deterministics; log-likelihood
    and predictive draws come from the workers; ``pm.sample_posterior_predictive`` and ``az.loo`` take the result."""
    import arviz as az

    model = schools()
    trace = dhmc.sample(model, chains=16, draws=60, warmup=60, chains_per_task=8, cluster=client2, progress=False,
                        log_likelihood=True, predictive=True, prior=50)
    jax_backend()  # pymc.sampling.jax, without its XLA_FLAGS (workers started after would inherit them)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        reference = pm.sample(draws=20, tune=20, chains=1, model=model, nuts_sampler="numpyro", progressbar=False,
                              random_seed=1, idata_kwargs={"log_likelihood": True}, compute_convergence_checks=False)
    ours, theirs = _layout(trace), _layout(reference.to_datatree() if hasattr(reference, "to_datatree")
                                           else _as_tree(reference))
    for group in theirs:
        assert group in ours, (group, sorted(ours))
        if group == "sample_stats":
            assert set(ours[group]["vars"]) == set(theirs[group]["vars"]) - {"tree_depth"}
            continue
        assert ours[group] == theirs[group], group
    assert set(ours) - set(theirs) == {"posterior_predictive", "prior", "prior_predictive"}
    assert ours["prior"]["vars"] == ours["posterior"]["vars"] and trace["prior"].sizes["draw"] == 50
    predictive = {"y": ["chain", "draw", "school"]}
    assert ours["prior_predictive"]["vars"] == ours["posterior_predictive"]["vars"] == predictive

    post = trace["posterior"]
    np.testing.assert_allclose(post["theta"].values, post["mu"].values[..., None]
                               + post["tau"].values[..., None] * post["theta_trans"].values, rtol=1e-12, atol=1e-12)
    assert (post["tau"].values > 0).all() and trace["posterior_predictive"]["y"].shape == (16, 60, 8)
    assert trace["constant_data"]["sigma"].values[0] == 15.0
    idata = az.InferenceData.from_datatree(trace)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loo = az.loo(idata)
        ppc = pm.sample_posterior_predictive(idata, model=model, progressbar=False, random_seed=2)
    assert np.isfinite(loo.elpd_loo) and -34 < loo.elpd_loo < -28  # eight schools: about -30.7
    assert ppc.posterior_predictive["y"].shape == (16, 60, 8)
    import matplotlib

    matplotlib.use("Agg")
    assert az.plot_ppc(idata, num_pp_samples=20) is not None  # dhmc's own posterior_predictive group


def _as_tree(idata):
    import xarray as xr

    return xr.DataTree.from_dict({g: idata[g] for g in idata.groups()})


@pytest.mark.slow
@pytest.mark.parametrize(("kernel", "dense_mass", "warmup"), [
    ("chees", None, "auto"), ("chees", True, 100), ("mams", False, "auto"), ("hmc", False, 100)])
def test_every_kernel_and_metric_samples_a_pymc_model(client2, kernel, dense_mass, warmup):
    trace = dhmc.sample(schools(), kernel=kernel, dense_mass=dense_mass, warmup=warmup, chains=64, draws=200,
                        cluster=client2, progress=False, **({"num_steps": 8} if kernel == "hmc" else {}))
    post = trace["posterior"]
    assert post["mu"].dtype == np.float64 and json.loads(trace.attrs["dhmc_run_spec"])["x64"]
    assert abs(float(post["mu"].mean()) - 4.4) < 1.0 and 2.5 < float(post["tau"].mean()) < 4.8


@pytest.mark.slow
def test_a_pymc_run_resumes_and_extends_bitwise(client2, tmp_path):
    from dhmc.storage import zarr_

    kwargs = dict(chains=16, draws=60, warmup=60, chains_per_task=8, cluster=client2, progress=False,
                  log_likelihood=True)
    whole = dhmc.sample(schools(), store=tmp_path / "whole.zarr", **kwargs)
    dhmc.sample(schools(), store=tmp_path / "cut.zarr", **kwargs)
    root, _ = zarr_.open_store(tmp_path / "cut.zarr")
    root["dhmc/done"][1, :] = 0  # as if the run had stopped before the second chunk's blocks were marked
    with pytest.raises(ValueError, match="give it again"):
        dhmc.resume(tmp_path / "cut.zarr", cluster=client2, progress=False)
    resumed = dhmc.resume(tmp_path / "cut.zarr", cluster=client2, target=schools(), progress=False)
    for group, name in (("posterior", "theta"), ("log_likelihood", "y")):
        np.testing.assert_array_equal(resumed[group][name].values, whole[group][name].values)
    longer = dhmc.sample(schools(), store=tmp_path / "longer.zarr", **{**kwargs, "draws": 80})
    extended = dhmc.extend(tmp_path / "whole.zarr", 20, cluster=client2, target=schools(), progress=False)
    np.testing.assert_array_equal(extended["posterior"]["theta"].values, longer["posterior"]["theta"].values)


@pytest.mark.slow
def test_a_killed_worker_changes_nothing_in_a_pymc_run(tmp_path):
    """A worker SIGKILLed mid-run: its blocks run again elsewhere (the restarted worker compiles the model again),
    and the store is bitwise the one of an undisturbed run."""
    import os
    import signal
    import threading
    import time

    import zarr
    from distributed import Client, LocalCluster

    from tests.test_faults import done_blocks, same_trace

    kw = dict(chains=128, draws=2000, warmup=100, seed=11, chains_per_task=16, progress=False)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        dhmc.sample(schools(), cluster=client, store=tmp_path / "ref.zarr", **kw)
        out = {}
        thread = threading.Thread(target=lambda: out.setdefault(
            "trace", dhmc.sample(schools(), cluster=client, store=tmp_path / "hit.zarr", **kw)))
        thread.start()
        deadline = time.time() + 300
        while done_blocks(tmp_path / "hit.zarr") < 2 and time.time() < deadline:
            time.sleep(0.1)
        total = int(np.prod(zarr.open_group(str(tmp_path / "ref.zarr"), mode="r")["dhmc/done"].shape))
        assert done_blocks(tmp_path / "hit.zarr") < total, "the run ended before a worker could be killed"
        os.kill(sorted(client.run(os.getpid).values())[0], signal.SIGKILL)
        thread.join(900)
    assert "trace" in out, "the run did not finish after a worker was killed"
    assert same_trace(tmp_path / "ref.zarr", tmp_path / "hit.zarr")


def test_a_target_that_does_not_round_trip_is_named_before_any_cluster():
    """Some libraries' objects pickle but do not unpickle (Inference Gym's: ``missing a required argument``); the
    driver tries the round trip and names the part, before any cluster starts."""

    class Gym:
        def __init__(self, distribution):
            self.distribution = distribution

        def __reduce__(self):  # forgets its argument, as a class whose __init__ and pickling disagree
            return (type(self), ())

        def logdensity(self, x):
            return -0.5 * jnp.sum((x - self.distribution) ** 2)

    with pytest.raises(TypeError, match=r"^the target\.logdensity_fn\.__self__ cannot be sent to the workers: Gym "
                                        r"pickles but does not unpickle \(TypeError: .*missing 1 required positional "
                                        r"argument: 'distribution'\); send the target by reference") as e:
        dhmc.sample(Gym(1.0).logdensity, init=jnp.zeros(2), chains=4, draws=10, progress=False, cluster=NOWHERE)
    assert "\n" not in str(e.value)


BY_REFERENCE = '''
import jax.numpy as jnp
import numpy as np
import pymc as pm

import dhmc


class Gym:  # does not survive pickling: sent by reference it never needs to
    def __init__(self, centre):
        self.centre = centre

    def __reduce__(self):
        return (type(self), ())

    def logdensity(self, x):
        return -0.5 * jnp.sum((x - self.centre) ** 2)


def make(centre):
    return dhmc.models.LogDensityTarget(Gym(centre).logdensity, jnp.zeros(2), name="gym")


def regression(slope):
    x = np.linspace(-1, 1, 20)
    with pm.Model(coords={"point": range(20)}) as model:
        b = pm.Normal("b", 0.0, 10.0)
        pm.Normal("y", b * x, 1.0, observed=slope * x, dims="point")
    return model
'''


@pytest.mark.slow
def test_targets_by_reference_sample_resume_and_come_from_the_cli(client2, tmp_path, monkeypatch):
    from dhmc.models import by_reference
    from dhmc.storage import zarr_
    from tests.test_cli_user_model import dhmc_cli

    (tmp_path / "mytargets.py").write_text(BY_REFERENCE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    # client2's workers started elsewhere: they find mytargets in the driver's working directory, kept by reference
    trace = dhmc.sample(by_reference("mytargets:make", centre=3.0), chains=16, draws=100, cluster=client2,
                        progress=False)
    assert abs(float(trace["posterior"]["x"].mean()) - 3.0) < 0.2
    np.savez(tmp_path / "data.npz", slope=2.0)
    common = ["--data", "data.npz", "--chains", 16, "--draws", 60, "--warmup", 60, "--chains-per-task", 8,
              "--no-progress", "--by-reference"]
    for store in ("whole.zarr", "cut.zarr"):
        out = dhmc_cli(tmp_path, "sample", "mytargets:regression", *common, "--out", store)
        assert out.returncode == 0, out.stderr[-2000:]
    whole = dhmc.open_trace(tmp_path / "whole.zarr")
    assert json.loads(whole.attrs["dhmc_run_spec"])["by_reference"]
    assert whole["posterior"]["b"].dtype == np.float64 and abs(float(whole["posterior"]["b"].mean()) - 2.0) < 0.3
    root, _ = zarr_.open_store(tmp_path / "cut.zarr")
    root["dhmc/done"][1, :] = 0
    out = dhmc_cli(tmp_path, "resume", "cut.zarr", "--model", "mytargets:regression", "--no-progress")
    assert out.returncode == 0, out.stderr[-2000:]
    np.testing.assert_array_equal(dhmc.open_trace(tmp_path / "cut.zarr")["posterior"]["b"].values,
                                  whole["posterior"]["b"].values)


CLI_MODELS = '''
import numpy as np
import pymc as pm

with pm.Model(coords={"point": range(5)}) as model:
    mu = pm.Normal("mu", 0.0, 10.0)
    pm.Normal("y", mu, 1.0, observed=np.arange(5.0), dims="point")


def make(centre):
    with pm.Model() as built:
        pm.Normal("z", centre, 1.0)
    return built
'''


@pytest.mark.slow
def test_the_cli_samples_a_pm_model_or_a_function_returning_one_and_extends_it(tmp_path):
    from tests.test_cli_user_model import dhmc_cli

    (tmp_path / "mymodels.py").write_text(CLI_MODELS)
    common = ["--chains", 16, "--draws", 100, "--warmup", 100, "--no-progress", "--log-likelihood"]
    out = dhmc_cli(tmp_path, "sample", "mymodels:model", *common, "--out", "m.zarr")
    assert out.returncode == 0, out.stderr[-2000:]
    tree = dhmc.open_trace(tmp_path / "m.zarr")
    assert tree["log_likelihood"]["y"].dims == ("chain", "draw", "point")
    assert abs(float(tree["posterior"]["mu"].mean()) - 2.0) < 0.2
    out = dhmc_cli(tmp_path, "extend", "m.zarr", "--draws", 20, "--model", "mymodels:model", "--no-progress")
    assert out.returncode == 0, out.stderr[-2000:]
    assert dhmc.open_trace(tmp_path / "m.zarr")["posterior"].sizes["draw"] == 120
    (tmp_path / "data.json").write_text(json.dumps({"centre": 5.0}))
    out = dhmc_cli(tmp_path, "sample", "mymodels:make", "--data", "data.json", *common[:-1], "--out", "f.zarr")
    assert out.returncode == 0, out.stderr[-2000:]
    assert abs(float(dhmc.open_trace(tmp_path / "f.zarr")["posterior"]["z"].mean()) - 5.0) < 0.3


@pytest.mark.slow
def test_a_bambi_formula_model_samples_through_its_pymc_model(client2):
    import bambi as bmb
    import pandas as pd

    rng = np.random.default_rng(0)
    group = np.repeat(np.arange(4), 10)
    data = pd.DataFrame({"x": rng.normal(5.0, 1.0, size=40), "g": [f"g{i}" for i in group]})
    data["y"] = 1.0 + 2.0 * data["x"] + np.array([-1.0, 0.0, 0.5, 1.0])[group] + rng.normal(0, 0.5, 40)
    model = bmb.Model("y ~ x + (1|g)", data)
    trace = dhmc.sample(model, chains=32, draws=200, cluster=client2, progress=False)
    post = trace["posterior"]
    # as bmb.Model.fit() stores them: no per-observation mu, no offsets
    assert set(post.data_vars) == {"Intercept", "x", "1|g", "1|g_sigma", "sigma"}
    assert post["1|g"].dims[-1] == "g__factor_dim" and list(post["g__factor_dim"].values) == ["g0", "g1", "g2", "g3"]
    assert abs(float(post["x"].mean()) - 2.0) < 0.3
    # the intercept on x's own scale (Bambi samples it for centred x, about 1 + 2 * 5 = 11, and moves it back)
    assert abs(float(post["Intercept"].mean()) - 1.0) < 2.0


def test_a_pymc_target_pickles_its_model_small():
    import cloudpickle

    target = PyMCTarget(schools(), name="schools")
    blob = cloudpickle.dumps(target)
    assert len(blob) < 200_000
    again = cloudpickle.loads(blob)
    assert [v.name for v in again.model.value_vars] == ["mu", "tau_log__", "theta_trans"]

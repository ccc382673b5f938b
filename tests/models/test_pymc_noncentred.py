"""``noncentered=True`` for a PyMC model: the hierarchy's normal variables rewritten on a copy of the model's graph,
the same posterior (the log density changes by the rewrite's log-Jacobian only), the user's model untouched."""

from __future__ import annotations

import numpy as np
import pytest

pm = pytest.importorskip("pymc")


import dhmc  # noqa: E402
from dhmc.models.pymc_ import pymc_target  # noqa: E402
from dhmc.models.pymc_noncentred import noncentred, noncentred_variables  # noqa: E402
from tests.models.test_pymc_ import NOWHERE  # noqa: E402
from tests.validation.pymc_models import eight_schools_centered, eight_schools_noncentered, kidiq  # noqa: E402


def test_only_a_normal_whose_location_or_scale_depends_on_a_free_variable_is_rewritten():
    assert noncentred_variables(eight_schools_centered()) == ["theta"]
    assert noncentred_variables(eight_schools_noncentered()) == []  # theta_trans ~ Normal(0, 1): no hierarchy
    assert noncentred_variables(kidiq()) == []
    with pm.Model() as model:
        tau = pm.HalfNormal("tau")
        pm.StudentT("t", nu=3, mu=0, sigma=tau)  # not a normal: stays centred
        pm.LogNormal("w", 0, tau)  # transformed (positive): stays centred
    assert noncentred_variables(model) == []
    same, names = noncentred(model)
    assert same is model and names == []


def test_the_rewritten_log_density_is_the_centred_one_plus_its_log_jacobian():
    """At random points, log p_nc(mu, log tau, z) = log p_c(mu, log tau, theta = mu + tau z) + 8 log tau (the
    Jacobian of z -> theta): the same posterior, written non-centred."""
    centred = eight_schools_centered()
    rewritten, names = noncentred(centred)
    assert names == ["theta"]
    assert [v.name for v in centred.free_RVs] == ["mu", "tau", "theta"]  # the user's model is unchanged
    assert {v.name for v in rewritten.free_RVs} == {"mu", "tau", "theta_decentered"}
    assert [d.name for d in rewritten.deterministics] == ["theta"]
    assert rewritten.named_vars_to_dims["theta"] == rewritten.named_vars_to_dims["theta_decentered"] == ["school"]
    logp_c, logp_nc = centred.compile_logp(), rewritten.compile_logp()
    rng = np.random.default_rng(0)
    for _ in range(5):
        mu, log_tau, z = rng.normal(0, 3), rng.normal(1, 1), rng.normal(size=8)
        theta = mu + np.exp(log_tau) * z
        c = logp_c({"mu": mu, "tau_log__": log_tau, "theta": theta})
        nc = logp_nc({"mu": mu, "tau_log__": log_tau, "theta_decentered": z})
        np.testing.assert_allclose(nc, c + 8 * log_tau, rtol=1e-10)


def test_the_flat_model_reports_theta_and_refuses_an_init_for_it():
    target = pymc_target(eight_schools_centered()).with_outputs(noncentered=True)
    flat = target.build()
    x = np.asarray(flat.centre) + 0.3
    values = flat.constrain_fn(x)
    assert set(values) == {"mu", "tau", "theta", "theta_decentered"}
    np.testing.assert_allclose(values["theta"], values["mu"] + values["tau"] * values["theta_decentered"],
                               rtol=1e-12)
    with pytest.raises(ValueError, match="init names 'theta', which noncentered=True samples as theta_decentered"):
        dhmc.sample(eight_schools_centered(), init={"theta": np.zeros(8)}, noncentered=True, chains=4, draws=10,
                    progress=False, cluster=NOWHERE)


@pytest.mark.slow
def test_a_noncentred_pymc_run_resumes_bitwise(client2, tmp_path):
    """The store's run spec keeps ``noncentered``: resuming with the user's (centred) model rewrites it again, to
    the same flat layout and the same draws."""
    from dhmc.storage import zarr_

    kwargs = dict(chains=16, draws=40, warmup=40, chains_per_task=8, cluster=client2, progress=False,
                  noncentered=True)
    whole = dhmc.sample(eight_schools_centered(), store=tmp_path / "whole.zarr", **kwargs)
    dhmc.sample(eight_schools_centered(), store=tmp_path / "cut.zarr", **kwargs)
    root, _ = zarr_.open_store(tmp_path / "cut.zarr")
    root["dhmc/done"][1, :] = 0  # as if the run had stopped before the second chunk's blocks were marked
    resumed = dhmc.resume(tmp_path / "cut.zarr", cluster=client2, target=eight_schools_centered(), progress=False)
    for name in ("theta", "theta_decentered", "tau"):
        np.testing.assert_array_equal(resumed["posterior"][name].values, whole["posterior"][name].values)

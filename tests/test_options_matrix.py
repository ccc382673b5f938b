"""kernel x dense_mass x x64 x cluster: every combination samples a correlated 3-D Gaussian correctly.

The embedded cluster (``cluster=None``) runs executables the driver compiled and shipped; the
``client2`` LocalCluster's workers compile for themselves. ``dense_mass=True`` puts a Cholesky (a
LAPACK call) into the block programs, which once crashed every embedded worker.
"""

from __future__ import annotations

import itertools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from correlated_gaussian import CORR, COV, MEAN, PRECISION, SD
from mc_checks import within_correlation_error, within_mc_error

import dhmc


def logdensity(p):
    d = p["x"] - jnp.asarray(MEAN)
    return -0.5 * d @ jnp.asarray(PRECISION) @ d


def test_target_is_a_proper_gaussian():
    assert np.linalg.eigvalsh(CORR).min() > 0.1


CASES = list(itertools.product(["chees", "hmc"], [False, True], [False, True], ["embedded", "client2"]))
# MAMS shares ChEES's adaptation and block programs: a half-fraction of its cube, each option on and off twice
CASES += [("mams", False, False, "embedded"), ("mams", True, True, "embedded"),
          ("mams", True, False, "client2"), ("mams", False, True, "client2")]


# The quick suite runs two cases on client2: ChEES with a dense metric and x64, MAMS with a dense metric and x32 (the
# other quick tests sample with HMC and diagonal metrics). The embedded cluster starts anew for each case (~10 s):
# its quick counterpart is test_embedded.py's test_driver_compiled_executables_give_bitwise_the_same_draws[dense-x64],
# the same draws from the embedded cluster as from client2 with ChEES, a dense metric and x64. The slow suite, which
# CI runs too, runs the other cases.
QUICK_CASES = [("chees", True, True, "client2"), ("mams", True, False, "client2")]
SLOW_CASES = [c for c in CASES if c not in QUICK_CASES]


# pytest.ini turns dhmc's UserWarnings into errors: one raised in the driver's background compile
# thread would silently switch the embedded cluster from shipped executables to compiling on the
# workers, hiding what a user gets. Let them through here, and fail on them at the end instead.
@pytest.mark.filterwarnings("always::UserWarning")
@pytest.mark.parametrize(("kernel", "dense_mass", "x64", "where"), [
    pytest.param(*case, marks=[pytest.mark.slow] if case in SLOW_CASES else []) for case in CASES],
    ids=[f"{k}-{'dense' if d else 'diag'}-{'x64' if x else 'x32'}-{w}" for k, d, x, w in CASES])
def test_options_matrix_gaussian_3d(kernel, dense_mass, x64, where, request, tmp_path, recwarn):
    cluster = request.getfixturevalue("client2") if where == "client2" else None
    seed = 100 + CASES.index((kernel, dense_mass, x64, where))
    # dense_mass runs stream into a store, whose attrs keep the adapted parameters.
    store = tmp_path / "run.zarr" if dense_mass else None
    with jax.enable_x64(x64):
        trace = dhmc.sample(logdensity, init={"x": jnp.zeros(3)}, chains=64, draws=300, warmup=300, seed=seed,
                            kernel=kernel, num_steps=10 if kernel == "hmc" else None, dense_mass=dense_mass,
                            chains_per_task=16, cluster=cluster, store=store, progress=False)
    x = trace["posterior"]["x"]
    assert x.dims[:2] == ("chain", "draw")
    x = x.values
    assert x.shape == (64, 300, 3)
    assert x.dtype == (np.float64 if x64 else np.float32)
    assert np.isfinite(x).all()

    spec = json.loads(trace.attrs["dhmc_run_spec"])
    assert (spec["kernel"], spec["dense_mass"], spec["x64"]) == (kernel, dense_mass, x64)
    history = json.loads(trace.attrs["dhmc_warmup"])
    assert history and sum(r["iterations"] for r in history) == 300
    steps = np.array([r["step_size"] for r in history])
    assert np.all(np.isfinite(steps) & (steps > 0)), steps
    if kernel == "hmc":
        assert (trace["sample_stats"]["n_steps"].values == 10).all()

    for i in range(3):
        within_mc_error(x[..., i], MEAN[i], SD[i])

    if dense_mass:
        within_correlation_error(x, MEAN, COV)

        params = trace.attrs["dhmc_params"]
        params = json.loads(params) if isinstance(params, str) else params
        inv_mass = np.asarray(params["inverse_mass_matrix"], float)
        assert inv_mass.shape == (3, 3)
        assert np.allclose(inv_mass, inv_mass.T)
        # The adapted inverse mass matrix estimates the target's covariance.
        assert np.all(np.abs(inv_mass - COV) < 0.2 * np.outer(SD, SD)), inv_mass

    from_dhmc = [f"{w.filename}:{w.lineno}: {w.message}" for w in recwarn
                 if issubclass(w.category, UserWarning) and "/dhmc/" in w.filename]
    assert not from_dhmc, from_dhmc

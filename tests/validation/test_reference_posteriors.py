"""Every kernel dhmc offers, with its defaults, against six posteriordb reference posteriors (gold-standard draws).

Each posterior as a plain JAX log density, and two as NumPyro models. Pass: every parameter's mean within
max |z| < 4.5 and sd within max(5%, 3/sqrt(ESS)) of the reference (``compare.py``); the centred eight
schools funnel must report its divergences (or a convergence warning) instead.

CI runs seed 20; ``DHMC_VALIDATION_SEEDS=20,21,22`` runs more (the three-seed sweep in the README).
"""

from __future__ import annotations

import json
import os
import warnings

import jax
import numpy as np
import pytest

import dhmc
from dhmc import diagnostics
from tests.validation.compare import compare
from tests.validation.posteriors import REFERENCE_POSTERIORS

pytestmark = pytest.mark.slow

NAMES = sorted(REFERENCE_POSTERIORS)


SEEDS = [int(s) for s in os.environ.get("DHMC_VALIDATION_SEEDS", "20").split(",")]


def _sample(target, client, post, seed=20, **kw):
    with jax.enable_x64(post.x64), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", dhmc.ConvergenceWarning)
        trace = dhmc.sample(target, chains=128, draws=1000, seed=seed, dense_mass=post.dense_mass, cluster=client,
                            progress=False, **kw)
    return trace, [str(w.message) for w in caught if issubclass(w.category, dhmc.ConvergenceWarning)]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("kernel", ["chees", "mams", "hmc"])
@pytest.mark.parametrize("name", NAMES)
def test_log_density_matches_reference(name, kernel, seed, client2):
    post = REFERENCE_POSTERIORS[name]
    with jax.enable_x64(post.x64):
        trace, warned = _sample(post.logdensity, client2, post, seed, init=post.init_as(), kernel=kernel)
    position = {k: trace["posterior"][k].values for k in post.init}
    report = compare(post.to_reference(position, derived=True), name)
    divergent = diagnostics.divergences(trace)
    told = f"{report}\ndivergences: {divergent}; warnings: {warned}; warmup: {_warmup_summary(trace)}"
    if post.expect_unbiased:
        assert report.passed, told
    elif not report.passed:  # never silently wrong: a wrong run must say so (its divergences warn too)
        assert warned, f"no warning, yet:\n{told}"
        assert divergent == 0 or any("divergent" in w for w in warned)


def _warmup_summary(trace) -> str:
    history = json.loads(trace["posterior"].attrs["dhmc_warmup"])
    steps = trace["sample_stats"]["n_steps"].values[0].mean()
    return f"{sum(h['iterations'] for h in history)} iterations, {steps:.1f} steps a draw after"


@pytest.mark.parametrize("name", ["eight_schools-eight_schools_noncentered", "kidiq-kidscore_momiq"])
def test_numpyro_model_matches_reference(name, client2):
    post = REFERENCE_POSTERIORS[name]
    trace, _ = _sample(post.numpyro_model, client2, post)
    samples = {k: np.asarray(v.values) for k, v in trace["posterior"].data_vars.items()}
    report = compare(post.numpyro_to_reference(samples), name)
    assert report.passed, str(report)


def test_the_centred_hierarchy_non_centred_by_dhmc_matches_reference(client2):
    """The centred eight schools' documented route: its NumPyro model with ``noncentered=True`` (theta reported
    as the model names it) recovers the reference, where the centred log density stays biased."""
    name = "eight_schools-eight_schools_centered"
    post = REFERENCE_POSTERIORS[name]
    trace, warned = _sample(post.numpyro_model, client2, post, noncentered=True)
    assert {"mu", "tau", "theta", "theta_decentered"} <= set(trace["posterior"].data_vars)
    samples = {k: np.asarray(v.values) for k, v in trace["posterior"].data_vars.items()}
    report = compare(post.numpyro_to_reference(samples, derived=True), name)
    assert report.passed and not warned, f"{report}\nwarnings: {warned}"
    assert diagnostics.divergences(trace) == 0

"""dhmc with its defaults (and with kernel="mams") against six posteriordb reference posteriors (gold-standard draws).

Each posterior as a plain JAX log density, and two as NumPyro models. Pass: every parameter's mean within
max |z| < 4.5 and sd within max(5%, 3/sqrt(ESS)) of the reference (``compare.py``); the centred eight
schools funnel must report its divergences instead.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from compare import compare
from posteriors import REFERENCE_POSTERIORS

import dhmc
from dhmc import diagnostics

pytestmark = pytest.mark.slow

NAMES = sorted(REFERENCE_POSTERIORS)


def _sample(target, client, post, **kw):
    with jax.enable_x64(post.x64):
        return dhmc.sample(target, chains=128, draws=1000, warmup=1000, seed=20, dense_mass=post.dense_mass,
                           cluster=client, progress=False, **kw)


@pytest.mark.parametrize("kernel", ["chees", "mams"])
@pytest.mark.parametrize("name", NAMES)
def test_log_density_matches_reference(name, kernel, client2):
    post = REFERENCE_POSTERIORS[name]
    with jax.enable_x64(post.x64):
        trace = _sample(post.logdensity, client2, post, init=post.init_as(), kernel=kernel)
    position = {k: trace["posterior"][k].values for k in post.init}
    report = compare(post.to_reference(position, derived=True), name)
    divergent = diagnostics.divergences(trace)
    if post.expect_unbiased:
        assert report.passed, f"{report}\ndivergences: {divergent}"
    elif divergent == 0:  # never silently wrong: a run without divergences must be right
        assert report.passed, f"no divergences reported, yet:\n{report}"
    else:
        assert any("divergent" in w for w in diagnostics.check(trace))


@pytest.mark.parametrize("name", ["eight_schools-eight_schools_noncentered", "kidiq-kidscore_momiq"])
def test_numpyro_model_matches_reference(name, client2):
    post = REFERENCE_POSTERIORS[name]
    trace = _sample(post.numpyro_model, client2, post)
    samples = {k: np.asarray(v.values) for k, v in trace["posterior"].data_vars.items()}
    report = compare(post.numpyro_to_reference(samples), name)
    assert report.passed, str(report)

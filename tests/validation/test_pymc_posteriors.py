"""Three reference posteriors written in PyMC (``pymc_models.py``), sampled by ``dhmc.sample(model)`` with its
defaults, at two seeds, against the posteriordb reference draws by ``compare.py``'s rule (every parameter's mean
within max |z| < 4.5, sd within max(5%, 3/sqrt(ESS))). The centred eight schools as written must pass or say that
it did not (a convergence warning or its divergences), as its log density must in ``test_reference_posteriors.py``;
by its documented route, ``noncentered=True``, it must pass."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import dhmc
from dhmc import diagnostics
from tests.validation.compare import compare
from tests.validation.posteriors import REFERENCE_POSTERIORS

pytest.importorskip("pymc")

from tests.validation.pymc_models import PYMC_MODELS  # noqa: E402

pytestmark = pytest.mark.slow


CENTRED = "eight_schools-eight_schools_centered"


@pytest.mark.parametrize("seed", [20, 21])
@pytest.mark.parametrize("name", sorted(PYMC_MODELS))
def test_pymc_model_matches_reference(name, seed, client2):
    _check(name, seed, client2)


@pytest.mark.parametrize("seed", [20, 21])
def test_the_centred_eight_schools_by_its_route_matches_reference(seed, client2):
    """``noncentered=True``: ``theta`` reported as a deterministic of ``theta_decentered``, and correct."""
    trace = _check(CENTRED, seed, client2, noncentered=True, must_pass=True)
    assert {"mu", "tau", "theta", "theta_decentered"} <= set(trace["posterior"].data_vars)


def _check(name, seed, client2, must_pass=False, **options):
    import jax

    post = REFERENCE_POSTERIORS[name]
    x64 = jax.config.jax_enable_x64
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", dhmc.ConvergenceWarning)
            trace = dhmc.sample(PYMC_MODELS[name](), chains=128, draws=1000, seed=seed, dense_mass=post.dense_mass,
                                cluster=client2, progress=False, **options)
    finally:
        jax.config.update("jax_enable_x64", x64)  # a float64 PyMC model turns x64 on, as PyMC does
    warned = [str(w.message) for w in caught if issubclass(w.category, dhmc.ConvergenceWarning)]
    samples = {k: np.asarray(v.values) for k, v in trace["posterior"].data_vars.items()}
    report = compare(post.numpyro_to_reference(samples, derived=True), name)
    told = f"{report}\ndivergences: {diagnostics.divergences(trace)}; warnings: {warned}"
    print(f"{report.summary_line()}; divergences {diagnostics.divergences(trace)}; {len(warned)} warnings")
    if post.expect_unbiased or must_pass:
        assert report.passed, told
    elif not report.passed:  # never silently wrong
        assert warned, f"no warning, yet:\n{told}"
    return trace

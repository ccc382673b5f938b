"""Monte-Carlo-error-aware comparisons of draws with exact posterior moments."""

from __future__ import annotations


def within_mc_error(draws, exact_mean, exact_sd, z=4.5):
    """Assert mean and sd of ``draws`` (chain, draw) match exact values within Monte Carlo error (ArviZ ESS)."""
    import arviz as az
    import numpy as np

    draws = np.asarray(draws, float)
    ess = float(az.ess(draws, method="bulk"))
    mean, sd = draws.mean(), draws.std()
    mcse = sd / np.sqrt(ess)
    assert abs(mean - exact_mean) < z * mcse, (
        f"mean {mean:.5f} vs exact {exact_mean:.5f} (mcse {mcse:.2g}, ess {ess:.0f})")
    tol = max(0.05, 3 / np.sqrt(ess))
    assert abs(sd / exact_sd - 1) < tol, f"sd {sd:.5f} vs exact {exact_sd:.5f} (tolerance {tol:.2%})"

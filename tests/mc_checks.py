"""Monte-Carlo-error-aware comparisons of draws with exact posterior moments; AR(1) chains for the statistics' tests."""

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


def within_correlation_error(draws, exact_mean, exact_cov, z=4.5):
    """Assert the sample correlations of ``draws`` (chain, draw, d) match ``exact_cov``'s within Monte Carlo error.

    ``r - rho`` is, to first order, the mean of ``psi = zi zj - rho (zi^2 + zj^2) / 2`` (z standardised
    with the exact moments), whose sd is ``1 - rho^2`` for a Gaussian; the ESS of ``psi`` (not of the
    coordinates, which fixed-length HMC can make larger than the number of draws) sets the tolerance.
    """
    import itertools

    import arviz as az
    import numpy as np

    draws = np.asarray(draws, float)
    exact_mean, exact_cov = np.asarray(exact_mean, float), np.asarray(exact_cov, float)
    sd = np.sqrt(np.diag(exact_cov))
    rho = exact_cov / np.outer(sd, sd)
    r = np.corrcoef(draws.reshape(-1, draws.shape[-1]).T)
    zs = (draws - exact_mean) / sd
    for i, j in itertools.combinations(range(draws.shape[-1]), 2):
        psi = zs[..., i] * zs[..., j] - rho[i, j] * (zs[..., i] ** 2 + zs[..., j] ** 2) / 2
        ess = min(float(az.ess(psi, method="mean")), psi.size)
        tol = z * (1 - rho[i, j] ** 2) / np.sqrt(ess)
        assert abs(r[i, j] - rho[i, j]) < tol, (
            f"corr[{i},{j}] {r[i, j]:.4f} vs exact {rho[i, j]:.4f} (tolerance {tol:.3g}, ess {ess:.0f})")


def ar1(rng, rho, shape):
    """AR(1) chains along axis 1 with autocorrelation ``rho`` (a scalar, or one per trailing scalar)."""
    import numpy as np

    noise = rng.normal(size=shape)
    x = np.empty(shape)
    x[:, 0] = noise[:, 0]
    for t in range(1, shape[1]):
        x[:, t] = rho * x[:, t - 1] + noise[:, t]
    return x

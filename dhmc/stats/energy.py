"""The ensemble's energy Bayesian fraction of missing information (pure NumPy), and what a low one means."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["EBFMI_CHAINS", "EBFMI_MIN", "ebfmi", "ebfmi_warning"]

EBFMI_MIN = 0.3  # Stan's threshold: below it, the momentum's resampling changes the energy too little
EBFMI_CHAINS = 4096  # the chains E-BFMI reads (the first): enough for its estimate, bounded for a store of millions


def ebfmi(energy: np.ndarray) -> float:
    """The ensemble's energy Bayesian fraction of missing information (Betancourt 2016) of ``energy`` with shape
    ``(chains, draws)`` (an array, or an xarray DataArray sliced before it is read) over its first
    :data:`EBFMI_CHAINS` chains: the mean squared change of a chain's energy from one draw to the next over the
    energy's variance across those chains' draws (NaN with fewer than two draws).

    Each refresh of HMC's momentum moves the energy by about the kinetic energy's spread; where the energy's
    marginal is much wider (a funnel's neck, a heavy tail) the chains take many draws to cross it, and an
    ensemble that started outside it fills it slowly. The variance is the ensemble's, not each chain's: a short
    chain's own energy spans only its neighbourhood, which makes Stan's per-chain fraction read high for many
    short chains. A Gaussian gives about 1; the centred eight schools and the Brownian motion with unknown
    scales (whose sds come out 10-20% small) give 0.13-0.16 at 1024 chains.
    """
    e = np.asarray(energy[:EBFMI_CHAINS], np.float64)
    if e.ndim != 2 or e.shape[1] < 2:
        return math.nan
    var = float(e.var())
    return float(np.mean(np.square(np.diff(e, axis=1))) / var) if var > 0 else math.nan


def ebfmi_warning(fraction: float) -> str:
    """What an E-BFMI below :data:`EBFMI_MIN` means, in words (the run's warning and ``dhmc summary``'s)."""
    return (f"E-BFMI {fraction:.2f} is below {EBFMI_MIN}: the chains change their energy slowly, so a funnel's neck "
            "or a heavy tail may be under-explored and the sds too small; reparameterise (a hierarchy: "
            "noncentered=True, or laplace= where the data squeeze it too)")

"""``dhmc.stats.energy``: the ensemble's E-BFMI."""

from __future__ import annotations

import numpy as np
from mc_checks import ar1

from dhmc.stats import ebfmi


def test_ebfmi_of_an_ar1_energy_and_of_chains_that_each_keep_their_level():
    """An energy that is AR(1) with autocorrelation rho gives 2 (1 - rho); chains each near their own level give a
    low fraction (the ensemble's variance, not a chain's own), which Stan's per-chain fraction reads as high."""
    rng = np.random.default_rng(0)
    for rho in (0.0, 0.5, 0.9):
        energy = ar1(rng, rho, (256, 200)) * np.sqrt(1 - rho**2)
        assert abs(ebfmi(energy) - 2 * (1 - rho)) < 0.05 * 2 * (1 - rho) + 0.01, rho
    levels = rng.normal(0.0, 3.0, size=(512, 1)) + rng.normal(0.0, 0.3, size=(512, 10))
    assert ebfmi(levels) < 0.05
    per_chain = np.mean(np.diff(levels, axis=1) ** 2, axis=1) / levels.var(axis=1)
    assert per_chain.min() > 0.5
    assert np.isnan(ebfmi(levels[:, :1])) and np.isnan(ebfmi(np.ones((4, 5))))

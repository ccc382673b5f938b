"""The cold phase's pieces on the driver (``dhmc.distributed.cold_rounds``): its stray chains and where it applies.
The phase's rounds, driven through the policy, are in ``test_warmup.py``; its metric in ``test_cold_metric.py``."""

from __future__ import annotations

import numpy as np

from dhmc.distributed import cold_rounds


def test_stray_chains_are_reseated_onto_the_next_chain_that_is_not():
    """Two chains 400 nats below an ensemble whose log densities spread over an IQR of 2 (a Gaussian mixture's
    local mode): moved onto their next neighbours in chain order; a chain merely in the tail is left alone."""
    rng = np.random.default_rng(0)
    lp = -2105 + rng.normal(size=1024) * 1.5
    lp[[5, 1023]] = -2492.0
    lp[7] = -2113.0
    lp[6] = np.nan
    x = np.arange(1024.0)[:, None] * np.ones((1, 3))
    moved, n = cold_rounds.reseat_strays(x, cold_rounds.stray_chains(lp))
    assert n == 3
    np.testing.assert_array_equal(moved[[5, 6, 1023]], x[[7, 7, 0]])  # 6 is not finite: stray too
    np.testing.assert_array_equal(np.delete(moved, [5, 6, 1023], 0), np.delete(x, [5, 6, 1023], 0))
    same, none = cold_rounds.reseat_strays(x, cold_rounds.stray_chains(-2105 + rng.normal(size=1024) * 30))
    assert none == 0 and same is x


def test_one_dimension_or_a_handful_of_chains_has_no_cold_phase():
    """Isokinetic dynamics need a velocity on a sphere of two dimensions or more; the metric and step an ensemble."""
    assert not cold_rounds.cold_applies(1024, 1) and not cold_rounds.cold_applies(4, 10)
    assert cold_rounds.cold_applies(8, 2)

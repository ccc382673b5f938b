"""The cold phase's pieces on the driver (``dhmc.distributed.cold_rounds``): its metric choice, stray chains, and
where it applies. The phase's rounds, driven through the policy, are in ``test_warmup.py``."""

from __future__ import annotations

import math

import numpy as np

from dhmc.distributed import cold_rounds

DIM, CHAINS = 3, 512
SDS = np.array([0.1, 1.0, 10.0])


def _draws(seed: int, corr: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(CHAINS, DIM))
    z[:, 1] = corr * z[:, 0] + math.sqrt(1 - corr**2) * z[:, 1]
    return z * SDS


def test_wants_dense_needs_the_chains_to_estimate_it():
    x = _draws(0, 0.99)
    assert cold_rounds.wants_dense(x)
    assert not cold_rounds.wants_dense(x[: 2 * DIM - 1])  # fewer than 2 chains a dimension
    assert not cold_rounds.wants_dense(x[:, :1])  # one dimension


def test_wants_dense_looks_past_the_condition_noise_gives_a_few_chains_a_dimension():
    """1024 draws of 501 uncorrelated coordinates have a correlation matrix of condition ~30 from noise alone: no
    dense metric. An item-response-like ensemble, whose first coordinate is 20 times tighter given the others
    than alone (the mean ability, given the abilities), gets one."""
    rng = np.random.default_rng(3)
    free = rng.normal(size=(1024, 501))
    assert np.linalg.cond(np.corrcoef(free, rowvar=False)) > 10  # the old rule's threshold, passed by noise
    assert not cold_rounds.wants_dense(free)
    tied = free.copy()
    tied[:, 0] = -free[:, 1:].mean(axis=1) * math.sqrt(500) + 0.05 * free[:, 0]
    assert cold_rounds.wants_dense(tied)
    assert math.isclose(cold_rounds.noise_condition(1024, 3), 1.24, rel_tol=0.01)


def test_wants_dense_for_a_moderate_correlation_that_many_chains_resolve():
    """The Brownian motion written non-centred (32 dimensions, 1024 chains): its cold ensemble's correlation condition
    lies between 10 and 20.5 (10 times noise's 2.05, which refused it a dense metric), and the diagonal metric took
    5.5 times the gradients. Here a condition of 15."""
    rng = np.random.default_rng(4)
    free = rng.normal(size=(1024, 32))
    assert not cold_rounds.wants_dense(free)
    tied = free.copy()
    tied[:, 1] = 0.875 * free[:, 0] + math.sqrt(1 - 0.875**2) * free[:, 1]  # condition (1 + r) / (1 - r) = 15
    condition = np.linalg.cond(np.corrcoef(tied, rowvar=False))
    assert 10 < condition < 10 * cold_rounds.noise_condition(1024, 32), condition
    assert cold_rounds.wants_dense(tied)


def test_stray_chains_are_reseated_onto_the_next_chain_that_is_not():
    """Two chains 400 nats below an ensemble whose log densities spread over an IQR of 2 (a Gaussian mixture's
    local mode): moved onto their next neighbours in chain order; a chain merely in the tail is left alone."""
    rng = np.random.default_rng(0)
    lp = -2105 + rng.normal(size=1024) * 1.5
    lp[[5, 1023]] = -2492.0
    lp[7] = -2113.0
    lp[6] = np.nan
    x = np.arange(1024.0)[:, None] * np.ones((1, 3))
    moved, n = cold_rounds.reseat_strays(x, lp)
    assert n == 3
    np.testing.assert_array_equal(moved[[5, 6, 1023]], x[[7, 7, 0]])  # 6 is not finite: stray too
    np.testing.assert_array_equal(np.delete(moved, [5, 6, 1023], 0), np.delete(x, [5, 6, 1023], 0))
    same, none = cold_rounds.reseat_strays(x, -2105 + rng.normal(size=1024) * 30)
    assert none == 0 and same is x


def test_one_dimension_or_a_handful_of_chains_has_no_cold_phase():
    """Isokinetic dynamics need a velocity on a sphere of two dimensions or more; the metric and step an ensemble."""
    assert not cold_rounds.cold_applies(1024, 1) and not cold_rounds.cold_applies(4, 10)
    assert cold_rounds.cold_applies(8, 2)

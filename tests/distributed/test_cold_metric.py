"""The cold phase's metric (``dhmc.distributed.cold_metric``): whether a dense one pays, the dense and diagonal
metrics from positions and gradients, and the step size carried between them."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dhmc.core.adaptation import fisher
from dhmc.distributed import cold_metric

DIM, CHAINS = 3, 512
SDS = np.array([0.1, 1.0, 10.0])


def _draws(seed: int, corr: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(CHAINS, DIM))
    z[:, 1] = corr * z[:, 0] + math.sqrt(1 - corr**2) * z[:, 1]
    return z * SDS


def test_wants_dense_needs_the_chains_to_estimate_it():
    x = _draws(0, 0.99)
    assert cold_metric.wants_dense(x)
    assert not cold_metric.wants_dense(x[: 2 * DIM - 1])  # fewer than 2 chains a dimension
    assert not cold_metric.wants_dense(x[:, :1])  # one dimension


def test_wants_dense_looks_past_the_condition_noise_gives_a_few_chains_a_dimension():
    """1024 draws of 501 uncorrelated coordinates have a correlation matrix of condition ~30 from noise alone: no
    dense metric. An item-response-like ensemble, whose first coordinate is 20 times tighter given the others
    than alone (the mean ability, given the abilities), gets one."""
    rng = np.random.default_rng(3)
    free = rng.normal(size=(1024, 501))
    assert np.linalg.cond(np.corrcoef(free, rowvar=False)) > 10  # the old rule's threshold, passed by noise
    assert not cold_metric.wants_dense(free)
    tied = free.copy()
    tied[:, 0] = -free[:, 1:].mean(axis=1) * math.sqrt(500) + 0.05 * free[:, 0]
    assert cold_metric.wants_dense(tied)
    assert math.isclose(cold_metric.noise_condition(1024, 3), 1.24, rel_tol=0.01)


def test_wants_dense_for_a_moderate_correlation_that_many_chains_resolve():
    """The Brownian motion written non-centred (32 dimensions, 1024 chains): its cold ensemble's correlation condition
    lies between 10 and 20.5 (10 times noise's 2.05, which refused it a dense metric), and the diagonal metric took
    5.5 times the gradients. Here a condition of 15."""
    rng = np.random.default_rng(4)
    free = rng.normal(size=(1024, 32))
    assert not cold_metric.wants_dense(free)
    tied = free.copy()
    tied[:, 1] = 0.875 * free[:, 0] + math.sqrt(1 - 0.875**2) * free[:, 1]  # condition (1 + r) / (1 - r) = 15
    condition = np.linalg.cond(np.corrcoef(tied, rowvar=False))
    assert 10 < condition < 10 * cold_metric.noise_condition(1024, 32), condition
    assert cold_metric.wants_dense(tied)


def _precision(dim: int, seed: int) -> np.ndarray:
    """A rotated Gaussian's precision, its variances spread over four orders of magnitude."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.normal(size=(dim, dim)))
    return (q / np.logspace(-2, 2, dim)) @ q.T


def test_the_dense_metric_is_a_gaussians_covariance_whatever_the_ensemble():
    """Chains 100 times too wide, 10 times less so along one direction, and off-centre: the geometric mean of Cov x
    and Cov(g)^-1 is the posterior covariance to rounding, where the diagonal Fisher metric and Cov x are far off.
    (Its bound: a product of the ensemble's and the posterior's condition numbers near 1e8, whose square float64's
    ``Cov g`` cannot hold; a cold ensemble relaxes towards the posterior, which brings the product towards 1.)"""
    dim = 6
    precision, mu = _precision(dim, 0), np.arange(dim, dtype=float)
    rng = np.random.default_rng(1)
    x = mu + 3.0 + 100.0 * rng.normal(size=(64, dim)) * np.array([1.0, 1.0, 1.0, 1.0, 1.0, 0.1])
    g = -(x - mu) @ precision
    covariance = np.linalg.inv(precision)
    np.testing.assert_allclose(cold_metric.dense_metric(x, g), covariance, rtol=1e-6, atol=1e-9 * covariance.max())
    moments = fisher.cross_moments(x, g, xp=np)
    assert not np.allclose(cold_metric.diagonal_metric(moments), np.diag(covariance), rtol=0.5)
    assert not np.allclose(np.cov(x, rowvar=False), covariance, rtol=0.5)


def test_the_dense_metric_leaves_out_chains_that_are_not_finite_and_needs_more_chains_than_dimensions():
    dim = 4
    precision = _precision(dim, 2)
    x = np.random.default_rng(3).normal(size=(40, dim))
    g = -x @ precision
    g[5, 2], x[7, 0] = np.nan, np.inf
    np.testing.assert_allclose(cold_metric.dense_metric(x, g), np.linalg.inv(precision), rtol=1e-6)
    assert cold_metric.dense_metric(x[:dim], g[:dim]) is None


def test_a_carried_step_never_grows_in_any_direction():
    """Diagonal to diagonal: the least ratio of the coordinates' variances; into a dense metric: the least
    generalised eigenvalue, so a step along the new metric's narrowest direction is no longer than before."""
    assert cold_metric.carried_step(1.0, np.array([4.0, 1.0]), np.array([1.0, 4.0])) == math.sqrt(0.25)
    new = np.array([[2.0, 1.9], [1.9, 2.0]])  # variances 3.9 and 0.1 along the diagonals
    step = cold_metric.carried_step(1.0, np.ones(2), new)
    np.testing.assert_allclose(step, math.sqrt(1 / 3.9))
    assert cold_metric.carried_step(1.0, new, new) == pytest.approx(1.0)


def test_dense_estimates_count_evenly_spaced_chains_up_to_a_bound():
    assert cold_metric.estimate_rows(1000) == slice(0, 1000, 1)
    rows = range(3 * cold_metric.ESTIMATE_CHAINS + 5)[cold_metric.estimate_rows(3 * cold_metric.ESTIMATE_CHAINS + 5)]
    assert len(rows) <= cold_metric.ESTIMATE_CHAINS and rows.step == 4

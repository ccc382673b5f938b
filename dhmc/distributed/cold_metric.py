"""The cold phase's metric (pure NumPy): diagonal from the ensemble's positions and gradients, dense once the
ensemble is correlated enough for one to pay, and the step size carried from one metric into the next.

The diagonal metric is ``sqrt(Var x / Var g)`` (:func:`diagonal_metric`: exact for Gaussian coordinates whatever
the ensemble's spread, :mod:`dhmc.core.adaptation.fisher`); the dense one the geometric mean of ``Cov x`` and
``Cov(g)^-1`` (:func:`dense_metric`: exact for any Gaussian whatever the ensemble's spread and orientation), chosen
for ``dense_mass=None`` by :func:`wants_dense`. :mod:`dhmc.distributed.cold_rounds` runs the phase with them.
"""

from __future__ import annotations

import math

import numpy as np

from dhmc.core.adaptation import fisher

DENSE_CONDITION = 10.0  # dense_mass=None: a dense metric when the ensemble's correlation matrix has at least this
DENSE_NOISE_MARGIN = 3.0  # condition number, and this many times an uncorrelated ensemble's of as many chains
# (noise_condition) ...
DENSE_CHAINS_PER_DIM = 2  # ... and the ensemble has this many chains per dimension to estimate it
DENSE_MAX_DIM = 1000  # ... and the dimension is at most this (a dense step costs d^2)
ESTIMATE_CHAINS = 8192  # a dense metric, and whether one pays, from at most this many chains (evenly spaced)


def diagonal_metric(moments: fisher.CrossMoments) -> np.ndarray:
    """The cold phase's diagonal metric: ``sqrt(Var x / Var g)``, each coordinate clipped to ``1e-12 .. 1e12``
    (1 where the ensemble gives nothing finite)."""
    var = np.asarray(fisher.fisher_variance(moments, xp=np), np.float64)
    return np.where(np.isfinite(var) & (var > 0), np.clip(var, 1e-12, 1e12), 1.0)


def estimate_rows(chains: int) -> slice:
    """The chains a dense estimate counts: all, or every ``k``-th for at most :data:`ESTIMATE_CHAINS`."""
    k = -(-chains // ESTIMATE_CHAINS)
    return slice(0, chains, k)


def _power(a: np.ndarray, p: float) -> np.ndarray:
    """``a^p`` of a symmetric positive semi-definite matrix, its eigenvalues floored at ``1e-12`` of the largest."""
    w, v = np.linalg.eigh(a)
    floor = max(1e-12 * float(w[-1]), np.finfo(np.float64).tiny)
    return (v * np.maximum(w, floor) ** p) @ v.T


def dense_metric(positions: np.ndarray, gradients: np.ndarray) -> np.ndarray | None:
    """The dense counterpart of ``sqrt(Var x / Var g)``: the geometric mean ``A # B^-1 = A^1/2 (A^1/2 B A^1/2)^-1/2
    A^1/2`` of the ensemble's ``A = Cov x`` and ``B = Cov g`` (the metric ``M^-1`` with ``M^-1 B M^-1 = A``).

    For a Gaussian of precision ``P`` the gradients are ``-P (x - mu)``, so ``B = P A P`` over any ensemble and the
    mean is ``P^-1`` exactly, whatever the ensemble's spread and orientation (:func:`diagonal_metric` is exact only
    for uncorrelated coordinates; the ensemble's own covariance only once it has reached the posterior). Chains with a
    position or gradient that is not finite are left out; None when what is left gives no positive-definite
    metric (fewer chains than dimensions, a flat direction).
    """
    x, g = np.asarray(positions, np.float64), np.asarray(gradients, np.float64)
    finite = np.all(np.isfinite(x), axis=1) & np.all(np.isfinite(g), axis=1)
    x, g = x[finite], g[finite]
    if x.shape[0] <= x.shape[1]:
        return None
    a, b = np.cov(x, rowvar=False), np.cov(g, rowvar=False)
    # in the diagonal Fisher metric's units first: the powers below see the correlations, not the scales (the
    # matrix A^1/2 B A^1/2 has the square of the condition number of the metric in A's units)
    scale = np.sqrt(np.sqrt(np.diag(a) / np.diag(b)))
    if not np.all(np.isfinite(scale) & (scale > 0)):
        return None
    a, b = a / np.outer(scale, scale), b * np.outer(scale, scale)
    root = _power(a, 0.5)
    metric = root @ _power(root @ b @ root, -0.5) @ root
    metric = 0.5 * (metric + metric.T) * np.outer(scale, scale)
    try:
        np.linalg.cholesky(metric)
    except np.linalg.LinAlgError:
        return None
    return metric if np.all(np.isfinite(metric)) else None


def carried_step(step_size: float, old: np.ndarray, new: np.ndarray) -> float:
    """A whitened step size moved from metric ``old`` to ``new`` (each ``(d,)`` or ``(d, d)``) so that no direction's
    step grows: times the square root of the least eigenvalue of ``new^-1 old``."""
    if old.ndim == 1 and new.ndim == 1:
        return step_size * math.sqrt(float(np.min(old / new)))
    full = lambda m: np.diag(m) if m.ndim == 1 else m
    factor = np.linalg.cholesky(full(new))
    whitened = np.linalg.solve(factor, np.linalg.solve(factor, full(old)).T)
    return step_size * math.sqrt(max(float(np.linalg.eigvalsh(0.5 * (whitened + whitened.T))[0]), 0.0))


def noise_condition(chains: int, dim: int) -> float:
    """The condition number that noise alone gives the correlation matrix of ``chains`` independent draws of ``dim``
    uncorrelated coordinates: Marchenko-Pastur's ``((1 + sqrt(g)) / (1 - sqrt(g)))^2``, ``g = dim / chains`` (1.24
    for 3 coordinates of 1024 chains, 3.6 for 100, 34 for 501)."""
    g = math.sqrt(dim / chains)
    return ((1.0 + g) / (1.0 - g)) ** 2 if g < 1 else math.inf


def dense_can_pay(chains: int, dim: int) -> bool:
    """Whether :func:`wants_dense` may say yes for ``chains`` chains in ``dim`` dimensions: ``2 <= dim <=``
    :data:`DENSE_MAX_DIM` and :data:`DENSE_CHAINS_PER_DIM` counted chains (:func:`estimate_rows`) per dimension."""
    counted = len(range(chains)[estimate_rows(chains)])
    return 2 <= dim <= DENSE_MAX_DIM and counted >= DENSE_CHAINS_PER_DIM * dim


def wants_dense(positions: np.ndarray) -> bool:
    """Whether a dense metric pays for this ensemble: enough chains to estimate one (:data:`DENSE_CHAINS_PER_DIM`
    per dimension), a dimension of at most :data:`DENSE_MAX_DIM`, and a correlation matrix whose condition
    number is at least :data:`DENSE_CONDITION` and :data:`DENSE_NOISE_MARGIN` times what noise alone gives it
    (:func:`noise_condition`): what a diagonal metric leaves for the trajectories to cover, beyond what the
    estimate itself adds.

    An item-response model's mean ability is 20 times tighter given the abilities than alone (its sd 0.006 against
    0.11): with 1024 chains in 501 dimensions (2 a dimension) a dense metric took 891 sequential gradients a chain
    where the diagonal took 5,400. The Brownian motion written non-centred (32 dimensions) took 3,076 with a
    dense metric and 16,818 with the diagonal one that 10 times the noise condition chose (``benchmarks/README.md``).
    """
    if not dense_can_pay(*positions.shape):
        return False
    x = np.asarray(positions[estimate_rows(positions.shape[0])], np.float64)
    chains, dim = x.shape
    sd = x.std(axis=0)
    if not np.all(np.isfinite(sd) & (sd > 0)):
        return False
    eig = np.linalg.eigvalsh(np.corrcoef(x, rowvar=False))
    threshold = max(DENSE_CONDITION, DENSE_NOISE_MARGIN * noise_condition(chains, dim))
    return bool(eig[0] > 0 and eig[-1] / eig[0] >= threshold)


__all__ = ["DENSE_CHAINS_PER_DIM", "DENSE_CONDITION", "DENSE_MAX_DIM", "DENSE_NOISE_MARGIN", "ESTIMATE_CHAINS",
           "carried_step", "dense_can_pay", "dense_metric", "diagonal_metric", "estimate_rows", "noise_condition",
           "wants_dense"]

"""Warmup on the driver (pure NumPy): the rounds, merging the blocks of a round, and when ``warmup="auto"`` ends.

A round runs every chunk for the same iterations with the same parameters; each block adapts its
own step size (dual averaging) and trajectory length (ChEES per gradient) and collects the moments
of the round's second half. After the round the driver merges them in chain order and, unless the
run has converged, re-estimates the mass matrix from the moments and carries the trajectory length
into the new metric's units (:func:`carry_length`).

``warmup="auto"`` runs rounds of :data:`AUTO_ROUND` iterations until :func:`converged` holds for two
rounds in a row (one calm round after a moving one was not enough: 75 iterations left the non-centred
eight schools' log tau 3-5% too narrow at 1024 chains, three seeds out of three):

* stationary: every coordinate's mean and log-variance agree with the previous round's within what
  the ensemble's size allows (a two-sided test at 1% for the whole vector, Bonferroni);
* mixing: every coordinate's chains moved, over the round, by at least ``MIN_DISPLACEMENT`` of the
  squared distance between independent draws (``E (x_end - x_start)^2 >= 0.3 * 2 var``): an
  ensemble whose chains barely move is stationary too, and must not pass;
* adapted: the step size moved by less than 30% from the previous round and the trajectory
  length by less than 40% within the round.

Every decision depends only on the merged statistics, which depend only on the seed and the plan,
so the rounds (and the draws) are the same on any number of workers, and after a resume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dhmc.core.adaptation.welford import WelfordState, welford

AUTO_ROUND = 25  # iterations per round of warmup="auto"
MIN_ROUNDS = 3  # a metric from round 0, used in round 1, checked against round 2 (rounds 1 and 2 both passing)
DEFAULT_MAX_WARMUP = 1000
FIXED_FRACTIONS = (0.15, 0.15, 0.25, 0.35, 0.10)  # an integer warmup: the metric after all rounds but the last
MIN_DISPLACEMENT = 0.3
MAX_STEP_CHANGE = math.log(1.3)
MAX_LENGTH_CHANGE = math.log(1.4)
FALSE_ALARM = 0.01  # chance that a stationary, mixing ensemble fails the drift test in a round


def fixed_rounds(warmup: int) -> list[int]:
    """Iterations per round of an integer ``warmup``; short warmups get a single round."""
    if warmup < 100:
        return [warmup] if warmup > 0 else []
    sizes = [int(round(f * warmup)) for f in FIXED_FRACTIONS]
    sizes[-1] += warmup - sum(sizes)
    return sizes


def auto_rounds(max_warmup: int) -> list[int]:
    """The most rounds ``warmup="auto"`` may run: :data:`AUTO_ROUND` iterations each, ``max_warmup`` in all."""
    full, rest = divmod(max_warmup, AUTO_ROUND)
    return [AUTO_ROUND] * full + ([rest] if rest else [])


@dataclass(frozen=True)
class Round:
    """A round's merged statistics: the adapted parameters and the ensemble's moments (second half)."""

    step_size: float
    trajectory_length: float  # <= 0: fixed-step HMC's placeholder
    moments: WelfordState  # float64, of the round's second half, every chain
    acceptance_rate: float
    divergences: int
    grad_evals: int
    start_length: float  # the trajectory length the round started from


def merge(stats: list[dict], weights: np.ndarray, dense: bool, start_length: float) -> Round:
    """Merge the blocks' ``WarmupStats`` (as dicts) in chain order; ``weights``: chains per block."""
    mean = lambda xs: float(np.dot(weights, xs) / weights.sum())
    step = math.exp(mean([math.log(float(s["step_size"])) for s in stats]))
    lengths = [float(s["trajectory_length"]) for s in stats]
    # fixed-step HMC carries the placeholder -1 (its steps are fixed): keep it, do not average logs of it
    length = math.exp(mean(np.log(lengths))) if min(lengths) > 0 else start_length
    wf = welford(dense, xp=np)
    moments = None
    for s in stats:
        w = WelfordState(**{k: np.asarray(v, np.float64) for k, v in s["mass"].items()})
        moments = w if moments is None else wf.merge(moments, w)
    return Round(step, length, moments, mean([float(s["acceptance_rate"]) for s in stats]),
                 int(sum(int(s["divergences"]) for s in stats)), int(sum(int(s["grad_evals"]) for s in stats)),
                 start_length)


def variances(moments: WelfordState) -> np.ndarray:
    m2 = np.diagonal(moments.m2) if moments.m2.ndim == 2 else moments.m2
    return m2 / max(float(moments.count) - 1, 1.0)


def inverse_mass_matrix(moments: WelfordState, dense: bool) -> np.ndarray:
    """The regularised (co)variance of a round's moments: the next round's inverse mass matrix."""
    return welford(dense, xp=np).final(moments)


def largest_whitened_variance(positions: np.ndarray, inverse_mass: np.ndarray, iterations: int = 30,
                              max_chains: int = 4096) -> float:
    """Top eigenvalue of the ensemble's covariance in the metric's units (power iteration, first chains)."""
    x = np.asarray(positions[:max_chains], np.float64)
    x = x - x.mean(axis=0)
    inverse_mass = np.asarray(inverse_mass, np.float64)
    if inverse_mass.ndim == 1:
        y = x / np.sqrt(inverse_mass)
    else:
        y = np.linalg.solve(np.linalg.cholesky(inverse_mass), x.T).T
    v = np.ones(y.shape[1]) / math.sqrt(y.shape[1])
    value = 0.0
    for _ in range(iterations):
        w = y.T @ (y @ v) / len(y)
        value = float(np.linalg.norm(w))
        if not value > 0:
            return 0.0
        v = w / value
    return value


def carry_length(length: float, positions: np.ndarray, old: np.ndarray, new: np.ndarray) -> float:
    """The trajectory length in a new metric: scaled by how the ensemble's widest whitened direction scales.

    ChEES learns ``T`` relative to the widest direction (its optimum is about 4.5 of its sd on a
    Gaussian); a new metric rescales that direction, and ``T`` with it. Without this, a length
    learned under the identity metric (thousands on a target of sds 1 and 1000) was carried into a
    metric where 2 would do, and the criterion, flat there, never brought it back.
    """
    before, after = largest_whitened_variance(positions, old), largest_whitened_variance(positions, new)
    if not (length > 0 and before > 0 and after > 0):
        return length
    return length * math.sqrt(after / before)


@dataclass(frozen=True)
class Check:
    """Whether ``warmup="auto"`` may stop after a round, and the numbers behind it."""

    converged: bool
    drift_mean: float  # largest |z| of a coordinate's change in mean ...
    drift_variance: float  # ... and in log variance, from the previous round
    critical: float  # the |z| both must stay below
    displacement: float  # smallest (over coordinates) E (x_end - x_start)^2 / (2 var) over the round
    step_change: float  # |log| change of the step size from the previous round
    length_change: float  # |log| change of the trajectory length within the round

    def as_dict(self) -> dict:
        return {k: (v if isinstance(v, bool) else round(float(v), 4)) for k, v in self.__dict__.items()}


def describe(check: dict) -> str:
    """What a round's recorded check (:meth:`Check.as_dict`) measured, in words, for a warning."""
    return (f"drift |z| {check['drift_mean']:.3g} (mean) and {check['drift_variance']:.3g} (variance) of at most "
            f"{check['critical']:.3g}, displacement {check['displacement']:.3g} of at least {MIN_DISPLACEMENT}")


def critical_z(dim: int) -> float:
    """Two-sided normal quantile at :data:`FALSE_ALARM` shared by ``2 dim`` tests (Bonferroni)."""
    from statistics import NormalDist

    return NormalDist().inv_cdf(1.0 - FALSE_ALARM / (4.0 * dim))


def converged(current: Round, previous: Round | None, start: np.ndarray, end: np.ndarray, chains: int,
              adapt: bool = True) -> Check:
    """Apply the rule of this module's docstring to ``current`` after ``previous`` (None: the first round).

    ``start`` and ``end`` are every chain's positions before and after ``current``. The drift test
    counts one independent draw per chain and round, so it is conservative for chains that mix well
    and fails (warmup goes on) for chains that mix slowly. Without ``adapt`` only the ensemble is
    checked (a burn-in with fixed parameters).
    """
    dim = start.shape[1]
    critical = critical_z(dim)
    var = variances(current.moments)
    safe = np.where(var > 0, var, 1.0)
    displacement = float(np.min(np.mean((np.asarray(end, float) - start) ** 2, axis=0) / (2 * safe)))
    length_change = abs(math.log(current.trajectory_length / current.start_length)) \
        if adapt and current.trajectory_length > 0 and current.start_length > 0 else 0.0
    if previous is None:
        return Check(False, math.inf, math.inf, critical, displacement, math.inf, length_change)
    old = variances(previous.moments)
    with np.errstate(divide="ignore", invalid="ignore"):
        z_mean = np.abs(current.moments.mean - previous.moments.mean) / np.sqrt((var + old) / chains)
        z_var = np.abs(np.log(var / old)) / math.sqrt(4.0 / chains)
    drift_mean = float(np.nanmax(np.where(np.isfinite(z_mean), z_mean, np.inf)))
    drift_variance = float(np.nanmax(np.where(np.isfinite(z_var), z_var, np.inf)))
    step_change = abs(math.log(current.step_size / previous.step_size)) if adapt else 0.0
    ok = (drift_mean < critical and drift_variance < critical and displacement >= MIN_DISPLACEMENT
          and step_change < MAX_STEP_CHANGE and length_change < MAX_LENGTH_CHANGE)
    return Check(bool(ok), drift_mean, drift_variance, critical, displacement, step_change, length_change)


__all__ = ["AUTO_ROUND", "MIN_ROUNDS", "DEFAULT_MAX_WARMUP", "Round", "Check", "fixed_rounds", "auto_rounds",
           "merge", "inverse_mass_matrix", "carry_length", "converged", "describe"]

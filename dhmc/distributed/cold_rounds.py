"""The cold phase of ``warmup="auto"`` on the driver (pure NumPy): merging its rounds, its stray chains, when it
ends, and the metric the adjusted phase starts in.

Cold rounds (:mod:`dhmc.core.cold`) run unadjusted isokinetic steps, one gradient an iteration, whose step size
every block re-estimates after every gradient from its chains' energy errors against an equipartition bias budget.
Round 0 runs no step: it measures the start's positions and gradients. After each round the driver merges every
block's moments of positions and gradients in chain order and sets the next round's metric and step size
(:mod:`dhmc.distributed.cold_metric`: diagonal ``sqrt(Var x / Var g)`` until the ensemble is correlated enough for a
dense one to pay, for ``dense_mass=None``; ``dense_mass=True``: dense from the first step; the blocks' step size
carried into the new metric so that no direction's step grows). The phase ends at the second round in a row of
:data:`COLD_ROUND` gradients whose ensemble means and log variances agree with the previous round's and whose
chains' own changes average to 0 (:mod:`dhmc.distributed.stopping`), or after :data:`MAX_COLD` gradients, unless
the ensemble is then still far from the typical set and nearing it (:attr:`ColdPhase.approaching`: up to
:data:`MAX_COLD_FAR`). Between cold rounds, chains stuck far below the ensemble's log density (a local mode of
negligible mass) are reseated onto others (:func:`reseat_strays`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dhmc.core.adaptation import fisher
from dhmc.distributed import cold_metric as metrics
from dhmc.distributed.stopping import critical_z, moment_drift, paired_drift

COLD_ROUND = 20  # gradients per cold round (the drivers' synchronisation: see docs/design.md)
MAX_COLD = 400  # the cold phase's gradients at most; the adjusted phase converges what is left ...
MAX_COLD_FAR = 4000  # ... unless the ensemble is still far from equipartition and nearing it: then at most these
FAR_EQUIPARTITION = 1.0  # far: the coordinates' Cov(x, -g) off from its stationary 1 by 1 on average (or more) ...
FAR_LOOKBACK = 5  # ... and nearing: its equipartition below half what it was this many rounds before
COLD_MIN_CHAINS = 8  # fewer chains: no cold phase (no ensemble to estimate its metric and step size from)
COLD_START_STEP = 0.05  # the first cold step, times sqrt(d), in the start's gradient metric (LAPS: 0.01 sqrt(d))
STRAY_IQRS = 10.0  # a cold chain whose log density is this many IQRs (and STRAY_NATS) below the median is stray
STRAY_NATS = 10.0


@dataclass(frozen=True)
class ColdRound:
    """A cold round's merged statistics: the blocks' step size and the ensemble's end positions and gradients."""

    step_size: float  # the blocks' (geometric mean, by chains), whitened units
    moments: fisher.CrossMoments  # float64, of every chain's end position and gradient
    energy_variance: float  # the blocks' last Var(dE) / d (mean, by chains)
    nans: int
    grad_evals: int


def merge_cold(stats: list[dict], weights: np.ndarray) -> ColdRound:
    """Merge the cold blocks' ``ColdStats`` (as dicts) in chain order; ``weights``: chains per block."""
    mean = lambda xs: float(np.dot(weights, xs) / weights.sum())
    moments = None
    for s in stats:
        m = fisher.CrossMoments(**{k: np.asarray(v, np.float64) for k, v in s["moments"].items()})
        moments = m if moments is None else fisher.merge(moments, m, xp=np)
    steps = [float(s["step_size"]) for s in stats]
    step = math.exp(mean(np.log(steps))) if min(steps) > 0 else -1.0  # round 0 takes no step
    return ColdRound(step, moments,
                     mean([float(s["energy_variance"]) for s in stats]), int(sum(int(s["nans"]) for s in stats)),
                     int(sum(int(s["grad_evals"]) for s in stats)))


def drift(current: fisher.CrossMoments, previous: fisher.CrossMoments, chains: int) -> tuple[float, float]:
    """:func:`moment_drift` between two cold ensembles' positions."""
    return moment_drift(current.mean_x, fisher.variances(current, xp=np)[0], previous.mean_x,
                        fisher.variances(previous, xp=np)[0], chains)


def stray_chains(logdensity: np.ndarray) -> np.ndarray:
    """Which chains :func:`reseat_strays` moves: a log density that is not finite, or :data:`STRAY_IQRS`
    interquartile ranges plus :data:`STRAY_NATS` below the median (none when no chain's is finite)."""
    lp = np.asarray(logdensity, np.float64)
    finite = np.isfinite(lp)
    if not finite.any():
        return np.zeros(lp.shape, bool)
    q1, median, q3 = np.percentile(lp[finite], [25, 50, 75])
    return ~finite | (lp < median - STRAY_IQRS * (q3 - q1) - STRAY_NATS)


def reseat_strays(positions: np.ndarray, stray: np.ndarray) -> tuple[np.ndarray, int]:
    """The cold ensemble with its ``stray`` chains (:func:`stray_chains`) moved onto others; and how many moved.

    A chain is stray when its log density is more than :data:`STRAY_IQRS` interquartile ranges plus
    :data:`STRAY_NATS` below the ensemble's median, or not finite: far beyond the typical set's own spread (a
    Gaussian's log density in ``d`` dimensions spreads over an IQR of about ``sqrt(d)``; its one-in-a-million
    chain lies some 4 IQRs below the median), stuck in a local mode of negligible mass (two chains of a
    Gaussian mixture sat 387 nats below the rest, with the ensemble's IQR at 2 nats: they made its variance
    13 times the posterior's and held warmup for 5,000 gradients). Each stray chain takes the position of the
    next chain (in chain order, cyclically) that is not stray: a deterministic function of the merged ensemble,
    during the burn-in only, whose draws are never kept.
    """
    if not stray.any() or stray.all():
        return positions, 0
    keep = np.flatnonzero(~stray)
    take = keep[np.searchsorted(keep, np.flatnonzero(stray)) % len(keep)]
    out = np.array(positions, copy=True)
    out[stray] = out[take]
    return out, int(stray.sum())


def cold_applies(chains: int, dim: int) -> bool:
    """Whether a run may start with a cold phase: isokinetic dynamics need two dimensions, and its metric and
    step size an ensemble (:data:`COLD_MIN_CHAINS` chains)."""
    return dim >= 2 and chains >= COLD_MIN_CHAINS


class ColdPhase:
    """The cold phase's state across its rounds: :meth:`next` gives the next round's ``(first, iterations, params)``,
    :meth:`update` takes its merged block statistics; :attr:`done` once it has ended."""

    def __init__(self, chains: int, dim: int, dtype, dense: bool | None = None):
        self.chains, self.dim, self.dtype = chains, dim, np.dtype(dtype)
        self.choose = dense is None  # dense_mass=None: dense from the first round whose end wants it (then kept)
        self.dense = bool(dense)  # whether the metric is dense (dense_mass=True: from the first step)
        metric = np.eye(dim, dtype=self.dtype) if self.dense else np.ones(dim, self.dtype)
        self.params = {"step_size": np.asarray(-1.0, self.dtype), "inverse_mass_matrix": metric}
        self.grads, self.first, self.previous, self.passes, self.done = 0, 0, None, 0, False
        self.equipartition: list[float] = []  # every round's

    @property
    def needs_gradients(self) -> bool:
        """Whether the next round's blocks must return their chains' end gradients: a dense metric is estimated
        from them, so only while the metric is dense or may turn dense (``cold_metric.dense_can_pay``). A 2,429-D
        model's 4096 chains would otherwise ship 40 MB of gradients a round for nothing."""
        return self.dense or (self.choose and metrics.dense_can_pay(self.chains, self.dim))

    def next(self) -> tuple[int, int, dict]:
        """The next round's first iteration, iterations (0: round 0, which measures the start) and parameters."""
        return self.first, 0 if self.previous is None else COLD_ROUND, self.params

    def update(self, index: int, iterations: int, params: dict, stats: list[dict], weights: np.ndarray,
               start: np.ndarray, end: np.ndarray) -> tuple[dict, np.ndarray]:
        """Take a finished round (run with ``params``); return its record and the positions the next round starts
        from (``end``, its stray chains reseated)."""
        current = merge_cold(stats, weights)
        logdensity = np.concatenate([np.asarray(s["logdensity"]) for s in stats])
        if self.choose and not self.dense:
            self.dense = metrics.wants_dense(end)
        stray = stray_chains(logdensity)
        metric = self._metric(current.moments, end, stats, stray)
        end, reseated = reseat_strays(end, stray)
        self.grads += current.grad_evals // self.chains
        self.first += iterations
        old = np.asarray(params["inverse_mass_matrix"], np.float64)
        if iterations == 0 or not current.step_size > 0:  # the start (measured), or a step gone to 0
            eps = COLD_START_STEP * math.sqrt(self.dim)
        else:  # the blocks' step, carried so that no direction's step grows in the new metric
            eps = metrics.carried_step(current.step_size, old, metric)
        record = {"phase": "cold", "round": index, "iterations": iterations, "step_size": eps,
                  "dense": metric.ndim == 2,
                  "equipartition": float(fisher.equipartition(current.moments, xp=np)),
                  "energy_variance": current.energy_variance, "nans": current.nans, "reseated": reseated,
                  "grad_evals": current.grad_evals}
        passed = False
        if iterations and self.previous is not None and self.previous[1]:
            z_mean, z_var = drift(current.moments, self.previous[0], self.chains)
            paired = paired_drift(start, end)
            critical = critical_z(self.dim)
            passed = z_mean < critical and z_var < critical and paired < critical and not reseated
            record["check"] = {"drift_mean": round(z_mean, 4), "drift_variance": round(z_var, 4),
                               "paired_drift": round(paired, 4), "critical": round(critical, 4), "passed": passed}
        self.passes = self.passes + 1 if passed else 0
        self.previous = (current.moments, iterations)
        self.params = {"step_size": np.asarray(eps, self.dtype), "inverse_mass_matrix": metric.astype(self.dtype)}
        self.equipartition.append(record["equipartition"])
        self.done = self.passes >= 2 or self.grads >= MAX_COLD_FAR or (self.grads >= MAX_COLD and not self.approaching)
        return record, end

    @property
    def approaching(self) -> bool:
        """Whether the ensemble is still far from the typical set (its equipartition above :data:`FAR_EQUIPARTITION`)
        and nearing it (below half its value :data:`FAR_LOOKBACK` rounds before): the cold phase goes on past
        :data:`MAX_COLD`, one gradient an iteration, where the adjusted phase would crawl.

        A regression on an uncentred covariate (posteriordb's kilpisjarvi: slope and intercept correlated -0.99999,
        chains started up to 270 sds out, the noise scale at 5e4 times its posterior's) still read 4e14 at 400
        gradients, falling 40% a round; the adjusted phase took 108,000 gradients a chain from there (float64;
        float32 ran out of warmup and draws, wrong). Cold for 550 more (to 3.8, a dense metric chosen on the way),
        the whole run took 2,800 (float64) and 4,000 (float32), both right.
        """
        e = self.equipartition
        return len(e) > FAR_LOOKBACK and e[-1] > FAR_EQUIPARTITION and e[-1] < 0.5 * e[-1 - FAR_LOOKBACK]

    def _metric(self, moments: fisher.CrossMoments, end: np.ndarray, stats: list[dict],
                stray: np.ndarray) -> np.ndarray:
        """The next round's metric: ``cold_metric.dense_metric`` of the round's end (its ``stray`` chains left out)
        once :attr:`dense`, else (or where the ensemble gives no dense one) ``cold_metric.diagonal_metric``."""
        if self.dense:
            kept = np.flatnonzero(~stray)
            rows = kept[metrics.estimate_rows(len(kept))]
            gradients = np.concatenate([np.asarray(s["gradient"]) for s in stats])
            metric = metrics.dense_metric(end[rows], gradients[rows])
            if metric is not None:
                return metric
        return metrics.diagonal_metric(moments)


__all__ = ["COLD_ROUND", "FAR_EQUIPARTITION", "FAR_LOOKBACK", "MAX_COLD", "MAX_COLD_FAR", "ColdPhase", "ColdRound",
           "cold_applies", "drift", "merge_cold", "reseat_strays", "stray_chains"]

"""Warmup's policy on the driver (pure NumPy): which round runs next with which parameters, merging a round's
blocks, and when each phase ends. :class:`Policy` is the one object the runner asks; a unit test drives it
with made-up block results, no cluster.

With ``warmup="auto"`` (and adaptation) warmup has two phases.

**Cold** (:mod:`dhmc.core.cold`): unadjusted isokinetic steps, one gradient an iteration, whose step size
every block re-estimates after every gradient from its chains' energy errors against an equipartition
bias budget. Round 0 runs no step: it measures the start's positions and gradients. After each round the
driver merges every block's moments of positions and gradients in chain order and sets the next round's
diagonal metric to ``sqrt(Var x / Var g)`` (exact for Gaussian coordinates whatever the ensemble's spread:
:mod:`dhmc.core.adaptation.fisher`) and its step size to the blocks' (carried into the new metric so that
no coordinate's step grows). The phase ends at the second round in a row of :data:`COLD_ROUND` gradients
whose ensemble means and log variances agree with the previous round's (:func:`drift`) and whose chains'
own changes average to 0 (:func:`paired_drift`), or after :data:`MAX_COLD` gradients. Between cold rounds,
chains stuck far below the ensemble's log density (a local mode of negligible mass) are reseated onto others
(:func:`reseat_strays`). The (co)variance of its end positions and their widest direction start the adjusted
phase.

**Adjusted** (:mod:`dhmc.core.ensemble`'s warmup): a round runs every chunk for the same iterations with
the same parameters; each block adapts its own step size (dual averaging) and trajectory length (ChEES
per gradient) and collects the moments of the round's second half. After the round the driver merges
them in chain order and, unless the run has converged, re-estimates the mass matrix from the moments and
carries the trajectory length into the new metric's units (:func:`carry_length`).

``warmup="auto"`` runs adjusted rounds of :data:`AUTO_ROUND` iterations until :func:`converged` holds for
two rounds in a row (one calm round after a moving one was not enough: 75 iterations left the non-centred
eight schools' log tau 3-5% too narrow at 1024 chains, three seeds out of three):

* stationary: every coordinate's mean and log-variance agree with the previous round's within what
  the ensemble's size allows (a two-sided test at 1% for the whole vector, Bonferroni), and the chains'
  own changes over the round, of each coordinate and its square, average to 0 within their spread
  (:func:`paired_drift`: the test that sees a slow, one-way drift);
* mixing: every coordinate's chains moved, over the round, by at least ``MIN_DISPLACEMENT`` of the
  squared distance between independent draws (``E (x_end - x_start)^2 >= 0.3 * 2 var``): an
  ensemble whose chains barely move is stationary too, and must not pass;
* adapted: the step size moved by less than 30% per :data:`AUTO_ROUND` iterations from the previous round
  (17% for a round of 15) and the trajectory length by less than 40% within the round.

Drift and step size are tested against the round before the previous one too: a slow drift passes between neighbours
(a centred hierarchy's chains meet its funnel's neck one by one, its step size shrinking by a few percent a
round; an ensemble stopped there had log tau 3 sds off at 10 draws a chain).

An integer ``warmup`` has no cold phase: adjusted rounds of :func:`fixed_rounds`.

Every decision depends only on the merged statistics, which depend only on the seed and the plan,
so the rounds (and the draws) are the same on any number of workers, and after a resume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from dhmc.core.adaptation import fisher
from dhmc.core.adaptation.welford import WelfordState, welford

AUTO_ROUND = 25  # iterations per round of warmup="auto"
AUTO_ROUND_AFTER_COLD = 15  # ... after a cold phase, whose ensemble is near the typical set already
MIN_ROUNDS = 3  # a metric from round 0, used in round 1, checked against round 2 (rounds 1 and 2 both passing)
DEFAULT_MAX_WARMUP = 1000
FIXED_FRACTIONS = (0.15, 0.15, 0.25, 0.35, 0.10)  # an integer warmup: the metric after all rounds but the last
MIN_DISPLACEMENT = 0.3
MAX_STEP_CHANGE = math.log(1.3)
MAX_LENGTH_CHANGE = math.log(1.4)
FALSE_ALARM = 0.01  # chance that a stationary, mixing ensemble fails the moments' drift test in a round (the paired
# test and the test against the round before the previous add their own, each at the same level)
DRIFT_CHAINS = 1024  # the drift tests count at most this many chains: a drift below what 1024 chains resolve is
# far below the Monte Carlo error of any target_ess a run asks for, and more chains must not cost more rounds
COLD_ROUND = 20  # gradients per cold round (the drivers' synchronisation: see docs/design.md)
MAX_COLD = 400  # the cold phase's gradients at most; the adjusted phase converges what is left
COLD_MIN_CHAINS = 8  # fewer chains: no cold phase (no ensemble to estimate its metric and step size from)
COLD_START_STEP = 0.05  # the first cold step, times sqrt(d), in the start's gradient metric (LAPS: 0.01 sqrt(d))
STRAY_IQRS = 10.0  # a cold chain whose log density is this many IQRs (and STRAY_NATS) below the median is stray
STRAY_NATS = 10.0
START_LENGTH = 1.0  # the adjusted phase's first trajectory length, in sds of the ensemble's widest whitened direction
DENSE_CONDITION = 10.0  # dense_mass=None: a dense metric when the ensemble's correlation matrix is this ill-conditioned
DENSE_CHAINS_PER_DIM = 4  # ... and the ensemble has this many chains per dimension to estimate it
DENSE_MAX_DIM = 1000  # ... and the dimension is at most this (a dense step costs d^2)


def fixed_rounds(warmup: int) -> list[int]:
    """Iterations per round of an integer ``warmup``; short warmups get a single round."""
    if warmup < 100:
        return [warmup] if warmup > 0 else []
    sizes = [int(round(f * warmup)) for f in FIXED_FRACTIONS]
    sizes[-1] += warmup - sum(sizes)
    return sizes


def auto_rounds(max_warmup: int, size: int = AUTO_ROUND) -> list[int]:
    """The most adjusted rounds ``warmup="auto"`` may run: ``size`` iterations each, ``max_warmup`` in all."""
    full, rest = divmod(max_warmup, size)
    return [size] * full + ([rest] if rest else [])


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
    divergence_rate: float = 0.0  # divergent transitions per chain and iteration of the round (reported)
    paired_drift: float = 0.0  # largest |z| of the chains' mean change of x or (x - mean)^2 over the round

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


def _largest(z: np.ndarray) -> float:
    """The largest |z| over the coordinates, a z that is not finite counting as infinite."""
    return float(np.nanmax(np.where(np.isfinite(z), z, np.inf)))


def moment_drift(mean, var, old_mean, old_var, chains: int) -> tuple[float, float]:
    """Largest |z| over the coordinates of the change in mean and in log variance between two ensembles (one
    independent draw per chain each, at most :data:`DRIFT_CHAINS`: conservative for chains that move little in
    between)."""
    n = min(chains, DRIFT_CHAINS)
    with np.errstate(divide="ignore", invalid="ignore"):
        z_mean = np.abs(mean - old_mean) / np.sqrt((var + old_var) / n)
        z_var = np.abs(np.log(var / old_var)) / math.sqrt(4.0 / n)
    return _largest(z_mean), _largest(z_var)


def paired_drift(start: np.ndarray, end: np.ndarray) -> float:
    """Largest |z| over the coordinates of the chains' mean change, over a round, of ``x`` and of ``(x - m)^2``.

    Stationary chains change any function of their state by 0 on average, and the spread of the per-chain
    changes measures the noise, however strongly each chain's end depends on its start: chains that move
    little but all one way (a funnel's neck filling slowly, the step size shrinking round after round) give
    a large z where comparing the rounds' moments, which counts the chains as independent draws, sees none.
    """
    start, end = np.asarray(start, np.float64), np.asarray(end, np.float64)
    n = start.shape[0]
    centre = 0.5 * (start.mean(axis=0) + end.mean(axis=0))
    worst = 0.0
    for change in (end - start, (end - centre) ** 2 - (start - centre) ** 2):
        sd = change.std(axis=0, ddof=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.abs(change.mean(axis=0)) / (sd / math.sqrt(min(n, DRIFT_CHAINS)))
        z = np.where(sd > 0, z, 0.0)  # no chain moved that coordinate: the displacement test speaks
        worst = max(worst, _largest(z))
    return worst


def converged(current: Round, previous: Round | None, start: np.ndarray, end: np.ndarray, chains: int,
              adapt: bool = True, iterations: int = 0) -> Check:
    """Apply the rule of this module's docstring to ``current`` after ``previous`` (None: the first round).

    ``start`` and ``end`` are every chain's positions before and after ``current``. The drift test
    counts one independent draw per chain and round, so it is conservative for chains that mix well
    and fails (warmup goes on) for chains that mix slowly. Without ``adapt`` only the ensemble is
    checked (a burn-in with fixed parameters). ``iterations``: those since ``previous`` (0: :data:`AUTO_ROUND`),
    for the divergence rate, and the step size's change allowed (:data:`MAX_STEP_CHANGE` per :data:`AUTO_ROUND`
    iterations: a step size that keeps shrinking by a few percent a round has not settled).
    """
    dim = start.shape[1]
    divergence_rate = current.divergences / (chains * iterations) if iterations else 0.0
    critical = critical_z(dim)
    var = variances(current.moments)
    safe = np.where(var > 0, var, 1.0)
    displacement = float(np.min(np.mean((np.asarray(end, float) - start) ** 2, axis=0) / (2 * safe)))
    length_change = abs(math.log(current.trajectory_length / current.start_length)) \
        if adapt and current.trajectory_length > 0 and current.start_length > 0 else 0.0
    if previous is None:
        return Check(False, math.inf, math.inf, critical, displacement, math.inf, length_change, divergence_rate,
                     paired_drift(start, end))
    drift_mean, drift_variance = moment_drift(current.moments.mean, var, previous.moments.mean,
                                              variances(previous.moments), chains)
    step_change = abs(math.log(current.step_size / previous.step_size)) if adapt else 0.0
    max_step_change = MAX_STEP_CHANGE * (iterations or AUTO_ROUND) / AUTO_ROUND
    paired = paired_drift(start, end)
    ok = (drift_mean < critical and drift_variance < critical and displacement >= MIN_DISPLACEMENT
          and step_change < max_step_change and length_change < MAX_LENGTH_CHANGE and paired < critical)
    return Check(bool(ok), drift_mean, drift_variance, critical, displacement, step_change, length_change,
                 divergence_rate, paired)


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


def cold_metric(moments: fisher.CrossMoments) -> np.ndarray:
    """The cold phase's diagonal metric: ``sqrt(Var x / Var g)``, each coordinate clipped to ``1e-12 .. 1e12``
    (1 where the ensemble gives nothing finite)."""
    var = np.asarray(fisher.fisher_variance(moments, xp=np), np.float64)
    return np.where(np.isfinite(var) & (var > 0), np.clip(var, 1e-12, 1e12), 1.0)


def drift(current: fisher.CrossMoments, previous: fisher.CrossMoments, chains: int) -> tuple[float, float]:
    """:func:`moment_drift` between two cold ensembles' positions."""
    return moment_drift(current.mean_x, fisher.variances(current, xp=np)[0], previous.mean_x,
                        fisher.variances(previous, xp=np)[0], chains)


def reseat_strays(positions: np.ndarray, logdensity: np.ndarray) -> tuple[np.ndarray, int]:
    """The cold ensemble with its stray chains moved onto others; and how many moved.

    A chain is stray when its log density is more than :data:`STRAY_IQRS` interquartile ranges plus
    :data:`STRAY_NATS` below the ensemble's median, or not finite: far beyond the typical set's own spread (a
    Gaussian's log density in ``d`` dimensions spreads over an IQR of about ``sqrt(d)``; its one-in-a-million
    chain lies some 4 IQRs below the median), stuck in a local mode of negligible mass (two chains of a
    Gaussian mixture sat 387 nats below the rest, with the ensemble's IQR at 2 nats: they made its variance
    13 times the posterior's and held warmup for 5,000 gradients). Each stray chain takes the position of the
    next chain (in chain order, cyclically) that is not stray: a deterministic function of the merged ensemble,
    during the burn-in only, whose draws are never kept.
    """
    lp = np.asarray(logdensity, np.float64)
    finite = np.isfinite(lp)
    if not finite.any():
        return positions, 0
    q1, median, q3 = np.percentile(lp[finite], [25, 50, 75])
    stray = ~finite | (lp < median - STRAY_IQRS * (q3 - q1) - STRAY_NATS)
    if not stray.any() or stray.all():
        return positions, 0
    keep = np.flatnonzero(~stray)
    take = keep[np.searchsorted(keep, np.flatnonzero(stray)) % len(keep)]
    out = np.array(positions, copy=True)
    out[stray] = out[take]
    return out, int(stray.sum())


@dataclass(frozen=True)
class Step:
    """One round to run: every chunk runs ``iterations`` iterations of ``phase`` from ``first`` with ``params``."""

    phase: str  # "cold" or "warmup" (adjusted)
    index: int  # the round's number within warmup (both phases)
    first: int  # the phase's first iteration of the round (each phase counts its own)
    iterations: int
    params: dict  # the block programs' parameters (numpy, the model's dtype)
    adapt: bool = False
    collect_mass: bool = False


class Policy:
    """Warmup's policy: :meth:`next` gives the next round (None: warmup is over), :meth:`update` takes its merged
    block statistics and the ensemble's positions before and after it, and returns the round's record.

    Parameters
    ----------
    rounds
        Iterations per adjusted round (for ``auto``, the most rounds: :func:`auto_rounds`).
    params
        The starting parameters (:func:`dhmc.distributed.runner.initial_params`, or adapted ones).
    auto, adapt, dense, cold
        ``warmup="auto"``; adaptation; a dense metric (None: :func:`wants_dense` decides after the cold phase,
        read it back from :attr:`dense`); a cold phase first (``auto`` and ``adapt`` only, where
        :func:`cold_applies`).
    chains, dim, dtype
        The ensemble's size, the dimension and the positions' dtype.
    restore_length
        Fixed-step HMC: the trajectory length to sample with (warmup adapts ChEES trajectories).
    """

    def __init__(self, rounds: list[int], params: dict, *, auto: bool, adapt: bool, dense: bool, cold: bool,
                 chains: int, dim: int, dtype, restore_length=None):
        self.rounds, self.params, self.auto, self.adapt, self.dense = list(rounds), dict(params), auto, adapt, dense
        self.chains, self.dim, self.dtype = chains, dim, np.dtype(dtype)
        self.cold = cold and auto and adapt and cold_applies(chains, dim)
        if dense is None and not self.cold:  # dhmc chooses at the cold phase's end; without one, diagonal
            self.dense = False
        self.restore_length = restore_length
        self.cold_params = {"step_size": np.asarray(-1.0, self.dtype), "inverse_mass_matrix": np.ones(dim, self.dtype)}
        self.cold_grads, self.cold_first, self.cold_previous, self.cold_passes = 0, 0, None, 0
        self.round, self.first, self.previous, self.earlier, self.settled, self.done = 0, 0, None, None, False, False
        self.index = 0

    # -- what runs next ------------------------------------------------------------------------------------
    def next(self) -> Step | None:
        """The next round, or None when warmup is over (:attr:`params` then holds the adapted parameters)."""
        if self.cold:
            n = 0 if self.cold_previous is None else COLD_ROUND
            return Step("cold", self.index, self.cold_first, n, self.cold_params)
        if self.done or self.round >= len(self.rounds):
            return None
        r = self.round
        collect = self.auto or (self.adapt and r < len(self.rounds) - 1)
        return Step("warmup", self.index, self.first, self.rounds[r], self.params, adapt=self.adapt,
                    collect_mass=collect)

    def update(self, step: Step, stats: list[dict], weights: np.ndarray, start: np.ndarray,
               end: np.ndarray) -> tuple[dict, np.ndarray]:
        """Take a finished round: its blocks' statistics (chain order), ``weights`` (chains per block) and every
        chain's positions before and after it. Returns the round's record (JSON-able) for the run's history and
        the positions the next round starts from (``end``, with a cold round's stray chains reseated)."""
        self.index += 1
        if step.phase == "cold":
            return self._update_cold(step, stats, weights, start, end)
        return self._update_adjusted(step, stats, weights, start, end), end

    def final_params(self) -> dict:
        """The parameters sampling starts from."""
        if self.restore_length is not None:  # fixed-step HMC samples with the user's steps
            return dict(self.params, trajectory_length=self.restore_length)
        return self.params

    # -- the cold phase -------------------------------------------------------------------------------------
    def _update_cold(self, step: Step, stats: list[dict], weights: np.ndarray, start: np.ndarray,
                     end: np.ndarray) -> tuple[dict, np.ndarray]:
        current = merge_cold(stats, weights)
        end, reseated = reseat_strays(end, np.concatenate([np.asarray(s["logdensity"]) for s in stats]))
        self.cold_grads += current.grad_evals // self.chains
        self.cold_first += step.iterations
        metric = cold_metric(current.moments)
        old = np.asarray(step.params["inverse_mass_matrix"], np.float64)
        if step.iterations == 0 or not current.step_size > 0:  # the start (measured), or a step gone to 0
            eps = COLD_START_STEP * math.sqrt(self.dim)
        else:  # the blocks' step, carried so that no coordinate's step grows in the new metric
            eps = current.step_size * float(np.min(np.sqrt(old / metric)))
        record = {"phase": "cold", "round": step.index, "iterations": step.iterations, "step_size": eps,
                  "equipartition": float(fisher.equipartition(current.moments, xp=np)),
                  "energy_variance": current.energy_variance, "nans": current.nans, "reseated": reseated,
                  "grad_evals": current.grad_evals}
        passed = False
        if step.iterations and self.cold_previous is not None and self.cold_previous[1]:
            z_mean, z_var = drift(current.moments, self.cold_previous[0], self.chains)
            paired = paired_drift(start, end)
            critical = critical_z(self.dim)
            passed = z_mean < critical and z_var < critical and paired < critical and not reseated
            record["check"] = {"drift_mean": round(z_mean, 4), "drift_variance": round(z_var, 4),
                               "paired_drift": round(paired, 4), "critical": round(critical, 4), "passed": passed}
        self.cold_passes = self.cold_passes + 1 if passed else 0
        self.cold_previous = (current.moments, step.iterations)
        self.cold_params = {"step_size": np.asarray(eps, self.dtype), "inverse_mass_matrix": metric.astype(self.dtype)}
        if self.cold_passes >= 2 or self.cold_grads >= MAX_COLD:
            self.cold = False
            self._hand_over(end)
        return record, end

    def _hand_over(self, end: np.ndarray) -> None:
        """The adjusted phase starts in the (co)variance of the cold phase's end positions (dense when
        :func:`wants_dense` says so and the user left ``dense_mass`` to dhmc), its step size searched, its
        trajectory :data:`START_LENGTH` sds of the ensemble's widest whitened direction.

        Not the cold phase's own ``sqrt(Var x / Var g)``: once the ensemble has reached the typical set its
        spread is the posterior's, and for correlated coordinates the gradient's metric is narrower than their
        marginals (kidiq's adjusted phase started at a step of 0.27 in it, 0.9 in the positions' variance).
        """
        if self.dense is None:
            self.dense = wants_dense(end)
        end = np.asarray(end, np.float64)
        wf = welford(bool(self.dense), xp=np)
        inverse_mass = wf.final(wf.update(wf.init(self.dim, np.float64), end))
        widest = largest_whitened_variance(end, inverse_mass)
        length = START_LENGTH * math.sqrt(widest) if widest > 0 else -1.0
        self.params = dict(self.params, inverse_mass_matrix=np.asarray(inverse_mass, self.dtype),
                           step_size=np.asarray(-1.0, self.dtype), trajectory_length=np.asarray(length, self.dtype))

    # -- the adjusted phase ---------------------------------------------------------------------------------
    def _update_adjusted(self, step: Step, stats: list[dict], weights: np.ndarray, start: np.ndarray,
                         end: np.ndarray) -> dict:
        params, r = step.params, self.round
        current = merge(stats, weights, self.dense, float(params["trajectory_length"]))
        record = {"round": step.index, "iterations": step.iterations, "step_size": current.step_size,
                  "trajectory_length": current.trajectory_length, "acceptance_rate": current.acceptance_rate,
                  "divergences": current.divergences, "grad_evals": current.grad_evals}
        stop = False
        if self.auto:  # stops at the second round in a row that passes the rule
            check = converged(current, self.previous, start, end, self.chains, self.adapt, step.iterations)
            if check.converged and self.earlier is not None:  # and no slow drift since the round before
                longer = converged(current, self.earlier, start, end, self.chains, self.adapt,
                                   step.iterations + self.rounds[r - 1])
                check = replace(check, converged=longer.drift_mean < check.critical
                                and longer.drift_variance < check.critical
                                and longer.step_change < MAX_STEP_CHANGE * (step.iterations + self.rounds[r - 1])
                                / AUTO_ROUND,
                                drift_mean=max(check.drift_mean, longer.drift_mean),
                                drift_variance=max(check.drift_variance, longer.drift_variance))
            stop = check.converged and self.settled and r + 1 >= MIN_ROUNDS
            self.settled = check.converged
            record["check"] = check.as_dict() | {"converged": stop, "passed": check.converged}
        if self.adapt:
            params = dict(params, step_size=np.asarray(current.step_size, self.dtype),
                          trajectory_length=np.asarray(current.trajectory_length, self.dtype))
            if step.collect_mass and not stop:  # a converged round keeps the metric it ran with
                new = inverse_mass_matrix(current.moments, self.dense)
                length = carry_length(current.trajectory_length, end, params["inverse_mass_matrix"], new)
                params.update(inverse_mass_matrix=np.asarray(new, self.dtype),
                              trajectory_length=np.asarray(length, self.dtype))
        self.earlier, self.previous = self.previous, current
        self.params, self.first, self.round = params, self.first + step.iterations, r + 1
        self.done = stop
        return record


def cold_applies(chains: int, dim: int) -> bool:
    """Whether a run may start with a cold phase: isokinetic dynamics need two dimensions, and its metric and
    step size an ensemble (:data:`COLD_MIN_CHAINS` chains)."""
    return dim >= 2 and chains >= COLD_MIN_CHAINS


def wants_dense(positions: np.ndarray) -> bool:
    """Whether a dense metric pays for this ensemble: enough chains to estimate one (:data:`DENSE_CHAINS_PER_DIM`
    per dimension), a dimension of at most :data:`DENSE_MAX_DIM`, and a correlation matrix whose condition
    number is at least :data:`DENSE_CONDITION` (what a diagonal metric leaves for the trajectories to cover)."""
    chains, dim = positions.shape
    if dim < 2 or dim > DENSE_MAX_DIM or chains < DENSE_CHAINS_PER_DIM * dim:
        return False
    x = np.asarray(positions, np.float64)
    sd = x.std(axis=0)
    if not np.all(np.isfinite(sd) & (sd > 0)):
        return False
    eig = np.linalg.eigvalsh(np.corrcoef(x, rowvar=False))
    return bool(eig[0] > 0 and eig[-1] / eig[0] >= DENSE_CONDITION)


def adjusted_iterations(history: list[dict]) -> int:
    """The adjusted iterations a warmup history ran (sampling's iterations follow them; the cold phase has its own
    random stream)."""
    return sum(int(h["iterations"]) for h in history if h.get("phase") != "cold")


__all__ = ["AUTO_ROUND", "MIN_ROUNDS", "DEFAULT_MAX_WARMUP", "COLD_ROUND", "MAX_COLD", "Round", "ColdRound", "Check",
           "Step", "Policy", "fixed_rounds", "auto_rounds", "merge", "merge_cold", "cold_metric", "drift",
           "inverse_mass_matrix", "carry_length", "converged", "describe", "adjusted_iterations", "wants_dense",
           "paired_drift", "moment_drift", "reseat_strays", "cold_applies"]

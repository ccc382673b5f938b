"""Warmup's policy on the driver (pure NumPy): which round runs next with which parameters, merging a round's
blocks, and when each phase ends. :class:`Policy` is the one object the runner asks; a unit test drives it
with made-up block results, no cluster.

With ``warmup="auto"`` (and adaptation) warmup has two phases.

**Cold** (:mod:`dhmc.distributed.cold_rounds`): unadjusted isokinetic steps, one gradient an iteration, in
rounds of :data:`~dhmc.distributed.cold_rounds.COLD_ROUND` gradients, until the ensemble stops drifting. The
(co)variance of its end positions and their widest direction start the adjusted phase.

**Adjusted** (:mod:`dhmc.core.ensemble`'s warmup): a round runs every chunk for the same iterations with
the same parameters; each block adapts its own step size (dual averaging) and trajectory length (ChEES
per gradient) and collects the moments of the round's second half. After the round the driver merges
them in chain order and, unless the run has converged, re-estimates the mass matrix from the moments and
carries the trajectory length into the new metric's units (:func:`carry_length`). With ``warmup="auto"``, a
round whose ensemble has not moved (:attr:`~dhmc.distributed.stopping.Check.stationary`) pools its moments with
those of the rounds before it since the ensemble last moved, and keeps its trajectory length: a 501-D dense
metric re-estimated from one round's 8 draws of 1024 chains is noise at the level of its eigenvalues
(Marchenko-Pastur: 0.57 to 1.56 for an exact one), and the length carried through that noise changed by 40-90%
within every other round (item response: 10 adjusted rounds; 4 when pooled).

``warmup="auto"`` runs adjusted rounds of :data:`AUTO_ROUND` iterations (:data:`AUTO_ROUND_AFTER_COLD` after a
cold phase) until :func:`dhmc.distributed.stopping.converged` holds for two rounds in a row (one calm round after
a moving one was not enough: 75 iterations left the non-centred eight schools' log tau 3-5% too narrow at 1024
chains, three seeds out of three). Drift and step size are tested against the round before the previous one too:
a slow drift passes between neighbours (a centred hierarchy's chains meet its funnel's neck one by one, its step
size shrinking by a few percent a round; an ensemble stopped there had log tau 3 sds off at 10 draws a chain).

An integer ``warmup`` has no cold phase: adjusted rounds of :func:`fixed_rounds`.

Every decision depends only on the merged statistics, which depend only on the seed and the plan,
so the rounds (and the draws) are the same on any number of workers, and after a resume.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from dhmc.core.adaptation.welford import WelfordState, welford
from dhmc.distributed.cold_rounds import ColdPhase, cold_applies
from dhmc.distributed.stopping import converged, max_step_change

AUTO_ROUND = 25  # iterations per round of warmup="auto"
AUTO_ROUND_AFTER_COLD = 15  # ... after a cold phase, whose ensemble is near the typical set already
MIN_ROUNDS = 3  # a metric from round 0, used in round 1, checked against round 2 (rounds 1 and 2 both passing)
DEFAULT_MAX_WARMUP = 1000
FIXED_FRACTIONS = (0.15, 0.15, 0.25, 0.35, 0.10)  # an integer warmup: the metric after all rounds but the last
START_LENGTH = 1.0  # the adjusted phase's first trajectory length, in sds of the ensemble's widest whitened direction


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
class Step:
    """One round to run: every chunk runs ``iterations`` iterations of ``phase`` from ``first`` with ``params``."""

    phase: str  # "cold" or "warmup" (adjusted)
    index: int  # the round's number within warmup (both phases)
    first: int  # the phase's first iteration of the round (each phase counts its own)
    iterations: int
    params: dict  # the block programs' parameters (numpy, the model's dtype)
    adapt: bool = False
    collect_mass: bool = False
    gradients: bool = False  # cold: the blocks return their chains' end gradients (ColdPhase.needs_gradients)


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
        ``warmup="auto"``; adaptation; a dense metric (None: the cold phase decides,
        :func:`~dhmc.distributed.cold_metric.wants_dense`; read it back from :attr:`dense`); a cold phase first
        (``auto`` and ``adapt`` only, where :func:`cold_applies`).
    chains, dim, dtype
        The ensemble's size, the dimension and the positions' dtype.
    restore_length
        Fixed-step HMC: the trajectory length to sample with (warmup adapts ChEES trajectories).
    """

    def __init__(self, rounds: list[int], params: dict, *, auto: bool, adapt: bool, dense: bool, cold: bool,
                 chains: int, dim: int, dtype, restore_length=None):
        self.rounds, self.params, self.auto, self.adapt, self.dense = list(rounds), dict(params), auto, adapt, dense
        self.chains, self.dim, self.dtype = chains, dim, np.dtype(dtype)
        self.cold = ColdPhase(chains, dim, dtype, dense) if cold and auto and adapt and cold_applies(chains, dim) \
            else None
        if dense is None and self.cold is None:  # dhmc chooses in the cold phase; without one, diagonal
            self.dense = False
        self.restore_length = restore_length
        self.round, self.first, self.previous, self.earlier, self.settled, self.done = 0, 0, None, None, False, False
        self.pooled = None  # the moments of every round since the ensemble last moved: the next metric is theirs
        self.index = 0

    # -- what runs next ------------------------------------------------------------------------------------
    def next(self) -> Step | None:
        """The next round, or None when warmup is over (:attr:`params` then holds the adapted parameters)."""
        if self.cold is not None:
            return Step("cold", self.index, *self.cold.next(), gradients=self.cold.needs_gradients)
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
        record, end = self.cold.update(step.index, step.iterations, step.params, stats, weights, start, end)
        if self.cold.done:
            dense, self.cold = self.cold.dense, None
            self._hand_over(end, dense)
        return record, end

    def _hand_over(self, end: np.ndarray, dense: bool) -> None:
        """The adjusted phase starts in the (co)variance of the cold phase's end positions (dense where the cold
        phase's metric was: for a ``dense_mass`` left to dhmc, :func:`~dhmc.distributed.cold_metric.wants_dense`
        chose it), its step size searched, its trajectory :data:`START_LENGTH` sds of the ensemble's widest whitened
        direction.

        Not the cold phase's own ``sqrt(Var x / Var g)``: once the ensemble has reached the typical set its
        spread is the posterior's, and for correlated coordinates the gradient's metric is narrower than their
        marginals (kidiq's adjusted phase started at a step of 0.27 in it, 0.9 in the positions' variance).
        """
        if self.dense is None:
            self.dense = dense
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
        stop, stationary = False, False
        if self.auto:  # stops at the second round in a row that passes the rule
            check = converged(current, self.previous, start, end, self.chains, self.adapt, step.iterations)
            if check.converged and self.earlier is not None:  # and no slow drift since the round before
                longer = converged(current, self.earlier, start, end, self.chains, self.adapt,
                                   step.iterations + self.rounds[r - 1])
                check = replace(check, converged=longer.drift_mean < check.critical
                                and longer.drift_variance < check.critical
                                and longer.step_change < max_step_change(step.iterations + self.rounds[r - 1]),
                                drift_mean=max(check.drift_mean, longer.drift_mean),
                                drift_variance=max(check.drift_variance, longer.drift_variance))
            stop = check.converged and self.settled and r + 1 >= MIN_ROUNDS
            self.settled, stationary = check.converged, check.stationary
            record["check"] = check.as_dict() | {"converged": stop, "passed": check.converged}
        if self.adapt:
            params = dict(params, step_size=np.asarray(current.step_size, self.dtype),
                          trajectory_length=np.asarray(current.trajectory_length, self.dtype))
            moments = current.moments
            if stationary and self.pooled is not None:  # the same distribution as the rounds before: pool them
                moments = welford(bool(self.dense), xp=np).merge(self.pooled, moments)
            self.pooled = moments
            record["metric_draws"] = int(moments.count)
            if step.collect_mass and not stop:  # a converged round keeps the metric it ran with
                new = inverse_mass_matrix(moments, self.dense)
                # a stationary ensemble's new metric refines the old within its noise: the length learned stands
                length = current.trajectory_length if stationary else \
                    carry_length(current.trajectory_length, end, params["inverse_mass_matrix"], new)
                params.update(inverse_mass_matrix=np.asarray(new, self.dtype),
                              trajectory_length=np.asarray(length, self.dtype))
        self.earlier, self.previous = self.previous, current
        self.params, self.first, self.round = params, self.first + step.iterations, r + 1
        self.done = stop
        return record


def adjusted_iterations(history: list[dict]) -> int:
    """The adjusted iterations a warmup history ran (sampling's iterations follow them; the cold phase has its own
    random stream)."""
    return sum(int(h["iterations"]) for h in history if h.get("phase") != "cold")


__all__ = ["AUTO_ROUND", "AUTO_ROUND_AFTER_COLD", "MIN_ROUNDS", "DEFAULT_MAX_WARMUP", "Round", "Step", "Policy",
           "fixed_rounds", "auto_rounds", "merge", "inverse_mass_matrix", "carry_length", "adjusted_iterations"]

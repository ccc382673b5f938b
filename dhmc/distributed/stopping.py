"""When a warmup phase may end (pure NumPy): the tests that an ensemble has stopped drifting, mixes and has
settled its parameters.

An adjusted round passes :func:`converged` when it is

* stationary: every coordinate's mean and log-variance agree with the previous round's within what
  the ensemble's size allows (a two-sided test at 1% for the whole vector, Bonferroni), and the chains'
  own changes over the round, of each coordinate and its square, average to 0 within their spread
  (:func:`paired_drift`: the test that sees a slow, one-way drift);
* mixing: every coordinate's chains moved, over the round, by at least ``MIN_DISPLACEMENT`` of the
  squared distance between independent draws (``E (x_end - x_start)^2 >= 0.3 * 2 var``): an
  ensemble whose chains barely move is stationary too, and must not pass;
* adapted: the step size moved by less than 30% per :data:`STEP_CHANGE_ITERATIONS` iterations from the previous
  round (17% for a round of 15) and the trajectory length ended within 40% of where the round started or of
  where the previous round ended: a new metric rescales the length a round starts from
  (:func:`~dhmc.distributed.warmup.carry_length`) by an estimate that noise in a high-dimensional metric throws
  off, and ChEES back at its last length has settled as surely as ChEES that did not move.

The cold phase (:mod:`dhmc.distributed.cold_rounds`) uses the same drift tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

MIN_DISPLACEMENT = 0.3
MAX_STEP_CHANGE = math.log(1.3)  # per STEP_CHANGE_ITERATIONS iterations
STEP_CHANGE_ITERATIONS = 25
MAX_LENGTH_CHANGE = math.log(1.4)
FALSE_ALARM = 0.01  # chance that a stationary, mixing ensemble fails the moments' drift test in a round (the paired
# test and the test against the round before the previous add their own, each at the same level)
DRIFT_CHAINS = 1024  # the drift tests count at most this many chains: a drift below what 1024 chains resolve is
# far below the Monte Carlo error of any target_ess a run asks for, and more chains must not cost more rounds


def variances(moments) -> np.ndarray:
    """Per-coordinate sample variances of Welford moments (a dense state's diagonal)."""
    m2 = np.diagonal(moments.m2) if moments.m2.ndim == 2 else moments.m2
    return m2 / max(float(moments.count) - 1, 1.0)


@dataclass(frozen=True)
class Check:
    """Whether ``warmup="auto"`` may stop after a round, and the numbers behind it."""

    converged: bool
    drift_mean: float  # largest |z| of a coordinate's change in mean ...
    drift_variance: float  # ... and in log variance, from the previous round
    critical: float  # the |z| both must stay below
    displacement: float  # smallest (over coordinates) E (x_end - x_start)^2 / (2 var) over the round
    step_change: float  # |log| change of the step size from the previous round
    length_change: float  # |log| change of the trajectory length within the round, or from the previous round's end
    # if that is smaller
    divergence_rate: float = 0.0  # divergent transitions per chain and iteration of the round (reported)
    paired_drift: float = 0.0  # largest |z| of the chains' mean change of x or (x - mean)^2 over the round

    @property
    def stationary(self) -> bool:
        """The ensemble did not move: its moments match the round before's and its chains' paired changes average
        to 0 (mixing and adaptation not asked)."""
        return self.drift_mean < self.critical and self.drift_variance < self.critical \
            and self.paired_drift < self.critical

    def failures(self, iterations: int = 0) -> list[str]:
        """The tests of this module's docstring the round failed, by name, over ``iterations`` since the round
        compared with (0: :data:`STEP_CHANGE_ITERATIONS`)."""
        tests = (("drift", self.stationary), ("displacement", self.displacement >= MIN_DISPLACEMENT),
                 ("step size", self.step_change < max_step_change(iterations)),
                 ("trajectory length", self.length_change < MAX_LENGTH_CHANGE))
        return [name for name, ok in tests if not ok]

    def as_dict(self) -> dict:
        return {k: (v if isinstance(v, bool) else round(float(v), 4)) for k, v in self.__dict__.items()}


def max_step_change(iterations: int = 0) -> float:
    """The |log| change of the step size allowed over ``iterations`` (0: :data:`STEP_CHANGE_ITERATIONS`)."""
    return MAX_STEP_CHANGE * (iterations or STEP_CHANGE_ITERATIONS) / STEP_CHANGE_ITERATIONS


def describe(record: dict) -> str:
    """What a warmup round's record (its ``iterations`` and :meth:`Check.as_dict` as ``check``; a cold round's tests
    the drift only) measured, in words, each test against its limit, and which failed: for a warning that warmup
    did not converge."""
    recorded = record.get("check", {})
    unmeasured = {"drift_mean": math.inf, "drift_variance": math.inf, "paired_drift": math.inf, "critical": math.inf,
                  "displacement": 0.0, "step_change": math.inf, "length_change": 0.0, "divergence_rate": 0.0}
    c = Check(False, **{name: recorded.get(name, value) for name, value in unmeasured.items()})
    percent = lambda log_change: f"{100 * math.expm1(log_change):.0f}%" if math.isfinite(log_change) else "inf"
    iterations = record.get("iterations") or 0
    texts = [f"drift |z| {c.drift_mean:.3g} (mean), {c.drift_variance:.3g} (variance) and {c.paired_drift:.3g} "
             f"(paired) of at most {c.critical:.3g}",
             f"displacement {c.displacement:.3g} of at least {MIN_DISPLACEMENT}",
             f"step size change {percent(c.step_change)} of at most {percent(max_step_change(iterations))}",
             f"trajectory length change {percent(c.length_change)} of at most {percent(MAX_LENGTH_CHANGE)}"]
    failed = c.failures(iterations)
    if record.get("phase") == "cold":  # its rounds test the drift only
        texts, failed = texts[:1], [f for f in failed if f == "drift"]
    verdict = f"failed: {', '.join(failed)}" if failed else \
        ("passed, but warmup stops only at the second passing round in a row" if recorded.get("passed")
         else "failed: step size change over the last two rounds")
    return f"{'; '.join(texts)}; {verdict}"


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


def drift_chains(chains: int) -> slice:
    """The chains a paired test counts: the first :data:`DRIFT_CHAINS` (all of a smaller ensemble).

    The test's noise is then 1024 chains' at any size (the mean of all chains' changes against 1024 chains' error
    let a drift just above the critical z pass later the more chains there were), and a larger ensemble's test reads
    the chains a 1024-chain run has: the same starts and keys (chains are keyed by their global index), moved by
    parameters estimated from more chains. Every fourth of 4096 chains instead gave the test fresh noise, and with
    it fresh chances to fail where the 1024-chain run had passed: arK at seed 1 ran two more cold rounds at 4096
    chains (paired |z| 3.72 against a critical 3.38; the first 1024 read 1.91, the 1024-chain run 1.71)."""
    return slice(0, min(chains, DRIFT_CHAINS))


def paired_drift(start: np.ndarray, end: np.ndarray) -> float:
    """Largest |z| over the coordinates of the chains' mean change, over a round, of ``x`` and of ``(x - m)^2``.

    Stationary chains change any function of their state by 0 on average, and the spread of the per-chain
    changes measures the noise, however strongly each chain's end depends on its start: chains that move
    little but all one way (a funnel's neck filling slowly, the step size shrinking round after round) give
    a large z where comparing the rounds' moments, which counts the chains as independent draws, sees none.
    It counts the chains of :func:`drift_chains`.
    """
    counted = drift_chains(start.shape[0])
    start, end = np.asarray(start[counted], np.float64), np.asarray(end[counted], np.float64)
    n = start.shape[0]
    centre = 0.5 * (start.mean(axis=0) + end.mean(axis=0))
    worst = 0.0
    for change in (end - start, (end - centre) ** 2 - (start - centre) ** 2):
        sd = change.std(axis=0, ddof=1)
        with np.errstate(divide="ignore", invalid="ignore"):
            z = np.abs(change.mean(axis=0)) / (sd / math.sqrt(n))
        z = np.where(sd > 0, z, 0.0)  # no chain moved that coordinate: the displacement test speaks
        worst = max(worst, _largest(z))
    return worst


def converged(current, previous, start: np.ndarray, end: np.ndarray, chains: int,
              adapt: bool = True, iterations: int = 0) -> Check:
    """Apply the rule of this module's docstring to the round ``current`` after ``previous`` (None: the first
    round), both :class:`dhmc.distributed.warmup.Round`.

    ``start`` and ``end`` are every chain's positions before and after ``current``. The drift test
    counts one independent draw per chain and round, so it is conservative for chains that mix well
    and fails (warmup goes on) for chains that mix slowly. Without ``adapt`` only the ensemble is
    checked (a burn-in with fixed parameters). ``iterations``: those since ``previous`` (0:
    :data:`STEP_CHANGE_ITERATIONS`), for the divergence rate, and the step size's change allowed
    (:data:`MAX_STEP_CHANGE` per :data:`STEP_CHANGE_ITERATIONS` iterations: a step size that keeps shrinking by a
    few percent a round has not settled).
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
    if length_change and previous.trajectory_length > 0:
        length_change = min(length_change, abs(math.log(current.trajectory_length / previous.trajectory_length)))
    step_change = abs(math.log(current.step_size / previous.step_size)) if adapt else 0.0
    check = Check(False, drift_mean, drift_variance, critical, displacement, step_change, length_change,
                  divergence_rate, paired_drift(start, end))
    return replace(check, converged=not check.failures(iterations))


__all__ = ["Check", "converged", "critical_z", "describe", "drift_chains", "max_step_change", "moment_drift",
           "paired_drift", "variances"]

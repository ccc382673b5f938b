"""When a warmup phase may end (``dhmc.distributed.stopping``): the stop rule passes a mixing, stationary,
settled ensemble and only that; the paired test sees the slow drift the moments miss."""

from __future__ import annotations

import numpy as np

from dhmc.core.adaptation.welford import WelfordState, welford
from dhmc.distributed import stopping, warmup


def _round(samples: np.ndarray, step=0.5, length=2.0, start_length=2.0) -> warmup.Round:
    wf = welford(False, xp=np)
    moments = wf.update(wf.init(samples.shape[-1], np.float64), samples.reshape(-1, samples.shape[-1]))
    return warmup.Round(step, length, WelfordState(*moments), 0.8, 0, 0, start_length)


def test_the_stop_rule_passes_a_mixing_stationary_ensemble_and_only_that():
    rng = np.random.default_rng(0)
    chains, dim = 256, 5
    draws = lambda: rng.normal(size=(chains, 12, dim))
    start, end = rng.normal(size=(chains, dim)), rng.normal(size=(chains, dim))
    previous, current = _round(draws()), _round(draws())
    assert stopping.converged(current, previous, start, end, chains).converged
    # the same moments, but chains that did not move: stationary and stuck
    assert not stopping.converged(current, previous, start, start + 0.01, chains).converged
    # still drifting: the means moved by 1 sd
    assert not stopping.converged(_round(draws() + 1.0), previous, start, end, chains).converged
    # still contracting: the variance halved
    assert not stopping.converged(_round(draws() * 0.7), previous, start, end, chains).converged
    # adaptation not settled: the step size halved, or the trajectory grew 2x within the round
    assert not stopping.converged(_round(draws(), step=0.25), previous, start, end, chains).converged
    assert not stopping.converged(_round(draws(), length=4.0), previous, start, end, chains).converged
    assert not stopping.converged(current, None, start, end, chains).converged


def test_a_length_back_where_the_previous_round_left_it_has_settled():
    """A new metric rescaled the length a round started from (irt: 2.5 carried to 1.26, ChEES back at 3.19 by the
    round's end): settled if ChEES ended within 40% of the previous round's length, not if it is still growing."""
    rng = np.random.default_rng(0)
    chains, dim = 256, 5
    draws = lambda: rng.normal(size=(chains, 12, dim))
    start, end = rng.normal(size=(chains, dim)), rng.normal(size=(chains, dim))
    carried = lambda previous_length: stopping.converged(_round(draws(), length=2.2, start_length=1.0),
                                                         _round(draws(), length=previous_length), start, end, chains)
    settled = carried(2.0)
    assert settled.converged and settled.length_change < stopping.MAX_LENGTH_CHANGE
    assert not carried(1.0).converged  # 1.0 -> 2.2 within the round and from the round before: still growing


def test_stationary_asks_only_that_the_ensemble_did_not_move():
    """Chains that barely moved, or a step size still settling, are stationary (the metric's moments may pool);
    moved means, a shrunk variance or no round before are not."""
    rng = np.random.default_rng(0)
    chains, dim = 256, 5
    draws = lambda: rng.normal(size=(chains, 12, dim))
    start, end = rng.normal(size=(chains, dim)), rng.normal(size=(chains, dim))
    previous = _round(draws())
    still = start + 0.01 * rng.normal(size=start.shape)
    assert stopping.converged(_round(draws()), previous, start, still, chains).stationary
    assert stopping.converged(_round(draws(), step=0.25), previous, start, end, chains).stationary
    assert not stopping.converged(_round(draws() + 1.0), previous, start, end, chains).stationary
    assert not stopping.converged(_round(draws() * 0.7), previous, start, end, chains).stationary
    assert not stopping.converged(_round(draws()), None, start, end, chains).stationary


def test_paired_drift_sees_a_slow_one_way_drift_that_the_moments_do_not():
    rng = np.random.default_rng(1)
    start = rng.normal(size=(1024, 2))
    still = start + 0.05 * rng.normal(size=start.shape)
    assert stopping.paired_drift(start, still) < stopping.critical_z(2)
    assert stopping.paired_drift(start, still - 0.02) > stopping.critical_z(2)  # 2% of an sd, all one way




def test_a_paired_test_counts_the_first_1024_chains_of_a_larger_ensemble():
    """4096 chains are tested on their first 1024, those a 1024-chain run has: the same noise as 1024 chains, so a
    drift just above the critical z does not hold a larger ensemble's warmup longer (the ICG's cold phase ran 3 more
    rounds at 4096 chains), and no fresh chains to fail the test where the smaller run passed."""
    rng = np.random.default_rng(2)
    start = rng.normal(size=(4096, 3))
    end = start + 0.3 * rng.normal(size=start.shape) + 0.01
    end[1024:] += 1.0  # chains a 1024-chain run does not have are not read
    assert stopping.paired_drift(start, end) == stopping.paired_drift(start[:1024], end[:1024])
    counted = {n: len(range(n)[stopping.drift_chains(n)]) for n in (1000, 1500, 4096, 5000)}
    assert counted == {1000: 1000, 1500: 1024, 4096: 1024, 5000: 1024}


def test_a_warning_names_the_test_that_kept_warmup_going():
    """The eight schools' 10th round at seed 0 failed only on its step size (0.147 -> 0.179 in 15 iterations)."""
    check = {"drift_mean": 0.86, "drift_variance": 1.04, "paired_drift": 2.6, "critical": 3.48, "displacement": 0.9,
             "step_change": 0.197, "length_change": 0.03, "passed": False}
    text = stopping.describe({"iterations": 15, "check": check})
    assert "step size change 22% of at most 17%" in text and text.endswith("failed: step size")
    rng = np.random.default_rng(0)
    start, end = rng.normal(size=(64, 3)), rng.normal(size=(64, 3))
    first = stopping.describe({"iterations": 15, "check": stopping.converged(_round(rng.normal(size=(64, 8, 3))),
                                                                             None, start, end, 64).as_dict()})
    assert first.endswith("failed: drift, step size")  # no round before to compare with
    text = stopping.describe({"iterations": 15, "check": dict(check, step_change=0.1, passed=True)})
    assert text.endswith("passed, but warmup stops only at the second passing round in a row")
    assert stopping.describe({"iterations": 15, "check": dict(check, step_change=0.1)}).endswith(
        "failed: step size change over the last two rounds")
    cold = stopping.describe({"phase": "cold", "iterations": 20, "check": {"drift_mean": 4.4, "drift_variance": 3.5,
                                                                           "paired_drift": 4.4, "critical": 3.48}})
    assert cold.startswith("drift |z| 4.4 (mean)") and cold.endswith("of at most 3.48; failed: drift")

"""Warmup's policy (``dhmc.distributed.warmup.Policy``), driven without a cluster: made-up block statistics in,
the rounds and parameters it asks for out."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dhmc.core.adaptation import fisher
from dhmc.core.adaptation.welford import welford
from dhmc.distributed import cold_metric, cold_rounds, warmup

DIM, CHAINS = 3, 512
SDS = np.array([0.1, 1.0, 10.0])


def _policy(auto=True, dense=False, rounds=None, cold=True) -> warmup.Policy:
    params = {"step_size": np.asarray(-1.0, np.float32), "inverse_mass_matrix": np.ones(DIM, np.float32),
              "trajectory_length": np.asarray(-1.0, np.float32)}
    rounds = rounds or (warmup.auto_rounds(1000, warmup.AUTO_ROUND_AFTER_COLD) if auto else warmup.fixed_rounds(200))
    return warmup.Policy(rounds, params, auto=auto, adapt=True, dense=dense, cold=cold, chains=CHAINS, dim=DIM,
                         dtype=np.float32)


def _draws(seed: int, corr: float = 0.0, shift: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    z = rng.normal(size=(CHAINS, DIM))
    z[:, 1] = corr * z[:, 0] + math.sqrt(1 - corr**2) * z[:, 1]
    return (z + shift) * SDS


def _cold_stats(x: np.ndarray, step: float, corr: float = 0.0) -> list[dict]:
    """Two blocks' ColdStats of the Gaussian :func:`_draws` draws from (gradient ``-P x``, ``P`` its precision), as a
    worker returns them."""
    correlation = np.eye(DIM)
    correlation[0, 1] = correlation[1, 0] = corr
    precision = np.linalg.inv(SDS[:, None] * correlation * SDS)
    out = []
    for part in (x[: CHAINS // 2], x[CHAINS // 2:]):
        g = -part @ precision
        m = fisher.cross_moments(part, g, xp=np)
        lp = -0.5 * np.sum(part * (part @ precision), axis=1)
        out.append({"step_size": step, "moments": m._asdict(), "energy_variance": 0.01, "nans": 0,
                    "logdensity": lp, "grad_evals": len(part) * 21, "gradient": g})
    return out


def _moments(x: np.ndarray):
    wf = welford(False, xp=np)
    return wf.update(wf.init(DIM, np.float64), x)


def _adjusted_stats(x: np.ndarray, step: float, length: float) -> list[dict]:
    return [{"step_size": step, "trajectory_length": length, "mass": _moments(part)._asdict(), "acceptance_rate": 0.8,
             "divergences": 0, "grad_evals": len(part) * 100} for part in (x[: CHAINS // 2], x[CHAINS // 2:])]


def _run(policy: warmup.Policy, draws, cold_shift=lambda r: 0.0, corr: float = 0.0,
         cold_scale=lambda r: 1.0) -> list[warmup.Step]:
    """Drive ``policy`` to its end; the cold rounds' ensembles shifted by ``cold_shift(r)`` sds and widened
    ``cold_scale(r)`` times (the gradients stay the Gaussian's: a wider ensemble is far from equipartition)."""
    steps, positions, r = [], draws(0), 0
    while (step := policy.next()) is not None:
        steps.append(step)
        end = draws(r + 1) if step.phase == "warmup" else (draws(r + 1) + cold_shift(r) * SDS) * cold_scale(r)
        stats = (_cold_stats(end, 0.5, corr) if step.phase == "cold"
                 else _adjusted_stats(end, 0.3, float(step.params["trajectory_length"])))
        if step.phase == "cold" and not step.gradients:  # as a worker returns them
            stats = [{k: v for k, v in s.items() if k != "gradient"} for s in stats]
        policy.update(step, stats, np.array([CHAINS // 2, CHAINS // 2], float), positions, end)  # (record, start)
        positions, r = end, r + 1
        assert r < 200
    return steps


def test_a_stationary_ensemble_leaves_the_cold_phase_after_three_rounds_of_steps():
    """Round 0 measures the start (no step); rounds 1-3 step; rounds 2 and 3 agree with their previous ones:
    adjusted rounds follow, in the cold ensemble's metric, the step searched and the trajectory set from the
    ensemble's width."""
    policy = _policy()
    steps = _run(policy, _draws)
    phases = [s.phase for s in steps]
    assert phases[:4] == ["cold"] * 4 and phases[4] == "warmup"
    assert [s.iterations for s in steps[:4]] == [0] + [cold_rounds.COLD_ROUND] * 3
    assert steps[1].params["step_size"] == pytest.approx(cold_rounds.COLD_START_STEP * math.sqrt(DIM))
    np.testing.assert_allclose(steps[1].params["inverse_mass_matrix"], SDS**2, rtol=1e-5)  # exact: Gaussian
    first = steps[4].params
    assert float(first["step_size"]) < 0  # searched by the first adjusted block
    np.testing.assert_allclose(first["inverse_mass_matrix"], SDS**2, rtol=0.2)
    assert 0.5 < float(first["trajectory_length"]) < 2.0  # START_LENGTH sds of the widest whitened direction
    assert len(steps) - 4 >= warmup.MIN_ROUNDS and all(s.iterations == warmup.AUTO_ROUND_AFTER_COLD
                                                       for s in steps[4:])


def test_a_drifting_ensemble_stays_cold_until_the_cap():
    policy = _policy()
    steps = _run(policy, _draws, cold_shift=lambda r: 0.5 * r)  # the mean moves by half an sd a round
    cold = [s for s in steps if s.phase == "cold"]
    assert sum(s.iterations + 1 for s in cold) >= cold_rounds.MAX_COLD
    assert steps[len(cold)].phase == "warmup"


def test_an_ensemble_still_far_from_the_typical_set_and_nearing_it_stays_cold_past_the_cap():
    """Chains 100 times too wide at the start, 20% nearer a round: still far at :data:`MAX_COLD` (its equipartition
    about 25), so the cold phase goes on until the drift tests pass; a drifting ensemble far off that does not near it
    (10 times too wide, round after round) stops at the cap."""
    policy = _policy()
    steps = _run(policy, _draws, cold_scale=lambda r: 1.0 + 100.0 * 0.8**r)
    cold = sum(s.iterations + 1 for s in steps if s.phase == "cold")
    assert cold_rounds.MAX_COLD + cold_rounds.COLD_ROUND < cold < cold_rounds.MAX_COLD_FAR
    assert steps[-1].phase == "warmup"
    policy = _policy()
    steps = _run(policy, _draws, cold_shift=lambda r: 0.5 * r, cold_scale=lambda r: 10.0)
    cold = sum(s.iterations + 1 for s in steps if s.phase == "cold")
    assert cold_rounds.MAX_COLD <= cold < cold_rounds.MAX_COLD + 2 * cold_rounds.COLD_ROUND


def test_dense_mass_none_chooses_a_dense_metric_for_a_correlated_ensemble_only():
    """From the first cold round whose ensemble is correlated on: the cold rounds' metric, and the adjusted phase's."""
    for corr, dense in ((0.99, True), (0.0, False)):
        policy = _policy(dense=None)
        steps = _run(policy, lambda s, c=corr: _draws(s, c), corr=corr)
        assert policy.dense is dense
        cold = [s.params["inverse_mass_matrix"].shape for s in steps if s.phase == "cold"]
        assert cold[0] == (DIM,) and set(cold[1:]) == {(DIM, DIM) if dense else (DIM,)}
        metric = steps[-1].params["inverse_mass_matrix"]
        assert metric.shape == ((DIM, DIM) if dense else (DIM,))


def test_cold_blocks_return_their_gradients_only_where_a_dense_metric_may_use_them():
    """The end gradients are for a dense metric: asked for while ``dense_mass`` is True, or None with enough chains
    per dimension for a dense one to pay; never for ``dense_mass=False``, nor where the dimension is too large for
    the chains (``_run`` drops them as a worker does, so the dense runs above would fail without them)."""
    for dense, asked in ((True, True), (None, True), (False, False)):
        steps = _run(_policy(dense=dense), _draws)
        assert {s.gradients for s in steps if s.phase == "cold"} == {asked}
        assert not any(s.gradients for s in steps if s.phase == "warmup")
    few = cold_rounds.ColdPhase(chains=2 * DIM * 100 - 1, dim=DIM * 100, dtype=np.float32)
    assert not few.needs_gradients and cold_rounds.ColdPhase(2 * DIM * 100, DIM * 100, np.float32).needs_gradients
    assert not cold_rounds.ColdPhase(4096, cold_metric.DENSE_MAX_DIM + 1, np.float32).needs_gradients
    assert cold_rounds.ColdPhase(4096, cold_metric.DENSE_MAX_DIM + 1, np.float32, dense=True).needs_gradients


def test_the_users_dense_mass_holds_through_the_cold_phase():
    """``dense_mass=True``: dense from the first step, even for an uncorrelated ensemble; ``False``: never."""
    for corr, dense in ((0.0, True), (0.99, False)):
        steps = _run(_policy(dense=dense), lambda s, c=corr: _draws(s, c), corr=corr)
        shape = (DIM, DIM) if dense else (DIM,)
        assert {s.params["inverse_mass_matrix"].shape for s in steps} == {shape}


def test_an_integer_warmup_has_no_cold_phase_and_runs_its_rounds():
    policy = _policy(auto=False, dense=None)
    steps = _run(policy, _draws)
    assert [s.phase for s in steps] == ["warmup"] * len(warmup.fixed_rounds(200))
    assert [s.iterations for s in steps] == warmup.fixed_rounds(200)
    assert policy.dense is False


def test_adjusted_iterations_leave_the_cold_phase_out():
    history = [{"phase": "cold", "iterations": 20}, {"iterations": 15}, {"iterations": 15}]
    assert warmup.adjusted_iterations(history) == 30


def test_one_dimension_or_a_handful_of_chains_has_no_cold_phase():
    """Isokinetic dynamics need a velocity on a sphere of two dimensions or more; the metric and step an ensemble."""
    params = {"step_size": np.asarray(-1.0), "inverse_mass_matrix": np.ones(1), "trajectory_length": np.asarray(-1.0)}
    policy = warmup.Policy(warmup.auto_rounds(100), params, auto=True, adapt=True, dense=None, cold=True, chains=64,
                           dim=1, dtype=np.float32)
    assert policy.next().phase == "warmup" and policy.dense is False


def test_a_stationary_round_pools_its_moments_with_the_rounds_before_and_keeps_its_length():
    """Round 0 (nothing to compare with) and a round whose ensemble moved (shifted 5 sds) set the metric from their
    own draws and carry the length into it; a round that matches the one before pools their draws for the metric
    and keeps the length it adapted."""
    policy = _policy(cold=False)
    weights = np.array([CHAINS // 2, CHAINS // 2], float)
    own = lambda *xs: warmup.inverse_mass_matrix(_moments(np.concatenate(xs)), False)
    rounds = [_draws(1), _draws(2), _draws(3, shift=5.0)]
    start = _draws(0)
    expected = [own(rounds[0]), own(rounds[0], rounds[1]), own(rounds[2])]
    for x, metric, stationary in zip(rounds, expected, (False, True, False), strict=True):
        step = policy.next()
        record = policy.update(step, _adjusted_stats(x, 0.3, 2.5), weights, start, x)[0]
        np.testing.assert_allclose(policy.params["inverse_mass_matrix"], metric, rtol=1e-6)
        assert record["metric_draws"] == CHAINS * (2 if stationary else 1)
        assert (float(policy.params["trajectory_length"]) == 2.5) is stationary
        start = x

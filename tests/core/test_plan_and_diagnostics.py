"""The chunk plan (pure) and the diagnostics dhmc computes itself."""

from __future__ import annotations

import numpy as np
import pytest

from dhmc.diagnostics import nested_rhat
from dhmc.distributed.plan import Plan, default_chains_per_task, default_draws_per_segment
from dhmc.distributed.warmup import auto_rounds, fixed_rounds
from dhmc.distributed.worker import chain_moments
from dhmc.observe.convergence import RunningConvergence


@pytest.mark.parametrize("chains", [1, 7, 64, 256, 1000, 1024, 65536])
def test_chunks_cover_every_chain_once(chains):
    cpt = default_chains_per_task(chains)
    plan = Plan(chains, 100, 10, cpt, 50)
    covered = [i for c in range(plan.num_chunks) for i in plan.chunk(c)]
    assert covered == list(range(chains))


def test_segments_and_rounds_add_up():
    dps = default_draws_per_segment(1000, 128, 64)
    plan = Plan(256, 1000, 0, 128, dps)
    assert sum(len(plan.segment(s)) for s in range(plan.num_segments)) == 1000
    assert sum(fixed_rounds(1000)) == 1000 and len(fixed_rounds(1000)) == 5
    assert fixed_rounds(50) == [50] and fixed_rounds(0) == []
    assert sum(auto_rounds(1010)) == 1010 and auto_rounds(60) == [25, 25, 10]


def test_nested_rhat_detects_a_stuck_superchain():
    rng = np.random.default_rng(0)
    good = rng.normal(size=(64, 20))
    assert nested_rhat(good, 8) < 1.01
    bad = good.copy()
    bad[:8] += 3.0
    assert nested_rhat(bad, 8) > 1.1


def test_running_convergence_flags_disagreeing_chains():
    rng = np.random.default_rng(1)
    ok, stuck = RunningConvergence(32, 4, 8), RunningConvergence(32, 4, 8)
    for seg in range(4):
        for chunk in range(4):
            x = rng.normal(size=(8, 50, 2))
            ok.add(chunk, seg, chain_moments({"x": x}))
            stuck.add(chunk, seg, chain_moments({"x": x + (3.0 if chunk == 0 else 0.0)}))
    assert ok.report()["x[0]"]["rhat"] < 1.02
    assert stuck.report()["x[0]"]["rhat"] > 1.1
    assert 0 < ok.report()["x[1]"]["ess_bulk"] <= 32 * 200

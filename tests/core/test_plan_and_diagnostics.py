"""The run geometry (pure) and the diagnostics dhmc computes itself."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from dhmc.distributed.monitor import ConvergenceMonitor
from dhmc.distributed.warmup import auto_rounds, fixed_rounds
from dhmc.geometry import Geometry, default_chains_per_task, default_draws_per_segment


@pytest.mark.parametrize("chains", [1, 7, 64, 256, 1000, 1024, 65536])
def test_chunks_cover_every_chain_once(chains):
    cpt = default_chains_per_task(chains)
    plan = Geometry(chains, 100, cpt, 50)
    covered = [i for c in range(plan.num_chunks) for i in plan.chunk(c)]
    assert covered == list(range(chains))


def test_segments_and_rounds_add_up():
    dps = default_draws_per_segment(1000, 128, 64)
    plan = Geometry(256, 1000, 128, dps)
    assert sum(len(plan.segment(s)) for s in range(plan.num_segments)) == 1000
    assert sum(fixed_rounds(1000)) == 1000 and len(fixed_rounds(1000)) == 5
    assert fixed_rounds(50) == [50] and fixed_rounds(0) == []
    assert sum(auto_rounds(1010)) == 1010 and auto_rounds(60) == [25, 25, 10]


def test_the_monitor_measures_every_scalar_and_flags_disagreeing_chains():
    """One monitor per run: per-scalar split and nested R-hat and ESS, the extremes, and the auto rule's verdict."""
    rng = np.random.default_rng(1)
    spec = SimpleNamespace(chains=32, target_ess=None, geometry=Geometry(32, 200, 8, 50))
    ok, stuck = ConvergenceMonitor(spec, sink=None), ConvergenceMonitor(spec, sink=None)
    for seg in range(4):
        for chunk in range(4):
            x = rng.normal(size=(8, 50, 2, 2))
            ok.add(chunk, seg, SimpleNamespace(head_draws={"x": x, "s": x[..., 0, 0]}))
            shifted = x + (3.0 if chunk == 0 else 0.0)
            stuck.add(chunk, seg, SimpleNamespace(head_draws={"x": shifted, "s": x[..., 0, 0]}))
    good, bad = ok.measure(4), stuck.measure(4)
    assert list(good["params"]) == ["x[0,0]", "x[0,1]", "x[1,0]", "x[1,1]", "s"]
    assert good["max_split_rhat"] < 1.02 and good["max_nested_rhat"] < 1.02 and good["draws"] == 200
    assert 0.5 * 32 * 200 < good["params"]["x[1,1]"]["ess_bulk"] < 1.5 * 32 * 200  # independent draws
    assert good["min_ess"] == min(min(p["ess_bulk"], p["ess_tail"], p["ess_sd"]) for p in good["params"].values())
    assert bad["params"]["x[0,1]"]["nested_rhat"] > 1.1 and bad["params"]["s"]["nested_rhat"] < 1.05
    assert bad["worst"].startswith("x[") and bad["max_nested_rhat"] > 1.1
    assert ok.final() == {"max_rhat": good["max_split_rhat"],
                          **{k: good[k] for k in ("max_nested_rhat", "worst", "chains", "draws", "min_ess")}}
    stuck_apart = ConvergenceMonitor(spec, sink=None)  # every chain constant, at its own value: split R-hat inf
    stuck_apart.heads = {key: {"x": np.broadcast_to(np.arange(8.0)[:, None, None, None] + 8 * key[0], (8, 50, 2, 2)),
                               "s": np.zeros((8, 50))} for key in ok.heads}
    apart = stuck_apart.measure(4)
    assert apart["max_split_rhat"] == np.inf and apart["worst"] == "x[0,0]" and apart["params"]["s"]["rhat"] is None
    assert apart["max_nested_rhat"] > 1.1
    auto = ConvergenceMonitor(SimpleNamespace(**{**vars(spec), "target_ess": 1000.0}), sink=None)
    auto.heads = ok.heads
    verdict = auto.measure(4)
    assert verdict["converged"] and verdict["remaining"] == 0 and verdict["max_rhat"] == verdict["max_nested_rhat"]


def test_the_auto_rule_waits_for_a_heavy_tails_sd():
    """Independent Student-t draws (3 degrees of freedom: a few far draws carry the variance) meet a bulk and tail
    ESS target that their sd's ESS does not: the run goes on; a normal's meets all three."""
    rng = np.random.default_rng(2)
    spec = SimpleNamespace(chains=32, target_ess=2000.0, geometry=Geometry(32, 400, 8, 50))  # 200 of 400 draws
    heavy, normal = ConvergenceMonitor(spec, sink=None), ConvergenceMonitor(spec, sink=None)
    for seg in range(4):
        for chunk in range(4):
            heavy.add(chunk, seg, SimpleNamespace(head_draws={"t": rng.standard_t(3.0, size=(8, 50))}))
            normal.add(chunk, seg, SimpleNamespace(head_draws={"t": rng.normal(size=(8, 50))}))
    t, z = heavy.measure(4), normal.measure(4)
    assert min(t["params"]["t"]["ess_bulk"], t["params"]["t"]["ess_tail"]) > 2000 > t["params"]["t"]["ess_sd"]
    assert t["min_ess"] == t["params"]["t"]["ess_sd"] and not t["converged"] and t["remaining"] > 0
    assert z["converged"] and 0.5 * 6400 < z["params"]["t"]["ess_sd"] < 1.5 * 6400


def test_the_auto_rule_counts_at_most_1024_chains_worth_of_the_sds_ess():
    """The monitor reads up to 4096 chains: all of a 4096-chain run, 4096 of 16384. The bulk and tail ESS scale to
    the ensemble; the sd's counts at most 1024 chains' worth (a tail handed over thin is biased for as many draws
    per chain at any number of chains): the ESS of the chains read times 1024 / 4096, the same from the same draws
    read as a 4096-chain run's, and short of a target that the 4096 chains' own sd ESS meets."""
    from dhmc.stats import ess_sd

    rng = np.random.default_rng(7)
    large = ConvergenceMonitor(SimpleNamespace(chains=16384, target_ess=8000.0,
                                               geometry=Geometry(16384, 40, 256, 10)), sink=None)
    small = ConvergenceMonitor(SimpleNamespace(chains=4096, target_ess=8000.0, geometry=Geometry(4096, 40, 64, 10)),
                               sink=None)
    assert large.chains_at(1) == small.chains_at(1) == 64  # per chunk: 4096 chains read either way
    assert ConvergenceMonitor(SimpleNamespace(chains=4096, target_ess=400.0, geometry=Geometry(4096, 40, 256, 10)),
                              sink=None).chains_at(1) == 256  # a 4096-chain run's every chain
    t = rng.standard_t(5.0, size=(4096, 10))
    for chunk in range(64):
        draws = {"t": t[64 * chunk:64 * chunk + 64]}
        large.add(chunk, 0, SimpleNamespace(head_draws=draws))
        small.add(chunk, 0, SimpleNamespace(head_draws=draws))
    big, read = large.measure(1), small.measure(1)
    sd_ess = big["params"]["t"]["ess_sd"]
    assert sd_ess == read["params"]["t"]["ess_sd"] == pytest.approx(float(ess_sd(t[:, :, None])[0]) / 4)
    assert sd_ess < 8000 < 4 * sd_ess
    assert big["params"]["t"]["ess_bulk"] == 4 * read["params"]["t"]["ess_bulk"] > 8000
    assert not big["converged"] and not read["converged"] and big["min_ess"] == sd_ess


def test_start_memory_reads_1024_of_the_chains_read():
    """Chains that remember their start a little (first and last draws correlated 0.08): 1024 chains cannot tell
    (z about 2.6, here 2.0, below the critical 2.8), 4096 can (5.3), and a 4096-chain run is not held back by what a
    1024-chain run would pass: its start memory is that of 1024 of its chains, spread over its chunks."""
    rng = np.random.default_rng(3)
    r = 0.08
    first = rng.normal(size=(4096, 1))
    last = r * first + np.sqrt(1 - r * r) * rng.normal(size=(4096, 1))
    x = np.concatenate([first, rng.normal(size=(4096, 8)), last], axis=1)
    from dhmc.distributed.monitor import start_memory

    assert start_memory(x[:, :, None]) > 4.0  # all 4096 would hold it back
    spec = SimpleNamespace(chains=4096, target_ess=400.0, geometry=Geometry(4096, 40, 256, 10))
    monitor = ConvergenceMonitor(spec, sink=None)
    for chunk in range(16):
        monitor.add(chunk, 0, SimpleNamespace(head_draws={"x": x[256 * chunk:256 * chunk + 256]}))
    record = monitor.measure(1)
    assert record["chains"] == 4096 and record["start_memory"] == start_memory(x[::4, :, None])
    assert record["start_memory"] < record["memory_critical"] and record["converged"]


def test_start_memory_is_noise_for_chains_that_forgot_their_start():
    """Independent draws (normal, and Student-t with 3 degrees of freedom, whose squares have no variance: their
    correlation read z = 15 by chance, where the distances' stays near normal): the largest z over 8 scalars stays
    below the Bonferroni critical z in 95% or more of 200 ensembles of 1024 chains (98.5% at seed 5)."""
    from dhmc.distributed.monitor import start_memory
    from dhmc.distributed.stopping import critical_z

    rng = np.random.default_rng(5)
    draws = lambda: np.concatenate([rng.normal(size=(1024, 10, 4)), rng.standard_t(3.0, size=(1024, 10, 4))], axis=2)
    z = np.array([start_memory(draws()) for _ in range(200)])
    assert np.mean(z >= critical_z(8)) <= 0.05 and start_memory(draws()[:, :1]) == 0.0


def test_the_auto_rule_waits_until_the_chains_forget_their_start():
    """Chains that keep their distance from the centre over the run (a scale mixture: each chain's scale fixed,
    its sign and size redrawn each draw, so every ESS across chains is met) do not converge; the same draws
    with each chain's scale redrawn each draw do."""
    rng = np.random.default_rng(6)
    spec = SimpleNamespace(chains=1024, target_ess=400.0, geometry=Geometry(1024, 40, 64, 10))
    kept, redrawn = ConvergenceMonitor(spec, sink=None), ConvergenceMonitor(spec, sink=None)
    scale = np.exp(0.5 * rng.normal(size=(1024, 1)))
    for seg in range(2):
        for chunk in range(64):
            z = rng.normal(size=(16, 10))
            kept.add(chunk, seg, SimpleNamespace(head_draws={"x": scale[16 * chunk:16 * chunk + 16] * z}))
            redrawn.add(chunk, seg, SimpleNamespace(head_draws={"x": np.exp(0.5 * rng.normal(size=(16, 10))) * z}))
    stuck, mixed = kept.measure(2), redrawn.measure(2)
    assert stuck["min_ess"] > 400 and stuck["start_memory"] > stuck["memory_critical"] and not stuck["converged"]
    assert stuck["remaining"] == 4  # the ESS is met: at least until the next check (20% more draws)
    assert mixed["converged"] and mixed["start_memory"] < mixed["memory_critical"]


def test_the_monitor_keeps_its_head_chains_within_its_memory_budget():
    """``dhmc.monitor-memory``: a big model's long run looks at fewer head chains (at least one a chunk), so the
    driver's memory for them is bounded whatever the draws and dimension."""
    from dhmc.distributed.monitor import head_chains

    geometry = Geometry(1024, 10_000, 64, 100)
    assert head_chains(geometry) == head_chains(geometry, 2 * 4, 2**30) == 64  # small: all 1024 it would
    k = head_chains(geometry, 501 * 4, 2**30)
    assert k == 3 and geometry.num_chunks * k * 10_000 * 501 * 4 <= 2**30
    assert head_chains(geometry, 10**6, 2**30) == 1
    # a run looks at every chain it would while its draws so far fit, fewer as they grow (a draws="auto" run whose
    # max_draws would not fit looked at 27 of 64 chunks' chains from its first check)
    layout = SimpleNamespace(posterior={"x": SimpleNamespace(dtype="float32", shape=(501,))})
    monitor = ConvergenceMonitor(SimpleNamespace(chains=1024, target_ess=None, geometry=geometry),
                                 sink=SimpleNamespace(layout=layout))
    assert monitor.budget == 2**30 and [monitor.chains_at(w) for w in (1, 10, 50, 100)] == [64, 33, 6, 3]
    monitor.budget = 16 * 200 * 501 * 4 * 10  # 20 chains a chunk fit 100 draws, 10 fit 200
    rng = np.random.default_rng(0)
    for segment in (0, 1):
        for chunk in range(geometry.num_chunks):
            monitor.add(chunk, segment, SimpleNamespace(head_draws={"x": rng.normal(size=(64, 100, 2))}))
    assert monitor.heads[0, 0]["x"].shape[0] == 20 and monitor.heads[0, 1]["x"].shape[0] == 10
    first = monitor.draws(1)["x"]
    assert first.shape == (16 * 20, 100, 2) and monitor.heads[0, 0]["x"].shape[0] == 20
    both = monitor.draws(2)["x"]
    assert both.shape == (16 * 10, 200, 2) and monitor.heads[0, 0]["x"].shape[0] == 10  # trimmed
    np.testing.assert_array_equal(both[:10, :100], first[:10])

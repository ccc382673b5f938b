"""Scaling studies (``dhmc.scaling``): a small real study on the embedded cluster, the JSON schema, the plots.

No assertions on speedups: the machine is shared and noisy; only that timings exist and are positive.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from dhmc import scaling
from dhmc.scaling import plots
from dhmc.scaling.clusters import Clusters
from dhmc.scaling.plot_data import point_note
from dhmc.scaling.report import derive

RUN_KEYS = {"workers", "chains", "draws", "seconds", "seconds_min", "seconds_max", "chain_draws_per_s", "speedup",
            "efficiency"}
TINY = {"draws": 20, "num_steps": 5, "repeat": 2, "progress": False}


def _check_schema(result: dict, kind: str, out) -> None:
    assert {"kind", "model", "runs", "machine"} <= set(result)
    assert result["kind"] == kind
    on_disk = json.loads((out / "scaling.json").read_text())
    assert on_disk["kind"] == kind and len(on_disk["runs"]) == len(result["runs"]) and on_disk["complete"]
    for run in on_disk["runs"]:
        assert RUN_KEYS <= set(run), RUN_KEYS - set(run)
        assert run["seconds"] > 0 and 0 < run["seconds_min"] <= run["seconds"] <= run["seconds_max"]
        assert run["chain_draws_per_s"] > 0 and run["speedup"] > 0 and run["efficiency"] > 0
        assert run["compile_seconds"] >= 0 and run["repeats"] == TINY["repeat"]
        assert len(run["seconds_all"]) == TINY["repeat"]
        assert run["cpu_share"] is None or run["cpu_share"] > 0
    machine = on_disk["machine"]
    assert machine["cpu_count"] >= 1 and machine["versions"]["jax"] and machine["versions"]["distributed"]
    for name in on_disk["plots"]:
        png = out / name
        assert png.is_file() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


@pytest.fixture(scope="module")
def strong_study(tmp_path_factory):
    """One small strong study on 1 and 2 embedded workers, shared by the tests that read it."""
    out = tmp_path_factory.mktemp("strong")
    return scaling.run_study("strong", [1, 2], chains=16, model="gaussian_2d", out=out, **TINY), out


def test_strong_study_on_the_embedded_cluster(strong_study):
    result, out = strong_study
    _check_schema(result, "strong", out)
    runs = result["runs"]
    assert [r["workers"] for r in runs] == [1, 2]
    assert all(r["chains"] == 16 and r["draws"] == 20 for r in runs)
    assert runs[0]["speedup"] == pytest.approx(1.0) and runs[0]["efficiency"] == pytest.approx(1.0)
    assert runs[1]["efficiency"] == pytest.approx(runs[1]["speedup"] / 2)
    # equal work at every point: the same blocks
    assert runs[0]["chains_per_task"] == runs[1]["chains_per_task"] == 16 // (4 * 2)
    assert all(r["acceptance_rate"] > 0.2 for r in runs)
    assert all(r["discarded_cold_repeats"] == 0 for r in runs), "the warm-up did not compile on every worker"
    assert len(list(out.glob("*.png"))) >= 2


def test_strong_points_do_equal_work(strong_study):
    """Every point of a strong study times the same blocks and the same gradient evaluations."""
    result, out = strong_study
    one, two = sorted(json.loads((out / "scaling.json").read_text())["runs"], key=lambda r: r["workers"])
    assert (one["workers"], two["workers"]) == (1, 2)
    for key in ("chains", "draws", "chains_per_task", "draws_per_segment", "blocks", "num_steps", "grad_evals"):
        assert one[key] == two[key], key
    # the gradient evaluations are counted from sample_stats.n_steps: chains x draws x leapfrog steps
    assert one["grad_evals"] == 16 * TINY["draws"] * TINY["num_steps"]
    assert one["grad_evals_all"] == two["grad_evals_all"] == [one["grad_evals"]] * TINY["repeat"]
    assert one["blocks"] == (16 // one["chains_per_task"]) * -(-TINY["draws"] // one["draws_per_segment"])
    # the workers' own counts (dhmc's worker metrics) agree with the plan, and both workers took part
    for run in (one, two):
        assert run["blocks_run_all"] == [run["blocks"]] * TINY["repeat"]
        assert all(sum(per) == run["blocks"] and len(per) == run["workers"] for per in run["blocks_per_worker_all"])
        assert run["block_seconds"] > 0 and run["block_cpu_seconds"] > 0 and 0 < run["worker_busy"] <= 1.05
        assert run["compile_seconds_all"] == [0.0] * TINY["repeat"]
        assert run["suspect"] in (None, "superlinear")  # never "unequal work"; superlinear: a noisy machine


@pytest.mark.slow  # another study on another embedded cluster; the strong study runs quick
def test_chains_study_on_one_worker(tmp_path):
    out = tmp_path / "chains"
    result = scaling.run_study("chains", chains_list=[8, 2], out=out, **TINY)
    _check_schema(result, "chains", out)
    assert [r["chains"] for r in result["runs"]] == [2, 8]
    assert all(r["workers"] == 1 and r["chains_per_task"] == r["chains"] for r in result["runs"])
    assert max(r["efficiency"] for r in result["runs"]) == pytest.approx(1.0)
    assert (out / "chains.png").is_file()


@pytest.mark.slow
def test_study_scales_a_given_cluster_and_restores_it(tmp_path):
    """The path used for dask-cuda and Slurm: scale the cluster per point, restart its workers."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster:
        result = scaling.run_study("weak", [1, 2], chains_per_worker=4, cluster=cluster, out=tmp_path, **TINY)
        _check_schema(result, "weak", tmp_path)
        assert [(r["workers"], r["chains"]) for r in result["runs"]] == [(1, 4), (2, 8)]
        assert (tmp_path / "time_per_chain.png").is_file()
        deadline = time.monotonic() + 60
        while len(cluster.scheduler_info["workers"]) != 1 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(cluster.scheduler_info["workers"]) == 1  # scaled back to its size


def test_restart_between_points_outlasts_the_lost_worker_timeout():
    """A SpecCluster closes a worker whose restart takes longer than ``lost-worker-timeout`` (15 s;
    a busy machine gets there); the study's restart must survive that (here: with a 0.05 s timeout)."""
    import dask
    from distributed import LocalCluster

    with dask.config.set({"distributed.deploy.lost-worker-timeout": "0.05s"}), \
            LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                         dashboard_address="127.0.0.1:0") as cluster, Clusters(cluster, None) as clusters:
        before = set(cluster.scheduler_info["workers"])
        client = clusters.get(1)
        assert len(client.scheduler_info()["workers"]) == 1
        assert set(client.scheduler_info()["workers"]) != before  # a fresh worker process


def test_unscalable_address_needs_its_own_worker_count(tmp_path):
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp", host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster, set_as_default=False):
        with pytest.raises(scaling.ScalingError, match="cannot scale it"):
            scaling.run_study("strong", [2], chains=8, cluster=cluster.scheduler_address, out=tmp_path, **TINY)


@pytest.mark.parametrize(("args", "match"), [
    ({"kind": "sideways", "workers": [1], "chains": 8}, "kind must be one of"),
    ({"kind": "strong", "workers": [1, 2]}, "needs chains"),
    ({"kind": "weak", "workers": [1, 2], "chains": 8}, "needs chains_per_worker"),
    ({"kind": "strong", "workers": [0, 2], "chains": 8}, "workers must be a positive integer"),
    ({"kind": "strong", "workers": [], "chains": 8}, "workers must list"),
    ({"kind": "chains", "workers": [1, 2], "chains_list": [2, 4]}, "one worker count"),
    ({"kind": "chains"}, "needs chains_list"),
    ({"kind": "strong", "workers": [1], "chains": 8, "repeat": 0}, "repeat must be"),
    ({"kind": "strong", "workers": [1], "chains": 8, "model": "nope"}, "unknown model 'nope'"),
])
def test_bad_input_is_refused_before_any_work(tmp_path, args, match):
    args = {"draws": 10, "out": tmp_path / "x", **args}
    with pytest.raises(ValueError, match=match):
        scaling.run_study(args.pop("kind"), args.pop("workers", None), **args)
    assert not (tmp_path / "x").exists()


def _synthetic(kind: str) -> dict:
    runs = []
    for model, t1 in (("gaussian_2d", 8.0), ("coin_toss", 3.0)):
        for w, eff in ((1, 1.0), (2, 0.9), (4, 0.7)):
            chains = 512 if kind == "strong" else 256 * w
            t = t1 / (w * eff) if kind == "strong" else t1 / eff
            runs.append({"model": model, "workers": w, "chains": chains, "draws": 400, "seconds": t,
                         "seconds_min": 0.95 * t, "seconds_max": 1.1 * t, "chain_draws_per_s": chains * 400 / t,
                         "speedup": None, "efficiency": None})
    study = {"kind": kind, "model": "gaussian_2d,coin_toss", "runs": runs, "machine": {"cores_available": 4},
             "settings": {"draws": 400, "repeat": 3}, "cluster": None}
    derive(kind, runs)
    return study


@pytest.mark.parametrize("kind", ["strong", "weak"])
def test_speedup_is_normalised_per_workload_and_plotted(tmp_path, kind):
    study = _synthetic(kind)
    for run in study["runs"]:
        expected = {1: 1.0, 2: 0.9, 4: 0.7}[run["workers"]]
        assert run["efficiency"] == pytest.approx(expected)
        assert run["speedup"] == pytest.approx(expected * run["workers"])
        assert run["speedup_min"] < run["speedup"] < run["speedup_max"]
    paths = plots.plot_study(study, tmp_path)
    names = {p.name for p in paths}
    assert {"speedup.png", "efficiency.png"} <= names
    assert ("time_per_chain.png" if kind == "weak" else "time.png") in names
    assert all(p.stat().st_size > 5000 for p in paths)


@pytest.mark.parametrize("kind", ["strong", "weak"])
def test_faster_than_linear_is_marked_suspect(tmp_path, kind):
    study = _synthetic(kind)
    runs = [r for r in study["runs"] if r["model"] == "gaussian_2d"]
    for r in runs:
        r.update(grad_evals=r["chains"] * 400 * 10, blocks=r["chains"] // 8, block_seconds=0.5)
    runs[0]["block_seconds"] = 0.6  # the baseline's blocks ran slower: a slower machine, not dhmc
    two = next(r for r in runs if r["workers"] == 2)
    for key in ("seconds", "seconds_min", "seconds_max"):
        two[key] /= 2.3 / 1.8  # 2.3x on 2 workers instead of 1.8x (efficiency 0.9)
    two["chain_draws_per_s"] = two["chains"] * 400 / two["seconds"]
    derive(kind, study["runs"])
    assert two["speedup"] == pytest.approx(2.3)
    assert two["suspect"] == "superlinear"
    assert "more than 2x" in two["suspect_detail"] and "slower while the baseline ran" in two["suspect_detail"]
    assert two["block_seconds_vs_baseline"] == pytest.approx(0.5 / 0.6)
    assert all(r["suspect"] is None for r in study["runs"] if r is not two)
    assert "suspect: superlinear" in point_note(two)
    plots.plot_study(study, tmp_path)


@pytest.mark.parametrize("kind", ["strong", "weak"])
def test_unequal_work_is_marked_suspect(kind):
    study = _synthetic(kind)
    runs = [r for r in study["runs"] if r["model"] == "coin_toss"]
    for r in runs:
        r.update(grad_evals=r["chains"] * 400 * 10, blocks=r["chains"] // 8)
    derive(kind, study["runs"])
    assert all(r["suspect"] is None for r in study["runs"])  # strong: the same work; weak: in proportion
    four = next(r for r in runs if r["workers"] == 4)
    four["grad_evals"] += 1
    four["blocks"] += 1
    derive(kind, study["runs"])
    assert four["suspect"] == "unequal work"
    assert "gradient evaluations" in four["suspect_detail"] and "blocks" in four["suspect_detail"]
    assert all(r["suspect"] is None for r in study["runs"] if r is not four)


def test_plots_refuse_mixed_kinds(tmp_path):
    with pytest.raises(ValueError, match="different kinds"):
        plots.plot_studies([_synthetic("strong"), _synthetic("weak")], tmp_path)


def test_machine_info_and_no_jax_at_import():
    info = scaling.machine_info()
    assert {"cpu_count", "cpu_model", "platform", "versions", "cores_available"} <= set(info)
    assert "dask" in info["versions"] and "jax" in info["versions"]
    code = ("import sys, dhmc.scaling, dhmc.scaling.plots; "
            "bad = [m for m in ('jax', 'matplotlib', 'dhmc.api') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)

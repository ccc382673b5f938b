"""Smoke tests of benchmarks/: the modules run at their smallest sizes and write well-formed JSON.

No timing is asserted (the numbers depend on the machine and its load). The full quick suite
(``python -m benchmarks.run --quick``) starts dhmc clusters and compiles every sampler: several minutes on
two cores, so it is marked slow; the fast tests run the modules' pieces that need no cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]
BENCH = REPO / "benchmarks"
MODULES = ["throughput", "ess", "many_chains", "memory", "coin_toss_headline", "dhmc_overhead", "run", "scale",
           "funnel_neck", "laplace_cost", "tail_noise", "posteriordb_outside"]


def _run(module, args, timeout):
    """``python -m benchmarks.<module> args...`` from the repository root, as the README runs them."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{module}", *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=env, cwd=REPO)
    tail = f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, f"exit {proc.returncode}\n{tail}"
    return proc.stdout


@pytest.mark.parametrize("module", MODULES)
def test_help(module):
    assert "usage" in _run(module, ["--help"], 60).lower()


def test_posteriordb_outside_reads_a_clone_and_names_draws_as_stan(tmp_path):
    """A posteriordb clone's files (a made-up one) and Stan's 1-based names for vector and matrix sites."""
    import io
    import zipfile

    import numpy as np

    from benchmarks import posteriordb_outside as po

    root = tmp_path / "posterior_database"
    (root / "posteriors").mkdir(parents=True)
    (root / "data" / "data").mkdir(parents=True)
    (root / "posteriors" / "p-m.json").write_text(json.dumps({"data_name": "p"}))
    blob = io.BytesIO()
    with zipfile.ZipFile(blob, "w") as z:
        z.writestr("p.json", json.dumps({"y": [1, 2]}))
    (root / "data" / "data" / "p.json.zip").write_bytes(blob.getvalue())
    assert po.data(str(tmp_path), "p-m") == {"y": [1, 2]}
    samples = {"sigma": np.zeros((2, 3)), "beta": np.arange(12.0).reshape(2, 3, 2), "m": np.zeros((2, 3, 2, 2))}
    names = po.stan_names(samples, {"sigma", "beta[1]", "beta[2]", "m[2,1]"})
    assert sorted(names) == ["beta[1]", "beta[2]", "m[2,1]", "sigma"]
    np.testing.assert_array_equal(names["beta[2]"], samples["beta"][:, :, 1])


def test_shell_scripts_parse():
    for script in ("gpu.sh", "fetch_wheels.sh"):
        subprocess.run(["bash", "-n", str(BENCH / script)], check=True)


def test_benchmarks_neither_patch_dhmc_nor_edit_sys_path():
    """They watch dhmc through ``observers=`` and import as a package: no attribute set, no path edited."""
    for path in BENCH.glob("*.py"):
        text = path.read_text()
        assert "sys.path" not in text and "setattr(" not in text, path.name


def test_probe_times_a_run_from_its_events():
    """``DhmcProbe`` told a run's events: its phases, the blocks' sums, each block matched to its task by key."""
    import dhmc
    from benchmarks.probe import DhmcProbe

    now = time.time()
    stream = [{"key": "dhmc-ab-sample-0-0-1f2e3d", "worker": "w1",
               "startstops": [{"action": "compute", "start": now + 1.0, "stop": now + 2.0}]},
              {"key": "dhmc-zz-sample-1-0-4c5b6a", "worker": "w2",  # another run's task: not this run's block
               "startstops": [{"action": "compute", "start": now + 1.0, "stop": now + 1.5}]}]
    client = SimpleNamespace(get_task_stream=lambda: stream)
    geometry = SimpleNamespace(draws_per_segment=50, chunk=lambda c: range(4 * c, 4 * c + 4))
    probe = DhmcProbe()
    assert isinstance(probe, dhmc.Observer)
    probe.wall_start, probe.marks["call"] = now, time.perf_counter()
    probe.start_run(client, "dhmc-ab", geometry)
    probe.sample_block(0, 0, SimpleNamespace(seconds=0.5, compile_seconds=0.25), 200)
    probe.sample_block(1, 0, SimpleNamespace(seconds=0.5, compile_seconds=0.0), 200)
    probe.close()
    probe.marks["returned"] = time.perf_counter()
    probe.timing = {"cluster_start": 1.0, "compile": 0.25, "warmup": 0.0, "sampling": 2.0, "writing": 0.5}
    summary = probe.summary()
    assert set(summary["driver_phases_s"]) == {"call", "before_run", "cluster_start", "runner_warmup",
                                               "runner_sample", "after_sampling", "cluster_close"}
    assert summary["driver_phases_s"]["runner_sample"] == 2.5
    assert (summary["blocks"], summary["chains_per_block"], summary["iterations_per_block"]) == (2, 4, 50)
    assert (summary["block_device_seconds_sum"], summary["blocks_compiled"]) == (1.0, 1)
    assert summary["task_overhead_s_mean"] == pytest.approx(0.25)  # 1 s computing - 0.5 s device - 0.25 s compile
    assert summary["first_task_start_after_call_s"] == pytest.approx(1.0)
    assert set(summary["task_stream"]) == {"w1", "w2"}


@pytest.mark.slow  # three processes that import JAX (the floor's, BlackJAX's and the parent); test_help runs each module
def test_throughput_reference_samplers_tiny(tmp_path):
    """The floor and BlackJAX on the coin toss, 4 chains x 50 draws: JSON with rates for both."""
    out = tmp_path / "throughput.json"
    _run("throughput", ["--quick", "--targets", "coin_toss", "--methods", "floor,blackjax", "--no-warm", "--out", out],
         300)
    runs = json.loads(out.read_text())["runs"]
    assert {r["method"] for r in runs} == {"floor", "blackjax"}
    for r in runs:
        assert "error" not in r, r
        assert r["cold_chain_draws_per_s"] > 0
        assert r["cold_grad_evals_per_s"] == pytest.approx(r["cold_chain_draws_per_s"] * 10)
    # same HMC, same keys: the floor and BlackJAX draw the same chains
    assert runs[0]["mean0"] == pytest.approx(runs[1]["mean0"], abs=1e-4)


@pytest.mark.slow  # another throughput run, for one option
def test_throughput_kernel_ratio_and_cpu_tiny(tmp_path):
    """``--kernel-ratio``: dhmc's block program vs the floor's on the same block, in one pinned process; the JSON
    names the CPU and the printed tables start with it."""
    out = tmp_path / "throughput.json"
    stdout = _run("throughput", ["--quick", "--targets", "coin_toss", "--methods", "floor", "--no-warm",
                                 "--kernel-ratio", "--out", out], 300)
    payload = json.loads(out.read_text())
    assert payload["machine"]["cpu"]["cores_available"] >= 1
    assert "\nCPU: " in stdout
    [k] = payload["kernel_ratio"]
    assert "error" not in k, k
    assert k["dhmc_block_device_s"] > 0 and k["floor_block_device_s"] > 0
    assert k["kernel_ratio_dhmc_over_floor_same_block"] == pytest.approx(k["dhmc_block_device_s"]
                                                                        / k["floor_block_device_s"])
    assert (k["chains_per_task"], k["draws_per_segment"]) == (4, 50)
    assert "kernel, same block (coin_toss 4 chains" in stdout


def test_throughput_contract_is_the_contract_case():
    """``--contract`` selects the contract check's case, the same as the spelled-out options."""
    from benchmarks import throughput

    assert throughput.CONTRACT == {"targets": ["logistic"], "chains": [1024],
                                   "methods": ["dhmc", "floor", "blackjax", "numpyro"], "draws": 400, "num_steps": 10,
                                   "step_size": 0.02, "no_warm": True, "chains_per_task": None}


def test_funnel_neck_tiny(tmp_path):
    """Every rule runs on the centred eight schools and reports its gradients and each quarter's neck; the start
    has no chain in the neck, so the first quarter's 1% quantile lies above the exact one."""
    out = tmp_path / "funnel.json"
    _run("funnel_neck", ["--problems", "eight_schools_centered", "--chains", 64, "--grads", 40,
                         "--reference-draws", 2000, "--out", out], 300)
    run = json.loads(out.read_text())["runs"][0]
    assert set(run["rules"]) == {"harmonic", "arithmetic", "levels", "selected"}
    assert 0 < run["step_harmonic"] <= run["step_arithmetic"] and run["levels"] >= 1
    for rule in run["rules"].values():
        assert rule["grads"] >= 40 and len(rule["checkpoints"]) == 4
        assert rule["checkpoints"][0]["log_tau"]["q01_gap"] > 0


def test_funnel_neck_brownian_laplace_samples_the_scales_exact_marginal(tmp_path):
    """The laplace form's density differs from brownian_grid's quadrature by a constant on the scales (and by the
    standard normal in z), and its run starts with no chain on the observation scale's tail."""
    import jax.numpy as jnp
    import numpy as np

    from benchmarks.funnel_neck import brownian_laplace
    from benchmarks.laps_targets import brownian_grid

    logdensity, draws, watched = brownian_laplace(np.random.default_rng(0), 10)
    assert draws.shape == (10, 32) and watched == {"log_observation": 0, "log_innovation": 1}
    grid = brownian_grid(0.01)
    cells = [(1000, 1000), (1300, 950), (900, 1050)]  # (log_innovation, log_observation) indices near the bulk
    z = np.linspace(-1, 1, 30)
    gaps = [float(logdensity(jnp.asarray(np.r_[grid["log_observation"][i, j], grid["log_innovation"][i, j], z])))
            - float(np.log(grid["weights"][i, j])) for i, j in cells]
    np.testing.assert_allclose(gaps, gaps[0], atol=1e-3)
    out = tmp_path / "laplace.json"
    _run("funnel_neck", ["--problems", "brownian_laplace", "--rules", "harmonic", "--chains", 64, "--grads", 40,
                         "--reference-draws", 2000, "--out", out], 300)
    rule = json.loads(out.read_text())["runs"][0]["rules"]["harmonic"]
    assert rule["grads"] >= 40 and rule["checkpoints"][0]["log_observation"]["q01_gap"] > 0


def test_machine_names_the_cpu_and_never_raises(monkeypatch, tmp_path):
    """``machine()["cpu"]``: model, cores, caches, ISA where readable; with no sysfs, lscpu or /proc: what is left."""
    from benchmarks import machine

    info = machine.machine()["cpu"]
    assert info["cores_available"] >= 1
    assert machine.cpu_line(info).startswith("CPU: ")
    machine.cpu.cache_clear()
    monkeypatch.setattr(machine, "SYS_CPU", tmp_path / "missing")
    monkeypatch.setattr(machine, "_cpuinfo", lambda: {})
    monkeypatch.setenv("PATH", str(tmp_path))
    try:
        bare = machine.cpu()
    finally:
        machine.cpu.cache_clear()
    assert set(bare) <= {"cores_available", "logical_cpus"}
    assert machine.cpu_line(bare).startswith("CPU: unknown model")
    assert machine._lscpu_cache_bytes("2097152 (2 instances)") == {"bytes_per_instance": 1048576, "instances": 2}
    assert machine._size_bytes("1024K") == 2**20 and machine._cpu_list("0-2,5") == [0, 1, 2, 5]


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_run_quick_writes_every_result(tmp_path):
    """``python -m benchmarks.run --quick``: every benchmark at its smallest size, each JSON written.

    About 8 minutes on two quiet cores (30 on a loaded one): mostly cluster starts and XLA compiles.
    """
    _run("run", ["--quick", "--out-dir", tmp_path], 3000)
    for name in ("throughput", "ess", "memory", "coin_toss_headline", "dhmc_overhead"):
        payload = json.loads((tmp_path / f"{name}.json").read_text())
        assert payload["benchmark"] == name
        assert "cpu" in payload["machine"]
    runs = json.loads((tmp_path / "throughput.json").read_text())["runs"]
    assert {r["method"] for r in runs} >= {"dhmc", "floor", "blackjax", "numpyro"}
    assert all("error" not in r for r in runs)
    dhmc = [r for r in runs if r["method"] == "dhmc"]
    assert all(r["warm_s"] > 0 and "compile" in r["dhmc_timing_cold"] for r in dhmc)


def test_scale_accounting_from_a_fake_run():
    """``scale``'s pure parts: a store path's kind and pattern, the latencies from a task stream and the observer's
    arrivals, the block's CPU figures from the observer's marks, and the W_max model."""
    from benchmarks import scale

    assert [scale.store_kind(p) for p in ("posterior/x/c/3/0/0", "sample_stats/lp/c/3/0", "posterior/chain/c/0",
                                          "dhmc/done/c/3/0", "dhmc/host/c/1/2", "dhmc/position/c/3/0/0", "zarr.json",
                                          "dhmc/done/zarr.3af84c2741864d7aa2c6f9270fc9022f.partial", ".zgroup")] == \
        ["draws", "draws", "coords", "done", "host", "position", "metadata", "metadata", "other"]
    assert scale._pattern("posterior/x/c/3/0/0.e9685872e9f5402dbbbdb2d50823ef5e.partial") == "posterior/x/c/N/N/N.*.partial"

    t0 = 1000.0  # chunk 0: segment 0 computes 1.00-1.10 s, reaches the driver at 1.15, segment 1 starts at 1.20
    stream = [{"key": "dhmc-ab-sample-0-0-1f2e3d", "worker": "w1",
               "startstops": [{"action": "compute", "start": t0 + 1.0, "stop": t0 + 1.1}]},
              {"key": "dhmc-ab-sample-0-1-4c5b6a", "worker": "w1",
               "startstops": [{"action": "compute", "start": t0 + 1.2, "stop": t0 + 1.3}]},
              {"key": "dhmc-zz-sample-0-0-aaaaaa", "worker": "w2",  # another run's task
               "startstops": [{"action": "compute", "start": t0, "stop": t0 + 5}]}]
    client = SimpleNamespace(get_task_stream=lambda start=None: stream)
    watch = SimpleNamespace(run_id="dhmc-ab", t0=t0, blocks=[{"chunk": 0, "segment": 0, "received": t0 + 1.15},
                                                             {"chunk": 0, "segment": 1, "received": t0 + 1.4}])
    lat = scale._latency(client, watch)
    assert lat["workers_used"] == 1
    got = {k: v["median_ms"] for k, v in lat["latency"].items()}
    assert got["turnaround"] == pytest.approx(100) and got["submit_to_start"] == pytest.approx(50)
    assert got["to_driver"] == pytest.approx(75) and got["worker_idle_gap"] == pytest.approx(100)
    assert got["task_compute"] == pytest.approx(100)

    mark = lambda wall, driver, main, sched: {"wall": wall, "driver": driver, "driver_main": main, "fs_calls": 0,
                                              "scheduler": sched, "hosts": 0.0}
    watch = SimpleNamespace(k={25: "q1", 75: "q3"}, checks=[{"after_block": 30, "cpu_s": 0.2}],
                            marks={"start_run": mark(0, 0, 0, 0), "q1": mark(1, 0.1, 0.05, 0.1),
                                   "q3": mark(3, 0.5, 0.35, 0.35), "last": mark(4, 0.6, 0.4, 0.45)})
    rates = scale._rates(watch, 100, {}, {"scheduler": [1], "hosts": [2]})
    assert rates["steady"]["driver_cpu_ms_per_block"] == pytest.approx(4.0)  # (0.4 s - 0.2 s of checks) / 50
    assert rates["steady"]["scheduler_cpu_ms_per_block"] == pytest.approx(5.0)
    assert rates["steady"]["wall_ms_per_block"] == pytest.approx(40.0)
    record = {"workers": 128, "idle": {"scheduler": 0.05}, "memory": {**rates, "driver_bound": True}}
    scale._less_idle(record)
    assert record["memory"]["steady"]["scheduler_cpu_ms_per_block_less_idle"] == pytest.approx(5.0 - 2.0)
    m = scale.model([record])["memory"]
    assert m["driver_w_max"] == {"0.5": pytest.approx(125), "5.0": pytest.approx(1250)}
    assert m["driver_loop_wall_w_max"]["5.0"] == pytest.approx(125) and m["driver_bound"]
    assert "W_max" in scale.model_text(scale.model([record]))


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_scale_quick_runs_the_driver_on_a_cluster(tmp_path):
    """``python -m benchmarks.scale --quick``: a real scheduler and 1, then 8 real workers in worker hosts, dhmc's
    driver on them with and without a store, the warmup barrier with a slow worker; every process gone after.

    About 1.5 minutes on two quiet cores.
    """
    import psutil

    out = tmp_path / "scale.json"
    stdout = _run("scale", ["--quick", "--out", out], 1100)
    payload = json.loads(out.read_text())
    assert payload["benchmark"] == "scale" and "cpu" in payload["machine"]
    assert [r["workers"] for r in payload["runs"]] == [1, 8]
    for r in payload["runs"]:
        assert "error" not in r, r
        for mode in ("memory", "store"):
            run = r[mode]
            assert run["blocks"] == run["chunks"] * run["segments"] >= 48
            assert run["blocks_compiled"] == 0  # the programs were compiled before the timed runs
            assert run["blocks_per_s"] > 0 and run["steady"]["driver_cpu_ms_per_block"] > 0
            assert run["steady"]["scheduler_cpu_ms_per_block"] >= 0
            assert run["latency"]["turnaround"]["n"] > 0
        files = r["store"]["store_files"]["by_kind"]
        assert files["position"] == r["store"]["blocks"]  # end positions: a file a block
        assert files["done"] == r["store"]["segments"]  # done flags: a file a segment, for every chunk
        assert 0 < r["store"]["store_calls"]["driver_per_block"]["rename:done"] <= 1.0  # written in batches
    barrier = payload["runs"][1]["barrier"]
    assert len(barrier["slow"]["rounds"]) == len(barrier["even"]["rounds"]) >= 1
    assert payload["model"]["from_workers"] == 8 and "driver_w_max" in payload["model"]["store"]
    assert "W_max" in stdout and "\nCPU: " in stdout
    orphans = []  # a scheduler, worker host or driver of a benchmark whose process is gone
    for p in psutil.process_iter(["cmdline"]):
        argv = p.info["cmdline"] or []
        if "--role" in argv and any(str(a).endswith("benchmarks/scale.py") for a in argv):
            parent = json.loads(argv[argv.index("--config") + 1])["parent"]
            if not psutil.pid_exists(parent):
                orphans.append(argv[:4])
    assert not orphans, orphans


def test_laplace_cost_tiny(tmp_path):
    """Both models time a plain and a Laplace-whitened ensemble gradient; the whitened one names its latent sites."""
    out = tmp_path / "cost.json"
    _run("laplace_cost", ["--chains", 8, "--repeats", 2, "--out", out], 300)
    runs = {r["model"]: r for r in json.loads(out.read_text())["runs"]}
    assert runs["eight_schools_centered"]["latent"] == ["theta"] and runs["brownian"]["latent"] == ["steps"]
    assert all(r["plain_ms"] > 0 and r["laplace_ms"] > 0 for r in runs.values())


def test_tail_noise_tiny(tmp_path):
    """Both scales' exact marginals: the observation scale's heavy tail (kurtosis far above a normal's 3) and the
    spread of the sd ratio shrinking with the draws."""
    out = tmp_path / "noise.json"
    _run("tail_noise", ["--grid", 0.05, "--repeats", 50, "--draws", "100,10000", "--out", out], 300)
    runs = {r["scale"]: r for r in json.loads(out.read_text())["runs"]}
    assert runs["log_observation"]["kurtosis"] > 10 > runs["log_innovation"]["kurtosis"] > 3
    spread = [row["sd_ratio_sd"] for row in runs["log_observation"]["draws"]]
    assert spread[0] > 3 * spread[1]

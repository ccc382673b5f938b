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
MODULES = ["throughput", "ess", "many_chains", "memory", "coin_toss_headline", "dhmc_overhead", "run"]


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

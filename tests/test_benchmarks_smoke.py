"""Smoke tests of benchmarks/: the scripts run at their smallest sizes and write well-formed JSON.

No timing is asserted (the numbers depend on the machine and its load). The full quick suite
(``benchmarks/run.py --quick``) starts dhmc clusters and compiles every sampler: several minutes on
two cores, so it is marked slow; the fast tests run the scripts' pieces that need no cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = ["throughput.py", "ess.py", "memory.py", "coin_toss_headline.py", "dhmc_overhead.py", "run.py"]


def _run(args, timeout):
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=timeout, env=env)
    tail = f"stdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    assert proc.returncode == 0, f"exit {proc.returncode}\n{tail}"
    return proc.stdout


@pytest.mark.parametrize("script", SCRIPTS)
def test_help(script):
    assert "usage" in _run([BENCH / script, "--help"], 60).lower()


def test_shell_scripts_parse():
    for script in ("gpu.sh", "fetch_wheels.sh"):
        subprocess.run(["bash", "-n", str(BENCH / script)], check=True)


def test_throughput_reference_samplers_tiny(tmp_path):
    """The floor and BlackJAX on the coin toss, 4 chains x 50 draws: JSON with rates for both."""
    out = tmp_path / "throughput.json"
    _run([BENCH / "throughput.py", "--quick", "--targets", "coin_toss", "--methods", "floor,blackjax", "--no-warm",
          "--out", out], 300)
    runs = json.loads(out.read_text())["runs"]
    assert {r["method"] for r in runs} == {"floor", "blackjax"}
    for r in runs:
        assert "error" not in r, r
        assert r["cold_chain_draws_per_s"] > 0
        assert r["cold_grad_evals_per_s"] == pytest.approx(r["cold_chain_draws_per_s"] * 10)
    # same HMC, same keys: the floor and BlackJAX draw the same chains
    assert runs[0]["mean0"] == pytest.approx(runs[1]["mean0"], abs=1e-4)


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_run_quick_writes_every_result(tmp_path):
    """``benchmarks/run.py --quick``: every benchmark at its smallest size, each JSON written.

    About 8 minutes on two quiet cores (30 on a loaded one): mostly cluster starts and XLA compiles.
    """
    _run([BENCH / "run.py", "--quick", "--out-dir", tmp_path], 3000)
    for name in ("throughput", "ess", "memory", "coin_toss_headline", "dhmc_overhead"):
        payload = json.loads((tmp_path / f"{name}.json").read_text())
        assert payload["benchmark"] == name
        assert "machine" in payload
    runs = json.loads((tmp_path / "throughput.json").read_text())["runs"]
    assert {r["method"] for r in runs} >= {"dhmc", "floor", "blackjax", "numpyro"}
    assert all("error" not in r for r in runs)
    dhmc = [r for r in runs if r["method"] == "dhmc"]
    assert all(r["warm_s"] > 0 and "compile" in r["dhmc_timing_cold"] for r in dhmc)

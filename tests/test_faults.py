"""Failures for real: a SIGKILLed worker, a SIGKILLed driver resumed, Ctrl-C. Nothing lost, nothing twice."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr
import zarr

import dhmc

pytestmark = pytest.mark.slow


def same_trace(a, b) -> bool:
    a = xr.open_datatree(a, engine="zarr", consolidated=False)
    b = xr.open_datatree(b, engine="zarr", consolidated=False)
    return all(np.array_equal(a[g][v].values, b[g][v].values) for g in ("posterior", "sample_stats")
               for v in a[g].data_vars)


def done_blocks(path) -> int:
    try:
        return int(zarr.open_group(str(path), mode="r")["dhmc/done"][...].sum())
    except Exception:  # noqa: BLE001 - not created yet
        return 0


def logdensity(p):
    return -0.5 * jnp.sum((p["x"] - jnp.arange(3.0)) ** 2 / (1.0 + jnp.arange(3.0)))


def test_killed_worker_changes_nothing(tmp_path):
    from distributed import Client, LocalCluster

    kw = dict(init={"x": jnp.zeros(3)}, chains=128, draws=3000, warmup=200, seed=11, chains_per_task=16, progress=False)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        dhmc.sample(logdensity, cluster=client, store=tmp_path / "ref.zarr", **kw)
        out = {}
        thread = threading.Thread(target=lambda: out.setdefault(
            "trace", dhmc.sample(logdensity, cluster=client, store=tmp_path / "hit.zarr", **kw)))
        thread.start()
        deadline = time.time() + 120
        while done_blocks(tmp_path / "hit.zarr") < 2 and time.time() < deadline:
            time.sleep(0.1)
        victim = sorted(client.run(os.getpid).values())[0]
        os.kill(victim, signal.SIGKILL)
        thread.join(600)
    assert "trace" in out, "the run did not finish after a worker was killed"
    assert same_trace(tmp_path / "ref.zarr", tmp_path / "hit.zarr")


def test_a_worker_killed_during_automatic_warmup_changes_nothing(tmp_path):
    """warmup="auto" decides when to stop from merged statistics: a block lost and re-run elsewhere must
    give the same statistics, the same rounds and the same draws."""
    from distributed import Client, LocalCluster

    kw = dict(init={"x": jnp.zeros(3)}, chains=128, draws=200, seed=12, chains_per_task=16, progress=False)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        reference = dhmc.sample(logdensity, cluster=client, **kw)
        out = {}
        thread = threading.Thread(target=lambda: out.setdefault("trace", dhmc.sample(logdensity, cluster=client, **kw)))
        thread.start()
        deadline, victim = time.time() + 120, None
        while victim is None and time.time() < deadline:
            for worker, keys in client.processing().items():
                if any("-cold-2-" in str(key) for key in keys):  # the cold phase's second round of steps
                    victim = client.run(os.getpid, workers=[worker])[worker]
            time.sleep(0.02)
        assert victim is not None, "no worker was seen running the cold phase's second round"
        os.kill(victim, signal.SIGKILL)
        thread.join(600)
    assert "trace" in out, "the run did not finish after a worker was killed"
    assert out["trace"]["posterior"].attrs["dhmc_warmup"] == reference["posterior"].attrs["dhmc_warmup"]
    for group in ("posterior", "sample_stats"):
        for name in reference[group].data_vars:
            assert np.array_equal(reference[group][name].values, out["trace"][group][name].values), (group, name)


def _cli(*args):
    return [sys.executable, "-m", "dhmc", *map(str, args)]


def test_killed_driver_resumes_bitwise(tmp_path):
    """With MAMS and the automatic warmup (the store-safety tests kill the default kernel's drivers)."""
    args = ["sample", "coin_toss", "--chains", 128, "--draws", 3000, "--seed", 3,
            "--chains-per-task", 16, "--kernel", "mams", "--no-progress"]
    full = subprocess.run(_cli(*args, "--out", tmp_path / "full.zarr"), capture_output=True, text=True, timeout=600)
    assert full.returncode == 0, full.stderr[-1500:]

    cut = tmp_path / "cut.zarr"
    proc = subprocess.Popen(_cli(*args, "--out", cut), start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while done_blocks(cut) < 3 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    written = done_blocks(cut)
    total = zarr.open_group(str(cut), mode="r")["dhmc/done"].size
    assert 0 < written < total, f"kill came too late or too early: {written}/{total} blocks"

    start = time.perf_counter()
    resumed = subprocess.run(_cli("resume", cut, "--no-progress"), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-1500:]
    print(f"resumed {total - written} of {total} blocks in {time.perf_counter() - start:.1f} s")
    assert done_blocks(cut) == total
    assert same_trace(tmp_path / "full.zarr", cut)


def test_ctrl_c_leaves_a_resumable_store(tmp_path):
    store = tmp_path / "int.zarr"
    proc = subprocess.Popen(_cli("sample", "coin_toss", "--chains", 128, "--draws", 16000, "--warmup", 100,
                                 "--chains-per-task", 16, "--out", store, "--no-progress"),
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.time() + 300
    while done_blocks(store) < 2 and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert proc.poll() is None, "the run ended before it was interrupted: give it more draws"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err[-1500:]
    assert f"dhmc resume {store}" in err and "Traceback" not in err
    resumed = subprocess.run(_cli("resume", store, "--no-progress"), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-1500:]

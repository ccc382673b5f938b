"""dask-jobqueue against Slurm.

The job-script test needs only dask_jobqueue. The ``slurm``-marked tests need the single-node
Slurm on 127.0.0.1 from ``deploy/local-slurm/up.sh`` (stop it with ``down.sh``)::

    sudo deploy/local-slurm/up.sh && pytest -m slurm tests/distributed/test_slurm.py
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import pytest

dask_jobqueue = pytest.importorskip("dask_jobqueue")


def local_slurm_kwargs(tmp_path) -> dict:
    """SLURMCluster kwargs for the local Slurm: one 1-core, 1-process worker per job, and every
    socket (scheduler, dashboards, nanny, worker) on 127.0.0.1."""
    return dict(
        cores=1,
        processes=1,
        memory="1GiB",
        walltime="00:10:00",
        python=sys.executable,
        scheduler_options={"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"},
        worker_extra_args=["--host", "127.0.0.1", "--dashboard-address", "127.0.0.1:0"],
        local_directory=str(tmp_path / "worker-space"),
        log_directory=str(tmp_path / "slurm-logs"),
        death_timeout=60,
    )


def _squeue_states(job_ids) -> dict[str, str]:
    out = subprocess.run(
        ["squeue", "-h", "-t", "all", "-o", "%i %T", "-j", ",".join(job_ids)],
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


@pytest.fixture(scope="module")
def local_slurm():
    """Skip unless a Slurm controller answers and has an idle node."""
    if shutil.which("sinfo") is None:
        pytest.skip("sinfo not on PATH: start the local Slurm with deploy/local-slurm/up.sh")
    res = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=30)
    states = [line.split()[1] for line in res.stdout.splitlines() if len(line.split()) == 2]
    if res.returncode != 0 or not {"idle", "mixed"} & set(states):
        pytest.skip(
            f"no idle Slurm node (sinfo rc={res.returncode}, node states {states}): run deploy/local-slurm/up.sh"
        )


# --- job script rendering (no Slurm needed) ---------------------------------------------------


def test_gpu_partition_job_script(tmp_path):
    kwargs = dict(
        queue="gpu",
        account="proj123",
        cores=1,  # one Dask thread drives one GPU
        job_cpu=4,  # but give XLA's host side 4 cores
        processes=1,
        memory="32GiB",  # host memory limit of the Dask worker
        walltime="04:00:00",
        # --mem and --mem-per-gpu are mutually exclusive in sbatch: drop the --mem line
        job_directives_skip=["--mem"],
        job_extra_directives=["--gres=gpu:1", "--mem-per-gpu=40G"],
        job_script_prologue=["export XLA_PYTHON_CLIENT_PREALLOCATE=false"],
        python="/opt/dhmc/bin/python",
        log_directory=str(tmp_path / "logs"),
        scheduler_options={"host": "127.0.0.1", "dashboard_address": "127.0.0.1:0"},
    )
    with dask_jobqueue.SLURMCluster(**kwargs) as cluster:
        script = cluster.job_script()
        address = cluster.scheduler_address

    sbatch = [line for line in script.splitlines() if line.startswith("#SBATCH")]
    for expected in (
        "#SBATCH -p gpu",
        "#SBATCH -A proj123",
        "#SBATCH -n 1",
        "#SBATCH --cpus-per-task=4",
        "#SBATCH -t 04:00:00",
        "#SBATCH --gres=gpu:1",
        "#SBATCH --mem-per-gpu=40G",
    ):
        assert expected in sbatch, (expected, script)
    assert not any(line.startswith("#SBATCH --mem=") for line in sbatch), script
    assert any(line.startswith(f"#SBATCH -o {tmp_path / 'logs'}/") for line in sbatch), script
    # directives come before the first command; the worker runs last and connects back
    body = script.split("\n")
    assert max(i for i, line in enumerate(body) if line.startswith("#SBATCH")) < body.index(
        "export XLA_PYTHON_CLIENT_PREALLOCATE=false"
    )
    worker_cmd = body[-1] if body[-1].strip() else body[-2]
    assert worker_cmd.startswith("/opt/dhmc/bin/python -m distributed.cli.dask_worker " + address)
    assert "--nthreads 1" in worker_cmd and "--memory-limit 32.00GiB" in worker_cmd


# --- real jobs on the local Slurm -------------------------------------------------------------


@pytest.mark.slurm
def test_slurm_cluster_two_jobs(local_slurm, tmp_path):
    from distributed import Client

    with dask_jobqueue.SLURMCluster(**local_slurm_kwargs(tmp_path)) as cluster:
        cluster.scale(jobs=2)
        with Client(cluster) as client:
            client.wait_for_workers(2, timeout=60)
            assert client.submit(lambda x: x + 1, 1).result(timeout=30) == 2
            hosts = {w["host"] for w in client.scheduler_info()["workers"].values()}
            assert hosts == {"127.0.0.1"}

            job_ids = [job.job_id for job in cluster.workers.values()]
            assert len(job_ids) == 2 and all(job_ids), job_ids
            assert set(_squeue_states(job_ids).values()) == {"RUNNING"}

    # closing the cluster scancels its jobs
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        states = _squeue_states(job_ids)
        if not {"PENDING", "RUNNING", "COMPLETING"} & set(states.values()):
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"jobs still active after cluster.close(): {states}")


# --- dhmc.sample(..., cluster="slurm") --------------------------------------------------------
# Tests of dhmc itself on the local Slurm go here (mark them @pytest.mark.slurm, request the
# ``local_slurm`` fixture, and reuse local_slurm_kwargs(tmp_path) for dhmc.cluster.slurm).


@pytest.mark.slurm
def test_dhmc_sample_runs_its_blocks_in_slurm_jobs(local_slurm, tmp_path):
    import jax.numpy as jnp
    import numpy as np

    import dhmc

    seen = set()
    stop = False

    def poll():
        while not stop:
            seen.update(_running_job_names())
            time.sleep(0.5)

    import threading

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    try:
        trace = dhmc.sample(lambda p: -0.5 * jnp.sum(p["x"] ** 2), init={"x": jnp.zeros(3)}, chains=64, draws=200,
                            warmup=200, seed=2, cluster="slurm", progress=False,
                            cluster_options={"log_directory": str(tmp_path), "local_directory": str(tmp_path)})
    finally:
        stop = True
        watcher.join(5)
    x = trace["posterior"]["x"].values.reshape(-1, 3)
    assert np.abs(x.mean(0)).max() < 0.1 and np.abs(x.std(0) - 1).max() < 0.1
    assert seen, "no Slurm job was seen RUNNING during the run"


def _running_job_names() -> set[str]:
    out = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True, timeout=10)
    return {line.split()[0] for line in out.stdout.splitlines() if line.endswith("RUNNING")}

"""dask-jobqueue against Slurm.

The job-script test needs only dask_jobqueue. The ``slurm``-marked tests need the single-node
Slurm on 127.0.0.1 from ``deploy/local-slurm/up.sh`` (stop it with ``down.sh``)::

    sudo deploy/local-slurm/up.sh && pytest -m slurm tests/distributed/test_slurm.py
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from held_model import HOLD, held_gaussian

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
    # With no controller, sinfo retries for ~9 s before it fails; ``scontrol ping`` says so at once (exit 1).
    if shutil.which("scontrol") is not None:
        ping = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=30)
        if ping.returncode != 0:
            said = (ping.stdout.strip() or ping.stderr.strip() or "no answer").splitlines()[0]
            pytest.skip(f"no Slurm controller answers ({said}): run deploy/local-slurm/up.sh")
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


# --- jobs lost to scancel, walltime or preemption ---------------------------------------------
# The runs' workers stall while HOLD exists (tests/held_model.py), so a job can be cancelled and replaced
# before the run ends on any machine, fast or loaded, with the draws unchanged.


def _job_states(name: str) -> dict[str, str]:
    """``{job id: state}`` of the jobs named ``name`` (ended ones too, while Slurm remembers them)."""
    out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i %T", "-n", name], capture_output=True, text=True,
                         timeout=30).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def _blocks_done(path) -> int:
    import zarr

    try:
        return int(zarr.open_group(str(path), mode="r")["dhmc/done"][...].sum())
    except Exception:  # noqa: BLE001 - not created yet
        return 0


def _sample_in_thread(store, job_name, tmp_path, outcome, **cluster_options):
    """``dhmc.sample`` of held_gaussian on 2 Slurm jobs named ``job_name``, in a thread; its end lands in
    ``outcome`` (``"at"``: when, ``"error"``: what it raised)."""
    import jax.numpy as jnp

    import dhmc

    opts = {"job_name": job_name, "log_directory": str(tmp_path / "logs"),
            "local_directory": str(tmp_path / "space"), **cluster_options}

    def run():
        try:
            dhmc.sample(held_gaussian, init={"x": jnp.zeros(2)}, chains=32, chains_per_task=16, draws=3200,
                        warmup=100, seed=4, progress=False, cluster="slurm", store=store, cluster_options=opts)
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            outcome["error"] = e
        outcome["at"] = time.monotonic()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _hold_and_scancel(store, job_name, thread, jobs=1) -> tuple[list[str], list[str]]:
    """Once a block is in the store, stall the workers and scancel ``jobs`` of the run's running jobs.

    Returns the ids of the jobs cancelled and of all the run's jobs at that time.
    """
    deadline = time.monotonic() + 180
    while _blocks_done(store) < 1 and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    open(HOLD, "w").close()
    running = sorted(i for i, state in _job_states(job_name).items() if state == "RUNNING")
    assert thread.is_alive() and len(running) >= jobs, (running, _blocks_done(store))
    subprocess.run(["scancel", *running[:jobs]], check=True, timeout=30)
    return running[:jobs], sorted(_job_states(job_name))


def _wait_for_new_job(job_name, before, thread, timeout=90) -> float:
    """Seconds until a job not in ``before`` is RUNNING."""
    start = time.monotonic()
    while thread.is_alive() and time.monotonic() < start + timeout:
        if any(job not in before and state == "RUNNING" for job, state in _job_states(job_name).items()):
            return time.monotonic() - start
        time.sleep(0.25)
    pytest.fail(f"no job replaced a cancelled one within {timeout} s: {before} -> {_job_states(job_name)}")


@pytest.mark.slurm
@pytest.mark.slow
def test_a_cancelled_job_is_replaced_and_the_draws_are_bitwise_unchanged(local_slurm, tmp_path, hold):
    import uuid

    import xarray as xr

    tag, outcome = uuid.uuid4().hex[:8], {}
    _sample_in_thread(tmp_path / "ref.zarr", f"dhmc-ref-{tag}", tmp_path, outcome).join(300)
    assert "at" in outcome and "error" not in outcome, outcome

    # distributed's default lost-worker-timeout (15 s) passes before the cluster gives up on the job
    name, store, outcome = f"dhmc-hit-{tag}", tmp_path / "hit.zarr", {}
    thread = _sample_in_thread(store, name, tmp_path, outcome)
    cancelled, before = _hold_and_scancel(store, name, thread)
    seconds = _wait_for_new_job(name, before, thread)
    print(f"job {cancelled[0]} cancelled; a new job RUNNING {seconds:.1f} s later")
    os.remove(hold)
    thread.join(240)
    assert not thread.is_alive(), "the run hangs after one of its jobs was cancelled"
    assert "error" not in outcome, repr(outcome.get("error"))
    assert len(set(_job_states(name)) - set(before)) == 1, (before, _job_states(name))

    ref, hit = (xr.open_datatree(p, engine="zarr", consolidated=False) for p in (tmp_path / "ref.zarr", store))
    for group in ("posterior", "sample_stats"):
        for var in ref[group].data_vars:
            assert np.array_equal(ref[group][var].values, hit[group][var].values), (group, var)


@pytest.mark.slurm
@pytest.mark.slow
def test_lost_jobs_are_not_replaced_past_the_budget_and_the_run_ends(local_slurm, tmp_path, hold):
    import uuid

    import dask

    import dhmc

    name, store, outcome = f"dhmc-budget-{uuid.uuid4().hex[:8]}", tmp_path / "lost.zarr", {}
    limits = {"distributed.deploy.lost-worker-timeout": "2s", "dhmc.no-workers-timeout": "5s"}
    with dask.config.set(limits):
        thread = _sample_in_thread(store, name, tmp_path, outcome, job_replacements=1)
        _, before = _hold_and_scancel(store, name, thread)
        _wait_for_new_job(name, before, thread)
        rest = sorted(job for job, state in _job_states(name).items() if state in ("RUNNING", "PENDING"))
        subprocess.run(["scancel", *rest], check=True, timeout=30)
        killed = time.monotonic()
        thread.join(120)
        after = _job_states(name)
    assert not thread.is_alive(), "the run hangs once its job replacements are spent"
    assert isinstance(outcome.get("error"), dhmc.NoWorkersError), repr(outcome.get("error"))
    assert outcome["at"] - killed < 45 and f"dhmc resume {store}" in str(outcome["error"])
    assert len(set(after) - set(before)) == 1, f"a job beyond the budget was submitted: {before} -> {after}"


def test_job_replacer_replaces_lost_jobs_until_its_budget_is_spent():
    """Without Slurm: the bookkeeping of JobReplacer.check on a stand-in for SLURMCluster."""
    from types import SimpleNamespace

    from dhmc.distributed.slurm import JobReplacer

    submitted = iter(range(100, 200))

    class Cluster:
        def __init__(self):
            self.worker_spec = {"a": {}, "b": {}}
            self.workers = {}

        def scale(self, jobs):
            assert jobs == len(self.worker_spec)
            for name in set(self.worker_spec) - set(self.workers):
                self.workers[name] = SimpleNamespace(job_id=str(next(submitted)))

    cluster = Cluster()
    replacer = JobReplacer(cluster, budget=2)
    replacer.check()  # jobs not submitted yet are not lost
    assert replacer.left == 2 and not cluster.workers
    cluster.scale(2)
    a, b = cluster.workers["a"].job_id, cluster.workers["b"].job_id
    replacer.check()
    assert replacer.left == 2 and replacer.replaced == []

    del cluster.workers["a"]  # what SpecCluster does lost-worker-timeout after the worker left
    replacer.check()
    assert replacer.replaced == [a] and replacer.left == 1 and cluster.workers["a"].job_id not in (a, b)
    replacer.check()  # the new job counts once
    assert replacer.left == 1

    lost = {cluster.workers.pop("a").job_id, cluster.workers.pop("b").job_id}
    replacer.check()  # one replacement left for two lost jobs: one is replaced, the other dropped
    assert replacer.replaced[0] == a and replacer.replaced[1] in lost and replacer.left == 0
    assert len(cluster.worker_spec) == 1 and set(cluster.workers) == set(cluster.worker_spec)

    replacer.check()  # sees the new job
    cluster.workers.clear()
    replacer.check()
    assert cluster.worker_spec == {} and cluster.workers == {} and replacer.left == 0


USER_MODULE = '''
import numpyro
import numpyro.distributions as dist


def regression(x, y=None):
    slope = numpyro.sample("slope", dist.Normal(0.0, 10.0))
    with numpyro.plate("point", x.shape[0]):
        numpyro.sample("y", dist.Normal(slope * x, 1.0), obs=y)
'''


@pytest.mark.slurm
@pytest.mark.slow
def test_a_users_module_runs_in_slurm_jobs_from_the_command_line(local_slurm, tmp_path):
    """What the sbatch driver runs: ``dhmc sample pkg.module:function --data`` with Slurm workers, which
    never import the user's module (it travels by value)."""
    import json
    import sys

    import numpy as np

    import dhmc

    (tmp_path / "usermodels.py").write_text(USER_MODULE)
    x = np.linspace(-1, 1, 20)
    (tmp_path / "points.json").write_text(json.dumps({"x": x.tolist(), "y": (2.0 * x).tolist()}))
    out = subprocess.run([sys.executable, "-m", "dhmc", "sample", "usermodels:regression", "--data", "points.json",
                          "--chains", "32", "--draws", "100", "--warmup", "100", "--cluster", "slurm",
                          "--cluster-option", f"log_directory={tmp_path}", "--cluster-option",
                          f"local_directory={tmp_path}", "--out", "reg.zarr", "--no-progress"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    slope = dhmc.open_trace(tmp_path / "reg.zarr")["posterior"]["slope"].values
    sd = 1.0 / np.sqrt(np.sum(x**2) + 1e-2)
    assert abs(slope.mean() - sd**2 * np.sum(2.0 * x**2)) < 5 * sd / np.sqrt(slope.size / 10)


# --- dhmc's Slurm defaults, without Slurm ---------------------------------------------------------------


@pytest.mark.parametrize("walltime, seconds", [("01:00:00", 3600), ("30", 1800), ("05:30", 330), ("2-12", 216000),
                                               ("1-02:30", 95400), ("1-00:00:10", 86410), ("UNLIMITED", None),
                                               ("INFINITE", None), (None, None), ("soon", None)])
def test_walltimes_in_every_slurm_format(walltime, seconds):
    from dhmc.distributed.slurm import lifetime_for, walltime_seconds

    assert walltime_seconds(walltime) == seconds
    lifetime = lifetime_for(walltime)
    if seconds is None:
        assert lifetime is None
    else:  # retire at the latest 20% (at most 3 minutes) before the walltime, staggered, never after it
        latest = lifetime[0] + lifetime[1]
        assert abs(latest - (seconds - min(180, 0.2 * seconds))) <= 1 and 0 < lifetime[1] < lifetime[0]


def test_slurm_options_use_tls_and_let_workers_announce_their_node(monkeypatch):
    from dhmc.distributed import network, slurm

    monkeypatch.setattr(network, "scheduler_host", lambda: "10.9.8.7")
    kwargs = slurm.slurm_options(scheduler_options={"dashboard_address": "127.0.0.1:0"},
                                 worker_extra_args=["--dashboard-address", "127.0.0.1:0"], walltime="01:00:00")
    assert kwargs["scheduler_options"] == {"dashboard_address": "127.0.0.1:0", "host": "10.9.8.7"}
    assert "--host" not in kwargs["worker_extra_args"]  # each worker: its own node's address
    assert kwargs["worker_extra_args"][2:] == ["--worker-class", "dhmc.distributed.network.SecureWorker",
                                               "--lifetime", "3300s", "--lifetime-stagger", "120s"]
    assert kwargs["security"] is not None and kwargs["security"].require_encryption

    # a user's {host: null, interface: ib0} (dask config merges dicts): no host of ours, the interface kept
    kwargs = slurm.slurm_options(scheduler_options={"host": None, "interface": "ib0"}, walltime=None)
    assert kwargs["scheduler_options"] == {"interface": "ib0"} and kwargs["security"] is not None
    assert "--lifetime" not in kwargs["worker_extra_args"]

    # a Slurm on loopback: TLS all the same (other users share loopback), workers on 127.0.0.1
    monkeypatch.setattr(network, "scheduler_host", lambda: "127.0.0.1")
    kwargs = slurm.slurm_options()
    assert kwargs["security"].require_encryption and kwargs["worker_extra_args"][:2] == ["--host", "127.0.0.1"]
    with pytest.raises(ValueError, match="security=False"):
        slurm.slurm_options(security=False, scheduler_options={"host": "10.9.8.7"})


def test_the_scheduler_listens_on_the_route_to_the_nodes():
    from dhmc.distributed.network import scheduler_host

    assert scheduler_host(["127.0.0.1", "localhost"]) == "127.0.0.1"  # a single-node Slurm on this machine
    assert scheduler_host([])  # no Slurm: the default route's address (or this host's), never an error


def test_importing_dask_jobqueue_keeps_the_callers_ctrl_c(tmp_path):
    script = """
import signal, threading
from dhmc.distributed.slurm import _slurm_cluster_class
handler = signal.getsignal(signal.SIGINT)
errors = []
def in_thread():
    try:
        _slurm_cluster_class()
    except Exception as e:
        errors.append(e)
t = threading.Thread(target=in_thread); t.start(); t.join()
assert not errors, errors
assert signal.getsignal(signal.SIGINT) is handler, signal.getsignal(signal.SIGINT)
_slurm_cluster_class()
assert signal.getsignal(signal.SIGINT) is handler
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "ok", done.stderr[-2000:]


PYMC_MODULE = '''
import numpy as np
import pymc as pm

x = np.linspace(-1, 1, 20)


def regression(slope):
    with pm.Model(coords={"point": range(20)}) as model:
        b = pm.Normal("b", 0.0, 10.0)
        pm.Normal("y", b * x, 1.0, observed=slope * x, dims="point")
    return model
'''


@pytest.mark.slow  # Slurm jobs that each import PyMC and compile the model: CI's slow suite runs it, Slurm up
@pytest.mark.slurm
@pytest.mark.parametrize("by_reference", [False, True], ids=["by-value", "by-reference"])
def test_a_pymc_model_runs_in_slurm_jobs_by_value_and_by_reference(local_slurm, tmp_path, by_reference):
    """Issue 28: a function returning a pm.Model, from the command line, sampled by Slurm workers: pickled (the
    workers compile the model), or by reference (each worker imports the module from the driver's directory,
    which the jobs share here, and calls it)."""
    pytest.importorskip("pymc")
    import json

    import dhmc

    (tmp_path / "pymcmodels.py").write_text(PYMC_MODULE)
    (tmp_path / "data.json").write_text(json.dumps({"slope": 2.0}))
    out = subprocess.run([sys.executable, "-m", "dhmc", "sample", "pymcmodels:regression", "--data", "data.json",
                          *(["--by-reference"] if by_reference else []), "--chains", "32", "--draws", "100",
                          "--warmup", "100", "--cluster", "slurm", "--cluster-option", f"log_directory={tmp_path}",
                          "--cluster-option", f"local_directory={tmp_path}", "--out", "reg.zarr", "--no-progress"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    tree = dhmc.open_trace(tmp_path / "reg.zarr")
    assert json.loads(tree.attrs["dhmc_run_spec"])["by_reference"] is by_reference
    b = tree["posterior"]["b"].values
    x = np.linspace(-1, 1, 20)
    sd = 1.0 / np.sqrt(np.sum(x**2) + 1e-2)
    assert b.dtype == np.float64 and abs(b.mean() - sd**2 * np.sum(2.0 * x**2)) < 5 * sd / np.sqrt(b.size / 10)

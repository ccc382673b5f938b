"""dhmc on a multi-node Slurm of network namespaces: default config, TLS, and a host crashed, cut off or timed out.

Each run samples ``held_gaussian`` on 3 one-core jobs (one per host). Its workers stall (in a callback
that adds zeros to the log density) while ``HOLD`` exists, so a fault lands mid-run on any machine, fast
or loaded. Every faulted run must end with a store bitwise identical to the undisturbed reference run:
no block lost or doubled. Times to recover are printed (``pytest -s`` or the ``-rA`` report shows them).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid

import dask
import numpy as np
import pytest
import zarr
from held_model import HOLD, held_gaussian
from tls_probe import pem_files, refused, stranger_context

import dhmc  # before any dask.config.set of dhmc's keys: leaving one made earlier drops dhmc's defaults

from . import netns

RUN = dict(chains=48, chains_per_task=16, draws=3200, warmup=100, seed=5)  # 3 chunks x 3 segments


def _held_host(multihost, timeout: float = 60) -> str:
    """A host whose worker is held inside a block (``c2`` when it is one): the one to strike."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held = [host for host in sorted(multihost.nodes) if os.path.exists(f"{HOLD}.{host}")]
        if held:
            return "c2" if "c2" in held else held[0]
        time.sleep(0.05)
    pytest.fail(f"no worker was held inside a block within {timeout} s")


def _options(tmp_path, name: str, **extra) -> dict:
    """dhmc's Slurm cluster options for a run: only what the test machine needs, nothing about addresses."""
    return {"jobs": 3, "job_name": name, "memory": "1GiB", "walltime": "00:10:00",
            "log_directory": str(tmp_path / "logs"), "local_directory": str(tmp_path / "space"), **extra}


def _sample(store, options, outcome) -> threading.Thread:
    """``dhmc.sample`` of held_gaussian on the multi-host Slurm in a thread; its end lands in ``outcome``."""
    import jax.numpy as jnp

    def run():
        try:
            dhmc.sample(held_gaussian, init={"x": jnp.zeros(2)}, progress=False, cluster="slurm", store=store,
                        cluster_options=options, **RUN)
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            outcome["error"] = e
        outcome["at"] = time.monotonic()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def _done(store) -> int:
    try:
        return int(zarr.open_group(str(store), mode="r")["dhmc/done"][...].sum())
    except Exception:  # noqa: BLE001 - not created yet
        return 0


def _hold_after_first_block(store, thread) -> None:
    deadline = time.monotonic() + 240
    while _done(store) < 1 and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    open(HOLD, "w").close()
    assert thread.is_alive() and _done(store) >= 1, ("the run ended or wrote nothing", _done(store))


def _where(store) -> tuple[np.ndarray, np.ndarray]:
    group = zarr.open_group(str(store), mode="r")["dhmc"]
    return group["host"][...], group["worker"][...]


def _assert_ended_as_undisturbed(thread, outcome, reference, store, fault: str) -> None:
    """The run in ``thread`` ended, without an error, with the reference run's draws."""
    assert not thread.is_alive(), f"the run hangs after {fault}"
    assert "error" not in outcome, repr(outcome.get("error"))
    _assert_same_draws(reference, store)


def _assert_same_draws(reference, store) -> None:
    import xarray as xr

    ref, hit = (xr.open_datatree(p, engine="zarr", consolidated=False) for p in (reference, store))
    for group in ("posterior", "sample_stats"):
        for var in ref[group].data_vars:
            assert np.array_equal(ref[group][var].values, hit[group][var].values), (group, var)
    done = zarr.open_group(str(store), mode="r")["dhmc/done"][...]
    assert done.all(), done  # no block lost; bitwise equal above: none written differently


def _report(capsys, line: str) -> None:
    with capsys.disabled():
        print(f"\n[multihost] {line}")


@pytest.fixture(scope="module")
def reference(multihost, tmp_path_factory):
    """The undisturbed run, on 3 hosts with dhmc's default Slurm config, and its wall time."""
    tmp = tmp_path_factory.mktemp("reference")
    store, outcome = tmp / "ref.zarr", {}
    setup = tmp / "setup_workers.py"  # dhmc.worker-setup on the Slurm workers: each notes its host
    setup.write_text(f"import socket, pathlib\npathlib.Path({str(tmp)!r}, 'setup-' + socket.gethostname()).touch()\n")
    start = time.monotonic()
    with dask.config.set({"dhmc.worker-setup": [str(setup)]}):
        _sample(store, _options(tmp, f"dhmc-ref-{uuid.uuid4().hex[:6]}"), outcome).join(400)
    assert "at" in outcome and "error" not in outcome, outcome
    assert {p.name for p in tmp.glob("setup-*")} == {f"setup-{host}" for host in multihost.nodes}
    return store, outcome["at"] - start


def test_a_run_spreads_over_three_hosts_with_the_default_config_over_tls(reference, multihost, capsys):
    """Every host ran blocks (and the worker set-up, checked by the fixture), each worker over TLS on its own IP."""
    store, seconds = reference
    hosts, workers = _where(store)
    assert set(hosts.ravel()) == set(multihost.nodes), hosts  # c1, c2, c3 each ran blocks
    ips = {w.split("://")[1].rsplit(":", 1)[0] for w in workers.ravel()}
    assert ips == set(multihost.nodes.values()), workers  # each worker announced its own host's address
    assert all(w.startswith("tls://") for w in workers.ravel()), workers
    import xarray as xr

    x = xr.open_datatree(store, engine="zarr", consolidated=False)["posterior"]["x"].values.reshape(-1, 2)
    assert np.abs(x.mean(0) - 1).max() < 0.05 and np.abs(x.std(0) - 1).max() < 0.05
    _report(capsys, f"undisturbed run on {sorted(set(hosts.ravel()))}: {seconds:.1f} s")


def test_the_scheduler_and_workers_refuse_a_client_or_worker_without_the_certificate(multihost, tmp_path):
    from distributed.security import Security

    from dhmc.distributed.connect import connect

    client, close = connect("slurm", _options(tmp_path, f"dhmc-tls-{uuid.uuid4().hex[:6]}", jobs=1))
    try:
        scheduler = client.scheduler.address
        (worker,) = client.scheduler_info()["workers"]
        assert scheduler.startswith(f"tls://{multihost.bridge_ip}:"), scheduler
        assert worker.split("://")[1].rsplit(":", 1)[0] in multihost.nodes.values(), worker
        for address in (scheduler, worker):  # the servers refuse: no certificate, another CA's, plain TCP
            assert refused(address, stranger_context()), address
            assert refused(address, stranger_context(Security.temporary())), address
            assert refused(address.replace("tls://", "tcp://"), None), address
            assert not refused(address, stranger_context(client.security)), address  # the run's own: accepted
        # a worker on another host that trusts the run's CA but shows another CA's certificate, or none, or
        # speaks plain TCP, is refused by the scheduler
        run_ca, foreign = pem_files(client.security)["ca"], pem_files(Security.temporary())
        attempts = {"foreign certificate": [scheduler, "--tls-ca-file", run_ca, "--tls-cert", foreign["cert"],
                                            "--tls-key", foreign["key"]],
                    "plain TCP": [scheduler.replace("tls://", "tcp://")]}
        for what, args in attempts.items():
            started = netns.run_in("c3", [sys.executable, "-m", "distributed.cli.dask_worker", *args, "--no-nanny",
                                          "--death-timeout", "8", "--nthreads", "1"], timeout=60)
            assert started.returncode != 0, (what, started.stderr[-2000:])
        assert len(client.scheduler_info()["workers"]) == 1
        assert client.submit(lambda: 41 + 1).result(timeout=30) == 42
    finally:
        close()


def test_a_crashed_host_is_survived_bitwise(reference, multihost, tmp_path, hold, capsys):
    store, outcome = tmp_path / "crash.zarr", {}
    thread = _sample(store, _options(tmp_path, f"dhmc-crash-{uuid.uuid4().hex[:6]}"), outcome)
    _hold_after_first_block(store, thread)
    victim = _held_host(multihost)
    netns.kill_host(victim)  # its slurmd, job, worker, mid-block: the kernel closes their sockets
    crashed = time.monotonic()
    os.remove(hold)
    thread.join(300)
    _assert_ended_as_undisturbed(thread, outcome, reference[0], store, "a host crashed")
    hosts, _ = _where(store)
    _report(capsys, f"host {victim} killed mid-block: its block re-run elsewhere, run ended "
                    f"{outcome['at'] - crashed:.1f} s after the crash (blocks per host: "
                    f"{ {h: int((hosts == h).sum()) for h in sorted(set(hosts.ravel()))} })")


def test_a_partitioned_host_is_survived_bitwise_and_its_stale_block_harms_nothing(reference, multihost, tmp_path,
                                                                                   hold, capsys):
    store, outcome = tmp_path / "partition.zarr", {}
    # detect a silent peer in 12 s, not distributed's default 30 s (the least it allows is 11 s)
    with dask.config.set({"distributed.comm.timeouts.tcp": "12s"}):
        thread = _sample(store, _options(tmp_path, f"dhmc-cut-{uuid.uuid4().hex[:6]}"), outcome)
        _hold_after_first_block(store, thread)
        victim = _held_host(multihost)
        open(f"{HOLD}.keep.{victim}", "w").close()  # the cut-off worker stays in its block after the others go on
        netns.cut(victim)
        cut = time.monotonic()
        os.remove(hold)
        thread.join(300)
    _assert_ended_as_undisturbed(thread, outcome, reference[0], store, "a host was cut off")

    # Still cut off, the stale worker now finishes its block and writes it over the finished store
    # (the filesystem is shared): the same bytes, each chunk replaced whole, no done flag touched.
    written = _last_write(store)
    os.remove(f"{HOLD}.keep.{victim}")
    deadline = time.monotonic() + 60
    while _last_write(store) <= written and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _last_write(store) > written, "the cut-off worker wrote nothing within 60 s"
    stale = time.monotonic() - cut
    netns.heal(victim)
    _assert_same_draws(reference[0], store)
    _report(capsys, f"host {victim} cut off mid-block: its block re-run elsewhere, run ended "
                    f"{outcome['at'] - cut:.1f} s after the cut; its stale block landed {stale:.1f} s after the cut")


def _last_write(store) -> float:
    """The newest modification time of a draws chunk in the store."""
    return max(p.stat().st_mtime for p in (store / "posterior" / "x" / "c").rglob("*") if p.is_file())


def test_a_job_at_its_walltime_retires_its_worker_and_is_replaced_bitwise(reference, multihost, tmp_path, hold,
                                                                            capsys):
    store, outcome, name = tmp_path / "walltime.zarr", {}, f"dhmc-wall-{uuid.uuid4().hex[:6]}"
    states: dict[str, set] = {}  # every state seen per job: Slurm forgets ended jobs after MinJobAge (10 s)
    watching = threading.Event()

    def watch():
        while not watching.is_set():
            for job, state in _jobs(name).items():
                states.setdefault(job, set()).add(state)
            time.sleep(0.5)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    # Slurm's shortest time limit is a minute: workers retire after 42-48 s (dhmc's --lifetime and stagger)
    with dask.config.set({"distributed.deploy.lost-worker-timeout": "2s"}):
        thread = _sample(store, _options(tmp_path, name, walltime="00:01:00"), outcome)
        _hold_after_first_block(store, thread)
        first = set(_jobs(name))
        deadline = time.monotonic() + 150
        while not (set(_jobs(name)) - first) and thread.is_alive() and time.monotonic() < deadline:
            time.sleep(0.25)  # held until a job ended and its replacement was submitted
        replaced = time.monotonic()
        new = set(_jobs(name)) - first
        os.remove(hold)
        thread.join(300)
    watching.set()
    watcher.join(5)
    assert new, f"no job replaced the first ones within 150 s: {_jobs(name)}"
    _assert_ended_as_undisturbed(thread, outcome, reference[0], store, "its jobs reached their walltime")
    ended = {job: states.get(job, set()) for job in first}
    assert not any("TIMEOUT" in seen for seen in ended.values()), ended  # none was killed by Slurm
    retired = [job for job in sorted(first) if "worker-lifetime-reached" in _job_log(tmp_path, name, job)]
    assert retired, (ended, {job: _job_log(tmp_path, name, job)[-1500:] for job in first})
    _report(capsys, f"walltime 1 min: the workers of jobs {retired} retired (--lifetime) and jobs {sorted(new)} "
                    f"replaced them; run ended {outcome['at'] - replaced:.1f} s after the first replacement")


def _job_log(tmp_path, name: str, job: str) -> str:
    path = tmp_path / "logs" / f"{name}-{job}.err"
    return path.read_text() if path.exists() else ""


def _jobs(name: str) -> dict[str, str]:
    out = subprocess.run(["squeue", "-h", "-t", "all", "-o", "%i %T", "-n", name], capture_output=True, text=True,
                         timeout=30).stdout
    return dict(line.split() for line in out.splitlines() if line.strip())


def test_weak_scaling_across_hosts_says_they_share_one_machine(multihost, tmp_path, capsys):
    import json

    out = tmp_path / "scale"
    done = subprocess.run([sys.executable, "-m", "dhmc.cli", "scale", "weak", "--workers", "1,2,3", "--cluster",
                           "slurm", "--chains-per-worker", "128", "--draws", "200", "--repeat", "1", "--out", str(out),
                           "--cluster-option", "memory=1GiB", "--cluster-option", f"log_directory={tmp_path}"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    study = json.loads((out / "scaling.json").read_text())
    hosts = [run["hosts"] for run in study["runs"]]
    assert [len(h) for h in hosts] == [1, 2, 3] and set(hosts[-1]) == set(multihost.nodes.values()), hosts
    assert {run["machines"] for run in study["runs"]} == {1}  # namespaces of one machine: the plot says so
    from dhmc.scaling.plot_data import subtitle as _subtitle

    assert "3 hosts share one machine's" in _subtitle([study])
    assert {p.name for p in out.glob("*.png")} == {"speedup.png", "efficiency.png", "time_per_chain.png"}
    _report(capsys, "weak scaling on 1, 2, 3 hosts: " + ", ".join(
        f"{run['workers']} -> {run['speedup']:.2f}x" for run in study["runs"]))

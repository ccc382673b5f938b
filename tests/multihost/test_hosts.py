"""The multi-host test rig itself (plain dask-jobqueue and sockets, no dhmc).

Needs the multi-host Slurm in network namespaces, as root::

    sudo deploy/local-slurm/up-multi.sh 3
    pytest -m multihost tests/multihost
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from . import netns

pytestmark = [pytest.mark.multihost, pytest.mark.slow]

QUEUE_WAIT = 60  # s, as in dask-jobqueue's own tests

# Run inside a host's namespace: connect to argv[1]:argv[2] within argv[3] s, say what happened.
CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("connected")
except TimeoutError:
    print("timeout")
except OSError as exc:
    print(f"error {exc!r}")
"""


def multihost_cluster_kwargs(env: netns.MultiHostEnv, tmp_path) -> dict:
    """SLURMCluster kwargs for the multi-host Slurm: one 1-core worker per job (one job fills a node),
    the scheduler on the bridge address that every host reaches, its dashboard on loopback only.
    Workers listen on all addresses of their host and report the one facing the scheduler (the
    host's IP), so they need no ``--host``/``--interface``."""
    return dict(
        cores=1,
        processes=1,
        memory="1GiB",
        walltime="00:10:00",
        python=sys.executable,
        scheduler_options={"host": env.bridge_ip, "dashboard_address": "127.0.0.1:0"},
        local_directory=str(tmp_path / "worker-space"),
        log_directory=str(tmp_path / "slurm-logs"),
        death_timeout=60,
    )


def _connect_from(host: str, ip: str, port: int, timeout: float = 2.0) -> tuple[str, float]:
    """Connect from inside ``host`` to ``ip:port``; return (outcome, seconds taken)."""
    t0 = time.monotonic()
    res = netns.run_in(host, [sys.executable, "-c", CONNECT, ip, str(port), str(timeout)], timeout=timeout + 30)
    return (res.stdout.strip() or f"rc={res.returncode} {res.stderr.strip()}"), time.monotonic() - t0


def test_three_jobs_land_on_three_hosts(multihost, tmp_path):
    """One worker job per node: each worker runs on its own host (IP and hostname)."""
    dask_jobqueue = pytest.importorskip("dask_jobqueue")
    from distributed import Client
    from distributed.comm import get_address_host

    n = len(multihost.nodes)
    with dask_jobqueue.SLURMCluster(**multihost_cluster_kwargs(multihost, tmp_path)) as cluster:
        assert cluster.scheduler_address.startswith(f"tcp://{multihost.bridge_ip}:")
        with Client(cluster) as client:
            cluster.scale(jobs=n)
            client.wait_for_workers(n, timeout=QUEUE_WAIT)
            workers = client.scheduler_info(n_workers=-1)["workers"]
            assert sorted(get_address_host(a) for a in workers) == sorted(multihost.nodes.values())
            names = client.run(socket.gethostname)
            assert sorted(names.values()) == sorted(multihost.nodes)
            for addr, name in names.items():  # hostname and IP belong to the same host
                assert get_address_host(addr) == multihost.nodes[name]


def test_cut_link_times_out_and_heal_restores(multihost):
    """``cut`` is a silent partition (a connect hangs until its timeout); ``heal`` undoes it at once."""
    host = "c2" if "c2" in multihost.nodes else next(iter(multihost.nodes))
    with socket.create_server((multihost.bridge_ip, 0), backlog=16) as server:
        port = server.getsockname()[1]
        assert _connect_from(host, multihost.bridge_ip, port)[0] == "connected"

        netns.cut(host)
        assert netns.is_cut(host)
        outcome, took = _connect_from(host, multihost.bridge_ip, port, timeout=2.0)
        assert outcome == "timeout", outcome
        assert took >= 2.0
        others = [h for h in multihost.nodes if h != host]
        if others:  # only that host is cut off
            assert _connect_from(others[0], multihost.bridge_ip, port)[0] == "connected"

        netns.heal(host)
        assert not netns.is_cut(host)
        assert _connect_from(host, multihost.bridge_ip, port)[0] == "connected"


def _job_state(job: str) -> str:
    res = subprocess.run(
        ["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=30
    )
    return res.stdout.strip()


def test_kill_host_then_restart(multihost):
    """``kill_host`` ends every process of the host (slurmd, the job's processes); ``restart_host``
    brings its slurmd back, the node answers again and is idle once the dead job is cancelled."""
    host = sorted(multihost.nodes)[-1]
    job = (
        subprocess.run(
            ["sbatch", "--parsable", "-w", host, "-o", "/dev/null", "--wrap", "sleep 600"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        .stdout.strip()
        .split(";")[0]
    )
    try:
        deadline = time.monotonic() + 30
        while not any(netns._comm(p) == "sleep" for p in netns.host_pids(host)):
            assert time.monotonic() < deadline, f"job {job} never started its sleep on {host}"
            time.sleep(0.2)

        netns.kill_host(host)
        assert netns.host_pids(host) == []
        assert not netns.slurmd_running(host)

        netns.restart_host(host)
        assert netns.slurmd_running(host)
        states = netns.wait_nodes(multihost, netns.HEALTHY, timeout=30)  # answering again: no "*"
        assert states[host] in netns.HEALTHY, states
        # a job younger than ~20 s stays RUNNING in Slurm's view until cancelled (see restart_host)
        subprocess.run(["scancel", job], capture_output=True, timeout=30, check=True)
        states = netns.wait_nodes(multihost, {"idle"}, timeout=30)
        assert states[host] == "idle", states
        assert _job_state(job) in ("NODE_FAIL", "CANCELLED", ""), _job_state(job)  # "": purged
    finally:
        subprocess.run(["scancel", job], capture_output=True, timeout=30)

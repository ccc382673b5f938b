"""Helpers for tests on the multi-host Slurm of ``deploy/local-slurm/up-multi.sh``.

That script makes N compute "hosts" ``c1..cN`` as Linux network namespaces on the bridge ``dhmcbr0``
(10.77.0.1 in the root namespace, where pytest and the Dask scheduler run), each with its own slurmd,
and a slurmctld in the namespace ``dhmc-head``. The helpers here read its address file and inject
host-level faults: cut a host's link (a silent partition), kill a host (a crash), bring it back.

Everything is plain ``subprocess``; the fault helpers need root (or passwordless ``sudo -n``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
START_NODE = REPO / "deploy" / "local-slurm" / "start-node.sh"
#: Slurm node states (``sinfo %T``) of a node that answers and can run jobs.
HEALTHY = frozenset({"idle", "mixed", "allocated"})


def state_dir() -> Path:
    """The state dir of up-multi.sh: ``$DHMC_MULTI_DIR``, default ``/tmp/dhmc-multi-slurm``."""
    return Path(os.environ.get("DHMC_MULTI_DIR", "/tmp/dhmc-multi-slurm"))


@dataclass(frozen=True)
class MultiHostEnv:
    """Addresses of the multi-host Slurm, read from ``<state dir>/hosts.env``.

    ``nodes`` maps node name (also the namespace and hostname, ``c1``...) to its IP; ``bridge_ip`` is
    the root namespace's address on the bridge, the one a Dask scheduler must listen on.
    """

    state_dir: Path
    slurm_conf: str
    partition: str
    bridge: str
    bridge_ip: str
    head_ns: str
    head_ip: str
    nodes: dict[str, str] = field(default_factory=dict)

    @staticmethod
    def port(host: str) -> str:
        """Name of the bridge port (host side of the veth) of ``host``: ``v-c2`` for ``c2``."""
        return f"v-{host}"


def _root(argv: list[str]) -> list[str]:
    """``argv``, prefixed with ``sudo -n`` unless we are root."""
    return argv if os.geteuid() == 0 else ["sudo", "-n", *argv]


def _run(argv: list[str], timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(_root(argv), capture_output=True, text=True, timeout=timeout, check=check)


def read_hosts_env(directory: Path | None = None) -> MultiHostEnv | None:
    """Parse ``hosts.env`` (KEY=VALUE lines) of up-multi.sh; None when it is missing."""
    directory = directory or state_dir()
    try:
        text = (directory / "hosts.env").read_text()
    except FileNotFoundError:
        return None
    kv: dict[str, str] = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith("#"):
            key, value = line.split("=", 1)
            kv[key.strip()] = value.strip().strip('"')
    names = kv.get("NODES", "").split()
    return MultiHostEnv(
        state_dir=directory,
        slurm_conf=kv["SLURM_CONF"],
        partition=kv.get("PARTITION", "multi"),
        bridge=kv.get("BRIDGE", "dhmcbr0"),
        bridge_ip=kv.get("BRIDGE_IP", "10.77.0.1"),
        head_ns=kv.get("HEAD_NS", "dhmc-head"),
        head_ip=kv.get("HEAD_IP", "10.77.0.2"),
        nodes={n: kv[f"NODE_{n}"] for n in names},
    )


def node_states(env: MultiHostEnv | None = None, timeout: float = 10) -> dict[str, str]:
    """``{node: state}`` from ``sinfo`` with the multi-host config (``idle``, ``allocated``, ``down*``...).

    Empty when up-multi.sh's state file is missing or slurmctld does not answer within ``timeout``.
    """
    env = env or read_hosts_env()
    if env is None or shutil.which("sinfo") is None:
        return {}
    try:
        res = subprocess.run(
            ["sinfo", "-h", "-N", "-p", env.partition, "-o", "%N %T"],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**os.environ, "SLURM_CONF": env.slurm_conf},
        )
    except subprocess.TimeoutExpired:
        return {}
    if res.returncode != 0:
        return {}
    return dict(line.split()[:2] for line in res.stdout.splitlines() if len(line.split()) >= 2)


def multihost_env(timeout: float = 5) -> MultiHostEnv | None:
    """The multi-host Slurm's addresses, or None unless it is up: state file present and every node
    answering (idle, mixed or allocated) in ``sinfo`` within ``timeout`` seconds."""
    env = read_hosts_env()
    if env is None or not env.nodes:
        return None
    states = node_states(env, timeout=timeout)
    if set(states) != set(env.nodes) or not set(states.values()) <= HEALTHY:
        return None
    return env


def cut(host: str) -> None:
    """Partition ``host`` from everything else: its bridge port goes down, so its packets vanish (no
    RST, no FIN, no ICMP from a peer). Established connections hang until TCP's own timeouts
    (``distributed.comm.timeouts.tcp``); a new connection to or from it times out, or fails with
    EHOSTUNREACH once ARP gives up (about 3 s), as on a real LAN whose peer vanished. Undo with :func:`heal`.
    """
    _run(["ip", "link", "set", MultiHostEnv.port(host), "down"])


def heal(host: str, timeout: float = 5) -> None:
    """Undo :func:`cut`: bring ``host``'s bridge port up, wait (bounded) for carrier on both ends, and
    flush neighbour entries that failed or were half-resolved during the cut (otherwise a connect in
    the first second after healing can still fail with EHOSTUNREACH)."""
    _run(["ip", "link", "set", MultiHostEnv.port(host), "up"])
    deadline = time.monotonic() + timeout
    while "LOWER_UP" not in _run(["ip", "-n", host, "-o", "link", "show", "eth0"], check=False).stdout:
        if time.monotonic() > deadline:
            raise RuntimeError(f"eth0 of {host} has no carrier {timeout} s after healing its link")
        time.sleep(0.05)
    env = read_hosts_env()
    namespaces = {host} | (set(env.nodes) | {env.head_ns} if env else set())
    stale = ["nud", "failed", "nud", "incomplete"]
    for ns in sorted(namespaces):
        _run(["ip", "-n", ns, "neigh", "flush", "dev", "eth0", *stale], check=False)
    _run(["ip", "neigh", "flush", "dev", env.bridge if env else "dhmcbr0", *stale], check=False)


def is_cut(host: str) -> bool:
    """Whether ``host``'s bridge port is administratively down."""
    out = _run(["ip", "-o", "link", "show", MultiHostEnv.port(host)]).stdout
    flags = out.split("<", 1)[1].split(">", 1)[0].split(",") if "<" in out else []
    return "UP" not in flags


def host_pids(host: str) -> list[int]:
    """PIDs of every process in ``host``'s network namespace (slurmd, job steps, Dask workers...)."""
    res = _run(["ip", "netns", "pids", host], check=False)
    return [int(p) for p in res.stdout.split()]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def slurmd_running(host: str) -> bool:
    """Whether a slurmd runs in ``host``'s namespace."""
    return any(_comm(p) == "slurmd" for p in host_pids(host))


def kill_host(host: str, timeout: float = 10) -> None:
    """Crash ``host``: SIGKILL every process in its namespace (slurmd, its job steps and jobs), and wait
    (bounded) until none is left. The kernel closes their sockets, so peers see resets, not silence.
    Slurm marks the node DOWN after ``SlurmdTimeout`` (30 s); :func:`restart_host` brings it back."""
    deadline = time.monotonic() + timeout
    while pids := host_pids(host):
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {pids} in namespace {host} survive SIGKILL")
        for pid in pids:
            if os.geteuid() != 0:
                _run(["kill", "-9", str(pid)], check=False)
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def restart_host(host: str) -> None:
    """Start ``host``'s slurmd again, exactly as up-multi.sh does (``deploy/local-slurm/start-node.sh``).
    A no-op when its slurmd runs. The node registers at once and, with ``ReturnToService=2``, is
    usable again even if Slurm had already set it DOWN.

    Jobs that ran on the killed host: Slurm ends those older than about 20 s (``BatchStartTimeout``
    plus ``MessageTimeout``) with NODE_FAIL when the new slurmd registers; a younger one stays
    RUNNING in Slurm's view (holding the node) until it is cancelled, or until the node's next
    periodic registration, minutes later. dask-jobqueue cancels its jobs when the cluster closes.
    """
    res = subprocess.run(
        _root(["env", f"DHMC_MULTI_DIR={state_dir()}", str(START_NODE), host]),
        capture_output=True,
        text=True,
        timeout=30,
    )
    if res.returncode != 0:
        raise RuntimeError(f"start-node.sh {host} failed: {res.stderr.strip() or res.stdout.strip()}")


def wait_nodes(
    env: MultiHostEnv, states: frozenset[str] | set[str] = frozenset({"idle"}), timeout: float = 60
) -> dict[str, str]:
    """Poll ``sinfo`` until every node's state is in ``states``; return the last ``{node: state}``
    seen (which may not satisfy it when ``timeout`` ran out)."""
    deadline = time.monotonic() + timeout
    while True:
        seen = node_states(env, timeout=min(10.0, max(1.0, deadline - time.monotonic())))
        if set(seen) == set(env.nodes) and set(seen.values()) <= set(states):
            return seen
        if time.monotonic() > deadline:
            return seen
        time.sleep(0.5)


def resume(host: str, env: MultiHostEnv | None = None) -> None:
    """``scontrol update NodeName=host State=RESUME``: put a DOWN or drained node back into service.

    Needed after a long :func:`cut`: once Slurm has set the node DOWN (about 40 s after the cut with
    ``SlurmdTimeout=30``) it stops pinging it, and only its periodic registration request (every
    20 pings, about 200 s) would bring it back by itself after :func:`heal`. A restarted slurmd
    registers at once, so after :func:`restart_host` this is not needed.
    """
    env = env or read_hosts_env()
    if env is None:
        raise RuntimeError(f"no {state_dir()}/hosts.env: is the multi-host Slurm up?")
    _run(["env", f"SLURM_CONF={env.slurm_conf}", "scontrol", "update", f"NodeName={host}", "State=RESUME"], check=False)


def _squeue_jobs(env: MultiHostEnv, host: str) -> list[str]:
    res = subprocess.run(
        ["squeue", "-h", "-w", host, "-o", "%i"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "SLURM_CONF": env.slurm_conf},
    )
    return res.stdout.split() if res.returncode == 0 else []


def repair(env: MultiHostEnv, timeout: float = 60) -> dict[str, str]:
    """Undo every fault: heal all cut links, restart every host whose slurmd is gone, resume nodes
    Slurm set DOWN or drained meanwhile, then wait (bounded) for all nodes to be idle. Returns the
    last ``{node: state}`` seen."""
    for host in env.nodes:
        if is_cut(host):
            heal(host)
    for host in env.nodes:
        if not slurmd_running(host):
            restart_host(host)
            # its jobs died with it; Slurm may still count them as running (see restart_host)
            for job in _squeue_jobs(env, host):
                _run(["env", f"SLURM_CONF={env.slurm_conf}", "scancel", job], check=False)
    for host, state in node_states(env).items():
        if state.rstrip("*~#!%$@^-+") not in HEALTHY and not state.startswith("completing"):
            resume(host, env)
    return wait_nodes(env, frozenset({"idle"}), timeout=timeout)


def run_in(host: str, argv: list[str], timeout: float = 30) -> subprocess.CompletedProcess:
    """Run ``argv`` inside ``host``'s network namespace (``ip netns exec``): it binds and connects
    from that host's IP, and resolves c1.., head and root through its hosts file."""
    return _run(["ip", "netns", "exec", host, *argv], timeout=timeout, check=False)

"""Where a cluster dhmc starts listens, and its TLS: plain TCP on loopback, TLS with per-run certificates beyond.

A scheduler reachable from other hosts accepts anyone who can reach it and runs what they submit; so
any cluster dhmc starts that listens beyond 127.0.0.1 uses TLS, with certificates made for the run
(:meth:`distributed.security.Security.temporary`), unless the user gives a ``Security`` of their own.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shutil
import socket
import subprocess

__all__ = ["is_loopback", "route_to", "slurm_controller", "scheduler_host", "security_for", "security_env"]


def is_loopback(host: str | None) -> bool:
    """Whether ``host`` (an address or name) is on this machine's loopback only; None or ``""`` mean all interfaces."""
    if not host:
        return False
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def route_to(host: str) -> str:
    """This machine's address on the route to ``host`` (no packet is sent); ``127.0.0.1`` for loopback."""
    address = socket.gethostbyname(host)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((address, 6817))
        return sock.getsockname()[0]


_CONTROLLER = re.compile(r"^SlurmctldHost\[0\]\s*=\s*([^\s(]+)(?:\(([^)]+)\))?", re.M)


def slurm_controller() -> str | None:
    """The Slurm controller's address (or name) from ``scontrol show config``; None without Slurm."""
    scontrol = shutil.which("scontrol")
    if scontrol is None:
        return None
    try:
        out = subprocess.run([scontrol, "show", "config"], capture_output=True, text=True, timeout=15).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = _CONTROLLER.search(out)
    return (found.group(2) or found.group(1)) if found else None


def scheduler_host() -> str:
    """Where a Slurm cluster's scheduler listens: this machine's address on the route to the Slurm controller.

    Every node of a Slurm cluster reaches its controller, so the submitting host's address on that
    network is one the nodes reach too (a single-node Slurm on loopback gives ``127.0.0.1``). Without
    ``scontrol``, the address of the default route.
    """
    controller = slurm_controller()
    try:
        return route_to(controller or "192.0.2.1")  # TEST-NET-1: any address off this machine takes the default route
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def security_for(host: str | None, security=None):
    """The user's ``security``, else None on loopback, else per-run certificates (``Security.temporary()``)."""
    if security is not None or is_loopback(host):
        return security
    from distributed.security import Security

    return Security.temporary()


def security_env(security, folder: str) -> dict:
    """Environment that makes a ``dask spec`` worker process use ``security`` (files written to ``folder``).

    A worker's default ``Security()`` reads dask config, which environment variables set; the
    in-memory certificate and key of ``Security.temporary()`` go to files only this user can read.
    """
    tls = security.get_tls_config_for_role("worker")
    names = {"ca_file": "ca", "cert": "worker-cert", "key": "worker-key"}
    env = {"DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True"}
    os.makedirs(folder, mode=0o700, exist_ok=True)
    for key, value in tls.items():
        if value is None or key not in names:
            continue
        if "\n" in value:  # the text itself, not a path
            path = os.path.join(folder, names[key] + ".pem")
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
                f.write(value)
            value = path
        config_key = "CA_FILE" if key == "ca_file" else f"WORKER__{key.upper()}"
        env[f"DASK_DISTRIBUTED__COMM__TLS__{config_key}"] = value
    return env

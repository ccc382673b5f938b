"""Where a cluster dhmc starts listens, and its TLS: per-run certificates that every peer must show.

A Dask scheduler runs what any client that reaches it submits (``Client.run``), and loopback is
reached by every user of the machine (a shared login node), so every cluster dhmc starts uses
mutual TLS with certificates made for the run (:meth:`distributed.security.Security.temporary`),
whose files only this user can read, unless the user gives a ``Security`` of their own. The
workers' HTTP endpoints (``/metrics``, ``/health``) follow the same rule (:class:`SecureWorker`).
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import subprocess

from distributed import Worker

__all__ = ["is_loopback", "route_to", "slurm_nodes", "scheduler_host", "security_for", "security_env",
           "SecureWorker", "SECURE_WORKER"]


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


def slurm_nodes() -> list[str]:
    """The addresses (``NodeAddr``) of the Slurm cluster's nodes, from ``sinfo``; empty without Slurm."""
    sinfo = shutil.which("sinfo")
    if sinfo is None:
        return []
    try:
        out = subprocess.run([sinfo, "-h", "-N", "-o", "%o"], capture_output=True, text=True, timeout=15).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return list(dict.fromkeys(line.strip() for line in out.splitlines() if line.strip()))


def scheduler_host(nodes: list[str] | None = None) -> str:
    """Where a Slurm cluster's scheduler listens: this machine's address on the route to the compute nodes.

    The route to a node gives the submitting host's address on the network the nodes are on; only
    when every node is on loopback (a single-node Slurm on this machine) is it ``127.0.0.1``. Without
    ``sinfo``, the address of the default route.
    """
    nodes = slurm_nodes() if nodes is None else nodes
    routes = []
    for node in nodes:
        try:
            routes.append(route_to(node))
        except OSError:
            continue
    outside = [r for r in routes if not ipaddress.ip_address(r).is_loopback]
    if outside:
        return outside[0]
    if routes:
        return "127.0.0.1"
    try:
        return route_to("192.0.2.1")  # TEST-NET-1: an address off this machine takes the default route
    except OSError:
        return socket.gethostbyname(socket.gethostname())


def security_for(host: str | None = None, security=None):
    """The user's ``security``, else per-run certificates (``Security.temporary()``), on loopback too.

    ``host`` only names where the cluster listens, for the error without the cryptography package.
    """
    if security is False:
        raise ValueError("security=False: give a distributed.security.Security, or None for dhmc's default "
                         "(mutual TLS with per-run certificates)")
    if security is not None:
        return security
    from distributed.security import Security

    try:
        return Security.temporary()
    except ImportError:
        from dhmc.errors import ClusterError

        raise ClusterError(f"the cluster on {host or 'every interface'} needs TLS certificates, made with the "
                           "cryptography package: pip install cryptography") from None


def security_env(security, folder: str) -> dict:
    """Environment that makes a ``dask spec`` worker process use ``security`` (files written to ``folder``).

    A worker's default ``Security()`` reads dask config, which environment variables set; the
    in-memory certificate and key of ``Security.temporary()`` go to files only this user can read.
    """
    tls = security.get_tls_config_for_role("worker")
    names = {"ca_file": "ca", "cert": "worker-cert", "key": "worker-key"}
    env = {"DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": str(bool(security.require_encryption))}
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


class SecureWorker(Worker):
    """A ``distributed.Worker`` whose HTTP endpoints follow its comms' security.

    With TLS required, its HTTP server speaks HTTPS and asks for a certificate of the run's
    authority, as the worker's comms do; a plain ``distributed.Worker`` serves ``/metrics`` and
    ``/health`` in plain HTTP to anyone who reaches its address.
    """

    def start_http_server(self, routes, dashboard_address, default_port=0, ssl_options=None):
        if ssl_options is None and self.security.require_encryption:
            ssl_options = self.security.get_listen_args("worker").get("ssl_context")
        return super().start_http_server(routes, dashboard_address, default_port, ssl_options)


SECURE_WORKER = f"{SecureWorker.__module__}.{SecureWorker.__qualname__}"

"""Probe a Dask server as a stranger would: does it refuse a peer without the run's certificate?

The probing client never checks the server's certificate, so a refusal is the server's own doing
(a client verifying the server would give up first, and prove nothing about the server).
"""

from __future__ import annotations

import asyncio
import os
import ssl
import tempfile

_FILES = tempfile.TemporaryDirectory(prefix="dhmc-tls-probe-")  # removed when the test process ends


def pem_files(security, role: str = "worker") -> dict:
    """``{"ca", "cert", "key"}`` file paths of ``security``'s ``role`` (in-memory PEM texts written to files)."""
    folder = tempfile.mkdtemp(dir=_FILES.name)
    files = {}
    for key, value in security.get_tls_config_for_role(role).items():
        if value is None or key not in ("ca_file", "cert", "key"):
            continue
        if "\n" in value:
            path = os.path.join(folder, f"{key}.pem")
            with open(path, "w") as f:
                f.write(value)
            value = path
        files[{"ca_file": "ca", "cert": "cert", "key": "key"}[key]] = value
    return files


def stranger_context(security=None) -> ssl.SSLContext:
    """A TLS client context that trusts any server and shows ``security``'s worker certificate (None: none)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if security is not None:
        files = pem_files(security)
        context.load_cert_chain(files["cert"], files["key"])
    return context


def refused(address: str, context: ssl.SSLContext | None) -> bool:
    """Whether the server at ``address`` refuses to answer ``identity`` over a comm made with ``context``."""
    from distributed.comm import connect

    async def attempt():
        args = {"ssl_context": context, "require_encryption": True} if context is not None else {}
        comm = await connect(address, timeout=3, **args)
        try:
            await comm.write({"op": "identity"})
            await asyncio.wait_for(comm.read(), 3)
        finally:
            comm.abort()

    try:
        asyncio.run(attempt())
    except Exception:  # noqa: BLE001 - any failure to talk is a refusal
        return True
    return False


def http_status(url: str, context: ssl.SSLContext | None = None) -> int | None:
    """The HTTP status of GET ``url`` (over ``context`` for https), None where the server refused to talk."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as response:
            return response.status
    except urllib.error.HTTPError as e:
        return e.code
    except Exception:  # noqa: BLE001 - a reset, a failed handshake, a plain answer to TLS: a refusal
        return None


def worker_http_ports(client) -> dict:
    """``{worker address: port of its HTTP server}``."""
    return {address: info["services"]["dashboard"] for address, info in client.scheduler_info()["workers"].items()}


def health_answers(host: str, port: int, security) -> tuple:
    """The HTTP status of a worker's ``/health`` over plain HTTP, over TLS without a certificate, and over TLS with
    ``security``'s (None where refused): ``(None, None, 200)`` for endpoints that follow the run's comms."""
    health = f"https://{host}:{port}/health"
    return (http_status(health.replace("https", "http")), http_status(health, stranger_context()),
            http_status(health, stranger_context(security)))

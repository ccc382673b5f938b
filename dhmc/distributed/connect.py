"""Turn the user's ``cluster=`` argument into a ``Client``: start the cluster of a kind, or reach a given one.

``connect(cluster)`` returns a ``Client`` and a closer; dhmc closes only what it started.
"""

from __future__ import annotations

import logging
import re
from contextlib import suppress
from pathlib import Path

import dask.config
from distributed import Client, SpecCluster
from distributed.deploy.cluster import Cluster

from dhmc.distributed import config
from dhmc.distributed.cuda import cuda_cluster
from dhmc.distributed.embedded import local_cluster
from dhmc.distributed.slurm import slurm_cluster
from dhmc.errors import ClusterError

__all__ = ["connect", "KINDS"]

KINDS = ("local", "cuda", "slurm")


def expected_workers(cluster) -> int:
    """How many workers a cluster dhmc started will have."""
    if isinstance(cluster, SpecCluster) and cluster.worker_spec:
        return len(cluster.worker_spec)
    return 1


_ADDRESS = re.compile(r"^(tcp|tls|inproc|ucx|ws|wss)://|^[\w.\-]+:\d+$")


def connect(cluster=None, options: dict | None = None):
    """Return ``(client, close)`` for a cluster spec.

    ``cluster`` is None or ``"local"`` (embedded), ``"cuda"``, ``"slurm"``, a scheduler address,
    a ``Client`` or a ``Cluster``. ``close()`` shuts down only what this call started.
    """
    _drop_interrupt_race()
    if isinstance(cluster, Client):
        return cluster, lambda: None
    if isinstance(cluster, Cluster):
        client = Client(cluster, set_as_default=False)
        return client, client.close
    if cluster is None or cluster in KINDS:
        kind = cluster or "local"
        builder = {"local": local_cluster, "cuda": cuda_cluster, "slurm": slurm_cluster}[kind]
        opts = config.cluster_options(kind, options)
        # A block that killed this many workers ends the run (WorkerCrashError) instead of being retried,
        # and blocks fail once the cluster has had no worker for this long (NoWorkersError), never hang
        limits = {"distributed.scheduler.allowed-failures": max(0, int(config.get("worker-crashes")) - 1),
                  "distributed.scheduler.no-workers-timeout": config.get("no-workers-timeout")}
        with dask.config.set(limits):
            try:
                started = builder(**opts)
            except ClusterError:  # dhmc's own: says what to do already
                raise
            except (RuntimeError, OSError) as e:  # Dask's "Cluster failed to start" hides what failed
                raise ClusterError(f"the {kind} cluster failed to start: {_causes(e)}") from e
        client = Client(started, set_as_default=False)
        n = opts.get("jobs") if kind == "slurm" else expected_workers(started)
        try:
            client.wait_for_workers(n or 1, timeout=300 if kind == "slurm" else 120)
        except Exception:
            _close(client, started)
            raise
        return client, lambda: _close(client, started)
    if isinstance(cluster, str) and _ADDRESS.search(cluster):
        timeout = config.get("connect-timeout")
        try:
            client = Client(cluster, timeout=timeout, set_as_default=False)
        except (OSError, TimeoutError) as e:
            raise ClusterError(f"cannot reach the scheduler at {cluster} within {timeout} s ({e})") from None
        return client, client.close
    raise ValueError(f"cluster must be None, one of {', '.join(KINDS)}, a scheduler address, a Client or a "
                     f"Cluster; got {cluster!r}")


class _InterruptRace(logging.Filter):
    """Drop the ``NameError`` that Distributed's ``sync`` logs when Ctrl-C comes before its future exists.

    ``distributed.utils.sync`` answers ``KeyboardInterrupt`` by scheduling ``cancel()``, which reads a
    ``future`` assigned only once the coroutine has started; interrupted in between, the event loop logs a
    traceback for a call that had nothing to cancel. The interrupt itself is raised and handled as always.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if not isinstance(error, NameError) or error.__traceback__ is None:
            return True
        last = error.__traceback__
        while last.tb_next is not None:
            last = last.tb_next
        code = last.tb_frame.f_code
        return not (code.co_name == "cancel" and Path(code.co_filename).parts[-2:] == ("distributed", "utils.py"))


def _drop_interrupt_race() -> None:
    """Install :class:`_InterruptRace` on Tornado's callback logger, once."""
    logger = logging.getLogger("tornado.application")
    if not any(isinstance(f, _InterruptRace) for f in logger.filters):
        logger.addFilter(_InterruptRace())


def _causes(error: BaseException) -> str:
    """An error's message followed by those of the errors that caused it: ``"a: b: OSError: [Errno 98] ..."``."""
    parts, seen = [], set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        text = str(error).rstrip(".") or type(error).__name__
        if isinstance(error, OSError) and parts:
            text = f"{type(error).__name__}: {text}"
        if not any(text in part for part in parts):  # Dask repeats the message of the error it wraps
            parts.append(text)
        error = error.__cause__ or error.__context__
    return ": ".join(parts)


def _close(client, cluster):
    """Close what dhmc started, quietly: connections dropped while shutting down are not news."""
    loggers = [logging.getLogger(name) for name in ("distributed", "tornado", "asyncio")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        with suppress(Exception):
            client.close()
        with suppress(Exception):
            cluster.close()
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)

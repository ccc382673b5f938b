"""The embedded cluster: an in-process scheduler and one pinned ``dask spec`` worker process per core.

The driver supervises the worker processes itself: it restarts one that dies and keeps a
:class:`WorkerDeath` record of it, with the last lines it wrote, for crash reports.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import time
import weakref
from contextlib import suppress
from dataclasses import dataclass

from distributed import Scheduler, SpecCluster
from distributed.core import Status
from distributed.deploy.subprocess import SubprocessWorker
from tornado import web

from dhmc.distributed import network
from dhmc.distributed.child import remove_orphaned_folders, temporary_prefix

__all__ = ["local_cluster", "EmbeddedCluster", "DashboardOnDemand", "PinnedWorker", "WorkerDeath", "available_cores"]


@dataclass(frozen=True)
class WorkerDeath:
    """An embedded worker process that ended while the cluster was running."""

    worker: str
    returncode: int | None  # None: the process could not be restarted
    stderr_tail: tuple[str, ...]
    time: float

    def describe(self) -> str:
        """``"killed by signal 9 (SIGKILL)"``, ``"exited with code 1"`` or ``"could not be restarted"``."""
        if self.returncode is None:
            return "could not be restarted"
        if self.returncode < 0:
            try:
                name = signal.Signals(-self.returncode).name
            except ValueError:
                name = "unknown signal"
            return f"killed by signal {-self.returncode} ({name})"
        return f"exited with code {self.returncode}"


class PinnedWorker(SubprocessWorker):
    """A worker subprocess pinned to a set of cores and restarted by the driver if it dies.

    Workers run as ``dask spec`` subprocesses (not multiprocessing children of the user's script),
    so scripts without a main guard work. Pinning makes each added worker add a core instead of
    competing for XLA's threads. The driver itself restarts a worker that dies (up to
    ``max_restarts`` times) instead of a Nanny process per worker: that saves a Python process and
    an import of distributed per worker at start-up (measured here: 4.1-4.4 s -> 2.5-3.4 s to start
    two workers that preload JAX). The worker's stderr goes to ``log_file``; each death is kept in
    :attr:`deaths` with its exit status and the last lines it wrote there.
    """

    def __init__(self, scheduler: str, cores: list[int] | None = None, max_restarts: int = 10,
                 log_file: str | None = None, env: dict | None = None, **kwargs):
        self.cores, self.restarts_left, self.log_file, self.env = cores, max_restarts, log_file, env or {}
        self.deaths: list[WorkerDeath] = []
        self._closing, self._supervisor, self._log_start = False, None, 0
        super().__init__(scheduler, **kwargs)

    async def _spawn(self):
        cmd = [sys.executable, "-m", "dhmc.distributed.child", str(os.getpid()), self.scheduler,  # dies with us
               "--spec", json.dumps({"cls": self.worker_class, "opts": self.worker_kwargs})]
        taskset = shutil.which("taskset")
        if self.cores and taskset:  # pin by exec, not preexec_fn: no fork hooks in a JAX process
            cmd = [taskset, "-c", ",".join(map(str, self.cores)), *cmd]
        env = {**os.environ, **self.env}
        if self.log_file is None:
            return await asyncio.create_subprocess_exec(*cmd, env=env)
        with open(self.log_file, "ab") as log:
            self._log_start = log.tell()
            env["DHMC_BLOCK_LOG"] = "1"  # the worker notes each block it starts in its log
            return await asyncio.create_subprocess_exec(*cmd, stderr=log, env=env)

    async def _start(self) -> None:
        self.process = await self._spawn()
        self._supervisor = asyncio.ensure_future(self._supervise())

    async def _supervise(self) -> None:
        while self.process is not None:
            returncode = await self.process.wait()
            if self._closing:
                return
            self.deaths.append(WorkerDeath(str(self.name), returncode, self._stderr_tail(), time.time()))
            if self.restarts_left <= 0:
                return
            self.restarts_left -= 1
            try:
                self.process = await self._spawn()
            except Exception as e:  # noqa: BLE001 - kept as this worker's last word, not lost in a task
                self.deaths.append(WorkerDeath(str(self.name), None, (repr(e),), time.time()))
                return

    def _stderr_tail(self, lines: int = 15) -> tuple[str, ...]:
        if self.log_file is None:
            return ()
        with suppress(OSError), open(self.log_file, "rb") as log:
            log.seek(self._log_start)
            text = log.read()[-64 * 1024:].decode(errors="replace")
            return tuple(line for line in text.splitlines() if line.strip())[-lines:]
        return ()

    async def close(self) -> None:
        self._closing = True
        if self._supervisor is not None:
            self._supervisor.cancel()
        await super().close()


def available_cores() -> list[int]:
    """The cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


class EmbeddedCluster(SpecCluster):
    """A ``SpecCluster`` that spawns its workers before it builds its scheduler.

    The scheduler's port is chosen up front, so workers can start importing (distributed, JAX:
    ~2.5 s of CPU each) while the scheduler imports its dashboard (~1.4 s); a worker connects as
    soon as both are ready.
    """

    def __init__(self, *args, scheduler_address: str, log_dir: str | None = None, **kwargs):
        self._early_address, self.log_dir = scheduler_address, log_dir
        super().__init__(*args, **kwargs)

    def worker_deaths(self) -> list[WorkerDeath]:
        """Every worker process that died so far, oldest first."""
        workers = [w for w in self._created if isinstance(w, PinnedWorker)]
        return sorted((d for w in workers for d in w.deaths), key=lambda d: d.time)

    async def _close(self):
        try:
            await super()._close()
        finally:
            if self.log_dir:
                shutil.rmtree(self.log_dir, ignore_errors=True)

    async def _start(self):
        if self.status == Status.created and self._early_address:
            workers = {}
            for name, spec in self.worker_spec.items():
                workers[name] = spec["cls"](self._early_address, **{"name": name, **spec.get("options", {})})
                self._created.add(workers[name])
            await asyncio.gather(*workers.values())
            for worker in workers.values():
                worker._cluster = weakref.ref(self)
            self.workers.update(workers)
            self._early_address = None
        await super()._start()
        application = getattr(self.scheduler, "http_application", None)
        if application is not None and not any(isinstance(a, DashboardOnDemand) for a in application.applications):
            application.add_application(DashboardOnDemand(self.scheduler))


class DashboardOnDemand(web.Application):
    """Dask's bokeh dashboard, connected to the scheduler's HTTP server by the first request nothing else serves.

    Importing it takes ~1.2 s of CPU, which a cold run on a few cores pays in wall time (the workers'
    start and the block program's compile share those cores) although most runs' dashboard is never
    opened; the first page opened takes that much longer instead. dhmc's own page (``/dhmc``) and the
    Prometheus metrics are served from the start.
    """

    def __init__(self, scheduler: Scheduler):
        super().__init__()  # no routes of its own (Dask's route listing reads them)
        self.scheduler = scheduler

    def find_handler(self, request, **kwargs):
        application = self.scheduler.http_application
        if self in application.applications:
            application.applications.remove(self)
            try:
                from distributed.dashboard.scheduler import connect
            except ImportError:  # no bokeh: Dask's routes say so
                return None
            connect(application, self.scheduler.http_server, self.scheduler)
        return application.find_handler(request, **kwargs)


def _ephemeral_ports() -> range:
    """The ports the OS hands out for ``bind(0)`` and outgoing connections (IANA's range where it does not say)."""
    with suppress(OSError, ValueError), open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low, high = map(int, f.read().split())
        return range(low, high + 1)
    return range(32768, 65536)  # Linux's default; BSD, macOS and Windows hand out 49152-65535


def _free_port(host: str, rng: random.Random | None = None, tries: int = 64) -> int:
    """A port free now on ``host`` that no ``bind(0)`` can take before the scheduler binds it.

    The workers are spawned before the scheduler listens, so the port is free for a while; taken from the
    OS's ephemeral range, a worker's, the dashboard's or any process's ``bind(0)`` may be handed it in the
    meantime (the likely cause of a CI run's one "Scheduler failed to start", in a CLI resume). Outside
    that range only an explicit bind can take it.
    """
    rng = rng or random.Random()
    ephemeral = _ephemeral_ports()
    candidates = [p for p in (rng.randrange(10_000, 32_768) for _ in range(tries)) if p not in ephemeral]
    for port in candidates:
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:  # an OS whose ephemeral range covers 10000-32767
        sock.bind((host, 0))
        return sock.getsockname()[1]


class _ReportedByDhmc(logging.Filter):
    """Drop the scheduler's "Task ... marked as failed because ..." lines (N workers died, no workers):
    dhmc raises WorkerCrashError or NoWorkersError with what the user needs instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.startswith("Task ") and "marked as failed because" in message)


# Dask's statistical profiler samples a worker's Python stack every 10 ms on the core the block runs on; a
# block is one XLA call, so it shows nothing and cost ~2-4% of a cold contract-size run here
_WORKER_PROFILER = "DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED"


def local_cluster(n_workers: int | None = None, host: str = "127.0.0.1", dashboard_address: str = "127.0.0.1:0",
                  pin: bool = True, memory_limit=0, max_restarts: int = 10, security=None) -> SpecCluster:
    """The embedded cluster: an in-process scheduler and one pinned worker per core, on loopback by default.

    Its comms use mutual TLS, on loopback too: ``security`` (a ``distributed.security.Security``), or per-run
    certificates (:func:`~dhmc.distributed.network.security_for`).
    """
    cores = available_cores()
    n_workers = n_workers or len(cores)
    worker_opts = {"nthreads": 1, "host": host, "memory_limit": memory_limit, "silence_logs": 40,
                   "preload": ["dhmc.distributed.worker"]}
    scheduler_log = logging.getLogger("distributed.scheduler")
    if not any(isinstance(f, _ReportedByDhmc) for f in scheduler_log.filters):
        scheduler_log.addFilter(_ReportedByDhmc())
    remove_orphaned_folders()  # of drivers killed before they could
    log_dir = tempfile.mkdtemp(prefix=temporary_prefix("workers"))
    security = network.security_for(host, security)
    env = network.security_env(security, os.path.join(log_dir, "tls"))
    env[_WORKER_PROFILER] = "False"
    workers = {}
    for i in range(n_workers):
        mine = [cores[i % len(cores)]] if pin and n_workers <= len(cores) else None
        workers[f"dhmc-{i}"] = {"cls": PinnedWorker, "options": {
            "cores": mine, "max_restarts": max_restarts, "worker_class": network.SECURE_WORKER,
            "log_file": os.path.join(log_dir, f"dhmc-{i}.log"), "env": env,
            "worker_kwargs": {**worker_opts, "name": f"dhmc-{i}"}, "name": f"dhmc-{i}"}}
    port = _free_port(host)
    protocol = "tls" if security.require_encryption else "tcp"
    scheduler = {"cls": Scheduler, "options": {"host": host, "port": port, "dashboard_address": dashboard_address,
                                               "dashboard": False,  # connected on demand: DashboardOnDemand
                                               "protocol": protocol, "security": security}}
    return EmbeddedCluster(workers=workers, scheduler=scheduler, name="dhmc-local", silence_logs=40,
                           scheduler_address=f"{protocol}://{host}:{port}", log_dir=log_dir, security=security)

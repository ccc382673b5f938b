"""dask-jobqueue's ``SLURMCluster`` with dhmc's defaults, and the replacement of jobs whose worker was lost.

Defaults that work across hosts with no config edits: the scheduler listens on this machine's
address on the route to the Slurm controller (which every node reaches; ``127.0.0.1`` for a Slurm on
loopback), each worker announces its own host's address on the route back, the cluster uses TLS with
per-run certificates unless it is on loopback, and each worker retires a little before its job's
walltime so that its block is handed on cleanly, not killed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading

from distributed.core import Status

from dhmc.distributed import network
from dhmc.errors import ClusterError

logger = logging.getLogger(__name__)

__all__ = ["slurm_cluster", "JobReplacer", "lifetime_for"]


def slurm_cluster(jobs=2, job_replacements=10, scheduler_options=None, worker_extra_args=(), security=None,
                  interface=None, shared_temp_directory="~/.dhmc/tls", walltime="01:00:00", **kwargs):
    """``dask_jobqueue.SLURMCluster`` with dhmc's config; scaled to ``jobs`` single-worker jobs.

    A job whose worker is lost (``scancel``, walltime, preemption, a dead node) is replaced by a new
    one, ``job_replacements`` times in all (see :class:`JobReplacer`). ``security`` (a
    ``distributed.security.Security``) replaces the per-run certificates; their worker halves are
    written to ``shared_temp_directory``, which the jobs must reach (readable by this user only).
    """
    SLURMCluster = _slurm_cluster_class()
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    kwargs.setdefault("python", sys.executable)
    scheduler_options = {k: v for k, v in (scheduler_options or {}).items() if not (k == "host" and v is None)}
    if "host" not in scheduler_options and "interface" not in scheduler_options and interface is None:
        scheduler_options["host"] = network.scheduler_host()
    host = scheduler_options.get("host")
    args = list(worker_extra_args or ())
    if network.is_loopback(host) and "--host" not in args and "--interface" not in args:
        args += ["--host", "127.0.0.1"]  # on loopback a worker listens there only
    if "--lifetime" not in args and (lifetime := lifetime_for(walltime)):
        args += ["--lifetime", f"{lifetime}s"]
    security = network.security_for(host, security)
    if security is not None:
        os.makedirs(os.path.expanduser(os.path.expandvars(shared_temp_directory)), mode=0o700, exist_ok=True)
    cluster = SLURMCluster(scheduler_options=scheduler_options, worker_extra_args=args, security=security,
                           interface=interface, shared_temp_directory=shared_temp_directory, walltime=walltime,
                           **kwargs)
    cluster.scale(jobs=jobs)
    cluster.dhmc_replacer = JobReplacer(cluster, int(job_replacements)).start()
    return cluster


def _slurm_cluster_class():
    """``dask_jobqueue.SLURMCluster``, imported without the side effect of ``dask_jobqueue.runner``.

    That module sets SIGINT to ``sys.exit`` at import: Ctrl-C would then end a run with ``SystemExit``
    instead of ``KeyboardInterrupt``, and outside the main thread (a run started from a thread) the
    import fails. The handler is put back, and the call skipped outside the main thread.
    """
    if threading.current_thread() is threading.main_thread():
        handler = signal.getsignal(signal.SIGINT)
        try:
            from dask_jobqueue import SLURMCluster
        except ImportError:
            raise ClusterError("cluster='slurm' needs dask-jobqueue: pip install 'dhmc[slurm]'") from None
        finally:
            signal.signal(signal.SIGINT, handler)
        return SLURMCluster
    with _IMPORT_LOCK:
        real, signal.signal = signal.signal, lambda *args: None
        try:
            from dask_jobqueue import SLURMCluster
        except ImportError:
            raise ClusterError("cluster='slurm' needs dask-jobqueue: pip install 'dhmc[slurm]'") from None
        finally:
            signal.signal = real
    return SLURMCluster


_IMPORT_LOCK = threading.Lock()


def lifetime_for(walltime: str | None) -> int | None:
    """Seconds a worker lives in a job of ``walltime`` (``[D-]HH:MM:SS``, ``MM:SS`` or minutes): 10% or 2 minutes less.

    A worker that retires hands its running block back to the scheduler, which gives it to another
    worker; one that Slurm kills at the walltime counts as a crash of that block.
    """
    if not walltime:
        return None
    days, _, clock = str(walltime).rpartition("-")
    parts = [float(p) for p in clock.split(":")]
    seconds = {1: lambda m: m * 60, 2: lambda m, s: m * 60 + s, 3: lambda h, m, s: h * 3600 + m * 60 + s}[
        len(parts)](*parts) + float(days or 0) * 86400
    return int(seconds - min(120, 0.1 * seconds)) if seconds > 0 else None


class JobReplacer:
    """Submit a new job for each job of a jobqueue cluster whose worker was lost, ``budget`` times in all.

    ``scale(jobs=n)`` alone never replaces a job: once a job's worker has been gone from the scheduler
    for ``distributed.deploy.lost-worker-timeout`` (15 s, time for a worker its Nanny restarts to come
    back) the cluster forgets the job, but nothing asks it for the jobs it still plans. This asks, once
    a second. ``adapt(minimum_jobs=n, maximum_jobs=n)`` asks too, as fast (measured on the local Slurm,
    from ``scancel`` to the new job's submission and its worker's arrival: 15.3 s and 18.5 s with
    ``adapt``, 16.2 s and 18.9 s with this), but without a limit; limiting it means rewriting both its
    bounds and the cluster's plan behind its back, and it asks the scheduler for a target every second.
    Once the budget is spent a lost job is dropped from the plan: blocks wait for the workers left and,
    with none left, the run ends with ``NoWorkersError`` after ``dhmc.no-workers-timeout``. A job that
    ends before its worker first connects is never noticed (the scheduler never saw it leave).
    """

    def __init__(self, cluster, budget: int, interval: float = 1.0):
        self.cluster, self.left, self.interval = cluster, budget, interval
        self.replaced: list[str] = []  # job ids whose loss was made good, oldest first
        self._jobs: dict[str, str] = {}  # worker-spec name -> job id, for jobs whose worker we may lose

    def start(self) -> JobReplacer:
        self.cluster.loop.add_callback(self._watch)
        return self

    async def _watch(self) -> None:
        while self.cluster.status not in (Status.closing, Status.closed):
            try:
                self.check()
            except Exception:  # noqa: BLE001 - the watcher must outlive one bad look
                logger.warning("dhmc: could not check the cluster's jobs", exc_info=True)
            await asyncio.sleep(self.interval)

    def check(self) -> None:
        """Replace (or, with no budget left, drop) the planned jobs whose worker the cluster has given up on."""
        cluster = self.cluster
        self._jobs = {name: job for name, job in self._jobs.items() if name in cluster.worker_spec}
        for name, job in cluster.workers.items():
            self._jobs[name] = str(getattr(job, "job_id", None) or name)
        replaced = False
        for name in [name for name in self._jobs if name not in cluster.workers]:
            job = self._jobs.pop(name)  # its new job is seen on a later look
            if self.left > 0:
                self.left -= 1
                self.replaced.append(job)
                replaced = True
                logger.warning("dhmc: job %s lost its worker; submitting a new one (%d replacement(s) left)",
                               job, self.left)
            else:
                del cluster.worker_spec[name]
                logger.warning("dhmc: job %s lost its worker and no job replacements are left "
                               "(dhmc.cluster.slurm.job-replacements); going on with %d job(s)",
                               job, len(cluster.worker_spec))
        if replaced:
            cluster.scale(jobs=len(cluster.worker_spec))  # submits the planned jobs that have none



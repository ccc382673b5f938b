"""dask-jobqueue's ``SLURMCluster`` with dhmc's defaults, and the replacement of jobs whose worker was lost.

Defaults that work across hosts with no config edits: the scheduler listens on this machine's
address on the route to the compute nodes (``127.0.0.1`` only when every node is on loopback), each
worker announces its own host's address on the route back, the cluster uses mutual TLS with
per-run certificates (on loopback too), and each worker retires a little before its job's
walltime so that its block is handed on cleanly, not killed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time

from distributed.core import Status

from dhmc.distributed import network
from dhmc.errors import ClusterError

logger = logging.getLogger(__name__)

__all__ = ["slurm_cluster", "slurm_options", "JobReplacer", "lifetime_for", "walltime_seconds"]


def slurm_cluster(jobs=2, job_replacements=10, **options):
    """``dask_jobqueue.SLURMCluster`` with dhmc's config (see :func:`slurm_options`), scaled to ``jobs`` jobs.

    A job whose worker is lost (``scancel``, preemption, a dead node) is replaced by a new one,
    ``job_replacements`` times in all; one whose worker retired at its lifetime, always (see
    :class:`JobReplacer`).
    """
    SLURMCluster = _slurm_cluster_class()
    kwargs = slurm_options(**options)
    if kwargs["security"].require_encryption:
        os.makedirs(os.path.expanduser(os.path.expandvars(kwargs["shared_temp_directory"])), mode=0o700,
                    exist_ok=True)
    cluster = SLURMCluster(**kwargs)
    cluster.scale(jobs=jobs)
    lifetime = lifetime_for(kwargs.get("walltime"))
    retire_after = lifetime[0] - lifetime[1] if lifetime and "--lifetime" in kwargs["worker_extra_args"] else None
    cluster.dhmc_replacer = JobReplacer(cluster, int(job_replacements), retire_after=retire_after).start()
    return cluster


def slurm_options(scheduler_options=None, worker_extra_args=(), security=None, interface=None,
                  shared_temp_directory="~/.dhmc/tls", walltime="01:00:00", **kwargs) -> dict:
    """``SLURMCluster`` keyword arguments from dhmc's config: addresses, TLS and worker lifetime filled in.

    With no ``host`` or ``interface``, the scheduler listens on this machine's address on the route to
    the nodes (:func:`~dhmc.distributed.network.scheduler_host`). ``security`` defaults to per-run
    certificates, whose worker halves are written to ``shared_temp_directory`` (the jobs must reach it;
    readable by this user only); workers are :class:`~dhmc.distributed.network.SecureWorker`, whose HTTP
    endpoints need them too. Workers retire before ``walltime`` (:func:`lifetime_for`).
    """
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    kwargs.setdefault("python", sys.executable)
    scheduler_options = {k: v for k, v in (scheduler_options or {}).items() if not (k == "host" and v is None)}
    if "host" not in scheduler_options and "interface" not in scheduler_options and interface is None:
        scheduler_options["host"] = network.scheduler_host()
    host = scheduler_options.get("host")
    args = list(worker_extra_args or ())
    if network.is_loopback(host) and "--host" not in args and "--interface" not in args:
        args += ["--host", "127.0.0.1"]  # on loopback a worker listens there only
    if "--worker-class" not in args:
        args += ["--worker-class", network.SECURE_WORKER]
    if "--lifetime" not in args and (lifetime := lifetime_for(walltime)):
        args += ["--lifetime", f"{lifetime[0]}s", "--lifetime-stagger", f"{lifetime[1]}s"]
    return {**kwargs, "scheduler_options": scheduler_options, "worker_extra_args": args, "interface": interface,
            "security": network.security_for(host, security), "shared_temp_directory": shared_temp_directory,
            "walltime": walltime}


def lifetime_for(walltime) -> tuple[int, int] | None:
    """``(lifetime, stagger)`` seconds of a worker in a job of ``walltime``; None for no limit.

    The worker retires after ``lifetime +- stagger`` (dask's ``--lifetime``, ``--lifetime-stagger``):
    at the latest 20% (at most 3 minutes) before the walltime, leaving its start-up and a clean
    hand-over of its block to another worker; one that Slurm kills at the walltime counts as a crash
    of its block. Staggered, jobs started together do not all retire at once. ``walltime`` is in
    Slurm's formats: ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M``, ``D-H:M:S``.
    """
    seconds = walltime_seconds(walltime)
    if not seconds:
        return None
    latest = seconds - min(180, 0.2 * seconds)
    stagger = min(120, 0.05 * seconds)
    return int(latest - stagger), int(stagger)


def walltime_seconds(walltime) -> float | None:
    """Seconds of a Slurm time limit; None for none (``None``, ``UNLIMITED``, ``INFINITE``) or one unreadable."""
    text = str(walltime or "").strip()
    if not text or text.upper() in ("UNLIMITED", "INFINITE", "NONE"):
        return None
    days, dash, clock = text.rpartition("-")
    try:
        parts = [float(p) for p in clock.split(":")]
        if dash:  # D-H, D-H:M, D-H:M:S
            hours, minutes, secs = (parts + [0.0, 0.0])[:3]
            return float(days) * 86400 + hours * 3600 + minutes * 60 + secs
        if len(parts) == 3:
            return parts[0] * 3600 + parts[1] * 60 + parts[2]
        return parts[0] * 60 + (parts[1] if len(parts) == 2 else 0.0)
    except (ValueError, IndexError):
        return None


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
    ends before its worker first connects is never noticed (the scheduler never saw it leave). A job
    that lasted ``retire_after`` seconds or more since its submission (its worker retired, as planned,
    before the walltime) is replaced without spending the budget, however long the run.
    """

    def __init__(self, cluster, budget: int, interval: float = 1.0, retire_after: float | None = None):
        self.cluster, self.left, self.interval, self.retire_after = cluster, budget, interval, retire_after
        self.replaced: list[str] = []  # job ids whose loss was made good, oldest first
        self.retired: list[str] = []  # job ids whose worker retired at its lifetime, replaced as planned
        self._jobs: dict[str, str] = {}  # worker-spec name -> job id, for jobs whose worker we may lose
        self._born: dict[str, float] = {}  # job id -> when it was first seen

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
            self._born.setdefault(self._jobs[name], time.monotonic())
        replaced = False
        for name in [name for name in self._jobs if name not in cluster.workers]:
            job = self._jobs.pop(name)  # its new job is seen on a later look
            lived = time.monotonic() - self._born.pop(job, time.monotonic())
            if self.retire_after is not None and lived >= self.retire_after:
                self.retired.append(job)
                replaced = True
                logger.info("dhmc: job %s retired its worker before its walltime; submitting a new one", job)
            elif self.left > 0:
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



"""Clusters of ``n`` workers for the points of a study, freshly started or restarted for every point.

The embedded local cluster is started anew with ``n`` workers (each pinned to its own core while there
are cores enough, so the study measures cores, not XLA's threads); a dask-cuda, Slurm or given ``Cluster``
is scaled to ``n`` workers and restarted with ``client.restart()``.
"""

from __future__ import annotations

import time
from contextlib import suppress

from dhmc.scaling.plan import ScalingError

__all__ = ["Clusters", "cluster_info", "placement"]


class Clusters:
    """Clients with ``n`` workers, freshly started or restarted for every point."""

    def __init__(self, cluster, options):
        self.spec, self.options = cluster, dict(options or {})
        self.client = self.close = None
        self.original = None  # a user's cluster is scaled back to its size at the end
        self.restarted = None  # whether the last get() restarted the workers (None: started fresh)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.client is not None and self.original is not None:
            with suppress(Exception):
                self._scale(self.original)
        if self.close is not None:
            with suppress(Exception):
                self.close()
        self.client = self.close = None

    @property
    def cpu_workers(self) -> bool:
        """Whether the workers compute on CPUs (their CPU share then says whether they had their cores)."""
        return not (self.spec == "cuda" or "CUDA" in type(getattr(self.spec, "cluster", self.spec)).__name__)

    @property
    def embedded(self) -> bool:
        return self.spec is None or self.spec == "local"

    def pinned(self, n: int) -> bool | None:
        if not self.embedded:
            return None
        from dhmc.distributed import config
        from dhmc.distributed.embedded import available_cores

        pin = config.cluster_options("local", self.options).get("pin", True)
        return bool(pin) and n <= len(available_cores())

    def get(self, n: int):
        from dhmc.distributed.connect import connect

        if self.embedded:
            self.client, self.close = connect("local", {**self.options, "n_workers": n})
            return self.client
        if self.client is None and self.spec in ("cuda", "slurm"):
            # a cluster started here for this point: its workers are fresh already
            kind = self.spec
            opts = {"n_workers": n} if kind == "cuda" else {"jobs": n}
            self.client, self.close = connect(kind, {**self.options, **opts})
            self._wait(n)
            return self.client
        if self.client is None:
            self.client, self.close = connect(self.spec, self.options)
            self.original = _count(self.client) if self._scalable() else None
        # Fresh workers for every point: retire the surplus, restart the rest, then add the missing ones
        # (new workers start fresh; restarting a worker that has only just joined can stall).
        if not self._scalable() or _count(self.client) > n:
            self._scale(n)  # an unscalable cluster: refused here unless it has n workers
        self._restart()
        self._scale(n)
        return self.client

    def _restart(self) -> None:
        import dask

        timeout = 600 if self.spec == "slurm" else 180
        if not all(w.get("nanny") for w in _workers(self.client).values()):
            self.restarted = False  # restart would only shut down workers without a Nanny: keep them
            return
        self.restarted = True
        try:
            # A SpecCluster (LocalCluster, LocalCUDACluster) closes a worker's Nanny for good when no worker
            # of that name re-registers within lost-worker-timeout (15 s) of leaving the scheduler, which a
            # restart on a busy machine can exceed: then the restart never completes. Give it the restart's time.
            with dask.config.set({"distributed.deploy.lost-worker-timeout": f"{timeout}s"}):
                self.client.restart(wait_for_workers=True, timeout=timeout)
        except TimeoutError as e:
            msg = f"restarting the workers between points did not finish within {timeout} s ({e})"
            raise ScalingError(msg) from None

    def release(self, n: int) -> None:
        if self.embedded and self.close is not None:
            self.close()
            self.client = self.close = None

    def _scalable(self) -> bool:
        cluster = getattr(self.client, "cluster", None)
        return cluster is not None and hasattr(cluster, "scale")

    def _count(self) -> int:
        return _count(self.client)

    def _scale(self, n: int) -> None:
        if not self._scalable():
            have = self._count()
            if have != n:
                raise ScalingError(f"the cluster at {self.client.scheduler.address} has {have} workers and dhmc "
                                   f"cannot scale it (no Cluster object) to {n}; pass a Cluster, 'cuda' or "
                                   f"'slurm', or only --workers {have}")
            return
        self.client.cluster.scale(n)  # workers; with dhmc's Slurm config (processes: 1) one job each
        self._wait(n)

    def _wait(self, n: int, timeout: float | None = None) -> None:
        timeout = timeout or (600.0 if self.spec == "slurm" else 180.0)
        deadline = time.monotonic() + timeout
        while (have := self._count()) != n:
            if time.monotonic() > deadline:
                raise ScalingError(f"the cluster did not reach {n} workers within {timeout:.0f} s (has {have})")
            time.sleep(0.5)


def _workers(client) -> dict:
    """All workers' records (recent ``distributed`` lists only the first few unless asked)."""
    try:
        return client.scheduler_info(n_workers=-1)["workers"]
    except TypeError:
        return client.scheduler_info()["workers"]


def _count(client) -> int:
    return len(_workers(client))


def placement(client) -> dict:
    """Where the workers run: their distinct ``hosts`` (addresses), the ``machines`` under them (hosts of one
    machine, such as network namespaces or containers, share its boot id) and the largest machine's cores."""
    def machine():
        import os

        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                boot = f.read().strip()
        except OSError:
            boot = os.uname().nodename
        return boot, os.cpu_count()

    found = {}
    with suppress(Exception):
        found = client.run(machine)
    hosts = sorted({w.get("host") for w in _workers(client).values()})
    return {"hosts": hosts, "machines": len({boot for boot, _ in found.values()}) or None,
            "machine_cores": max((cores for _, cores in found.values()), default=None)}


def cluster_info(client) -> dict:
    """What the workers of the first point run on: threads, memory, and JAX's devices."""
    info = _workers(client)
    workers = [{"name": str(w.get("name")), "host": w.get("host"), "nthreads": w.get("nthreads"),
                "memory_limit": w.get("memory_limit")} for w in info.values()]

    def devices():
        import jax

        return [f"{d.platform}:{getattr(d, 'device_kind', '')}" for d in jax.devices()]

    found = {}
    with suppress(Exception):
        found = client.run(devices)
    return {"workers": workers, "worker_devices": sorted({", ".join(v) for v in found.values()})}


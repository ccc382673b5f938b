"""Per-worker sampling metrics: heartbeat metrics, Prometheus series and plugins.

``record_block`` is called inside Dask tasks after each block of sampling. It
updates the worker's :class:`dhmc.observe.block_stats.BlockStats`, exported two ways:

* ``Worker.metrics["dhmc_*"]`` callables, which travel with the heartbeat into
  the scheduler's ``WorkerState.metrics`` (and the dashboard's Workers table);
* a Prometheus collector on the worker process's global ``REGISTRY``, served
  by the worker's own ``/metrics`` endpoint.
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from dhmc.observe.block_stats import METRIC_KEYS, BlockStats
from dhmc.observe.dashboard import DhmcSchedulerPlugin

__all__ = ["WORKER_PLUGIN_NAME", "DhmcCollector", "DhmcWorkerPlugin", "install", "instrument", "record_block",
           "worker_stats"]

logger = logging.getLogger(__name__)

WORKER_PLUGIN_NAME = "dhmc-observe-worker"

_lock = threading.Lock()
_stats: weakref.WeakKeyDictionary[Any, BlockStats] = weakref.WeakKeyDictionary()
_collector_registered = False
_collector_lock = threading.Lock()


def worker_stats(worker: Any) -> BlockStats | None:
    """The stats of ``worker`` in this process, None where it has recorded nothing."""
    return _stats.get(worker)


def _metric(key: str, worker: Any) -> Any:
    stats = worker_stats(worker)
    return stats.snapshot()[key] if stats is not None else None


def _add_worker_metrics(worker: Any) -> None:
    # Rebind rather than mutate: Worker.get_metrics may be iterating the old dict.
    ours = {k: functools.partial(_metric, k) for k in METRIC_KEYS}
    worker.metrics = {**worker.metrics, **ours}


class DhmcCollector:
    """Prometheus collector over every dhmc-instrumented worker in this process."""

    _counters = (
        ("dhmc_chain_draws", "Chain draws produced (chains x draws)."),
        ("dhmc_grad_evals", "Gradient evaluations."),
        ("dhmc_blocks_done", "Sampling blocks finished."),
        ("dhmc_divergences", "Divergent transitions after warmup."),
        ("dhmc_warmup_divergences", "Divergent transitions during warmup (while step sizes are probed)."),
        ("dhmc_sampling_seconds", "Wall seconds spent sampling."),
        ("dhmc_compile_seconds", "Wall seconds spent compiling."),
    )
    _gauges = (
        ("dhmc_chain_draws_per_s", "Recent chain-draw throughput."),
        ("dhmc_grad_evals_per_s", "Recent gradient-evaluation throughput."),
        ("dhmc_acceptance", "Mean acceptance probability of the last block."),
    )

    def collect(self):  # noqa: D102
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        with _lock:
            items = list(_stats.items())
        snaps = [(str(w.address), s.snapshot()) for w, s in items]
        for name, doc in self._counters:
            fam = CounterMetricFamily(name, doc, labels=["worker"])
            for addr, snap in snaps:
                fam.add_metric([addr], snap[name])
            yield fam
        for name, doc in self._gauges:
            fam = GaugeMetricFamily(name, doc, labels=["worker"])
            for addr, snap in snaps:
                fam.add_metric([addr], snap[name])
            yield fam
        info = GaugeMetricFamily("dhmc_run_info", "Current run and phase.", labels=["worker", "run_id", "phase"])
        for addr, snap in snaps:
            if snap["dhmc_run_id"]:
                info.add_metric([addr, snap["dhmc_run_id"], snap["dhmc_phase"]], 1.0)
        yield info


def _register_collector() -> None:
    global _collector_registered
    with _collector_lock:
        if _collector_registered:
            return
        _collector_registered = True
    try:
        import prometheus_client

        prometheus_client.REGISTRY.register(DhmcCollector())
    except Exception:  # e.g. duplicated series after a module reload
        logger.warning("dhmc: could not register the Prometheus collector", exc_info=True)


def instrument(worker: Any, *, on_loop: bool = True) -> BlockStats:
    """Attach dhmc metrics to ``worker`` (idempotent) and return its stats.

    Parameters
    ----------
    worker : distributed.Worker
    on_loop : bool
        True when called on the worker's event loop; otherwise the
        ``Worker.metrics`` update is scheduled onto the loop.
    """
    with _lock:
        stats = _stats.get(worker)
        if stats is not None:
            return stats
        stats = _stats[worker] = BlockStats(str(getattr(worker, "address", "")))
    _register_collector()  # outside _lock: registering calls collect(), which takes it
    if on_loop:
        _add_worker_metrics(worker)
    else:
        worker.loop.add_callback(_add_worker_metrics, worker)
    return stats


class DhmcWorkerPlugin(WorkerPlugin):
    """Install dhmc metrics (heartbeat + Prometheus) on every worker."""

    name = WORKER_PLUGIN_NAME
    idempotent = True

    def setup(self, worker: Any) -> None:  # noqa: D102
        from dhmc.distributed.events import on_block

        instrument(worker, on_loop=True)
        on_block(record_block)


def record_block(**block: Any) -> None:
    """Record one finished block on the current Dask worker (the keywords of :meth:`BlockStats.record`).

    Called through :func:`dhmc.distributed.events.on_block` for every block the worker runs: run id,
    phase, chains and draws, gradient evaluations, seconds of sampling and of compiling, mean
    acceptance and divergences. A no-op outside a worker; installs the metrics lazily if
    ``DhmcWorkerPlugin`` was not registered. Never raises.
    """
    try:
        from distributed.worker import get_worker

        worker = get_worker()
    except (ValueError, ImportError):
        return
    try:
        instrument(worker, on_loop=False).record(**block)
    except Exception:
        logger.warning("dhmc: record_block failed", exc_info=True)


_installed: set[tuple[str, str]] = set()
_install_lock = threading.Lock()


def install(client: Any) -> Any:
    """Register the worker and scheduler plugins through ``client``.

    Works on already-running clusters (run-time ``register_plugin``), is
    idempotent per client and thread-safe, and only logs failures. For an
    asynchronous client it returns an awaitable.

    Parameters
    ----------
    client : distributed.Client
    """
    key = (str(getattr(client, "id", id(client))), str(getattr(client.scheduler, "address", "")))
    plugins = (DhmcWorkerPlugin(), DhmcSchedulerPlugin())

    if getattr(client, "asynchronous", False):

        async def _install_async() -> None:
            if key in _installed:
                return
            _installed.add(key)
            for plugin in plugins:
                try:
                    await client.register_plugin(plugin, name=plugin.name)
                except Exception:
                    logger.warning("dhmc: could not register %s", plugin.name, exc_info=True)

        return _install_async()

    with _install_lock:
        if key in _installed:
            return None
        _installed.add(key)
        for plugin in plugins:
            try:
                client.register_plugin(plugin, name=plugin.name)
            except Exception:
                logger.warning("dhmc: could not register %s", plugin.name, exc_info=True)
    return None

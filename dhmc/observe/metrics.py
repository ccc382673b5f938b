"""Per-worker sampling metrics: heartbeat metrics, Prometheus series and plugins.

``record_block`` is called inside Dask tasks after each block of sampling. It
updates a small per-worker accumulator that is exported two ways:

* ``Worker.metrics["dhmc_*"]`` callables, which travel with the heartbeat into
  the scheduler's ``WorkerState.metrics`` (and the dashboard's Workers table);
* a Prometheus collector on the worker process's global ``REGISTRY``, served
  by the worker's own ``/metrics`` endpoint.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
import weakref
from collections import deque
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from dhmc.observe.dashboard import DhmcSchedulerPlugin

logger = logging.getLogger(__name__)

WORKER_PLUGIN_NAME = "dhmc-observe-worker"

#: Blocks that ended within this many seconds feed the throughput estimate.
RATE_WINDOW_S = 10.0
#: Rates are held at least this long after the last block ...
RATE_HOLD_S = 10.0
#: ... then fade linearly to zero over this many seconds.
RATE_FADE_S = 20.0

#: Keys published in ``Worker.metrics`` (and hence ``WorkerState.metrics``).
METRIC_KEYS = (
    "dhmc_chain_draws_per_s",
    "dhmc_grad_evals_per_s",
    "dhmc_chain_draws",
    "dhmc_grad_evals",
    "dhmc_blocks_done",
    "dhmc_divergences",
    "dhmc_warmup_divergences",
    "dhmc_sampling_seconds",
    "dhmc_compile_seconds",
    "dhmc_acceptance",
    "dhmc_run_id",
    "dhmc_phase",
)


class BlockStats:
    """Thread-safe totals and recent throughput of one worker.

    Rates are the throughput of the blocks that ended in the last
    ``RATE_WINDOW_S`` seconds (total draws over the wall span they cover, so
    concurrent blocks add up). The rate is held for ``max(RATE_HOLD_S, 2 x
    block wall time)`` after the last block, then fades to zero over
    ``RATE_FADE_S``.
    """

    def __init__(self, address: str = "") -> None:
        self.address = address
        self._lock = threading.Lock()
        self._recent: deque[tuple[float, float, int, int]] = deque()
        self._base = (0.0, 0.0)
        self._last: float | None = None
        self._hold = RATE_HOLD_S
        self.chain_draws = 0
        self.grad_evals = 0
        self.blocks_done = 0
        self.divergences = 0  # of sampling blocks: warmup's (step sizes being probed) are counted apart
        self.warmup_divergences = 0
        self.sampling_seconds = 0.0
        self.compile_seconds = 0.0
        self.acceptance = 0.0
        self.run_id = ""
        self.phase = ""

    def record(
        self,
        *,
        run_id: str,
        phase: str,
        chains: int,
        draws: int,
        grad_evals: int,
        seconds: float,
        compile_seconds: float,
        acceptance_mean: float,
        divergences: int,
        now: float | None = None,
    ) -> None:
        """Add one finished block (``now``: monotonic end time, for tests)."""
        now = time.monotonic() if now is None else now
        n = int(chains) * int(draws)
        seconds, compile_seconds = max(float(seconds), 0.0), max(float(compile_seconds), 0.0)
        with self._lock:
            self.chain_draws += n
            self.grad_evals += int(grad_evals)
            self.blocks_done += 1
            if phase == "warmup":
                self.warmup_divergences += int(divergences)
            else:
                self.divergences += int(divergences)
            self.sampling_seconds += seconds
            self.compile_seconds += compile_seconds
            acc = float(acceptance_mean)
            self.acceptance = acc if math.isfinite(acc) else 0.0
            self.run_id, self.phase = str(run_id), str(phase)
            recent = self._recent
            recent.append((now - seconds, now, n, int(grad_evals)))
            while recent[0][1] < now - RATE_WINDOW_S:
                recent.popleft()
            span = max(now - min(r[0] for r in recent), 1e-3)
            self._base = (sum(r[2] for r in recent) / span, sum(r[3] for r in recent) / span)
            self._last = now
            self._hold = max(RATE_HOLD_S, 2.0 * (seconds + compile_seconds))

    def rates(self, now: float | None = None) -> tuple[float, float]:
        """Current ``(chain_draws_per_s, grad_evals_per_s)``."""
        now = time.monotonic() if now is None else now
        with self._lock:
            if self._last is None:
                return 0.0, 0.0
            age = now - self._last
            f = 1.0 if age <= self._hold else max(0.0, 1.0 - (age - self._hold) / RATE_FADE_S)
            return self._base[0] * f, self._base[1] * f

    def snapshot(self, now: float | None = None) -> dict[str, Any]:
        """All metrics as a flat ``{METRIC_KEY: value}`` dict."""
        draws_rate, grad_rate = self.rates(now)
        with self._lock:
            return {
                "dhmc_chain_draws_per_s": draws_rate,
                "dhmc_grad_evals_per_s": grad_rate,
                "dhmc_chain_draws": self.chain_draws,
                "dhmc_grad_evals": self.grad_evals,
                "dhmc_blocks_done": self.blocks_done,
                "dhmc_divergences": self.divergences,
                "dhmc_warmup_divergences": self.warmup_divergences,
                "dhmc_sampling_seconds": self.sampling_seconds,
                "dhmc_compile_seconds": self.compile_seconds,
                "dhmc_acceptance": self.acceptance,
                "dhmc_run_id": self.run_id,
                "dhmc_phase": self.phase,
            }


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

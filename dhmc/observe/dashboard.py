"""Scheduler-side dhmc dashboard: JSON routes and a self-contained HTML page.

``DhmcSchedulerPlugin.start`` adds three tornado routes to the running
scheduler's HTTP application (``Scheduler.http_application``, the
``RoutingApplication`` that also serves ``/status`` and ``/metrics``):

* ``/dhmc/api/workers`` -- per-worker ``dhmc_*`` values from ``WorkerState.metrics``;
* ``/dhmc/api/progress`` -- latest driver-published progress per run;
* ``/dhmc/api/history`` -- 1 Hz chain-draws/s history and max R-hat per block;
* ``/dhmc`` -- an HTML page (inline JS, no CDN) polling them every second; it is
  ``static/dashboard.html`` in this package, served with the current data embedded.

The driver publishes progress with :func:`publish_progress` as a scheduler
event on topic ``"dhmc-progress"``; the plugin's ``log_event`` hook keeps the
latest record per run.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
from collections import deque
from importlib import resources
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin
from tornado import web
from tornado.ioloop import PeriodicCallback

logger = logging.getLogger(__name__)

SCHEDULER_PLUGIN_NAME = "dhmc-observe-scheduler"
PROGRESS_TOPIC = "dhmc-progress"
MAX_RUNS = 20
HISTORY_LEN = 300  # seconds of 1 Hz rate samples kept on the scheduler
MAX_WORKER_SERIES = 16
_ROUTES_FLAG = "_dhmc_routes"

_WORKER_FIELDS = (
    "chain_draws_per_s",
    "grad_evals_per_s",
    "blocks_done",
    "chain_draws",
    "grad_evals",
    "acceptance",
    "divergences",
    "warmup_divergences",
    "compile_seconds",
    "sampling_seconds",
    "run_id",
    "phase",
)


def _clean(obj: Any) -> Any:
    """Plain JSON/msgpack-safe copy: numpy scalars to Python, non-finite floats to None."""
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    if isinstance(obj, (str, bool)) or obj is None:
        return obj
    if isinstance(obj, int):
        return int(obj)
    try:
        f = float(obj)
    except (TypeError, ValueError):
        return str(obj)
    if f.is_integer() and "int" in type(obj).__name__:
        return int(f)
    return f if math.isfinite(f) else None


def worker_records(scheduler: Any) -> list[dict[str, Any]]:
    """One record per connected worker, built from ``WorkerState.metrics``."""
    now = time.time()
    out = []
    for ws in sorted(scheduler.workers.values(), key=lambda w: w.address):
        m = ws.metrics
        rec: dict[str, Any] = {
            "worker": ws.address,
            "name": str(ws.name),
            "nthreads": ws.nthreads,
            "last_seen_s": round(now - ws.last_seen, 3),
        }
        for f in _WORKER_FIELDS:
            default = "" if f in ("run_id", "phase") else 0
            value = m.get("dhmc_" + f)
            rec[f] = default if value is None else value
        out.append(_clean(rec))
    return out


def _plugin(scheduler: Any) -> DhmcSchedulerPlugin:
    plugin = getattr(scheduler, "plugins", {}).get(SCHEDULER_PLUGIN_NAME)
    if isinstance(plugin, DhmcSchedulerPlugin):
        return plugin
    plugin = DhmcSchedulerPlugin()  # routes added without the plugin: rebuild from events
    for _, msg in scheduler.get_events(PROGRESS_TOPIC):
        plugin.log_event(PROGRESS_TOPIC, msg)
    return plugin


def progress_records(scheduler: Any) -> dict[str, dict[str, Any]]:
    """Latest progress record per ``run_id``."""
    return dict(_plugin(scheduler).runs)


def history_records(scheduler: Any) -> dict[str, Any]:
    """Rate history (1 Hz, scheduler-side) and max split R-hat per block, per run."""
    return _plugin(scheduler).history()


class _Handler(web.RequestHandler):
    def initialize(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def _json(self, obj: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.write(json.dumps(_clean(obj), allow_nan=False))


class WorkersHandler(_Handler):
    """``GET /dhmc/api/workers``."""

    def get(self) -> None:  # noqa: D102
        self._json(worker_records(self.scheduler))


class HistoryHandler(_Handler):
    """``GET /dhmc/api/history``."""

    def get(self) -> None:  # noqa: D102
        self._json(history_records(self.scheduler))


class ProgressHandler(_Handler):
    """``GET /dhmc/api/progress``."""

    def get(self) -> None:  # noqa: D102
        self._json(progress_records(self.scheduler))


@functools.cache
def page() -> str:
    """The page's HTML; ``/*INITIAL*/null`` in it stands for the data it starts with."""
    return resources.files(__package__).joinpath("static", "dashboard.html").read_text(encoding="utf-8")


class PageHandler(_Handler):
    """``GET /dhmc``: the HTML page, with the current data embedded."""

    def get(self) -> None:  # noqa: D102
        initial = {
            "workers": worker_records(self.scheduler),
            "progress": progress_records(self.scheduler),
            "history": history_records(self.scheduler),
            "scheduler": str(self.scheduler.address),
        }
        data = json.dumps(_clean(initial), allow_nan=False).replace("</", "<\\/")
        self.set_header("Content-Type", "text/html; charset=utf-8")
        self.set_header("Cache-Control", "no-store")
        self.write(page().replace("/*INITIAL*/null", data))


def _route_patterns(router: Any, seen: set[int] | None = None) -> set[str]:
    """All path patterns reachable from a tornado router."""
    seen = set() if seen is None else seen
    out: set[str] = set()
    if id(router) in seen:
        return out
    seen.add(id(router))
    for rule in getattr(router, "rules", []):
        regex = getattr(rule.matcher, "regex", None)
        if regex is not None:
            out.add(regex.pattern)
        if hasattr(rule.target, "rules"):
            out |= _route_patterns(rule.target, seen)
    return out


def _http_prefix(app: Any) -> str:
    # distributed prefixes all its routes (e.g. ".../health") with ``http_prefix``.
    for pat in _route_patterns(app.default_router):
        if pat.endswith("/health$"):
            return pat[: -len("health$")].rstrip("/")
    return ""


def add_routes(scheduler: Any) -> bool:
    """Add the dhmc routes to ``scheduler.http_application`` once.

    Returns
    -------
    bool
        True if routes were added, False if present already or no HTTP server.
    """
    app = getattr(scheduler, "http_application", None)
    if app is None or not hasattr(app, "add_handlers"):
        logger.warning("dhmc: scheduler has no HTTP application; dashboard routes not added")
        return False
    prefix = _http_prefix(app)
    api = prefix + "/dhmc/api/workers"
    if getattr(app, _ROUTES_FLAG, False) or any(api in p for p in _route_patterns(app.default_router)):
        return False
    kw = {"scheduler": scheduler}
    app.add_handlers(
        r".*$",
        [
            (api, WorkersHandler, kw),
            (prefix + "/dhmc/api/progress", ProgressHandler, kw),
            (prefix + "/dhmc/api/history", HistoryHandler, kw),
            (prefix + "/dhmc/?", PageHandler, kw),
        ],
    )
    setattr(app, _ROUTES_FLAG, True)
    return True


class DhmcSchedulerPlugin(SchedulerPlugin):
    """Serve the dhmc page and JSON routes; track progress and rate history."""

    name = SCHEDULER_PLUGIN_NAME
    idempotent = True

    def __init__(self) -> None:
        self.runs: dict[str, dict[str, Any]] = {}
        self.rhat: dict[str, list[list[float]]] = {}
        self.rates: deque[tuple[float, dict[str, float]]] = deque(maxlen=HISTORY_LEN)
        self._pc: PeriodicCallback | None = None

    def start(self, scheduler: Any) -> None:  # noqa: D102
        self.scheduler = scheduler
        for _, msg in scheduler.get_events(PROGRESS_TOPIC):
            self.log_event(PROGRESS_TOPIC, msg)
        add_routes(scheduler)
        self._pc = PeriodicCallback(self._sample, 1000)
        self._pc.start()

    async def close(self) -> None:  # noqa: D102
        if self._pc is not None:
            self._pc.stop()

    def _sample(self) -> None:
        rates = {}
        for ws in self.scheduler.workers.values():
            v = ws.metrics.get("dhmc_chain_draws_per_s")
            rates[ws.address] = float(v) if isinstance(v, (int, float)) and math.isfinite(v) else 0.0
        self.rates.append((time.time(), rates))

    def log_event(self, topic: str, msg: Any) -> None:  # noqa: D102
        if topic != PROGRESS_TOPIC or not isinstance(msg, dict):
            return
        run = str(msg.get("run_id", ""))
        old = self.runs.get(run)
        if old is None or (msg.get("published_at") or 0) >= (old.get("published_at") or 0):
            self.runs[run] = msg
        rhats = [c.get("rhat") for c in (msg.get("convergence") or {}).values() if isinstance(c, dict)]
        rhats = [r for r in rhats if isinstance(r, (int, float)) and math.isfinite(r)]
        if rhats and isinstance(msg.get("blocks_done"), (int, float)):
            by_block = {b: r for b, r in self.rhat.get(run, [])}
            by_block[msg["blocks_done"]] = max(rhats)
            self.rhat[run] = [[b, r] for b, r in sorted(by_block.items())][-500:]
        while len(self.runs) > MAX_RUNS:
            drop = min(self.runs, key=lambda r: self.runs[r].get("published_at") or 0)
            self.runs.pop(drop)
            self.rhat.pop(drop, None)

    def history(self) -> dict[str, Any]:
        """``{"t": [...], "total": [...], "workers": {addr: [...]}, "rhat": {run: [[block, max]]}}``."""
        samples = list(self.rates)
        latest = samples[-1][1] if samples else {}
        shown = sorted(latest, key=lambda a: -latest[a])[:MAX_WORKER_SERIES]
        return {
            "t": [t for t, _ in samples],
            "total": [sum(r.values()) for _, r in samples],
            "workers": {a: [r.get(a, 0.0) for _, r in samples] for a in sorted(shown)},
            "rhat": self.rhat,
        }


def publish_progress(client: Any, record: dict) -> None:
    """Send a run-progress record to the scheduler without waiting.

    Schedules ``scheduler.log_event("dhmc-progress", record)`` on the client's
    event loop and returns at once; failures are logged, never raised.

    Parameters
    ----------
    client : distributed.Client
    record : dict
        ``run_id``, ``phase``, ``blocks_done``, ``blocks_total``, ``chains``,
        ``draws_done``, ``draws_total``, ``elapsed_s`` and ``convergence``
        (``{param: {"rhat": float, "ess_bulk": float}}``).
    """
    try:
        msg = _clean(dict(record))
        msg.setdefault("published_at", time.time())

        async def _send() -> None:
            try:
                await client.scheduler.log_event(topic=PROGRESS_TOPIC, msg=msg)
            except Exception:
                logger.warning("dhmc: could not publish progress", exc_info=True)

        client.loop.add_callback(_send)
    except Exception:
        logger.warning("dhmc: could not publish progress", exc_info=True)

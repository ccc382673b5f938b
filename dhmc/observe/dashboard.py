"""Scheduler-side dhmc dashboard: the plugin, its JSON routes and HTML page, and the page's URL.

``DhmcSchedulerPlugin.start`` adds four tornado routes to the running
scheduler's HTTP application (``Scheduler.http_application``, the
``RoutingApplication`` that also serves ``/status`` and ``/metrics``):

* ``/dhmc/api/workers`` -- per-worker ``dhmc_*`` values from ``WorkerState.metrics``;
* ``/dhmc/api/progress`` -- latest driver-published progress per run;
* ``/dhmc/api/history`` -- 1 Hz chain-draws/s history and max R-hat per block;
* ``/dhmc`` -- an HTML page (inline JS, no CDN) polling them every second; it is
  ``static/dashboard.html`` in this package, served with the current data embedded.

The driver publishes progress with :func:`publish_progress` as a scheduler
event on topic ``"dhmc-progress"``; the plugin's ``log_event`` hook keeps the
latest record per run (:class:`dhmc.observe.records.RunRecords`). :func:`page_url`
is the page's address for a client.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from importlib import resources
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from distributed.diagnostics.plugin import SchedulerPlugin
from tornado import web
from tornado.ioloop import PeriodicCallback

from dhmc.observe.records import RunRecords, json_safe, worker_records

__all__ = ["PROGRESS_TOPIC", "SCHEDULER_PLUGIN_NAME", "DhmcSchedulerPlugin", "add_routes", "page", "page_url",
           "publish_progress"]

logger = logging.getLogger(__name__)

SCHEDULER_PLUGIN_NAME = "dhmc-observe-scheduler"
PROGRESS_TOPIC = "dhmc-progress"
_ROUTES_FLAG = "_dhmc_routes"


def _records(scheduler: Any) -> RunRecords:
    plugin = getattr(scheduler, "plugins", {}).get(SCHEDULER_PLUGIN_NAME)
    if isinstance(plugin, DhmcSchedulerPlugin):
        return plugin.records
    records = RunRecords()  # routes added without the plugin: rebuild from events
    for _, msg in scheduler.get_events(PROGRESS_TOPIC):
        records.add_progress(msg)
    return records


class _Handler(web.RequestHandler):
    def initialize(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def _json(self, obj: Any) -> None:
        self.set_header("Content-Type", "application/json")
        self.set_header("Cache-Control", "no-store")
        self.write(json.dumps(json_safe(obj), allow_nan=False))


class WorkersHandler(_Handler):
    """``GET /dhmc/api/workers``."""

    def get(self) -> None:  # noqa: D102
        self._json(worker_records(self.scheduler))


class HistoryHandler(_Handler):
    """``GET /dhmc/api/history``."""

    def get(self) -> None:  # noqa: D102
        self._json(_records(self.scheduler).history())


class ProgressHandler(_Handler):
    """``GET /dhmc/api/progress``."""

    def get(self) -> None:  # noqa: D102
        self._json(_records(self.scheduler).runs)


@functools.cache
def page() -> str:
    """The page's HTML; ``/*INITIAL*/null`` in it stands for the data it starts with."""
    return resources.files(__package__).joinpath("static", "dashboard.html").read_text(encoding="utf-8")


class PageHandler(_Handler):
    """``GET /dhmc``: the HTML page, with the current data embedded."""

    def get(self) -> None:  # noqa: D102
        records = _records(self.scheduler)
        initial = {
            "workers": worker_records(self.scheduler),
            "progress": records.runs,
            "history": records.history(),
            "scheduler": str(self.scheduler.address),
        }
        data = json.dumps(json_safe(initial), allow_nan=False).replace("</", "<\\/")
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
    """Serve the dhmc page and JSON routes; keep the runs' progress and the rate history."""

    name = SCHEDULER_PLUGIN_NAME
    idempotent = True

    def __init__(self) -> None:
        self.records = RunRecords()
        self._pc: PeriodicCallback | None = None

    def start(self, scheduler: Any) -> None:  # noqa: D102
        self.scheduler = scheduler
        for _, msg in scheduler.get_events(PROGRESS_TOPIC):
            self.log_event(PROGRESS_TOPIC, msg)
        add_routes(scheduler)
        self._pc = PeriodicCallback(lambda: self.records.sample_rates(self.scheduler.workers.values()), 1000)
        self._pc.start()

    async def close(self) -> None:  # noqa: D102
        if self._pc is not None:
            self._pc.stop()

    def log_event(self, topic: str, msg: Any) -> None:  # noqa: D102
        if topic == PROGRESS_TOPIC:
            self.records.add_progress(msg)


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
        msg = json_safe(dict(record))
        msg.setdefault("published_at", time.time())

        async def _send() -> None:
            try:
                await client.scheduler.log_event(topic=PROGRESS_TOPIC, msg=msg)
            except Exception:
                logger.warning("dhmc: could not publish progress", exc_info=True)

        client.loop.add_callback(_send)
    except Exception:
        logger.warning("dhmc: could not publish progress", exc_info=True)


def page_url(client: Any) -> str | None:
    """The URL of dhmc's ``/dhmc`` page on the scheduler's dashboard, None without a dashboard.

    Built from ``client.dashboard_link`` (``distributed.dashboard.link``): its final ``/status``
    becomes ``/dhmc``; any path before it (a proxy's or ``http_prefix``), query and fragment stay.
    A link without ``/status`` gets ``/dhmc`` after its path. Where the scheduler runs in this
    process, the host is the one its HTTP server listens on: Dask's link names the scheduler's comm
    host, where nothing listens when the dashboard is kept on loopback and the comms are not.
    """
    try:
        link = client.dashboard_link
    except Exception:
        logger.debug("dhmc: no dashboard link", exc_info=True)
        return None
    if not link:
        return None
    parts = urlsplit(str(link))
    listening = _listening_host(getattr(getattr(client, "cluster", None), "scheduler", None))
    if listening is not None and parts.hostname != listening:
        host = f"[{listening}]" if ":" in listening else listening
        parts = parts._replace(netloc=host + (f":{parts.port}" if parts.port else ""))
    prefix = parts.path.rstrip("/").removesuffix("/status").rstrip("/")
    return urlunsplit(parts._replace(path=prefix + "/dhmc"))


def _listening_host(scheduler) -> str | None:
    """The host an in-process scheduler's HTTP server listens on; None if not one host (or not known)."""
    sockets = getattr(getattr(scheduler, "http_server", None), "_sockets", None)  # tornado's listening sockets
    hosts = {sock.getsockname()[0] for sock in (sockets or {}).values()}
    if len(hosts) != 1:
        return None
    (host,) = hosts
    return None if host in ("0.0.0.0", "::") else host

"""What the /dhmc page shows, as plain JSON records kept on the scheduler.

* :func:`worker_records` -- one record per worker, from the heartbeat's ``WorkerState.metrics``;
* :class:`RunRecords` -- the latest driver-published progress per run, the max split R-hat per
  block, and a 1 Hz history of every worker's chain-draws/s.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

__all__ = ["HISTORY_LEN", "MAX_RUNS", "MAX_WORKER_SERIES", "RunRecords", "json_safe", "worker_records"]

MAX_RUNS = 20
HISTORY_LEN = 300  # seconds of 1 Hz rate samples kept on the scheduler
MAX_WORKER_SERIES = 16

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


def json_safe(obj: Any) -> Any:
    """Plain JSON/msgpack-safe copy: numpy scalars to Python, non-finite floats to None."""
    if isinstance(obj, dict):
        return {str(k): json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
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
        out.append(json_safe(rec))
    return out


class RunRecords:
    """Progress per run (the latest ``MAX_RUNS`` runs), max R-hat per block, and rate history."""

    def __init__(self) -> None:
        self.runs: dict[str, dict[str, Any]] = {}
        self.rhat: dict[str, list[list[float]]] = {}
        self.rates: deque[tuple[float, dict[str, float]]] = deque(maxlen=HISTORY_LEN)

    def add_progress(self, msg: Any) -> None:
        """Keep a driver's progress record (see :func:`dhmc.observe.dashboard.publish_progress`)."""
        if not isinstance(msg, dict):
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

    def sample_rates(self, workers: Iterable[Any]) -> None:
        """Append one sample of every worker's ``dhmc_chain_draws_per_s`` (``WorkerState``s)."""
        rates = {}
        for ws in workers:
            v = ws.metrics.get("dhmc_chain_draws_per_s")
            rates[ws.address] = float(v) if isinstance(v, (int, float)) and math.isfinite(v) else 0.0
        self.rates.append((time.time(), rates))

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

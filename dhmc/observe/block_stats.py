"""One worker's block statistics: totals and recent throughput, as the flat ``dhmc_*`` metrics.

:class:`BlockStats` is fed by :func:`dhmc.observe.metrics.record_block` after each block and read by
the heartbeat metrics and the Prometheus collector of :mod:`dhmc.observe.metrics`.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from typing import Any

__all__ = ["METRIC_KEYS", "RATE_FADE_S", "RATE_HOLD_S", "RATE_WINDOW_S", "BlockStats"]

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
            if phase in ("cold", "warmup"):  # a cold block's undone steps count as warmup's
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

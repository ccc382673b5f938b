"""The run's progress and convergence, published to the dashboard's /dhmc page as blocks finish."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dhmc.types import BlockResult

__all__ = ["DashboardPublisher"]

MAX_ROWS = 256  # parameters sent with each record: the worst by R-hat and by ESS (a model may have 10^5 scalars)
EVERY = 0.5  # seconds between two records while blocks finish (a thousand workers finish thousands a second)


class DashboardPublisher:
    """An observer of one run (:class:`dhmc.Observer`) that feeds the /dhmc page.

    Its convergence table is the run's :class:`~dhmc.distributed.monitor.ConvergenceMonitor`'s last
    measurement: the numbers the progress bar and ``draws="auto"`` use too. Blocks are published at most every
    :data:`EVERY` seconds, and the last one always.
    """

    def start_run(self, client, run_id: str, geometry) -> None:
        self.client, self.run_id, self.geometry = client, run_id, geometry
        self.blocks_done, self.chain_draws, self.started = 0, 0, time.perf_counter()
        self.record: dict | None = None
        self.convergence: dict = {}
        self.published, self.unpublished = -math.inf, False
        from dhmc.observe.metrics import install

        install(client)  # the per-worker metrics and the /dhmc page's plugin

    def sample_block(self, chunk: int, segment: int, result: BlockResult, chain_draws: int) -> None:
        geometry = self.geometry
        self.blocks_done += 1
        self.chain_draws += chain_draws
        self.record = {**(self.record or {}),
            "run_id": self.run_id, "phase": "sampling", "blocks_done": self.blocks_done,
            "blocks_total": geometry.num_chunks * geometry.num_segments, "chains": geometry.chains,
            "draws_done": self.chain_draws, "draws_total": geometry.chains * geometry.draws,
            "elapsed_s": time.perf_counter() - self.started, "convergence": self.convergence,
        }
        last = self.blocks_done == self.record["blocks_total"]
        if last or time.perf_counter() - self.published >= EVERY:
            self._publish()
        else:
            self.unpublished = True

    def convergence_check(self, check: dict) -> None:
        """Publish each parameter's R-hat and ESS; with ``draws="auto"`` also ``auto`` (min ESS, target, draws left)."""
        self.convergence = _worst(check.get("params", {}), MAX_ROWS)
        if self.record is not None:
            self.record["convergence"] = self.convergence
            if "target_ess" in check:
                self.record["auto"] = {k: v for k, v in check.items() if k != "params"}
            self._publish()

    def close(self) -> None:
        """The run ended: its last record, if not sent yet."""
        if self.unpublished:
            self._publish()

    def _publish(self) -> None:
        from dhmc.observe.dashboard import publish_progress

        publish_progress(self.client, dict(self.record, published_at=time.time()))
        self.published, self.unpublished = time.perf_counter(), False


def _worst(params: dict, rows: int) -> dict:
    """At most ``rows`` of ``params``: half the highest R-hat, the rest the lowest bulk ESS (undefined: worst)."""
    if len(params) <= rows:
        return params
    worst = lambda key, sign: sorted(params, key=lambda k: sign * (params[k][key] if params[k][key] is not None
                                                                   else -sign * math.inf))
    keep = dict.fromkeys(worst("rhat", -1)[:rows // 2])
    keep.update(dict.fromkeys(k for k in worst("ess_bulk", 1) if k not in keep))
    return {k: params[k] for k in list(keep)[:rows]}

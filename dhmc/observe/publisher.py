"""The run's progress and running convergence, published to the dashboard's /dhmc page as blocks finish."""

from __future__ import annotations

import time

from dhmc.observe.convergence import RunningConvergence


class DashboardPublisher:
    """An observer of one run (see :class:`dhmc.distributed.runner.Runner`) that feeds the /dhmc page."""

    def start_run(self, client, run_id: str, plan) -> None:
        self.client, self.run_id, self.plan = client, run_id, plan
        self.convergence = RunningConvergence(plan.chains, plan.num_segments, plan.chains_per_task)
        self.blocks_done, self.chain_draws, self.started = 0, 0, time.perf_counter()
        self.record: dict | None = None
        from dhmc.observe.metrics import install

        install(client)  # the per-worker metrics and the /dhmc page's plugin

    def sample_block(self, chunk: int, segment: int, result: dict, chain_draws: int) -> None:
        plan = self.plan
        self.blocks_done += 1
        self.chain_draws += chain_draws
        self.convergence.add(chunk, segment, result["moments"])
        self.record = {**(self.record or {}),
            "run_id": self.run_id, "phase": "sampling", "blocks_done": self.blocks_done,
            "blocks_total": plan.num_chunks * plan.num_segments, "chains": plan.chains,
            "draws_done": self.chain_draws, "draws_total": plan.chains * plan.draws,
            "elapsed_s": time.perf_counter() - self.started, "convergence": self.convergence.report(),
        }
        self._publish()

    def convergence_check(self, check: dict) -> None:
        """``draws="auto"``: publish ``auto = {"draws", "min_ess", "target_ess", "max_rhat", "remaining", ...}``."""
        if self.record is not None:
            self.record["auto"] = dict(check)
            self._publish()

    def _publish(self) -> None:
        from dhmc.observe.dashboard import publish_progress

        publish_progress(self.client, dict(self.record, published_at=time.time()))

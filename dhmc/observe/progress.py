"""A one-line progress report on stderr: blocks done, draws/s across workers (with ``draws="auto"``:
min ESS vs target, draws left), the dashboard link."""

from __future__ import annotations

import sys
import time


class Progress:
    """Prints ``dhmc: warmup round 2/5 | sampling 12/40 blocks, 51,200 chain-draws/s`` in place."""

    def __init__(self, stream=sys.stderr):
        self.total, self.done, self.stream = 0, 0, stream
        self.start = time.perf_counter()
        self.chain_draws = 0
        self.tty = hasattr(stream, "isatty") and stream.isatty()
        self.last = float("-inf")
        self.auto = ""

    def start_run(self, client, run_id: str, plan) -> None:
        """Print the dashboard link; count the blocks to come."""
        self.total = plan.num_chunks * plan.num_segments
        if client.dashboard_link:
            print(f"dhmc: dashboard {client.dashboard_link}", file=self.stream, flush=True)

    def _show(self, text: str) -> None:
        if self.tty:
            print(f"\rdhmc: {text}\033[K", end="", file=self.stream, flush=True)
        elif time.perf_counter() - self.last >= 5.0:  # a log file gets a line every few seconds
            print(f"dhmc: {text}", file=self.stream, flush=True)
            self.last = time.perf_counter()

    def warmup_block(self, round_index: int, rounds: int, chunks_done: int, chunks: int) -> None:
        self._show(f"warmup round {round_index + 1}/{rounds}, {chunks_done}/{chunks} blocks")
        self.start = time.perf_counter()

    def sample_block(self, chunk: int, segment: int, result: dict, chain_draws: int) -> None:
        self.done += 1
        self.chain_draws += chain_draws
        rate = self.chain_draws / max(time.perf_counter() - self.start, 1e-9)
        self._show(f"sampling {self.done}/{self.total} blocks, {rate:,.0f} chain-draws/s{self.auto}")

    def convergence_check(self, check: dict) -> None:
        """``draws="auto"``: the min ESS of the draws so far and the draws it suggests are left."""
        self.auto = f", min ESS {check['min_ess']:,.0f}/{check['target_ess']:,.0f}, ~{check['remaining']:,} draws left"

    def close(self) -> None:
        if self.tty:
            print(file=self.stream, flush=True)

"""What a run prints while it goes: the dashboard's link, and a progress bar (tqdm: a terminal or a notebook).

The bar counts warmup blocks, then chain-draws, with tqdm's rate (chain-draws/s across all workers)
and ETA; with ``draws="auto"`` its postfix says the min ESS against the target and the draws left.
"""

from __future__ import annotations

import logging
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dhmc.types import BlockResult

__all__ = ["DashboardLink", "Progress"]


class DashboardLink:
    """Prints (and logs) ``dhmc: dashboard http://.../dhmc``, dhmc's own page, when a run starts."""

    def __init__(self, stream=sys.stderr):
        self.stream = stream

    def start_run(self, client, run_id: str, geometry) -> None:
        from dhmc.observe.dashboard import page_url

        url = page_url(client)
        if url:
            print(f"dhmc: dashboard {url}", file=self.stream, flush=True)
            logging.getLogger("dhmc").info("run %s: dashboard %s", run_id, url)


class Progress:
    """A tqdm bar per phase: ``dhmc warmup`` (blocks, round r/R), then ``dhmc sampling`` (chain-draws)."""

    def __init__(self, stream=sys.stderr):
        self.stream, self.bar, self.geometry = stream, None, None
        self.tty = hasattr(stream, "isatty") and stream.isatty()

    def start_run(self, client, run_id: str, geometry) -> None:
        self.geometry = geometry

    def _phase(self, name: str, total: int, unit: str, scale: bool = False):
        """The bar of phase ``name``, started on its first block (a log file gets an update every 5 s)."""
        if self.bar is None or self.bar.desc != name:
            from tqdm.auto import tqdm

            self.close()
            self.bar = tqdm(total=total, desc=name, unit=unit, unit_scale=scale, file=self.stream, leave=True,
                            mininterval=0.5 if self.tty else 5.0, ascii=None if self.tty else True,
                            dynamic_ncols=self.tty, ncols=None if self.tty else 120)
        return self.bar

    def warmup_block(self, round_index: int, rounds: int, chunk: int, result: BlockResult, chunks_done: int,
                     chunks: int) -> None:
        bar = self._phase("dhmc warmup", rounds * chunks, " blocks")
        bar.set_postfix_str(f"round {round_index + 1}/{rounds}", refresh=False)
        bar.update(1)

    def sample_block(self, chunk: int, segment: int, result: BlockResult, chain_draws: int) -> None:
        geometry = self.geometry
        total = geometry.chains * geometry.draws if geometry is not None else None
        self._phase("dhmc sampling", total, " chain-draws", scale=True).update(chain_draws)

    def convergence_check(self, check: dict) -> None:
        """The monitor's last measurement: min ESS (against ``target_ess`` and the draws left, for ``draws="auto"``)."""
        if self.bar is None:
            return
        if "target_ess" in check:
            self.bar.set_postfix_str(f"min ESS {check['min_ess']:,.0f}/{check['target_ess']:,.0f}, "
                                     f"~{check['remaining']:,} draws left")
        else:
            self.bar.set_postfix_str(f"min ESS {check['min_ess']:,.0f}, nested R-hat {check['max_nested_rhat']:.3f}")

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

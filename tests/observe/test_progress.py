"""The progress bar (tqdm) and the dashboard link, as a log file sees them."""

from __future__ import annotations

import io

from dhmc.geometry import Geometry
from dhmc.observe.progress import DashboardLink, Progress


class Client:
    dashboard_link = "http://127.0.0.1:8787/status"


def test_bar_counts_warmup_blocks_then_chain_draws_with_rate_and_auto_postfix():
    stream = io.StringIO()
    plan = Geometry(chains=64, draws=100, chains_per_task=32, draws_per_segment=50)
    progress = Progress(stream)
    progress.start_run(Client(), "run", plan)
    for chunk in range(2):
        progress.warmup_block(0, 1, chunk, {}, chunk + 1, 2)
    for segment in range(2):
        for chunk in range(2):
            progress.sample_block(chunk, segment, {}, 32 * 50)
    progress.convergence_check({"min_ess": 812.4, "target_ess": 1000.0, "remaining": 40})
    progress.close()
    out = stream.getvalue()
    assert "dhmc warmup" in out and "2/2" in out and "round 1/1" in out
    assert "dhmc sampling" in out and "6.40k/6.40k" in out and "chain-draws/s" in out
    assert "min ESS 812/1,000, ~40 draws left" in out
    assert "dashboard" not in out  # the link is the DashboardLink's


def test_dashboard_link_is_printed_without_a_bar():
    stream = io.StringIO()
    DashboardLink(stream).start_run(Client(), "run", None)
    assert stream.getvalue() == "dhmc: dashboard http://127.0.0.1:8787/dhmc\n"

"""dhmc worker metrics, Prometheus series and scheduler routes on a real LocalCluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace

import pytest

from dhmc.observe.block_stats import METRIC_KEYS, RATE_FADE_S, RATE_HOLD_S, BlockStats
from dhmc.observe.dashboard import (
    PROGRESS_TOPIC,
    SCHEDULER_PLUGIN_NAME,
    _http_prefix,
    _route_patterns,
    add_routes,
    page_url,
    publish_progress,
)
from dhmc.observe.metrics import WORKER_PLUGIN_NAME, install, record_block

pytestmark = pytest.mark.timeout(180)

REPO = Path(__file__).resolve().parents[2]


def _block(stats: BlockStats, now: float, **kw) -> None:
    args = dict(
        run_id="r",
        phase="sampling",
        chains=4,
        draws=100,
        grad_evals=4000,
        seconds=2.0,
        compile_seconds=0.0,
        acceptance_mean=0.9,
        divergences=1,
    )
    stats.record(**{**args, **kw}, now=now)


def test_block_stats_rates_hold_then_decay():
    s = BlockStats("w")
    assert s.rates(now=0.0) == (0.0, 0.0)
    _block(s, now=100.0)
    assert s.rates(now=100.0) == pytest.approx((200.0, 2000.0))  # 400 draws in 2 s
    _block(s, now=102.0)  # back-to-back block: same throughput over the 4 s span
    assert s.rates(now=102.0) == pytest.approx((200.0, 2000.0))
    assert s.rates(now=102.0 + RATE_HOLD_S - 0.1)[0] == pytest.approx(200.0)  # held between blocks
    assert 0.0 < s.rates(now=102.0 + RATE_HOLD_S + RATE_FADE_S / 2)[0] < 200.0  # fading
    assert s.rates(now=102.0 + RATE_HOLD_S + RATE_FADE_S + 0.1) == (0.0, 0.0)
    snap = s.snapshot(now=103.0)
    assert set(snap) == set(METRIC_KEYS)
    assert (snap["dhmc_chain_draws"], snap["dhmc_blocks_done"], snap["dhmc_divergences"]) == (800, 2, 2)


def test_block_stats_long_blocks_hold_longer():
    s = BlockStats("w")
    _block(s, now=1000.0, seconds=60.0, compile_seconds=5.0)
    assert s.rates(now=1000.0 + 120.0)[0] > 0.0  # 2x block wall time > 30 s default


def test_block_stats_concurrent_blocks_add_up():
    s = BlockStats("w")
    _block(s, now=10.0)
    _block(s, now=10.0)  # a second thread finished an equal block at the same time
    assert s.rates(now=10.0)[0] == pytest.approx(400.0)


def test_record_block_outside_worker_is_noop():
    record_block(
        run_id="r",
        phase="p",
        chains=1,
        draws=1,
        grad_evals=1,
        seconds=1.0,
        compile_seconds=0.0,
        acceptance_mean=1.0,
        divergences=0,
    )


def test_worker_metrics_heartbeat_prometheus_and_routes(harness):
    install(harness.client)
    install(harness.client)  # idempotent
    assert WORKER_PLUGIN_NAME in harness.scheduler.worker_plugins
    assert SCHEDULER_PLUGIN_NAME in harness.scheduler.plugins
    harness.client.gather(harness.run_blocks("run-a"))
    workers = harness.workers
    assert len(workers) == 2

    # (a) heartbeats carry the metrics into WorkerState.metrics
    def scheduler_rates():  # wait until a heartbeat after the last block arrived (not an earlier test's run)
        ms = {w: harness.scheduler.workers[w].metrics for w in workers}
        if all((m.get("dhmc_blocks_done") or 0) >= 4 and m.get("dhmc_run_id") == "run-a" for m in ms.values()):
            return {w: m["dhmc_chain_draws_per_s"] for w, m in ms.items()}
        return None

    rates = harness.wait_for(scheduler_rates, timeout=20)
    assert all(v > 0 for v in rates.values())
    ms = harness.scheduler.workers[workers[0]].metrics
    assert ms["dhmc_run_id"] == "run-a" and ms["dhmc_phase"] == "sampling"
    assert ms["dhmc_blocks_done"] >= 4 and ms["dhmc_grad_evals_per_s"] > 0
    assert rates[workers[1]] > rates[workers[0]]  # worker 1 runs twice the chains

    # (b) each worker's own /metrics endpoint
    for w in workers:
        text = harness.get(harness.worker_port(w), "/metrics").decode()
        lines = {ln.split("{")[0]: float(ln.rsplit(" ", 1)[1]) for ln in text.splitlines() if ln.startswith("dhmc_")}
        for name in (
            "dhmc_chain_draws_total",
            "dhmc_grad_evals_total",
            "dhmc_blocks_done_total",
            "dhmc_chain_draws_per_s",
            "dhmc_grad_evals_per_s",
            "dhmc_acceptance",
        ):
            assert lines.get(name, 0) > 0, (w, name, text[-2000:])
        assert f'dhmc_run_info{{phase="sampling",run_id="run-a",worker="{w}"}} 1.0' in text

    # (c) scheduler routes
    recs = harness.get_json("/dhmc/api/workers")
    assert sorted(r["worker"] for r in recs) == workers
    for r in recs:
        assert r["chain_draws_per_s"] > 0 and r["grad_evals_per_s"] > 0 and r["blocks_done"] >= 4
        assert {
            "chain_draws",
            "grad_evals",
            "acceptance",
            "divergences",
            "compile_seconds",
            "sampling_seconds",
            "run_id",
            "phase",
        } <= set(r)
    html = harness.get(harness.port, "/dhmc").decode()
    assert len(html) > 500 and "<title>dhmc" in html and workers[0] in html
    assert len(harness.get(harness.port, "/dhmc/")) > 500  # trailing slash too


def test_publish_progress_reaches_route(harness):
    install(harness.client)
    conv = {"mu": {"rhat": 1.3, "ess_bulk": 12.5}, "tau": {"rhat": float("nan"), "ess_bulk": 3.0}}
    for k in (1, 2, 3):
        publish_progress(
            harness.client,
            {
                "run_id": "run-p",
                "phase": "sampling",
                "blocks_done": k,
                "blocks_total": 10,
                "chains": 8,
                "draws_done": 50 * k,
                "draws_total": 500,
                "elapsed_s": 1.5 * k,
                "convergence": conv,
            },
        )
    publish_progress(harness.client, {"run_id": "odd", "x": object(), "y": {1: (2, 3)}})  # never raises
    prog = harness.wait_for(
        lambda: (p := harness.get_json("/dhmc/api/progress")).get("run-p", {}).get("blocks_done") == 3 and p
    )
    rec = prog["run-p"]
    assert rec["blocks_total"] == 10 and rec["convergence"]["mu"] == {"rhat": 1.3, "ess_bulk": 12.5}
    assert rec["convergence"]["tau"]["rhat"] is None  # NaN -> null keeps the JSON valid
    # the totals are sampled at 1 Hz on the scheduler from the install on: wait for the first sample too (with no
    # test of the dashboard in a browser before this one, as in the quick suite, it may not have been taken yet)
    hist = harness.wait_for(lambda: (h := harness.get_json("/dhmc/api/history"))["rhat"].get("run-p") and h["t"] and h)
    assert hist["rhat"]["run-p"] == [[1, 1.3], [2, 1.3], [3, 1.3]]
    assert len(hist["t"]) == len(hist["total"]) >= 1
    assert len(harness.scheduler.get_events(PROGRESS_TOPIC)) >= 3


def test_install_twice_and_distributed_internals_pinned(harness):
    """Pin the distributed internals dhmc.observe relies on (2026.8)."""
    from distributed.http.routing import RoutingApplication
    from tornado.web import Application

    sched = harness.scheduler
    install(harness.client)
    # a second client gets its own install() call: registration must stay single
    from distributed import Client

    with Client(harness.client.scheduler.address) as c2, ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: install(c2), range(8)))  # concurrent, repeated calls
    app = sched.http_application
    assert isinstance(app, RoutingApplication) and isinstance(app, Application)
    patterns = _route_patterns(app.default_router)
    assert sum("/dhmc/api/workers" in p for p in patterns) == 1
    assert sum("/dhmc/api/progress" in p for p in patterns) == 1
    assert sum("/dhmc/api/history" in p for p in patterns) == 1
    assert add_routes(sched) is False
    assert _http_prefix(app) == ""  # found distributed's "/health" route, no prefix
    assert any(p.endswith("/health$") for p in patterns)
    # SchedulerPlugin.log_event hook + Scheduler.get_events exist
    from distributed.diagnostics.plugin import SchedulerPlugin

    assert callable(SchedulerPlugin.log_event) and callable(sched.get_events)
    # Worker.metrics is a dict of callables, called with the worker, per heartbeat
    w = harness.workers[0]
    keys = harness.client.run(
        lambda dask_worker: sorted(k for k in dask_worker.metrics if k.startswith("dhmc_")), workers=[w]
    )[w]
    assert keys == sorted(METRIC_KEYS)


def test_bokeh_workers_table_shows_dhmc_columns(harness):
    """The stock dashboard's Workers table picks the dhmc_* scalars up as extra columns."""
    from distributed.dashboard.components.scheduler import WorkerTable

    install(harness.client)
    harness.client.gather(harness.run_blocks("run-t", n_blocks=1))
    harness.wait_for(lambda: all("dhmc_chain_draws_per_s" in ws.metrics for ws in harness.scheduler.workers.values()))
    table = harness.client.sync(_make_table, WorkerTable, harness.scheduler)
    assert {"dhmc_chain_draws_per_s", "dhmc_grad_evals_per_s", "dhmc_blocks_done"} <= set(table.extra_names)


@pytest.mark.parametrize(
    ("link", "url"),
    [
        ("http://127.0.0.1:8787/status", "http://127.0.0.1:8787/dhmc"),
        ("https://host:8787/foo/status/", "https://host:8787/foo/dhmc"),  # a prefix stays
        ("http://hub/user/ann/proxy/8787/status?token=t", "http://hub/user/ann/proxy/8787/dhmc?token=t"),
        ("http://host:8787", "http://host:8787/dhmc"),
        ("http://host:8787/foo/", "http://host:8787/foo/dhmc"),
        ("", None),
        (None, None),
    ],
)
def test_page_url_replaces_status_with_dhmc(link, url):
    assert page_url(SimpleNamespace(dashboard_link=link)) == url


def test_page_url_without_a_dashboard():
    class NoDashboard:
        @property
        def dashboard_link(self):
            raise KeyError("dashboard")  # what Client.dashboard_link raises when the scheduler serves none

    assert page_url(NoDashboard()) is None


def test_routes_honour_http_prefix():
    """A scheduler started with ``http_prefix`` gets the routes under that prefix; ``page_url`` finds the page."""
    import dask
    from distributed import Client, LocalCluster

    with (
        dask.config.set({"distributed.dashboard.link": "{scheme}://{host}:{port}/foo/status"}),
        LocalCluster(
            n_workers=0,
            processes=False,
            protocol="tcp://",
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
            scheduler_kwargs={"http_prefix": "/foo"},
        ) as cluster,
        Client(cluster) as client,
    ):
        install(client)
        port = client.scheduler_info()["services"]["dashboard"]
        assert json.loads(_get(port, "/foo/dhmc/api/workers")) == []
        assert len(_get(port, "/foo/dhmc")) > 500
        url = page_url(client)
        assert url == f"http://127.0.0.1:{port}/foo/dhmc"
        with urllib.request.urlopen(url, timeout=10) as r:
            assert "<title>dhmc" in r.read().decode()


def _get(port: int, path: str) -> bytes:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
        return r.read()


async def _make_table(cls, scheduler):
    table = cls(scheduler)
    table.update()
    return table


RUNTIME_SCRIPT = textwrap.dedent(
    """
    import json, sys, time, urllib.request
    from distributed import Client, LocalCluster

    def main():
        with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                          dashboard_address="127.0.0.1:0", worker_dashboard_address="127.0.0.1:0") as cl, \\
                Client(cl) as c:
            assert not [m for m in sys.modules if m == "dhmc" or m.startswith("dhmc.")]
            from dhmc.observe.metrics import install, record_block
            w = list(c.scheduler_info()["workers"])[0]
            kw = dict(run_id="late", phase="warmup", chains=2, draws=10, grad_evals=200, seconds=0.1,
                      compile_seconds=0.0, acceptance_mean=0.7, divergences=0)
            c.submit(record_block, **kw, workers=[w], pure=False).result()  # before install: lazy path
            deadline = time.monotonic() + 20
            while not cl.scheduler.workers[w].metrics.get("dhmc_chain_draws_per_s"):
                assert time.monotonic() < deadline, "lazy metrics never reached the scheduler"
                time.sleep(0.2)
            install(c)
            port = c.scheduler_info()["services"]["dashboard"]
            url = f"http://127.0.0.1:{port}/dhmc/api/workers"
            print(json.dumps(json.loads(urllib.request.urlopen(url, timeout=10).read())))

    if __name__ == "__main__":
        main()
    """
)


@pytest.mark.slow  # a fresh process and a cluster of its own; the other tests install on the session's cluster
def test_install_on_cluster_started_before_import(tmp_path):
    script = tmp_path / "late_install.py"
    script.write_text(RUNTIME_SCRIPT)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=150, env=env, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    recs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(recs) == 1 and recs[0]["chain_draws_per_s"] > 0 and recs[0]["phase"] == "warmup"

"""Render /dhmc in Debian's headless chromium during a fake ongoing run."""

from __future__ import annotations

import re
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from dhmc.observe.dashboard import publish_progress
from dhmc.observe.metrics import install

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"

# Slow (each test starts headless chromium two or three times); the quick suite reads the dashboard's routes and
# its page over HTTP (test_metrics.py).
pytestmark = [
    pytest.mark.slow,
    pytest.mark.browser,
    pytest.mark.timeout(240),
    pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs /usr/bin/chromium"),
]

RATE_RE = re.compile(r'<span class="rate" data-worker="([^"]+)" data-metric="chain_draws_per_s">([^<]+)</span>')


def _chromium(url: str, profile: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--window-size=1280,1000",
        "--virtual-time-budget=5000",
        *extra,
        url,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90)


def test_dashboard_renders_worker_rates(harness, tmp_path):
    from distributed import Event

    install(harness.client)
    stop = f"dhmc-stop-{uuid.uuid4().hex}"
    futures = harness.run_blocks("demo-run", n_blocks=0, block_s=0.25, stop=stop)
    try:
        workers = harness.workers
        harness.wait_for(lambda: all(r["chain_draws_per_s"] > 0 for r in harness.get_json("/dhmc/api/workers")))
        params = ("mu", "tau", "theta[0]", "theta[1]")
        for k in range(1, 7):  # a driver publishing progress as blocks arrive
            conv = {p: {"rhat": 1.0 + 0.4 / k / (i + 1), "ess_bulk": 35.0 * k * (i + 1)} for i, p in enumerate(params)}
            publish_progress(
                harness.client,
                {
                    "run_id": "demo-run",
                    "phase": "sampling",
                    "blocks_done": 2 * k,
                    "blocks_total": 16,
                    "chains": 12,
                    "draws_done": 100 * k,
                    "draws_total": 800,
                    "elapsed_s": 2.5 * k,
                    "convergence": conv,
                },
            )
            time.sleep(0.3)
        harness.wait_for(lambda: harness.get_json("/dhmc/api/progress").get("demo-run", {}).get("blocks_done") == 12)

        url = f"http://127.0.0.1:{harness.port}/dhmc"
        t0 = time.monotonic()
        dom = _chromium(url, tmp_path / "profile-dom", "--dump-dom")
        dom_s = time.monotonic() - t0
        assert dom.returncode == 0, dom.stderr[-3000:]
        body = re.sub(r"<script.*?</script>", "", dom.stdout, flags=re.S)  # only what JS rendered
        rates = {w: float(v.replace(",", "")) for w, v in RATE_RE.findall(body)}
        assert set(rates) == set(workers), body[-3000:]
        assert all(v > 0 for v in rates.values()), rates
        assert "12 / 16" in body and "demo-run" in body and "theta[1]" in body

        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "dashboard.png"
        shot.unlink(missing_ok=True)
        t0 = time.monotonic()
        res = _chromium(url, tmp_path / "profile-shot", f"--screenshot={shot}")
        shot_s = time.monotonic() - t0
        assert res.returncode == 0 and shot.stat().st_size > 10_000, res.stderr[-3000:]
        print(f"chromium --dump-dom {dom_s:.1f} s, --screenshot {shot_s:.1f} s")
    finally:
        Event(stop, client=harness.client).set()
        harness.client.gather(futures)
        shutil.rmtree(tmp_path / "profile-dom", ignore_errors=True)
        shutil.rmtree(tmp_path / "profile-shot", ignore_errors=True)


PARAM_RE = re.compile(r'<tr data-param="([^"]+)">')


def test_convergence_table_sorts_naturally_and_worst_first(harness, tmp_path):
    install(harness.client)
    names = [f"x[{i}]" for i in range(40)]
    rhat = {name: 1.0 + ((7 * i) % 40) / 1000 for i, name in enumerate(names)}  # worst are not the first names
    ess = {name: 50.0 + (11 * i) % 40 for i, name in enumerate(names)}
    conv = {name: {"rhat": rhat[name], "ess_bulk": ess[name]} for name in names}
    record = {"run_id": "wide-run", "phase": "sampling", "blocks_done": 3, "blocks_total": 9, "chains": 64,
              "draws_done": 300, "draws_total": 900, "elapsed_s": 3.0, "convergence": conv}
    publish_progress(harness.client, record)
    harness.wait_for(lambda: harness.get_json("/dhmc/api/progress").get("wide-run", {}).get("blocks_done") == 3)
    url = f"http://127.0.0.1:{harness.port}/dhmc"

    def shown(fragment: str, name: str) -> list[str]:
        dom = _chromium(url + fragment, tmp_path / f"profile-{name}", "--dump-dom")
        assert dom.returncode == 0, dom.stderr[-3000:]
        return PARAM_RE.findall(re.sub(r"<script.*?</script>", "", dom.stdout, flags=re.S))

    by_rhat = sorted(names, key=lambda n: -rhat[n])
    assert shown("", "auto") == by_rhat[:16]  # more rows than fit: the worst R-hat first
    assert shown("#sort=name&all=1", "name") == names  # natural order: x[2] before x[10]
    assert shown("#sort=ess", "ess") == sorted(names, key=lambda n: ess[n])[:16]
    for name in ("auto", "name", "ess"):
        shutil.rmtree(tmp_path / f"profile-{name}", ignore_errors=True)

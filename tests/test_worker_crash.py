"""A block that crashes its workers ends the run with WorkerCrashError in seconds; the store resumes bitwise.

The log density calls back into Python (``jax.pure_callback``, once per batched evaluation of its
value: gradients do not need it) and, once a marker file exists, the worker process running it
writes a line to stderr and SIGKILLs itself: every worker that picks up a block dies, as with a
segfaulting custom call.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr
import zarr

import dhmc
from dhmc import cli

DRIVER = os.getpid()  # shipped by value: workers compare their pid with the driver's
MARKER = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"dhmc-test-crash-{DRIVER}")


def _with_callback(fn, x):
    """``fn(x)`` on the host, once per batch; its zeros are added to the log density."""
    zeros = lambda v: (fn(v), np.zeros(v.shape[:-1], v.dtype))[1]
    out = jax.pure_callback(zeros, jax.ShapeDtypeStruct((), x.dtype), jax.lax.stop_gradient(x),
                            vmap_method="broadcast_all")
    return jax.lax.stop_gradient(out)


def _die_if_marked(x):
    if os.getpid() != DRIVER and os.path.exists(MARKER):
        sys.stderr.write("the model's callback kills this worker now\n")
        sys.stderr.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def crashing_logdensity(p):
    return -0.5 * jnp.sum((p["x"] - 1.0) ** 2) + _with_callback(_die_if_marked, p["x"])


def _raise_on_a_worker(x):
    if os.getpid() != DRIVER:
        raise FloatingPointError("model blew up")


def raising_logdensity(p):
    return -0.5 * jnp.sum(p["x"] ** 2) + _with_callback(_raise_on_a_worker, p["x"])


KW = dict(init={"x": jnp.zeros(2)}, chains=32, chains_per_task=16, draws=6400, warmup=100, seed=4, progress=False)


def _done(path) -> int:
    try:
        return int(zarr.open_group(str(path), mode="r")["dhmc/done"][...].sum())
    except Exception:  # noqa: BLE001 - not created yet
        return 0


def _same(a, b) -> bool:
    a, b = (xr.open_datatree(p, engine="zarr", consolidated=False) for p in (a, b))
    return all(np.array_equal(a[g][v].values, b[g][v].values) for g in ("posterior", "sample_stats")
               for v in a[g].data_vars)


class _Background:
    """``dhmc.sample(target, store=store, **kw)`` in a thread; ``error`` and ``at`` (monotonic s) once it fails."""

    def __init__(self, target, store, **kw):
        self.store, self.error, self.at = store, None, None
        self.thread = threading.Thread(target=self._run, args=(target, kw))
        self.thread.start()

    def _run(self, target, kw):
        try:
            dhmc.sample(target, store=self.store, **kw)
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            self.error, self.at = e, time.monotonic()

    def wait_for_blocks(self, n: int = 2, poll: float = 0.05) -> None:
        deadline = time.monotonic() + 300
        while _done(self.store) < n and time.monotonic() < deadline and self.thread.is_alive():
            time.sleep(poll)

    def join(self, seconds: float, hang: str):
        self.thread.join(seconds)
        assert not self.thread.is_alive(), hang
        return self.error


@pytest.fixture
def marker():
    yield MARKER
    if os.path.exists(MARKER):
        os.remove(MARKER)


@pytest.mark.slow
def test_a_crashing_block_ends_the_run_in_seconds_and_the_store_resumes(tmp_path, marker):
    dhmc.sample(crashing_logdensity, store=tmp_path / "ref.zarr", **KW)
    total = zarr.open_group(str(tmp_path / "ref.zarr"), mode="r")["dhmc/done"].size
    assert total >= 6, "too few blocks to crash in the middle"

    store = tmp_path / "hit.zarr"
    run = _Background(crashing_logdensity, store, **KW)
    run.wait_for_blocks()
    open(marker, "w").close()
    marked = time.monotonic()
    error = run.join(300, "the run hangs after its workers crashed")
    assert isinstance(error, dhmc.WorkerCrashError), repr(error)
    seconds = run.at - marked
    print(f"WorkerCrashError {seconds:.1f} s after the first crash")
    assert seconds < 60
    message = str(error)
    assert "signal 9 (SIGKILL)" in message and "crashing_logdensity" in message, message
    # two blocks run at once, so deaths may arrive in pairs: 3 or 4 of them end the run
    count = re.search(r"killed (\d+) (worker|times)", message)
    assert count and int(count.group(1)) >= 3 and "chains" in message, message
    assert "the model's callback kills this worker now" in message
    assert f"dhmc resume {store}" in message

    written = _done(store)
    assert 2 <= written < total
    os.remove(marker)
    dhmc.resume(store, target=crashing_logdensity, init=KW["init"], progress=False)
    assert _done(store) == total
    assert _same(tmp_path / "ref.zarr", store)


def test_a_block_that_raises_fails_at_once_with_the_users_error(client2):
    """On the session's cluster: an error is no crash, the workers live on (the crashes above start their own)."""
    start = time.monotonic()
    with pytest.raises(Exception, match="model blew up"):
        dhmc.sample(raising_logdensity, init={"x": jnp.zeros(2)}, chains=16, draws=20, warmup=20, progress=False,
                    cluster=client2)
    assert time.monotonic() - start < 120
    assert len(client2.scheduler_info()["workers"]) == 2


def test_the_command_line_exits_1_with_the_whole_crash_message(monkeypatch, capsys):
    def crash(*args, **kwargs):
        raise dhmc.WorkerCrashError("a sample block ... killed 3 worker(s); the last, dhmc-0, killed by signal 11 "
                                    "(SIGSEGV)\nits last lines on stderr:\n    Fatal Python error")

    monkeypatch.setattr(dhmc, "sample", crash)
    assert cli.main(["sample", "coin_toss", "--out", "x.zarr"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("dhmc: error: a sample block") and "SIGSEGV" in err and "Fatal Python error" in err


def _slowly(x):
    time.sleep(0.002)  # a few seconds per block: the workers are killed while blocks remain


def slow_logdensity(p):
    return -0.5 * jnp.sum((p["x"] - 1.0) ** 2) + _with_callback(_slowly, p["x"])


@pytest.mark.slow
def test_losing_every_worker_for_good_ends_the_run_and_the_store_resumes(tmp_path):
    import dask
    import psutil

    kw = dict(KW, cluster_options={"max_restarts": 0})
    dhmc.sample(slow_logdensity, store=tmp_path / "ref.zarr", **KW)
    store = tmp_path / "lost.zarr"
    with dask.config.set({"dhmc.no-workers-timeout": "5s"}):
        started = time.time()
        run = _Background(slow_logdensity, store, **kw)
        run.wait_for_blocks(poll=0.02)
        workers = [p for p in psutil.Process().children(recursive=True)  # this run's workers, not others'
                   if "dhmc.distributed.child" in " ".join(p.cmdline()) and p.create_time() >= started - 1]
        assert len(workers) == 2, workers
        for worker in workers:
            worker.kill()
        killed = time.monotonic()
        error = run.join(120, "the run hangs without workers")
    assert isinstance(error, dhmc.NoWorkersError), repr(error)
    assert run.at - killed < 30 and f"dhmc resume {store}" in str(error)
    total = zarr.open_group(str(store), mode="r")["dhmc/done"].size
    assert _done(store) < total
    dhmc.resume(store, target=slow_logdensity, init=KW["init"], progress=False)
    assert _same(tmp_path / "ref.zarr", store)


def _stuck_if_marked(x):
    while os.getpid() != DRIVER and os.path.exists(MARKER):
        time.sleep(0.1)


def stuck_logdensity(p):
    return -0.5 * jnp.sum((p["x"] - 1.0) ** 2) + _with_callback(_stuck_if_marked, p["x"])


@pytest.mark.slow
def test_a_stuck_block_ends_the_run_after_the_block_timeout_and_the_store_resumes(tmp_path, marker):
    import dask

    dhmc.sample(stuck_logdensity, store=tmp_path / "ref.zarr", **KW)
    store = tmp_path / "stuck.zarr"
    with dask.config.set({"dhmc.block-timeout": "4s"}):
        run = _Background(stuck_logdensity, store, **KW)
        run.wait_for_blocks()
        open(marker, "w").close()
        stuck = time.monotonic()
        error = run.join(120, "the run hangs on a stuck block")
    assert isinstance(error, dhmc.BlockTimeoutError), repr(error)
    assert run.at - stuck < 30
    assert "dhmc.block-timeout" in str(error) and f"dhmc resume {store}" in str(error)
    os.remove(marker)
    dhmc.resume(store, target=stuck_logdensity, init=KW["init"], progress=False)
    assert _same(tmp_path / "ref.zarr", store)

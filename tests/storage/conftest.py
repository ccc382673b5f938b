"""A real dhmc store, and real processes holding a store's lock."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

HOLDER = textwrap.dedent("""
    import sys, time
    from dhmc.storage.lock import StoreLock
    StoreLock(sys.argv[1], run_id="holder").acquire()
    print("LOCKED", flush=True)
    time.sleep(600)
""")


@pytest.fixture(scope="session")
def made_store(client2, tmp_path_factory):
    """A store written by a real (tiny) run of the built-in coin_toss model; copy it before changing it."""
    import dhmc

    path = tmp_path_factory.mktemp("made") / "coin.zarr"
    dhmc.sample("coin_toss", chains=8, draws=10, warmup=10, chains_per_task=4, cluster=client2, store=path,
                progress=False)
    return path


@pytest.fixture
def dhmc_store(made_store, tmp_path):
    """A fresh copy of :func:`made_store`."""
    path = tmp_path / "coin.zarr"
    shutil.copytree(made_store, path)
    return path


@pytest.fixture
def spawn():
    """Start ``python -c code *args`` with this checkout first on the path; killed at the end if still running."""
    procs = []
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}

    def start(code: str, *args) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", code, *map(str, args)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


@pytest.fixture
def hold_lock(spawn):
    """Start a process that takes a store's lock and keeps it; returns the process once it holds it."""

    def start(store) -> subprocess.Popen:
        proc = spawn(HOLDER, store)
        line = proc.stdout.readline()
        if line.strip() != "LOCKED":
            proc.kill()
            pytest.fail(f"the holder did not take the lock: {line!r} {proc.communicate()[1][-2000:]}")
        return proc

    return start

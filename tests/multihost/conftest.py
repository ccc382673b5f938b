"""Fixtures for tests on the multi-host Slurm in network namespaces (``deploy/local-slurm/up-multi.sh``).

Every test here is marked ``multihost`` and ``slow`` (also added below for modules that forget), and
needs root: ``sudo deploy/local-slurm/up-multi.sh 3 && pytest -m multihost tests/multihost``.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import pytest

from . import netns

SKIP_REASON = "multi-host Slurm not up: run sudo deploy/local-slurm/up-multi.sh 3 (see deploy/README.md)"
HERE = Path(__file__).resolve().parent
REPAIR_TIMEOUT = 60  # s: a restarted slurmd registers within a second or two; a cut node at once


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Mark every test under tests/multihost ``multihost`` and ``slow`` (before ``-m`` selects)."""
    for item in items:
        if HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.multihost)
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="package")
def multihost():
    """The :class:`netns.MultiHostEnv` of the running multi-host Slurm; skips when it is not up.

    If up-multi.sh's state file exists but a node is cut off or its slurmd is gone (say, an earlier
    session was interrupted in the middle of a fault), repairs that first. For the package (tests/multihost),
    ``SLURM_CONF`` points at the multi-host config, so sbatch/squeue/scancel, including those that
    dask-jobqueue starts, talk to it; the previous value is put back after the package's last test.
    """
    env = netns.multihost_env()
    if env is None and netns.read_hosts_env() is not None and os.geteuid() == 0:
        try:
            netns.repair(netns.read_hosts_env(), timeout=REPAIR_TIMEOUT)
        except Exception as exc:  # any failure here just means "not up"
            warnings.warn(f"repairing the multi-host Slurm failed: {exc}", stacklevel=1)
        env = netns.multihost_env()
    if env is None:
        pytest.skip(SKIP_REASON)
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = env.slurm_conf
    try:
        yield env
    finally:
        if old is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = old


@pytest.fixture(autouse=True)
def restore_hosts(multihost):
    """After each test: heal every cut link, restart every host whose slurmd is gone, and wait
    (bounded) until all nodes are idle, so one test's fault never leaks into the next.

    A node that is still unusable (down, not responding) after that errors the test's teardown;
    one that is only still busy (a job of the test finishing) gives a warning.
    """
    yield
    states = netns.repair(multihost, timeout=REPAIR_TIMEOUT)
    bad = {n: s for n, s in states.items() if s not in netns.HEALTHY and not s.startswith("completing")}
    missing = set(multihost.nodes) - set(states)
    if bad or missing:
        pytest.fail(
            f"multi-host Slurm not restored after {REPAIR_TIMEOUT} s: {states or 'no answer from sinfo'}; "
            f"logs in {multihost.state_dir}/log"
        )
    if set(states.values()) != {"idle"}:
        warnings.warn(f"multi-host nodes still busy after the test: {states}", stacklevel=1)

"""Shared fixtures: real multi-process LocalClusters on loopback, reused within a session."""

from __future__ import annotations

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402


def _cluster(n_workers: int):
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=n_workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address=None)
    return cluster, Client(cluster)


@pytest.fixture(scope="session")
def client2():
    """A 2-worker LocalCluster with one thread per worker process."""
    cluster, client = _cluster(2)
    yield client
    client.close()
    cluster.close()


@pytest.fixture(scope="session")
def client1():
    """A 1-worker LocalCluster with one thread per worker process."""
    cluster, client = _cluster(1)
    yield client
    client.close()
    cluster.close()


@pytest.fixture(scope="session")
def _embedded_client():
    """One embedded cluster (what ``cluster=None`` starts: pinned ``dhmc.distributed.child`` workers), started once."""
    from dhmc.distributed.connect import connect

    client, close = connect(None, {})
    yield client
    close()


@pytest.fixture(scope="module")
def embedded(_embedded_client):
    """Runs with ``cluster=None`` in the module use one embedded cluster started once a session, not one each.

    Everything else of ``cluster=None`` is as a user gets it: the driver compiles the block programs and ships
    them to the embedded workers, which load them. Tests of the start itself (a driver killed while its workers
    start, TLS off loopback, a script without a main guard, scaling studies) start embedded clusters of their own.
    """
    from dhmc.distributed import startup

    started = startup._connect

    def connect(cluster, options):
        if cluster is None and not options:
            return _embedded_client, lambda: None
        return started(cluster, options)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(startup, "_connect", connect)
        yield _embedded_client


@pytest.fixture
def hold():
    """Create the path it gives to stall ``held_model.held_gaussian``'s workers, remove it to let them go on;
    removed after the test, with the ``HOLD.<host>`` and ``HOLD.keep.<host>`` files."""
    import glob

    from held_model import HOLD

    try:
        yield HOLD
    finally:
        for path in glob.glob(f"{HOLD}*"):
            os.remove(path)

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

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

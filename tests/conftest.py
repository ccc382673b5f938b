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


def within_mc_error(draws, exact_mean, exact_sd, z=4.5):
    """Assert mean and sd of ``draws`` (chain, draw) match exact values within Monte Carlo error (ArviZ ESS)."""
    import arviz as az
    import numpy as np

    draws = np.asarray(draws, float)
    ess = float(az.ess(draws, method="bulk"))
    mean, sd = draws.mean(), draws.std()
    mcse = sd / np.sqrt(ess)
    assert abs(mean - exact_mean) < z * mcse, (
        f"mean {mean:.5f} vs exact {exact_mean:.5f} (mcse {mcse:.2g}, ess {ess:.0f})")
    tol = max(0.05, 3 / np.sqrt(ess))
    assert abs(sd / exact_sd - 1) < tol, f"sd {sd:.5f} vs exact {exact_sd:.5f} (tolerance {tol:.2%})"

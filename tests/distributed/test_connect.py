"""``connect``: a cluster that cannot start says why, in one line."""

from __future__ import annotations

import socket

import pytest

from dhmc.distributed import connect as connect_module
from dhmc.distributed import embedded
from dhmc.distributed.connect import connect
from dhmc.errors import ClusterError


def test_a_cluster_that_cannot_start_says_why(monkeypatch):
    """Dask says only "Cluster failed to start: Scheduler failed to start."; dhmc names the cause under it."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        monkeypatch.setattr(embedded, "_free_port", lambda host: holder.getsockname()[1])
        with pytest.raises(ClusterError, match=r"^the local cluster failed to start: .*Address already in use"):
            connect(None, {"n_workers": 1})


def test_dhmcs_own_cluster_errors_pass_unchanged(monkeypatch):
    def missing(**options):
        raise ClusterError("cluster='slurm' needs dask-jobqueue: pip install 'dhmc[slurm]'")

    monkeypatch.setattr(connect_module, "slurm_cluster", missing)
    with pytest.raises(ClusterError, match=r"^cluster='slurm' needs dask-jobqueue"):
        connect("slurm")

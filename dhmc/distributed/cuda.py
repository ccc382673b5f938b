"""The CUDA cluster: dask-cuda's ``LocalCUDACluster``, one worker per GPU, each JAX confined to its GPU."""

from __future__ import annotations

import os

from dhmc.distributed import network
from dhmc.errors import ClusterError

__all__ = ["cuda_cluster"]


def cuda_cluster(n_workers=None, host="127.0.0.1", dashboard_address="127.0.0.1:0", memory_fraction=0.8,
                 **kwargs):
    """``dask_cuda.LocalCUDACluster``: one worker per GPU, JAX confined to its GPU."""
    try:
        from dask_cuda import LocalCUDACluster
    except ImportError:
        raise ClusterError("cluster='cuda' needs dask-cuda: pip install 'dhmc[cuda]'") from None
    # LocalCUDACluster rotates CUDA_VISIBLE_DEVICES per worker; its env= replaces (not extends) the
    # environment it passes, so set JAX's variables in this process and let workers inherit them.
    os.environ.setdefault("JAX_CUDA_VISIBLE_DEVICES", "0")  # each worker's first visible GPU is its own
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    os.environ.setdefault("XLA_CLIENT_MEM_FRACTION", str(memory_fraction))
    security = network.security_for(host, kwargs.pop("security", None))  # mutual TLS, on loopback too
    kwargs.update(security=security, protocol="tls://" if security.require_encryption else "tcp://")
    return LocalCUDACluster(n_workers=n_workers, threads_per_worker=1, host=host,
                            dashboard_address=dashboard_address, resources={"GPU": 1}, **kwargs)

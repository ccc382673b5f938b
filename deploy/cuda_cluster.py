#!/usr/bin/env python3
"""Start a long-lived Dask cluster on one multi-GPU machine: one worker per GPU, one thread each.

    python deploy/cuda_cluster.py                       # all visible GPUs, scheduler on 127.0.0.1:8786
    python deploy/cuda_cluster.py --devices 0,1 --mem-fraction 0.5
    dhmc sample eight_schools --cluster tcp://127.0.0.1:8786 --out eight.zarr   # in another shell

It prints the scheduler address and serves until Ctrl-C. Needs dask-cuda (pip install 'dhmc[cuda]').
For a one-off run, `dhmc sample ... --cluster cuda` starts the same cluster inside the driver instead.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time


def jax_worker_env(mem_fraction: float | None) -> dict[str, str]:
    """Environment that confines each worker's JAX to its own GPU without preallocating it."""
    env = {
        # dask-cuda gives worker i CUDA_VISIBLE_DEVICES rotated to start at its own GPU ("i,i+1,...,0,..")
        # so the worker's GPU is JAX's local device 0; hide the others from JAX.
        "JAX_CUDA_VISIBLE_DEVICES": "0",
        "XLA_PYTHON_CLIENT_PREALLOCATE": "false",
    }
    if mem_fraction is not None:
        env["XLA_CLIENT_MEM_FRACTION"] = str(mem_fraction)  # older jaxlib: XLA_PYTHON_CLIENT_MEM_FRACTION
    return env


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=8786, help="scheduler port (0: any free one)")
    p.add_argument("--dashboard-address", default="127.0.0.1:8787")
    p.add_argument("--devices", default=None, help="GPUs, e.g. 0,1 (default: CUDA_VISIBLE_DEVICES or all)")
    p.add_argument("--mem-fraction", type=float, default=None, help="max GPU memory share per worker")
    p.add_argument("--local-directory", default=None, help="worker scratch space")
    p.add_argument("--scheduler-file", default=None, help="also write the scheduler address here (JSON)")
    args = p.parse_args(argv)

    try:
        from dask_cuda import LocalCUDACluster
    except ImportError:
        sys.exit("cuda_cluster.py needs dask-cuda: pip install 'dhmc[cuda]' on a machine with GPUs")
    from distributed import Client

    # LocalCUDACluster replaces any env= it is given with {"CUDA_VISIBLE_DEVICES": ...}, so set the
    # variables here: the workers' nannies inherit this process's environment.
    os.environ.update(jax_worker_env(args.mem_fraction))

    cluster = LocalCUDACluster(
        CUDA_VISIBLE_DEVICES=args.devices,
        threads_per_worker=1,
        host=args.host,
        scheduler_port=args.port,
        dashboard_address=args.dashboard_address,
        local_directory=args.local_directory,
        resources={"GPU": 1},
    )
    client = Client(cluster)
    if args.scheduler_file:
        client.write_scheduler_file(args.scheduler_file)
    n = len(cluster.workers)
    print(f"scheduler: {cluster.scheduler_address}  ({n} GPU workers)", flush=True)
    print(f"dashboard: {cluster.dashboard_link}", flush=True)
    print(f"use with:  dhmc sample MODEL --cluster {cluster.scheduler_address} --out STORE", flush=True)

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        pass
    finally:
        client.close()
        cluster.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

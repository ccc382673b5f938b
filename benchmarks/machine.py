"""Facts that make a number interpretable: the machine, its load, the versions, the date."""

from __future__ import annotations

import os
import platform
import subprocess
from datetime import UTC, datetime

__all__ = ["machine", "lscpu", "cores", "have_dask_cuda"]

PACKAGES = ("jax", "jaxlib", "numpyro", "blackjax", "dask", "distributed", "zarr", "xarray", "arviz", "dhmc")


def machine() -> dict:
    """Cores, load, memory, versions, date, host, and the JAX platforms asked for."""
    import importlib.metadata as md

    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    info = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cores_available": cores(),
        "loadavg_1_5_15": load,
        "versions": versions,
        "jax_platforms": os.environ.get("JAX_PLATFORMS"),
    }
    try:
        import psutil

        info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    return info


def lscpu() -> dict:
    """CPU model, core count and cache sizes from ``lscpu`` (empty where it is missing)."""
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    keys = ("Model name", "CPU(s)", "Core(s) per socket", "Socket(s)", "Thread(s) per core", "L1d cache",
            "L2 cache", "L3 cache")
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return {k: fields[k].strip() for k in keys if k in fields}


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def have_dask_cuda() -> bool:
    """Whether dask-cuda imports (missing, or broken against this dask: False)."""
    try:
        import dask_cuda  # noqa: F401
    except Exception:  # noqa: BLE001 - missing, or broken against this dask
        return False
    return True

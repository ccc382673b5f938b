"""Facts that make a number interpretable: the machine, its CPU, its load, the versions, the date."""

from __future__ import annotations

import functools
import os
import platform
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path

__all__ = ["machine", "cpu", "cpu_line", "cores", "have_dask_cuda"]

PACKAGES = ("jax", "jaxlib", "numpyro", "blackjax", "dask", "distributed", "zarr", "xarray", "arviz", "dhmc")
# the vector ISA extensions XLA's CPU backend chooses code by (x86 and Arm), recorded where present
ISA = ("avx", "avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
       "amx_tile", "amx_bf16", "amx_int8", "amx_fp16", "asimd", "sve", "sve2")
SYS_CPU = Path("/sys/devices/system/cpu")
CACHES = {(1, "Data"): "L1d", (2, "Unified"): "L2", (3, "Unified"): "L3"}


def machine() -> dict:
    """The CPU (:func:`cpu`), cores, load, memory, versions, date, host, and the JAX platforms asked for."""
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
        "cpu": cpu(),
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


@functools.cache
def cpu() -> dict:
    """The CPU: model, cores, sockets, threads per core, L1d/L2/L3 caches, vector ISA flags.

    Caches: ``lscpu``'s line as it prints it (e.g. ``"2 MiB (2 instances)"``, the total), and from sysfs
    (``cache/index*/{level,type,size,shared_cpu_list}``) the bytes of one instance, the number of instances
    and how many CPUs share one; without sysfs, the bytes per instance from ``lscpu -B``. Whatever cannot be
    read is left out: this never raises.
    """
    ls, ls_bytes = _lscpu(), _lscpu("-B")
    cpuinfo = _cpuinfo()
    info = {"model": cpuinfo.get("model name") or ls.get("Model name"), "cores_available": cores(),
            "logical_cpus": os.cpu_count(), "sockets": _sysfs_sockets() or _int(ls.get("Socket(s)")),
            "threads_per_core": _sysfs_threads_per_core() or _int(ls.get("Thread(s) per core"))}
    sysfs = _sysfs_caches()
    for name in CACHES.values():
        info[name] = {"lscpu": ls.get(f"{name} cache"),
                      **(sysfs.get(name) or _lscpu_cache_bytes(ls_bytes.get(f"{name} cache")))}
    flags = set((cpuinfo.get("flags") or cpuinfo.get("Features") or ls.get("Flags") or "").split())
    info["isa"] = [f for f in ISA if f in flags]
    return _prune(info)


def cpu_line(info: dict | None = None) -> str:
    """One line naming the CPU (``info``: a :func:`cpu` dict, default this machine's), for the head of a table:
    ``CPU: AMD EPYC, 2 cores available (1 socket(s), 1 thread(s)/core), L1d 32 KiB/core, L2 1 MiB/core, ...``."""
    info = cpu() if info is None else info
    cores_text = f"{info.get('cores_available', '?')} cores available"
    if info.get("logical_cpus") not in (None, info.get("cores_available")):
        cores_text += f" of {info['logical_cpus']} CPUs"
    topology = [f"{info[k]} {label}" for k, label in (("sockets", "socket(s)"), ("threads_per_core", "thread(s)/core"))
                if k in info]
    parts = [info.get("model", "unknown model"), cores_text + (f" ({', '.join(topology)})" if topology else "")]
    parts += [_cache_text(name, info.get(name, {}), info.get("threads_per_core", 1)) for name in CACHES.values()]
    parts.append(" ".join(f for f in info.get("isa", []) if f in ("avx2", "avx512f", "sve") or f.startswith("amx")))
    return "CPU: " + ", ".join(p for p in parts if p)


def _cache_text(name: str, cache: dict, threads_per_core: int) -> str:
    """``L2 1 MiB/core``, ``L3 32 MiB shared by 2 CPUs``, ``L2 1 MiB x2``, or lscpu's text, or ''."""
    if "bytes_per_instance" not in cache:
        return f"{name} {cache['lscpu']}" if "lscpu" in cache else ""
    size, shared = _human(cache["bytes_per_instance"]), cache.get("cpus_per_instance")
    if shared is None:
        return f"{name} {size} x{cache.get('instances', '?')}"
    return f"{name} {size}/core" if shared <= threads_per_core else f"{name} {size} shared by {shared} CPUs"


def _lscpu(*flags) -> dict:
    """``lscpu``'s ``key: value`` lines (empty where it is missing)."""
    try:
        text = subprocess.run(["lscpu", *flags], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in text.splitlines() if ":" in line)}


def _cpuinfo() -> dict:
    """The first processor's ``key: value`` lines of ``/proc/cpuinfo`` (empty where it is missing)."""
    out = {}
    for line in _read(Path("/proc/cpuinfo")).splitlines():
        if not line.strip():
            if out:
                break
            continue
        if ":" in line:
            k, v = line.split(":", 1)
            out.setdefault(k.strip(), v.strip())
    return out


def _sysfs_caches() -> dict:
    """``{"L2": {"bytes_per_instance", "instances", "cpus_per_instance"}, ...}`` from sysfs (empty without it)."""
    found = {}
    for index in sorted(SYS_CPU.glob("cpu[0-9]*/cache/index[0-9]*")):
        name = CACHES.get((_int(_read(index / "level")), _read(index / "type").strip()))
        size, shared = _size_bytes(_read(index / "size")), _read(index / "shared_cpu_list").strip()
        if name is None or size is None:
            continue
        c = found.setdefault(name, {"bytes_per_instance": size, "sharing": set()})
        c["sharing"].add(shared)
    return {name: {"bytes_per_instance": c["bytes_per_instance"], "instances": len(c["sharing"]),
                   "cpus_per_instance": len(_cpu_list(min(c["sharing"])))} for name, c in found.items()}


def _lscpu_cache_bytes(text) -> dict:
    """``lscpu -B``'s total, ``"2097152 (2 instances)"``, as bytes per instance and instances (empty if unreadable)."""
    m = re.fullmatch(r"(\d+)(?: \((\d+) instances?\))?", (text or "").strip())
    if not m:
        return {}
    instances = int(m.group(2) or 1)
    return {"bytes_per_instance": int(m.group(1)) // instances, "instances": instances}


def _sysfs_sockets():
    ids = {_read(p).strip() for p in SYS_CPU.glob("cpu[0-9]*/topology/physical_package_id")}
    return len(ids - {""}) or None


def _sysfs_threads_per_core():
    return len(_cpu_list(_read(SYS_CPU / "cpu0/topology/thread_siblings_list").strip())) or None


def _cpu_list(text: str) -> list[int]:
    """``"0-3,8"`` -> ``[0, 1, 2, 3, 8]`` (empty if unreadable)."""
    out = []
    try:
        for part in filter(None, text.split(",")):
            a, _, b = part.partition("-")
            out.extend(range(int(a), int(b or a) + 1))
    except ValueError:
        return []
    return out


def _size_bytes(text: str):
    """sysfs's ``"32K"`` / ``"1024K"`` / ``"32M"`` as bytes (None if unreadable)."""
    text = text.strip().upper()
    scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
    try:
        return int(text.rstrip("KMG")) * scale
    except ValueError:
        return None


def _human(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def _int(text):
    try:
        return int(str(text).strip())
    except (TypeError, ValueError):
        return None


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _prune(d: dict) -> dict:
    """Drop the fields that could not be read (None, empty), at every level."""
    out = {}
    for k, v in d.items():
        v = _prune(v) if isinstance(v, dict) else v
        if v not in (None, {}, [], ""):
            out[k] = v
    return out


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

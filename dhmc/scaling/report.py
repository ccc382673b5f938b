"""What a study's record says: speedup, efficiency and suspect points, the machine, ``scaling.json``.

Equal work is checked, not assumed: a strong study whose points differ in blocks or gradient evaluations
(a weak one: not in proportion to the workers) is marked ``"suspect": "unequal work"``; a point faster
than linear (``speedup > workers``), which equal blocks on pinned workers cannot be, is marked
``"suspect": "superlinear"``: its ``block_seconds`` against the baseline's then shows whether the machine
was slower while the baseline ran (other work on the machine or its host, which ``cpu_share`` cannot see
when it runs on the cores the baseline leaves free).
"""

from __future__ import annotations

import json
import os
import platform
import socket
from contextlib import suppress
from pathlib import Path

__all__ = ["derive", "load_average", "machine_info", "write_json"]


def derive(kind: str, runs: list[dict]) -> None:
    """Fill ``speedup`` and ``efficiency``, per model, relative to its own baseline; mark suspect points."""
    for model in {r["model"] for r in runs}:
        mine = [r for r in runs if r["model"] == model]
        if kind == "chains":
            base = min(mine, key=lambda r: r["chains"])["chain_draws_per_s"]
            best = max(r["chain_draws_per_s"] for r in mine)
            for r in mine:
                r["speedup"] = r["chain_draws_per_s"] / base
                r["efficiency"] = r["chain_draws_per_s"] / best
                _mark(r, [])
            continue
        first = min(mine, key=lambda r: r["workers"])
        w0, rate0 = first["workers"], first["chain_draws_per_s"]
        for r in mine:
            r["speedup"] = w0 * r["chain_draws_per_s"] / rate0
            r["efficiency"] = r["speedup"] / r["workers"]
            # the same from the fastest / slowest repeats of this point and the baseline's median
            r["speedup_min"] = w0 * r["chains"] * r["draws"] / r["seconds_max"] / rate0
            r["speedup_max"] = w0 * r["chains"] * r["draws"] / r["seconds_min"] / rate0
            r["block_seconds_vs_baseline"] = (r["block_seconds"] / first["block_seconds"]
                                              if r.get("block_seconds") and first.get("block_seconds") else None)
            _mark(r, _suspicions(kind, r, first))


def _suspicions(kind: str, run: dict, base: dict) -> list[tuple[str, str]]:
    """``(reason, detail)`` for a strong/weak point that is not equal work or is faster than linear."""
    found = []
    n, n0 = run["workers"], base["workers"]
    num, den = (1, 1) if kind == "strong" else (n, n0)  # weak: the work grows with the workers
    same = "the same as" if kind == "strong" else f"{n / n0:g}x"
    if len(set(run.get("grad_evals_all") or ())) > 1:
        found.append(("unequal work", f"the repeats did different numbers of gradient evaluations: "
                                      f"{run['grad_evals_all']}"))
    for key, label in (("grad_evals", "gradient evaluations"), ("blocks", "blocks")):
        mine, theirs = run.get(key), base.get(key)
        if mine is not None and theirs is not None and mine * den != theirs * num:
            found.append(("unequal work", f"{mine:,} {label}, not {same} the {n0}-worker point's {theirs:,}"))
    blocks_run = run.get("blocks_run_all")
    if blocks_run and any(b != run["blocks"] for b in blocks_run):
        found.append(("unequal work", f"the workers ran {blocks_run} blocks, not the plan's {run['blocks']}"))
    if run is not base and run["speedup"] > n:
        detail = (f"speedup {run['speedup']:.2f}x on {n} workers is more than {n}x, which equal blocks on "
                  f"{n} workers cannot give")
        b, b0 = run.get("block_seconds"), base.get("block_seconds")
        if b and b0:
            c, c0 = run.get("block_cpu_seconds"), base.get("block_cpu_seconds")
            cpu = f" (CPU {c0:.3f} s and {c:.3f} s)" if c and c0 else ""
            detail += (f"; a block took {b0:.3f} s at the {n0}-worker point and {b:.3f} s here{cpu}, "
                       f"{b0 / b:.2f}x: "
                       + ("the machine was slower while the baseline ran (other work on it or its host)"
                          if b0 > b else "the difference is outside the blocks (idle workers, overhead)"))
        found.append(("superlinear", detail))
    return found


def _mark(run: dict, found: list[tuple[str, str]]) -> None:
    reasons = list(dict.fromkeys(reason for reason, _ in found))
    run["suspect"] = ", ".join(reasons) or None
    if found:
        run["suspect_detail"] = "; ".join(detail for _, detail in found)
    else:
        run.pop("suspect_detail", None)


def machine_info() -> dict:
    """The driver machine: CPU, cores, memory, platform and library versions (imports no JAX)."""
    from importlib import metadata

    versions = {}
    for name in ("dhmc", "jax", "jaxlib", "numpy", "dask", "distributed", "numpyro", "xarray", "zarr",
                 "matplotlib", "dask-cuda", "dask-jobqueue"):
        with suppress(metadata.PackageNotFoundError):
            versions[name] = metadata.version(name)
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    memory = None
    with suppress(ValueError, OSError, AttributeError):
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return {
        "hostname": socket.gethostname(),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "cpu_model": _cpu_model(),
        "cpu_count": os.cpu_count(),
        "cores_available": len(cores),
        "memory_bytes": memory,
        "load_average": load_average(),
        "versions": versions,
    }


def _cpu_model() -> str:
    with suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, where the platform has them."""
    with suppress(OSError, AttributeError):
        return [round(x, 2) for x in os.getloadavg()]
    return None


def write_json(result: dict, out: Path) -> None:
    """Write ``out/scaling.json`` whole or not at all (a reader never sees half a file)."""
    path = out / "scaling.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2, default=_json_default) + "\n")
    tmp.replace(path)


def _json_default(value):
    with suppress(Exception):
        return value.item()
    return str(value)

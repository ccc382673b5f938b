"""Running a benchmark: one measurement per child process, its JSON record, tables, the exit status.

A benchmark is a module run from the repository root (``python -m benchmarks.throughput``); each of
its measurements runs the same module again in a fresh process (``--child CONFIG``), whose last
stdout line is the measurement's JSON record.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["REPO", "RESULTS", "write_json", "write_runs", "table", "run_child", "parse_args_or_run_child", "report_errors",
           "finish", "timed", "recording_convergence"]

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results"


def write_json(path: str | Path, payload: dict) -> Path:
    """Write ``payload`` as indented JSON (NumPy values as plain numbers), creating the folder."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=_jsonable) + "\n")
    return path


def write_runs(path: str | Path, benchmark: str, args: argparse.Namespace, started: float, runs: list) -> None:
    """Write a one-process benchmark's record (its machine, settings, seconds since ``started`` and ``runs``) and say
    where."""
    from benchmarks.machine import machine

    write_json(path, {"benchmark": benchmark, "machine": machine(), "settings": vars(args),
                      "wall_s": time.perf_counter() - started, "runs": runs})
    print(f"wrote {path}")


def _jsonable(x):
    import numpy as np

    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


def table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """A plain-text table: ``columns`` is ``[(key, header, format)]``; missing values print as '-'."""
    head = [h for _, h, _ in columns]
    body = []
    for r in rows:
        line = []
        for key, _, fmt in columns:
            v = r.get(key)
            line.append("-" if v is None else (format(v, fmt) if fmt else str(v)))
        body.append(line)
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    fmt_line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))
    return "\n".join([fmt_line(head), fmt_line(["-" * w for w in widths]), *map(fmt_line, body)])


def run_child(module: str, config: dict, timeout: float, env: dict | None = None, cache: str = "fresh",
              prefix: tuple[str, ...] = ()) -> dict:
    """Run ``python -m module --child CONFIG`` from the repository root in a fresh process; return its record.

    A fresh process per measurement keeps one sampler's compiled programs, caches and memory out of the
    next one's numbers. ``module`` is the benchmark's own name (``__spec__.name``: also right under ``-m``).
    ``cache`` sets dhmc's persistent compilation cache: ``fresh``, an empty folder for this process only
    (dhmc's workers share compiled programs through it, as they do for a user, but nothing from an earlier
    run is reused: cold stays cold); ``off``, none; ``user``, dhmc's default folder, possibly warm from
    earlier runs (what the contract check sees). ``prefix`` goes before the command (``("taskset", "-c", "1")``).
    Failures come back as ``{"error": ...}``, never raised.
    """
    full_env = {**os.environ, **(env or {})}
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    folder = None
    if cache == "off":
        full_env["DHMC_COMPILATION_CACHE"] = "0"
    elif cache == "fresh":
        folder = tempfile.mkdtemp(prefix="dhmc-bench-cache-")
        full_env["DHMC_CACHE_DIR"] = folder
        full_env["DHMC_COMPILATION_CACHE"] = "1"
    argv = [*prefix, sys.executable, "-m", module, "--child", json.dumps(config)]
    t = time.perf_counter()
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=str(REPO))
    except subprocess.TimeoutExpired as e:
        return {"error": f"timed out after {timeout:.0f} s", "stderr_tail": _tail(e.stderr)}
    finally:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
    wall = time.perf_counter() - t
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit status {proc.returncode}", "stderr_tail": _tail(proc.stderr),
                "stdout_tail": _tail(proc.stdout)}
    record = json.loads(lines[-1])
    record["process_wall_s"] = wall
    return record


def _tail(text, n: int = 2000) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return text[-n:]


def parse_args_or_run_child(ap: argparse.ArgumentParser, argv, child, out_name: str):
    """Add ``--out`` (default ``results/<out_name>``) and the hidden ``--child``, and parse.

    In a child process (``--child CONFIG``) run ``child(config)``, print its record as the last line of
    stdout and return None.
    """
    ap.add_argument("--out", default=str(RESULTS / out_name))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child)), default=_jsonable), flush=True)
        return None
    return args


def report_errors(rows: list[dict], label, tail: int = 1500) -> int:
    """Print every failed measurement (``label(row)`` names it) and return the exit code: 1 if any failed."""
    failed = [r for r in rows if "error" in r]
    for r in failed:
        print(f"ERROR {label(r)}: {r['error']}\n{r.get('stderr_tail', '')[-tail:]}")
    return 1 if failed else 0


def finish(path, rows: list[dict], label, sections, started: float | None = None, tail: int = 1500) -> int:
    """A benchmark's end: the CPU (:func:`benchmarks.machine.cpu_line`), its tables (each non-empty one after a
    blank line), every failed measurement, where the JSON went (and the seconds since ``started``); returns the
    exit code (:func:`report_errors`)."""
    from benchmarks.machine import cpu_line

    print(f"\n{cpu_line()}")
    for text in filter(None, sections):
        print()
        print(text)
    code = report_errors(rows, label, tail)
    took = "" if started is None else f" ({time.perf_counter() - started:.0f} s)"
    print(f"\nwrote {path}{took}")
    return code


def timed(fn):
    """``(seconds, result)`` of ``fn()``, with every JAX array in the result ready."""
    import jax

    t = time.perf_counter()
    out = fn()
    jax.block_until_ready(out)
    return time.perf_counter() - t, out


@contextlib.contextmanager
def recording_convergence(out: dict):
    """Record the ``dhmc.ConvergenceWarning`` messages raised inside (every one, repeats included) as
    ``out["warnings"]``."""
    import warnings

    import dhmc

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", dhmc.ConvergenceWarning)
        yield
    out["warnings"] = [str(w.message) for w in caught if issubclass(w.category, dhmc.ConvergenceWarning)]

"""Scaling studies: how sampling time changes with the number of workers (strong, weak) or of chains.

``run_study`` times fixed-cost HMC sampling (``kernel="hmc"``, ``adapt=False``, ``warmup=0``, a fixed
step size and number of leapfrog steps per model, so that every draw costs the same) on clusters of
growing size, writes ``DIR/scaling.json`` and PNG plots, and returns the record.

- ``strong``: a fixed ensemble (``chains``) on 1, 2, 4, ... workers.
- ``weak``: ``chains_per_worker * workers`` chains on each point; the work grows with the workers.
- ``chains``: one worker, ensembles of growing size (``chains_list``), one block per segment, showing
  where the per-task and per-iteration overhead stops dominating.

Each point runs on freshly started workers: the embedded local cluster is started anew with ``n``
workers (each pinned to its own core while there are cores enough, so the study measures cores, not
XLA's threads); a dask-cuda, Slurm or given ``Cluster`` is scaled to ``n`` workers and restarted with
``client.restart()``. Each point first runs one untimed warm-up sample identical to the timed ones (the
same chains, draws, blocks and seed), so that every worker has compiled its program and run blocks, and
the driver has seen the ensemble's shapes, at every point alike; the timed repeats must then compile
nothing (a repeat that did is discarded and run again). ``seconds`` is the wall time of the sampling
phase (submitting the first block to writing the last, dhmc's ``dhmc_timing`` ``sampling + writing``); the
whole call, with the driver's set-up, is ``wall_seconds``, and the warm-up's compile time is
``compile_seconds``.

Equal work is checked, not assumed: every point records its plan (``chains_per_task``,
``draws_per_segment``, ``blocks``), the gradient evaluations it did (``grad_evals``, the sum of
``sample_stats.n_steps``), and from dhmc's worker metrics how many blocks each worker ran and how long a
block took (``block_seconds``). A strong study whose points differ in blocks or gradient evaluations (a
weak one: not in proportion to the workers) is marked ``"suspect": "unequal work"``; a point faster than
linear (``speedup > workers``), which equal blocks on pinned workers cannot be, is marked
``"suspect": "superlinear"``: its ``block_seconds`` against the baseline's then shows whether the machine
was slower while the baseline ran (other work on the machine or its host, which ``cpu_share`` cannot see
when it runs on the cores the baseline leaves free).

This module imports only the standard library at import time; JAX, Dask and matplotlib are imported
when a study runs.
"""

from __future__ import annotations

import json
import math
import os
import platform
import socket
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import suppress
from datetime import UTC, datetime
from pathlib import Path

KINDS = ("strong", "weak", "chains")

#: Fixed HMC settings per built-in model: ``(step_size, num_steps)``. The step sizes keep the
#: acceptance well above zero; the numbers of steps make 512 chains x 400 draws cost roughly
#: 5-20 s on one core, so that blocks of 64 chains x 200 draws run >= 0.5 s (a Dask task costs ~2.5 ms).
DEFAULT_SETTINGS: dict[str, tuple[float, int]] = {
    "gaussian_2d": (0.1, 1000),
    "harmonic_oscillator": (0.1, 1000),
    "coin_toss": (0.2, 200),
    "eight_schools": (0.3, 300),
    "linear_acceleration": (0.001, 50),
}
FALLBACK_SETTINGS = (0.1, 100)
BLOCKS_PER_WORKER = 4  # CPU default: blocks per worker per segment (equal work, some load balancing)


class ScalingError(RuntimeError):
    """A study that cannot be run as asked (e.g. an unscalable cluster)."""


# -- public --------------------------------------------------------------------------------------------


def run_study(
    kind: str,
    workers: Sequence[int] | None = None,
    *,
    chains: int | None = None,
    chains_per_worker: int | None = None,
    draws: int,
    model: str | Sequence[str] = "gaussian_2d",
    cluster=None,
    repeat: int = 3,
    out: str | os.PathLike,
    chains_list: Sequence[int] | None = None,
    chains_per_task: int | None = None,
    step_size: float | None = None,
    num_steps: int | None = None,
    seed: int = 0,
    cluster_options: dict | None = None,
    progress: bool | Callable[[str], None] = True,
) -> dict:
    """Run a scaling study, write ``out/scaling.json`` and PNG plots, and return the record.

    Parameters
    ----------
    kind
        ``"strong"`` (fixed ``chains``), ``"weak"`` (``chains_per_worker`` per worker) or ``"chains"``
        (one worker, each ensemble size in ``chains_list``).
    workers
        Worker counts, e.g. ``[1, 2, 4]``; ``"chains"`` takes a single count (default ``[1]``).
    chains, chains_per_worker, chains_list
        The ensemble size of a strong study, per worker of a weak study, the sizes of a chains study.
    draws
        Draws per chain at every point.
    model
        A built-in model name, or several: each is timed on every point and plotted normalised to its
        own smallest-worker time.
    cluster
        None or ``"local"`` (the embedded cluster, restarted per point), ``"cuda"``, ``"slurm"``, a
        ``distributed.Cluster`` or a ``Client`` of one (scaled per point); a scheduler address only
        when every point asks for the workers it already has.
    repeat
        Timed runs per point (after one untimed warm-up run).
    out
        Output directory (created).
    chains_per_task
        Chains per block, the same at every point (equal work, bitwise the same draws). Default: the
        largest divisor of the ensemble (strong) or of ``chains_per_worker`` (weak) that gives each worker
        at least 4 blocks per segment at the most workers (1 block on ``"cuda"``), e.g. ``512 // (4 * 2)``;
        a chains study: the whole ensemble.
    step_size, num_steps
        Fixed HMC settings; default per model from :data:`DEFAULT_SETTINGS`.
    seed, cluster_options
        Passed to :func:`dhmc.sample`; options for the cluster kind (``dhmc.yaml``).
    progress
        Print one line per point to stderr (or pass a callable taking the line).

    Returns
    -------
    dict
        ``{"kind", "model", "runs": [{"workers", "chains", "draws", "seconds", "seconds_min", "seconds_max",
        "chain_draws_per_s", "speedup", "efficiency", ...}], "machine", ...}``, as written to
        ``scaling.json``. ``speedup`` is the throughput relative to the smallest worker count ``w0``, times
        ``w0`` (strong: ``w0 * T(w0) / T(n)``; weak: the scaled speedup ``n * T(w0) / T(n)`` for ``w0 = 1``);
        ``efficiency = speedup / workers``. For ``"chains"``: ``speedup`` is the throughput relative to the
        smallest ensemble and ``efficiency`` the fraction of the best throughput.
    """
    models = [model] if isinstance(model, str) else list(model)
    points, cpt_of, workers = _plan(kind, workers, chains, chains_per_worker, chains_list, chains_per_task, draws,
                                    repeat, models, cluster)
    settings = {m: _settings(m, step_size, num_steps) for m in models}
    _check_models(models)
    say = _say(progress)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    t_study = time.perf_counter()
    result = {
        "kind": kind,
        "model": ",".join(models),
        "models": models,
        "runs": [],
        "machine": machine_info(),
        "settings": {
            "kernel": "hmc", "adapt": False, "warmup": 0, "seed": seed, "repeat": repeat, "draws": draws,
            "statistic": "median", "seconds": "sampling phase wall time (dhmc_timing sampling + writing)",
            "per_model": {m: {"step_size": s, "num_steps": k} for m, (s, k) in settings.items()},
            "chains_per_worker": chains_per_worker,
        },
        "cluster": cluster if isinstance(cluster, str) or cluster is None else type(cluster).__name__,
        "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "complete": False,
    }
    runs, machine = result["runs"], result["machine"]
    say(f"dhmc scale {kind}: models {', '.join(models)}; points "
        + ", ".join(f"{w}w x {c} chains" for w, c in points) + f"; {draws} draws; {repeat} repeats -> {out}")
    with _Clusters(cluster, cluster_options, workers) as clusters:
        for n, c in points:
            t_point = time.perf_counter()
            client = clusters.get(n)
            cluster_seconds = time.perf_counter() - t_point
            if "workers" not in machine:
                machine.update(_cluster_info(client))
            for m in models:
                step, steps = settings[m]
                record = _time_point(client, m, n, c, draws, cpt_of(c), step, steps, seed, repeat)
                record.update(cluster_start_seconds=cluster_seconds, pinned=clusters.pinned(n),
                              fresh_workers=clusters.restarted is not False, cpu_workers=clusters.cpu_workers,
                              load_average=_loadavg())
                runs.append(record)
                say(f"  {m}: {n} worker(s), {c} chains: {record['seconds']:.3f} s "
                    f"(min {record['seconds_min']:.3f}, max {record['seconds_max']:.3f}), "
                    f"{record['chain_draws_per_s']:,.0f} chain-draws/s, compile {record['compile_seconds']:.2f} s, "
                    f"acceptance {record['acceptance_rate']:.2f}; {record['blocks']} blocks of "
                    f"{record['chains_per_task']} chains x {record['draws_per_segment']} draws"
                    + (f" ({record['block_seconds']:.3f} s each)" if record.get("block_seconds") else "")
                    + f", {_count_text(record['grad_evals_all'])} gradient evaluations" + _busy(record))
            clusters.release(n)
            _derive(kind, runs)
            result["wall_seconds"] = time.perf_counter() - t_study
            _write(result, out)  # what is measured so far survives a failure at a later point

    from dhmc.observe import plots

    result["plots"] = [p.name for p in plots.plot_study(result, out)]
    busy = [r for r in runs if r["cpu_workers"] and r.get("cpu_share") is not None and r["cpu_share"] < 0.75]
    if busy:
        say(f"dhmc scale {kind}: warning: at {len(busy)} of {len(runs)} points the workers got under 75% of their "
            "cores (other work on this machine); the speedups are not reliable")
    for run in runs:
        if run.get("suspect"):
            say(f"dhmc scale {kind}: warning: {run['model']}, {run['workers']} worker(s): suspect "
                f"({run['suspect']}): {run['suspect_detail']}")
    result["complete"] = True
    result["wall_seconds"] = time.perf_counter() - t_study
    _write(result, out)
    for run in runs:
        if kind != "chains" and run["workers"] != min(workers):
            say(f"  {run['model']}: {run['workers']} workers: speedup {run['speedup']:.2f}x, "
                f"efficiency {run['efficiency']:.0%}")
    say(f"dhmc scale {kind}: done in {result['wall_seconds']:.0f} s; wrote {out / 'scaling.json'} and "
        + ", ".join(result["plots"]))
    return result


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
        "load_average": _loadavg(),
        "versions": versions,
    }


# -- planning ------------------------------------------------------------------------------------------


def _positive(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _plan(kind, workers, chains, chains_per_worker, chains_list, chains_per_task, draws, repeat, models, cluster):
    """Validate the study and return ``(points [(workers, chains)], chains_per_task(chains), workers)``."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    _positive("draws", draws)
    _positive("repeat", repeat)
    if not models or not all(isinstance(m, str) and m for m in models):
        raise ValueError(f"model must be a model name or a list of names, got {models!r}")
    if chains_per_task is not None:
        _positive("chains_per_task", chains_per_task)
    if kind == "chains":
        workers = [1] if workers is None else list(workers)
        if len(workers) != 1:
            raise ValueError(f"a chains study runs on one worker count, got workers={workers}")
        if chains_list is None and chains is not None and not isinstance(chains, int):
            chains_list = chains
        if not chains_list:
            raise ValueError("a chains study needs chains_list, e.g. [2, 8, 32, ..., 4096]")
        sizes = sorted({_positive("chains", int(c)) for c in chains_list})
        workers = [_positive("workers", workers[0])]
        return [(workers[0], c) for c in sizes], (lambda c: min(chains_per_task or c, c)), workers
    if workers is None or not list(workers):
        raise ValueError("workers must list the worker counts, e.g. [1, 2, 4]")
    workers = sorted({_positive("workers", int(w)) for w in workers})
    per_block = 1 if cluster == "cuda" else BLOCKS_PER_WORKER
    if kind == "strong":
        if chains is None:
            raise ValueError("a strong study needs chains (the fixed ensemble size)")
        _positive("chains", chains)
        cpt = chains_per_task or _divisor_at_most(chains, chains // (per_block * workers[-1]))
        return [(w, chains) for w in workers], (lambda c: min(cpt, c)), workers
    if chains_per_worker is None:
        raise ValueError("a weak study needs chains_per_worker (the ensemble grows with the workers)")
    _positive("chains_per_worker", chains_per_worker)
    cpt = chains_per_task or _divisor_at_most(chains_per_worker, chains_per_worker // per_block)
    return [(w, w * chains_per_worker) for w in workers], (lambda c: min(cpt, c)), workers


def _divisor_at_most(total: int, limit: int) -> int:
    """The largest divisor of ``total`` not above ``limit`` (so that all blocks have the same shape), or
    ``limit`` itself (a shorter last block) where no divisor comes within half of it."""
    limit = max(1, limit)
    best = max(d for d in range(1, limit + 1) if total % d == 0)
    return best if 2 * best >= limit else limit


def _check_models(models) -> None:
    from dhmc.models import EXAMPLES

    unknown = [m for m in models if m not in EXAMPLES]
    if unknown:
        raise ValueError(f"unknown model {unknown[0]!r}; choose one of: {', '.join(EXAMPLES)}")


def _settings(model: str, step_size, num_steps) -> tuple[float, int]:
    default_step, default_steps = DEFAULT_SETTINGS.get(model, FALLBACK_SETTINGS)
    step = float(step_size) if step_size is not None else default_step
    steps = int(num_steps) if num_steps is not None else default_steps
    if not step > 0:
        raise ValueError(f"step_size must be positive, got {step_size!r}")
    _positive("num_steps", steps)
    return step, steps


# -- timing --------------------------------------------------------------------------------------------


def _sample(client, model, chains, draws, cpt, step, steps, seed) -> dict:
    import dhmc

    t = time.perf_counter()
    tree = dhmc.sample(model, chains=chains, draws=draws, warmup=0, seed=seed, kernel="hmc", step_size=step,
                       num_steps=steps, adapt=False, cluster=client, chains_per_task=cpt, progress=False)
    wall = time.perf_counter() - t
    timing = spec = None
    for node in tree.subtree:
        if timing is None and "dhmc_timing" in node.attrs:
            timing = json.loads(node.attrs["dhmc_timing"])
        if spec is None and "dhmc_run_spec" in node.attrs:
            spec = json.loads(node.attrs["dhmc_run_spec"])
    if timing is None:
        raise ScalingError("dhmc.sample returned no dhmc_timing attribute")
    acceptance = float(tree["sample_stats"]["acceptance_rate"].mean())
    # the leapfrog steps (gradient evaluations) of every chain and draw: the work this run did
    grad_evals = int(tree["sample_stats"]["n_steps"].values.sum(dtype="int64"))
    return {"wall": wall, "timing": timing, "spec": spec or {}, "acceptance": acceptance, "grad_evals": grad_evals,
            "seconds": timing["sampling"] + timing.get("writing", 0.0)}


def _time_point(client, model, n, chains, draws, cpt, step, steps, seed, repeat) -> dict:
    """One untimed warm-up run identical to the timed ones, then ``repeat`` timed runs."""
    # The warm-up is the timed call itself (same chains, draws, blocks and seed): every worker compiles
    # its program and runs blocks, and the driver meets the ensemble's shapes, before any timed run, at
    # every point alike; a smaller warm-up left some of that to the first timed run of some points.
    warm = _sample(client, model, chains, draws, cpt, step, steps, seed)
    compile_seconds = warm["timing"]["compile"]

    timed, discarded, cold = [], 0, []
    while len(timed) < repeat:
        cpu, blocks = _worker_cpu(client), _worker_blocks(client)
        run = _sample(client, model, chains, draws, cpt, step, steps, seed)
        after_cpu, after_blocks = _worker_cpu(client), _worker_blocks(client)
        run["cpu_share"] = _cpu_share(cpu, after_cpu, run["seconds"])
        run["worker_cpu_seconds"] = _cpu_seconds(cpu, after_cpu)
        run["per_worker"] = _blocks_delta(blocks, after_blocks)
        if run["timing"]["compile"] > 0 and discarded < repeat:
            discarded += 1  # a worker compiled during the timed run: not warm, run it again
            cold.append(run["timing"]["compile"])
            compile_seconds = max(compile_seconds, run["timing"]["compile"])
            continue
        timed.append(run)
    seconds = [r["seconds"] for r in timed]
    median = statistics.median(seconds)
    spec = timed[0]["spec"]
    dps = int(spec.get("draws_per_segment", draws))
    cpt = int(spec.get("chains_per_task", cpt))
    chunks = math.ceil(chains / cpt)
    segments = math.ceil(draws / dps)
    grad_evals = [r["grad_evals"] for r in timed]
    # per repeat: blocks each worker ran, and the device seconds per block (dhmc's worker metrics)
    per_worker = [r["per_worker"] for r in timed]
    counted = [sum(b for b, _ in pw) for pw in per_worker if pw]
    if not any(counted):  # no dhmc worker metrics on this cluster: nothing counted
        per_worker, counted = [[] for _ in timed], []
    block_seconds = [sum(t for _, t in pw) / max(1, sum(b for b, _ in pw)) for pw in per_worker if pw]
    busy = [sum(t for _, t in pw) / (r["seconds"] * n) for pw, r in zip(per_worker, timed, strict=True)
            if pw and r["seconds"] > 0]
    # the workers' CPU seconds per block: near block_seconds when they had their cores; above the quiet
    # machine's value when the CPU itself ran slower (other work on the machine or its host)
    block_cpu = [r["worker_cpu_seconds"] / (chunks * segments) for r in timed if r["worker_cpu_seconds"]]
    return {
        "model": model,
        "workers": n,
        "chains": chains,
        "draws": draws,
        "seconds": median,
        "seconds_min": min(seconds),
        "seconds_max": max(seconds),
        "seconds_all": seconds,
        "wall_seconds": statistics.median(r["wall"] for r in timed),
        "chain_draws_per_s": chains * draws / median,
        "grad_evals": grad_evals[0] if len(set(grad_evals)) == 1 else None,
        "grad_evals_all": grad_evals,
        "grad_evals_per_s": statistics.median(grad_evals) / median,
        "speedup": None,
        "efficiency": None,
        "suspect": None,
        "compile_seconds": compile_seconds,
        "compile_seconds_all": [r["timing"]["compile"] for r in timed],
        "warmup_run_seconds": warm["wall"],
        "repeats": repeat,
        "discarded_cold_repeats": discarded,
        "discarded_compile_seconds": cold,
        "chains_per_task": cpt,
        "draws_per_segment": dps,
        "blocks": chunks * segments,
        # blocks the workers reported per repeat (None without dhmc's worker metrics): equal to "blocks"
        "blocks_run_all": counted or None,
        "blocks_per_worker_all": [sorted((b for b, _ in pw), reverse=True) for pw in per_worker] if counted else None,
        # device seconds per block (median over repeats), and the share of the timed window the workers
        # spent in blocks (1: no idle time, no overhead between blocks)
        "block_seconds": statistics.median(block_seconds) if block_seconds else None,
        "block_cpu_seconds": statistics.median(block_cpu) if block_cpu else None,
        "worker_busy": statistics.median(busy) if busy else None,
        "step_size": step,
        "num_steps": steps,
        "acceptance_rate": statistics.fmean(r["acceptance"] for r in timed),
        # CPU seconds the workers used per second of sampling, averaged over workers: ~1 when each
        # worker had its core to itself, well below 1 when the machine was busy with other work
        "cpu_share": _median_or_none([r["cpu_share"] for r in timed]),
        "worker_cpu_seconds": _median_or_none([r["worker_cpu_seconds"] for r in timed]),
    }


def _worker_cpu(client) -> dict:
    try:
        return client.run(time.process_time)
    except Exception:  # noqa: BLE001 - a diagnostic only
        return {}


def _cpu_share(before: dict, after: dict, seconds: float) -> float | None:
    shares = [(after[w] - before[w]) / seconds for w in after if w in before and seconds > 0]
    return statistics.fmean(shares) if shares else None


def _cpu_seconds(before: dict, after: dict) -> float | None:
    used = [after[w] - before[w] for w in after if w in before]
    return sum(used) if used else None


def _blocks_here(dask_worker=None) -> tuple[int, float] | None:
    """On a worker: (blocks done, their device seconds) from dhmc's worker metrics."""
    try:
        from dhmc.observe import metrics
    except ImportError:
        return None
    stats = metrics._stats.get(dask_worker)
    return (0, 0.0) if stats is None else (int(stats.blocks_done), float(stats.sampling_seconds))


def _worker_blocks(client) -> dict:
    try:
        return {w: v for w, v in client.run(_blocks_here).items() if v is not None}
    except Exception:  # noqa: BLE001 - a diagnostic only
        return {}


def _blocks_delta(before: dict, after: dict) -> list[tuple[int, float]]:
    """``(blocks, seconds)`` per worker between two snapshots (workers that ran none included)."""
    return [(after[w][0] - before.get(w, (0, 0.0))[0], after[w][1] - before.get(w, (0, 0.0))[1]) for w in after]


def _median_or_none(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _derive(kind: str, runs: list[dict]) -> None:
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


# -- clusters ------------------------------------------------------------------------------------------


class _Clusters:
    """Clients with ``n`` workers, freshly started or restarted for every point."""

    def __init__(self, cluster, options, workers):
        self.spec, self.options, self.workers = cluster, dict(options or {}), workers
        self.client = self.close = None
        self.original = None  # a user's cluster is scaled back to its size at the end
        self.restarted = None  # whether the last get() restarted the workers (None: started fresh)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.client is not None and self.original is not None:
            with suppress(Exception):
                self._scale(self.original)
        if self.close is not None:
            with suppress(Exception):
                self.close()
        self.client = self.close = None

    @property
    def cpu_workers(self) -> bool:
        """Whether the workers compute on CPUs (their CPU share then says whether they had their cores)."""
        return not (self.spec == "cuda" or "CUDA" in type(getattr(self.spec, "cluster", self.spec)).__name__)

    @property
    def embedded(self) -> bool:
        return self.spec is None or self.spec == "local"

    def pinned(self, n: int) -> bool | None:
        if not self.embedded:
            return None
        from dhmc.distributed import config
        from dhmc.distributed.clusters import available_cores

        pin = config.cluster_options("local", self.options).get("pin", True)
        return bool(pin) and n <= len(available_cores())

    def get(self, n: int):
        from dhmc.distributed.clusters import connect

        if self.embedded:
            self.client, self.close = connect("local", {**self.options, "n_workers": n})
            return self.client
        if self.client is None and self.spec in ("cuda", "slurm"):
            # a cluster started here for this point: its workers are fresh already
            kind = self.spec
            opts = {"n_workers": n} if kind == "cuda" else {"jobs": n}
            self.client, self.close = connect(kind, {**self.options, **opts})
            self._wait(n)
            return self.client
        if self.client is None:
            self.client, self.close = connect(self.spec, self.options)
            self.original = _count(self.client) if self._scalable() else None
        # Fresh workers for every point: retire the surplus, restart the rest, then add the missing ones
        # (new workers start fresh; restarting a worker that has only just joined can stall).
        if not self._scalable() or _count(self.client) > n:
            self._scale(n)  # an unscalable cluster: refused here unless it has n workers
        self._restart()
        self._scale(n)
        return self.client

    def _restart(self) -> None:
        import dask

        timeout = 600 if self.spec == "slurm" else 180
        if not all(w.get("nanny") for w in _workers(self.client).values()):
            self.restarted = False  # restart would only shut down workers without a Nanny: keep them
            return
        self.restarted = True
        try:
            # A SpecCluster (LocalCluster, LocalCUDACluster) closes a worker's Nanny for good when no worker
            # of that name re-registers within lost-worker-timeout (15 s) of leaving the scheduler, which a
            # restart on a busy machine can exceed: then the restart never completes. Give it the restart's time.
            with dask.config.set({"distributed.deploy.lost-worker-timeout": f"{timeout}s"}):
                self.client.restart(wait_for_workers=True, timeout=timeout)
        except TimeoutError as e:
            msg = f"restarting the workers between points did not finish within {timeout} s ({e})"
            raise ScalingError(msg) from None

    def release(self, n: int) -> None:
        if self.embedded and self.close is not None:
            self.close()
            self.client = self.close = None

    def _scalable(self) -> bool:
        cluster = getattr(self.client, "cluster", None)
        return cluster is not None and hasattr(cluster, "scale")

    def _count(self) -> int:
        return _count(self.client)

    def _scale(self, n: int) -> None:
        if not self._scalable():
            have = self._count()
            if have != n:
                raise ScalingError(f"the cluster at {self.client.scheduler.address} has {have} workers and dhmc "
                                   f"cannot scale it (no Cluster object) to {n}; pass a Cluster, 'cuda' or "
                                   f"'slurm', or only --workers {have}")
            return
        self.client.cluster.scale(n)  # workers; with dhmc's Slurm config (processes: 1) one job each
        self._wait(n)

    def _wait(self, n: int, timeout: float | None = None) -> None:
        timeout = timeout or (600.0 if self.spec == "slurm" else 180.0)
        deadline = time.monotonic() + timeout
        while (have := self._count()) != n:
            if time.monotonic() > deadline:
                raise ScalingError(f"the cluster did not reach {n} workers within {timeout:.0f} s (has {have})")
            time.sleep(0.5)


def _workers(client) -> dict:
    """All workers' records (recent ``distributed`` lists only the first few unless asked)."""
    try:
        return client.scheduler_info(n_workers=-1)["workers"]
    except TypeError:
        return client.scheduler_info()["workers"]


def _count(client) -> int:
    return len(_workers(client))


def _cluster_info(client) -> dict:
    """What the workers of the first point run on: threads, memory, and JAX's devices."""
    info = _workers(client)
    workers = [{"name": str(w.get("name")), "host": w.get("host"), "nthreads": w.get("nthreads"),
                "memory_limit": w.get("memory_limit")} for w in info.values()]

    def devices():
        import jax

        return [f"{d.platform}:{getattr(d, 'device_kind', '')}" for d in jax.devices()]

    found = {}
    with suppress(Exception):
        found = client.run(devices)
    return {"workers": workers, "worker_devices": sorted({", ".join(v) for v in found.values()})}


# -- small helpers -------------------------------------------------------------------------------------


def _busy(record) -> str:
    share = record.get("cpu_share")
    if share is None or not record.get("cpu_workers", True):
        return ""
    note = f", workers' CPU share {share:.0%}"
    return note + (" (the machine is busy: timings are unreliable)" if share < 0.75 else "")


def _count_text(counts) -> str:
    return " / ".join(f"{c:.4g}" for c in dict.fromkeys(counts))  # one number when the repeats agree


def _say(progress) -> Callable[[str], None]:
    if callable(progress):
        return progress
    if progress:
        return lambda line: print(line, file=sys.stderr, flush=True)
    return lambda line: None


def _cpu_model() -> str:
    with suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _loadavg() -> list[float] | None:
    with suppress(OSError, AttributeError):
        return [round(x, 2) for x in os.getloadavg()]
    return None


def _write(result: dict, out: Path) -> None:
    path = out / "scaling.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2, default=_json_default) + "\n")
    tmp.replace(path)


def _json_default(value):
    with suppress(Exception):
        return value.item()
    return str(value)


__all__ = ["run_study", "machine_info", "DEFAULT_SETTINGS", "KINDS", "ScalingError"]

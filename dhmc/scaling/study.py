"""``run_study``: the points of a study, one after the other, each on fresh workers, into ``scaling.json``."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from dhmc.scaling.clusters import Clusters, cluster_info, placement
from dhmc.scaling.measure import time_point
from dhmc.scaling.plan import check_models, hmc_settings, study_points
from dhmc.scaling.plots import plot_study
from dhmc.scaling.report import derive, load_average, machine_info, write_json

__all__ = ["run_study"]


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
    points, cpt_of, workers = study_points(kind, workers, chains, chains_per_worker, chains_list, chains_per_task,
                                          draws, repeat, models, cluster)
    settings = {m: hmc_settings(m, step_size, num_steps) for m in models}
    check_models(models)
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
    with Clusters(cluster, cluster_options) as clusters:
        for n, c in points:
            t_point = time.perf_counter()
            client = clusters.get(n)
            cluster_seconds = time.perf_counter() - t_point
            if "workers" not in machine:
                machine.update(cluster_info(client))
            for m in models:
                step, steps = settings[m]
                record = time_point(client, m, n, c, draws, cpt_of(c), step, steps, seed, repeat)
                record.update(placement(client), cluster_start_seconds=cluster_seconds, pinned=clusters.pinned(n),
                              fresh_workers=clusters.restarted is not False, cpu_workers=clusters.cpu_workers,
                              load_average=load_average())
                runs.append(record)
                say(f"  {m}: {n} worker(s), {c} chains: {record['seconds']:.3f} s "
                    f"(min {record['seconds_min']:.3f}, max {record['seconds_max']:.3f}), "
                    f"{record['chain_draws_per_s']:,.0f} chain-draws/s, compile {record['compile_seconds']:.2f} s, "
                    f"acceptance {record['acceptance_rate']:.2f}; {record['blocks']} blocks of "
                    f"{record['chains_per_task']} chains x {record['draws_per_segment']} draws"
                    + (f" ({record['block_seconds']:.3f} s each)" if record.get("block_seconds") else "")
                    + f", {_count_text(record['grad_evals_all'])} gradient evaluations" + _busy(record))
            clusters.release(n)
            derive(kind, runs)
            result["wall_seconds"] = time.perf_counter() - t_study
            write_json(result, out)  # what is measured so far survives a failure at a later point

    result["plots"] = [p.name for p in plot_study(result, out)]
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
    write_json(result, out)
    for run in runs:
        if kind != "chains" and run["workers"] != min(workers):
            say(f"  {run['model']}: {run['workers']} workers: speedup {run['speedup']:.2f}x, "
                f"efficiency {run['efficiency']:.0%}")
    say(f"dhmc scale {kind}: done in {result['wall_seconds']:.0f} s; wrote {out / 'scaling.json'} and "
        + ", ".join(result["plots"]))
    return result


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


"""Timing one point of a study: a warm-up run, then the timed repeats, with what the workers did.

Each point first runs one untimed warm-up sample identical to the timed ones (the same chains, draws,
blocks and seed), so that every worker has compiled its program and run blocks, and the driver has seen
the ensemble's shapes, at every point alike; the timed repeats must then compile nothing (a repeat that
did is discarded and run again). ``seconds`` is the wall time of the sampling phase (submitting the first
block to writing the last, dhmc's ``dhmc_timing`` ``sampling + writing``); the whole call, with the
driver's set-up, is ``wall_seconds``, and the warm-up's compile time is ``compile_seconds``.

Every point records its plan (``chains_per_task``, ``draws_per_segment``, ``blocks``), the gradient
evaluations it did (``grad_evals``, the sum of ``sample_stats.n_steps``), and from dhmc's worker metrics
how many blocks each worker ran and how long a block took (``block_seconds``).
"""

from __future__ import annotations

import json
import math
import statistics
import time
import warnings

from dhmc.errors import ConvergenceWarning
from dhmc.scaling.plan import ScalingError

__all__ = ["time_point"]


def _sample(client, model, chains, draws, cpt, step, steps, seed) -> dict:
    from dhmc.api import sample

    t = time.perf_counter()
    with warnings.catch_warnings():
        # a timing point runs unwarmed fixed-step chains on purpose: whether they agree is not measured
        warnings.simplefilter("ignore", ConvergenceWarning)
        tree = sample(model, chains=chains, draws=draws, warmup=0, seed=seed, kernel="hmc", step_size=step,
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


def time_point(client, model, n, chains, draws, cpt, step, steps, seed, repeat) -> dict:
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
    stats = metrics.worker_stats(dask_worker)
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


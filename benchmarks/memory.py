"""Driver memory and the cost of streaming draws to Zarr: 2^16 chains x 1000 draws of a 2-parameter model; and
the driver's memory of a ``draws="auto"`` run without a store against ``max_draws`` and the dimension.

Two fresh processes run the same fixed-step HMC (``gaussian_2d``, step 0.2, 5 leapfrog steps, no warmup)
through ``dhmc.sample`` on its embedded cluster: one with ``store=`` (blocks are written to Zarr as they
finish and the result is opened lazily), one without (every draw is held in the driver). Each reports the
driver's peak resident memory (``ru_maxrss``) and the peak total of its worker processes (psutil,
sampled every 0.2 s). Goals: driver peak < 0.5 GiB with a store, whatever the size; slowdown < 10%. The slowdown is t(store) / t(no store).

    python -m benchmarks.memory                              # 65536 chains x 1000 draws
    python -m benchmarks.memory --chains 4096 --draws 200    # smaller
    python -m benchmarks.memory --modes auto --chains 1024 --dims irt,501,4096 --max-draws 1000,10000

``auto``: ``dhmc.sample`` of a ``d``-dimensional Gaussian (sds 1 to 10) or of LAPS's 501-D item-response model
(``irt``), ``draws="auto"``, ``target_ess=400``,
each ``max_draws`` given, no store, defaults otherwise. The driver's arrays follow the draws taken (a run stops at
10-20 draws a chain), so its peak should not move with ``max_draws``: before the in-memory result grew with the
draws, a 501-D run of 1024 chains asked for 38 GiB (``max_draws=10000``, float64) before its first draw.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.harness import parse_args_or_run_child, report_errors, run_child, table, write_json
from benchmarks.machine import cpu_line, machine

GIB = 2**30


def _peak_rss_bytes() -> int:
    import resource

    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb * 1024 if sys.platform != "darwin" else kb


class _WorkerWatch(threading.Thread):
    """Peak summed RSS of this process's descendants (the cluster's workers and nannies)."""

    def __init__(self, period=0.2):
        super().__init__(daemon=True)
        self.period, self.peak, self.stop = period, 0, threading.Event()

    def run(self):
        import psutil

        me = psutil.Process()
        while not self.stop.is_set():
            total = 0
            for p in me.children(recursive=True):
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            self.peak = max(self.peak, total)
            self.stop.wait(self.period)


def child(cfg: dict) -> dict:
    import numpy as np

    import dhmc
    import dhmc.api  # noqa: F401

    base_rss = _peak_rss_bytes()
    watch = _WorkerWatch()
    watch.start()
    store = cfg.get("store")
    t = time.perf_counter()
    if cfg["mode"] == "auto":
        return _auto(cfg, base_rss, watch, t)
    tree = dhmc.sample("gaussian_2d", chains=cfg["chains"], draws=cfg["draws"], warmup=0, kernel="hmc",
                       step_size=cfg["step_size"], num_steps=cfg["num_steps"], adapt=False, seed=0,
                       progress=False, store=store, overwrite=True, chains_per_task=cfg.get("chains_per_task"))
    seconds = time.perf_counter() - t
    watch.stop.set()
    watch.join()
    x = tree["posterior"]["x"]
    out = {**cfg, "seconds": seconds, "driver_peak_rss_gib": _peak_rss_bytes() / GIB,
           "driver_rss_after_imports_gib": base_rss / GIB, "workers_peak_rss_gib": watch.peak / GIB,
           "shape": list(x.shape), "dhmc_timing": json.loads(tree["posterior"].attrs["dhmc_timing"]),
           "chain_draws_per_s": cfg["chains"] * cfg["draws"] / seconds}
    # check a slice of what came back (lazily from the store when there is one)
    out["mean_first_chains"] = np.asarray(x[: min(256, cfg["chains"])].mean(("chain", "draw")).values).tolist()
    if store:
        out["store_bytes"] = sum(f.stat().st_size for f in Path(store).rglob("*") if f.is_file())
    return out


def _auto(cfg: dict, base_rss: int, watch: _WorkerWatch, t: float) -> dict:
    import jax.numpy as jnp
    import numpy as np

    import dhmc

    if cfg["target"] == "irt":  # LAPS's 501-D item-response model (benchmarks.laps_targets)
        from benchmarks.laps_targets import target

        logdensity, init = target("irt")
    else:
        precision = jnp.asarray(1.0 / np.linspace(1.0, 10.0, cfg["dim"]) ** 2, jnp.float32)
        logdensity, init = lambda p: -0.5 * jnp.sum(precision * p["x"] ** 2), {"x": np.zeros(cfg["dim"], np.float32)}
    tree = dhmc.sample(logdensity, init=init, chains=cfg["chains"], draws="auto", target_ess=400,
                       max_draws=cfg["max_draws"], seed=0, progress=False)
    seconds = time.perf_counter() - t
    watch.stop.set()
    watch.join()
    x = tree["posterior"][max(tree["posterior"].data_vars, key=lambda k: tree["posterior"][k].size)]
    return {**cfg, "seconds": seconds, "driver_peak_rss_gib": _peak_rss_bytes() / GIB,
            "driver_rss_after_imports_gib": base_rss / GIB, "workers_peak_rss_gib": watch.peak / GIB,
            "shape": list(x.shape), "dtype": str(x.dtype), "draws_kept_gib": x.nbytes / GIB,
            "max_draws_gib": cfg["chains"] * cfg["max_draws"] * x.dtype.itemsize * cfg["dim"] / GIB,
            "draws_taken": int(tree["posterior"].sizes["draw"]),
            "dhmc_timing": json.loads(tree["posterior"].attrs["dhmc_timing"])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chains", type=int, default=2**16)
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--step-size", type=float, default=0.2)
    ap.add_argument("--num-steps", type=int, default=5)
    ap.add_argument("--chains-per-task", type=int, default=None)
    ap.add_argument("--modes", default="store,memory", help="store: stream to Zarr; memory: no store; auto: "
                    "draws='auto' without a store, over --dims x --max-draws")
    ap.add_argument("--dims", default="501,4096", help="auto: the Gaussian's dimensions; irt: LAPS's 501-D "
                    "item-response model (benchmarks.laps_targets)")
    ap.add_argument("--max-draws", default="1000,10000", help="auto: the max_draws given")
    ap.add_argument("--dir", default=None, help="where the Zarr store goes (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the store")
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--quick", action="store_true", help="2048 chains x 100 draws")
    args = parse_args_or_run_child(ap, argv, child, "memory.json")
    if args is None:
        return 0
    if args.quick:
        args.chains, args.draws = 2048, 100
    folder = Path(args.dir or tempfile.mkdtemp(prefix="dhmc-memory-"))
    folder.mkdir(parents=True, exist_ok=True)
    env = {"JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    rows = []
    try:
        cfgs = []
        for mode in [m for m in args.modes.split(",") if m]:
            if mode == "auto":
                cfgs += [{"mode": mode, "chains": args.chains, "dim": 501 if d == "irt" else int(d),
                          "target": "irt" if d == "irt" else "gaussian", "max_draws": int(m), "store": None}
                         for d in args.dims.split(",") for m in args.max_draws.split(",")]
                continue
            cfgs.append({"mode": mode, "chains": args.chains, "draws": args.draws, "step_size": args.step_size,
                         "num_steps": args.num_steps, "chains_per_task": args.chains_per_task,
                         "store": str(folder / "memory.zarr") if mode == "store" else None})
        for cfg in cfgs:
            mode = cfg["mode"] if cfg["mode"] != "auto" else (f"auto {cfg['target']} d={cfg['dim']} "
                                                              f"max_draws={cfg['max_draws']}")
            t = time.perf_counter()
            rec = run_child(__spec__.name, cfg, args.timeout, env)
            rec = {**cfg, **rec, "loadavg_after": os.getloadavg()[0]}
            rows.append(rec)
            msg = rec.get("error") or (f"{rec['seconds']:.1f} s, driver peak {rec['driver_peak_rss_gib']:.2f} GiB, "
                                       f"workers peak {rec['workers_peak_rss_gib']:.2f} GiB")
            print(f"[{time.perf_counter() - t:6.1f} s] {mode}: {msg}", flush=True)
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(folder, ignore_errors=True)
    by = {r["mode"]: r for r in rows if "error" not in r}
    summary = {}
    if "store" in by:
        summary["driver_peak_rss_gib_with_store"] = by["store"]["driver_peak_rss_gib"]
        summary["goal_driver_peak_below_half_gib"] = by["store"]["driver_peak_rss_gib"] < 0.5
    if "store" in by and "memory" in by:
        summary["slowdown_store_over_memory"] = by["store"]["seconds"] / by["memory"]["seconds"]
        summary["goal_slowdown_below_10_percent"] = summary["slowdown_store_over_memory"] < 1.10
    auto = [r for r in rows if r["mode"] == "auto" and "error" not in r]
    for target, dim in sorted({(r["target"], r["dim"]) for r in auto}):
        peaks = {r["max_draws"]: r["driver_peak_rss_gib"] for r in auto if (r["target"], r["dim"]) == (target, dim)}
        summary[f"auto_{target}_d{dim}_driver_peak_gib_by_max_draws"] = peaks
        summary[f"auto_{target}_d{dim}_peak_ratio_largest_over_smallest_max_draws"] = peaks[max(peaks)] / peaks[min(peaks)]
    payload = {"benchmark": "memory", "machine": machine(), "summary": summary, "runs": rows,
               "notes": ["driver peak = ru_maxrss of the process calling dhmc.sample (imports included)",
                         "workers peak = max over time of the summed RSS of its descendant processes"]}
    path = write_json(args.out, payload)
    print(cpu_line())
    for r in rows:
        if r.get("shape"):
            r["draws"] = r["shape"][1]
    print(table(rows, [("mode", "mode", ""), ("target", "target", ""), ("chains", "chains", "d"), ("dim", "dim", "d"),
                         ("max_draws", "max_draws", "d"), ("draws", "draws", "d"),
                         ("seconds", "seconds", ".1f"), ("chain_draws_per_s", "draws/s", ",.0f"),
                         ("driver_peak_rss_gib", "driver peak GiB", ".2f"),
                         ("workers_peak_rss_gib", "workers peak GiB", ".2f")]))
    print(json.dumps(summary))
    code = report_errors(rows, lambda r: r["mode"])
    print(f"wrote {path}")
    return code


if __name__ == "__main__":
    sys.exit(main())

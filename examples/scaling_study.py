"""Strong scaling: the same ensemble on 1, 2, ... workers, with ``dhmc scale strong``.

Runs the CLI (``python -m dhmc scale strong ...``), which times fixed-cost HMC (no warmup, fixed step
size and steps, so every draw costs the same) on freshly started clusters of each size and writes
``scaling.json`` and its own PNGs into ``OUT/scaling/``; this script then draws one summary figure
from ``scaling.json``: the speedup against the ideal line and the throughput in chain-draws per second.

On a laptop (the default, an embedded local cluster) each worker is pinned to its own core, so the
study measures cores. ``--cluster`` is passed to the CLI: ``cuda``, ``slurm`` or a scheduler address.
If this dhmc has no ``scale`` command, the script times ``dhmc.sample`` itself on local clusters of
1, 2, ... workers and writes the same ``scaling.json``.

    python examples/scaling_study.py                          # 1024 chains x 200 draws, 3 repeats
    python examples/scaling_study.py --quick --out /tmp/scaling
    python examples/scaling_study.py --cluster slurm --workers 1,2,4,8
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

CLI = [sys.executable, "-m", "dhmc"]


def cli_has_scale() -> bool:
    """Whether this dhmc has the ``scale`` command (``dhmc scale --help`` exits 0)."""
    done = subprocess.run([*CLI, "scale", "--help"], capture_output=True, text=True)
    return done.returncode == 0


def run_cli(workers, chains, draws, repeat, cluster, folder) -> dict:
    cmd = [*CLI, "scale", "strong", "--workers", workers, "--chains", str(chains), "--draws", str(draws),
           "--repeat", str(repeat), "--out", str(folder)]
    if cluster:
        cmd += ["--cluster", cluster]
    print("$ dhmc " + " ".join(cmd[3:]), flush=True)
    done = subprocess.run(cmd)
    if done.returncode != 0:
        raise SystemExit(f"dhmc scale failed with exit code {done.returncode}")
    return json.loads((folder / "scaling.json").read_text())


def run_fallback(workers, chains, draws, repeat, folder) -> dict:
    """Time ``dhmc.sample`` on local clusters of each size (fixed-cost HMC, same chains_per_task)."""
    from distributed import Client, LocalCluster

    import dhmc

    counts = [int(w) for w in workers.split(",")]
    cpt = max(1, chains // (4 * max(counts)))  # equal blocks, 4 per worker at the most workers
    settings = dict(warmup=0, kernel="hmc", adapt=False, step_size=0.1, num_steps=1000, chains_per_task=cpt,
                    progress=False)
    runs = []
    for n in counts:
        cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0")
        with cluster, Client(cluster) as client:
            dhmc.sample("gaussian_2d", chains=chains, draws=draws, cluster=client, **settings)  # compile
            seconds = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                dhmc.sample("gaussian_2d", chains=chains, draws=draws, cluster=client, **settings)
                seconds.append(time.perf_counter() - t0)
        runs.append({"workers": n, "chains": chains, "draws": draws, "seconds": float(np.median(seconds)),
                     "seconds_min": min(seconds), "seconds_max": max(seconds),
                     "chain_draws_per_s": chains * draws / float(np.median(seconds))})
        print(f"{n} worker(s): {runs[-1]['seconds']:.2f} s")
    base = runs[0]
    for run in runs:
        run["speedup"] = base["workers"] * base["seconds"] / run["seconds"]
        run["efficiency"] = run["speedup"] / run["workers"]
    result = {"kind": "strong", "model": "gaussian_2d", "runs": runs, "machine": {"note": "fallback timing"},
              "settings": {"per_model": {"gaussian_2d": {"step_size": 0.1, "num_steps": 1000}}}}
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "scaling.json").write_text(json.dumps(result, indent=2))
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small study (CI smoke test)")
    parser.add_argument("--out", default="examples/output", help="folder for the figure (the CLI's go to OUT/scaling)")
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    parser.add_argument("--cluster", default=None, help="passed to dhmc scale: local (default), cuda, slurm, address")
    args = parser.parse_args(argv)
    out = Path(args.out)
    folder = out / "scaling"
    folder.mkdir(parents=True, exist_ok=True)
    # gaussian_2d at dhmc scale's fixed 1000 leapfrog steps per draw: 1024 x 200 draws is ~20 s on one core.
    chains, draws, repeat = (64, 50, 1) if args.quick else (1024, 200, 3)

    t0 = time.perf_counter()
    if cli_has_scale():
        result = run_cli(args.workers, chains, draws, repeat, args.cluster, folder)
    else:
        print("this dhmc has no `dhmc scale` command: timing dhmc.sample on local clusters instead")
        if args.cluster:
            raise SystemExit("--cluster needs `dhmc scale`; the fallback runs on local clusters only")
        result = run_fallback(args.workers, chains, draws, repeat, folder)
    print(f"study took {time.perf_counter() - t0:.0f} s")

    runs = sorted(result["runs"], key=lambda r: r["workers"])
    workers = np.array([r["workers"] for r in runs])
    speedup = np.array([r["speedup"] for r in runs])
    rate = np.array([r["chain_draws_per_s"] for r in runs])
    spread = np.array([[r["chains"] * r["draws"] / r["seconds_max"], r["chains"] * r["draws"] / r["seconds_min"]]
                       for r in runs])
    for r in runs:
        print(f"{r['workers']} worker(s): {r['seconds']:.2f} s, {r['chain_draws_per_s']:,.0f} chain-draws/s, "
              f"speedup {r['speedup']:.2f}, efficiency {r['efficiency']:.0%}"
              + (f", {r['grad_evals']:.4g} gradient evaluations in {r['blocks']} blocks" if r.get("grad_evals") else "")
              + (f"; SUSPECT ({r['suspect']}): {r.get('suspect_detail', '')}" if r.get("suspect") else ""))

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4.2))
    ax1.plot(workers, workers, "k--", lw=1, label="ideal")
    ax1.plot(workers, speedup, "o-", color="tab:blue", label="measured")
    for w, s, r in zip(workers, speedup, runs, strict=True):
        # dhmc scale marks a point "suspect" (e.g. "superlinear": faster than linear, which equal work on
        # pinned CPU workers cannot be) instead of letting the figure report it silently
        note = f"\nsuspect: {r['suspect']}" if r.get("suspect") else ""
        ax1.annotate(f"{s:.2f}x ({r['efficiency']:.0%}){note}", (w, s), textcoords="offset points", xytext=(6, -12),
                     fontsize=8, va="top", color="tab:red" if note else "black")
    ax1.set(xlabel="workers", ylabel="speedup", xticks=workers, title="speedup (efficiency)")
    ax1.set_xlim(workers.min() - 0.3, workers.max() + 0.6)
    ax1.set_ylim(0, max(workers.max(), speedup.max()) * 1.15)
    ax1.legend(fontsize=8, loc="upper left")
    ax2.errorbar(workers, rate, yerr=[rate - spread[:, 0], spread[:, 1] - rate], fmt="o-", color="tab:green",
                 capsize=3)
    steps = result.get("settings", {}).get("per_model", {}).get(result["model"], {}).get("num_steps")
    ylabel = "chain-draws per second" + (f"\n({steps} leapfrog steps each)" if steps else "")
    ax2.set(xlabel="workers", ylabel=ylabel, xticks=workers, ylim=(0, spread.max() * 1.15),
            title="throughput (median, min-max over repeats)")
    ax2.ticklabel_format(axis="y", style="plain")
    ax2.set_xlim(workers.min() - 0.3, workers.max() + 0.3)
    machine = result.get("machine", {})
    where = ", ".join(str(v) for v in (machine.get("cpu_model"), machine.get("hostname")) if v)
    cores = machine.get("cores_available")
    title = (f"Strong scaling: {runs[0]['chains']} chains x {runs[0]['draws']} draws of {result['model']}"
             + (f" on {where}" if where else "") + (f" ({cores} cores)" if cores else ""))
    suspect = [r for r in runs if r.get("suspect")]
    if suspect:
        reasons = ", ".join(sorted({r["suspect"] for r in suspect}))
        title += f"\n{len(suspect)} point(s) marked suspect ({reasons}): see scaling.json"
    busy = [r for r in runs if r.get("cpu_share") is not None and r["cpu_share"] < 0.8]
    if busy:  # dhmc scale records the share of CPU the workers got; on a busy machine the times mean little
        title += (f"\nthe machine was busy (workers got {min(r['cpu_share'] for r in busy):.0%} of their CPU at "
                  "worst): these timings are unreliable")
    fig.suptitle(title, fontsize=10.5)
    fig.tight_layout()
    path = out / "scaling_study.png"
    fig.savefig(path, dpi=100)
    others = sorted(p.name for p in folder.glob("*.png"))
    print(f"wrote {path}; the study's own plots: {', '.join(others) or 'none'} in {folder}")


if __name__ == "__main__":
    main()

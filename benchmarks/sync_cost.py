"""What a warmup synchronisation costs: the wall time of a round beyond its slowest block.

Every warmup round (cold or adjusted) is a barrier across the ensemble: the driver submits one block per chunk,
waits for all of them, merges their statistics and decides the next round. Per round, the run's ``dhmc_timing``
records the round's wall time and its slowest block's device seconds (``warmup_rounds``); the difference is the
synchronisation: submitting, scheduling, shipping positions and statistics both ways, and the driver's merge.
This script runs ``dhmc.sample`` with ``warmup="auto"`` on a cheap target (a 10-D Gaussian, so the blocks are
short and the synchronisation shows) on the embedded cluster, or on the local Slurm
(``deploy/local-slurm/up.sh``; ``--cluster slurm``), and reports the median round, block and synchronisation
seconds per phase, and the synchronisation per gradient of a cold round.

    python -m benchmarks.sync_cost                       # embedded cluster, 1024 chains: results/sync_cost.json
    python -m benchmarks.sync_cost --cluster slurm --out benchmarks/results/sync_cost_slurm.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

from benchmarks.harness import RESULTS, write_json
from benchmarks.machine import machine


def measure(cluster: str, chains: int, dim: int, seed: int) -> dict:
    import jax.numpy as jnp

    import dhmc
    from dhmc.distributed import cold_rounds

    options = {}
    if cluster == "slurm":
        import tempfile

        folder = tempfile.mkdtemp(prefix="dhmc-sync-")
        options = {"log_directory": folder, "local_directory": folder}
    t = time.perf_counter()
    tree = dhmc.sample(lambda p: -0.5 * jnp.sum((p["x"] / jnp.arange(1.0, dim + 1)) ** 2),
                       init={"x": jnp.zeros(dim)}, chains=chains, draws=100, seed=seed, progress=False,
                       cluster=None if cluster == "local" else cluster, cluster_options=options or None)
    total = time.perf_counter() - t
    timing = json.loads(tree["posterior"].attrs["dhmc_timing"])
    spec = json.loads(tree["posterior"].attrs["dhmc_run_spec"])
    rounds = timing["warmup_rounds"][1:]  # the first round also waits for the workers' first compile
    out = {"cluster": cluster, "chains": chains, "dim": dim, "chains_per_task": spec["chains_per_task"],
           "blocks_per_round": -(-chains // spec["chains_per_task"]), "total_s": total, "rounds": len(rounds) + 1}
    for phase in ("cold", "warmup"):
        mine = [r for r in rounds if r["phase"] == phase]
        if not mine:
            continue
        sync = [r["seconds"] - r["block_seconds_max"] for r in mine]
        out[phase] = {"rounds": len(mine), "median_round_s": statistics.median(r["seconds"] for r in mine),
                      "median_block_s": statistics.median(r["block_seconds_max"] for r in mine),
                      "median_sync_s": statistics.median(sync), "max_sync_s": max(sync)}
    if "cold" in out:
        out["cold"]["sync_s_per_gradient"] = out["cold"]["median_sync_s"] / (cold_rounds.COLD_ROUND + 1)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cluster", default="local", choices=("local", "slurm"))
    ap.add_argument("--chains", type=int, default=1024)
    ap.add_argument("--dim", type=int, default=10)
    ap.add_argument("--seeds", type=lambda s: [int(x) for x in s.split(",")], default=[0, 1, 2])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    out = args.out or str(RESULTS / ("sync_cost.json" if args.cluster == "local" else f"sync_cost_{args.cluster}.json"))
    runs = []
    for seed in args.seeds:
        runs.append(measure(args.cluster, args.chains, args.dim, seed))
        r = runs[-1]
        print(f"seed {seed}: {r['blocks_per_round']} blocks a round; " + "; ".join(
            f"{p}: {r[p]['rounds']} rounds, round {r[p]['median_round_s'] * 1e3:.0f} ms, slowest block "
            f"{r[p]['median_block_s'] * 1e3:.0f} ms, synchronisation {r[p]['median_sync_s'] * 1e3:.0f} ms"
            for p in ("cold", "warmup") if p in r), flush=True)
    write_json(out, {"benchmark": "sync_cost", "machine": machine(), "settings": vars(args), "runs": runs})
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How precisely independent draws can give the Brownian motion's scales' sds: the floor under any sampler's error.

``many_chains.py`` scores a run at the first prefix whose bulk and tail ESS reach the target (400), and checks each
sd against the exact one within ``max(0.05, 3 / sqrt(ESS))`` (``tests/validation/compare.py``); at 1024 chains that
prefix is 10 draws a chain and the bulk ESS some 5,000, so the 5% floor is the rule. A sd's own Monte Carlo error
grows with the kurtosis, ``sd_rel ~ sqrt((kurtosis - 1) / (4 n))`` for ``n`` independent draws, where the rule's
``3 / sqrt(ESS)`` assumes a normal's 3. This script draws each log scale's exact marginal (the quadrature grid of
``laps_targets.brownian_grid``; uniform within a grid cell) ``--repeats`` times for each ``n`` of ``--draws``, and
reports the spread of the sd ratio and how often the rule fails **a sampler that makes independent draws**; and the
share of the mass and of the variance in each tail beyond 2, 3 and 4 sds.

    python -m benchmarks.tail_noise                      # results/tail_noise.json
"""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks.harness import RESULTS, write_runs

SCALES = ("log_innovation", "log_observation")


def marginal(name: str, h: float):
    """``(points, weights)``: ``name``'s exact marginal on the quadrature grid of step ``h``."""
    import numpy as np

    from benchmarks.laps_targets import brownian_grid

    grid = brownian_grid(h)
    axis = SCALES.index(name)  # the grid is indexed (log_innovation, log_observation)
    weights = grid["weights"].sum(axis=1 - axis)
    points = grid[name].take(0, axis=1 - axis)
    return np.asarray(points, float), np.asarray(weights / weights.sum(), float)


def run(name: str, draws: list[int], repeats: int, h: float, seed: int) -> dict:
    import numpy as np

    points, weights = marginal(name, h)
    mean = float(weights @ points)
    var = float(weights @ (points - mean) ** 2)
    sd = var**0.5
    kurtosis = float(weights @ (points - mean) ** 4) / var**2
    tails = {}
    for k in (2, 3, 4):
        for side, beyond in (("below", points < mean - k * sd), ("above", points > mean + k * sd)):
            tails[f"{side}_{k}sd"] = {"mass": float(weights[beyond].sum()),
                                      "variance_share": float(weights[beyond] @ (points[beyond] - mean) ** 2) / var}
    cdf, rng = np.cumsum(weights), np.random.default_rng(seed)
    rows = []
    for n in draws:
        ratios = np.empty(repeats)
        for r in range(repeats):
            x = points[np.minimum(np.searchsorted(cdf, rng.random(n)), len(points) - 1)] + rng.uniform(-h / 2, h / 2, n)
            ratios[r] = x.std(ddof=1) / sd
        tolerance = max(0.05, 3 / n**0.5)
        rows.append({"draws": n, "sd_ratio_sd": float(ratios.std()), "sd_ratio_median": float(np.median(ratios)),
                     "rule_tolerance": tolerance, "rule_fails": float(np.mean(np.abs(ratios - 1) >= tolerance)),
                     "normal_sd_rel": (2 * n) ** -0.5, "kurtosis_sd_rel": ((kurtosis - 1) / (4 * n)) ** 0.5})
        print(f"{name}: {n} independent draws: sd ratio {np.median(ratios):.3f} +- {ratios.std():.3f}, the rule's "
              f"+-{tolerance:.3f} fails {100 * rows[-1]['rule_fails']:.1f}% of them", flush=True)
    return {"scale": name, "mean": mean, "sd": sd, "kurtosis": kurtosis, "tails": tails, "draws": rows}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draws", type=lambda s: [int(x) for x in s.split(",")], default=[1024, 4096, 10240, 40960])
    ap.add_argument("--repeats", type=int, default=2000)
    ap.add_argument("--grid", type=float, default=0.01, help="the quadrature grid's step (the reference's: 0.01)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "tail_noise.json"))
    args = ap.parse_args(argv)
    t = time.perf_counter()
    runs = [run(name, args.draws, args.repeats, args.grid, args.seed) for name in SCALES]
    write_runs(args.out, "tail_noise", args, t, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())

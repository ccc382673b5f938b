"""Convergence of an HMC ensemble on the coin-toss model, checked against the exact posterior.

Two coins, uniform priors, 20 of 40 and 30 of 40 tosses heads: the posteriors are Beta(21, 21) and
Beta(31, 11). The same initial ensemble (same ``seed``) is run with plain HMC (no warmup, fixed step
size and number of steps) for a growing number of draws, and for a growing trajectory time at a fixed
number of draws. Because every chain's random stream depends only on (seed, chain, iteration), the
runs are nested: the run with N draws is the first N draws of any longer run.

What to compare against: the posterior MEAN, (heads + 1) / (tosses + 2) = 31/42 = 0.738 for the second
coin, not the MAP (mode), heads / tosses = 30/40 = 0.75. A Beta(31, 11) is skewed, its mean lies towards
the longer (left) tail, and an ensemble average estimates the mean. (The 2022 seed project compared its
ensemble averages with 0.75 and saw a "bias" that was its own confusion of the two.)

    python examples/coin_toss_convergence.py                  # 4096 chains, up to 500 draws (minutes)
    python examples/coin_toss_convergence.py --quick --out /tmp/coin
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

import dhmc  # noqa: E402

HEADS, TOSSES = np.array([20, 30]), np.array([40, 40])
A, B = HEADS + 1, TOSSES - HEADS + 1                      # Beta(a, b) posteriors under uniform priors
EXACT_MEAN = A / (A + B)                                  # 0.5, 0.738
EXACT_SD = np.sqrt(A * B / ((A + B) ** 2 * (A + B + 1)))  # 0.0762, 0.0670
MAP = HEADS / TOSSES                                      # 0.5, 0.75
COLOURS = ("tab:blue", "tab:orange")


def ensemble_moments(trace):
    """Mean and sd across the ensemble (over chains) of each coin, at every draw: arrays (draws, coin)."""
    p = trace["posterior"]["p"]
    return p.mean("chain").values, p.std("chain").values


def run(chains, draws, trajectory_length, step_size, seed, cluster):
    """Plain HMC from the initial ensemble of ``seed``: no warmup, no adaptation, fixed step size and time.

    The number of leapfrog steps is ``round(trajectory_length / step_size)``; giving the time rather than
    ``num_steps`` keeps it a traced value, so runs that differ only in time reuse one compiled program.
    """
    return dhmc.sample("coin_toss", chains=chains, draws=draws, warmup=0, kernel="hmc", adapt=False,
                       step_size=step_size, trajectory_length=trajectory_length, seed=seed, cluster=cluster,
                       progress=False)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small ensemble and few runs (CI smoke test)")
    parser.add_argument("--out", default="examples/output", help="folder for the figure")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    step_size, good_time, bad_time = 0.1, 0.2, 1.0
    if args.quick:
        chains, max_draws, times, fixed_draws = 512, 50, np.round(np.arange(0.1, 2.01, 0.2), 2), 3
    else:
        chains, max_draws, times, fixed_draws = 4096, 500, np.round(np.arange(0.1, 3.01, 0.1), 2), 3

    from distributed import Client, LocalCluster

    t0 = time.perf_counter()
    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0")
    with cluster, Client(cluster) as client:
        # Growing number of draws. The runs are nested (each chain's random numbers depend only on the
        # seed, the chain and the iteration), so one run of max_draws holds every shorter run as a prefix.
        by_draws = {T: ensemble_moments(run(chains, max_draws, T, step_size, args.seed, client))
                    for T in (good_time, bad_time)}
        if not args.quick:  # check the nesting claim: a separate 10-draw run ends where draw 10 of the long one is
            short = ensemble_moments(run(chains, 10, good_time, step_size, args.seed, client))
            assert np.array_equal(short[0][-1], by_draws[good_time][0][9]), "runs with one seed are not nested"
        # Growing trajectory time at a fixed, small number of draws.
        by_time = np.array([[m[-1] for m in ensemble_moments(run(chains, fixed_draws, T, step_size, args.seed,
                                                                 client))] for T in times])  # (T, mean|sd, coin)
    runs = len(times) + 2 + (0 if args.quick else 1)
    print(f"{runs} runs of {chains} chains in {time.perf_counter() - t0:.1f} s")
    print(f"exact posterior means {EXACT_MEAN.round(4)}, sds {EXACT_SD.round(4)}; MAPs {MAP}")
    for n in (1, 3, 10, 30, 100, 300, 500):
        if n <= max_draws:
            m, s = by_draws[good_time][0][n - 1], by_draws[good_time][1][n - 1]
            print(f"T = {good_time}, after {n:3d} draws: ensemble mean {m.round(4)}, sd {s.round(4)}")

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.8), sharey="row")
    se = (EXACT_SD / np.sqrt(chains), EXACT_SD / np.sqrt(2 * (chains - 1)))  # MC error of mean and sd over chains
    draws = np.arange(1, max_draws + 1)
    for row, (exact, name) in enumerate([(EXACT_MEAN, "mean"), (EXACT_SD, "sd")]):
        for col in range(2):
            ax = axes[row, col]
            for c in range(2):
                ax.axhspan(exact[c] - 2 * se[row][c], exact[c] + 2 * se[row][c], color=COLOURS[c], alpha=0.2, lw=0)
                ax.axhline(exact[c], color=COLOURS[c], ls="--", lw=1)
                if col == 0:
                    ax.plot(draws, by_draws[good_time][row][:, c], "-", color=COLOURS[c], lw=1.8,
                            label=f"coin {c}, T = {good_time}" if row == 0 else None)
                    ax.plot(draws, by_draws[bad_time][row][:, c], ":", color=COLOURS[c], lw=1.2,
                            label=f"coin {c}, T = {bad_time}" if row == 0 else None)
                else:
                    ax.plot(times, by_time[:, row, c], "o-", color=COLOURS[c], ms=3.5, lw=1.2)
            if row == 0:
                ax.axhline(MAP[1], color="k", ls=(0, (1, 1.5)), lw=1.2,
                           label="MAP of coin 1: 30/40 = 0.75" if col == 0 else None)
            ax.grid(alpha=0.3, which="both")
            ax.set_ylabel(f"ensemble {name} of p" if col == 0 else "")
        axes[row, 0].set_xscale("log")
        axes[row, 0].set_xlabel("number of draws N")
        axes[row, 1].set_xlabel(f"trajectory time T = step size x steps  (N = {fixed_draws} draws)")
    axes[0, 0].plot([], [], "k--", lw=1, label="exact posterior (±2 MC s.e.)")
    fig.legend(loc="upper center", bbox_to_anchor=(0.5, 0.955), ncol=6, fontsize=8, frameon=False)
    for row in range(2):
        for T in (good_time, bad_time):
            axes[row, 1].axvline(T, color="0.4", lw=0.8, ls=(0, (4, 3)), zorder=0)
    axes[1, 1].text(good_time, 0.98, f" T = {good_time}", transform=axes[1, 1].get_xaxis_transform(), fontsize=7.5,
                    va="top", color="0.3")
    axes[1, 1].text(bad_time, 0.98, f" T = {bad_time}", transform=axes[1, 1].get_xaxis_transform(), fontsize=7.5,
                    va="top", color="0.3")
    axes[0, 0].set_title(f"same initial ensemble, growing number of draws (step {step_size})", fontsize=10)
    axes[0, 1].set_title("same initial ensemble, growing trajectory time", fontsize=10)
    fig.suptitle(f"Coin toss: {chains} HMC chains from one initial ensemble converge to the exact posterior "
                 "Beta(21,21), Beta(31,11)", fontsize=11.5)
    fig.text(0.5, 0.01,
             "Dashed: exact posterior mean (21/42 = 0.5, 31/42 = 0.738) and sd, shaded ±2 Monte Carlo standard "
             "errors for this ensemble. Dotted black: the MAP of coin 1, 30/40 = 0.75;\nBeta(31,11) is skewed, its "
             "mean lies below its mode, so an average over draws converges to 0.738, not 0.75. With T near half an "
             "oscillation period\n(1.0 for coin 0, 1.35 for coin 1) fixed-length HMC maps the ensemble onto its "
             "mirror image and the sd stalls: the reason dhmc's default kernel, ChEES, jitters the trajectory time.",
             ha="center", va="bottom", fontsize=8.3)
    fig.tight_layout(rect=(0, 0.085, 1, 0.945))
    path = out / "coin_toss_convergence.png"
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""Fit a thrown object's height, h + v0 t + g t^2, to noisy measurements, and compare with least squares.

The NumPyro model (``dhmc.models.examples.linear_acceleration_model``) has weakly informative normal
priors and a known noise sd of 3, so the posterior should agree with the least-squares fit
(``numpy.polyfit``) to well within one standard error. The figure shows the posterior of each parameter
(with the least-squares estimate and the true value used to simulate the data) and the posterior
predictive band over the data.

    python examples/linear_acceleration.py                  # 1024 chains x 1000 draws
    python examples/linear_acceleration.py --quick --out /tmp/linacc
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
from dhmc.models.examples import linear_acceleration_data, linear_acceleration_model  # noqa: E402

NAMES = ("h", "v0", "g")
LABELS = {"h": "initial height h", "v0": "initial velocity v0", "g": "coefficient g of t² (= acceleration / 2)"}
NOISE = 3.0  # the model's known noise sd


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small ensemble (CI smoke test)")
    parser.add_argument("--out", default="examples/output", help="folder for the figure")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # Keep the default 1000 warmup iterations even in --quick: t^2 reaches 441, the parameters are strongly
    # correlated and badly scaled, and a short warmup leaves the trajectory length too short to move.
    chains, draws, warmup = (64, 200, 1000) if args.quick else (1024, 1000, 1000)

    t, y, truth = linear_acceleration_data()
    t0 = time.perf_counter()
    trace = dhmc.sample(linear_acceleration_model, model_args=(t, y), chains=chains, draws=draws, warmup=warmup,
                        seed=args.seed, progress=not args.quick)
    print(f"sampled {chains} chains x {draws} draws in {time.perf_counter() - t0:.1f} s")
    post = trace["posterior"].to_dataset()
    stats = trace["sample_stats"].to_dataset()
    print(f"divergences: {int(stats.diverging.sum())}, mean acceptance {float(stats.acceptance_rate.mean()):.3f}")

    # Least squares: polyfit returns the highest power first. Weights 1/NOISE and cov="unscaled" give the
    # covariance for the model's known noise sd, which is the posterior covariance under flat priors.
    coef, cov = np.polyfit(t, y, 2, w=np.full_like(t, 1.0 / NOISE), cov="unscaled")
    ls = dict(zip(("g", "v0", "h"), coef, strict=True))
    ls_se = dict(zip(("g", "v0", "h"), np.sqrt(np.diag(cov)), strict=True))
    print(f"{'':4s} {'posterior mean':>15s} {'sd':>8s} {'least squares':>14s} {'s.e.':>8s} {'truth':>7s}")
    for k in NAMES:
        m, s = float(post[k].mean()), float(post[k].std())
        print(f"{k:4s} {m:15.4f} {s:8.4f} {ls[k]:14.4f} {ls_se[k]:8.4f} {truth[k]:7.2f}")

    fig = plt.figure(figsize=(11, 9))
    grid = fig.add_gridspec(3, 3, height_ratios=(1, 1.3, 0.7), hspace=0.45, wspace=0.25)
    for i, k in enumerate(NAMES):
        ax = fig.add_subplot(grid[0, i])
        values = post[k].values.ravel()
        ax.hist(values, bins=60, density=True, color="tab:blue", alpha=0.6, label="posterior (dhmc)")
        ax.axvline(ls[k], color="k", lw=1.5, label="least squares (numpy.polyfit)")
        ax.axvspan(ls[k] - ls_se[k], ls[k] + ls_se[k], color="k", alpha=0.08, label="least squares ±1 s.e.")
        ax.axvline(truth[k], color="tab:red", ls="--", lw=1.2, label="true value (simulation)")
        ax.set_xlabel(LABELS[k])
        ax.set_yticks([])
        ax.set_title(f"{k} = {values.mean():.3f} ± {values.std():.3f}", fontsize=10)
        ax.ticklabel_format(axis="x", useOffset=False)
        ax.locator_params(axis="x", nbins=5)
        if i == 0:
            fig.legend(loc="upper center", bbox_to_anchor=(0.5, 0.955), ncol=4, fontsize=8.5, frameon=False)

    # Posterior predictive: the mean curve for a random subset of draws, plus the observation noise.
    rng = np.random.default_rng(args.seed)
    flat = {k: post[k].values.ravel() for k in NAMES}
    pick = rng.choice(flat["h"].size, size=min(4000, flat["h"].size), replace=False)
    curves = flat["h"][pick, None] + flat["v0"][pick, None] * t + flat["g"][pick, None] * t**2  # at the data times
    predictive = curves + rng.normal(0.0, NOISE, curves.shape)
    low, high = np.quantile(predictive, [0.05, 0.95], axis=0)
    mean_low, mean_high = np.quantile(curves, [0.05, 0.95], axis=0)
    inside = np.mean((y >= low) & (y <= high))
    fit, true_curve = np.polyval(coef, t), truth["h"] + truth["v0"] * t + truth["g"] * t**2
    ax = fig.add_subplot(grid[1, :])
    ax.fill_between(t, low, high, color="tab:blue", alpha=0.18, label="90% posterior predictive (with noise)")
    ax.fill_between(t, mean_low, mean_high, color="tab:blue", alpha=0.5, label="90% band of the mean curve")
    ax.plot(t, y, ".", color="0.3", ms=4, label="data")
    ax.plot(t, fit, "k-", lw=1.3, label="least-squares fit")
    ax.plot(t, true_curve, "--", color="tab:red", lw=1.2, label="true curve")
    ax.set(ylabel="height y")
    ax.tick_params(labelbottom=False)
    ax.set_title(f"posterior predictive over the {t.size} measurements ({inside:.0%} inside the 90% band)",
                 fontsize=10)
    ax.legend(fontsize=8, loc="lower center", ncol=3)
    # The mean-curve band is too thin to see at that scale: show it relative to the least-squares fit.
    ax2 = fig.add_subplot(grid[2, :], sharex=ax)
    ax2.fill_between(t, mean_low - fit, mean_high - fit, color="tab:blue", alpha=0.5)
    ax2.plot(t, true_curve - fit, "--", color="tab:red", lw=1.2)
    ax2.plot(t, np.median(curves, axis=0) - fit, color="tab:blue", lw=1)
    ax2.axhline(0.0, color="k", lw=1.3)
    ax2.set(xlabel="time t", ylabel="minus least squares")
    ax2.set_title("mean curve relative to the least-squares fit (posterior median and 90% band; true curve)",
                  fontsize=10)
    fig.suptitle(f"Linear acceleration: {chains} chains x {draws} draws with dhmc vs numpy.polyfit", fontsize=12)
    fig.subplots_adjust(left=0.08, right=0.98, top=0.87, bottom=0.06)
    path = out / "linear_acceleration.png"
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

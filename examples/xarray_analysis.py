"""Posterior analysis with xarray on a lazily opened dhmc Zarr store (the built-in eight schools model).

dhmc streams draws into a Zarr store in ArviZ's layout: one group per ArviZ group, dims
``(chain, draw, ...)`` with coordinates. ``dhmc.open_trace`` opens it lazily as an
``xarray.DataTree``; from there, everything is plain xarray: select chains and draws by label or
position, reduce over ``("chain", "draw")``, derive new quantities by broadcasting, and compute the
probability of an event as the mean of a boolean array.

    python examples/xarray_analysis.py                  # 1024 chains x 1000 draws
    python examples/xarray_analysis.py --quick --out /tmp/xr
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import xarray as xr  # noqa: E402

import dhmc  # noqa: E402
from dhmc.models.examples import EIGHT_SCHOOLS_SIGMA  # noqa: E402

SAMPLE = ("chain", "draw")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small ensemble (CI smoke test)")
    parser.add_argument("--out", default="examples/output", help="folder for the Zarr store and the figure")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    chains, draws, warmup = (32, 200, 200) if args.quick else (1024, 1000, 1000)
    store = out / "xarray_analysis.zarr"

    t0 = time.perf_counter()
    dhmc.sample("eight_schools", chains=chains, draws=draws, warmup=warmup, seed=args.seed, store=store,
                overwrite=True, progress=not args.quick)
    print(f"sampled {chains} chains x {draws} draws into {store} in {time.perf_counter() - t0:.1f} s")

    # 1. Open lazily: only metadata is read here; arrays are read when values are needed.
    tree = dhmc.open_trace(store)
    post = tree["posterior"].to_dataset()
    print(post)
    y = tree["observed_data"]["obs"].values  # the observed effects, one per school

    # 2. Select by label and by position. chain labels are 0..chains-1, so slice(0, 9) is 10 chains (labels are
    #    inclusive); isel drops the first 100 draws by position.
    first_ten = post.sel(chain=slice(0, 9)).isel(draw=slice(min(100, draws // 2), None))
    print(f"\nchains 0-9, draws {int(first_ten.draw[0])}..: mu = {float(first_ten.mu.mean()):.3f} "
          f"(all chains: {float(post.mu.mean()):.3f})")

    # 3. Posterior summaries by reducing over (chain, draw).
    means = post.mean(SAMPLE)
    quantiles = post["theta"].quantile([0.05, 0.5, 0.95], dim=SAMPLE)
    print("\nposterior mean of mu, tau:", float(means.mu), float(means.tau))
    print("theta: 5%, 50%, 95% quantiles per school\n", quantiles.round(2).to_pandas().T)

    # 4. Derived quantities by broadcasting. sigma gets the "school" dim so it lines up with theta;
    #    the pooling factor says how far each school's estimate is pulled towards mu (1 = completely).
    sigma = xr.DataArray(EIGHT_SCHOOLS_SIGMA, dims="school", coords={"school": post.school})
    pooling = sigma**2 / (sigma**2 + post.tau**2)
    shrinkage = post.theta - post.mu
    print("\npooling factor per school (posterior median):", pooling.median(SAMPLE).round(3).values)
    print("theta - mu per school (posterior median):", shrinkage.median(SAMPLE).round(2).values)

    # 5. Probabilities of events: the mean of a boolean array.
    p_large = (post.theta > 10).mean(SAMPLE)
    p_a_beats_c = float((post.theta.sel(school=0) > post.theta.sel(school=2)).mean())
    p_small_tau = float((post.tau < 1).mean())
    print("P(theta > 10) per school:", p_large.round(3).values)
    print(f"P(school 0 better than school 2) = {p_a_beats_c:.3f}; P(tau < 1) = {p_small_tau:.3f}")

    # 6. Running means over draws (cumulative sums along "draw"), for 10 chains and for the whole ensemble.
    n = xr.DataArray(np.arange(1, draws + 1), dims="draw", coords={"draw": post.draw})
    running_ten = post.mu.sel(chain=slice(0, 9)).cumsum("draw") / n
    running_all = post.mu.mean("chain").cumsum("draw") / n

    fig, axes = plt.subplots(2, 2, figsize=(11, 8))
    schools = post.school.values
    ax = axes[0, 0]
    q = quantiles
    ax.errorbar(schools + 0.12, q.sel(quantile=0.5), yerr=[q.sel(quantile=0.5) - q.sel(quantile=0.05),
                q.sel(quantile=0.95) - q.sel(quantile=0.5)], fmt="o", color="tab:blue", capsize=3,
                label="posterior theta: median, 5-95%")
    ax.errorbar(schools - 0.12, y, yerr=EIGHT_SCHOOLS_SIGMA, fmt="s", color="0.5", ms=4, capsize=3,
                label="observed effect ± sigma")
    ax.axhline(float(means.mu), color="tab:orange", ls="--", lw=1.2, label="posterior mean of mu")
    ax.set(xlabel="school", ylabel="effect", xticks=schools, title="shrinkage towards the common mean")
    ax.legend(fontsize=8, loc="upper right")

    ax = axes[0, 1]
    ax.bar(schools, p_large, color="tab:blue", alpha=0.75)
    for s, p in zip(schools, p_large.values, strict=True):
        ax.text(s, p + 0.01, f"{p:.2f}", ha="center", fontsize=8)
    ax.set(xlabel="school", ylabel="probability", xticks=schools, ylim=(0, max(0.5, float(p_large.max()) + 0.08)),
           title=f"P(theta > 10) per school;  P(theta[0] > theta[2]) = {p_a_beats_c:.2f}")

    ax = axes[1, 0]
    pq = pooling.quantile([0.05, 0.5, 0.95], dim=SAMPLE)
    ax.errorbar(schools, pq.sel(quantile=0.5), yerr=[pq.sel(quantile=0.5) - pq.sel(quantile=0.05),
                pq.sel(quantile=0.95) - pq.sel(quantile=0.5)], fmt="o", color="tab:green", capsize=3)
    ax.set(xlabel="school", ylabel="sigma² / (sigma² + tau²)", xticks=schools,
           ylim=(0, 1.05), title="derived: pooling factor per school (median, 5-95%)")

    ax = axes[1, 1]
    for c in running_ten.chain.values:
        ax.plot(n, running_ten.sel(chain=c), lw=0.8, alpha=0.6,
                label="one chain (chains 0-9)" if c == 0 else None)
    ax.plot(n, running_all, color="k", lw=2, label=f"mean over all {chains} chains")
    ax.axhline(float(means.mu), color="tab:orange", ls="--", lw=1, label="posterior mean of mu")
    ax.set(xscale="log", xlabel="number of draws N", ylabel="mean of mu over the first N draws",
           title="running mean of mu: chains 0-9 (.sel) and all")
    ax.legend(fontsize=8, loc="upper right")
    for ax in axes.ravel():
        ax.title.set_fontsize(10.5)
    fig.suptitle(f"xarray on a dhmc Zarr store: eight schools, {chains} chains x {draws} draws", fontsize=12)
    fig.tight_layout()
    path = out / "xarray_analysis.png"
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

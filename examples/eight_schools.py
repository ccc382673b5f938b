"""Eight schools, centred and non-centred: NumPyro models as users write them, the funnel and divergences.

The centred model samples each school's effect ``theta ~ Normal(mu, tau)`` directly; when ``tau`` is
small the posterior is a narrow funnel that HMC cannot enter with one step size, and it reports
divergent transitions there. The non-centred model samples ``theta_tilde ~ Normal(0, 1)`` and sets
``theta = mu + tau * theta_tilde``, which removes the funnel. Both runs are streamed to Zarr stores;
the ArviZ summary and the trace plot are made from the stores.

    python examples/eight_schools.py                  # 256 chains x 1000 draws per model
    python examples/eight_schools.py --quick --out /tmp/schools
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import numpyro  # noqa: E402
import numpyro.distributions as dist  # noqa: E402

import dhmc  # noqa: E402
from dhmc.models.examples import EIGHT_SCHOOLS_SIGMA, EIGHT_SCHOOLS_Y  # noqa: E402
from dhmc.models.examples import eight_schools_model as non_centred  # noqa: E402 - theta = mu + tau * theta_tilde


def centred(sigma, y=None):
    """The textbook (centred) parameterisation."""
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
    with numpyro.plate("school", len(sigma)):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)


def first_school(theta):
    """theta of school 0, whatever the name of the school dimension."""
    return theta.isel({theta.dims[2]: 0})


def sample_both(stores, chains, draws, warmup, seed):
    """Sample both models into their Zarr stores on one local cluster."""
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0")
    with cluster, Client(cluster) as client:
        for name, model in (("centred", centred), ("non-centred", non_centred)):
            t0 = time.perf_counter()
            dhmc.sample(model, model_args=(EIGHT_SCHOOLS_SIGMA, EIGHT_SCHOOLS_Y), chains=chains, draws=draws,
                        warmup=warmup, seed=seed, store=stores[name], overwrite=True, cluster=client,
                        progress=False)
            print(f"{name}: {chains} chains x {draws} draws in {time.perf_counter() - t0:.1f} s -> {stores[name]}")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small ensembles (CI smoke test)")
    parser.add_argument("--out", default="examples/output", help="folder for the Zarr stores and figures")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replot", action="store_true", help="skip sampling: redraw from the stores in --out")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # The centred model needs hundreds of leapfrog steps per draw in the funnel; 256 chains keep a full run to
    # minutes on a laptop. (--quick: 80 warmup iterations are a single adaptation round, no mass matrix.)
    chains, draws, warmup = (32, 100, 80) if args.quick else (256, 1000, 1000)

    import arviz as az

    stores = {"centred": out / "eight_schools_centred.zarr", "non-centred": out / "eight_schools_non_centred.zarr"}
    if not args.replot:
        sample_both(stores, chains, draws, warmup, args.seed)

    # Everything below reads the stores back, lazily.
    traces = {name: dhmc.open_trace(path) for name, path in stores.items()}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8), sharey=True)
    lowest = []
    for ax, (name, trace) in zip(axes, traces.items(), strict=True):
        post, stats = trace["posterior"], trace["sample_stats"]
        theta0 = first_school(post["theta"]).values.ravel()
        log_tau = np.log(post["tau"].values.ravel())
        lowest.append(np.quantile(log_tau, 0.0005))
        diverging = stats["diverging"].values.ravel()
        n_steps = stats["n_steps"].values.mean()
        rng = np.random.default_rng(0)  # plot at most 20 000 draws, so the funnel's neck stays visible
        shown = np.flatnonzero(~diverging)
        shown = rng.choice(shown, size=min(20_000, shown.size), replace=False)
        ax.scatter(theta0[shown], log_tau[shown], s=2, color="0.35", alpha=0.3, lw=0, rasterized=True,
                   label=f"draw ({shown.size:,} of {diverging.size:,} shown)")
        ax.scatter(theta0[diverging], log_tau[diverging], s=9, color="crimson", alpha=0.8, lw=0,
                   label="divergent transition (all)")
        ax.set_title(f"{name}: {diverging.sum()} divergences ({diverging.mean():.2%} of draws), "
                     f"{n_steps:.0f} leapfrog steps/draw", fontsize=9.5)
        ax.set_xlabel("theta[0] (effect in school 0)")
        ax.set_xlim(np.quantile(theta0, [0.001, 0.999]) + np.array([-5, 5]))
        print(f"{name}: {diverging.sum()} divergent draws of {diverging.size}; "
              f"mean tau {float(post['tau'].mean()):.3f}, P(tau < 1) {float((post['tau'] < 1).mean()):.3f}")
    axes[0].set_ylabel("log tau")
    axes[0].set_ylim(max(-7.0, min(lowest) - 0.5), np.quantile(log_tau, 0.9995) + 0.3)
    axes[0].legend(loc="lower right", fontsize=8, markerscale=3)
    fig.suptitle("Eight schools: the funnel of the centred model (log tau vs theta[0]) and its divergences",
                 fontsize=11.5)
    fig.tight_layout()
    funnel = out / "eight_schools_funnel.png"
    fig.savefig(funnel, dpi=100)
    print(f"wrote {funnel}")

    # ArviZ (0.x) from the Zarr store: InferenceData.from_datatree on the lazily opened DataTree.
    idatas = {name: az.InferenceData.from_datatree(dhmc.open_trace(path)) for name, path in stores.items()}
    for name, idata in idatas.items():
        print(f"\n{name}:")
        print(az.summary(idata, var_names=["mu", "tau", "theta"], round_to=3).to_string())
    # Two chains with the most divergences and two with the fewest (labels picked with xarray).
    centred_idata = idatas["centred"]
    per_chain = centred_idata.sample_stats["diverging"].sum("draw")
    order = per_chain.sortby(per_chain, ascending=False).chain.values
    chosen = sorted({*order[:2].tolist(), *order[-2:].tolist()})
    few = centred_idata.sel(chain=chosen)
    axes = az.plot_trace(few, var_names=["mu", "tau"], compact=True, divergences=None,
                         backend_kwargs={"figsize": (10, 4.8)})
    diverging = few.sample_stats["diverging"]
    for row, var in enumerate(["mu", "tau"]):  # mark divergent draws where they happen, in red
        values = few.posterior[var].where(diverging)
        draws_at = np.broadcast_to(values.draw.values, values.shape)
        axes[row, 1].scatter(draws_at.ravel(), values.values.ravel(), s=6, color="crimson", zorder=3,
                             label="divergent" if row == 0 else None)
    axes[0, 1].legend(loc="upper right", fontsize=8)
    fig = axes.ravel()[0].figure
    counts = ", ".join(f"{c}: {int(per_chain.sel(chain=c))}" for c in chosen)
    fig.suptitle(f"centred eight schools, read back from {stores['centred'].name}\n"
                 f"chains {chosen} of {chains}: the two with the most and the fewest divergences ({counts})",
                 fontsize=10)
    fig.tight_layout()
    trace_plot = out / "eight_schools_trace.png"
    fig.savefig(trace_plot, dpi=90)
    print(f"wrote {trace_plot}")


if __name__ == "__main__":
    main()

"""Eight schools, centred and non-centred: NumPyro models as users write them, the funnel and divergences.

The centred model samples each school's effect ``theta ~ Normal(mu, tau)`` directly; when ``tau`` is
small the posterior is a narrow funnel that HMC cannot enter with one step size, and it reports
divergent transitions there. The non-centred model samples ``theta_tilde ~ Normal(0, 1)`` and sets
``theta = mu + tau * theta_tilde``, which removes the funnel. Both runs are streamed to Zarr stores;
the ArviZ summary and the trace plot are made from the stores.

    python examples/eight_schools.py                  # 1024 chains x 1000 draws per model
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small ensembles (CI smoke test)")
    parser.add_argument("--out", default="examples/output", help="folder for the Zarr stores and figures")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    chains, draws, warmup = (32, 100, 80) if args.quick else (1024, 1000, 1000)

    import arviz as az
    from distributed import Client, LocalCluster

    stores = {"centred": out / "eight_schools_centred.zarr", "non-centred": out / "eight_schools_non_centred.zarr"}
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            Client(cluster) as client:
        for name, model in (("centred", centred), ("non-centred", non_centred)):
            t0 = time.perf_counter()
            dhmc.sample(model, model_args=(EIGHT_SCHOOLS_SIGMA, EIGHT_SCHOOLS_Y), chains=chains, draws=draws,
                        warmup=warmup, seed=args.seed, store=stores[name], overwrite=True, cluster=client,
                        progress=False)
            print(f"{name}: {chains} chains x {draws} draws in {time.perf_counter() - t0:.1f} s -> {stores[name]}")

    # Everything below reads the stores back, lazily.
    traces = {name: dhmc.open_trace(path) for name, path in stores.items()}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.8), sharey=True)
    for ax, (name, trace) in zip(axes, traces.items(), strict=True):
        post, stats = trace["posterior"], trace["sample_stats"]
        theta0 = first_school(post["theta"]).values.ravel()
        log_tau = np.log(post["tau"].values.ravel())
        diverging = stats["diverging"].values.ravel()
        n_steps = stats["n_steps"].values.mean()
        ax.scatter(theta0[~diverging], log_tau[~diverging], s=2, color="0.45", alpha=0.25, lw=0, rasterized=True,
                   label="draw")
        ax.scatter(theta0[diverging], log_tau[diverging], s=9, color="crimson", alpha=0.8, lw=0,
                   label="divergent transition")
        ax.set_title(f"{name}: {diverging.sum()} divergences ({diverging.mean():.2%} of draws), "
                     f"{n_steps:.0f} leapfrog steps/draw", fontsize=9.5)
        ax.set_xlabel("theta[0] (effect in school 0)")
        ax.set_xlim(np.quantile(theta0, [0.001, 0.999]) + np.array([-5, 5]))
        print(f"{name}: {diverging.sum()} divergent draws of {diverging.size}; "
              f"mean tau {float(post['tau'].mean()):.3f}, P(tau < 1) {float((post['tau'] < 1).mean()):.3f}")
    axes[0].set_ylabel("log tau")
    axes[0].set_ylim(max(-6.0, np.quantile(log_tau, 0.0005) - 0.5), np.quantile(log_tau, 0.9995) + 0.3)
    axes[1].legend(loc="lower right", fontsize=8, markerscale=3)
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
    few = idatas["centred"].sel(chain=slice(0, 7))
    axes = az.plot_trace(few, var_names=["mu", "tau"], compact=True, divergences="bottom",
                         backend_kwargs={"figsize": (10, 4.6)})
    fig = axes.ravel()[0].figure
    fig.suptitle(f"centred eight schools, chains 0-7 of {chains}, read from {stores['centred'].name} "
                 "(divergences marked on the axis)", fontsize=10.5)
    fig.tight_layout()
    trace_plot = out / "eight_schools_trace.png"
    fig.savefig(trace_plot, dpi=90)
    print(f"wrote {trace_plot}")


if __name__ == "__main__":
    main()

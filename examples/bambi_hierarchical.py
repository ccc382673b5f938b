"""A hierarchical regression from a formula: a Bambi model, sampled by dhmc through its PyMC model.

Reaction times of 18 subjects over 10 days of sleep deprivation (simulated like lme4's ``sleepstudy``), each
subject with an intercept and a slope of its own drawn around the population's: ``reaction ~ days + (days |
subject)``. Bambi writes the PyMC model (priors, the correlated group effects' non-centred parameterisation,
names and coords); ``dhmc.sample(model)`` samples it, and the result is named as ``model.fit()``'s would be. The
figure shows each subject's data and posterior regression lines against the truth the data were simulated from,
and the population slope's posterior.

    python examples/bambi_hierarchical.py                    # 256 chains x 1000 draws
    python examples/bambi_hierarchical.py --quick --out /tmp/bambi
"""

from __future__ import annotations

import argparse
import time
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

import dhmc  # noqa: E402

SUBJECTS, DAYS = 18, 10
TRUTH = {"Intercept": 250.0, "days": 10.0, "sd_intercept": 25.0, "sd_days": 6.0, "sigma": 25.0}


def simulate(seed: int = 0) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    """The data, and each subject's true intercept and slope."""
    rng = np.random.default_rng(seed)
    intercepts = TRUTH["Intercept"] + rng.normal(0.0, TRUTH["sd_intercept"], SUBJECTS)
    slopes = TRUTH["days"] + rng.normal(0.0, TRUTH["sd_days"], SUBJECTS)
    subject = np.repeat(np.arange(SUBJECTS), DAYS)
    days = np.tile(np.arange(DAYS, dtype=float), SUBJECTS)
    reaction = intercepts[subject] + slopes[subject] * days + rng.normal(0.0, TRUTH["sigma"], subject.size)
    frame = pd.DataFrame({"reaction": reaction, "days": days, "subject": [f"s{i:02d}" for i in subject]})
    return frame, intercepts, slopes


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="32 chains x 200 draws")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "output"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    chains, draws = (32, 200) if args.quick else (256, 1000)

    import arviz as az
    import bambi as bmb

    data, intercepts, slopes = simulate(args.seed)
    model = bmb.Model("reaction ~ days + (days | subject)", data)
    t0 = time.perf_counter()
    trace = dhmc.sample(model, chains=chains, draws=draws, seed=args.seed, log_likelihood=True,
                        store=out / "bambi_hierarchical.zarr", overwrite=True, progress=False)
    print(f"{chains} chains x {draws} draws in {time.perf_counter() - t0:.1f} s; groups {sorted(trace.children)}")
    post = trace["posterior"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        idata = az.InferenceData.from_datatree(trace)
        print(az.summary(idata, var_names=["Intercept", "days", "1|subject_sigma", "days|subject_sigma", "sigma"],
                         kind="stats").round(2).to_string())
        print(f"elpd_loo = {az.loo(idata).elpd_loo:.1f}")

    # each subject's line: population effect + the subject's offset, per posterior draw
    a = (post["Intercept"] + post["1|subject"]).stack(sample=("chain", "draw"))
    b = (post["days"] + post["days|subject"]).stack(sample=("chain", "draw"))
    pick = np.random.default_rng(1).choice(a.sizes["sample"], 60, replace=False)
    fig = plt.figure(figsize=(12, 8.5))
    grid = fig.add_gridspec(4, 6, hspace=0.55, wspace=0.3, height_ratios=(1, 1, 1, 1.25))
    x = np.arange(DAYS)
    for i in range(SUBJECTS):
        ax = fig.add_subplot(grid[i // 6, i % 6])
        rows = data[data["subject"] == f"s{i:02d}"]
        ai, bi = a.isel({a.dims[0]: i}).values, b.isel({b.dims[0]: i}).values
        for k in pick:
            ax.plot(x, ai[k] + bi[k] * x, color="tab:blue", alpha=0.06, lw=1)
        ax.plot(rows["days"], rows["reaction"], ".", color="0.2", ms=4)
        ax.plot(x, intercepts[i] + slopes[i] * x, "--", color="tab:red", lw=1)
        ax.set_title(f"s{i:02d}: slope {bi.mean():.1f} (true {slopes[i]:.1f})", fontsize=8)
        ax.tick_params(labelsize=7)
    ax = fig.add_subplot(grid[3, :3])
    ax.hist(post["days"].values.ravel(), bins=60, density=True, color="tab:blue", alpha=0.6)
    ax.axvline(TRUTH["days"], color="tab:red", ls="--", label="population slope simulated")
    ax.axvline(slopes.mean(), color="k", lw=1, label="mean of the 18 subjects' slopes")
    ax.set(xlabel="days (population slope, ms per day)", yticks=[])
    ax.legend(fontsize=8)
    ax = fig.add_subplot(grid[3, 3:])
    ax.hist(post["days|subject_sigma"].values.ravel(), bins=60, density=True, color="tab:blue", alpha=0.6)
    ax.axvline(TRUTH["sd_days"], color="tab:red", ls="--", label="simulated")
    ax.axvline(slopes.std(ddof=1), color="k", lw=1, label="sd of the 18 subjects' slopes")
    ax.set(xlabel="days|subject_sigma (sd of the slopes between subjects)", yticks=[])
    ax.legend(fontsize=8)
    fig.suptitle(f"bmb.Model('reaction ~ days + (days | subject)') sampled by dhmc: {chains} chains x {draws} draws "
                 "(blue: posterior lines, red: truth)", fontsize=11)
    path = out / "bambi_hierarchical.png"
    fig.savefig(path, dpi=100)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()

"""An animated ensemble: HMC particles flowing into a correlated 2-D Gaussian.

The target is the built-in ``gaussian_2d`` density (mean (5, 5), covariance [[4, -3], [-3, 4]]),
given here as a plain JAX log density. The whole ensemble starts in a small cloud far out in the
tail, at (0, 0), and is moved by plain HMC (fixed step size and trajectory time, no warmup), so the
animation shows what the sampler does draw by draw: the cloud falls into the density, overshoots,
spreads along the long axis and settles. A draw whose position equals the previous one was a
rejected proposal (marked with a red cross); a few particles leave a trail.

    python examples/hmc_animation.py                  # 300 particles, 60 draws
    python examples/hmc_animation.py --quick --out /tmp/anim
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.animation import FuncAnimation, PillowWriter  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

import dhmc  # noqa: E402
from dhmc.models.examples import GAUSSIAN_2D_COV, GAUSSIAN_2D_MEAN, gaussian_2d_logdensity  # noqa: E402

TRAILS = 3  # particles whose path is drawn
STEP, STEPS = 0.6, 2  # leapfrog step size and steps per draw: trajectory time 1.2


def density_grid(lim, n=120):
    xs = np.linspace(*lim, n)
    X, Y = np.meshgrid(xs, xs)
    d = np.stack([X - GAUSSIAN_2D_MEAN[0], Y - GAUSSIAN_2D_MEAN[1]], -1)
    q = np.einsum("...i,ij,...j->...", d, np.linalg.inv(GAUSSIAN_2D_COV), d)
    return X, Y, q


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer particles and draws (CI smoke test)")
    parser.add_argument("--out", default="examples/output", help="folder for the GIF and a PNG of its last frame")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    chains, draws = (100, 25) if args.quick else (300, 60)

    # Every chain starts near (0, 0): an init with a leading chain axis is used as given.
    rng = np.random.default_rng(args.seed)
    start = rng.normal(0.0, 0.3, (chains, 2)).astype(np.float32)
    t0 = time.perf_counter()
    trace = dhmc.sample(gaussian_2d_logdensity, init={"x": start}, chains=chains, draws=draws, warmup=0,
                        kernel="hmc", adapt=False, step_size=STEP, num_steps=STEPS, seed=args.seed, progress=False)
    print(f"sampled {chains} chains x {draws} draws in {time.perf_counter() - t0:.1f} s")

    x = trace["posterior"]["x"].values                        # (chain, draw, 2)
    path = np.concatenate([start[:, None, :], x], axis=1)     # frame 0 is the initial ensemble
    moved = np.any(path[:, 1:] != path[:, :-1], axis=-1)      # accepted (moved) vs rejected (stayed)
    accept = trace["sample_stats"]["acceptance_rate"].values  # Metropolis acceptance probability per draw
    print(f"fraction of proposals accepted: {moved.mean():.3f} (mean acceptance probability {accept.mean():.3f})")
    print(f"ensemble mean after {draws} draws: {path[:, -1].mean(0).round(3)} (exact {GAUSSIAN_2D_MEAN})")

    lim = (-3.0, 13.0)
    X, Y, q = density_grid(lim)
    fig, ax = plt.subplots(figsize=(5.2, 5.2))
    ax.contourf(X, Y, np.exp(-0.5 * q), levels=12, cmap="Blues", alpha=0.7)
    ax.contour(X, Y, q, levels=[1, 4, 9], colors="steelblue", linewidths=0.8)  # 1, 2, 3 sigma
    ax.plot(*GAUSSIAN_2D_MEAN, "+", color="navy", ms=12, mew=2)
    ax.set(xlim=lim, ylim=lim, xlabel="x1", ylabel="x2", aspect="equal")
    cloud = ax.scatter(path[:, 0, 0], path[:, 0, 1], s=9, color="k", alpha=0.6, lw=0, zorder=3)
    rejected = ax.scatter([], [], s=22, marker="x", color="crimson", lw=1.2, zorder=4)
    trail_colours = plt.cm.autumn(np.linspace(0.0, 0.8, TRAILS))
    trails = [ax.plot([], [], "-o", color=c, ms=3, lw=1.2, zorder=5)[0] for c in trail_colours]
    title = ax.set_title("", fontsize=9.5)
    ax.legend(handles=[Line2D([], [], ls="", marker="o", color="k", ms=4, label="particle"),
                       Line2D([], [], ls="", marker="x", color="crimson", ms=6, label="rejected this draw"),
                       Line2D([], [], marker="o", color=trail_colours[0], ms=3, label="trail of one particle"),
                       Line2D([], [], color="steelblue", lw=0.8, label="1, 2, 3 sd contours")],
              loc="upper right", fontsize=7.5, framealpha=0.9)
    fig.subplots_adjust(left=0.12, right=0.97, bottom=0.09, top=0.9)

    def frame(k):
        cloud.set_offsets(path[:, k])
        if k == 0:
            rejected.set_offsets(np.empty((0, 2)))
            text = f"initial ensemble of {chains} particles"
        else:
            rejected.set_offsets(path[~moved[:, k - 1], k])
            text = (f"draw {k}/{draws}: {moved[:, k - 1].mean():.0%} accepted, "
                    f"ensemble mean ({path[:, k, 0].mean():.2f}, {path[:, k, 1].mean():.2f})")
        for i, line in enumerate(trails):
            line.set_data(path[i, max(0, k - 6):k + 1, 0], path[i, max(0, k - 6):k + 1, 1])
        title.set_text(f"HMC on gaussian_2d ({STEPS} leapfrog steps of {STEP} per draw)\n{text}")
        return cloud, rejected, title, *trails

    animation = FuncAnimation(fig, frame, frames=draws + 1, blit=False)
    gif = out / "hmc_animation.gif"
    animation.save(gif, writer=PillowWriter(fps=4), dpi=72)
    frame(draws)
    fig.savefig(out / "hmc_animation_last_frame.png", dpi=90)
    print(f"wrote {gif} ({gif.stat().st_size / 1e6:.2f} MB) and {out / 'hmc_animation_last_frame.png'}")


if __name__ == "__main__":
    main()

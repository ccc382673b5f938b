"""What ``laplace=`` costs per gradient: one ensemble gradient of the Laplace-whitened log density against the plain one.

``many_chains.py`` counts a route's sequential gradients as evaluations of the log density it samples; with
``laplace=`` each of those takes the latent block's Hessian (``len(x)`` Hessian-vector products, batched, not
sequential) and a Cholesky factor, and differentiates through both. This script times ``jit(vmap(value_and_grad))``
of both densities of each model on ``--chains`` positions (drawn from the prior-free start: the model's centre
plus U(-1, 1)), the median of ``--repeats`` calls after a warm-up call, and reports the ratio: on a CPU the
factor by which a route's gradient is dearer in seconds. On a GPU a batched Hessian runs its products side by side,
so the ratio there is the one to read for wall-clock (``gpu.sh``).

    python -m benchmarks.laplace_cost                    # results/laplace_cost.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from benchmarks.harness import RESULTS, write_runs

MODELS = ("eight_schools_centered", "brownian")


def flat_models(name: str):
    """``(plain, laplace)`` flat models of ``name``'s NumPyro model, its hierarchical sites whitened in the second."""
    from dhmc.models.numpyro_ import NumPyroTarget
    from dhmc.models.resolve import with_laplace

    if name == "brownian":
        from benchmarks.laps_targets import brownian_model

        target = NumPyroTarget(brownian_model, name=name)
    else:
        from tests.validation.posteriors import get

        target = NumPyroTarget(get("eight_schools-eight_schools_centered").numpyro_model, name=name)
    whitened, latent = with_laplace(target, name, True)
    return target.build(), whitened.build(), latent


def seconds(fn, positions, repeats: int) -> float:
    import jax

    jax.block_until_ready(fn(positions))
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(positions))
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def run(name: str, chains: int, repeats: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    plain, whitened, latent = flat_models(name)
    rng = np.random.default_rng(0)
    x = plain.centre + rng.uniform(-1, 1, (chains, plain.dim))
    y = np.asarray(jax.jit(jax.vmap(whitened.to_flat))(jnp.asarray(x, plain.dtype)))
    out = {"model": name, "latent": list(latent), "latent_size": int(sum(b - a for a, b in
                                                                        (plain.variables[v] for v in latent))),
           "dim": plain.dim, "chains": chains}
    for label, model, positions in (("plain", plain, x), ("laplace", whitened, y)):
        fn = jax.jit(jax.vmap(jax.value_and_grad(model.logdensity_fn)))
        out[f"{label}_ms"] = 1e3 * seconds(fn, jnp.asarray(positions, plain.dtype), repeats)
    out["ratio"] = out["laplace_ms"] / out["plain_ms"]
    print(f"{name}: {out['latent_size']} latent of {plain.dim}; one ensemble gradient of {chains} chains "
          f"{out['plain_ms']:.3g} ms plain, {out['laplace_ms']:.3g} ms with laplace= ({out['ratio']:.0f}x)", flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=lambda s: s.split(","), default=list(MODELS))
    ap.add_argument("--chains", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default=str(RESULTS / "laplace_cost.json"))
    args = ap.parse_args(argv)
    unknown = sorted(set(args.models) - set(MODELS))
    if unknown:
        ap.error(f"unknown model {unknown[0]}; models: {', '.join(MODELS)}")
    t = time.perf_counter()
    runs = [run(name, args.chains, args.repeats) for name in args.models]
    write_runs(args.out, "laplace_cost", args, t, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Independent check of the reference-posterior definitions in ``posteriors.py`` (no dhmc involved).

Run from the repository root as ``python -m tests.validation.check_posteriors_with_peers [--only kidiq,arK] [--quick]``.

For each posterior it

1. checks that the JAX log density and the NumPyro model's potential energy agree up to a constant
   (in float64, at the init point, jittered points and reference draws mapped to unconstrained space);
2. recomputes the "exact" moments independently (1-D quadrature over the scale parameter, everything
   else Gaussian in closed form) and compares with ``exact_moments.json`` (all but the mixture);
3. samples the JAX log density with BlackJAX NUTS (window adaptation) and the NumPyro model with NumPyro
   NUTS (4 chains, 1000 warmup + 1000 draws by default), maps draws to Stan names and runs ``compare``.

The exit status is 0 when every check passes, except the centred eight schools posterior, whose sampling
comparison is reported but not required to pass (funnel: divergences and a biased log tau expected).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import warnings
from collections.abc import Callable
from functools import partial
from pathlib import Path

warnings.filterwarnings("ignore", category=FutureWarning)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from tests.validation.compare import compare  # noqa: E402
from tests.validation.posteriors import (  # noqa: E402
    REFERENCE_POSTERIORS,
    ReferencePosterior,
    _data,
    get,
    load_json,
    reference_draws,
    reference_file,
)

# --------------------------------------------------------------------------------------------------
# 1. JAX log density vs NumPyro potential energy
# --------------------------------------------------------------------------------------------------


def logdensity_agreement(post: ReferencePosterior, n_random: int = 8, seed: int = 0) -> dict:
    """Spread of (logdensity + potential_energy) over test points; 0 means equal up to a constant."""
    from numpyro.infer.util import potential_energy

    rng = np.random.default_rng(seed)
    points = [post.init]
    for _ in range(n_random):
        points.append({k: v + rng.normal(scale=0.3, size=np.shape(v)) for k, v in post.init.items()})
    ref = post.from_reference(reference_draws(post.name))
    for c, d in [(0, 0), (3, 500), (9, 999)]:
        points.append({k: v[c, d] for k, v in ref.items()})
    with jax.enable_x64(True):
        lp_fn = jax.jit(post.logdensity)
        pe_fn = jax.jit(lambda p: potential_energy(post.numpyro_model, (), {}, post.numpyro_unconstrained(p)))
        sums, lps = [], []
        for p in points:
            pj = {k: jnp.asarray(v, dtype=jnp.float64) for k, v in p.items()}
            lp, pe = float(lp_fn(pj)), float(pe_fn(pj))
            sums.append(lp + pe)
            lps.append(lp)
        g_lp = jax.grad(post.logdensity)(post.init_as(jnp.float64))
        g_pe = jax.grad(lambda p: potential_energy(post.numpyro_model, (), {}, post.numpyro_unconstrained(p)))(
            post.init_as(jnp.float64)
        )
        grad_err = max(float(jnp.max(jnp.abs(g_lp[k] + g_pe[k]))) for k in g_lp)
        grad_scale = max(float(jnp.max(jnp.abs(g_lp[k]))) for k in g_lp)
    sums = np.asarray(sums)
    spread = float(sums.max() - sums.min())
    scale = max(1.0, max(abs(x) for x in lps))
    return {
        "constant": float(sums[0]),
        "spread": spread,
        "rel_spread": spread / scale,
        "grad_rel_err": grad_err / max(1.0, grad_scale),
        "ok": spread / scale < 1e-9 and grad_err / max(1.0, grad_scale) < 1e-9,
    }


# --------------------------------------------------------------------------------------------------
# 2. Independent "exact" moments (float64 numpy, 1-D quadrature)
# --------------------------------------------------------------------------------------------------


def _weights(logp: np.ndarray) -> np.ndarray:
    w = np.exp(logp - logp.max())
    return w / w.sum()


def _halfcauchy_log(x, s):
    return math.log(2 / math.pi) - math.log(s) - np.log1p((x / s) ** 2)


def _halfnormal_log(x, s):
    return math.log(2) - 0.5 * (x / s) ** 2 - math.log(s) - 0.5 * math.log(2 * math.pi)


def _linear_gaussian_moments(X, y, prior_sd, log_prior_sigma, u_grid):
    """Moments of y ~ N(X b, sigma), b ~ N(0, prior_sd^2 I) (flat if None), sigma = exp(u) ~ prior."""
    N, D = X.shape
    XtX, Xty, yty = X.T @ X, X.T @ y, y @ y
    s2 = np.exp(2 * u_grid)[:, None, None]
    A = XtX[None] / s2 + (0.0 if prior_sd is None else np.eye(D)[None] / prior_sd**2)
    A_inv = np.linalg.inv(A)
    m = np.einsum("gij,gj->gi", A_inv, Xty[None] / s2[:, :, 0])
    _, logdetA = np.linalg.slogdet(A)
    loglik = -N * u_grid - 0.5 * yty / s2[:, 0, 0] + 0.5 * np.einsum("gi,gi->g", m, Xty[None] / s2[:, :, 0])
    loglik -= 0.5 * logdetA
    w = _weights(loglik + log_prior_sigma(np.exp(u_grid)) + u_grid)
    mean_b = w @ m
    second = np.einsum("g,gij->ij", w, A_inv + m[:, :, None] * m[:, None, :])
    sd_b = np.sqrt(np.diag(second) - mean_b**2)
    sig = np.exp(u_grid)
    mom = {}
    mom["sigma"] = (w @ sig, math.sqrt(w @ sig**2 - (w @ sig) ** 2))
    mom["log_sigma"] = (w @ u_grid, math.sqrt(w @ u_grid**2 - (w @ u_grid) ** 2))
    return mean_b, sd_b, mom


def independent_exact_moments(post: ReferencePosterior) -> dict[str, tuple[float, float]] | None:
    d = _data(post.name)
    name = post.name
    if name.startswith("eight_schools"):
        y, s = d["y"], d["sigma"]
        u = np.linspace(-25.0, 10.0, 70001)
        tau2 = np.exp(2 * u)[:, None]
        v = s[None] ** 2 + tau2  # (G, J)
        prec_mu = 1 / 25.0 + np.sum(1 / v, axis=1)
        mu_hat = np.sum(y[None] / v, axis=1) / prec_mu
        # log N(y | 0, 25 11' + diag(v)) via the matrix determinant lemma / Sherman-Morrison
        logdet = np.sum(np.log(v), axis=1) + np.log1p(25.0 * np.sum(1 / v, axis=1))
        yVy = np.sum(y[None] ** 2 / v, axis=1) - 25.0 * np.sum(y[None] / v, axis=1) ** 2 / (
            1 + 25.0 * np.sum(1 / v, axis=1)
        )
        logp = -0.5 * logdet - 0.5 * yVy + _halfcauchy_log(np.exp(u), 5.0) + u
        w = _weights(logp)
        var_mu = 1 / prec_mu
        out = {}
        e_th = (tau2 * y[None] + s[None] ** 2 * mu_hat[:, None]) / v
        var_th = s[None] ** 2 * tau2 / v + (s[None] ** 2 / v) ** 2 * var_mu[:, None]
        e_tt = np.sqrt(tau2) * (y[None] - mu_hat[:, None]) / v
        var_tt = s[None] ** 2 / v + (tau2 / v**2) * var_mu[:, None]
        for j in range(len(y)):
            m1 = w @ e_th[:, j]
            out[f"theta[{j + 1}]"] = (m1, math.sqrt(w @ (var_th[:, j] + e_th[:, j] ** 2) - m1**2))
            m1 = w @ e_tt[:, j]
            out[f"theta_trans[{j + 1}]"] = (m1, math.sqrt(w @ (var_tt[:, j] + e_tt[:, j] ** 2) - m1**2))
        m1 = w @ mu_hat
        out["mu"] = (m1, math.sqrt(w @ (var_mu + mu_hat**2) - m1**2))
        tau = np.exp(u)
        out["tau"] = (w @ tau, math.sqrt(w @ tau**2 - (w @ tau) ** 2))
        out["log_tau"] = (w @ u, math.sqrt(w @ u**2 - (w @ u) ** 2))
        i0 = int(np.argmin(np.abs(u)))  # grid point at u = 0: count half of its cell
        out["P(tau<1)"] = (float(w[u < u[i0]].sum() + 0.5 * w[i0]), float("nan"))
        return out
    if name == "kidiq-kidscore_momiq":
        X = np.stack([np.ones_like(d["mom_iq"]), d["mom_iq"]], axis=1)
        y, prior_sd, names = d["kid_score"], None, ["beta[1]", "beta[2]"]
        log_prior = lambda sig: _halfcauchy_log(sig, 2.5)  # noqa: E731
    elif name == "sblrc-blr":
        X, y, prior_sd = d["X"], d["y"], 10.0
        names = [f"beta[{j + 1}]" for j in range(X.shape[1])]
        log_prior = lambda sig: _halfnormal_log(sig, 10.0)  # noqa: E731
    elif name == "arK-arK":
        X = np.concatenate([np.ones((d["ar_lags"].shape[0], 1)), d["ar_lags"]], axis=1)
        y, prior_sd = d["ar_target"], 10.0
        names = ["alpha"] + [f"beta[{j + 1}]" for j in range(X.shape[1] - 1)]
        log_prior = lambda sig: _halfcauchy_log(sig, 2.5)  # noqa: E731
    else:
        return None
    b_ols = np.linalg.lstsq(X, y, rcond=None)[0]
    u0 = math.log(math.sqrt(np.mean((y - X @ b_ols) ** 2)))
    u = np.linspace(u0 - 2.0, u0 + 2.0, 40001)
    mean_b, sd_b, out = _linear_gaussian_moments(X, y, prior_sd, log_prior, u)
    out.update({k: (float(m), float(sd)) for k, m, sd in zip(names, mean_b, sd_b, strict=True)})
    return out


def exact_moments_agreement(post: ReferencePosterior) -> dict | None:
    mine = independent_exact_moments(post)
    if mine is None or reference_file(post.name, "exact_moments.json") is None:
        return None
    theirs = load_json(post.name, "exact_moments.json")["moments"]
    worst_mean = worst_sd = 0.0
    rows = {}
    for k, (m, sd) in mine.items():
        if k not in theirs:
            continue
        if not isinstance(theirs[k], dict):  # a probability such as P(tau<1): report only
            rows[k] = (m, float(theirs[k]))
            continue
        dm = abs(m - theirs[k]["mean"]) / theirs[k]["sd"]
        ds = abs(sd / theirs[k]["sd"] - 1)
        rows[k] = (dm, ds)
        worst_mean, worst_sd = max(worst_mean, dm), max(worst_sd, ds)
    return {
        "max_mean_diff_in_sd": worst_mean,
        "max_sd_rel_diff": worst_sd,
        "n_compared": len(rows),
        "scalars": {k: v for k, v in rows.items() if not isinstance(theirs[k], dict)},
        "ok": worst_mean < 1e-4 and worst_sd < 1e-4,
    }


# --------------------------------------------------------------------------------------------------
# 3. Sampling with BlackJAX and NumPyro
# --------------------------------------------------------------------------------------------------


def _jittered_inits(post: ReferencePosterior, chains: int, seed: int, jitter: float) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {k: v[None] + rng.uniform(-jitter, jitter, size=(chains,) + np.shape(v)) for k, v in post.init.items()}


def run_blackjax(post, *, chains, warmup, draws, seed, jitter, target_accept, dense_mass=None):
    import blackjax

    dense = post.dense_mass if dense_mass is None else dense_mass
    with jax.enable_x64(post.x64):
        dtype = jnp.float64 if post.x64 else jnp.float32
        inits = {k: jnp.asarray(v, dtype) for k, v in _jittered_inits(post, chains, seed, jitter).items()}
        adapt = blackjax.window_adaptation(
            blackjax.nuts,
            post.logdensity,
            is_mass_matrix_diagonal=not dense,
            target_acceptance_rate=target_accept,
            adaptation_info_fn=blackjax.adaptation.base.get_filter_adapt_info_fn(),
        )

        def one_chain(key, x0):
            k_warm, k_draw = jax.random.split(key)
            (state, params), _ = adapt.run(k_warm, x0, num_steps=warmup)
            kernel = blackjax.nuts(post.logdensity, **params).step

            def step(state, k):
                state, info = kernel(k, state)
                return state, (state.position, info.is_divergent, info.num_integration_steps)

            _, (pos, div, nsteps) = jax.lax.scan(step, state, jax.random.split(k_draw, draws))
            return pos, div, nsteps, params["step_size"]

        keys = jax.random.split(jax.random.key(seed), chains)
        t0 = time.perf_counter()
        pos, div, nsteps, step_size = jax.jit(jax.vmap(one_chain))(keys, inits)
        jax.block_until_ready(pos)
        elapsed = time.perf_counter() - t0
        draws_np = {k: np.asarray(v, dtype=np.float64) for k, v in pos.items()}
        div, nsteps, step_size = np.asarray(div), np.asarray(nsteps), np.asarray(step_size)
    return draws_np, {
        "divergences": int(np.sum(div)),
        "mean_leapfrog_steps": float(np.mean(nsteps)),
        "step_size": [round(float(s), 4) for s in np.asarray(step_size)],
        "metric": "dense" if dense else "diag",
        "target_accept": target_accept,
        "seconds": round(elapsed, 1),
    }


def run_numpyro(post, *, chains, warmup, draws, seed, jitter, target_accept, dense_mass=None):
    from numpyro.infer import MCMC, NUTS

    dense = post.dense_mass if dense_mass is None else dense_mass
    with jax.enable_x64(post.x64):
        dtype = jnp.float64 if post.x64 else jnp.float32
        inits = _jittered_inits(post, chains, seed + 1, jitter)
        init_params = post.numpyro_unconstrained({k: jnp.asarray(v, dtype) for k, v in inits.items()})
        kernel = NUTS(post.numpyro_model, dense_mass=dense, target_accept_prob=target_accept)
        mcmc = MCMC(
            kernel,
            num_warmup=warmup,
            num_samples=draws,
            num_chains=chains,
            chain_method="vectorized",
            progress_bar=False,
        )
        t0 = time.perf_counter()
        mcmc.run(jax.random.key(seed), init_params=init_params, extra_fields=("diverging", "num_steps"))
        samples = mcmc.get_samples(group_by_chain=True)
        jax.block_until_ready(samples)
        elapsed = time.perf_counter() - t0
        extra = {k: np.asarray(v) for k, v in mcmc.get_extra_fields(group_by_chain=True).items()}
        samples_np = {k: np.asarray(v, dtype=np.float64) for k, v in samples.items()}
    return samples_np, {
        "divergences": int(np.sum(extra["diverging"])),
        "mean_leapfrog_steps": float(np.mean(extra["num_steps"])),
        "metric": "dense" if dense else "diag",
        "target_accept": target_accept,
        "seconds": round(elapsed, 1),
    }


# --------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default="", help="comma-separated posterior names or prefixes")
    ap.add_argument("--samplers", default="blackjax,numpyro")
    ap.add_argument("--chains", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=1000)
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=20240611)
    ap.add_argument("--jitter", type=float, default=1.0, help="uniform(-j, j) jitter of init per chain")
    ap.add_argument("--target-accept", type=float, default=0.8)
    ap.add_argument(
        "--centered-target-accept",
        type=float,
        default=None,
        help="extra BlackJAX run of the centred eight schools at this target acceptance (e.g. 0.99)",
    )
    ap.add_argument("--compare-metrics", action="store_true", help="also run BlackJAX with the other metric")
    ap.add_argument("--no-sampling", action="store_true")
    ap.add_argument("--derived", action="store_true", help="also compare log_tau, theta_trans, log_sigma ...")
    ap.add_argument("--json", default="", help="write a JSON summary here")
    args = ap.parse_args(argv)

    names = [get(n).name for n in args.only.split(",") if n] or list(REFERENCE_POSTERIORS)
    samplers = [s for s in args.samplers.split(",") if s]
    all_ok = True
    summary: dict[str, dict] = {}
    for name in names:
        post = REFERENCE_POSTERIORS[name]
        print(f"\n=== {name} ({post.difficulty}; dense_mass={post.dense_mass}, x64={post.x64})", flush=True)
        res: dict = {}
        if post.numpyro_model is not None:
            agree = logdensity_agreement(post)
            res["logdensity_vs_numpyro"] = agree
            all_ok &= agree["ok"]
            print(
                f"  log density vs NumPyro potential: constant={agree['constant']:.3e}, spread={agree['spread']:.2e}"
                f" (rel {agree['rel_spread']:.1e}), grad rel err={agree['grad_rel_err']:.1e}"
                f" -> {'ok' if agree['ok'] else 'MISMATCH'}"
            )
        ex = exact_moments_agreement(post)
        if ex is not None:
            res["exact_moments_recomputed"] = ex
            all_ok &= ex["ok"]
            print(
                f"  exact_moments.json vs independent quadrature: max |mean diff|/sd={ex['max_mean_diff_in_sd']:.1e},"
                f" max |sd rel diff|={ex['max_sd_rel_diff']:.1e} over {ex['n_compared']} -> "
                f"{'ok' if ex['ok'] else 'MISMATCH'}"
            )
            for k, (mine, theirs) in ex["scalars"].items():
                print(f"    {k}: independent {mine:.5f}, exact_moments.json {theirs:.5f}")
        if args.no_sampling:
            summary[name] = res
            continue
        kw = dict(chains=args.chains, warmup=args.warmup, draws=args.draws, seed=args.seed, jitter=args.jitter)
        runs: list[tuple[str, Callable[[], tuple[dict, dict]], Callable]] = []
        if "blackjax" in samplers:
            bj = partial(run_blackjax, post, target_accept=args.target_accept, **kw)
            runs.append(("blackjax", bj, post.to_reference))
            if args.compare_metrics:
                other = "diag" if post.dense_mass else "dense"
                runs.append((f"blackjax-{other}", partial(bj, dense_mass=not post.dense_mass), post.to_reference))
            if args.centered_target_accept and name == "eight_schools-eight_schools_centered":
                ta = args.centered_target_accept
                runs.append((f"blackjax-ta{ta}", partial(bj, target_accept=ta), post.to_reference))
        if "numpyro" in samplers and post.numpyro_model is not None:
            nu = partial(run_numpyro, post, target_accept=args.target_accept, **kw)
            runs.append(("numpyro", nu, post.numpyro_to_reference))
        for label, fn, to_ref in runs:
            draws, info = fn()
            report = compare(to_ref(draws, derived=args.derived), name, label=label, extra=info)
            print("  " + str(report).replace("\n", "\n  "), flush=True)
            res[label] = {
                "passed": report.passed,
                "max_abs_z": report.max_abs_z,
                "sd_ratio_range": [min(report.sd_ratios.values()), max(report.sd_ratios.values())],
                "min_ess": report.min_ess,
                **info,
            }
            if post.expect_unbiased:
                all_ok &= report.passed
        summary[name] = res
    print("\nOVERALL:", "PASS" if all_ok else "FAIL")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1, default=float))
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())

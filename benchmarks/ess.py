"""ESS per second: dhmc's defaults vs NumPyro NUTS vs BlackJAX ChEES, on eight schools (non-centred).

* ``dhmc``: ``dhmc.sample("eight_schools", chains=128, warmup=1000, draws=1000)`` -- the default kernel
  ("chees": jittered trajectories, ensemble-adapted step size, length and diagonal mass), embedded
  default cluster (its start counts).
* ``numpyro``: ``MCMC(NUTS(eight_schools_model), num_chains=4, chain_method="sequential")``, NumPyro's
  defaults otherwise (init_to_uniform, diagonal mass, target accept 0.8), one ``run()`` call (so no
  sampling-only time; ``--numpyro-split`` times ``warmup()`` and ``run()`` apart, at the price of a
  second compile that a user calling ``run()`` once does not pay).
* ``blackjax``: ``blackjax.chees_adaptation`` (128 chains, optax.adam(0.025), initial step 0.1) then
  ``blackjax.dynamic_hmc`` vmapped over chains in ``lax.scan``.

Score: the minimum bulk ESS (ArviZ, rank-normalised) over mu, tau, theta_tilde[8], theta[8], divided by
the wall seconds of the whole call (compile + warmup + sampling; for dhmc also its cluster start) and,
separately, by the sampling phase only (its compile included). Each sampler runs in a fresh process.

With ``--reference NAME[,NAME]`` the posteriors of ``tests/validation/posteriors.py`` (posteriordb,
in ``tests/validation/reference_posteriors``) run instead: the same JAX log density for all three samplers
(NumPyro through ``potential_fn``), ESS over Stan's parameters (``to_reference``).

    python benchmarks/ess.py                     # 1000 warmup + 1000 draws
    python benchmarks/ess.py --quick             # 100 + 100, for a smoke test
    python benchmarks/ess.py --reference kidiq,arK
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as C  # noqa: E402

SAMPLERS = ("dhmc", "numpyro", "blackjax")
REPO = Path(__file__).resolve().parents[1]


# -- the posterior --------------------------------------------------------------------------------------------


class Problem:
    """What each sampler needs: dhmc's target, NumPyro's kernel inputs, a JAX log density and its init."""

    def __init__(self, name: str):
        import numpy as np

        self.name = name
        if name == "eight_schools":
            from dhmc.models.examples import EIGHT_SCHOOLS_SIGMA, EIGHT_SCHOOLS_Y, eight_schools_model

            self.x64, self.dense_mass = False, False
            self.logdensity = C.eight_schools_logdensity(EIGHT_SCHOOLS_SIGMA, EIGHT_SCHOOLS_Y)
            self.init = {"mu": np.zeros(()), "log_tau": np.zeros(()), "theta_tilde": np.zeros(8)}
            self.init_radius = 2.0  # NumPyro's init_to_uniform: U(-2, 2) in unconstrained space
            self.dhmc_target, self.dhmc_kwargs = "eight_schools", {}
            self.numpyro_model = eight_schools_model
            self.numpyro_args = (EIGHT_SCHOOLS_SIGMA, EIGHT_SCHOOLS_Y)
        else:
            sys.path.insert(0, str(REPO / "tests" / "validation"))
            from posteriors import get

            post = get(name)
            self.name, self.post = post.name, post
            self.x64, self.dense_mass = post.x64, post.dense_mass
            self.logdensity, self.init = post.logdensity, post.init
            self.init_radius = 0.5  # dhmc's jitter of a log-density init
            self.dhmc_target = post.logdensity
            self.dhmc_kwargs = {"init": post.init, "dense_mass": post.dense_mass}
            self.numpyro_model = None

    def quantities(self, position: dict) -> dict:
        """``{name: (chain, draw, ...)}`` whose minimum bulk ESS is the score."""
        import numpy as np

        if self.name == "eight_schools":
            p = {k: np.asarray(v, np.float64) for k, v in position.items()}
            if "tau" not in p:
                p["tau"] = np.exp(p.pop("log_tau"))
            if "theta" not in p:
                p["theta"] = p["mu"][..., None] + p["tau"][..., None] * p["theta_tilde"]
            return {k: p[k] for k in ("mu", "tau", "theta_tilde", "theta")}
        return {k: np.asarray(v) for k, v in self.post.to_reference(position).items()}

    def starts(self, chains: int, seed: int):
        """``{name: (chains, ...)}``: the init plus U(-r, r) per coordinate."""
        import numpy as np

        rng = np.random.default_rng(seed)
        dtype = np.float64 if self.x64 else np.float32
        return {k: (np.asarray(v) + rng.uniform(-self.init_radius, self.init_radius, (chains, *np.shape(v))))
                .astype(dtype) for k, v in self.init.items()}


def min_ess(problem: Problem, position: dict) -> dict:
    import arviz as az
    import numpy as np

    ds = az.convert_to_dataset({k: v for k, v in problem.quantities(position).items()})
    ess = az.ess(ds, method="bulk")
    per = {}
    for name, da in ess.data_vars.items():
        values = np.atleast_1d(da.values)
        for i, v in enumerate(values):
            per[name if values.size == 1 else f"{name}[{i}]"] = float(v)
    worst = min(per, key=per.get)
    return {"min_ess_bulk": per[worst], "min_ess_param": worst, "ess_bulk": per}


# -- one sampler (child process) -------------------------------------------------------------------------


def child(cfg: dict) -> dict:
    import jax

    problem = Problem(cfg["problem"])
    if problem.x64:
        jax.config.update("jax_enable_x64", True)
    sampler = cfg["sampler"]
    out = {**cfg}
    if sampler == "dhmc":
        import dhmc
        import dhmc.api  # noqa: F401

        t = time.perf_counter()
        tree = dhmc.sample(problem.dhmc_target, chains=cfg["dhmc_chains"], draws=cfg["draws"], warmup=cfg["warmup"],
                           seed=cfg["seed"], progress=False, **problem.dhmc_kwargs)
        post = {k: v.values for k, v in tree["posterior"].data_vars.items()}
        out["total_s"] = time.perf_counter() - t
        timing = json.loads(tree["posterior"].attrs["dhmc_timing"])
        out["dhmc_timing"] = timing
        out["sampling_s"] = timing["sampling"] + timing["writing"]
        out["warmup_s"] = timing["warmup"]
        out["chains"] = cfg["dhmc_chains"]
        out["divergences"] = int(tree["sample_stats"]["diverging"].values.sum())
        out["mean_acceptance"] = float(tree["sample_stats"]["acceptance_rate"].values.mean())
        out["mean_n_steps"] = float(tree["sample_stats"]["n_steps"].values.mean())
        out["step_size"] = float(tree["sample_stats"]["step_size"].values.mean())
        out["warmup_history"] = json.loads(tree["posterior"].attrs.get("dhmc_warmup", "[]"))
        if problem.name != "eight_schools":
            post = {k: v for k, v in post.items() if k in problem.init}
    elif sampler == "numpyro":
        from numpyro.infer import MCMC, NUTS

        chains = cfg["numpyro_chains"]
        t = time.perf_counter()
        if problem.numpyro_model is not None:
            kernel, init = NUTS(problem.numpyro_model), None
        else:
            kernel = NUTS(potential_fn=lambda p: -problem.logdensity(p), dense_mass=problem.dense_mass)
            init = problem.starts(chains, cfg["seed"])
        mcmc = MCMC(kernel, num_warmup=cfg["warmup"], num_samples=cfg["draws"], num_chains=chains,
                    chain_method=cfg["numpyro_chain_method"], progress_bar=False)
        args = getattr(problem, "numpyro_args", ())
        if cfg.get("numpyro_split"):
            # warmup() then run(): both phases timed, but NumPyro compiles again for run() (per chain if sequential)
            key_warm, key_run = jax.random.split(jax.random.PRNGKey(cfg["seed"]))
            mcmc.warmup(key_warm, *args, init_params=init, extra_fields=("diverging",))
            jax.block_until_ready(mcmc.post_warmup_state)
            t1 = time.perf_counter()
            mcmc.run(key_run, *args, extra_fields=("diverging", "num_steps"))
        else:  # one run() as a user would call it: warmup and sampling in one compiled loop per chain
            t1 = None
            mcmc.run(jax.random.PRNGKey(cfg["seed"]), *args, init_params=init, extra_fields=("diverging", "num_steps"))
        samples = mcmc.get_samples(group_by_chain=True)
        jax.block_until_ready(samples)
        t2 = time.perf_counter()
        out.update(total_s=t2 - t, warmup_s=t1 and t1 - t, sampling_s=t1 and t2 - t1, chains=chains)
        extra = mcmc.get_extra_fields(group_by_chain=True)
        out["divergences"] = int(extra["diverging"].sum())
        out["mean_n_steps"] = float(extra["num_steps"].mean())
        post = {k: v for k, v in samples.items()}
    elif sampler == "blackjax":
        out.update(_blackjax(problem, cfg))
        post = out.pop("_position")
    else:
        raise ValueError(sampler)
    out["draws_total"] = out["chains"] * cfg["draws"]
    out.update(min_ess(problem, post))
    out["min_ess_per_s"] = out["min_ess_bulk"] / out["total_s"]
    if out.get("sampling_s"):
        out["min_ess_per_s_sampling"] = out["min_ess_bulk"] / out["sampling_s"]
    return out


def _blackjax(problem: Problem, cfg: dict) -> dict:
    import blackjax
    import jax
    import jax.numpy as jnp
    import numpy as np
    import optax
    from blackjax.adaptation.base import get_filter_adapt_info_fn

    chains, draws = cfg["blackjax_chains"], cfg["draws"]
    logdensity = problem.logdensity
    positions = jax.tree.map(jnp.asarray, problem.starts(chains, cfg["seed"]))
    key_warm, key_run = jax.random.split(jax.random.PRNGKey(cfg["seed"]))
    t = time.perf_counter()
    warmup = blackjax.chees_adaptation(logdensity, num_chains=chains, adaptation_info_fn=get_filter_adapt_info_fn())
    (states, parameters), _ = warmup.run(key_warm, positions, step_size=0.1, optim=optax.adam(0.025),
                                         num_steps=cfg["warmup"])
    jax.block_until_ready(states)
    t1 = time.perf_counter()
    kernel = blackjax.dynamic_hmc(logdensity, **parameters)

    @jax.jit
    def sample(states, key):
        def step(states, k):
            states, info = jax.vmap(kernel.step)(jax.random.split(k, chains), states)
            return states, (states.position, info.is_divergent, info.num_integration_steps)

        return jax.lax.scan(step, states, jax.random.split(key, draws))[1]

    draws_, divergent, n_steps = sample(states, key_run)
    jax.block_until_ready(draws_)
    t2 = time.perf_counter()
    position = {k: np.swapaxes(np.asarray(v), 0, 1) for k, v in draws_.items()}  # (draw, chain) -> (chain, draw)
    return {"total_s": t2 - t, "warmup_s": t1 - t, "sampling_s": t2 - t1, "chains": chains,
            "divergences": int(np.asarray(divergent).sum()), "mean_n_steps": float(np.asarray(n_steps).mean()),
            "step_size": float(parameters["step_size"]), "_position": position}


# -- driver --------------------------------------------------------------------------------------------------

COLUMNS = [
    ("problem", "posterior", ""), ("sampler", "sampler", ""), ("chains", "chains", "d"),
    ("total_s", "total s", ".2f"), ("warmup_s", "warmup s", ".2f"), ("sampling_s", "sampling s", ".2f"),
    ("min_ess_bulk", "min ESS", ",.0f"), ("min_ess_param", "worst", ""),
    ("min_ess_per_s", "min ESS/s", ",.0f"), ("min_ess_per_s_sampling", "min ESS/s sampling", ",.0f"),
    ("divergences", "div", "d"), ("mean_n_steps", "steps/draw", ".1f"),
]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samplers", default=",".join(SAMPLERS), type=lambda s: [x for x in s.split(",") if x])
    ap.add_argument("--reference", default=None, type=lambda s: [x for x in s.split(",") if x],
                    help="reference posteriors (tests/validation/posteriors.py) instead of eight schools")
    ap.add_argument("--warmup", type=int, default=1000)
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--dhmc-chains", type=int, default=128)
    ap.add_argument("--blackjax-chains", type=int, default=128)
    ap.add_argument("--numpyro-chains", type=int, default=4)
    ap.add_argument("--numpyro-chain-method", default="sequential", choices=("sequential", "vectorized"))
    ap.add_argument("--numpyro-split", action="store_true",
                    help="time NumPyro's warmup() and run() apart (costs it a second compile); default: one run()")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--quick", action="store_true", help="100 warmup + 100 draws, 32 ensemble chains")
    args = C.parse_args_or_run_child(ap, argv, child, "ess.json")
    if args is None:
        return 0
    if args.quick:
        args.warmup, args.draws, args.dhmc_chains, args.blackjax_chains = 100, 100, 32, 32
    problems = args.reference or ["eight_schools"]
    env = {"JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    rows, started = [], time.perf_counter()
    for rep in range(args.repeat):
        for problem in problems:
            for sampler in args.samplers:
                cfg = {"problem": problem, "sampler": sampler, "warmup": args.warmup, "draws": args.draws,
                       "seed": args.seed + rep, "dhmc_chains": args.dhmc_chains,
                       "blackjax_chains": args.blackjax_chains, "numpyro_chains": args.numpyro_chains,
                       "numpyro_chain_method": args.numpyro_chain_method, "numpyro_split": args.numpyro_split}
                t = time.perf_counter()
                argv = [str(Path(__file__).resolve()), "--child", json.dumps(cfg)]
                rec = C.run_child_fresh_cache(argv, args.timeout, env)
                rec = {**cfg, **rec, "repeat": rep, "loadavg_after": os.getloadavg()[0]}
                rows.append(rec)
                msg = rec.get("error") or (f"{rec['total_s']:.1f} s, min ESS {rec['min_ess_bulk']:.0f} "
                                           f"({rec['min_ess_param']}), {rec['min_ess_per_s']:.0f}/s")
                print(f"[{time.perf_counter() - t:6.1f} s] {problem} {sampler}: {msg}", flush=True)
    payload = {"benchmark": "ess", "machine": C.machine(), "wall_s": time.perf_counter() - started,
               "settings": {k: v for k, v in vars(args).items() if k not in ("child", "out")},
               "notes": ["min bulk ESS (ArviZ) over the listed quantities; /s over the whole call incl. compile, "
                         "warmup (and dhmc's cluster start); sampling-only includes the sampling phase's compile"],
               "runs": rows}
    path = C.write_json(args.out, payload)
    print()
    print(C.table(rows, COLUMNS))
    code = C.report_errors(rows, lambda r: f"{r['problem']} {r['sampler']}")
    print(f"\nwrote {path}")
    return code


if __name__ == "__main__":
    sys.exit(main())

"""The seed project's headline, redone honestly: dhmc vs NumPyro on the coin toss.

The seed claimed 44 s for its own ensemble HMC (1024 particles, final time 110.1, step 0.001, on a GPU)
against 4 m 56 s for NumPyro's HMC -- two runs of different work on different hardware. Here both run
on this machine, on the same model (``dhmc.models.examples.coin_toss_model``: two coins, 20/40 and 30/40
heads, uniform priors; exact posteriors Beta(21, 21) and Beta(31, 11)), two ways:

1. **Equal work.** Fixed-step HMC, no warmup, no adaptation, same chains x draws x leapfrog steps and
   step size, same kind of start (U(-2, 2) in logit space): ``dhmc.sample("coin_toss", kernel="hmc",
   adapt=False)`` on its embedded cluster (cold: cluster start included) and on a reused cluster (warm),
   vs NumPyro ``MCMC(HMC, chain_method="vectorized")`` (cold, and a second call: warm) and NumPyro
   ``chain_method="sequential"`` on a few chains (its per-chain rate, scaled to the same work).
2. **Equal accuracy.** Time until the posterior mean and sd of both coins are within 1% of the exact
   Beta values, for each sampler's defaults: dhmc (ChEES, 1024 chains, 1000 warmup) and NumPyro NUTS
   (4 chains, 1000 warmup), plus the two fixed-step HMC runs above. A pilot run measures the Monte
   Carlo standard errors (ArviZ ``mcse`` of mean and sd); the draws needed for 2 x MCSE < 1% of each
   of the four quantities follow (MCSE ~ 1/sqrt(draws)); a fresh run with that many draws is timed and
   its actual errors checked against the exact values.

    python -m benchmarks.coin_toss_headline            # 1024 chains x 1000 draws x 10 steps, + accuracy
    python -m benchmarks.coin_toss_headline --quick
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

from benchmarks.harness import parse_args_or_run_child, run_child, table, write_json
from benchmarks.machine import cores, cpu_line, machine

EXACT = {  # Beta(a, b): mean a / (a + b), sd sqrt(ab / ((a + b)^2 (a + b + 1)))
    "p[0]": (21, 21),
    "p[1]": (31, 11),
}
TOLERANCE = 0.01


def exact_moments() -> dict:
    out = {}
    for name, (a, b) in EXACT.items():
        out[f"mean {name}"] = a / (a + b)
        out[f"sd {name}"] = math.sqrt(a * b / ((a + b) ** 2 * (a + b + 1)))
    return out


def accuracy(p) -> dict:
    """Errors and MCSEs of the mean and sd of each coin from draws ``p`` of shape (chain, draw, 2)."""
    import arviz as az
    import numpy as np

    p = np.asarray(p, np.float64)
    ds = az.convert_to_dataset({"p": p})
    mcse_mean = az.mcse(ds, method="mean")["p"].values
    mcse_sd = az.mcse(ds, method="sd")["p"].values
    exact = exact_moments()
    out = {}
    for i in range(2):
        for stat, value, mcse in (("mean", p[..., i].mean(), mcse_mean[i]), ("sd", p[..., i].std(), mcse_sd[i])):
            key = f"{stat} p[{i}]"
            out[key] = {"value": float(value), "exact": exact[key], "rel_error": float(abs(value / exact[key] - 1)),
                        "mcse_rel": float(mcse / exact[key])}
    out["max_rel_error"] = max(v["rel_error"] for k, v in out.items() if isinstance(v, dict))
    out["max_mcse_rel"] = max(v["mcse_rel"] for k, v in out.items() if isinstance(v, dict))
    out["within_1pct"] = out["max_rel_error"] < TOLERANCE
    return out


# -- one run (child process) -----------------------------------------------------------------------------


def child(cfg: dict) -> dict:
    import jax
    import numpy as np

    kind = cfg["kind"]
    out = {**cfg}
    chains, draws = cfg["chains"], cfg["draws"]
    if kind.startswith("dhmc"):
        import dhmc
        import dhmc.api  # noqa: F401

        fixed = kind == "dhmc_hmc"
        kw = dict(chains=chains, draws=draws, seed=cfg["seed"], progress=False)
        if fixed:
            kw.update(kernel="hmc", adapt=False, warmup=0, step_size=cfg["step_size"], num_steps=cfg["num_steps"])
        else:
            kw.update(warmup=cfg["warmup"])

        def call(cluster):
            t = time.perf_counter()
            tree = dhmc.sample("coin_toss", cluster=cluster, **kw)
            p = tree["posterior"]["p"].values
            return time.perf_counter() - t, p, json.loads(tree["posterior"].attrs["dhmc_timing"]), tree

        out["seconds"], p, out["dhmc_timing"], tree = call(None)
        out["mean_n_steps"] = float(tree["sample_stats"]["n_steps"].values.mean())
        out["mean_acceptance"] = float(tree["sample_stats"]["acceptance_rate"].values.mean())
        out["sampling_s"] = out["dhmc_timing"]["sampling"]
        if cfg.get("warm"):
            from distributed import Client, LocalCluster

            with LocalCluster(n_workers=cores(), threads_per_worker=1, dashboard_address="127.0.0.1:0",
                              host="127.0.0.1") as cluster, Client(cluster) as client:
                call(client)
                out["warm_seconds"], _, out["dhmc_timing_warm"], _ = call(client)
    else:
        from numpyro.infer import HMC, MCMC, NUTS

        from dhmc.models.examples import coin_toss_model

        if kind == "numpyro_nuts":
            kernel = NUTS(coin_toss_model)
            method, warmup = "sequential", cfg["warmup"]
        else:
            # trajectory_length=None, else NumPyro replaces the step size by 2 pi / num_steps
            kernel = HMC(coin_toss_model, step_size=cfg["step_size"], num_steps=cfg["num_steps"],
                         trajectory_length=None, adapt_step_size=False, adapt_mass_matrix=False)
            method, warmup = ("vectorized" if kind == "numpyro_hmc" else "sequential"), 0
        mcmc = MCMC(kernel, num_warmup=warmup, num_samples=draws, num_chains=chains, chain_method=method,
                    progress_bar=False)

        def call(seed):
            t = time.perf_counter()
            mcmc.run(jax.random.PRNGKey(seed), extra_fields=("num_steps", "accept_prob"))
            p = np.asarray(mcmc.get_samples(group_by_chain=True)["p"])
            return time.perf_counter() - t, p

        out["seconds"], p = call(cfg["seed"])
        extra = mcmc.get_extra_fields(group_by_chain=True)
        out["mean_n_steps"] = float(np.asarray(extra["num_steps"]).mean())
        out["mean_acceptance"] = float(np.asarray(extra["accept_prob"]).mean())
        if cfg.get("warm"):
            out["warm_seconds"], _ = call(cfg["seed"] + 1)
    out["grad_evals"] = out["mean_n_steps"] * chains * draws
    out["chain_draws_per_s"] = chains * draws / out["seconds"]
    out["grad_evals_per_s"] = out["grad_evals"] / out["seconds"]
    if out.get("warm_seconds"):
        out["warm_chain_draws_per_s"] = chains * draws / out["warm_seconds"]
        out["warm_grad_evals_per_s"] = out["grad_evals"] / out["warm_seconds"]
    out["accuracy"] = accuracy(p)
    return out


# -- driver ----------------------------------------------------------------------------------------------


def run(cfg, timeout, env):
    t = time.perf_counter()
    rec = run_child(__spec__.name, cfg, timeout, env)
    rec = {**cfg, **rec, "loadavg_after": os.getloadavg()[0]}
    if "error" in rec:
        print(f"[{time.perf_counter() - t:6.1f} s] {cfg['kind']} {cfg['chains']}x{cfg['draws']}: ERROR {rec['error']}\n"
              f"{rec.get('stderr_tail', '')[-1500:]}", flush=True)
    else:
        a = rec["accuracy"]
        warm = f", warm {rec['warm_seconds']:.2f} s" if rec.get("warm_seconds") else ""
        print(f"[{time.perf_counter() - t:6.1f} s] {cfg['kind']:>14s} {cfg['chains']:>5d} x {cfg['draws']:>6d}: "
              f"{rec['seconds']:.2f} s{warm}, max rel error {a['max_rel_error']:.4f}, max rel MCSE "
              f"{a['max_mcse_rel']:.4f}", flush=True)
    return rec


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chains", type=int, default=1024, help="ensemble size (dhmc, NumPyro vectorized HMC)")
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--num-steps", type=int, default=10)
    ap.add_argument("--step-size", type=float, default=0.05)
    ap.add_argument("--sequential-chains", type=int, default=4, help="NumPyro sequential HMC's chains (scaled)")
    ap.add_argument("--warmup", type=int, default=1000, help="warmup of the adaptive samplers")
    ap.add_argument("--nuts-chains", type=int, default=4)
    ap.add_argument("--parts", default="work,accuracy")
    ap.add_argument("--accuracy-samplers", default="dhmc,numpyro_nuts,dhmc_hmc,numpyro_hmc",
                    type=lambda s: [x for x in s.split(",") if x],
                    help="dhmc (defaults), numpyro_nuts (defaults), dhmc_hmc / numpyro_hmc (the fixed-step runs)")
    ap.add_argument("--max-draws", type=int, default=200_000, help="cap on the draws per chain of an accuracy run")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--timeout", type=float, default=1200)
    ap.add_argument("--quick", action="store_true",
                    help="64 chains x 100 draws, 100 warmup, accuracy for dhmc and NUTS only, at most 400 draws")
    args = parse_args_or_run_child(ap, argv, child, "coin_toss_headline.json")
    if args is None:
        return 0
    if args.quick:
        args.chains, args.draws, args.warmup, args.max_draws, args.sequential_chains = 64, 100, 100, 400, 2
        args.accuracy_samplers = ["dhmc", "numpyro_nuts"]
    env = {"JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    parts = args.parts.split(",")
    started = time.perf_counter()
    payload = {"benchmark": "coin_toss_headline", "machine": machine(), "exact": exact_moments(),
               "seed_claim": {"seed_ensemble_hmc_s": 44.0, "numpyro_hmc_s": 296.0,
                              "seed_setting": "1024 particles, final time 110.1, step 0.001, GPU; NumPyro's "
                                              "setting not stated: not equal work"},
               "settings": {k: v for k, v in vars(args).items() if k not in ("child", "out")}}
    base = {"step_size": args.step_size, "num_steps": args.num_steps, "seed": args.seed, "warmup": args.warmup}
    failed = False

    if "work" in parts:
        work = [run({**base, "kind": "dhmc_hmc", "chains": args.chains, "draws": args.draws, "warm": True},
                    args.timeout, env),
                run({**base, "kind": "numpyro_hmc", "chains": args.chains, "draws": args.draws, "warm": True},
                    args.timeout, env),
                run({**base, "kind": "numpyro_hmc_seq", "chains": args.sequential_chains, "draws": args.draws,
                     "warm": True}, args.timeout, env)]
        ok = {r["kind"]: r for r in work if "error" not in r}
        failed |= len(ok) < len(work)
        summary = {}
        if "numpyro_hmc_seq" in ok:  # per-chain rate, scaled to the ensemble's work
            s = ok["numpyro_hmc_seq"]
            for k in ("seconds", "warm_seconds"):
                if s.get(k):
                    summary[f"numpyro_sequential_{k}_scaled_to_{args.chains}_chains"] = s[k] * args.chains / s["chains"]
        if "dhmc_hmc" in ok and "numpyro_hmc" in ok:
            d, n = ok["dhmc_hmc"], ok["numpyro_hmc"]
            summary["numpyro_vectorized_over_dhmc_cold"] = n["seconds"] / d["seconds"]
            if d.get("warm_seconds") and n.get("warm_seconds"):
                summary["numpyro_vectorized_over_dhmc_warm"] = n["warm_seconds"] / d["warm_seconds"]
            for k in ("seconds", "warm_seconds"):
                key = f"numpyro_sequential_{k}_scaled_to_{args.chains}_chains"
                if key in summary and d.get(k):
                    summary[f"numpyro_sequential_over_dhmc_{k.replace('seconds', '').strip('_') or 'cold'}"] = (
                        summary[key] / d[k])
            # the seed's run, if its "final time 110.1 at step 0.001" means 110,100 leapfrog steps per particle
            seed_grads = 1024 * 110.1 / 0.001
            summary["seed_work_grad_evals_if_final_time_over_step"] = seed_grads
            for name, r in (("dhmc_warm", d), ("numpyro_vectorized_warm", n)):
                rate = r.get("warm_grad_evals_per_s")
                if rate:
                    summary[f"seed_work_est_s_{name}"] = seed_grads / rate
        payload["equal_work"] = {"runs": work, "summary": summary}

    if "accuracy" in parts:
        acc = []
        chains_of = {"dhmc": args.chains, "numpyro_nuts": args.nuts_chains, "dhmc_hmc": args.chains,
                     "numpyro_hmc": args.chains}
        ladders = [{**base, "kind": k, "chains": chains_of[k], "draws": args.draws} for k in args.accuracy_samplers]
        for cfg in ladders:
            pilot = run(cfg, args.timeout, env)
            entry = {"kind": cfg["kind"], "chains": cfg["chains"], "pilot": pilot}
            if "error" in pilot:
                failed = True
                acc.append(entry)
                continue
            # 2 x MCSE < 1% of every quantity; MCSE ~ 1 / sqrt(draws)
            factor = (2 * pilot["accuracy"]["max_mcse_rel"] / TOLERANCE) ** 2
            need = max(10, math.ceil(cfg["draws"] * factor))
            entry["draws_needed_est"] = need
            if need > args.max_draws:
                entry["note"] = f"needs ~{need} draws per chain, over --max-draws {args.max_draws}: not run"
                print(f"    {cfg['kind']}: {entry['note']}", flush=True)
            else:
                final = run({**cfg, "draws": need, "seed": cfg["seed"] + 1}, args.timeout, env)
                entry["final"] = final
                failed |= "error" in final
                if "error" not in final:
                    entry["time_to_1pct_s"] = final["seconds"]
                    entry["within_1pct"] = final["accuracy"]["within_1pct"]
            acc.append(entry)
        payload["equal_accuracy"] = acc

    payload["wall_s"] = time.perf_counter() - started
    path = write_json(args.out, payload)
    print(f"\n{cpu_line()}")
    if "equal_work" in payload:
        rows = [r for r in payload["equal_work"]["runs"] if "error" not in r]
        print("\nEqual work (fixed-step HMC):")
        print(table(rows, [("kind", "sampler", ""), ("chains", "chains", "d"), ("draws", "draws", "d"),
                             ("num_steps", "steps", "d"), ("seconds", "cold s", ".2f"),
                             ("warm_seconds", "warm s", ".2f"), ("chain_draws_per_s", "cold draws/s", ",.0f"),
                             ("warm_chain_draws_per_s", "warm draws/s", ",.0f"),
                             ("warm_grad_evals_per_s", "warm grads/s", ".3g")]))
        print(json.dumps(payload["equal_work"]["summary"], indent=1))
    if "equal_accuracy" in payload:
        print("\nEqual accuracy (mean and sd of both coins within 1% of the exact Beta values):")
        rows = []
        for e in payload["equal_accuracy"]:
            f = e.get("final", {})
            rows.append({"kind": e["kind"], "chains": e["chains"], "draws": f.get("draws"),
                         "time": e.get("time_to_1pct_s"), "err": f.get("accuracy", {}).get("max_rel_error"),
                         "ok": e.get("within_1pct"), "note": e.get("note", "")})
        print(table(rows, [("kind", "sampler", ""), ("chains", "chains", "d"), ("draws", "draws/chain", "d"),
                             ("time", "seconds", ".2f"), ("err", "max rel err", ".4f"), ("ok", "within 1%", ""),
                             ("note", "note", "")]))
    print(f"\nwrote {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Many short chains: sequential gradient evaluations per chain to a target ESS, from a cold start.

The regime of GPUs and big CPU ensembles: every chain runs in parallel, so what the user waits for is the
number of gradient evaluations *one* chain makes (warmup included) before the ensemble's draws meet the
target. Per problem and sampler, each run in its own fresh process:

* **sequential gradients per chain** to reach min bulk ESS >= ``--target-ess`` (400) and min tail ESS >= 400
  (ArviZ) over every reference quantity (``to_reference(..., derived=True)``: Stan's parameters and the
  unconstrained / non-centred ones), and nested R-hat < 1.01 (Margossian et al. 2024, the check made for many
  short chains: superchains of consecutive chains, 16 of them for an ensemble, NUTS's 4 chains one each,
  where it is classic R-hat), max over the quantities; "reached" says whether it was met within the run.
  Rank-normalised split R-hat is reported too (``max_split_rhat``): it needs every chain to be some 50
  autocorrelation times long, however many chains agree, so no many-short-chain method meets 1.01 on it;
* **b^2** of each quantity's mean, ``(mean - mean_ref)^2 / var_ref``, and of its second moment,
  ``(mean(x^2) - E_ref[x^2])^2 / Var_ref[x^2]`` (max and average over the quantities); E_ref[x^2] =
  mean_ref^2 + sd_ref^2 (exact moments where the folder has them, else the reference draws), Var_ref[x^2] from
  the reference draws (10,000) or exactly for the Gaussians;
* **correctness** as ``tests/validation/compare.py``: max|z| < 4.5 and |sd/sd_ref - 1| < max(5%, 3/sqrt(ESS));
* min bulk ESS per 1000 gradient evaluations (all chains, warmup counted) and the seconds of the whole call
  (compile included; for dhmc also its cluster's start).

Samplers:

* ``dhmc``: ``dhmc.sample(logdensity, init=..., chains=C, draws="auto", target_ess=400)`` with its defaults
  (``warmup="auto"``: a cold phase, then adjusted rounds; ``dense_mass=None``: warmup chooses the metric, recorded
  as ``dense_mass``; the cold phase's share of the gradients is ``cold_grads``) (a dhmc without it: ``warmup=1000``, recorded in the row). It stops by itself;
  its sequential gradients = the warmup rounds' ``grad_evals`` / C + chain 0's summed ``n_steps`` (the chains
  run in lock-step; the rounds' ``grad_evals`` include their block starts and step-size searches). The whole
  run is scored.
* ``numpyro``: NUTS, 4 chains (``--numpyro-chain-method``), 500 warmup (as in the MAMS paper), then up to
  ``--numpyro-draws`` draws; per chain its warmup + draws ``num_steps``, the slowest chain counted.
* ``chees``: BlackJAX ``chees_adaptation(logdensity, C, mass_matrix_estimation="diagonal")``, optax.adam(0.025),
  initial step 0.1, ``--chees-warmup`` (500) iterations, then ``blackjax.dynamic_hmc`` vmapped over the C chains,
  up to ``--chees-draws`` (300) draws.
* ``meads``: BlackJAX ``meads_adaptation(logdensity, C)``, ``--meads-warmup`` (1000) iterations, then
  ``blackjax.ghmc`` (one gradient a step) for up to ``--meads-draws`` (6000) steps, every ``--meads-thin``-th (20)
  kept.
* ``laps``: BlackJAX LAPS (``blackjax.adaptation.laps.laps``: unadjusted MCLMC burn-in with its own early stop,
  at most ``--laps-steps1`` steps, one gradient each, then adjusted MCLMC for ``--laps-steps2`` gradients)
  on a one-device ``Mesh``. It returns one draw per chain (the final ensemble): ESS is ArviZ's over the C
  final states as one sequence, R-hat does not apply (reached = ESS and correctness), no prefix search.

For NUTS, ChEES and MEADS the draws are searched for the shortest prefix (bisection on a geometric grid, x1.25
from 8 draws) at which the target is met; gradients, ESS, b^2 and correctness are those of that prefix (of the
whole run when it is never met). Also reported: the gradients to the ESS target alone (R-hat left out), and the
ratios to NUTS of the same problem. Seconds are those of the whole run, not of the prefix. Ensemble samplers run
``--chains`` chains (1024; 4096 on a GPU). Problems: the six
posteriordb posteriors of ``tests/validation/posteriors.py``, ``gauss100_rot`` (100-D Gaussian, sds
log-spaced 1e-2..1 -- condition number 1e4 -- in a random rotation: Q from the QR of a seeded normal matrix)
and ``funnel`` (Neal's funnel, **non-centred**: v ~ N(0, 3), z ~ N(0, I_9), as in ``ess.py``). Chains start at
the posterior's ``init`` + U(-0.5, 0.5) per coordinate (dhmc jitters its ``init`` the same way).

    python -m benchmarks.many_chains                    # 8 problems x 5 samplers, 1024 chains: results/many_chains.json
    python -m benchmarks.many_chains --quick            # smoke run (~2 min): eight schools, 128 chains, small budgets
    python -m benchmarks.many_chains --problems kidiq,gauss100_rot --samplers dhmc,numpyro,chees
    python -m benchmarks.many_chains --gpu --chains 4096 --out $OUT/many_chains_gpu.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
import traceback

from benchmarks import ess  # the problems, compare.py's verdict, the markdown table
from benchmarks.harness import RESULTS, finish, parse_args_or_run_child, recording_convergence, run_child, write_json
from benchmarks.machine import cores, have_dask_cuda, machine

SAMPLERS = ("dhmc", "numpyro", "chees", "meads", "laps")
PROBLEMS = ess.REFERENCE + ("gauss100_rot", "funnel", ess.NONCENTERED, "icg100", "brownian", ess.BROWNIAN_NONCENTERED)
# irt (inference-gym's 501-D item-response model): on request (--problems irt), its 1024-chain runs take minutes
ROUTE_SAMPLERS = {route: ("dhmc",) for route in ess.ROUTES}  # dhmc's documented route; the peers run the log density
RHAT_MAX = 1.01
GRID_START, GRID_RATIO = 8, 1.25


# -- scoring --------------------------------------------------------------------------------------------------


def quantities(problem: ess.Problem, position: dict, numpyro: bool = False) -> dict:
    """``{name: (chain, draw)}`` float64: Stan's parameters and the derived ones (posteriordb), or x / v, z;
    ``numpyro``: ``position`` holds the NumPyro model's sites."""
    if numpyro and problem.post is not None:
        return ess._scalars(problem.post.numpyro_to_reference(position, derived=True))
    if problem.post is not None:
        return ess._scalars(problem.post.to_reference(position, derived=True))
    return problem.quantities(position)


def reference(problem: ess.Problem) -> dict:
    """``{name: (mean, sd, E[x^2], Var[x^2])}`` for every quantity with a reference mean and sd."""
    import numpy as np

    if problem.x2_moments is not None:  # a kept reference's (benchmarks.laps_targets)
        return {k: (m, s, *problem.x2_moments[k]) for k, (m, s, _) in problem.moments.items()}
    if problem.post is None:  # Gaussian marginals: Var[x^2] = 2 s^4 + 4 m^2 s^2
        return {k: (m, s, m * m + s * s, 2 * s**4 + 4 * m * m * s * s) for k, (m, s, _) in problem.moments.items()}
    from tests.validation.posteriors import reference_draws

    post = problem.post
    draws = quantities(problem, post.from_reference(reference_draws(post.name)))
    return {k: (m, s, m * m + s * s, float(np.var(draws[k] ** 2))) for k, (m, s, _) in post.moments().items()
            if k in draws}


def superchains(chains: int) -> int:
    """Superchains of nested R-hat: 16 groups of consecutive chains (fewer for small ensembles; NUTS's 4 chains
    are 4 superchains of one, where nested R-hat is classic R-hat)."""
    return next(k for k in (16, 8, 4, 2, 1) if chains % k == 0 and (chains // k >= 16 or k <= chains <= 16))


def _diagnostic(key: str, x) -> float:
    """ArviZ's bulk or tail ESS, nested R-hat ("rhat": Margossian et al. 2024, the check made for many short chains;
    superchains as :func:`superchains`) or rank-normalised split R-hat ("split_rhat"), of (chain, draw) draws."""
    import warnings

    import arviz as az

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if key == "rhat":
            from dhmc.diagnostics import nested_rhat

            return float(nested_rhat(x, superchains(x.shape[0]))) if x.shape[0] >= 2 else float("nan")
        return float(az.rhat(x) if key == "split_rhat" else az.ess(x, method=key))


class Diagnostics:
    """Bulk and tail ESS and R-hat per quantity of a prefix of the draws, computed when first asked for and kept;
    a check stops at the first quantity that fails (the worst one of the last check is tried first).

    ArviZ ranks every draw of every quantity (an argsort of chains x draws values): with 100 quantities and 4096
    chains that is minutes on one core, so ``workers`` > 1 spreads the quantities over spawned processes."""

    def __init__(self, q: dict, target: float, workers: int = 1):
        self.q, self.target, self.cache, self.worst, self.pool = q, target, {}, {}, None
        if workers > 1 and len(q) > 1:
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor

            self.pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)

    def values(self, n: int, key: str, names=None) -> dict:
        names = list(self.q) if names is None else names
        todo = [k for k in names if (n, key, k) not in self.cache]
        xs = [self.q[k][:, :n] for k in todo]
        mapper = self.pool.map if self.pool is not None and len(todo) > 1 else map
        for k, v in zip(todo, mapper(_diagnostic, [key] * len(todo), xs), strict=True):
            self.cache[n, key, k] = v
        return {k: self.cache[n, key, k] for k in names}

    def ok(self, key: str, value: float) -> bool:
        return value < RHAT_MAX if key.endswith("rhat") else value >= self.target  # NaN fails both

    def extreme(self, key: str, values: dict) -> str:
        """The worst quantity: largest R-hat or smallest ESS (NaN counts as the worst)."""
        bad = math.inf if key.endswith("rhat") else -math.inf
        clean = {k: bad if math.isnan(v) else v for k, v in values.items()}
        return (max if key.endswith("rhat") else min)(clean, key=clean.get)

    def met(self, n: int, keys) -> bool:
        """Every criterion in ``keys`` met at ``n`` draws (R-hat < 1.01, ESS >= target) by every quantity."""
        for key in keys:
            worst = self.worst.get(key)
            if worst is not None and not self.ok(key, self.values(n, key, [worst])[worst]):
                return False
            values = self.values(n, key)
            self.worst[key] = self.extreme(key, values)
            if not self.ok(key, values[self.worst[key]]):
                return False
        return True

    def first(self, ns: list[int], keys) -> int | None:
        """The smallest ``n`` of the grid ``ns`` meeting ``keys`` (bisection: ESS grows and R-hat falls with n,
        up to noise), None when the last does not."""
        if not self.met(ns[-1], keys):
            return None
        lo, hi = 0, len(ns) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            lo, hi = (lo, mid) if self.met(ns[mid], keys) else (mid + 1, hi)
        return ns[lo]

    def report(self, n: int, keys) -> dict:
        names = {"bulk": ("min_ess_bulk", "min_ess_param"), "tail": ("min_ess_tail", "min_ess_tail_param"),
                 "rhat": ("max_rhat", "max_rhat_param"), "split_rhat": ("max_split_rhat", "max_split_rhat_param")}
        out = {name: None for pair in names.values() for name in pair}
        for key in keys:
            values = self.values(n, key)
            worst = self.extreme(key, values)
            out.update(zip(names[key], (values[worst], worst), strict=True))
        return out


def bias(q: dict, ref: dict) -> dict:
    """b^2 of the mean and of the second moment: max (and which quantity) and average."""
    import numpy as np

    b_mean, b_sq = {}, {}
    for k, (m, s, e2, v2) in ref.items():
        if k in q:
            x = q[k]
            b_mean[k] = float((x.mean() - m) ** 2 / s**2)
            b_sq[k] = float(((x**2).mean() - e2) ** 2 / v2)
    out = {}
    for name, b in (("mean", b_mean), ("x2", b_sq)):
        out[f"b2_{name}_max"] = max(b.values()) if b else None
        out[f"b2_{name}_max_param"] = max(b, key=b.get) if b else None
        out[f"b2_{name}_avg"] = float(np.mean(list(b.values()))) if b else None
    return out


def grid(n: int) -> list[int]:
    """Prefix lengths: 8, 10, 13, 16, 20, ... (x1.25), and ``n`` itself."""
    out, x = [], float(GRID_START)
    while round(x) < n:
        if not out or round(x) > out[-1]:
            out.append(round(x))
        x *= GRID_RATIO
    return out + [n]


def score(problem, out: dict, run: dict, target: float, search: bool, workers: int = 1) -> None:
    """Find the shortest prefix of ``run["draws"]`` that meets the target (``search``; else the whole run), and
    record gradients, ESS, R-hat, b^2 and correctness there.

    ``run``: ``draws`` (position dict, leading (chain, draw)), ``grads`` (chain, iteration) gradient evaluations
    per iteration, warmup iterations first, ``warmup_iters`` and ``thin`` (stored draw j is iteration
    ``warmup_iters + (j + 1) * thin - 1``) or ``draw_iters`` (each stored draw's iteration)."""
    import numpy as np

    q_all = quantities(problem, {k: np.asarray(v) for k, v in run["draws"].items()}, run.get("numpyro", False))
    n_all = next(iter(q_all.values())).shape[1]
    t = time.perf_counter()
    grads = np.cumsum(np.asarray(run["grads"], np.int64), axis=1)
    draw_iters = run.get("draw_iters")
    if draw_iters is None:
        draw_iters = run["warmup_iters"] + np.arange(1, n_all + 1) * run.get("thin", 1) - 1
    cum = lambda n: grads[:, draw_iters[n - 1]]  # gradients of each chain up to stored draw n
    use_rhat = run.get("use_rhat", True)  # without R-hat (LAPS), correctness stands in for it
    keys = ("rhat", "bulk", "tail") if use_rhat else ("bulk", "tail")
    diag, ns = Diagnostics(q_all, target, workers), grid(n_all) if search else [n_all]
    try:
        chosen = diag.first(ns, keys)
        ess_only = diag.first(ns[: ns.index(chosen) + 1] if chosen else ns, ("bulk", "tail"))
        if ess_only is not None:
            out.update(ess_only_draws=ess_only, ess_only_seq_grads=int(cum(ess_only).max()))
        chosen = chosen or n_all
        out.update(diag.report(chosen, keys + (("split_rhat",) if use_rhat else ())))
    finally:
        diag.close()
    q = {k: v[:, :chosen] for k, v in q_all.items()}
    out.update(bias(q, out.pop("_ref")))
    out.update(ess.check(q, problem.name, problem.moments, problem.required))
    c = cum(chosen)
    out.update(draws_used=chosen, draws_run=n_all, prefixes_checked=len({n for n, _, _ in diag.cache}),
               scoring_s=time.perf_counter() - t,
               seq_grads=int(c.max()), seq_grads_min=int(c.min()), lockstep=bool(c.min() == c.max()),
               total_grads=int(c.sum()),
               seq_warmup_grads=int(grads[:, run["warmup_iters"] - 1].max()) if run["warmup_iters"] else None)
    out["reached"] = diag.met(chosen, keys) and (use_rhat or bool(out["correct"]))
    out["min_ess_per_1k_grads"] = 1000 * out["min_ess_bulk"] / out["total_grads"] if out["total_grads"] else None


# -- one sampler (child process) ------------------------------------------------------------------------------


def child(cfg: dict) -> dict:
    out = {**cfg}
    try:
        return _child(cfg, out)
    except Exception as e:  # recorded in the row; the run goes on
        out.pop("_ref", None)
        out["error"] = f"{type(e).__name__}: {e}"
        out["stderr_tail"] = traceback.format_exc()[-3000:]
        return out


def _child(cfg: dict, out: dict) -> dict:
    import jax

    problem = ess.Problem(cfg["problem"])
    if problem.x64:
        jax.config.update("jax_enable_x64", True)
    out["jax_devices"] = [str(d) for d in jax.devices()]
    out["_ref"] = reference(problem)
    out["n_quantities"] = len(out["_ref"])
    run = RUNNERS[cfg["sampler"]](problem, cfg, out)
    workers = cfg.get("score_workers") or max(1, min(8, cores() // 2))
    score(problem, out, run, cfg["target_ess"], cfg["sampler"] in ("numpyro", "chees", "meads"), workers)
    out["expect_unbiased"] = problem.expect_unbiased
    return out


def _dhmc(problem, cfg, out) -> dict:
    import numpy as np

    import dhmc
    from dhmc.diagnostics import ebfmi

    chains = cfg["chains"]
    kwargs = dict(init=problem.init, chains=chains, draws="auto", target_ess=cfg["target_ess"], seed=cfg["seed"],
                  progress=False)  # its defaults: dense_mass=None (warmup chooses the metric)
    if cfg["dhmc_max_draws"]:
        kwargs["max_draws"] = cfg["dhmc_max_draws"]
    cluster, t = None, time.perf_counter()  # a cluster started here counts, as dhmc's embedded one does
    if cfg.get("gpu"):  # as throughput.py: dask-cuda's cluster, else one worker for the one GPU, one block
        kwargs["chains_per_task"] = chains
        if have_dask_cuda():
            cluster, out["cluster_kind"] = "cuda", "cuda"
        else:
            from distributed import LocalCluster

            cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                                   dashboard_address="127.0.0.1:0")
            out["cluster_kind"] = "LocalCluster(1 worker)"
    if problem.route:  # a documented route: the NumPyro model, its hierarchy reparameterised by dhmc
        kwargs.pop("init")
        target = problem.route_model
        kwargs[problem.route] = True
    else:
        target = problem.logdensity
    try:
        with recording_convergence(out):
            try:
                tree = dhmc.sample(target, warmup="auto", cluster=cluster, **kwargs)
                out["warmup"] = "auto"
            except (TypeError, ValueError) as e:
                if "auto" not in str(e):
                    raise
                out["warmup"], out["warmup_fallback"] = 1000, f"warmup='auto' raised {type(e).__name__}: {e}"
                tree = dhmc.sample(target, warmup=1000, cluster=cluster, **kwargs)
        out["ebfmi"] = ebfmi(tree)
        names = tree["posterior"].data_vars if problem.route else problem.init
        draws = {k: tree["posterior"][k].values for k in names}
    finally:
        if cluster is not None and not isinstance(cluster, str):
            cluster.close()
    out["total_s"] = time.perf_counter() - t
    history = json.loads(tree["posterior"].attrs.get("dhmc_warmup", "[]"))
    n_steps = np.asarray(tree["sample_stats"]["n_steps"].values, np.int64)
    warm = sum(int(r.get("grad_evals", 0)) for r in history) / chains
    out.update(chains=chains, warmup_rounds=len(history), warmup_iterations=sum(int(r.get("iterations", 0))
               for r in history if r.get("phase") != "cold") or None, divergences=int(tree["sample_stats"]["diverging"].values.sum()),
               dhmc_timing=json.loads(tree["posterior"].attrs.get("dhmc_timing", "{}")),
               dense_mass=json.loads(tree["posterior"].attrs["dhmc_run_spec"])["dense_mass"],
               cold_grads=sum(int(r["grad_evals"]) for r in history if r.get("phase") == "cold") / chains,
               seq_grads_brief=warm + int(n_steps[0].sum()))
    return {"draws": draws, "grads": np.concatenate([np.full((chains, 1), round(warm)), n_steps], axis=1),
            "warmup_iters": 1, "numpyro": bool(problem.route)}


def _starts(problem, cfg, chains):
    import jax
    import jax.numpy as jnp

    return jax.tree.map(jnp.asarray, problem.starts(chains, cfg["seed"]))


def _numpyro(problem, cfg, out) -> dict:
    import jax
    import numpy as np
    from numpyro.infer import MCMC, NUTS

    chains, warmup, draws = cfg["numpyro_chains"], cfg["numpyro_warmup"], cfg["numpyro_draws"]
    t = time.perf_counter()
    kernel = NUTS(potential_fn=lambda p: -problem.logdensity(p), dense_mass=problem.dense_mass)
    mcmc = MCMC(kernel, num_warmup=warmup, num_samples=draws, num_chains=chains,
                chain_method=cfg["numpyro_chain_method"], progress_bar=False)
    mcmc._set_collection_params(0, warmup + draws, None)  # keep the warmup's num_steps too (as ess.py)
    mcmc.run(jax.random.PRNGKey(cfg["seed"]), init_params=problem.starts(chains, cfg["seed"]),
             extra_fields=("num_steps", "diverging"))
    samples = jax.block_until_ready(mcmc.get_samples(group_by_chain=True))
    extra = mcmc.get_extra_fields(group_by_chain=True)
    out.update(total_s=time.perf_counter() - t, chains=chains, warmup=warmup,
               divergences=int(np.asarray(extra["diverging"])[:, warmup:].sum()))
    return {"draws": {k: np.asarray(v)[:, warmup:] for k, v in samples.items()},
            "grads": np.asarray(extra["num_steps"], np.int64), "warmup_iters": warmup}


def _ensemble_sample(kernel, states, key, chains: int, draws: int, thin: int, info_steps):
    """``draws`` x ``thin`` vmapped kernel steps in ``lax.scan``: positions every ``thin`` steps (draw, chain, ...)
    -> (chain, draw, ...), and gradients per step (chain, step)."""
    import jax
    import numpy as np

    @jax.jit
    def sample(states, key):
        def step(states, k):
            states, info = jax.vmap(kernel.step)(jax.random.split(k, chains), states)
            return states, info_steps(info)

        def keep(states, k):
            states, n = jax.lax.scan(step, states, jax.random.split(k, thin))
            return states, (states.position, n)

        return jax.lax.scan(keep, states, jax.random.split(key, draws))[1]

    positions, n = jax.block_until_ready(sample(states, key))
    n = np.asarray(n, np.int64).reshape(draws * thin, chains).T
    return {k: np.swapaxes(np.asarray(v), 0, 1) for k, v in positions.items()}, n


def _chees(problem, cfg, out) -> dict:
    import blackjax
    import jax
    import numpy as np
    import optax
    from blackjax.adaptation.base import get_filter_adapt_info_fn

    chains, warmup, draws = cfg["chains"], cfg["chees_warmup"], cfg["chees_draws"]
    key_warm, key_run = jax.random.split(jax.random.PRNGKey(cfg["seed"]))
    positions = _starts(problem, cfg, chains)
    t = time.perf_counter()
    adapt = blackjax.chees_adaptation(problem.logdensity, chains, mass_matrix_estimation="diagonal",
                                      adaptation_info_fn=get_filter_adapt_info_fn(info_keys={"num_integration_steps"}))
    (states, params), info = adapt.run(key_warm, positions, step_size=0.1, optim=optax.adam(0.025),
                                       num_steps=warmup, max_sampling_steps=draws)
    warm = np.asarray(info.info.num_integration_steps, np.int64).reshape(warmup, chains).T
    kernel = blackjax.dynamic_hmc(problem.logdensity, **params)
    positions, n = _ensemble_sample(kernel, states, key_run, chains, draws, 1, lambda i: i.num_integration_steps)
    out.update(total_s=time.perf_counter() - t, chains=chains, warmup=warmup, step_size=float(params["step_size"]),
               mean_steps_per_draw=float(n.mean()))
    return {"draws": positions, "grads": np.concatenate([warm, n], axis=1), "warmup_iters": warmup}


def _meads(problem, cfg, out) -> dict:
    import blackjax
    import jax
    import numpy as np
    from blackjax.adaptation.base import get_filter_adapt_info_fn

    chains, warmup, thin = cfg["chains"], cfg["meads_warmup"], cfg["meads_thin"]
    draws = cfg["meads_draws"] // thin
    key_warm, key_run = jax.random.split(jax.random.PRNGKey(cfg["seed"]))
    positions = _starts(problem, cfg, chains)
    t = time.perf_counter()
    adapt = blackjax.meads_adaptation(problem.logdensity, chains, adaptation_info_fn=get_filter_adapt_info_fn())
    (states, params), _ = adapt.run(key_warm, positions, num_steps=warmup)
    kernel = blackjax.ghmc(problem.logdensity, **params)
    positions, n = _ensemble_sample(kernel, states, key_run, chains, draws, thin,
                                    lambda i: jax.numpy.ones_like(i.acceptance_rate, int))
    # one gradient a warmup step (the frozen fold's chains wait: one sequential step all the same)
    warm = np.full((chains, 1), warmup)
    out.update(total_s=time.perf_counter() - t, chains=chains, warmup=warmup, thin=thin,
               step_size=float(params["step_size"]), alpha=float(params["alpha"]), delta=float(params["delta"]))
    return {"draws": positions, "grads": np.concatenate([warm, n], axis=1), "warmup_iters": 1, "thin": thin}


def _laps(problem, cfg, out) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from blackjax.adaptation.laps import laps
    from jax.flatten_util import ravel_pytree

    chains = cfg["chains"]
    dtype = jnp.float64 if problem.x64 else jnp.float32
    flat0, unravel = ravel_pytree({k: jnp.asarray(v, dtype) for k, v in problem.init.items()})
    dim = int(flat0.size)
    r = problem.init_radius
    mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]), ("chains",))
    t = time.perf_counter()
    info, grads_per_step, acc, final = laps(
        lambda x: problem.logdensity(unravel(x)), lambda k: flat0 + jax.random.uniform(k, (dim,), dtype, -r, r), dim,
        cfg["laps_steps1"], cfg["laps_steps2"], chains, mesh, jax.random.key(cfg["seed"]))
    flat = np.asarray(jax.block_until_ready(final.position))
    steps1, samples2 = len(info["phase_1"]["step_size"]), len(info["phase_2"]["step_size"])
    steps_per_sample = float(np.asarray(info["phase_2"]["steps_per_sample"])[0])
    burn_in, adjusted = 1 + steps1, int(samples2 * steps_per_sample * grads_per_step)  # initial gradient counted
    out.update(total_s=time.perf_counter() - t, chains=chains, phase1_steps=steps1, phase2_samples=samples2,
               grads_per_step=grads_per_step, acc_prob_target=acc,
               phase2_acc_prob_last=float(np.asarray(info["phase_2"]["acc_prob"])[-1]),
               phase2_step_size_last=float(np.asarray(info["phase_2"]["step_size"])[-1]),
               note="one draw per chain (the final ensemble), scored as one sequence of C draws; no R-hat")
    draws = jax.vmap(unravel)(jnp.asarray(flat))
    return {"draws": {k: np.asarray(v)[None] for k, v in draws.items()}, "use_rhat": False,
            "grads": np.tile([burn_in, adjusted], (chains, 1)), "warmup_iters": 1, "draw_iters": np.ones(chains, int)}


RUNNERS = {"dhmc": _dhmc, "numpyro": _numpyro, "chees": _chees, "meads": _meads, "laps": _laps}


# -- driver ---------------------------------------------------------------------------------------------------

COLUMNS = [
    ("label", "problem", ""), ("sampler", "sampler", ""), ("chains", "chains", "d"),
    ("seq_warmup_grads", "warmup grads/chain", ",d"), ("seq_grads", "grads/chain to target", ",d"),
    ("reached", "reached", ""), ("draws_used", "draws", "d"), ("ess_only_seq_grads", "grads/chain to ESS only", ",d"),
    ("min_ess_bulk", "min bulk ESS", ",.0f"),
    ("min_ess_tail", "min tail ESS", ",.0f"), ("max_rhat", "max nested R-hat", ".3f"), ("max_split_rhat", "max split R-hat", ".3f"),
    ("min_ess_per_1k_grads", "ESS/1k grads", ".3g"), ("b2_mean_max", "b2 mean max", ".2g"),
    ("b2_mean_avg", "b2 mean avg", ".2g"), ("b2_x2_max", "b2 x2 max", ".2g"), ("b2_x2_avg", "b2 x2 avg", ".2g"),
    ("max_abs_z", "max \\|z\\|", ".2f"), ("correct", "correct", ""), ("total_s", "s", ".1f"),
    ("nuts_grads_ratio", "NUTS grads / grads", ".2f"), ("nuts_ess_only_ratio", "same, ESS only", ".2f"),
    ("nuts_ess_ratio", "ESS/grad / NUTS's", ".2f"),
]


def add_ratios(rows: list[dict]) -> None:
    """Per row, against the NUTS row of the same problem and seed: NUTS's sequential gradients to the target / this
    sampler's (> 1: fewer than NUTS; only where both reached it), the same to the ESS target alone (R-hat left out;
    only where both are correct), and this sampler's ESS per gradient / NUTS's (> 1: better)."""
    nuts = {(r["problem"], r["seed"]): r for r in rows if r["sampler"] == "numpyro" and "error" not in r}
    for r in rows:
        b = nuts.get((r["problem"], r["seed"]))
        if b is None or "error" in r:
            continue
        r["nuts_grads_ratio"] = b["seq_grads"] / r["seq_grads"] if r["reached"] and b["reached"] else None
        r["nuts_ess_only_ratio"] = (b["ess_only_seq_grads"] / r["ess_only_seq_grads"] if r.get("ess_only_seq_grads")
                                    and b.get("ess_only_seq_grads") and r["correct"] and b["correct"] else None)
        r["nuts_ess_ratio"] = (r["min_ess_per_1k_grads"] / b["min_ess_per_1k_grads"]
                               if b.get("min_ess_per_1k_grads") and r.get("min_ess_per_1k_grads") else None)


def summarise(rows: list[dict]) -> dict:
    """Per sampler: runs, how many reached the target and were correct, and the medians of the ratios to NUTS
    over the problems where each ratio exists."""
    out = {}
    for s in SAMPLERS:
        mine = [r for r in rows if r["sampler"] == s and "error" not in r]
        if mine:
            out[s] = {"runs": len(mine), "reached": sum(bool(r.get("reached")) for r in mine),
                      "correct": sum(bool(r.get("correct")) for r in mine)}
            for key in ("nuts_grads_ratio", "nuts_ess_only_ratio", "nuts_ess_ratio"):
                values = [r[key] for r in mine if r.get(key) is not None]
                out[s][f"median_{key}"] = statistics.median(values) if values else None
                out[s][f"n_{key}"] = len(values)
    return out


def summary_markdown(summary: dict) -> str:
    f = lambda d, key: "-" if d[f"median_{key}"] is None else f"{d[f'median_{key}']:.2f} ({d[f'n_{key}']})"
    lines = ["| sampler | runs | reached | correct | NUTS grads / grads, both reached | same, ESS only | "
             "ESS per grad / NUTS's |", "|---|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {s} | {d['runs']} | {d['reached']} | {d['correct']} | {f(d, 'nuts_grads_ratio')} | "
              f"{f(d, 'nuts_ess_only_ratio')} | {f(d, 'nuts_ess_ratio')} |" for s, d in summary.items()]
    return "\n".join(lines) + "\n\n(medians over problems; in brackets how many had the ratio)"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    split = lambda s: [x for x in s.split(",") if x]
    ap.add_argument("--problems", type=split, default=None,
                    help=f"comma-separated, default all: {', '.join(PROBLEMS)} (or their table labels: arK, "
                         "eight_schools_centered, ...; or prefixes: kidiq)")
    ap.add_argument("--samplers", type=split, default=None, help=f"comma-separated of {', '.join(SAMPLERS)}")
    ap.add_argument("--chains", type=int, default=1024, help="chains of dhmc, ChEES, MEADS and LAPS")
    ap.add_argument("--seeds", type=lambda s: [int(x) for x in split(s)], default=[0], help="e.g. 0,1,2")
    ap.add_argument("--target-ess", type=float, default=400.0)
    ap.add_argument("--dhmc-max-draws", type=int, default=None, help="dhmc's max_draws (default: dhmc's own)")
    ap.add_argument("--numpyro-chains", type=int, default=4)
    ap.add_argument("--numpyro-chain-method", default="sequential", choices=("sequential", "vectorized"))
    ap.add_argument("--numpyro-warmup", type=int, default=500)
    ap.add_argument("--numpyro-draws", type=int, default=2000, help="NUTS draws per chain after warmup (at most)")
    ap.add_argument("--chees-warmup", type=int, default=500, help="ChEES warmup iterations")
    ap.add_argument("--chees-draws", type=int, default=300, help="ChEES draws per chain (at most)")
    ap.add_argument("--meads-warmup", type=int, default=1000, help="MEADS warmup iterations (one gradient each)")
    ap.add_argument("--meads-draws", type=int, default=6000, help="MEADS steps per chain after warmup (at most)")
    ap.add_argument("--meads-thin", type=int, default=20, help="MEADS: keep every n-th step's draw")
    ap.add_argument("--laps-steps1", type=int, default=800, help="LAPS burn-in steps (at most: it stops early)")
    ap.add_argument("--laps-steps2", type=int, default=1000, help="LAPS adjusted phase, gradients per chain")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per measurement")
    ap.add_argument("--score-workers", type=int, default=0,
                    help="processes computing ArviZ's diagnostics (default: half the cores, at most 8)")
    ap.add_argument("--gpu", action="store_true", help="JAX on the GPU (dhmc: dask-cuda or a 1-worker cluster)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: eight schools (unless --problems), 128 chains, small budgets -> results/quick/")
    args = parse_args_or_run_child(ap, argv, child, "many_chains.json")
    if args is None:
        return 0
    if args.quick:
        args.problems = args.problems or ["eight_schools-eight_schools_noncentered"]
        args.chains, args.numpyro_warmup, args.numpyro_draws = 128, 200, 500
        args.chees_warmup, args.chees_draws, args.meads_warmup, args.meads_draws = 100, 100, 200, 1000
        args.laps_steps1, args.laps_steps2, args.dhmc_max_draws = 200, 300, args.dhmc_max_draws or 500
        if args.out == str(RESULTS / "many_chains.json"):
            args.out = str(RESULTS / "quick" / "many_chains.json")
    labels = {ess.label(p): p for p in PROBLEMS}  # eight_schools_centered, arK, ... as in the tables
    problems = [labels.get(p) or ess.resolve_problem(p) for p in (args.problems or PROBLEMS)]
    samplers = args.samplers or list(SAMPLERS)
    if unknown := [s for s in samplers if s not in SAMPLERS]:
        ap.error(f"unknown sampler(s) {unknown}; choose from {list(SAMPLERS)}")
    env = {"JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cuda,cpu" if args.gpu else "cpu")}
    if args.gpu:
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # dhmc's driver and worker share the GPU
    settings = {k: v for k, v in vars(args).items() if k not in ("child", "out")}
    settings.update(problems_run=problems, samplers_run=samplers)
    rows, started = [], time.perf_counter()

    def save():
        add_ratios(rows)
        return write_json(args.out, {
            "benchmark": "many_chains", "machine": machine(),
            "wall_s": time.perf_counter() - started,
            "settings": settings, "summary": summarise(rows),
            "notes": ["seq_grads: gradient evaluations of one chain (the slowest), warmup included, to the first "
                      "prefix meeting min bulk and tail ESS >= target_ess and max R-hat < 1.01 (whole run if never)",
                      "b2: (mean - mean_ref)^2 / var_ref and (mean(x^2) - E_ref[x^2])^2 / Var_ref[x^2] at that prefix",
                      "min_ess_per_1k_grads: min bulk ESS per 1000 gradients of all chains, warmup included",
                      "dhmc: warnings: the ConvergenceWarnings its run gave; ebfmi: the ensemble's E-BFMI (below 0.3 warns)",
                      "total_s: the whole call (compile, warmup, every draw run, not only the prefix)",
                      "funnel: non-centred (v, z); laps: the final ensemble only (one draw per chain), no R-hat"],
            "runs": rows})

    for seed in args.seeds:
        for problem in problems:
            for sampler in samplers:
                if sampler not in ROUTE_SAMPLERS.get(problem, SAMPLERS):
                    continue
                cfg = {"problem": problem, "sampler": sampler, "seed": seed, "chains": args.chains, "gpu": args.gpu,
                       **{k: getattr(args, k) for k in (
                           "target_ess", "dhmc_max_draws", "numpyro_chains", "numpyro_chain_method", "numpyro_warmup",
                           "numpyro_draws", "chees_warmup", "chees_draws", "meads_warmup", "meads_draws", "meads_thin",
                           "laps_steps1", "laps_steps2", "score_workers")}}
                t = time.perf_counter()
                rec = run_child(__spec__.name, cfg, args.timeout, env)
                rows.append({**cfg, **rec, "label": ess.label(problem), "loadavg_after": os.getloadavg()[0]})
                r = rows[-1]
                msg = ("ERROR " + r["error"][:200] if "error" in r else
                       f"{r['seq_grads']:,} grads/chain, reached {r['reached']}, min ESS {r['min_ess_bulk']:.0f}/"
                       f"{r['min_ess_tail']:.0f}, R-hat {r['max_rhat'] or float('nan'):.3f}, "
                       f"b2 x2 max {r['b2_x2_max']:.2g}, "
                       f"correct {r['correct']}, {r['total_s']:.1f} s")
                print(f"[{time.perf_counter() - t:6.1f} s] {ess.label(problem)} {sampler}: {msg}", flush=True)
                save()  # after every measurement: a run cut short keeps what it measured
    return finish(save(), rows, lambda r: f"{r['problem']} {r['sampler']} seed {r['seed']}",
                    [ess.md_table(rows, COLUMNS), summary_markdown(summarise(rows))], started)


if __name__ == "__main__":
    sys.exit(main())

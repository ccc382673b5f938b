"""ESS per second and per gradient: dhmc vs NumPyro NUTS vs BlackJAX, with the correctness of each.

Samplers (each run in its own fresh process):

* ``dhmc``: ``dhmc.sample(target, chains=128, draws=1000)`` (``warmup="auto"``, its default) -- the default kernel
  ("chees": jittered trajectories, ensemble-adapted step size, length and diagonal mass), embedded
  default cluster (its start counts).
* ``dhmc-mams``: the same call with ``kernel="mams"`` (Metropolis-adjusted microcanonical dynamics). A dhmc
  without that kernel answers "unknown kernel": the row records the error and the run goes on.
* ``numpyro``: ``MCMC(NUTS(...), num_chains=4, chain_method="sequential")``, NumPyro's defaults otherwise
  (diagonal mass, dense for kidiq as in the validation suite, target accept 0.8), one ``run()`` call (so no
  sampling-only time; ``--numpyro-split`` times ``warmup()`` and ``run()`` apart, at the price of a second
  compile that a user calling ``run()`` once does not pay). The warmup's draws are collected too (same
  single ``run()``) so that its leapfrog steps are counted; only the post-warmup draws are scored.
* ``blackjax``: ``blackjax.chees_adaptation`` (128 chains, optax.adam(0.025), initial step 0.1, diagonal mass
  estimated in the second half of warmup: ``mass_matrix_estimation="diagonal"``) then
  ``blackjax.dynamic_hmc`` vmapped over chains in ``lax.scan``.
* ``blackjax-mams``: BlackJAX's adjusted MCLMC (``blackjax.mcmc.adjusted_mclmc_dynamic``: isokinetic
  McLachlan integrator, 2 gradients a step, random trajectory lengths). Tuned *per chain* with
  ``blackjax.adjusted_mclmc_find_L_and_step_size`` (target acceptance 0.9, diagonal preconditioning,
  ``num_steps=warmup`` with ``frac_tune1 = frac_tune2 = 1/3``, ``frac_tune3 = 0``: the tuning runs as many
  iterations as the others' warmup), vmapped over the same 128 chains; each chain then samples with its own
  step size, L and diagonal metric.

Problems: the six posteriordb posteriors of ``tests/validation/posteriors.py`` (reference draws; the same JAX
log density for every sampler, NumPyro through ``potential_fn``), ``gauss100`` (100-D Gaussian, diagonal, sds
log-spaced from 1e-2 to 1: covariance condition number 1e4), ``funnel`` (Neal's funnel, non-centred: v ~ N(0,
3), z_i ~ N(0, 1) for 9 coordinates, d = 10; x_i = exp(v/2) z_i reported apart), and, on request only,
``gauss100_rot`` (the same spectrum in a random rotation) and ``eight_schools`` (dhmc's built-in model, the
script's original default; no reference moments), the LAPS targets (``benchmarks.laps_targets``) and dhmc's
documented routes for a centred hierarchy (``eight_schools-eight_schools_centered:noncentered``,
``brownian:noncentered``: dhmc samples the NumPyro model with ``noncentered=True``; ``...:laplace`` the same with
``laplace=True``; the peers run the log density as written, the centred one, on the same row).

Per row: seconds of the whole call (compile, warmup, sampling; for dhmc also its cluster start) and of the
sampling phase (its compile included); gradient evaluations (warmup + sampling: leapfrog steps, NUTS's
``num_steps``, 2 per McLachlan step); min bulk and tail ESS (ArviZ) over the reference quantities (Stan's
parameters; x for the Gaussians; v, z for the funnel); min ESS/s and min ESS per 1000 gradient evaluations;
correctness as in ``tests/validation/compare.py``: z = (mean - ref) / sqrt(mcse^2 + mcse_ref^2) with mcse =
sd / sqrt(bulk ESS) (mcse_ref = 0 for exact moments), pass when max|z| < 4.5 and every |sd / sd_ref - 1| <
max(5%, 3 / sqrt(ESS)). A summary gives, per dhmc kernel and posterior, the ratios to NumPyro NUTS and their
median over the six reference posteriors.

    python -m benchmarks.ess                        # eight schools (built-in), dhmc/numpyro/blackjax, 1000 + 1000
    python -m benchmarks.ess --all                  # every problem x every sampler -> results/ess_all.json
    python -m benchmarks.ess --all --quick          # the same at 100 + 100 draws, 32 ensemble chains
    python -m benchmarks.ess --problems kidiq,funnel --samplers dhmc,numpyro
    python -m benchmarks.ess --reference kidiq,arK  # (older spelling of --problems)
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

from benchmarks.harness import RESULTS, finish, parse_args_or_run_child, recording_convergence, run_child, write_json
from benchmarks.machine import machine
from benchmarks.targets import eight_schools_logdensity

DEFAULT_SAMPLERS = ("dhmc", "numpyro", "blackjax")
ALL_SAMPLERS = ("dhmc", "dhmc-mams", "blackjax-mams", "blackjax", "numpyro")
REFERENCE = ("eight_schools-eight_schools_noncentered", "eight_schools-eight_schools_centered",
             "kidiq-kidscore_momiq", "sblrc-blr", "arK-arK", "low_dim_gauss_mix-low_dim_gauss_mix")
SYNTHETIC = ("gauss100", "funnel")
NONCENTERED = "eight_schools-eight_schools_centered:noncentered"  # the centred NumPyro model, dhmc's noncentered=True
LAPS = ("icg100", "brownian", "irt")  # LAPS's own targets (benchmarks.laps_targets), references kept in the repo
BROWNIAN_NONCENTERED = "brownian:noncentered"  # its NumPyro model, dhmc's noncentered=True
LAPLACE = "eight_schools-eight_schools_centered:laplace"  # the centred NumPyro model, dhmc's laplace=True
BROWNIAN_LAPLACE = "brownian:laplace"  # its NumPyro model, dhmc's laplace=True
ROUTES = (NONCENTERED, BROWNIAN_NONCENTERED, LAPLACE, BROWNIAN_LAPLACE)  # dhmc's documented routes for a hierarchy
ON_REQUEST = ("gauss100_rot", "eight_schools") + ROUTES + LAPS
ALL_PROBLEMS = REFERENCE + SYNTHETIC
DHMC_KERNELS = {"dhmc": "chees", "dhmc-mams": "mams"}


def resolve_problem(name: str) -> str:
    """A problem's full name: exact, or an unambiguous prefix of a reference posterior ("kidiq")."""
    if name in ALL_PROBLEMS + ON_REQUEST:
        return name
    hits = [p for p in REFERENCE if p.startswith(name)]
    if len(hits) != 1:
        raise SystemExit(f"unknown or ambiguous problem {name!r}; known: {', '.join(ALL_PROBLEMS + ON_REQUEST)}")
    return hits[0]


def label(name: str) -> str:
    """Short name for tables: ``eight_schools_noncentered``, ``kidiq``, ``arK``, ``gauss100`` ..."""
    if name in ROUTES:
        return f"{label(name.split(':')[0])}, {name.split(':')[1]}=True"
    if name.startswith("eight_schools-"):
        return name.split("-", 1)[1]
    return name.split("-", 1)[0]


# -- the problems ---------------------------------------------------------------------------------------------


def _scalars(arrays: dict, first: int = 0) -> dict:
    """``{name: (chain, draw, *shape)}`` -> ``{name or name[i]: (chain, draw)}`` (float64)."""
    import numpy as np

    out = {}
    for k, v in arrays.items():
        v = np.asarray(v, np.float64)
        if v.ndim == 2:
            out[k] = v
        else:
            flat = v.reshape(*v.shape[:2], -1)
            for i in range(flat.shape[-1]):
                out[f"{k}[{i + first}]"] = flat[..., i]
    return out


def gauss_sds(d: int = 100):
    """Standard deviations log-spaced from 1e-2 to 1: covariance eigenvalues 1e-4 .. 1, condition number 1e4."""
    import numpy as np

    return np.logspace(-2.0, 0.0, d)


def gauss_rotation(d: int = 100, seed: int = 0):
    import numpy as np

    q, r = np.linalg.qr(np.random.default_rng(seed).normal(size=(d, d)))
    return q * np.sign(np.diag(r))


def gauss_logdensity(sds, rotation=None):
    """log N(x | 0, R diag(sds^2) R^T) (up to a constant), on ``{"x": (d,)}``."""
    import numpy as np

    inv = np.asarray(1.0 / sds)
    rot = None if rotation is None else np.asarray(rotation)

    def logdensity(p):
        import jax.numpy as jnp

        x = p["x"]
        y = x if rot is None else jnp.asarray(rot, x.dtype).T @ x
        return -0.5 * jnp.sum((y * jnp.asarray(inv, x.dtype)) ** 2)

    return logdensity


FUNNEL_V_SD = 3.0
FUNNEL_DIM = 10


def funnel_logdensity(p):
    """Neal's funnel, non-centred: v ~ N(0, 3), z ~ N(0, I_9) (x = exp(v/2) z is the centred coordinate)."""
    import jax.numpy as jnp

    return -0.5 * (p["v"] / FUNNEL_V_SD) ** 2 - 0.5 * jnp.sum(p["z"] ** 2)


class Problem:
    """What each sampler needs: dhmc's target, NumPyro's kernel inputs, a JAX log density, its init, and
    the quantities scored (``quantities``) with their reference moments (``moments``; None: not checked)."""

    def __init__(self, name: str):
        import numpy as np

        self.name = name
        self.moments, self.required, self.post = None, None, None
        self.expect_unbiased = True
        self.numpyro_model, self.numpyro_args = None, ()
        self.route = name.split(":")[1] if name in ROUTES else None  # dhmc samples route_model with this option
        # True (noncentered, laplace); the peers, the log density
        self.route_model = None
        self.init_radius = 0.5  # dhmc's jitter of a log-density init
        self.x64, self.dense_mass = False, False
        self.x2_moments = None  # {quantity: (E[x^2], Var[x^2])} where the Gaussian formula does not hold
        if name == "eight_schools":
            from dhmc.models.examples import EIGHT_SCHOOLS_SIGMA, EIGHT_SCHOOLS_Y, eight_schools_model

            self.logdensity = eight_schools_logdensity(EIGHT_SCHOOLS_SIGMA, EIGHT_SCHOOLS_Y)
            self.init = {"mu": np.zeros(()), "log_tau": np.zeros(()), "theta_tilde": np.zeros(8)}
            self.init_radius = 2.0  # NumPyro's init_to_uniform: U(-2, 2) in unconstrained space
            self.dhmc_target, self.dhmc_kwargs = "eight_schools", {}
            self.numpyro_model = eight_schools_model
            self.numpyro_args = (EIGHT_SCHOOLS_SIGMA, EIGHT_SCHOOLS_Y)
            return
        if name in ("gauss100", "gauss100_rot"):
            sds = gauss_sds(100)
            rot = gauss_rotation(100) if name == "gauss100_rot" else None
            self.logdensity = gauss_logdensity(sds, rot)
            self.init = {"x": np.zeros(100)}
            marginal = sds if rot is None else np.sqrt((rot**2) @ sds**2)
            self.moments = {f"x[{i}]": (0.0, float(s), 0.0) for i, s in enumerate(marginal)}
        elif name.split(":")[0] in LAPS:
            from benchmarks import laps_targets

            self.logdensity, self.init = laps_targets.target(name.split(":")[0])
            if self.route:
                self.route_model = laps_targets.brownian_model
            ref = laps_targets.reference(name.split(":")[0])
            self.moments = {k: (m, s, se) for k, (m, s, se, _, _) in ref.items()}
            self.x2_moments = {k: (e2, v2) for k, (_, _, _, e2, v2) in ref.items()}
        elif name == "funnel":
            self.logdensity = funnel_logdensity
            self.init = {"v": np.zeros(()), "z": np.zeros(FUNNEL_DIM - 1)}
            self.moments = {"v": (0.0, FUNNEL_V_SD, 0.0), **{f"z[{i}]": (0.0, 1.0, 0.0) for i in range(FUNNEL_DIM - 1)}}
            # x_i = exp(v/2) z_i: mean 0, sd sqrt(E[exp(v)]) = exp(v_sd^2 / 4); heavy-tailed, reported apart
            self.extra_moments = {f"x[{i}]": (0.0, math.exp(FUNNEL_V_SD**2 / 4), 0.0) for i in range(FUNNEL_DIM - 1)}
        else:
            from tests.validation.posteriors import get

            post = get(name.split(":")[0])
            self.name, self.post = post.name, post
            self.route_model = post.numpyro_model if self.route else None
            self.x64, self.dense_mass = post.x64, post.dense_mass
            self.logdensity, self.init = post.logdensity, post.init
            self.expect_unbiased = post.expect_unbiased
        self.required = None if self.post is not None else list(self.moments)
        self.dhmc_target = self.logdensity
        self.dhmc_kwargs = {"init": self.init}  # dhmc's defaults: dense_mass=None (its warmup chooses the metric)

    def quantities(self, position: dict, numpyro: bool = False) -> dict:
        """``{name: (chain, draw)}`` whose minimum ESS is the score and whose moments are checked; ``numpyro``:
        ``position`` holds the NumPyro model's sites (a route's)."""
        import numpy as np

        if numpyro and self.post is not None:
            return _scalars(self.post.numpyro_to_reference(position))
        if self.name == "eight_schools":
            p = {k: np.asarray(v, np.float64) for k, v in position.items()}
            if "tau" not in p:
                p["tau"] = np.exp(p.pop("log_tau"))
            if "theta" not in p:
                p["theta"] = p["mu"][..., None] + p["tau"][..., None] * p["theta_tilde"]
            return _scalars({k: p[k] for k in ("mu", "tau", "theta_tilde", "theta")})
        if self.post is not None:
            return _scalars(self.post.to_reference(position))
        return _scalars({k: position[k] for k in self.init})

    def extra_quantities(self, position: dict) -> dict:
        """Reported but not part of the score or the pass/fail: the funnel's centred x."""
        import numpy as np

        if self.name != "funnel":
            return {}
        v, z = np.asarray(position["v"], np.float64), np.asarray(position["z"], np.float64)
        return _scalars({"x": np.exp(v / 2)[..., None] * z})

    def starts(self, chains: int, seed: int):
        """``{name: (chains, ...)}``: the init plus U(-r, r) per coordinate."""
        import numpy as np

        rng = np.random.default_rng(seed)
        dtype = np.float64 if self.x64 else np.float32
        return {k: (np.asarray(v) + rng.uniform(-self.init_radius, self.init_radius, (chains, *np.shape(v))))
                .astype(dtype) for k, v in self.init.items()}


# -- scoring --------------------------------------------------------------------------------------------------


def ess_table(q: dict, method: str) -> dict:
    import warnings

    import arviz as az

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ess = az.ess(az.convert_to_dataset(q), method=method)
    return {k: float(ess[k].values) for k in q}


def check(q: dict, name: str, moments, required) -> dict:
    """``tests/validation/compare.py``'s verdict, summarised."""
    from tests.validation.compare import compare

    rep = compare(q, name, moments=moments, required=required)
    zs = {p.name: p.z for p in rep.params}
    worst_z = max(zs, key=lambda k: abs(zs[k])) if zs else None
    # how far each sd ratio is from 1 in units of its tolerance (> 1: outside)
    sd_excess = {p.name: abs(p.sd_ratio - 1) / p.sd_tol for p in rep.params}
    worst_sd = max(sd_excess, key=sd_excess.get) if sd_excess else None
    return {
        "max_abs_z": rep.max_abs_z, "max_abs_z_param": worst_z,
        "sd_ok": all(p.sd_ok for p in rep.params) and bool(rep.params),
        "worst_sd_param": worst_sd, "worst_sd_ratio": next((p.sd_ratio for p in rep.params if p.name == worst_sd), None),
        "worst_sd_tol": next((p.sd_tol for p in rep.params if p.name == worst_sd), None),
        "correct": rep.passed, "missing": list(rep.missing), "nonfinite": list(rep.nonfinite),
        "failures": [p.line() for p in rep.failures][:10],
    }


def score(problem: Problem, position: dict, numpyro: bool = False) -> dict:
    """Min bulk/tail ESS over the reference quantities, and the moments against the reference."""
    q = problem.quantities(position, numpyro)
    bulk, tail = ess_table(q, "bulk"), ess_table(q, "tail")
    worst, worst_tail = min(bulk, key=bulk.get), min(tail, key=tail.get)
    out = {"min_ess_bulk": bulk[worst], "min_ess_param": worst, "min_ess_tail": tail[worst_tail],
           "min_ess_tail_param": worst_tail, "ess_bulk": bulk, "ess_tail": tail}
    if problem.post is not None:
        out.update(check(q, problem.name, None, None))
    elif problem.moments is not None:
        out.update(check(q, problem.name, problem.moments, problem.required))
    extra = problem.extra_quantities(position)
    if extra:
        xb = ess_table(extra, "bulk")
        xc = check(extra, problem.name, problem.extra_moments, list(problem.extra_moments))
        out["extra"] = {"min_ess_bulk": min(xb.values()), "max_abs_z": xc["max_abs_z"],
                        "worst_sd_ratio": xc["worst_sd_ratio"], "worst_sd_tol": xc["worst_sd_tol"],
                        "passed": xc["correct"],
                        "note": "x = exp(v/2) z, heavy-tailed: not part of the score or the pass/fail"}
    return out


# -- one sampler (child process) -------------------------------------------------------------------------


def child(cfg: dict) -> dict:
    out = {**cfg}
    try:
        return _child(cfg, out)
    except Exception as e:  # recorded in the row; the run goes on
        out["error"] = f"{type(e).__name__}: {e}"
        out["stderr_tail"] = traceback.format_exc()[-3000:]
        return out


def _child(cfg: dict, out: dict) -> dict:
    import jax
    import numpy as np

    problem = Problem(cfg["problem"])
    if problem.x64:
        jax.config.update("jax_enable_x64", True)
    sampler = cfg["sampler"]
    if sampler in DHMC_KERNELS:
        import dhmc
        import dhmc.api  # noqa: F401
        from dhmc.diagnostics import ebfmi

        t = time.perf_counter()
        warmup = cfg.get("dhmc_warmup", "auto")
        warmup = warmup if warmup == "auto" else int(warmup)
        target, kwargs = problem.dhmc_target, problem.dhmc_kwargs
        if problem.route:  # a documented route: the NumPyro model, its hierarchy reparameterised by dhmc
            target = problem.route_model
            kwargs = {problem.route: True}
        with recording_convergence(out):
            tree = dhmc.sample(target, chains=cfg["dhmc_chains"], draws=cfg["draws"], warmup=warmup,
                               seed=cfg["seed"], kernel=DHMC_KERNELS[sampler], progress=False, **kwargs)
        out["ebfmi"] = ebfmi(tree)  # NaN for MAMS, whose energy is -log p alone
        post = {k: v.values for k, v in tree["posterior"].data_vars.items()}
        out["total_s"] = time.perf_counter() - t
        timing = json.loads(tree["posterior"].attrs["dhmc_timing"])
        out["dhmc_timing"] = timing
        out["sampling_s"] = timing["sampling"] + timing["writing"]
        out["warmup_s"] = timing["warmup"]
        out["chains"] = cfg["dhmc_chains"]
        stats = tree["sample_stats"]
        out["divergences"] = int(stats["diverging"].values.sum())
        out["mean_acceptance"] = float(stats["acceptance_rate"].values.mean())
        out["mean_n_steps"] = float(stats["n_steps"].values.mean())
        out["step_size"] = float(stats["step_size"].values.mean())
        history = json.loads(tree["posterior"].attrs.get("dhmc_warmup", "[]"))
        out["warmup_history"] = history
        # each leapfrog (velocity-Verlet) step is one gradient; the warmup's own count, per round, all chains
        # (dhmc's initial step-size search is not in it: a few gradients per chain)
        out["warmup_grads"] = int(sum(int(r.get("grad_evals", 0)) for r in history))
        out["sampling_grads"] = int(stats["n_steps"].values.sum(dtype="int64"))
        if problem.name != "eight_schools" and not problem.route:
            post = {k: v for k, v in post.items() if k in problem.init}
    elif sampler == "numpyro":
        post = _numpyro(problem, cfg, out)
    elif sampler == "blackjax":
        post = _blackjax_chees(problem, cfg, out)
    elif sampler == "blackjax-mams":
        post = _blackjax_mams(problem, cfg, out)
    else:
        raise ValueError(f"unknown sampler {sampler!r}")
    out["draws_total"] = out["chains"] * cfg["draws"]
    out["total_grads"] = out["warmup_grads"] + out["sampling_grads"]
    out.update(score(problem, {k: np.asarray(v) for k, v in post.items()}, bool(problem.route) and sampler in DHMC_KERNELS))
    out["min_ess_per_s"] = out["min_ess_bulk"] / out["total_s"]
    if out.get("sampling_s"):
        out["min_ess_per_s_sampling"] = out["min_ess_bulk"] / out["sampling_s"]
    out["min_ess_per_1k_grads"] = 1000 * out["min_ess_bulk"] / out["total_grads"] if out["total_grads"] else None
    out["expect_unbiased"] = problem.expect_unbiased
    return out


def _numpyro(problem: Problem, cfg: dict, out: dict) -> dict:
    import jax
    import numpy as np
    from numpyro.infer import MCMC, NUTS

    chains, warmup, draws = cfg["numpyro_chains"], cfg["warmup"], cfg["draws"]
    t = time.perf_counter()
    if problem.numpyro_model is not None:
        kernel, init = NUTS(problem.numpyro_model), None
    else:
        kernel = NUTS(potential_fn=lambda p: -problem.logdensity(p), dense_mass=problem.dense_mass)
        init = problem.starts(chains, cfg["seed"])
    mcmc = MCMC(kernel, num_warmup=warmup, num_samples=draws, num_chains=chains,
                chain_method=cfg["numpyro_chain_method"], progress_bar=False)
    args = problem.numpyro_args
    fields = ("diverging", "num_steps", "energy")
    if cfg.get("numpyro_split"):
        # warmup() then run(): both phases timed, but NumPyro compiles again for run() (per chain if sequential)
        key_warm, key_run = jax.random.split(jax.random.PRNGKey(cfg["seed"]))
        mcmc.warmup(key_warm, *args, init_params=init, extra_fields=fields, collect_warmup=True)
        warm_steps = int(np.asarray(mcmc.get_extra_fields()["num_steps"]).sum(dtype=np.int64))
        jax.block_until_ready(mcmc.post_warmup_state)
        t1 = time.perf_counter()
        mcmc.run(key_run, *args, extra_fields=fields)
        samples = mcmc.get_samples(group_by_chain=True)
        extra = mcmc.get_extra_fields(group_by_chain=True)
        skip = 0
    else:
        # one run() as a user would call it (warmup and sampling in one compiled loop per chain), collecting the
        # warmup iterations too (NumPyro's collection window starts at 0 instead of num_warmup) so that their
        # leapfrog steps can be counted; only the post-warmup draws are scored
        t1, warm_steps, skip = None, None, warmup
        mcmc._set_collection_params(0, warmup + draws, None)
        mcmc.run(jax.random.PRNGKey(cfg["seed"]), *args, init_params=init, extra_fields=fields)
        samples = mcmc.get_samples(group_by_chain=True)
        extra = mcmc.get_extra_fields(group_by_chain=True)
    jax.block_until_ready(samples)
    t2 = time.perf_counter()
    steps = np.asarray(extra["num_steps"], np.int64)
    if skip:
        assert steps.shape[1] == warmup + draws, steps.shape
        warm_steps = int(steps[:, :skip].sum())
    out.update(total_s=t2 - t, warmup_s=t1 and t1 - t, sampling_s=t1 and t2 - t1, chains=chains,
               warmup_grads=warm_steps, sampling_grads=int(steps[:, skip:].sum()),
               divergences=int(np.asarray(extra["diverging"])[:, skip:].sum()),
               mean_n_steps=float(steps[:, skip:].mean()))
    from dhmc.stats import ebfmi

    energy = np.asarray(extra["energy"], np.float64)[:, skip:]  # E-BFMI: the ensemble's (dhmc's) and Stan's per chain
    out.update(ebfmi=ebfmi(energy), ebfmi_per_chain_min=float(min(ebfmi(e[None]) for e in energy)))
    return {k: np.asarray(v)[:, skip:] for k, v in samples.items()}


def _blackjax_chees(problem: Problem, cfg: dict, out: dict) -> dict:
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
    mass = None if cfg.get("blackjax_chees_mass", "diagonal") == "none" else "diagonal"
    warmup = blackjax.chees_adaptation(logdensity, num_chains=chains, mass_matrix_estimation=mass,
                                       adaptation_info_fn=get_filter_adapt_info_fn(info_keys={"num_integration_steps"}))
    (states, parameters), winfo = warmup.run(key_warm, positions, step_size=0.1, optim=optax.adam(0.025),
                                             num_steps=cfg["warmup"])
    jax.block_until_ready(states)
    t1 = time.perf_counter()
    warm_grads = int(np.asarray(winfo.info.num_integration_steps, np.int64).sum())
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
    n_steps = np.asarray(n_steps, np.int64)
    out.update(total_s=t2 - t, warmup_s=t1 - t, sampling_s=t2 - t1, chains=chains,
               divergences=int(np.asarray(divergent).sum()), mean_n_steps=float(n_steps.mean()),
               step_size=float(parameters["step_size"]), warmup_grads=warm_grads,
               sampling_grads=int(n_steps.sum()), blackjax_chees_mass=mass)
    return {k: np.swapaxes(np.asarray(v), 0, 1) for k, v in draws_.items()}  # (draw, chain) -> (chain, draw)


MCLACHLAN_GRADS_PER_STEP = 2  # b1 a1 b2 a1 b1: two new gradients a step (the last one is reused by the next)


def _blackjax_mams(problem: Problem, cfg: dict, out: dict) -> dict:
    """BlackJAX adjusted MCLMC ("MAMS"), per-chain tuning vmapped over the ensemble, then vmapped sampling."""
    import blackjax
    import jax
    import jax.numpy as jnp
    import numpy as np
    from blackjax.mcmc import adjusted_mclmc_dynamic as amd

    chains, warmup, draws = cfg["blackjax_chains"], cfg["warmup"], cfg["draws"]
    logdensity = problem.logdensity
    positions = jax.tree.map(jnp.asarray, problem.starts(chains, cfg["seed"]))
    key_warm, key_run = jax.random.split(jax.random.PRNGKey(cfg["seed"]))
    kernel = amd.build_kernel(integration_steps_fn=amd.make_random_trajectory_length_fn(True))
    target = cfg.get("mams_target_accept", 0.9)
    avg_steps = cfg.get("mams_steps", 2.0)  # BlackJAX 1.7's default: L = 2 x step size (its docstring's choice)
    t = time.perf_counter()

    @jax.jit
    def tune(positions, key):
        def one(position, k):
            k_init, k_tune = jax.random.split(k)
            state = amd.init(position, logdensity, k_init)
            return blackjax.adjusted_mclmc_find_L_and_step_size(
                mclmc_kernel=kernel, logdensity_fn=logdensity, num_steps=warmup, state=state, rng_key=k_tune,
                target=target, frac_tune1=1 / 3, frac_tune2=1 / 3, frac_tune3=0.0, diagonal_preconditioning=True,
                target_num_integration_steps=avg_steps)

        return jax.vmap(one)(positions, jax.random.split(key, chains))

    states, params, tune_steps = tune(positions, key_warm)
    jax.block_until_ready(states)
    t1 = time.perf_counter()

    @jax.jit
    def sample(states, params, key):
        def one(state, p, k):
            def step(st, kk):
                st, info = kernel(kk, st, logdensity, p.step_size, jnp.inf, p.inverse_mass_matrix,
                                  (p.L / p.step_size,))
                return st, (st.position, info.is_divergent, info.num_integration_steps, info.acceptance_rate)

            return jax.lax.scan(step, state, jax.random.split(k, draws))[1]

        return jax.vmap(one)(states, params, jax.random.split(key, chains))

    draws_, divergent, n_steps, acc = sample(states, params, key_run)
    jax.block_until_ready(draws_)
    t2 = time.perf_counter()
    n_steps = np.asarray(n_steps, np.int64)
    out.update(total_s=t2 - t, warmup_s=t1 - t, sampling_s=t2 - t1, chains=chains,
               divergences=int(np.asarray(divergent).sum()), mean_n_steps=float(n_steps.mean()),
               mean_acceptance=float(np.asarray(acc).mean()),
               step_size=float(np.median(np.asarray(params.step_size))),
               L_median=float(np.median(np.asarray(params.L))),
               warmup_grads=MCLACHLAN_GRADS_PER_STEP * int(np.asarray(tune_steps, np.int64).sum()),
               sampling_grads=MCLACHLAN_GRADS_PER_STEP * int(n_steps.sum()),
               grads_per_step=MCLACHLAN_GRADS_PER_STEP, target_accept=target, target_num_integration_steps=avg_steps)
    return {k: np.asarray(v) for k, v in draws_.items()}  # vmapped over chains: already (chain, draw)


# -- driver --------------------------------------------------------------------------------------------------

COLUMNS = [
    ("label", "posterior", ""), ("sampler", "sampler", ""), ("chains", "chains", "d"),
    ("total_s", "total s", ".1f"), ("sampling_s", "sampling s", ".1f"), ("total_grads", "grads", ".3g"),
    ("min_ess_bulk", "min bulk ESS", ",.0f"), ("min_ess_param", "worst", ""), ("min_ess_tail", "min tail ESS", ",.0f"),
    ("min_ess_per_s", "ESS/s", ",.1f"), ("min_ess_per_s_sampling", "ESS/s sampling", ",.1f"),
    ("min_ess_per_1k_grads", "ESS/1k grads", ".3g"), ("max_abs_z", "max \\|z\\|", ".2f"), ("sd_ok", "sd ok", ""),
    ("correct", "correct", ""), ("divergences", "div", "d"), ("mean_n_steps", "steps/draw", ".1f"),
]


def md_table(rows: list[dict], columns) -> str:
    def cell(r, key, fmt):
        v = r.get(key)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        if isinstance(v, bool):
            return "yes" if v else "**no**"
        return format(v, fmt) if fmt else str(v)

    lines = ["| " + " | ".join(h for _, h, _ in columns) + " |",
             "|" + "|".join("---" if not fmt else "---:" for _, _, fmt in columns) + "|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['label']} | {r['sampler']} | error: {r['error'][:120].replace('|', '/')} |")
        else:
            lines.append("| " + " | ".join(cell(r, k, f) for k, _, f in columns) + " |")
    return "\n".join(lines)


def summarise(rows: list[dict]) -> dict:
    """Per dhmc kernel and problem: min ESS/s and min ESS per 1000 gradients relative to NumPyro NUTS; their
    median over the reference posteriors that ran (first repeat only)."""
    by = {(r["problem"], r["sampler"]): r for r in rows if r.get("repeat", 0) == 0 and "error" not in r}
    out = {}
    for sampler in [s for s in ALL_SAMPLERS if s != "numpyro"]:
        per = {}
        for problem in dict.fromkeys(r["problem"] for r in rows):
            a, b = by.get((problem, sampler)), by.get((problem, "numpyro"))
            if a is None or b is None:
                continue
            per[problem] = {
                "ess_per_s_ratio": a["min_ess_per_s"] / b["min_ess_per_s"] if b["min_ess_per_s"] else None,
                "ess_per_1k_grads_ratio": (a["min_ess_per_1k_grads"] / b["min_ess_per_1k_grads"]
                                           if b.get("min_ess_per_1k_grads") else None),
                "correct": a.get("correct"), "numpyro_correct": b.get("correct"),
            }
        if not per:
            continue
        ref = [p for p in per if p in REFERENCE]
        def med(key, per=per, ref=ref):
            values = [per[p][key] for p in ref if per[p][key] is not None]
            return statistics.median(values) if values else None

        out[sampler] = {"per_problem": per, "reference_posteriors": len(ref),
                        "median_ess_per_s_ratio": med("ess_per_s_ratio"),
                        "median_ess_per_1k_grads_ratio": med("ess_per_1k_grads_ratio"),
                        "min_ess_per_s_ratio": min((per[p]["ess_per_s_ratio"] for p in ref), default=None),
                        "all_reference_correct": all(per[p]["correct"] for p in ref) if ref else None}
    return out


def summary_markdown(summary: dict) -> str:
    if not summary:
        return "(no sampler with a NumPyro NUTS row on the same problem: no ratios)"
    parts = []
    for sampler, s in summary.items():
        lines = [f"**{sampler} / NumPyro NUTS**", "", "| posterior | min ESS/s ratio | min ESS/1k grads ratio | correct "
                 "| NUTS correct |", "|---|---:|---:|---|---|"]
        f = lambda v: "-" if v is None else f"{v:.2f}"
        yn = lambda v: "-" if v is None else ("yes" if v else "**no**")
        for p, d in s["per_problem"].items():
            lines.append(f"| {label(p)} | {f(d['ess_per_s_ratio'])} | {f(d['ess_per_1k_grads_ratio'])} | "
                         f"{yn(d['correct'])} | {yn(d['numpyro_correct'])} |")
        lines.append(f"| **median over {s['reference_posteriors']} reference posteriors** | "
                     f"**{f(s['median_ess_per_s_ratio'])}** | **{f(s['median_ess_per_1k_grads_ratio'])}** | "
                     f"{yn(s['all_reference_correct'])} | |")
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--all", action="store_true",
                    help=f"every problem ({', '.join(map(label, ALL_PROBLEMS))}) x every sampler "
                         f"({', '.join(ALL_SAMPLERS)}); JSON to results/ess_all.json unless --out")
    ap.add_argument("--samplers", default=None, type=lambda s: [x for x in s.split(",") if x],
                    help=f"comma-separated, of {', '.join(ALL_SAMPLERS)} (default: {', '.join(DEFAULT_SAMPLERS)})")
    ap.add_argument("--problems", "--reference", dest="problems", default=None,
                    type=lambda s: [x for x in s.split(",") if x],
                    help="comma-separated: reference posteriors (prefixes such as kidiq work), gauss100, funnel, "
                         "gauss100_rot, eight_schools (default: eight_schools)")
    ap.add_argument("--warmup", type=int, default=1000, help="warmup iterations of the peers (NumPyro's default)")
    ap.add_argument("--dhmc-warmup", default="auto", help="dhmc's warmup: auto (its default) or a number")
    ap.add_argument("--draws", type=int, default=1000)
    ap.add_argument("--dhmc-chains", type=int, default=128)
    ap.add_argument("--blackjax-chains", type=int, default=128, help="chains of both BlackJAX samplers")
    ap.add_argument("--blackjax-chees-mass", default="diagonal", choices=("diagonal", "none"),
                    help="BlackJAX ChEES: estimate a diagonal mass matrix in warmup (default) or keep the identity")
    ap.add_argument("--mams-target-accept", type=float, default=0.9, help="BlackJAX adjusted MCLMC tuning target")
    ap.add_argument("--mams-steps", type=float, default=2.0,
                    help="BlackJAX adjusted MCLMC: target_num_integration_steps (mean steps a trajectory; "
                         "BlackJAX 1.7's default 2)")
    ap.add_argument("--numpyro-chains", type=int, default=4)
    ap.add_argument("--numpyro-chain-method", default="sequential", choices=("sequential", "vectorized"))
    ap.add_argument("--numpyro-split", action="store_true",
                    help="time NumPyro's warmup() and run() apart (costs it a second compile); default: one run()")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=900, help="seconds per measurement")
    ap.add_argument("--quick", action="store_true", help="100 warmup + 100 draws, 32 ensemble chains")
    args = parse_args_or_run_child(ap, argv, child, "ess.json")
    if args is None:
        return 0
    if args.quick:
        args.warmup, args.draws, args.dhmc_chains, args.blackjax_chains = 100, 100, 32, 32
    if args.all and args.out == str(RESULTS / "ess.json"):
        args.out = str(RESULTS / "ess_all.json")
    problems = [resolve_problem(p) for p in (args.problems or (ALL_PROBLEMS if args.all else ["eight_schools"]))]

    samplers = args.samplers or list(ALL_SAMPLERS if args.all else DEFAULT_SAMPLERS)
    unknown = [s for s in samplers if s not in ALL_SAMPLERS]
    if unknown:
        ap.error(f"unknown sampler(s) {unknown}; choose from {list(ALL_SAMPLERS)}")
    env = {"JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu")}
    rows, started = [], time.perf_counter()
    settings = {k: v for k, v in vars(args).items() if k not in ("child", "out")}
    settings.update(problems_run=problems, samplers_run=samplers)

    def save():
        payload = {"benchmark": "ess", "machine": machine(), "wall_s": time.perf_counter() - started,
                   "settings": settings, "summary": summarise(rows),
                   "notes": ["min bulk ESS (ArviZ) over the reference quantities; /s over the whole call incl. "
                             "compile, warmup (and dhmc's cluster start); sampling-only includes the sampling "
                             "phase's compile; grads = warmup + sampling gradient evaluations",
                             "correctness as tests/validation/compare.py: max|z| < 4.5, |sd/sd_ref - 1| < "
                             "max(0.05, 3/sqrt(ESS))"],
                   "runs": rows}
        return write_json(args.out, payload)

    for rep in range(args.repeat):
        for problem in problems:
            for sampler in samplers:
                cfg = {"problem": problem, "sampler": sampler, "warmup": args.warmup, "draws": args.draws,
                       "dhmc_warmup": args.dhmc_warmup,
                       "seed": args.seed + rep, "dhmc_chains": args.dhmc_chains,
                       "blackjax_chains": args.blackjax_chains, "numpyro_chains": args.numpyro_chains,
                       "numpyro_chain_method": args.numpyro_chain_method, "numpyro_split": args.numpyro_split,
                       "blackjax_chees_mass": args.blackjax_chees_mass,
                       "mams_target_accept": args.mams_target_accept, "mams_steps": args.mams_steps}
                t = time.perf_counter()
                rec = run_child(__spec__.name, cfg, args.timeout, env)
                rec = {**cfg, **rec, "label": label(problem), "repeat": rep, "loadavg_after": os.getloadavg()[0]}
                rows.append(rec)
                if "error" in rec:
                    msg = "ERROR " + rec["error"][:200]
                else:
                    z = rec.get("max_abs_z")
                    msg = (f"{rec['total_s']:.1f} s, min ESS {rec['min_ess_bulk']:.0f} ({rec['min_ess_param']}), "
                           f"{rec['min_ess_per_s']:.1f}/s, {rec['min_ess_per_1k_grads']:.3g}/1k grads"
                           + ("" if z is None else f", max|z| {z:.2f}, correct {rec.get('correct')}"))
                print(f"[{time.perf_counter() - t:6.1f} s] {label(problem)} {sampler}: {msg}", flush=True)
                save()  # after every measurement: a long run that dies keeps what it measured
    return finish(save(), rows, lambda r: f"{r['problem']} {r['sampler']}",
                    [md_table(rows, COLUMNS), summary_markdown(summarise(rows))], started)


if __name__ == "__main__":
    sys.exit(main())

"""Shared pieces of the benchmarks: targets, the reference samplers, timing, machine facts, JSON.

Every sampler here runs the same fixed-step HMC (Gaussian momentum, identity mass matrix, leapfrog,
Metropolis test) on the same unconstrained log density from the same starting points, so their times
compare equal work: chains x draws x num_steps gradient evaluations.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"


# -- machine and output -------------------------------------------------------------------------------------


def machine() -> dict:
    """Facts that make a number interpretable: cores, load, versions, date."""
    import importlib.metadata as md

    versions = {}
    for name in ("jax", "jaxlib", "numpyro", "blackjax", "dask", "distributed", "zarr", "xarray", "arviz", "dhmc"):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    info = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "cores_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "loadavg_1_5_15": load,
        "versions": versions,
        "jax_platforms": os.environ.get("JAX_PLATFORMS"),
    }
    try:
        import psutil

        info["memory_gib"] = round(psutil.virtual_memory().total / 2**30, 1)
    except ImportError:
        pass
    return info


def write_json(path: str | Path, payload: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2, default=_jsonable) + "\n")
    return path


def _jsonable(x):
    import numpy as np

    if isinstance(x, np.generic):
        return x.item()
    if isinstance(x, np.ndarray):
        return x.tolist()
    return str(x)


def table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
    """A plain-text table: ``columns`` is ``[(key, header, format)]``; missing values print as '-'."""
    head = [h for _, h, _ in columns]
    body = []
    for r in rows:
        line = []
        for key, _, fmt in columns:
            v = r.get(key)
            line.append("-" if v is None else (format(v, fmt) if fmt else str(v)))
        body.append(line)
    widths = [max(len(h), *(len(b[i]) for b in body)) if body else len(h) for i, h in enumerate(head)]
    fmt_line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths, strict=True))
    return "\n".join([fmt_line(head), fmt_line(["-" * w for w in widths]), *map(fmt_line, body)])


def run_child(argv: list[str], timeout: float, env: dict | None = None) -> dict:
    """Run ``python argv...`` in a fresh process; its last stdout line is a JSON record.

    A fresh process per measurement keeps one sampler's compiled programs, caches and memory out
    of the next one's numbers. Failures come back as ``{"error": ...}`` records, never raised.
    """
    full_env = {**os.environ, **(env or {})}
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    t = time.perf_counter()
    try:
        proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=timeout, env=full_env,
                              cwd=str(HERE))
    except subprocess.TimeoutExpired as e:
        return {"error": f"timed out after {timeout:.0f} s", "stderr_tail": _tail(e.stderr)}
    wall = time.perf_counter() - t
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": f"exit status {proc.returncode}", "stderr_tail": _tail(proc.stderr),
                "stdout_tail": _tail(proc.stdout)}
    record = json.loads(lines[-1])
    record["process_wall_s"] = wall
    return record


def run_child_fresh_cache(argv: list[str], timeout: float, env: dict | None = None, cache: str = "fresh") -> dict:
    """``run_child`` with dhmc's persistent compilation cache set per ``cache``.

    ``fresh``: an empty cache folder for this process only (dhmc's workers share compiled programs through it,
    as they do for a user, but nothing from an earlier run is reused: cold stays cold); ``off``: no cache;
    ``user``: dhmc's default folder, possibly warm from earlier runs (what the contract check sees).
    """
    import shutil
    import tempfile

    env = dict(env or {})
    folder = None
    if cache == "off":
        env["DHMC_COMPILATION_CACHE"] = "0"
    elif cache == "fresh":
        folder = tempfile.mkdtemp(prefix="dhmc-bench-cache-")
        env["DHMC_CACHE_DIR"] = folder
        env["DHMC_COMPILATION_CACHE"] = "1"
    try:
        return run_child(argv, timeout, env)
    finally:
        if folder:
            shutil.rmtree(folder, ignore_errors=True)


def _tail(text, n: int = 2000) -> str:
    if text is None:
        return ""
    if isinstance(text, bytes):
        text = text.decode(errors="replace")
    return text[-n:]


def emit(record: dict) -> None:
    """Print a child's result as the last line of its stdout."""
    print(json.dumps(record, default=_jsonable), flush=True)


def parse_args_or_run_child(ap: argparse.ArgumentParser, argv, child, out_name: str):
    """Add ``--out`` (default ``results/<out_name>``) and the hidden ``--child``, and parse.

    In a child process (``--child CONFIG``) run ``child(config)``, emit its record and return None.
    """
    ap.add_argument("--out", default=str(RESULTS / out_name))
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        emit(child(json.loads(args.child)))
        return None
    return args


def report_errors(rows: list[dict], label, tail: int = 1500) -> int:
    """Print every failed measurement (``label(row)`` names it) and return the exit code: 1 if any failed."""
    failed = [r for r in rows if "error" in r]
    for r in failed:
        print(f"ERROR {label(r)}: {r['error']}\n{r.get('stderr_tail', '')[-tail:]}")
    return 1 if failed else 0


def finish(path, rows: list[dict], label, sections, started: float | None = None, tail: int = 1500) -> int:
    """A benchmark's end: its tables (each after a blank line), every failed measurement, where the JSON
    went (and the seconds since ``started``); returns the exit code (:func:`report_errors`)."""
    for text in sections:
        print()
        print(text)
    code = report_errors(rows, label, tail)
    took = "" if started is None else f" ({time.perf_counter() - started:.0f} s)"
    print(f"\nwrote {path}{took}")
    return code


def timed(fn):
    """``(seconds, result)`` of ``fn()``, with every JAX array in the result ready."""
    import jax

    t = time.perf_counter()
    out = fn()
    jax.block_until_ready(out)
    return time.perf_counter() - t, out


# -- targets --------------------------------------------------------------------------------------------------


class Target:
    """A benchmark target: one chain's log density on a dict position, its NumPyro twin, start points.

    ``logdensity(position_dict)``; ``flat(q)`` the same on one flat vector (name ``key``);
    ``numpyro_model`` samples site ``key`` whose unconstrained value is that vector, so NumPyro's
    ``init_params={key: init}`` starts at the same points.
    """

    def __init__(self, name, key, dim, logdensity, numpyro_model, init_scale=0.1, seed=0, init_fn=None,
                 numpyro_site=None):
        self.name, self.key, self.dim = name, key, dim
        self.logdensity, self.numpyro_model = logdensity, numpyro_model
        self.init_scale, self.seed, self.init_fn = init_scale, seed, init_fn
        self.numpyro_site = numpyro_site or key

    def flat(self, q):
        return self.logdensity({self.key: q})

    def init(self, chains: int):
        """Starting points ``(chains, dim)``, float32, the same for every sampler."""
        import numpy as np

        if self.init_fn is not None:
            return self.init_fn(chains)
        rng = np.random.default_rng(self.seed + 1)
        return (rng.normal(size=(chains, self.dim)) * self.init_scale).astype(np.float32)


def logistic_regression(n: int = 1000, d: int = 10, seed: int = 0) -> Target:
    """The contract's target: Bayesian logistic regression, N(0, 1) prior on the weights."""
    import jax.numpy as jnp
    import numpy as np

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, d)).astype(np.float32)
    w = rng.normal(size=d).astype(np.float32)
    y = (rng.uniform(size=n) < 1 / (1 + np.exp(-X @ w))).astype(np.float32)
    Xj, yj = jnp.asarray(X), jnp.asarray(y)

    def logdensity(p):
        lg = Xj @ p["w"]
        return jnp.sum(yj * lg - jnp.logaddexp(0.0, lg)) - 0.5 * jnp.sum(p["w"] ** 2)

    def model():
        import numpyro
        import numpyro.distributions as dist

        wv = numpyro.sample("w", dist.Normal(jnp.zeros(d), 1.0).to_event(1))
        numpyro.sample("y", dist.Bernoulli(logits=Xj @ wv).to_event(1), obs=yj)

    # the contract's init: rng.normal(size=(C, D)) * 0.1 drawn after the data from the same generator
    init_fn = lambda chains: (rng_after_data(seed, n, d).normal(size=(chains, d)) * 0.1).astype(np.float32)
    return Target(f"logistic_regression_n{n}_d{d}", "w", d, logdensity, model, 0.1, seed, init_fn)


def rng_after_data(seed, n, d):
    """The generator state the contract script uses for its init (after drawing X, w, y)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    rng.normal(size=(n, d))
    rng.normal(size=d)
    rng.uniform(size=n)
    return rng


COIN_HEADS = (20, 30)
COIN_TOSSES = (40, 40)


def coin_toss() -> Target:
    """The seed project's two coins with uniform priors, in logit space (log-Jacobian included).

    Posterior: Beta(21, 21) and Beta(31, 11) on p = sigmoid(u).
    """
    import jax
    import jax.numpy as jnp

    h = jnp.asarray(COIN_HEADS, jnp.float32)
    n = jnp.asarray(COIN_TOSSES, jnp.float32)

    def logdensity(p):
        u = p["u"]
        # binomial likelihood + uniform prior + log |dp/du| = log p + log(1 - p)
        return jnp.sum((h + 1.0) * jax.nn.log_sigmoid(u) + (n - h + 1.0) * jax.nn.log_sigmoid(-u))

    def model():
        from dhmc.models.examples import coin_toss_model

        coin_toss_model(COIN_HEADS, COIN_TOSSES)

    # NumPyro's site is p in (0, 1); its unconstrained value is u = logit(p), the same coordinates
    return Target("coin_toss", "u", 2, logdensity, model, 0.1, numpyro_site="p")


def gaussian(d: int = 100) -> Target:
    """A standard normal in ``d`` dimensions (cheap gradient, wide position)."""
    import jax.numpy as jnp

    def logdensity(p):
        return -0.5 * jnp.sum(p["x"] ** 2)

    def model():
        import numpyro
        import numpyro.distributions as dist

        numpyro.sample("x", dist.Normal(jnp.zeros(d), 1.0).to_event(1))

    return Target(f"gaussian_{d}d", "x", d, logdensity, model, 1.0)


TARGETS = {"logistic": logistic_regression, "coin_toss": coin_toss, "gaussian100": gaussian}


# -- samplers: same fixed-step HMC ---------------------------------------------------------------------------


def floor_sampler(flat_logdensity, eps: float, num_steps: int, draws: int):
    """The contract's minimal hand-written vmapped HMC: ``f(keys, init) -> draws (chains, draws, d)``."""
    import jax
    import jax.numpy as jnp

    grad = jax.value_and_grad(flat_logdensity)

    def one(key, q):
        lp, g = grad(q)

        def draw(c, k):
            q, lp, g = c
            k1, k2 = jax.random.split(k)
            p0 = jax.random.normal(k1, q.shape)

            def lf(i, s):
                q, p, _, g = s
                p = p + 0.5 * eps * g
                q = q + eps * p
                lpn, g = grad(q)
                p = p + 0.5 * eps * g
                return q, p, lpn, g

            qn, pn, lpn, gn = jax.lax.fori_loop(0, num_steps, lf, (q, p0, lp, g))
            acc = jnp.log(jax.random.uniform(k2)) < (lpn - 0.5 * pn @ pn) - (lp - 0.5 * p0 @ p0)
            q, lp, g = jax.tree.map(lambda a, b: jnp.where(acc, a, b), (qn, lpn, gn), (q, lp, g))
            return (q, lp, g), q

        return jax.lax.scan(draw, (q, lp, g), jax.random.split(key, draws))[1]

    return jax.jit(jax.vmap(one))


def blackjax_sampler(flat_logdensity, eps: float, num_steps: int, draws: int, dim: int):
    """BlackJAX's ``hmc`` vmapped over chains, ``lax.scan`` over draws (as in the contract)."""
    import blackjax
    import jax
    import jax.numpy as jnp

    kern = blackjax.hmc(flat_logdensity, eps, jnp.ones(dim), num_steps)

    def one(key, q):
        step = lambda st, k: (kern.step(k, st)[0],) * 2
        return jax.lax.scan(step, kern.init(q), jax.random.split(key, draws))[1].position

    return jax.jit(jax.vmap(one))


def numpyro_mcmc(target: Target, eps: float, num_steps: int, draws: int, chains: int, chain_method: str):
    """NumPyro ``MCMC(HMC)`` with fixed step size and steps, no warmup, no adaptation.

    ``trajectory_length=None`` matters: NumPyro's default ``trajectory_length=2*pi`` together with
    ``num_steps`` silently replaces the step size by ``2*pi / num_steps`` (numpyro 0.22,
    ``hmc.py``: "makes sure trajectory length is constant"), so ``HMC(step_size=0.02, num_steps=10)``
    integrates with step 0.628. Same gradient count, different HMC.
    """
    from numpyro.infer import HMC, MCMC

    kernel = HMC(target.numpyro_model, step_size=eps, num_steps=num_steps, trajectory_length=None,
                 adapt_step_size=False, adapt_mass_matrix=False)
    return MCMC(kernel, num_warmup=0, num_samples=draws, num_chains=chains, chain_method=chain_method,
                progress_bar=False)


# -- dhmc: a timed call and where its time went ---------------------------------------------------------------


class DhmcProbe:
    """Times the phases of ``dhmc.sample`` from outside, without changing what it does.

    Wraps (in this process only) the driver's steps -- target resolution, the initial-position check
    (a driver-side JIT compile), the layout, cluster start (``connect``), the Runner's warmup and
    sampling, assembling the DataTree and the cluster shutdown (which ``dhmc_timing`` does not count)
    -- and records each block's worker-side numbers (``seconds`` of device work, ``compile_seconds``)
    plus the scheduler's task stream (per-task compute spans by worker).
    """

    def __init__(self):
        self.phases: dict[str, float] = {}
        self.blocks: list[dict] = []
        self.task_stream: list[dict] = []
        self._undo = []

    def _wrap(self, owner, name, label, after=None):
        original = getattr(owner, name)
        probe = self

        def wrapper(*args, **kwargs):
            t = time.perf_counter()
            try:
                out = original(*args, **kwargs)
            finally:
                probe.phases[label] = probe.phases.get(label, 0.0) + time.perf_counter() - t
            return after(out) if after else out

        setattr(owner, name, wrapper)
        self._undo.append((owner, name, original))

    def __enter__(self):
        import dhmc.api as api
        import dhmc.distributed.clusters as clusters
        from dhmc.distributed.runner import Runner
        from dhmc.storage import schema

        probe = self
        self.wall_start = time.time()  # the scheduler's task stream uses wall-clock times

        def after_connect(pair):
            client, close = pair
            with _suppress():
                client.get_task_stream()  # installs the scheduler's task-stream plugin from now on

            def timed_close():
                with _suppress():
                    records = client.get_task_stream()
                    probe.task_stream = _summarise_stream(records, since=probe.wall_start)
                    probe._match_blocks(records)
                t = time.perf_counter()
                try:
                    return close()
                finally:
                    probe.phases["cluster_close"] = time.perf_counter() - t

            return client, timed_close

        self._wrap(clusters, "connect", "cluster_start", after_connect)
        self._wrap(api, "resolve_target", "resolve_target")
        self._wrap(api, "initial_positions", "initial_positions")
        self._wrap(api, "layout_for", "layout")
        self._wrap(Runner, "warmup", "runner_warmup")
        self._wrap(Runner, "sample", "runner_sample")
        self._wrap(schema, "to_datatree", "to_datatree")

        original_result = Runner._result

        def _result(runner, block):
            out = original_result(runner, block)
            if out is not None:
                job = block.job
                probe.blocks.append({"phase": job.phase, "chains": job.chain_stop - job.chain_start,
                                     "iterations": job.num_iterations, "seconds": out.get("seconds"),
                                     "compile_seconds": out.get("compile_seconds"), "received": time.time(),
                                     "key": getattr(block.future, "key", None)})
            return out

        Runner._result = _result
        self._undo.append((Runner, "_result", original_result))
        return self

    def __exit__(self, *exc):
        for owner, name, original in reversed(self._undo):
            setattr(owner, name, original)
        self._undo.clear()

    def _match_blocks(self, records) -> None:
        """Per block: when its task started and stopped computing on the worker (wall clock)."""
        spans = {}
        for r in records or []:
            for ss in r.get("startstops", []):
                if ss.get("action") == "compute":
                    spans[r.get("key")] = (ss["start"], ss["stop"], r.get("worker"))
        for b in self.blocks:
            if b["key"] in spans:
                b["compute_start"], b["compute_stop"], b["worker"] = spans[b["key"]]

    def summary(self) -> dict:
        sample = [b for b in self.blocks if b["phase"] == "sample"]
        out = {"driver_phases_s": dict(self.phases), "blocks": len(self.blocks)}
        if sample:
            out["block_device_seconds_sum"] = sum(b["seconds"] for b in sample)
            out["block_compile_seconds_sum"] = sum(b["compile_seconds"] for b in sample)
            out["block_compile_seconds_max"] = max(b["compile_seconds"] for b in sample)
            out["blocks_compiled"] = sum(1 for b in sample if b["compile_seconds"] > 0)
            out["chains_per_block"] = sample[0]["chains"]
            out["iterations_per_block"] = sample[0]["iterations"]
        if self.task_stream:
            out["task_stream"] = self.task_stream
        matched = [b for b in sample if "compute_stop" in b]
        if matched:
            # the worker finished a block -> the driver had its result in hand (transfer + driver queueing)
            lags = [b["received"] - b["compute_stop"] for b in matched]
            out["result_lag_s_mean"] = sum(lags) / len(lags)
            out["result_lag_s_max"] = max(lags)
            # worker time in a task beyond the block's compile + device seconds (unpickling, imports, metrics)
            extra = [b["compute_stop"] - b["compute_start"] - b["seconds"] - b["compile_seconds"] for b in matched]
            out["task_overhead_s_mean"] = sum(extra) / len(extra)
            out["task_overhead_s_first"] = max(extra)
            first = min(b["compute_start"] for b in matched)
            out["first_task_start_after_call_s"] = first - self.wall_start
            out["last_result_after_call_s"] = max(b["received"] for b in matched) - self.wall_start
        return out


class _suppress:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return True


def _summarise_stream(records, since: float = 0.0) -> dict:
    """Per worker: tasks, busy seconds computing, first compute start / last stop (seconds after ``since``)."""
    per = {}
    for r in records or []:
        w = r.get("worker")
        for ss in r.get("startstops", []):
            if ss["start"] < since:
                continue
            d = per.setdefault(w, {"tasks": 0, "compute_s": 0.0, "transfer_s": 0.0, "deserialize_s": 0.0,
                                   "first_start": None, "last_stop": None, "first_task_s": None})
            action = ss.get("action")
            dur = ss["stop"] - ss["start"]
            if action == "compute":
                d["tasks"] += 1
                d["compute_s"] += dur
                if d["first_start"] is None or ss["start"] < d["first_start"]:
                    d["first_start"], d["first_task_s"] = ss["start"], dur
                d["last_stop"] = max(d["last_stop"] or ss["stop"], ss["stop"])
            elif action in ("transfer", "deserialize"):
                d[f"{action}_s"] += dur
    if not per:
        return {}
    t0 = since or min(d["first_start"] for d in per.values() if d["first_start"] is not None)
    for d in per.values():
        d["first_start"] = d["first_start"] - t0 if d["first_start"] is not None else None
        d["last_stop"] = d["last_stop"] - t0 if d["last_stop"] is not None else None
    return {str(k): v for k, v in per.items()}


# -- eight schools (non-centred) as a plain JAX log density ---------------------------------------------------


def eight_schools_logdensity(sigma, y):
    """Unconstrained log density of dhmc's ``eight_schools_model``: (mu, log_tau, theta_tilde).

    mu ~ N(0, 5), tau ~ HalfCauchy(5) (sampled as log tau, log-Jacobian included), theta_tilde ~ N(0, 1),
    y ~ N(mu + tau theta_tilde, sigma).
    """
    import jax.numpy as jnp

    sigma, y = jnp.asarray(sigma, jnp.float32), jnp.asarray(y, jnp.float32)

    def normal(x, loc, scale):
        return -0.5 * ((x - loc) / scale) ** 2 - jnp.log(scale) - 0.5 * jnp.log(2 * jnp.pi)

    def logdensity(p):
        mu, log_tau, tt = p["mu"], p["log_tau"], p["theta_tilde"]
        tau = jnp.exp(log_tau)
        half_cauchy = jnp.log(2.0 / (jnp.pi * 5.0)) - jnp.log1p((tau / 5.0) ** 2)
        return (normal(mu, 0.0, 5.0) + half_cauchy + log_tau + jnp.sum(normal(tt, 0.0, 1.0))
                + jnp.sum(normal(y, mu + tau * tt, sigma)))

    return logdensity

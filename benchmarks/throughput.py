"""Throughput of fixed-step HMC: dhmc vs a hand-written vmapped JAX HMC (the floor), BlackJAX, NumPyro.

Same targets, same step size, same number of leapfrog steps, same chains and draws, same starting
points, no adaptation, no warmup: every sampler does chains x draws x num_steps gradient evaluations.

* ``dhmc``: ``dhmc.sample(kernel="hmc", adapt=False, warmup=0)``. Cold: its embedded default cluster
  (``cluster=None``), so the cold time includes starting and stopping that cluster. Warm: a
  ``distributed.LocalCluster`` + ``Client`` made once, one untimed call to compile on its workers, then
  the timed call.
* ``floor``: the minimal hand-written vmapped JAX HMC of the contract check (``jax.jit(jax.vmap(one))``).
* ``blackjax``: ``blackjax.hmc`` vmapped over chains, ``lax.scan`` over draws.
* ``numpyro``: ``MCMC(HMC(...), chain_method="vectorized")``; ``numpyro_seq``: ``chain_method="sequential"``
  (only up to ``--sequential-max`` chains).

Cold = first call in a fresh process (compile included); warm = the second call in the same process.
NumPyro re-traces and recompiles on every ``MCMC.run`` (and once per chain when sequential), so its
"warm" number still includes compiling. Each (target, sampler, chains) runs in its own process.

Kernel ratio (``--kernel-ratio``, on with ``--contract``): per (target, chains), one more process pinned to
one core (``taskset -c <last core>``) runs ``dhmc_overhead.measure``: dhmc's block program (its worker's
``run_job``, no cluster) and the floor's on the same block (chains_per_task x draws_per_segment), device
seconds of each in that one process. Printed beside the totals with dhmc's own per-block device seconds in
the run (the probe's ``block_device_seconds_sum / blocks``). Writes ``results/throughput.json``.

    python -m benchmarks.throughput                         # full: 64 .. 16384 chains, 3 targets
    python -m benchmarks.throughput --contract              # the contract's case, with the kernel ratio
    python -m benchmarks.throughput --quick                 # tiny: 4 chains x 50 draws
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time

from benchmarks.harness import finish, parse_args_or_run_child, run_child, table, timed, write_json
from benchmarks.machine import cores, have_dask_cuda, machine
from benchmarks.samplers import blackjax_sampler, floor_sampler, numpyro_mcmc
from benchmarks.targets import TARGETS

METHODS = ("dhmc", "floor", "blackjax", "numpyro", "numpyro_seq")
FULL_CHAINS = (64, 256, 1024, 4096, 16384)
# the contract check (../shared/contract/throughput): logistic regression N=1000 D=10, step 0.02, 10 leapfrog steps,
# 1024 chains x 400 draws, cold, dhmc on its embedded default cluster; the same as
# --chains 1024 --targets logistic --methods dhmc,floor,blackjax,numpyro --no-warm
CONTRACT = {"targets": ["logistic"], "chains": [1024], "methods": ["dhmc", "floor", "blackjax", "numpyro"],
            "draws": 400, "num_steps": 10, "step_size": 0.02, "no_warm": True, "chains_per_task": None}


# -- one measurement (child process) -----------------------------------------------------------------------


def child(cfg: dict) -> dict:
    if cfg["method"] == "kernel":
        return _child_kernel(cfg)
    import numpy as np

    target = TARGETS[cfg["target"]]()
    chains, draws, steps, eps = cfg["chains"], cfg["draws"], cfg["num_steps"], cfg["step_size"]
    init = target.init(chains)
    method = cfg["method"]
    out = {**cfg, "target_name": target.name, "dim": target.dim}
    if cfg.get("gpu"):
        import jax

        out["jax_devices"] = [str(d) for d in jax.devices()]
    if method == "dhmc":
        out.update(_child_dhmc(cfg, target, init))
    elif method in ("floor", "blackjax"):
        import jax

        t = time.perf_counter()
        if method == "floor":
            f = floor_sampler(target.flat, eps, steps, draws)
        else:
            import blackjax  # noqa: F401 - import outside the timed region, as the contract does

            f = blackjax_sampler(target.flat, eps, steps, draws, target.dim)
        build = time.perf_counter() - t
        keys = jax.random.split(jax.random.PRNGKey(1), chains)
        cold, x = timed(lambda: f(keys, init))
        out["cold_s"] = cold + build
        out["mean0"] = float(np.asarray(x)[..., 0].mean())
        if cfg["warm"]:
            keys2 = jax.random.split(jax.random.PRNGKey(2), chains)
            out["warm_s"], _ = timed(lambda: f(keys2, init))
    elif method in ("numpyro", "numpyro_seq"):
        import jax
        import numpyro  # noqa: F401

        site = target.numpyro_site
        mcmc = None

        def run(seed):
            nonlocal mcmc
            if mcmc is None:
                mcmc = numpyro_mcmc(target, eps, steps, draws, chains,
                                      "vectorized" if method == "numpyro" else "sequential")
            mcmc.run(jax.random.PRNGKey(seed), init_params={site: init})
            return mcmc.get_samples()[site]

        out["cold_s"], x = timed(lambda: run(1))
        x = np.asarray(x)
        if site != target.key:  # coin toss: NumPyro reports p, the others u = logit(p)
            x = np.log(x) - np.log1p(-x)
        out["mean0"] = float(x[..., 0].mean())
        if cfg["warm"]:
            out["warm_s"], _ = timed(lambda: run(2))
    else:
        raise ValueError(method)
    work = chains * draws
    for kind in ("cold", "warm"):
        s = out.get(f"{kind}_s")
        if s:
            out[f"{kind}_chain_draws_per_s"] = work / s
            out[f"{kind}_grad_evals_per_s"] = work * steps / s
    return out


def _child_dhmc(cfg, target, init) -> dict:
    import numpy as np

    t = time.perf_counter()
    import dhmc
    import dhmc.api  # noqa: F401 - dhmc.sample imports it lazily; time it apart

    import_s = time.perf_counter() - t
    out = {"dhmc_import_s": import_s}

    from benchmarks.probe import DhmcProbe  # imports dhmc: after timing its import

    def call(cluster):
        probe = DhmcProbe()
        t = time.perf_counter()
        tree = probe.sample(target.logdensity, init={target.key: init}, chains=cfg["chains"], draws=cfg["draws"],
                            warmup=0, kernel="hmc", step_size=cfg["step_size"], num_steps=cfg["num_steps"],
                            adapt=False, seed=1, progress=False, cluster=cluster,
                            chains_per_task=cfg.get("chains_per_task"))
        x = tree["posterior"][target.key].values
        return time.perf_counter() - t, x, probe.timing, probe.summary()

    from distributed import Client, LocalCluster

    def make_cluster():
        """The warm run's cluster: one worker per core on CPUs; one worker per GPU with --gpu."""
        if cfg.get("gpu"):
            if have_dask_cuda():
                from dask_cuda import LocalCUDACluster

                return LocalCUDACluster(threads_per_worker=1, dashboard_address="127.0.0.1:0", host="127.0.0.1")
            return LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0",
                                host="127.0.0.1")
        return LocalCluster(n_workers=cores(), threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0",
                            host="127.0.0.1")

    if cfg.get("gpu"):
        # cold on a GPU: dhmc's own "cuda" cluster (dask-cuda), else a 1-worker LocalCluster started inside
        # the timed call (the embedded default would start one JAX worker per CPU core, all on the GPU)
        if have_dask_cuda():
            out["cluster_kind"] = "cuda"
            out["cold_s"], x, out["dhmc_timing_cold"], out["probe_cold"] = call("cuda")
        else:
            out["cluster_kind"] = "LocalCluster(1 worker)"
            t = time.perf_counter()
            with make_cluster() as cluster:
                start = time.perf_counter() - t
                seconds, x, out["dhmc_timing_cold"], out["probe_cold"] = call(cluster)
                t2 = time.perf_counter()
            out["cold_s"] = start + seconds + (time.perf_counter() - t2)
            out["cold_cluster_start_s"] = start
    else:
        out["cluster_kind"] = "embedded default"
        out["cold_s"], x, out["dhmc_timing_cold"], out["probe_cold"] = call(None)
    out["mean0"] = float(np.asarray(x)[..., 0].mean())
    if cfg["warm"]:
        t = time.perf_counter()
        cluster = make_cluster()
        client = Client(cluster)
        out["warm_cluster_start_s"] = time.perf_counter() - t
        try:
            out["first_on_cluster_s"], _, out["dhmc_timing_first_on_cluster"], _ = call(client)
            out["warm_s"], _, out["dhmc_timing_warm"], out["probe_warm"] = call(client)
        finally:
            client.close()
            cluster.close()
    return out


def _child_kernel(cfg) -> dict:
    """dhmc's block program vs the floor's on the same block, both in this process (``dhmc_overhead.measure``)."""
    from benchmarks.dhmc_overhead import measure

    res = measure(cfg["target"], cfg["chains"], cfg["draws"], cfg["num_steps"], cfg["step_size"],
                  cfg["chains_per_task"], full_floor=False)
    return {"kernel": res, "affinity": sorted(os.sched_getaffinity(0))}


# -- the driver ----------------------------------------------------------------------------------------------


def configs(args) -> list[dict]:
    out = []
    for target in args.targets:
        for chains in args.chains:
            for method in args.methods:
                if method == "numpyro_seq" and chains > args.sequential_max:
                    continue
                cpt = args.chains_per_task
                if args.gpu and cpt is None:
                    cpt = min(chains, 2**16)  # a GPU wants the whole ensemble in one block
                out.append({"target": target, "method": method, "chains": chains, "draws": args.draws,
                            "num_steps": args.num_steps, "step_size": args.step_size, "warm": not args.no_warm,
                            "chains_per_task": cpt, "gpu": args.gpu})
    return out


def kernel_configs(args) -> list[dict]:
    """One kernel-ratio measurement per (target, chains), with the runs' block settings."""
    return [{"target": target, "method": "kernel", "chains": chains, "draws": args.draws, "num_steps": args.num_steps,
             "step_size": args.step_size, "chains_per_task": args.chains_per_task}
            for target in args.targets for chains in args.chains]


def one_core() -> tuple[str, ...]:
    """``taskset -c <last core>``, to pin the kernel measurement (nothing where taskset is missing)."""
    if not shutil.which("taskset") or not hasattr(os, "sched_getaffinity"):
        return ()
    return ("taskset", "-c", str(max(os.sched_getaffinity(0))))


def kernel_record(cfg: dict, rec: dict, rows: list[dict]) -> dict:
    """The kernel measurement's JSON record, with dhmc's own per-block device seconds in this run beside it."""
    out = {**cfg, **{k: v for k, v in rec.items() if k != "kernel"}}
    k = rec.get("kernel")
    if not k:
        return out
    out.update({key: k[key] for key in ("chains_per_task", "draws_per_segment", "dhmc_block_device_s",
                                        "floor_block_device_s", "kernel_ratio_dhmc_over_floor_same_block",
                                        "dhmc_block_compile_s", "floor_block_compile_s")})
    out["measure"] = k
    for r in rows:
        if r.get("method") != "dhmc" or r["target"] != cfg["target"] or r["chains"] != cfg["chains"] or "error" in r:
            continue
        for kind in ("cold", "warm"):
            p = r.get(f"probe_{kind}") or {}
            if p.get("blocks") and f"dhmc_run_block_device_s_{kind}" not in out:
                out[f"dhmc_run_block_device_s_{kind}"] = p["block_device_seconds_sum"] / p["blocks"]
                out[f"dhmc_run_block_over_floor_block_{kind}"] = (out[f"dhmc_run_block_device_s_{kind}"]
                                                                 / k["floor_block_device_s"])
                out[f"dhmc_run_block_{kind}"] = f"{p.get('chains_per_block')} x {p.get('iterations_per_block')}"
    return out


def kernel_lines(kernels: list[dict]) -> str:
    """One line per kernel-ratio measurement."""
    lines = []
    for k in kernels:
        if "kernel_ratio_dhmc_over_floor_same_block" not in k:
            continue
        cpus = ",".join(map(str, k.get("affinity", []))) or "?"
        line = (f"kernel, same block ({k['target']} {k['chains']} chains: blocks of {k['chains_per_task']} chains x "
                f"{k['draws_per_segment']} draws) in one process on CPU {cpus}: dhmc {k['dhmc_block_device_s']:.3f} s,"
                f" floor {k['floor_block_device_s']:.3f} s, "
                f"dhmc/floor {k['kernel_ratio_dhmc_over_floor_same_block']:.2f}")
        for kind in ("cold", "warm"):
            if f"dhmc_run_block_device_s_{kind}" in k:
                line += (f"; dhmc's {k[f'dhmc_run_block_{kind}']} blocks in the {kind} run: "
                         f"{k[f'dhmc_run_block_device_s_{kind}']:.3f} s each "
                         f"({k[f'dhmc_run_block_over_floor_block_{kind}']:.2f}x the floor's)")
        lines.append(line)
    return "\n".join(lines)


COLUMNS = [
    ("target", "target", ""), ("chains", "chains", "d"), ("method", "sampler", ""),
    ("cold_s", "cold s", ".2f"), ("cold_chain_draws_per_s", "cold draws/s", ",.0f"),
    ("cold_grad_evals_per_s", "cold grads/s", ",.3g"),
    ("warm_s", "warm s", ".2f"), ("warm_chain_draws_per_s", "warm draws/s", ",.0f"),
    ("warm_grad_evals_per_s", "warm grads/s", ",.3g"),
    ("cold_vs_dhmc", "cold t/t_dhmc", ".2f"), ("warm_vs_dhmc", "warm t/t_dhmc", ".2f"),
]


def add_ratios(rows: list[dict]) -> None:
    """``t_sampler / t_dhmc`` per (target, chains): above 1 means dhmc is faster."""
    for r in rows:
        ref = next((d for d in rows if d.get("method") == "dhmc" and d["target"] == r["target"]
                    and d["chains"] == r["chains"] and "error" not in d), None)
        for kind in ("cold", "warm"):
            if ref and ref.get(f"{kind}_s") and r.get(f"{kind}_s"):
                r[f"{kind}_vs_dhmc"] = r[f"{kind}_s"] / ref[f"{kind}_s"]


def dhmc_breakdown(rows: list[dict]) -> str:
    """Where dhmc's cold and warm seconds went, one line per run."""
    lines = []
    for r in rows:
        if r.get("method") != "dhmc" or "error" in r:
            continue
        for kind in ("cold", "warm"):
            t, p = r.get(f"dhmc_timing_{kind}"), r.get(f"probe_{kind}")
            if not t or not p:
                continue
            ph = p["driver_phases_s"]
            lines.append(
                f"{r['target']:>24s} {r['chains']:>6d} {kind}: call {r[f'{kind}_s']:.2f} s = start (target, "
                f"initial-position check, cluster start {ph.get('cluster_start') or 0:.2f}) "
                f"{ph.get('before_run', 0):.2f} + sampling {ph.get('runner_sample', 0):.2f} (worker compile max "
                f"{t['compile']:.2f}, device work {p.get('block_device_seconds_sum', 0):.2f} s summed over "
                f"{p.get('blocks', 0)} blocks of {p.get('chains_per_block')} chains x {p.get('iterations_per_block')} "
                f"draws) + result {ph.get('after_sampling', 0):.2f} + cluster close {ph.get('cluster_close', 0):.2f} "
                f"+ other; first block started {p.get('first_task_start_after_call_s', float('nan')):.2f} s into the "
                f"call; the driver used {100 * p.get('driver_cpu_share_of_a_core_while_sampling', float('nan')):.1f}% "
                "of a core while blocks ran")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", default="logistic,coin_toss,gaussian100",
                    type=lambda s: [t for t in s.split(",") if t])
    ap.add_argument("--chains", default=",".join(map(str, FULL_CHAINS)), type=lambda s: [int(c) for c in s.split(",")])
    ap.add_argument("--draws", type=int, default=400)
    ap.add_argument("--num-steps", type=int, default=10)
    ap.add_argument("--step-size", type=float, default=0.02)
    ap.add_argument("--methods", default=",".join(METHODS), type=lambda s: [m for m in s.split(",") if m])
    ap.add_argument("--sequential-max", type=int, default=64, help="NumPyro sequential only up to this many chains")
    ap.add_argument("--chains-per-task", type=int, default=None, help="dhmc's chains_per_task (default: dhmc's)")
    ap.add_argument("--no-warm", action="store_true", help="cold numbers only")
    ap.add_argument("--dhmc-compile-cache", choices=("fresh", "off", "user"), default="fresh",
                    help="dhmc workers' persistent JAX compilation cache: 'fresh' (an empty folder per measurement: "
                         "workers share programs within it, nothing carries over between runs), 'off', or 'user' "
                         "(dhmc's default ~/.cache/dhmc/jax, possibly warm from earlier runs, as the contract sees it)")
    ap.add_argument("--repeat", type=int, default=1, help="run the whole matrix this many times (interleaved)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per measurement process")
    ap.add_argument("--quick", action="store_true", help="tiny sizes: 4 chains x 50 draws (sequential NumPyro too)")
    ap.add_argument("--contract", action="store_true",
                    help="the contract check's case: logistic, 1024 chains x 400 draws, step 0.02, 10 steps, cold, "
                         "dhmc/floor/blackjax/numpyro, with the kernel ratio (sets those options; --quick then "
                         "shrinks it to 4 x 50)")
    ap.add_argument("--kernel-ratio", action=argparse.BooleanOptionalAction, default=None,
                    help="also measure dhmc's block program against the floor's on the same block, in one process "
                         "pinned to one core (benchmarks.dhmc_overhead.measure); default: on with --contract")
    ap.add_argument("--gpu", action="store_true",
                    help="run JAX on the GPU: dhmc on dask-cuda's LocalCUDACluster when importable, else a 1-worker "
                         "LocalCluster; chains_per_task = chains (up to 2^16) unless given")
    args = parse_args_or_run_child(ap, argv, child, "throughput.json")
    if args is None:
        return 0
    if args.contract:
        vars(args).update(CONTRACT)
    if args.quick:
        args.chains, args.draws, args.sequential_max = [4], 50, 4
    if args.kernel_ratio is None:
        args.kernel_ratio = args.contract
    if args.kernel_ratio and args.gpu:
        ap.error("--kernel-ratio measures on one CPU core: not with --gpu")
    unknown = [t for t in args.targets if t not in TARGETS] + [m for m in args.methods if m not in METHODS]
    if unknown:
        ap.error(f"unknown target/method {unknown}; targets {list(TARGETS)}, methods {list(METHODS)}")
    # on a GPU, name it: a JAX that cannot reach it then fails instead of quietly running on the CPU
    env = {"JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cuda,cpu" if args.gpu else "cpu")}
    if args.gpu:
        env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # driver, worker and samplers share the GPU
    rows, kernels = [], []
    started = time.perf_counter()

    def payload():
        return {"benchmark": "throughput", "machine": machine(), "wall_s": time.perf_counter() - started,
                "settings": {"targets": args.targets, "chains": args.chains, "methods": args.methods,
                             "draws": args.draws, "num_steps": args.num_steps, "step_size": args.step_size,
                             "warm": not args.no_warm, "dhmc_compile_cache": args.dhmc_compile_cache,
                             "repeat": args.repeat, "chains_per_task": args.chains_per_task, "gpu": args.gpu,
                             "contract": args.contract, "kernel_ratio": args.kernel_ratio},
                "notes": ["t/t_dhmc > 1: dhmc faster",
                          "dhmc cold includes starting and stopping its cluster (embedded default on CPUs)",
                          "grad evals = chains x draws x num_steps",
                          "NumPyro recompiles on every MCMC.run: its warm number includes compiling",
                          "kernel_ratio: dhmc's block program / the floor's on the same block, device seconds, one "
                          "process pinned to one core (dhmc_overhead.measure)"],
                "runs": rows, "kernel_ratio": kernels}

    for rep in range(args.repeat):
        for cfg in configs(args):
            t = time.perf_counter()
            rec = run_child(__spec__.name, cfg, args.timeout, env, args.dhmc_compile_cache)
            rec = {**cfg, **rec, "repeat": rep, "loadavg_after": os.getloadavg()[0]}
            rows.append(rec)
            status = rec.get("error") or (f"cold {rec.get('cold_s', float('nan')):.2f} s, "
                                          f"warm {rec.get('warm_s') or float('nan'):.2f} s")
            print(f"[{time.perf_counter() - t:6.1f} s] {cfg['target']:>11s} {cfg['chains']:>6d} {cfg['method']:>11s}: "
                  f"{status}", flush=True)
            add_ratios(rows)
            write_json(args.out, payload())  # after each measurement: a time limit keeps what was done
    add_ratios(rows)
    for cfg in kernel_configs(args) if args.kernel_ratio else []:
        t = time.perf_counter()
        # no persistent cache: dhmc's block compile is measured too
        rec = run_child(__spec__.name, cfg, args.timeout, env, "off", prefix=one_core())
        kernels.append(kernel_record(cfg, rec, rows))
        status = rec.get("error") or f"dhmc/floor {kernels[-1]['kernel_ratio_dhmc_over_floor_same_block']:.2f}"
        print(f"[{time.perf_counter() - t:6.1f} s] {cfg['target']:>11s} {cfg['chains']:>6d} {'kernel':>11s}: {status}",
              flush=True)
        write_json(args.out, payload())
    return finish(write_json(args.out, payload()), rows + kernels,
                  lambda r: f"{r['target']} {r['chains']} {r['method']}",
                  [table(rows, COLUMNS), dhmc_breakdown(rows), kernel_lines(kernels)], tail=800)


if __name__ == "__main__":
    sys.exit(main())

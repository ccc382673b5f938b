"""Where dhmc's time goes, without Dask: its worker code path in this process vs the floor.

For one target and ensemble size this runs, in ONE process, alternating:

* ``floor``: the contract's hand-written vmapped HMC over all chains (compile, then a warm call);
* ``floor_block``: the same on one dhmc block (``chains_per_task`` chains x ``draws_per_segment`` draws);
* ``dhmc_block``: dhmc's own worker function ``dhmc.distributed.worker.run_job`` on one block, called
  directly (no cluster): its compile (``compile_seconds``), its device time (``seconds``), and the
  whole call (device-to-NumPy copies, metrics);
* ``dhmc_driver_init``: the driver-side initial-position check dhmc runs on every call
  (``jax.jit(jax.vmap(logdensity))`` over all chains, re-traced each call).

From these: the ensemble's device time in dhmc = blocks x block seconds / workers, to compare with the
floor's, and the compile gap. Whatever dhmc.sample takes beyond that is cluster start, Dask and the
driver. Nothing in dhmc is changed.

    python -m benchmarks.dhmc_overhead --target logistic --chains 1024 --draws 400
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

from benchmarks.harness import RESULTS, timed, write_json
from benchmarks.machine import cores, cpu_line, machine
from benchmarks.samplers import floor_sampler
from benchmarks.targets import TARGETS


def measure(target_name: str, chains: int, draws: int, steps: int, eps: float, chains_per_task=None,
            full_floor: bool = True) -> dict:
    import cloudpickle
    import jax
    import jax.numpy as jnp
    import numpy as np

    from dhmc.distributed import worker
    from dhmc.distributed.runner import initial_params
    from dhmc.distributed.spec import RunSpec, geometry_for, layout_for
    from dhmc.models import LogDensityTarget

    target = TARGETS[target_name]()
    init = target.init(chains)
    resolved = LogDensityTarget(target.logdensity, {target.key: init[0]}, name="bench")
    model = resolved.build()
    geometry = geometry_for(model, layout_for(model), chains, draws, chains_per_task, gpu=False)
    cpt, dps = geometry.chains_per_task, geometry.draws_per_segment
    spec = RunSpec(model="bench", chains=chains, draws=draws, warmup=0, seed=1, kernel="hmc", step_size=eps,
                   num_steps=steps, trajectory_length=None, adapt=False, dense_mass=False, target_accept=0.8,
                   chains_per_task=cpt, draws_per_segment=dps, x64=False)
    blob = cloudpickle.dumps(resolved)
    params = initial_params(spec, model.dim, model.dtype)

    def job(token):
        return worker.Job(run_id="bench", model_token=token, model_blob=blob, x64=False,
                          config=spec.kernel_config("sample"), seed=spec.seed, phase="sample", chain_start=0,
                          chain_stop=cpt, first_iteration=0, num_iterations=dps, positions=init[:cpt], params=params,
                          keep_draws=dps, adapt=False)

    out = {"target": target.name, "chains": chains, "draws": draws, "num_steps": steps, "step_size": eps,
           "chains_per_task": cpt, "draws_per_segment": dps, "blocks": math.ceil(chains / cpt) * math.ceil(draws / dps)}

    # dhmc's worker path, cold then warm (a fresh token per cold call forces a compile)
    t = time.perf_counter()
    r = worker.run_job(job("cold"))
    out["dhmc_block_cold_call_s"] = time.perf_counter() - t
    out["dhmc_block_compile_s"] = r.compile_seconds
    t = time.perf_counter()
    r = worker.run_job(job("cold"))
    out["dhmc_block_warm_call_s"] = time.perf_counter() - t
    out["dhmc_block_device_s"] = r.seconds

    # the floor on the same block and on the whole ensemble
    keys = jax.random.split(jax.random.PRNGKey(1), chains)
    fb = floor_sampler(target.flat, eps, steps, dps)
    t = time.perf_counter()
    compiled = fb.lower(keys[:cpt], init[:cpt]).compile()
    out["floor_block_compile_s"] = time.perf_counter() - t
    out["floor_block_device_s"], _ = timed(lambda: compiled(keys[:cpt], init[:cpt]))
    out["floor_block_device_s"], _ = timed(lambda: compiled(keys[:cpt], init[:cpt]))

    if full_floor:
        f = floor_sampler(target.flat, eps, steps, draws)
        t = time.perf_counter()
        compiled_all = f.lower(keys, init).compile()
        out["floor_compile_s"] = time.perf_counter() - t
        out["floor_device_s"], _ = timed(lambda: compiled_all(keys, init))

    # dhmc block again (the machine's load drifts: take the better of two)
    r = worker.run_job(job("cold"))
    out["dhmc_block_device_s"] = min(out["dhmc_block_device_s"], r.seconds)
    out["floor_block_device_s"] = min(out["floor_block_device_s"], timed(lambda: compiled(keys[:cpt], init[:cpt]))[0])

    # the driver's initial-position check, as dhmc.models.resolve.initial_positions does it on each call
    t = time.perf_counter()
    np.asarray(jax.jit(jax.vmap(model.logdensity_fn))(jnp.asarray(init)))
    out["dhmc_driver_init_check_s"] = time.perf_counter() - t
    from dhmc.models.resolve import initial_positions

    t = time.perf_counter()
    initial_positions(model, "bench", {target.key: init}, 1, chains)
    out["dhmc_driver_initial_positions_s"] = time.perf_counter() - t

    workers = cores()
    out["workers"] = workers
    out["dhmc_ensemble_device_s_est"] = out["blocks"] * out["dhmc_block_device_s"] / workers
    out["floor_blocks_device_s_est"] = out["blocks"] * out["floor_block_device_s"] / workers
    out["kernel_ratio_dhmc_over_floor_same_block"] = out["dhmc_block_device_s"] / out["floor_block_device_s"]
    out["compile_ratio_dhmc_over_floor_same_block"] = out["dhmc_block_compile_s"] / out["floor_block_compile_s"]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="logistic", choices=list(TARGETS))
    ap.add_argument("--chains", type=int, default=1024)
    ap.add_argument("--draws", type=int, default=400)
    ap.add_argument("--num-steps", type=int, default=10)
    ap.add_argument("--step-size", type=float, default=0.02)
    ap.add_argument("--chains-per-task", type=int, default=None)
    ap.add_argument("--no-full-floor", action="store_true", help="skip the floor over the whole ensemble")
    ap.add_argument("--quick", action="store_true", help="64 chains x 50 draws")
    ap.add_argument("--out", default=str(RESULTS / "dhmc_overhead.json"))
    args = ap.parse_args(argv)
    if args.quick:
        args.chains, args.draws = 64, 50
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("DHMC_COMPILATION_CACHE", "0")
    res = measure(args.target, args.chains, args.draws, args.num_steps, args.step_size, args.chains_per_task,
                  not args.no_full_floor)
    res["affinity"] = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    payload = {"benchmark": "dhmc_overhead", "machine": machine(), "result": res}
    path = write_json(args.out, payload)
    print(cpu_line())
    w = max(len(k) for k in res)
    for k, v in res.items():
        print(f"{k:<{w}}  {v:.4g}" if isinstance(v, float) else f"{k:<{w}}  {v}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where a block's time goes, op by op: each part of a transition timed alone, beside dhmc's block and the floor's.

In one process (pin it: ``taskset -c 1``), for one target and a block of ``--chains`` chains, every part
runs vmapped over the block inside a ``fori_loop`` of ``--iterations`` iterations, compiled once, best of
three; times are microseconds per chain and iteration:

* the log density's gradient, its value, both together (``value_and_grad``), and its two halves for the
  logistic regression: the matrix products (``X w`` and ``X^T r``) and the elementwise part;
* a transition's randomness: the ``fold_in`` of the iteration, then either a split, a normal and a
  uniform (three random-bits loops: dhmc before issue 21, BlackJAX's and the floor's way) or one vector of
  uniforms (dhmc's ``transition_noise``);
* dhmc's sample block program (``dhmc.distributed.program``, as the workers run it) and the floor's
  (the contract's hand-written HMC), per transition, with their compile seconds.

    python -m benchmarks.block_profile --chains 64 --iterations 200
"""

from __future__ import annotations

import argparse
import os
import sys

from benchmarks.harness import RESULTS, timed, write_json
from benchmarks.machine import cpu_line, machine


def _per_iteration(compile_program, args, iterations: int, chains: int) -> tuple[float, float]:
    """``(microseconds per chain and iteration, compile seconds)`` of the program ``compile_program()`` returns,
    called on ``args``: its best of three calls after a first one."""
    compile_s, compiled = timed(compile_program)
    timed(lambda: compiled(*args))
    best = min(timed(lambda: compiled(*args))[0] for _ in range(3))
    return best / iterations / chains * 1e6, compile_s


def measure(target_name: str, chains: int, iterations: int, steps: int, eps: float) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from benchmarks.samplers import floor_sampler
    from benchmarks.targets import TARGETS
    from dhmc.core.ensemble import KernelConfig, Params
    from dhmc.distributed.program import BlockInputs, build_program, compile_program, program_args
    from dhmc.models import LogDensityTarget

    target = TARGETS[target_name]()
    init = jnp.asarray(target.init(chains))
    dim = init.shape[1]
    keys = jax.random.split(jax.random.PRNGKey(1), chains)

    def looped(step):
        """``step(x, keys, i) -> (chains, dim)`` applied ``iterations`` times; its output feeds the next."""
        return lambda x, k: jax.lax.fori_loop(0, iterations, lambda i, y: y + 1e-6 * step(y, k, i), x)

    grad = jax.vmap(jax.grad(target.flat))
    value = jax.vmap(target.flat)
    both = jax.vmap(jax.value_and_grad(target.flat))
    parts = {
        "gradient": lambda x, k, i: grad(x),
        "log_density": lambda x, k, i: value(x)[:, None] * jnp.ones_like(x),
        "value_and_gradient": lambda x, k, i: both(x)[1] + both(x)[0][:, None],
        "rng_split_normal_uniform": lambda x, k, i: jax.vmap(_three_draws, (0, None, 0))(k, i, x),
        "rng_one_uniform_vector": lambda x, k, i: jax.vmap(_one_draw, (0, None, 0))(k, i, x),
    }
    if target_name == "logistic":
        data = _logistic_data(target)
        parts["logistic_matmuls_only"] = lambda x, k, i: (x @ data.T) @ data
        elementwise = jax.vmap(jax.grad(lambda lg: -jnp.sum(jnp.logaddexp(0.0, lg))))  # d/dlg, all N terms used:
        parts["logistic_elementwise_only"] = lambda x, k, i: elementwise(  # the sum keeps XLA from dropping any
            jnp.tile(x, (1, len(data) // dim + 1))[:, :len(data)]).reshape(chains, -1, dim).sum(1)
    out = {"target": target.name, "chains": chains, "iterations": iterations, "num_steps": steps, "step_size": eps,
           "us_per_chain_iteration": {}, "compile_s": {}}
    model = LogDensityTarget(target.logdensity, {target.key: np.asarray(init[0])}, name="profile").build()
    program = build_program(model, KernelConfig(kind="hmc", num_steps=steps), "sample", iterations)
    params = Params(jnp.asarray(eps, jnp.float32), jnp.ones(dim, jnp.float32), jnp.asarray(eps * steps, jnp.float32))
    floor = floor_sampler(target.flat, eps, steps, iterations)
    programs = {name: (lambda step=step: jax.jit(looped(step)).lower(init, keys).compile(), (init, keys))
                for name, step in parts.items()}
    programs["dhmc_block"] = (lambda: compile_program(program, program_args("sample", chains, dim, jnp.float32, False)),
                              (BlockInputs(jnp.uint32(1), jnp.arange(chains, dtype=jnp.uint32), init, params,
                                           jnp.int32(0), jnp.int32(iterations), *[jnp.bool_(False)] * 3),))
    programs["floor_block"] = (lambda: floor.lower(keys, init).compile(), (keys, init))
    for name, (compile_it, args) in programs.items():
        us, compile_s = _per_iteration(compile_it, args, iterations, chains)
        out["us_per_chain_iteration"][name] = us
        out["compile_s"][name] = compile_s
    us = out["us_per_chain_iteration"]
    out["dhmc_block_over_floor_block"] = us["dhmc_block"] / us["floor_block"]
    out["dhmc_block_model"] = {  # what a transition computes, from the parts
        "gradients": (steps - 1) * us["gradient"], "value_and_gradient_at_the_end": us["value_and_gradient"],
        "randomness": us["rng_one_uniform_vector"],
        "rest (the block minus its parts)": us["dhmc_block"] - (steps - 1) * us["gradient"] - us["value_and_gradient"]
        - us["rng_one_uniform_vector"]}
    return out


def _three_draws(key, iteration, like):
    import jax

    k1, k2 = jax.random.split(jax.random.fold_in(key, iteration))
    return jax.random.normal(k1, like.shape) + jax.random.uniform(k2)


def _one_draw(key, iteration, like):
    import jax

    v = jax.random.uniform(jax.random.fold_in(key, iteration), (like.size + 1,), minval=-1.0, maxval=1.0)
    return jax.lax.erf_inv(v[:-1]) + v[-1]


def _logistic_data(target):
    """The logistic regression's design matrix, from the target's closure."""
    import jax

    return next(c for c in jax.make_jaxpr(target.flat)(target.init(1)[0]).consts if getattr(c, "ndim", 0) == 2)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default="logistic")
    ap.add_argument("--chains", type=int, default=64)
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--num-steps", type=int, default=10)
    ap.add_argument("--step-size", type=float, default=0.02)
    ap.add_argument("--out", default=str(RESULTS / "block_profile.json"))
    args = ap.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    res = measure(args.target, args.chains, args.iterations, args.num_steps, args.step_size)
    res["affinity"] = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
    path = write_json(args.out, {"benchmark": "block_profile", "machine": machine(), "result": res})
    print(cpu_line())
    print(f"{res['target']}, {res['chains']} chains x {res['iterations']} iterations, one process on CPUs {res['affinity']}")
    for name, us in res["us_per_chain_iteration"].items():
        print(f"  {name:<28} {us:8.2f} us per chain and iteration   compile {res['compile_s'][name]:.2f} s")
    print("  dhmc's transition from its parts: " + ", ".join(f"{k} {v:.2f} us" for k, v in res["dhmc_block_model"].items()))
    print(f"  dhmc block / floor block: {res['dhmc_block_over_floor_block']:.3f}")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

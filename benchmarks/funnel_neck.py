"""How fast dhmc's HMC transition refills a funnel's neck, under three rules for the chains' step sizes.

The posteriors dhmc still gets wrong (``many_chains.py``: the centred eight schools as a bare log density, the
Brownian motion in every form) are funnels: a scale parameter whose small values squeeze the other coordinates
into a neck a few percent of the mass wide (``brownian_laplace``: what ``laplace=True`` leaves, the two log scales'
L-shaped marginal beside 30 standard normals, the observation scale watched). This script isolates the kernel from warmup: it starts ``--chains``
chains from the exact (or reference) posterior with the neck removed (every chain whose watched coordinate lies
below its ``--cut`` quantile replaced by one above it), fixes a diagonal metric (the posterior's variances) and a
trajectory length (``--length``, in those units, jittered ``u T`` as dhmc's), and runs the transition of
:mod:`dhmc.core.hmc` for ``--grads`` sequential gradients a chain under each rule:

* ``harmonic``: one step size for every chain, where dhmc's acceptance statistic
  (:func:`dhmc.core.step_size.harmonic_mean`, groups of 64 chains) is ``--target`` (what dhmc's warmup adapts to);
* ``arithmetic``: one step size where the chains' mean acceptance is ``--target`` (a chain's own average, as a
  single NUTS chain adapts);
* ``levels``: each chain draws, every transition and independently of its state (so the kernel stays exact), one
  of the steps ``h_a 2^-k`` from ``h_a`` (arithmetic's) down to about ``h_h`` (harmonic's), all equally likely;
  every chain integrates the same number of steps, ``ceil(u T / h_a)``, so a chain on a small step runs a shorter
  trajectory and an iteration costs what ``arithmetic``'s does;
* ``selected``: the same ladder, but each chain picks its rung from where it stands (AutoStep-style, Liu et al.
  2024): the largest step whose single leapfrog step from the chain's position and fresh momentum changes the
  energy by at most a threshold drawn log-uniformly in 0.3 .. 3 each transition; the proposal is accepted only if
  the same rule, from its end with the momentum reversed, picks the same rung (that keeps the kernel exact). The
  trials cost gradients beyond the trajectory's: the most any chain needed, both ways, counted.

Reported for each rule: the step sizes, the acceptance, and at each quarter of the gradients the watched
coordinates' sd (over every chain's draws of that quarter's iterations) over the exact one and their 1% and 5% quantiles
minus the exact ones (0 when the neck is full; positive while it is empty). CPU seconds are not the point
(the gradients are); the machine is recorded all the same.

    python -m benchmarks.funnel_neck                      # all three problems: results/funnel_neck.json
    python -m benchmarks.funnel_neck --problems eight_schools_centered --grads 3000
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

from benchmarks.harness import RESULTS, write_runs

PROBLEMS = ("eight_schools_centered", "brownian", "brownian_noncentered", "brownian_laplace")
RULES = ("harmonic", "arithmetic", "levels", "selected")
THRESHOLDS = (0.3, 3.0)  # the selected rule's one-step energy change allowed, drawn log-uniformly between
QUANTILES = (0.01, 0.05)


def eight_schools_centered(rng, n):
    """The centred eight schools' log density on ``(log_tau, mu, theta[8])`` and its reference draws (posteriordb)."""
    from benchmarks import ess
    from tests.validation.posteriors import reference_draws

    problem = ess.Problem("eight_schools-eight_schools_centered")
    d = reference_draws("eight_schools-eight_schools_centered")
    draws = np.column_stack([np.log(d["tau"].ravel()), d["mu"].ravel()] + [d[f"theta[{i}]"].ravel()
                                                                            for i in range(1, 9)])

    def logdensity(z):
        return problem.logdensity({"log_tau": z[0], "mu": z[1], "theta": z[2:]})

    return logdensity, draws[rng.choice(len(draws), n)], {"log_tau": 0}


def _scale_draws(rng, n, h: float = 0.01):
    """``(grid, log_innovation, log_observation)``: ``n`` exact draws of the Brownian's log scales from
    :func:`~benchmarks.laps_targets.brownian_grid` (step ``h``), each jittered within its cell."""
    from benchmarks.laps_targets import brownian_grid

    grid = brownian_grid(h)
    pick = rng.choice(grid["weights"].size, n, p=grid["weights"].ravel())
    li = grid["log_innovation"].ravel()[pick] + rng.uniform(-h / 2, h / 2, n)
    lo = grid["log_observation"].ravel()[pick] + rng.uniform(-h / 2, h / 2, n)
    return grid, li, lo


def brownian(rng, n, noncentered=False):
    """``laps_targets``'s Brownian motion on ``(log_innovation, log_observation, x[30])`` (non-centred: the
    innovations ``z = diff(x) / exp(log_innovation)`` instead of ``x``) and exact draws: the log scales from
    :func:`~benchmarks.laps_targets.brownian_grid`, the positions from their Gaussian conditional."""
    import jax.numpy as jnp
    from jax.scipy.stats import norm

    from benchmarks.laps_targets import BROWNIAN_STEPS, brownian_data, target

    y, observed = brownian_data()
    grid, li, lo = _scale_draws(rng, n)
    precision_prior, ones, data = np.linalg.inv(grid["covariance"]), np.zeros(BROWNIAN_STEPS), np.zeros(BROWNIAN_STEPS)
    ones[observed], data[observed] = 1.0, y[observed]
    x = np.empty((n, BROWNIAN_STEPS))
    for i, (a, b) in enumerate(zip(li, lo, strict=True)):
        covariance = np.linalg.inv(precision_prior * np.exp(-2 * a) + np.diag(ones * np.exp(-2 * b)))
        x[i] = rng.multivariate_normal(covariance @ (data * np.exp(-2 * b)), covariance)
    watched = {"log_innovation": 0, "log_observation": 1}
    if not noncentered:
        centred, _ = target("brownian")
        logdensity = lambda z: centred({"x": z[2:], "log_innovation": z[0], "log_observation": z[1]})
        return logdensity, np.column_stack([li, lo, x]), watched
    y_j, observed_j = jnp.asarray(y), jnp.asarray(observed)

    def logdensity(z):
        li, lo, innovations = z[0], z[1], z[2:]
        lp = norm.logpdf(li, 0.0, 2.0) + norm.logpdf(lo, 0.0, 2.0) + jnp.sum(norm.logpdf(innovations))
        path = jnp.cumsum(jnp.exp(li) * innovations)
        return lp + jnp.sum(jnp.where(observed_j, norm.logpdf(y_j.astype(path.dtype), path, jnp.exp(lo)), 0.0))

    innovations = np.diff(x, axis=1, prepend=0.0) / np.exp(li)[:, None]
    return logdensity, np.column_stack([li, lo, innovations]), {"log_observation": 1}


def brownian_laplace(rng, n):
    """What ``laplace=True`` samples for the Brownian motion, ``(log_observation, log_innovation, z[30])``: the log
    scales' marginal posterior (the Gaussian marginal likelihood of the observations) times a standard normal ``z``,
    which the positions whitened by their (Gaussian) conditional are exactly; exact draws from
    :func:`~benchmarks.laps_targets.brownian_grid` and ``z ~ N(0, I)``."""
    import jax.numpy as jnp

    from benchmarks.laps_targets import BROWNIAN_STEPS

    grid, li, lo = _scale_draws(rng, n)
    lam, y_rot = jnp.asarray(grid["spectrum"]), jnp.asarray(grid["rotated"])

    def logdensity(z):
        lo, li, white = z[0], z[1], z[2:]
        d = jnp.exp(2 * li) * lam.astype(z.dtype) + jnp.exp(2 * lo)
        return (-li**2 / 8 - lo**2 / 8 - 0.5 * jnp.sum(jnp.log(d)) - 0.5 * jnp.sum(y_rot.astype(z.dtype) ** 2 / d)
                - 0.5 * jnp.sum(white**2))

    return logdensity, np.column_stack([lo, li, rng.standard_normal((n, BROWNIAN_STEPS))]), \
        {"log_observation": 0, "log_innovation": 1}


def target(name: str, rng, n: int):
    """``(logdensity of a flat vector, exact draws (n, d), {watched name: column})``."""
    if name == "eight_schools_centered":
        return eight_schools_centered(rng, n)
    if name == "brownian_laplace":
        return brownian_laplace(rng, n)
    return brownian(rng, n, noncentered=name == "brownian_noncentered")


class Ensemble:
    """dhmc's HMC transition vmapped over chains, each chain with its own step size, all with ``num_steps``."""

    def __init__(self, logdensity, inverse_mass_matrix):
        import jax

        from dhmc.core import hmc, metropolis

        kernel = hmc.build_kernel()
        self.init = jax.jit(jax.vmap(lambda x: metropolis.init(x, logdensity)))
        step = lambda key, state, eps, n: kernel(key, state, logdensity, eps, inverse_mass_matrix, n)
        self.step = jax.jit(jax.vmap(step, in_axes=(0, 0, 0, None)))
        self.select = jax.jit(jax.vmap(selected_kernel(logdensity, inverse_mass_matrix), in_axes=(0, 0, None, None, None)))

    def transition(self, seed: int, iteration: int, states, step_sizes, num_steps: int):
        import jax

        keys = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(seed), iteration), len(step_sizes))
        return self.step(keys, states, step_sizes, num_steps)

    def selected(self, seed: int, iteration: int, states, top: float, rungs: int, num_steps: int):
        """``(states, acceptance, trials)`` of the ``selected`` rule's transition (:func:`selected_kernel`)."""
        import jax

        keys = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(seed), iteration), states.position.shape[0])
        return self.select(keys, states, top, rungs, num_steps)


def selected_kernel(logdensity, inverse_mass_matrix):
    """The ``selected`` rule's transition of one chain: ``(key, state, top step, rungs, num_steps) -> (state,
    acceptance, trials)``, the trials of the forward and the reverse search."""
    import jax
    import jax.numpy as jnp

    from dhmc.core.integrators import IntegratorState, kinetic_energy, leapfrog, momentum_from
    from dhmc.core.metropolis import HMCState

    energy = lambda s: -s.logdensity + kinetic_energy(inverse_mass_matrix, s.momentum)

    def rung(start: IntegratorState, top, rungs, threshold):
        """The first rung ``j`` (step ``top 2^-j``) whose one leapfrog step changes the energy by at most
        ``threshold`` (the last rung if none): ``j + 1`` trials, one gradient each."""
        def body(carry):
            j, _ = carry
            change = energy(leapfrog(logdensity, start, top * 2.0 ** -j, inverse_mass_matrix, 1)) - energy(start)
            ok = (jnp.abs(change) <= threshold) | (j >= rungs - 1)
            return jnp.where(ok, j, j + 1), ok

        j, _ = jax.lax.while_loop(lambda c: ~c[1], body, (jnp.int32(0), jnp.bool_(False)))
        return j

    def kernel(key, state: HMCState, top, rungs, num_steps):
        k_noise, k_threshold, k_accept = jax.random.split(key, 3)
        momentum = momentum_from(jax.random.normal(k_noise, state.position.shape), inverse_mass_matrix)
        threshold = jnp.exp(jax.random.uniform(k_threshold, (), minval=math.log(THRESHOLDS[0]),
                                               maxval=math.log(THRESHOLDS[1])))
        start = IntegratorState(state.position, momentum, state.logdensity, state.logdensity_grad)
        j = rung(start, top, rungs, threshold)
        end = leapfrog(logdensity, start, top * 2.0 ** -j, inverse_mass_matrix, num_steps)
        back = rung(end._replace(momentum=-end.momentum), top, rungs, threshold)
        delta = energy(end) - energy(start)
        delta = jnp.where(jnp.isfinite(delta), delta, jnp.inf)
        acceptance = jnp.where(back == j, jnp.exp(jnp.minimum(0.0, -delta)), 0.0)
        accept = jax.random.uniform(k_accept) < acceptance
        new = HMCState(jnp.where(accept, end.position, state.position),
                       jnp.where(accept, end.logdensity, state.logdensity),
                       jnp.where(accept, end.logdensity_grad, state.logdensity_grad))
        return new, acceptance, jnp.stack([j, back]) + 1

    return kernel


def tune(ensemble: Ensemble, states, statistic, target: float, length: float, dtype, tries: int = 4) -> float:
    """The step size where ``statistic(acceptance, diverging)`` of one full transition from ``states`` crosses
    ``target`` (bisection on ``log h`` over 1e-4 .. 2, ``tries`` transitions averaged per point)."""
    import jax.numpy as jnp

    low, high = math.log(1e-4), math.log(2.0)
    chains = states.position.shape[0]
    for _ in range(14):
        middle = 0.5 * (low + high)
        h = math.exp(middle)
        n = max(1, math.ceil(length / h))
        values = []
        for k in range(tries):
            _, info = ensemble.transition(10_000 + k, 0, states, jnp.full(chains, h, dtype), n)
            values.append(float(statistic(info.acceptance_rate, info.diverging)))
        low, high = (middle, high) if np.mean(values) >= target else (low, middle)
    return math.exp(low)


def run(name: str, args) -> dict:
    import jax.numpy as jnp

    from dhmc.core.adaptation.chees import halton
    from dhmc.core.step_size import harmonic_mean

    rng = np.random.default_rng(args.seed)
    logdensity, exact, watched = target(name, rng, args.reference_draws)
    dtype = jnp.float32
    ensemble = Ensemble(logdensity, jnp.asarray(exact.var(axis=0), dtype))
    stationary = ensemble.init(jnp.asarray(exact[rng.choice(len(exact), args.chains)], dtype))
    h_harmonic = tune(ensemble, stationary, harmonic_mean, args.target, args.length, dtype)
    h_arithmetic = tune(ensemble, stationary, lambda a, d: jnp.mean(jnp.where(d, 0.0, a)), args.target, args.length,
                        dtype)
    # the neck removed: chains below the cut quantile of the first watched coordinate replaced by ones above it
    column = next(iter(watched.values()))
    above = exact[exact[:, column] > np.quantile(exact[:, column], args.cut)]
    start = ensemble.init(jnp.asarray(above[rng.choice(len(above), args.chains)], dtype))
    exact_sd = {k: float(exact[:, c].std()) for k, c in watched.items()}
    exact_q = {k: np.quantile(exact[:, c], QUANTILES) for k, c in watched.items()}
    levels = max(1, math.ceil(math.log2(h_arithmetic / h_harmonic)) + 1) if h_arithmetic > h_harmonic else 1
    out = {"problem": name, "dim": exact.shape[1], "step_harmonic": h_harmonic, "step_arithmetic": h_arithmetic,
           "levels": levels, "rules": {}}
    for rule in args.rules:
        base = h_harmonic if rule == "harmonic" else h_arithmetic
        states, grads, iteration, history, acceptance = start, 0, 0, [], []
        t = time.perf_counter()
        while grads < args.grads:
            iteration += 1
            n = max(1, math.ceil(float(halton(iteration)) * args.length / base))
            if rule == "selected":
                states, accepted, trials = ensemble.selected(args.seed, iteration, states, base, levels, n)
                grads += n + int(trials.max(axis=0).sum())  # each search runs until its last chain is done
            else:
                k = rng.integers(0, levels, args.chains) if rule == "levels" else np.zeros(args.chains, int)
                states, info = ensemble.transition(args.seed, iteration, states, jnp.asarray(base * 2.0 ** -k, dtype),
                                                   n)
                accepted = info.acceptance_rate
                grads += n
            history.append((grads, np.asarray(states.position)[:, list(watched.values())]))
            acceptance.append(float(jnp.mean(accepted)))
        checkpoints = []
        for quarter in (1, 2, 3, 4):
            first = min((quarter - 1) * len(history) // 4, len(history) - 1)  # fewer than 4 iterations: share them
            part = history[first: max(first + 1, quarter * len(history) // 4)]
            window = np.concatenate([x for _, x in part])
            checkpoints.append({"grads": part[-1][0], **{k: {
                "sd_ratio": round(float(window[:, i].std()) / exact_sd[k], 3),
                **{f"q{round(100 * q):02d}_gap": round(float(np.quantile(window[:, i], q) - exact_q[k][j]), 3)
                   for j, q in enumerate(QUANTILES)}} for i, k in enumerate(watched)}})
        out["rules"][rule] = {"step_size": base, "grads": grads, "iterations": iteration,
                              "acceptance": round(float(np.mean(acceptance)), 3),
                              "seconds": round(time.perf_counter() - t, 1), "checkpoints": checkpoints}
        last = checkpoints[-1]
        print(f"{name} {rule:<10} step {base:.4g} x{levels if rule in ('levels', 'selected') else 1} levels, {grads} grads, "
              f"acceptance {out['rules'][rule]['acceptance']}: " + "; ".join(
                  f"{k} sd {v['sd_ratio']} q01 gap {v['q01_gap']} q05 gap {v['q05_gap']}"
                  for k, v in last.items() if k != "grads"), flush=True)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--problems", type=lambda s: s.split(","), default=list(PROBLEMS))
    ap.add_argument("--rules", type=lambda s: s.split(","), default=list(RULES))
    ap.add_argument("--chains", type=int, default=1024)
    ap.add_argument("--grads", type=int, default=6000, help="sequential gradients a chain, per rule")
    ap.add_argument("--length", type=float, default=1.5, help="trajectory length T (whitened units)")
    ap.add_argument("--target", type=float, default=0.8, help="acceptance the step sizes are tuned to")
    ap.add_argument("--cut", type=float, default=0.05, help="the neck removed: below this quantile")
    ap.add_argument("--reference-draws", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "funnel_neck.json"))
    args = ap.parse_args(argv)
    unknown = sorted(set(args.problems) - set(PROBLEMS)) + sorted(set(args.rules) - set(RULES))
    if unknown:
        ap.error(f"unknown problem or rule {', '.join(unknown)}; problems: {', '.join(PROBLEMS)}; rules: "
                 f"{', '.join(RULES)}")
    t = time.perf_counter()
    runs = [run(name, args) for name in args.problems]
    write_runs(args.out, "funnel_neck", args, t, runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())

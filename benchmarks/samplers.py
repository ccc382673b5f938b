"""The peers' fixed-step HMC: a hand-written vmapped JAX HMC (the contract's floor), BlackJAX, NumPyro.

Every sampler here runs the same fixed-step HMC (Gaussian momentum, identity mass matrix, leapfrog,
Metropolis test) on the same unconstrained log density from the same starting points, so their times
compare equal work: chains x draws x num_steps gradient evaluations.
"""

from __future__ import annotations

from benchmarks.targets import Target

__all__ = ["floor_sampler", "blackjax_sampler", "numpyro_mcmc"]


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

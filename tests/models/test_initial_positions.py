"""Starting points: one chain's init jittered per chain, or the user's own per chain (a leading chain axis)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.flatten_util import ravel_pytree

from dhmc.models.resolve import initial_positions, resolve_target


def logdensity(p):
    return -0.5 * (jnp.sum(p["w"] ** 2) + jnp.sum(p["b"] ** 2))


def test_a_per_chain_init_is_each_chains_raveled_position():
    chains = 64
    rng = np.random.default_rng(0)
    init = {"w": rng.normal(size=(chains, 3)).astype(np.float32), "b": rng.normal(size=(chains, 2, 2))}
    target, name, batched = resolve_target(logdensity, init, chains, (), {})
    positions = initial_positions(target.build(), name, batched, 0, chains)
    one = lambda i: np.asarray(ravel_pytree(jax.tree.map(lambda a: jnp.asarray(a[i], jnp.float32), init))[0])
    np.testing.assert_array_equal(positions, np.stack([one(i) for i in range(chains)]))


def test_a_per_chain_init_with_one_bad_chain_is_refused():
    init = {"w": np.zeros((4, 3)), "b": np.zeros((4, 2, 2))}
    init["w"][2, 0] = np.inf
    target, name, batched = resolve_target(logdensity, init, 4, (), {})
    with pytest.raises(ValueError, match="not finite at 1 of the initial points"):
        initial_positions(target.build(), name, batched, 0, 4)

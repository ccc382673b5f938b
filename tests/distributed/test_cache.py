"""Blocks sized for the CPU's cache: the core's L2, one chain's working set, and the geometry they give."""

from __future__ import annotations

import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dhmc.distributed.cache import CACHE_SHARE, chain_working_set, chains_in_cache, l2_cache_bytes
from dhmc.geometry import default_chains_per_task


def _logistic(n):
    x = jnp.asarray(np.random.default_rng(0).normal(size=(n, 10)), jnp.float32)
    y = jnp.asarray(np.random.default_rng(1).uniform(size=n) < 0.5, jnp.float32)
    return lambda w: jnp.sum(y * (x @ w) - jnp.logaddexp(0.0, x @ w)) - 0.5 * jnp.sum(w**2)


@pytest.mark.parametrize("n", [1000, 10000])
def test_a_chains_working_set_is_its_largest_array(n):
    assert chain_working_set(_logistic(n), 10, jnp.float32) == 4 * n  # X @ w: n floats


def test_the_working_set_looks_inside_loops_and_calls():
    def fn(z):
        big = jnp.outer(z, jnp.ones(500))  # (d, 500) inside a scan's body
        return jax.lax.scan(lambda c, _: (c + jnp.sum(jnp.tanh(big)), None), 0.0, None, length=3)[0]

    assert chain_working_set(jax.jit(fn), 4, jnp.float32) == 4 * 4 * 500


def test_chains_in_cache_is_a_power_of_two_within_its_share():
    assert chains_in_cache(4000, 2**20) == 64  # 1 MiB L2: 64 x 4 KB = a quarter of it
    assert chains_in_cache(4000, 2 * 2**20) == 128
    assert chains_in_cache(40000, 2**20) == 4
    assert chains_in_cache(10 * 2**20, 2**20) == 1
    for working_set in (40, 4000, 123456):
        fits, share = chains_in_cache(working_set, 2**20), working_set * CACHE_SHARE
        assert fits & (fits - 1) == 0 and fits * share <= 2**20 < 2 * fits * share


def test_this_machines_l2_is_read_on_linux():
    size = l2_cache_bytes()
    if not sys.platform.startswith("linux"):
        pytest.skip("sysfs is Linux's")
    assert size is not None and 2**14 <= size <= 2**30


@pytest.mark.parametrize("chains, fits, expected", [(1024, 64, 64), (1024, 128, 64), (16384, 128, 128),
                                                    (16384, None, 1024), (16384, 1, 16), (8, 4, 8)])
def test_blocks_are_capped_by_the_cache_not_below_sixteen_chains(chains, fits, expected):
    assert default_chains_per_task(chains, fits=fits) == expected
    assert default_chains_per_task(chains, gpu=True, fits=fits) == min(chains, 2**16)

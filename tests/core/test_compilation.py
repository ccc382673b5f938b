"""Block programs trace once per block shape (as BlackJAX's ``test_compilation.py``).

Every value that changes from block to block of one shape (seed, chain indices, positions, adapted
parameters, first iteration, and in warmup the round's length and flags) is an argument of the
program, never a constant traced into it: a driver's precompiled program serves every block of its
shape, and a worker compiles each shape once. Traces are counted by the log density, which a trace
calls from Python and a compiled program never does.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dhmc.core.ensemble import KernelConfig, Params
from dhmc.distributed.program import BlockInputs, build_program, program_args
from dhmc.models.base import FlatModel

DIM = 3
CHAINS = 4


class CountedGaussian:
    """A standard normal log density that counts how often it is traced."""

    def __init__(self):
        self.traces = 0

    def __call__(self, x):
        self.traces += 1
        return -0.5 * jnp.sum(x**2)


def _model(logdensity) -> FlatModel:
    return FlatModel(logdensity, lambda x: {"x": x}, DIM, jnp.float32, np.zeros(DIM, np.float32), 2.0)


def _block(phase, config, seed, first_chain=0, first_iteration=0, step_size=0.0, length=0.0, chains=CHAINS,
           warmup=(4, True, False, True)):
    """A block's concrete arguments, checked against the abstract ones the driver precompiles with.

    ``warmup`` is the round's ``(num_iterations, adapt, collect_mass, find_step)``; a seed also
    scales the metric, so that every value differs between two blocks.
    """
    positions = jax.random.normal(jax.random.PRNGKey(seed), (chains, DIM), jnp.float32)
    mass = jnp.eye(DIM, dtype=jnp.float32) if config.dense_mass else jnp.ones(DIM, jnp.float32)
    params = Params(jnp.float32(step_size), mass * (1.0 + seed / 10), jnp.float32(length))
    n, adapt, collect_mass, find_step = warmup if phase == "warmup" else (0, False, False, False)
    args = BlockInputs(jnp.uint32(seed), jnp.arange(first_chain, first_chain + chains, dtype=jnp.uint32), positions,
                       params, jnp.int32(first_iteration), jnp.int32(n), jnp.bool_(adapt), jnp.bool_(collect_mass),
                       jnp.bool_(find_step))
    abstract = program_args(phase, chains, DIM, jnp.float32, config.dense_mass)
    avals = lambda tree: (jax.tree.structure(tree), [(a.shape, a.dtype) for a in jax.tree.leaves(tree)])
    assert avals(args) == avals(abstract)
    return args


def test_a_warmup_block_program_traces_once_for_every_round():
    logdensity = CountedGaussian()
    config = KernelConfig(kind="mams", dense_mass=True, record_warmup=4)
    program = jax.jit(build_program(_model(logdensity), config, "warmup", 4))
    first, _ = program(_block("warmup", config, seed=0))
    traces = logdensity.traces
    assert traces > 0
    # the next round: other seed, chains, positions, parameters, first iteration, length and flags
    second, _ = program(_block("warmup", config, seed=1, first_chain=CHAINS, first_iteration=4, step_size=0.3,
                                length=1.5, warmup=(3, False, True, False)))
    assert logdensity.traces == traces
    assert not np.array_equal(first, second)


def test_a_sample_block_program_traces_once_per_block_shape():
    logdensity = CountedGaussian()
    config = KernelConfig(kind="chees", thinning=2, step_jitter=0.2)
    program = jax.jit(build_program(_model(logdensity), config, "sample", 5))
    first, _ = program(_block("sample", config, seed=0, first_iteration=100, step_size=0.4, length=1.2))
    traces = logdensity.traces
    assert traces > 0
    second, _ = program(_block("sample", config, seed=1, first_chain=CHAINS, first_iteration=110, step_size=0.5,
                                length=2.0))
    assert logdensity.traces == traces
    assert not np.array_equal(first, second)
    # another shape: traced anew (lowered only: the trace is what is counted, its compile would add nothing)
    program.lower(_block("sample", config, seed=0, step_size=0.4, length=1.2, chains=2))
    assert logdensity.traces == 2 * traces

"""Merging a warmup round's blocks (``dhmc.distributed.warmup.merge``, pure): however the ensemble is cut into
chunks, the merged moments are the whole ensemble's, and the step size and trajectory length the chain-weighted
geometric means of the blocks'."""

from __future__ import annotations

import numpy as np
import pytest

from dhmc.core.adaptation.welford import welford
from dhmc.distributed import stopping, warmup


def _block_stats(x: np.ndarray, dense: bool, step: float, length: float) -> dict:
    """One block's ``WarmupStats`` as a worker returns them (dicts of arrays), over its chains' draws ``x``."""
    wf = welford(dense, xp=np)
    state = wf.update(wf.init(x.shape[-1], np.float64), x.reshape(-1, x.shape[-1]))
    return {"step_size": step, "trajectory_length": length, "acceptance_rate": 0.8, "divergences": 1,
            "grad_evals": 10 * len(x), "mass": state._asdict()}


@pytest.mark.parametrize("dense", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_merged_moments_do_not_depend_on_the_chunking(dense, seed):
    rng = np.random.default_rng(seed)
    chains, draws, dim = 24, 7, 3
    x = rng.normal(size=(chains, draws, dim)) * rng.uniform(0.5, 3, dim) + rng.normal(size=dim)
    cuts = np.sort(rng.choice(np.arange(1, chains), size=rng.integers(1, 6), replace=False))
    chunks = np.split(x, cuts)
    steps = rng.uniform(0.1, 1, len(chunks))
    lengths = rng.uniform(1, 5, len(chunks))
    weights = np.array([len(c) for c in chunks], float)
    stats = [_block_stats(c, dense, s, t) for c, s, t in zip(chunks, steps, lengths, strict=True)]
    merged = warmup.merge(stats, weights, dense, start_length=1.0)
    whole = warmup.merge([_block_stats(x, dense, 1.0, 1.0)], np.array([chains], float), dense, 1.0)
    np.testing.assert_allclose(merged.moments.mean, whole.moments.mean, rtol=1e-12)
    np.testing.assert_allclose(merged.moments.m2, whole.moments.m2, rtol=1e-10)
    flat = x.reshape(-1, dim)
    expected = np.cov(flat.T, ddof=1) if dense else flat.var(axis=0, ddof=1)
    np.testing.assert_allclose(stopping.variances(merged.moments), np.diag(np.atleast_2d(expected)) if dense
                               else expected, rtol=1e-10)
    assert merged.step_size == pytest.approx(np.exp(np.average(np.log(steps), weights=weights)))
    assert merged.trajectory_length == pytest.approx(np.exp(np.average(np.log(lengths), weights=weights)))
    assert merged.divergences == len(chunks) and merged.grad_evals == 10 * chains


def test_fixed_step_hmc_keeps_its_placeholder_length():
    x = np.random.default_rng(0).normal(size=(8, 4, 2))
    stats = [_block_stats(x[:4], False, 0.5, -1.0), _block_stats(x[4:], False, 0.5, -1.0)]
    assert warmup.merge(stats, np.array([4.0, 4.0]), False, start_length=-1.0).trajectory_length == -1.0

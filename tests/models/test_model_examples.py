"""The built-in examples (`dhmc.models.examples`), without a cluster; tests/test_examples.py runs examples/."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from dhmc.models import example


def test_coin_toss_labels_each_coin_in_every_group():
    """Its posterior, observations and log-likelihood share the dim ``coin`` (the observations were ``heads_dim_0``
    and the log-likelihood one value for both coins, which ``az.loo`` read as one observation)."""
    model = example("coin_toss").with_outputs(log_likelihood=True).build()
    assert model.dims == {"p": ["coin"], "heads": ["coin"]} and model.coords == {"coin": [0, 1]}
    pointwise = model.log_likelihood_fn(jnp.zeros(model.dim))["heads"]  # p = 1/2 for both coins
    expected = [math.log(math.comb(40, k)) - 40 * math.log(2.0) for k in (20, 30)]
    np.testing.assert_allclose(pointwise, expected, rtol=1e-5)

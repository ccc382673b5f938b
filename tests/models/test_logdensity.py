"""A plain JAX log density (``dhmc.models.logdensity``): any pytree position, named in the result; a log density
that cannot be sampled is a one-line error."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from dhmc.models.logdensity import LogDensityTarget, variable_names


@pytest.mark.parametrize("template, names", [
    (np.zeros(3), ["x"]),
    (0.0, ["x"]),
    ({"mu": 0.0, "theta": np.zeros(2)}, ["mu", "theta"]),
    ((0.0, np.zeros(2)), ["x_0", "x_1"]),
    ([np.zeros(2)], ["x_0"]),
    ({"a": {"b": np.zeros(2)}, "c": (1.0, 2.0)}, ["a_b", "c_0", "c_1"]),
])
def test_every_leaf_of_a_position_is_a_named_variable(template, names):
    assert variable_names(template) == names
    model = LogDensityTarget(lambda p: 0.0, template).build()
    out = model.constrain_fn(jnp.arange(model.dim, dtype=jnp.float32))
    assert list(out) == names
    assert sum(int(np.size(v)) for v in out.values()) == model.dim


def test_two_leaves_with_one_name_are_refused():
    with pytest.raises(ValueError, match=r"^init: two leaves of the position would both be named 'a_b'; rename one$"):
        variable_names({"a": {"b": 0.0}, "a_b": 0.0})


@pytest.mark.parametrize("fn, message", [
    (lambda p: jnp.sum(p > 0), "it returns int32, not a float: its gradient is zero everywhere"),
    (lambda p: -0.5 * p**2, r"it must return a scalar, got an array of shape \(2,\)"),
])
def test_a_log_density_that_cannot_be_sampled_says_why(fn, message):
    model = LogDensityTarget(fn, np.zeros(2)).build()
    with pytest.raises(ValueError, match=message):
        model.logdensity_fn(jnp.zeros(2))

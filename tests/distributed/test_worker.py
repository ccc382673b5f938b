import cloudpickle
import jax
import jax.numpy as jnp
import numpy as np

from dhmc.distributed.worker import load_model
from dhmc.models.logdensity import LogDensityTarget


def _logdensity(p):
    return -0.5 * jnp.sum(p["x"] ** 2)


def test_a_worker_builds_a_target_once_per_precision():
    # a cluster that sampled a target in float32 and then samples it with x64 must build it again in float64
    blob = np.frombuffer(cloudpickle.dumps(LogDensityTarget(_logdensity, {"x": np.zeros(2)})), np.uint8)
    before = jax.config.jax_enable_x64
    try:
        jax.config.update("jax_enable_x64", False)
        single = load_model("test-precision", blob, False)
        jax.config.update("jax_enable_x64", True)
        double = load_model("test-precision", blob, True)
    finally:
        jax.config.update("jax_enable_x64", before)
    assert single.dtype == np.float32 and double.dtype == np.float64
    assert load_model("test-precision", blob, False) is single

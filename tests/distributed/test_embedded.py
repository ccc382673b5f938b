"""The embedded cluster's start-up path: executables compiled by the driver, and workers the driver restarts."""

from __future__ import annotations

import json
import os
import signal
import time

import cloudpickle
import jax.numpy as jnp
import numpy as np

from dhmc.distributed import worker
from dhmc.distributed.plan import RunSpec
from dhmc.models import LogDensityTarget


def logdensity(p):
    return -0.5 * jnp.sum((p["x"] - 1.0) ** 2 / jnp.arange(1.0, 4.0))


def test_driver_compiled_executables_give_bitwise_the_same_draws(client2):
    """The embedded cluster runs executables the driver compiled; client2's workers compile their own."""
    import dhmc

    kw = dict(init={"x": jnp.zeros(3)}, chains=48, draws=60, warmup=100, seed=3, chains_per_task=16,
              progress=False)
    shipped = dhmc.sample(logdensity, **kw)
    compiled = dhmc.sample(logdensity, cluster=client2, **kw)
    for group in ("posterior", "sample_stats"):
        for name in shipped[group].data_vars:
            assert np.array_equal(shipped[group][name].values, compiled[group][name].values), (group, name)
    assert json.loads(shipped.attrs["dhmc_timing"])["compile"] < 1.5  # loaded (~0.2 s); compiling takes seconds


def test_an_executable_for_another_backend_is_compiled_here_instead():
    target = LogDensityTarget(logdensity, {"x": jnp.zeros(3)}, name="t")
    spec = RunSpec("t", 16, 10, 0, 5, "hmc", 0.3, 4, None, False, False, 0.8, 16, 10, False)
    blob = worker.precompile(target.build(), spec.kernel_config, "sample", 10, 16, False)
    backend, payload = cloudpickle.loads(blob)
    assert backend == "cpu"
    assert worker._load(cloudpickle.dumps(("not-" + backend, payload))) is None
    assert worker._load(b"garbage") is None


def test_a_killed_embedded_worker_is_restarted():
    from dhmc.distributed.clusters import connect

    client, close = connect(None, {"n_workers": 2})
    try:
        before = client.run(os.getpid)
        assert len(before) == 2
        victim = sorted(before.values())[0]
        os.kill(victim, signal.SIGKILL)
        deadline = time.time() + 60
        while time.time() < deadline:
            pids = set(client.run(os.getpid, on_error="ignore").values())
            if len(pids) == 2 and victim not in pids:
                break
            time.sleep(0.2)
        assert len(pids) == 2 and victim not in pids, pids
    finally:
        close()

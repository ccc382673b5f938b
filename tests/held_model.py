"""A log density whose workers stall inside their block while a file exists, so that a fault (a job
cancelled, a host killed or cut off) lands mid-run on any machine, fast or loaded, with the draws unchanged.

``held_gaussian`` is a Gaussian of mean 1 plus zeros from a callback. In a worker (not in the driver,
which traces and checks the model) the callback waits while ``HOLD`` exists, or ``HOLD.keep.<host>``
for its own host, and first creates ``HOLD.<host>``: the hosts held inside a block. The module travels
to the workers by value (it is outside the installed libraries), ``DRIVER`` and ``HOLD`` with it.
"""

from __future__ import annotations

import os
import socket
import tempfile
import time

import numpy as np

DRIVER = os.getpid()
HOLD = os.path.join(tempfile.gettempdir(), f"dhmc-test-hold-{DRIVER}")


def _stall_while_held(x):
    host = socket.gethostname()
    held = lambda: os.getpid() != DRIVER and (os.path.exists(HOLD) or os.path.exists(f"{HOLD}.keep.{host}"))
    if held():
        open(f"{HOLD}.{host}", "w").close()  # this host is held inside a block
    while held():
        time.sleep(0.05)
    return np.zeros(x.shape[:-1], x.dtype)


def held_gaussian(p):
    import jax
    import jax.numpy as jnp

    x = jax.lax.stop_gradient(p["x"])
    zeros = jax.pure_callback(_stall_while_held, jax.ShapeDtypeStruct((), x.dtype), x, vmap_method="broadcast_all")
    return -0.5 * jnp.sum((p["x"] - 1.0) ** 2) + jax.lax.stop_gradient(zeros)

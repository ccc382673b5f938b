"""A model's fingerprint: one hash of its computation and data, the same in any process.

A resume, or a worker, can then tell that it was handed the model the store was started with.
The hash covers the jaxprs of the log density's value and gradient (what the sampler runs, custom
JVP/VJP rules included) and of ``constrain_fn`` (their text: primitives, shapes, dtypes, literals)
and every constant they captured (observed data, arrays a closure holds), byte for byte, plus the
flat size and dtype. A refactor that computes the same thing keeps the fingerprint; another JAX
(or NumPyro) version may trace differently and change it: :func:`versions` records dhmc's and
JAX's. Host callbacks (``jax.pure_callback``) count by name only: their Python code is not traced.
"""

from __future__ import annotations

import hashlib
import re

import jax
import numpy as np
from jax.extend.core import ClosedJaxpr

from dhmc.errors import ModelMismatchError
from dhmc.models.base import TRACING, FlatModel

__all__ = ["fingerprint", "versions", "check_same_run"]

#: Printed callbacks carry the address of a Python object (JAX 0.10 masks the digits; older ones may not).
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def fingerprint(model: FlatModel) -> str:
    """Hex SHA-256 of the model's computation and captured data.

    The same for the same model and data in any process and on any host with the same JAX version
    and x64 setting; different when a data value, a literal, the log density's or the constrain
    function's computation, the names or shapes of the variables, the flat size or dtype changes.
    The starting point (``centre``, ``radius``), ``dims`` and ``coords`` are not part of it.

    Cost: one trace of the gradient and one of ``constrain_fn``, no compilation: 10-100 ms for the
    built-in examples (eight_schools, the largest, ~0.1 s), plus hashing the captured data at
    ~1 GB/s. Takes :data:`dhmc.models.base.TRACING` while tracing: do not call it holding that lock.

    Parameters
    ----------
    model
        The flat model, as ``target.build()`` returns it.

    Returns
    -------
    str
        64 hex digits.
    """
    position = jax.ShapeDtypeStruct((model.dim,), model.dtype)
    with TRACING:
        logdensity = jax.make_jaxpr(jax.value_and_grad(model.logdensity_fn))(position)
        constrain, shapes = jax.make_jaxpr(model.constrain_fn, return_shape=True)(position)
    h = hashlib.sha256()
    _part(h, b"dhmc-fingerprint-1")
    _part(h, f"{model.dim} {np.dtype(model.dtype).str}".encode())
    _jaxpr(h, logdensity)
    _jaxpr(h, constrain)
    leaves, treedef = jax.tree.flatten(shapes)
    _part(h, str(treedef).encode())
    for leaf in leaves:
        _part(h, f"{tuple(leaf.shape)} {np.dtype(leaf.dtype).str}".encode())
    return h.hexdigest()


def versions() -> dict[str, str]:
    """The versions a fingerprint (and a run's bitwise results) depend on: ``{"dhmc", "jax", "jaxlib"}``."""
    import jaxlib

    from dhmc import __version__

    return {"dhmc": __version__, "jax": jax.__version__, "jaxlib": jaxlib.__version__}


def check_same_run(path, attrs, model) -> None:
    """Refuse to continue a store with another model, data, dhmc or JAX version than its run's."""
    stored = dict(attrs.get("dhmc_versions") or {})
    changed = [f"{k} {stored[k]} -> {v}" for k, v in versions().items() if k in stored and stored[k] != v]
    if changed:
        raise ModelMismatchError(f"the run in {path} was made with other versions ({', '.join(changed)}): its "
                                 "draws would not continue bitwise; pass force=True (--force) to resume anyway")
    if attrs.get("dhmc_fingerprint") not in (None, fingerprint(model)):
        raise ModelMismatchError(f"the run in {path} sampled another model or other data than the one given "
                                 "(their fingerprints differ); pass force=True (--force) to resume anyway")


def _part(h, data: bytes) -> None:
    """Length-prefixed, so that no two different sequences of parts hash the same bytes."""
    h.update(len(data).to_bytes(8, "little"))
    h.update(data)


def _jaxpr(h, closed) -> None:
    _part(h, _ADDRESS.sub("", str(closed.jaxpr)).encode())
    _consts(h, closed)


def _consts(h, closed) -> None:
    """The captured arrays, which the text leaves out: the top level's and any a nested jaxpr kept."""
    for const in closed.consts:
        dtype = getattr(const, "dtype", None)
        if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            const = jax.random.key_data(const)
        value = np.ascontiguousarray(np.asarray(const))
        _part(h, f"{value.shape} {value.dtype.str}".encode())
        _part(h, value.tobytes())
    for eqn in closed.jaxpr.eqns:  # JAX hoists nested constants to the top today; this is in case it does not
        for param in eqn.params.values():
            for sub in param if isinstance(param, tuple | list) else (param,):
                if isinstance(sub, ClosedJaxpr):
                    _consts(h, sub)

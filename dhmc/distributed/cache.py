"""How many chains a CPU block holds in a core's cache: the core's L2 size and one chain's working set.

A vmapped block evaluates every chain's gradient as one batch: each intermediate array of the log
density holds all of the block's chains. While the largest of them fit a core's L2 cache a gradient
costs the same per chain at any block size; past it, every step streams from L3 (a 1000-point
logistic regression: 4.2 us per chain-gradient in blocks of 16 to 256 chains, 6.3 us in one of 1024,
on a core with 1 MiB of L2). :func:`chains_in_cache` gives the most chains a block may hold for that.
"""

from __future__ import annotations

import os
from pathlib import Path

import jax
import numpy as np

__all__ = ["L2_FALLBACK_BYTES", "CACHE_SHARE", "l2_cache_bytes", "chain_working_set", "chains_in_cache"]

L2_FALLBACK_BYTES = 2**20  # where the OS does not say: today's cores have 1-2 MiB
CACHE_SHARE = 4  # a block's largest array may take a quarter of L2 (the rest: the arrays beside it, the data)


def l2_cache_bytes(cpu: int | None = None) -> int | None:
    """The L2 (or, without one, L1 data) cache of a core this process may run on, from Linux's sysfs; None
    elsewhere."""
    if cpu is None:
        cpu = min(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 0
    sizes = {}
    for index in Path(f"/sys/devices/system/cpu/cpu{cpu}/cache").glob("index*"):
        try:
            level, kind = int((index / "level").read_text()), (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        if kind in ("Unified", "Data") and size[:-1].isdigit():
            sizes[level] = int(size[:-1]) * {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1], 1)
    return sizes.get(2, sizes.get(1))


def chain_working_set(logdensity_fn, dim: int, dtype) -> int:
    """Bytes of the largest array one chain's log density and gradient compute (traced, not run)."""
    closed = jax.make_jaxpr(jax.value_and_grad(logdensity_fn))(jax.ShapeDtypeStruct((dim,), dtype))
    largest = 0

    def walk(jaxpr) -> None:
        nonlocal largest
        for eqn in jaxpr.eqns:
            for var in eqn.outvars:
                shape, kind = getattr(var.aval, "shape", None), getattr(var.aval, "dtype", None)
                if shape is not None and kind is not None:
                    largest = max(largest, int(np.prod(shape)) * np.dtype(kind).itemsize)
            for param in eqn.params.values():  # the bodies of pjit, custom_jvp, scan, cond, while ...
                for sub in param if isinstance(param, list | tuple) else (param,):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        walk(inner)

    walk(closed.jaxpr)
    return max(largest, dim * np.dtype(dtype).itemsize)


def chains_in_cache(working_set: int, cache_bytes: int | None = None) -> int:
    """The most chains (a power of two, at least 1) whose ``working_set``-byte arrays fill at most
    ``1 / CACHE_SHARE`` of ``cache_bytes`` (default: this core's L2)."""
    cache = cache_bytes or l2_cache_bytes() or L2_FALLBACK_BYTES
    fits = max(1, cache // (CACHE_SHARE * max(1, working_set)))
    return 1 << (fits.bit_length() - 1)

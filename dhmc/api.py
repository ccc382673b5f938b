"""The public entry points ``sample`` and ``resume``.

This module imports only JAX and NumPy: distributed, xarray and zarr (~1.5 s of imports) load
where they are first needed, in the threads that start the cluster and assemble the result.
"""

from __future__ import annotations

import json
import math
import time
from contextlib import nullcontext
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np

from dhmc.core.ensemble import KERNELS, initial_positions
from dhmc.distributed.plan import RunSpec, default_chains_per_task, default_draws_per_segment
from dhmc.models import LogDensityTarget, NumPyroTarget, example, is_numpyro_model
from dhmc.models.base import TRACING, FlatModel
from dhmc.storage import schema

if TYPE_CHECKING:
    import xarray as xr

__all__ = ["sample", "resume"]


def _version() -> str:
    from dhmc import __version__

    return __version__


def sample(
    target,
    *,
    init=None,
    chains: int = 1024,
    draws: int = 1000,
    warmup: int = 1000,
    seed: int = 0,
    kernel: str = "chees",
    step_size: float | None = None,
    num_steps: int | None = None,
    trajectory_length: float | None = None,
    adapt: bool = True,
    dense_mass: bool = False,
    target_accept: float = 0.8,
    cluster=None,
    chains_per_task: int | None = None,
    store: str | Path | None = None,
    model_args: tuple = (),
    model_kwargs: dict | None = None,
    progress: bool = True,
    overwrite: bool = False,
    cluster_options: dict | None = None,
) -> xr.DataTree:
    """Sample an ensemble of HMC chains on a Dask cluster.

    Parameters
    ----------
    target
        A JAX log density of one chain's position (a pytree; needs ``init``), a NumPyro model
        function, or the name of a built-in model (see ``dhmc.models.EXAMPLES``).
    init
        For a log density: one chain's position (jittered per chain by U(-0.5, 0.5)) or a pytree
        with a leading axis of length ``chains``. For a NumPyro model: optional; by default chains
        start uniformly in [-2, 2] in unconstrained space.
    chains, draws, warmup, seed
        Ensemble size, draws kept per chain, adaptation iterations, random seed.
    kernel
        ``"chees"`` (jittered trajectories, ChEES-adapted length) or ``"hmc"`` (fixed steps).
    step_size, num_steps, trajectory_length
        Fixed HMC settings; ``trajectory_length = step_size * num_steps``. With ``adapt=True`` a given
        ``step_size`` is only the starting point.
    adapt, dense_mass, target_accept
        Adapt step size, trajectory length and a diagonal (or dense) inverse mass matrix during warmup,
        steering the ensemble's harmonic-mean acceptance to ``target_accept``.
    cluster
        None (an embedded local cluster), ``"local"``, ``"cuda"``, ``"slurm"``, a scheduler address, a
        ``distributed.Client`` or a ``Cluster``.
    chains_per_task
        Chains per block; the draws are bitwise reproducible for a given seed and ``chains_per_task``.
    store
        A Zarr path; blocks are written there as they finish and the result is opened lazily from it.
    model_args, model_kwargs
        Arguments of a NumPyro model.
    progress, overwrite, cluster_options
        Show progress; replace an existing store; options for the cluster kind (see ``dhmc.yaml``).

    Returns
    -------
    xarray.DataTree
        Groups ``posterior``, ``sample_stats`` (and ``observed_data``), dims ``(chain, draw, ...)``.
    """
    _check_positive(chains=chains, draws=draws)
    _check_nonnegative(warmup=warmup)
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; choose one of: {', '.join(KERNELS)}")
    if not 0.0 < target_accept < 1.0:
        raise ValueError(f"target_accept must be in (0, 1), got {target_accept}")
    if step_size is not None and not step_size > 0:
        raise ValueError(f"step_size must be positive, got {step_size}")
    if num_steps is not None and num_steps < 1:
        raise ValueError(f"num_steps must be at least 1, got {num_steps}")
    if kernel == "hmc" and num_steps is None and trajectory_length is None:
        num_steps = 10
    if warmup == 0 and adapt:
        if step_size is None:
            raise ValueError("warmup=0 leaves nothing to adapt: give warmup > 0, or adapt=False with step_size and "
                             "num_steps (or trajectory_length)")
        adapt = False
    if not adapt and (step_size is None or (num_steps is None and trajectory_length is None)):
        raise ValueError("adapt=False needs step_size and num_steps (or trajectory_length)")

    resolved, name, batched = _resolve_target(target, init, chains, model_args, model_kwargs)
    model = resolved.build()
    x64 = bool(jax.config.jax_enable_x64)
    layout = _layout(model, chains, draws, chains_per_task, cluster)
    spec = RunSpec(name, chains, draws, warmup, seed, kernel, step_size, num_steps, trajectory_length, adapt,
                   dense_mass, target_accept, layout.chains_per_task, layout.draws_per_segment, x64)
    attrs = _attrs(spec)
    if store is not None:
        from dhmc.storage import zarr_

        zarr_.check_writable(store, overwrite)
    startup = _Startup(spec, model, cluster, cluster_options)
    try:
        positions = _initial_positions(model, name, batched, seed, chains)
    except BaseException:
        startup.abandon()
        raise
    return _execute(spec, resolved, model, layout, positions, attrs, startup, store, overwrite, progress,
                    resume_root=None)


def resume(path, cluster=None, *, target=None, init=None, model_args: tuple = (), model_kwargs: dict | None = None,
           progress: bool = True, cluster_options: dict | None = None) -> xr.DataTree:
    """Continue an interrupted run from the blocks already in its store.

    The result is bitwise identical to an uninterrupted run. A built-in model is found by its name;
    a run whose model was a Python function needs it again: ``resume(path, target=fn, init=...)``.
    """
    from dhmc.storage import zarr_

    root, layout = zarr_.open_store(path)
    try:
        spec = RunSpec(**json.loads(root.attrs["dhmc_run_spec"]))
    except Exception as e:  # noqa: BLE001
        raise zarr_.StoreError(f"store {path} is broken: unreadable run spec ({e})") from None
    if spec.x64 and not jax.config.jax_enable_x64:
        jax.config.update("jax_enable_x64", True)
    if target is None:
        if spec.model.startswith("python:"):
            raise ValueError(f"the run in {path} sampled the Python function {spec.model[7:]!r}; resume it from "
                             "Python: dhmc.resume(path, target=<the same function>, init=<the same init>)")
        target = spec.model
    resolved, _, _ = _resolve_target(target, init, spec.chains, model_args, model_kwargs)
    model = resolved.build()
    attrs = {k: root.attrs[k] for k in ("created_at", "inference_library", "inference_library_version",
                                        "dhmc_run_spec")}
    return _execute(spec, resolved, model, layout, None, attrs, _Startup(spec, model, cluster, cluster_options), path,
                    False, progress, resume_root=root)


# -- internals ------------------------------------------------------------------------------------------


def _check_positive(**values):
    for key, value in values.items():
        if not isinstance(value, int | np.integer) or value < 1:
            raise ValueError(f"{key} must be a positive integer, got {value!r}")


def _check_nonnegative(**values):
    for key, value in values.items():
        if not isinstance(value, int | np.integer) or value < 0:
            raise ValueError(f"{key} must be a non-negative integer, got {value!r}")


def _resolve_target(target, init, chains, model_args, model_kwargs):
    """Return ``(target object, name for the run spec, batched flat init or None)``."""
    if isinstance(target, str):
        return example(target), target, None
    if isinstance(target, LogDensityTarget | NumPyroTarget) or hasattr(target, "build"):
        return target, getattr(target, "name", "") or f"python:{type(target).__name__}", None
    if not callable(target):
        raise TypeError(f"target must be a log-density function, a NumPyro model or a model name, got "
                        f"{type(target).__name__}")
    name = f"python:{getattr(target, '__qualname__', repr(target))}"
    if is_numpyro_model(target, init, model_args, model_kwargs):
        return NumPyroTarget(target, tuple(model_args), dict(model_kwargs or {}), name=name), name, None
    leaves = jax.tree.leaves(init)
    if not leaves:
        raise ValueError("init must be a pytree of arrays (one chain's position) for a log-density target")
    firsts = {np.shape(leaf)[0] if np.ndim(leaf) else None for leaf in leaves}
    if len(firsts) == 1 and None not in firsts:
        (lead,) = firsts
        if lead == chains:
            one = jax.tree.map(lambda a: np.asarray(a)[0], init)
            return LogDensityTarget(target, one, name=name), name, init
        if all(np.ndim(leaf) >= 2 for leaf in leaves):
            raise ValueError(f"init has a leading axis of {lead} on every leaf but chains={chains}: give one "
                             f"chain's position or one with a leading axis of length {chains}")
    return LogDensityTarget(target, init, name=name), name, None


def _initial_positions(model: FlatModel, name, batched, seed, chains) -> np.ndarray:
    """Distinct starting points per chain, checked for a finite log density before any work is sent."""
    from jax.flatten_util import ravel_pytree

    if batched is not None:
        positions = np.stack([np.asarray(ravel_pytree(jax.tree.map(lambda a, i=i: jnp.asarray(a)[i], batched))[0],
                                         model.dtype) for i in range(chains)])
    else:
        positions = np.array(initial_positions(seed, jnp.arange(chains, dtype=jnp.uint32),
                                               jnp.asarray(model.centre, model.dtype), model.radius))
    logdensity = _evaluate(model, name, positions)
    bad = ~np.isfinite(logdensity)
    if bad.any() and batched is None:
        positions[bad] = model.centre
        logdensity = _evaluate(model, name, positions)
        bad = ~np.isfinite(logdensity)
    if bad.any():
        where = "at the initial point" if batched is None else f"at {int(bad.sum())} of the initial points"
        raise ValueError(f"the log density of {name!r} is not finite {where} (got {logdensity[bad][0]}); "
                         "give an init where it is finite")
    return positions


def _evaluate(model: FlatModel, name, positions) -> np.ndarray:
    try:
        with TRACING:
            evaluate = jax.jit(jax.vmap(model.logdensity_fn)).lower(jnp.asarray(positions))
        values = evaluate.compile()(jnp.asarray(positions))
    except Exception as e:  # noqa: BLE001 - the user's function failed: say which and on what
        msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
        raise ValueError(f"the log density {name!r} failed on one chain's position (flat size {model.dim}): "
                         f"{type(e).__name__}: {msg}") from None
    values = np.asarray(values)
    if values.shape != (positions.shape[0],):
        raise ValueError(f"the log density {name!r} must return a scalar per position, got shape "
                         f"{values.shape[1:]}")
    return values


def _layout(model: FlatModel, chains, draws, chains_per_task, cluster) -> schema.Layout:
    if chains_per_task is None:
        chains_per_task = default_chains_per_task(chains, gpu=cluster == "cuda")
    if not isinstance(chains_per_task, int | np.integer) or chains_per_task < 1:
        raise ValueError(f"chains_per_task must be a positive integer, got {chains_per_task!r}")
    chains_per_task = min(int(chains_per_task), chains)
    shapes = jax.eval_shape(model.constrain_fn, jax.ShapeDtypeStruct((model.dim,), model.dtype))
    variables = {k: (tuple(v.shape), v.dtype) for k, v in shapes.items()}
    bytes_per_draw = sum(4 * max(1, math.prod(s)) for s, _ in variables.values()) + 4 * 8
    dps = default_draws_per_segment(draws, chains_per_task, bytes_per_draw)
    return schema.make_layout(chains, draws, chains_per_task, dps, variables, model.dtype, model.dims,
                              model.coords)


def _attrs(spec: RunSpec) -> dict:
    from dataclasses import asdict

    return {
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "inference_library": "dhmc",
        "inference_library_version": _version(),
        "dhmc_run_spec": json.dumps(asdict(spec)),
    }


class _MemorySink:
    """Blocks written into NumPy arrays, which a DataTree wraps without copying.

    The tree is built in a thread while the run goes on (its first build imports half of xarray's
    optional dependencies, ~0.5 s here), and gets its attributes at the end.
    """

    def __init__(self, layout: schema.Layout, extra_groups: dict | None):
        from concurrent.futures import ThreadPoolExecutor

        self.layout = layout
        self.arrays = {
            group: {name: np.full((layout.chains, layout.draws, *s.shape), schema.fill_value(s.dtype), s.dtype)
                    for name, s in specs.items()}
            for group, specs in layout.groups().items()
        }
        pool = ThreadPoolExecutor(1, thread_name_prefix="dhmc-assemble")
        self._tree = pool.submit(schema.to_datatree, layout, self.arrays, {}, extra_groups)
        pool.shutdown(wait=False)

    def tree(self, attrs: dict) -> xr.DataTree:
        tree = self._tree.result()
        for node in tree.subtree:
            node.attrs.update(attrs)
        return tree

    def write(self, chunk, segment, block):
        c0 = chunk * self.layout.chains_per_task
        d0 = segment * self.layout.draws_per_segment
        for group, values in self.arrays.items():
            for name, array in values.items():
                v = block[group][name]
                array[c0:c0 + v.shape[0], d0:d0 + v.shape[1]] = v


class _StoreSink:
    """Blocks written to Zarr by a writer thread, in arrival order, so that sampling goes on meanwhile.

    Each chunk's segments arrive in order, so the store still holds a prefix of every chunk; at most
    ``max_pending`` blocks wait in memory (the driver then waits for the writer).
    """

    def __init__(self, root, layout, max_pending: int = 8):
        from concurrent.futures import ThreadPoolExecutor

        from dhmc.storage import zarr_

        self.root, self.layout, self.max_pending = root, layout, max_pending
        self.arrays = zarr_.block_arrays(root, layout)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="dhmc-write")
        self._pending: list = []

    def write(self, chunk, segment, block):
        from dhmc.storage import zarr_

        self._pending.append(self._pool.submit(zarr_.write_block, self.root, self.layout, chunk, segment, block,
                                               self.arrays))
        while self._pending and (self._pending[0].done() or len(self._pending) > self.max_pending):
            self._pending.pop(0).result()  # raises a failed write here

    def flush(self):
        """Wait until every block handed over is on disk; the sink takes no more blocks after this."""
        try:
            while self._pending:
                self._pending.pop(0).result()
        finally:
            self._pool.shutdown(wait=True)


class _Startup:
    """The embedded cluster starts, and the driver compiles the block programs, in the background.

    Both begin once the cheap checks pass and overlap with checking the log density. Other clusters
    are connected to when :meth:`connect` is called; their workers compile for themselves.
    """

    def __init__(self, spec, model, cluster, options):
        from dhmc.distributed.runner import precompile

        self.t0 = time.perf_counter()
        self.cluster, self.options = cluster, options
        embedded = (cluster is None or cluster == "local") and jax.default_backend() == "cpu"
        self.executables = precompile(spec, model) if embedded else None
        self._pending = _in_thread(_connect, cluster, options) if embedded else None

    def connect(self):
        """``(client, close)``, waiting for a cluster being started."""
        connected = self._pending.result() if self._pending else _connect(self.cluster, self.options)
        self.seconds = time.perf_counter() - self.t0
        return connected

    def abandon(self) -> None:
        """Close, in the background, a cluster started for a call that failed before using it."""
        if self._pending is not None:
            pending = self._pending
            _in_thread(lambda: pending.result()[1]())


def _connect(cluster, options):
    from dhmc.distributed.clusters import connect  # imports distributed

    return connect(cluster, options)


def _in_thread(fn, *args):
    from concurrent.futures import ThreadPoolExecutor

    pool = ThreadPoolExecutor(1, thread_name_prefix="dhmc")
    future = pool.submit(fn, *args)
    pool.shutdown(wait=False)
    return future


def _execute(spec, target, model, layout, positions, attrs, startup, store, overwrite, progress, resume_root):
    from distributed import span

    from dhmc.distributed.runner import Runner, initial_params
    from dhmc.observe.progress import Progress

    if store is not None:
        from dhmc.storage import zarr_

    client, close = startup.connect()
    executables, t0 = startup.executables, startup.t0
    try:
        _install_observers(client)
        root = resume_root
        if store is not None and root is None:
            root = zarr_.create_store(store, layout, model.dim, model.dtype, attrs, model.observed_data, overwrite)
        extra = {"observed_data": model.observed_data} if model.observed_data else None
        sink = _StoreSink(root, layout) if root is not None else _MemorySink(layout, extra)
        plan = spec.plan
        bar = Progress(plan.num_chunks * plan.num_segments, client.dashboard_link) if progress else None
        runner = Runner(client, spec, target, model.dim, model.dtype, sink, bar, executables, store=store)
        with span(f"dhmc-{runner.run_id}") if span else nullcontext():
            saved = zarr_.load_warmup(root, model.dtype) if resume_root is not None else None
            if saved is not None:
                positions, params = saved
                history = root.attrs.get("dhmc_warmup", [])
            else:
                if positions is None:  # resume before warmup finished: start again, deterministically
                    positions = _initial_positions(model, spec.model, None, spec.seed, spec.chains)
                params = initial_params(spec, model.dim, model.dtype)
                positions, params, history = runner.warmup(positions, params) if spec.warmup else (
                    positions, params, [])
                if root is not None:
                    zarr_.save_warmup(root, positions, params, history)
            done = zarr_.blocks_done(root) if resume_root is not None else None
            starts = {}
            for c in range(plan.num_chunks):
                seg = int(np.argmin(done[c])) if done is not None and not done[c].all() else (
                    plan.num_segments if done is not None else 0)
                chains = slice(plan.chunk(c).start, plan.chunk(c).stop)
                starts[c] = (seg, positions[chains] if seg == 0 else zarr_.segment_start_positions(root, seg, chains))
            runner.sample(starts, params)
        if bar:
            bar.close()
        timing = {"cluster_start": startup.seconds, **runner.timing, "total": time.perf_counter() - t0}
        attrs = {**attrs, "dhmc_timing": json.dumps(timing), "dhmc_warmup": json.dumps(history)}
        if root is not None:
            for node in ("", "posterior", "sample_stats"):
                (root[node] if node else root).attrs.update(attrs)
            return zarr_.open_trace(store)
        return sink.tree(attrs)
    finally:
        close()


def _install_observers(client) -> None:
    try:
        from dhmc.observe.metrics import install
    except ImportError:
        return
    try:
        install(client)
    except Exception:  # noqa: BLE001 - observability never stops a run
        pass


"""The public entry points ``sample`` and ``resume``: check the input, build the run, hand it to the driver.

This module imports only JAX and NumPy: distributed, xarray and zarr (~1.5 s of imports) load
where they are first needed, in the threads that start the cluster and assemble the result.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import jax

from dhmc.distributed.driver import RunContext, drive
from dhmc.distributed.spec import RunSpec, check_kernel_fits, check_options, layout_for
from dhmc.distributed.startup import Startup
from dhmc.models.fingerprint import fingerprint, versions
from dhmc.models.resolve import initial_positions, resolve_target

if TYPE_CHECKING:
    import xarray as xr

__all__ = ["sample", "resume"]


def sample(
    target,
    *,
    init=None,
    chains: int = 1024,
    draws: int | str = 1000,
    warmup: int = 1000,
    seed: int = 0,
    kernel: str = "chees",
    step_size: float | None = None,
    num_steps: int | None = None,
    trajectory_length: float | None = None,
    adapt: bool = True,
    dense_mass: bool = False,
    target_accept: float | None = None,
    cluster=None,
    chains_per_task: int | None = None,
    store: str | Path | None = None,
    model_args: tuple = (),
    model_kwargs: dict | None = None,
    progress: bool = True,
    overwrite: bool = False,
    cluster_options: dict | None = None,
    target_ess: float | None = None,
    max_draws: int | None = None,
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
        Ensemble size, draws kept per chain (or ``"auto"``), adaptation iterations, random seed.
    kernel
        ``"chees"`` (HMC, jittered trajectories of ChEES-adapted length), ``"mams"`` (Metropolis-adjusted
        microcanonical dynamics, same adaptation; needs two or more dimensions) or ``"hmc"`` (fixed steps).
    step_size, num_steps, trajectory_length
        Fixed HMC settings; ``trajectory_length = step_size * num_steps``. With ``adapt=True`` a given
        ``step_size`` is only the starting point.
    adapt, dense_mass, target_accept
        Adapt step size, trajectory length and a diagonal (or dense) inverse mass matrix during warmup,
        steering the ensemble's harmonic-mean acceptance to ``target_accept`` (default 0.8; 0.9 for MAMS).
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
    target_ess, max_draws
        With ``draws="auto"``: sample segment by segment until every scalar's bulk and tail ESS reach
        ``target_ess`` (1000) and nested R-hat is below 1.01, or ``max_draws`` (10000) draws.

    Returns
    -------
    xarray.DataTree
        Groups ``posterior``, ``sample_stats`` (and ``observed_data``), dims ``(chain, draw, ...)``.
    """
    options = check_options(chains=chains, draws=draws, warmup=warmup, kernel=kernel, step_size=step_size,
                            num_steps=num_steps, trajectory_length=trajectory_length, adapt=adapt,
                            target_accept=target_accept, chains_per_task=chains_per_task, target_ess=target_ess,
                            max_draws=max_draws)
    resolved, name, batched = resolve_target(target, init, chains, model_args, model_kwargs)
    model = resolved.build()
    check_kernel_fits(options["kernel"], model.dim)
    layout = layout_for(model, chains, options["draws"], chains_per_task, gpu=cluster == "cuda",
                        auto=options["target_ess"] is not None)
    spec = RunSpec(model=name, seed=seed, dense_mass=dense_mass, chains_per_task=layout.chains_per_task,
                   draws_per_segment=layout.draws_per_segment, x64=bool(jax.config.jax_enable_x64), **options)
    if store is not None:
        from dhmc.storage import zarr_

        zarr_.check_writable(store, overwrite)
    startup = Startup(spec, model, cluster, cluster_options)
    try:
        positions = initial_positions(model, name, batched, seed, chains)
    except BaseException:
        startup.abandon()
        raise
    run = RunContext(spec=spec, target=resolved, model=model, layout=layout, attrs=_attrs(spec, model, store),
                     positions=positions, store=store, overwrite=overwrite, observers=_observers(progress))
    return drive(run, startup)


def resume(path, cluster=None, *, target=None, init=None, model_args: tuple = (), model_kwargs: dict | None = None,
           progress: bool = True, cluster_options: dict | None = None, force: bool = False) -> xr.DataTree:
    """Continue an interrupted run from the blocks already in its store.

    The result is bitwise identical to an uninterrupted run. A built-in model is found by its name;
    a run whose model was a Python function needs it again: ``resume(path, target=fn, init=...)``.
    A model or data other than the store's, or another dhmc or JAX version, raises
    :class:`~dhmc.errors.ModelMismatchError` unless ``force=True``.
    """
    from dhmc.storage import zarr_
    from dhmc.storage.lock import check_free

    root, layout = zarr_.open_store(path)
    check_free(path)  # another run writing it: refused before any cluster starts
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
    resolved, _, _ = resolve_target(target, init, spec.chains, model_args, model_kwargs)
    model = resolved.build()
    if not force:
        _check_same_run(path, root.attrs, model)
    attrs = {k: root.attrs[k] for k in ("created_at", "inference_library", "inference_library_version",
                                        "dhmc_run_spec", "dhmc_fingerprint", "dhmc_versions") if k in root.attrs}
    run = RunContext(spec=spec, target=resolved, model=model, layout=layout, attrs=attrs, store=path, resume=True,
                     observers=_observers(progress))
    return drive(run, Startup(spec, model, cluster, cluster_options))


def _attrs(spec: RunSpec, model, store) -> dict:
    """The result's attributes; a store's also fingerprint the model (10-100 ms), for ``resume`` to check."""
    from dhmc import __version__

    identity = {"dhmc_fingerprint": fingerprint(model), "dhmc_versions": versions()} if store is not None else {}
    return {
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "inference_library": "dhmc",
        "inference_library_version": __version__,
        "dhmc_run_spec": json.dumps(asdict(spec)),
        **identity,
    }


def _check_same_run(path, attrs, model) -> None:
    """Refuse to continue a store with another model, data, dhmc or JAX version than its run's."""
    from dhmc.errors import ModelMismatchError

    stored = dict(attrs.get("dhmc_versions") or {})
    changed = [f"{k} {stored[k]} -> {v}" for k, v in versions().items() if k in stored and stored[k] != v]
    if changed:
        raise ModelMismatchError(f"the run in {path} was made with other versions ({', '.join(changed)}): its "
                                 "draws would not continue bitwise; pass force=True (--force) to resume anyway")
    if attrs.get("dhmc_fingerprint") not in (None, fingerprint(model)):
        raise ModelMismatchError(f"the run in {path} sampled another model or other data than the one given "
                                 "(their fingerprints differ); pass force=True (--force) to resume anyway")


def _observers(progress: bool) -> tuple:
    """The dashboard's publisher always; the progress line on request."""
    from dhmc.observe.progress import Progress
    from dhmc.observe.publisher import DashboardPublisher

    return (DashboardPublisher(), Progress()) if progress else (DashboardPublisher(),)

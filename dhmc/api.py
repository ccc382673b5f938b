"""The public entry points ``sample`` and ``resume``: check the input, build the run, hand it to the driver.

This module imports only JAX and NumPy: distributed, xarray and zarr (~1.5 s of imports) load
where they are first needed, in the threads that start the cluster and assemble the result.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import jax
import numpy as np

from dhmc.distributed.cold_rounds import cold_applies
from dhmc.distributed.continuation import continued_run
from dhmc.distributed.driver import RunContext, drive
from dhmc.distributed.observers import Observer
from dhmc.distributed.spec import (
    RunSpec,
    adapted_options,
    check_kernel_fits,
    check_options,
    geometry_for,
    layout_for,
    run_attrs,
)
from dhmc.distributed.startup import Startup, pickle_target
from dhmc.models.base import TRACING
from dhmc.models.reference import ReferenceTarget, is_reference
from dhmc.models.resolve import initial_positions, resolve_target, with_labels, with_laplace, with_outputs
from dhmc.storage.memory import check_fits

if TYPE_CHECKING:
    from collections.abc import Sequence

    import xarray as xr

__all__ = ["sample", "resume", "extend"]


def sample(
    target,
    *,
    init=None,
    chains: int = 1024,
    draws: int | str = 1000,
    warmup: int | str = "auto",
    seed: int = 0,
    kernel: str = "chees",
    step_size: float | None = None,
    num_steps: int | None = None,
    trajectory_length: float | None = None,
    adapt: bool = True,
    dense_mass: bool | None = None,
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
    thinning: int = 1,
    log_likelihood: bool = False,
    predictive: bool = False,
    prior: int = 0,
    dims: dict | None = None,
    coords: dict | None = None,
    adapted_from: str | Path | None = None,
    save_warmup: bool = False,
    max_warmup: int | None = None,
    observers: tuple = (),
    noncentered: bool = False,
    laplace: bool | str | Sequence[str] = False,
) -> xr.DataTree:
    """Sample an ensemble of HMC chains on a Dask cluster.

    Parameters
    ----------
    target
        A JAX log density of one chain's position (a pytree; needs ``init``), a NumPyro model
        function, a ``pymc.Model`` or ``bambi.Model`` (sampled through PyMC's JAX backend; see the
        PyMC page of the docs), the name of a built-in model (see ``dhmc.models.EXAMPLES``), or a
        target the workers make themselves (:func:`dhmc.models.by_reference`).
    init
        For a log density: one chain's position (jittered per chain by U(-0.5, 0.5)) or a pytree
        with a leading axis of length ``chains``. For a NumPyro model: optional; by default chains
        start uniformly in [-2, 2] in unconstrained space; give a dict of site values or a NumPyro init
        strategy (``init_to_median()``) to start near its point. For a PyMC model: optional; chains start
        at ``model.initial_point()`` plus U(-1, 1) unconstrained, a dict of free variables' values
        replacing the model's own.
    chains, draws, warmup, seed, thinning
        Ensemble size, draws kept per chain (or ``"auto"``), adaptation iterations (or ``"auto"``),
        random seed; a draw is kept every ``thinning`` transitions.
    max_warmup
        With ``warmup="auto"`` (the default): a cold phase first (unadjusted isokinetic steps, one gradient
        each, the step size adapted after every gradient and the metric every 20 from the whole ensemble's
        positions and gradients; at most 400 gradients, its draws never kept), then adjusted rounds of 15
        iterations until the ensemble has converged (its moments agree with the last rounds', its chains
        move and their own changes average out, step size and trajectory length are stable), at most
        ``max_warmup`` (1000) adjusted iterations; reaching it first warns. An integer ``warmup``: that many
        adjusted iterations, no cold phase.
    kernel
        ``"chees"`` (HMC, jittered trajectories of ChEES-adapted length), ``"mams"`` (Metropolis-adjusted
        microcanonical dynamics, same adaptation; needs two or more dimensions) or ``"hmc"`` (fixed steps).
    step_size, num_steps, trajectory_length
        Fixed HMC settings; ``trajectory_length = step_size * num_steps``. With ``adapt=True`` a given
        ``step_size`` is only the starting point. ``kernel="hmc"`` with neither ``num_steps`` nor
        ``trajectory_length`` takes 10 steps a draw.
    adapt, dense_mass, target_accept
        Adapt step size, trajectory length and a diagonal (or dense) inverse mass matrix during warmup,
        steering the ensemble's harmonic-mean acceptance to ``target_accept`` (default 0.8; 0.9 for MAMS).
        ``dense_mass=None``: ``warmup="auto"`` chooses a dense metric where the ensemble after its cold phase
        is correlated enough to pay for one and has the chains to estimate it (2 per dimension; at most 1000
        dimensions), else diagonal (an integer warmup: diagonal); the result's run spec says which.
    cluster
        None (an embedded local cluster), ``"local"``, ``"cuda"``, ``"slurm"``, a scheduler address, a
        ``distributed.Client`` or a ``Cluster``.
    chains_per_task
        Chains per block; the draws are bitwise reproducible for a given seed and ``chains_per_task``. None:
        about 1/16 of the ensemble on CPUs, at most as many chains as this machine's L2 cache holds the
        log density's largest array for (so it can differ between machines: give it to reproduce a run
        bitwise elsewhere); the whole ensemble (up to 2**16) on a GPU.
    store
        A Zarr path; blocks are written there as they finish and the result is opened lazily from it.
    model_args, model_kwargs
        Arguments of a NumPyro model.
    progress, overwrite, cluster_options
        Show progress; replace an existing store; options for the cluster kind (see ``dhmc.yaml``).
    target_ess, max_draws
        With ``draws="auto"``: sample segment by segment until every scalar's bulk and tail ESS and the ESS of its
        sd (:func:`dhmc.stats.ess_sd`: a heavy tail's sd takes more draws) reach ``target_ess`` (1000), nested
        R-hat is below 1.01 and the chains have forgotten their first draw
        (:func:`dhmc.distributed.monitor.start_memory`), or ``max_draws`` (10000) draws.
    log_likelihood, predictive, prior
        For a NumPyro or PyMC model: also store each observed site's pointwise log-likelihood (group
        ``log_likelihood``, for ``arviz.loo``/``waic``), a draw of it per posterior draw
        (``posterior_predictive``, for ``arviz.plot_ppc``), and ``prior`` draws of the prior
        (``prior``, ``prior_predictive``). Each holds chains x draws x observations values.
    noncentered
        For a NumPyro model: sample every latent site whose ``loc`` or ``scale`` depends on other latent sites
        (a hierarchy's ``theta ~ Normal(mu, tau)``) non-centred, ``theta = mu + tau * theta_decentered``
        (NumPyro's ``LocScaleReparam(0)``), ``theta`` still reported. For a PyMC model the same for every
        ``pm.Normal`` free variable whose ``mu`` or ``sigma`` depends on another free variable (rewritten on a
        copy of the model's graph: :mod:`dhmc.models.pymc_noncentred`). A centred hierarchy's funnel is the one
        geometry no step size serves: the centred eight schools takes tens of thousands of gradients a chain
        and stays biased; non-centred, a few hundred (``benchmarks/README.md``).
    laplace
        Sample the named latent variables (a log density's leaves, a NumPyro model's latent sites, a PyMC model's
        free variables; ``True``: a NumPyro or PyMC model's hierarchical ones, those ``noncentered`` would
        non-centre) whitened by their conditional mode and curvature given the rest, ``x = m(u) + L(u)^-T z``
        (:mod:`dhmc.models.laplace`), ``x`` still reported. Where ``x`` is Gaussian given the scales ``u`` every
        funnel between them is gone, the data's as well as the prior's (a Brownian motion's observation noise,
        which non-centring leaves); exact for any model. Each gradient then costs the latent block's Hessian and
        its Cholesky factor: for tens to a few hundred latent coordinates whose conditional is Gaussian-like.
    dims, coords
        Names of a variable's axes (``{"theta": ["school"]}``) and a dim's coordinates
        (``{"school": [...]}``), on top of those NumPyro plates give.
    save_warmup
        Keep the warmup's draws too, in a ``warmup_posterior`` group (``(chain, draw, ...)``, as ArviZ names it).
    adapted_from
        A store whose adapted step size, trajectory length and mass matrix this run takes (its warmup,
        if any, then only moves the chains). Its run must have sampled the same coordinates: as many, and
        the same ``noncentered`` and ``laplace``.
    observers
        Objects told of the run's events as they happen, beside the progress bar and the dashboard:
        any of the methods of :class:`dhmc.Observer` (``start_run``, ``warmup_block``,
        ``sample_block``, ``convergence_check``, ``close``). One that raises is logged and dropped.

    Returns
    -------
    xarray.DataTree
        Groups ``posterior``, ``sample_stats`` (and ``observed_data``, ``log_likelihood``), dims
        ``(chain, draw, ...)``.
    """
    observers = _checked(observers)
    options = check_options(chains=chains, draws=draws, warmup=warmup, kernel=kernel, step_size=step_size,
                            num_steps=num_steps, trajectory_length=trajectory_length, adapt=adapt,
                            target_accept=target_accept, chains_per_task=chains_per_task, target_ess=target_ess,
                            max_draws=max_draws, thinning=thinning, prior=prior, max_warmup=max_warmup, seed=seed)
    with TRACING:  # NumPyro's handler stack is global: runs prepared in two threads take turns
        resolved, name, batched = resolve_target(target, init, chains, model_args, model_kwargs)
        resolved = with_outputs(resolved, name, log_likelihood, predictive, options["prior"], noncentered)
        by_reference = isinstance(resolved, ReferenceTarget)
        resolved, latent = with_laplace(resolved, name, laplace, noncentered)
        pickled = pickle_target(resolved)  # as the user gave it: nothing has traced it yet
        model = with_labels(resolved.build(), dims, coords)
        check_kernel_fits(options["kernel"], model.dim)
        options["cold_start"] = options["cold_start"] and cold_applies(options["chains"], model.dim)
        params = None
        if adapted_from is not None:
            options, params = adapted_options(adapted_from, options, model.dim, latent, noncentered)
            dense_mass = params["inverse_mass_matrix"].ndim == 2
        layout = layout_for(model, warmup_draws=options["warmup"] if save_warmup else 0)
        geometry = geometry_for(model, layout, chains, options["draws"], chains_per_task, gpu=cluster == "cuda",
                                target_ess=options["target_ess"])
    spec = RunSpec(model=name, seed=seed, dense_mass=dense_mass, chains_per_task=geometry.chains_per_task,
                   by_reference=by_reference,
                   draws_per_segment=geometry.draws_per_segment, x64=bool(jax.config.jax_enable_x64),
                   log_likelihood=bool(log_likelihood), adapted_from=adapted_from and str(adapted_from),
                   predictive=bool(predictive), save_warmup=bool(save_warmup), noncentered=bool(noncentered),
                   laplace=latent,
                   **options)
    check_fits(layout, geometry, model.dim * np.dtype(model.dtype).itemsize, in_memory=store is None,
               grow=options["target_ess"] is not None)
    if store is not None:
        from dhmc.storage import zarr_

        zarr_.check_writable(store, overwrite)
    startup = Startup(spec, model, cluster, cluster_options)
    try:
        positions = initial_positions(model, name, batched, seed, chains)
    except BaseException:
        startup.abandon()
        raise
    run = RunContext(spec=spec, target=resolved, pickled=pickled, model=model, layout=layout,
                     attrs=run_attrs(spec, model, store),
                     positions=positions, store=store, overwrite=overwrite,
                     observers=_observers(progress, observers),
                     inputs=_inputs(target, model_kwargs, init), params=params)
    return drive(run, startup)


def resume(path, cluster=None, *, target=None, init=None, model_args: tuple = (), model_kwargs: dict | None = None,
           progress: bool = True, cluster_options: dict | None = None, force: bool = False,
           observers: tuple = ()) -> xr.DataTree:
    """Continue an interrupted run from the blocks already in its store.

    The result is bitwise identical to an uninterrupted run. A built-in model is found by its name;
    a run whose model was a Python function needs it again: ``resume(path, target=fn, init=...)``.
    A model or data other than the store's, or another dhmc or JAX version, raises
    :class:`~dhmc.errors.ModelMismatchError` unless ``force=True``; ``observers`` are :func:`sample`'s.
    """
    observers = _checked(observers)
    run = continued_run(path, target=target, init=init, model_args=model_args, model_kwargs=model_kwargs,
                        force=force, observers=_observers(progress, observers))
    return drive(run, Startup(run.spec, run.model, cluster, cluster_options))


def extend(path, draws: int, cluster=None, *, target=None, init=None, model_args: tuple = (),
           model_kwargs: dict | None = None, progress: bool = True, cluster_options: dict | None = None,
           force: bool = False, observers: tuple = ()) -> xr.DataTree:
    """Add ``draws`` draws per chain to a finished run in its store, from where its chains ended.

    The result is bitwise identical to one run of the total length; the options are :func:`resume`'s.
    """
    observers = _checked(observers)
    run = continued_run(path, target=target, init=init, model_args=model_args, model_kwargs=model_kwargs,
                        force=force, more_draws=draws, observers=_observers(progress, observers))
    return drive(run, Startup(run.spec, run.model, cluster, cluster_options))


def _inputs(target, model_kwargs, init) -> dict | None:
    """A referenced model's numeric keyword data and init, kept in its store so that a resume needs neither (a
    target by reference: the arguments its function is called with)."""
    numeric = lambda d: {k: v for k, v in (d if isinstance(d, dict) else {}).items()
                         if np.asarray(v).dtype.kind in "biuf"}
    if isinstance(target, ReferenceTarget):
        return {"model_kwargs": numeric(target.kwargs), "init": {}}
    return {"model_kwargs": numeric(model_kwargs), "init": numeric(init)} if is_reference(target) else None


def _checked(observers) -> tuple:
    """The user's observers, each with at least one of :class:`Observer`'s methods (else one-line ``TypeError``)."""
    events = [name for name in vars(Observer) if not name.startswith("_")]
    observes = lambda obj: any(callable(getattr(obj, event, None)) for event in events)
    observers = (observers,) if observes(observers) else tuple(observers or ())
    for observer in observers:
        if not observes(observer):
            raise TypeError(f"observers: {observer!r} has none of an observer's methods ({', '.join(events)})")
    return observers


def _observers(progress: bool, observers: tuple = ()) -> tuple:
    """The dashboard's publisher and link always; the progress bar on request; then the user's."""
    from dhmc.observe.progress import DashboardLink, Progress
    from dhmc.observe.publisher import DashboardPublisher

    return (DashboardPublisher(), DashboardLink(), *([Progress()] if progress else []), *observers)

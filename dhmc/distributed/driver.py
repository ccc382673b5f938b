"""One run, start to end: connect, open the sink, warm up (or load warmup), sample every remaining block.

``dhmc.sample`` and ``dhmc.resume`` check their input and hand a :class:`RunContext` here::

    api.sample -> RunContext -> drive: Startup.connect -> sink (memory | store) -> Runner.warmup
               -> Runner.sample (workers run blocks, and write them to a store) -> sink.finish: DataTree

The driver reaches storage only through the sink (:class:`dhmc.storage.sinks.Sink`).
"""

from __future__ import annotations

import json
import time
import uuid
import warnings
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from dhmc import stats
from dhmc.distributed import stopping, warmup
from dhmc.distributed.monitor import RHAT_MAX, ConvergenceMonitor
from dhmc.distributed.observers import Observers
from dhmc.distributed.runner import Runner, initial_params
from dhmc.distributed.spec import RunSpec
from dhmc.distributed.startup import Startup
from dhmc.errors import ConvergenceWarning
from dhmc.models.base import TRACING, FlatModel
from dhmc.models.resolve import initial_positions
from dhmc.storage import schema

__all__ = ["RunContext", "drive"]


@dataclass(frozen=True, kw_only=True)
class RunContext:
    """Everything one run needs, checked by the API before any work is sent."""

    spec: RunSpec
    target: object  # what the driver draws prior samples from
    pickled: tuple[bytes, str]  # the target pickled for workers, and its hash (see startup.pickle_target)
    model: FlatModel
    layout: schema.Layout
    attrs: dict  # JSON-able attributes of the result (and of a store)
    positions: np.ndarray | None = None  # start points; None: from the seed (a resume)
    store: str | None = None
    overwrite: bool = False
    resume: bool = False  # continue the blocks already in ``store``
    observers: tuple = field(default=())  # told of the run's events (dhmc.distributed.observers.Observer)
    inputs: dict | None = None  # a referenced model's data and init, kept in the store for a resume
    params: dict | None = None  # adapted parameters to start from (``adapted_from``); None: from the spec


def drive(run: RunContext, startup: Startup):
    """Run ``run`` on the cluster ``startup`` connects to; return its ``xarray.DataTree``."""
    from distributed import span

    client, close = startup.connect()
    run_id = f"dhmc-{uuid.uuid4().hex[:8]}"
    runner = sink = None
    try:
        sink = _open_sink(run, run_id)
        blob, token = run.pickled
        runner = Runner(client, run.spec, blob, token, run.model.dtype, sink, Observers(run.observers),
                        startup.executables, store=run.store, run_id=run_id)
        runner.observers.tell("start_run", client, run_id, run.spec.geometry)
        with span(f"dhmc-{run_id}") if span else nullcontext():
            positions, params, history = _warmup(run, runner, sink)
            run = _after_warmup(run, runner, sink, history, params)
            monitor = ConvergenceMonitor(run.spec, sink, sink.checked_waves() if run.spec.target_ess else 0)
            kept = runner.sample(sink.starts(positions), params, monitor)
        timing = {"cluster_start": startup.seconds, **runner.timing, "total": time.perf_counter() - startup.t0}
        attrs = {**run.attrs, "dhmc_timing": json.dumps(timing), "dhmc_warmup": json.dumps(history)}
        attrs.update(_finish_auto(run.spec, sink, monitor, kept) if monitor.auto else _final_check(run.spec, monitor))
        return _warn_energy(_warn_divergences(sink.finish(attrs)), run.spec.kernel)
    finally:
        if runner is not None:
            runner.observers.tell("close")
        if sink is not None:
            sink.release()
        startup.close()
        close()


def _open_sink(run: RunContext, run_id: str):
    """The run's sink: in memory without a store; else the store, created (or reopened to resume) and locked."""
    from dhmc.storage.memory import MemorySink
    from dhmc.storage.sinks import StoreSink

    geometry = run.spec.geometry
    if run.store is None:
        return MemorySink(run.layout, geometry, _extra_groups(run), grow=run.spec.target_ess is not None)
    if run.resume:
        return StoreSink.reopen(run.store, run.layout, geometry, run_id)
    return StoreSink.create(run.store, run.layout, geometry, run_id, dim=run.model.dim, dtype=run.model.dtype,
                            attrs=run.attrs, extra_groups=_extra_groups(run), overwrite=run.overwrite,
                            inputs=run.inputs, params=run.params)


def _extra_groups(run: RunContext) -> dict[str, dict[str, tuple]]:
    """Groups without chains to sample: ``observed_data``, ``constant_data``, and ``prior``/``prior_predictive`` draws
    (one chain)."""
    labelled = lambda values, lead: {k: ([*lead, *schema.observed_dims(k, v[(0,) * len(lead)], run.model.dims)], v)
                                     for k, v in values.items()}
    groups = {"observed_data": labelled(run.model.observed_data, []),
              "constant_data": labelled(run.model.constant_data, [])}
    if run.spec.prior:
        with TRACING:
            prior, predictive = run.target.sample_prior(run.spec.prior, run.spec.seed)
        groups |= {"prior": labelled({k: v[None] for k, v in prior.items()}, ["chain", "draw"]),
                   "prior_predictive": labelled({k: v[None] for k, v in predictive.items()}, ["chain", "draw"])}
    return {k: v for k, v in groups.items() if v}


def _warmup(run: RunContext, runner: Runner, sink):
    """Post-warmup positions, parameters and history: the sink's, when a resume finds them there."""
    saved = sink.saved_warmup(run.model.dtype)
    if saved is not None:
        return saved
    positions, params, history = _run_warmup(run, runner)
    sink.save_warmup(positions, params, history)
    return positions, params, history


def _run_warmup(run: RunContext, runner: Runner):
    spec, model = run.spec, run.model
    positions = run.positions
    if positions is None:  # a resume before warmup finished starts again, deterministically
        positions = initial_positions(model, spec.model, None, spec.seed, spec.chains)
    params = run.params if run.params is not None else initial_params(spec, model.dim, model.dtype)
    return runner.warmup(positions, params) if spec.warmup else (positions, params, [])


def _after_warmup(run: RunContext, runner: Runner, sink, history: list[dict], params: dict) -> RunContext:
    """After ``warmup="auto"``: the spec's ``warmup`` is the iterations run (sampling's iterations follow
    them), kept in the store for a resume; the kept warmup draws are cut to them; a warmup that reached
    ``max_warmup`` before converging warns with its last round's numbers. The spec's ``dense_mass`` is the
    metric warmup ended with (``dense_mass=None``: the one it chose)."""
    spec = run.spec
    dense = np.ndim(params["inverse_mass_matrix"]) == 2
    if not spec.auto_warmup:
        return run if spec.dense_mass is not None else _respec(run, runner, sink, replace(spec, dense_mass=dense))
    iterations = warmup.adjusted_iterations(history)
    if spec.save_warmup and sink.layout.warmup_draws > iterations:
        sink.trim_warmup(iterations)
    last = history[-1].get("check", {}) if history else {}
    if history and not last.get("converged"):
        warnings.warn(f"warmup='auto' reached max_warmup={spec.max_warmup} before the ensemble converged (the "
                      f"last round's {stopping.describe(history[-1])}); the draws may still be biased: check R-hat, or "
                      "raise max_warmup", ConvergenceWarning, stacklevel=4)
    return _respec(run, runner, sink, replace(spec, warmup=iterations, dense_mass=dense))


def _respec(run: RunContext, runner: Runner, sink, spec: RunSpec) -> RunContext:
    """The run (its runner, its sink's attrs) with ``spec``."""
    runner.spec = spec
    attrs = {**run.attrs, "dhmc_run_spec": json.dumps(asdict(spec))}
    sink.set_attrs({"dhmc_run_spec": attrs["dhmc_run_spec"]})
    return replace(run, spec=spec, attrs=attrs)


def _finish_auto(spec: RunSpec, sink, monitor: ConvergenceMonitor, kept: int) -> dict:
    """Keep the first ``kept`` segments (trim the sink), or warn that ``max_draws`` came first; new attrs."""
    geometry, last = spec.geometry, monitor.last
    if kept < geometry.num_segments:
        spec = spec.with_draws(geometry.draws_in(kept))
        sink.resize(spec.geometry, {"dhmc_run_spec": json.dumps(asdict(spec))})
    elif last is not None and not last["converged"]:
        rhat = f", nested R-hat {last['max_rhat']:.3f}" if last["max_rhat"] >= RHAT_MAX else ""
        memory = f", the chains' memory of their first draw z = {last['start_memory']:.1f} (at most " \
                 f"{last['memory_critical']:.1f})" if last["start_memory"] >= last["memory_critical"] else ""
        warnings.warn(f"draws='auto' reached max_draws={geometry.draws} before converging: min ESS "
                      f"{last['min_ess']:.0f} of target_ess {spec.target_ess:g}{rhat}{memory}", ConvergenceWarning,
                      stacklevel=4)
    extra = {"dhmc_auto": json.dumps(_without_params(last))} if last is not None else {}
    return {"dhmc_run_spec": json.dumps(asdict(spec)), **extra}


def _warn_divergences(trace):
    """``trace``, after a warning if any kept draw diverged (as Stan and PyMC warn: one is enough to doubt the
    posterior; a correct many-chain run of a well-posed target has none)."""
    diverging = trace["sample_stats"]["diverging"]
    n = int(np.asarray(diverging.values).sum())
    if n:
        share = 100 * n / diverging.size
        warnings.warn(f"{n} divergent transitions after warmup ({share:.3g}% of draws): the posterior may be biased "
                      "where the chains diverged; reparameterise (a hierarchy: noncentered=True, or laplace= where the "
                      "data squeeze it too) or raise target_accept", ConvergenceWarning, stacklevel=4)
    return trace


def _warn_energy(trace, kernel: str):
    """``trace``, after a warning if its E-BFMI (:func:`dhmc.stats.ebfmi`, the first chains') is below 0.3: the
    Brownian motion with unknown scales met every other check (ESS, nested R-hat, no divergence) with its scales'
    sds 10-20% small. MAMS records ``-log p`` as its energy (no momentum): no E-BFMI."""
    if kernel != "mams":
        fraction = stats.ebfmi(trace["sample_stats"]["energy"])
        if fraction < stats.EBFMI_MIN:
            warnings.warn(stats.ebfmi_warning(fraction), ConvergenceWarning, stacklevel=4)
    return trace


def _without_params(check: dict) -> dict:
    """A check as the store keeps it: the extremes, not every parameter's numbers."""
    return {k: v for k, v in check.items() if k != "params"}


def _final_check(spec: RunSpec, monitor: ConvergenceMonitor) -> dict:
    """A fixed-draws run's nested R-hat over its head chains (superchains: its chunks); 1.01 or more warns.

    Nested R-hat, not split R-hat: a chain's split R-hat is about ``sqrt(1 + tau / draws)`` for
    autocorrelation time ``tau`` however many chains agree, so it stays above 1.01 for many short
    chains of a converged ensemble (1.015 for 64 chains x 60 draws of the coin toss); split R-hat is
    kept in the record.
    """
    if spec.draws < 4:
        return {}
    check = monitor.final()
    if check["max_nested_rhat"] >= RHAT_MAX:
        warnings.warn(f"nested R-hat {check['max_nested_rhat']:.3f} over the first {check['chains']} chains (split "
                      f"R-hat {check['max_rhat']:.3f}, worst for {check['worst']!r}) is at least {RHAT_MAX}: the "
                      "chains disagree; sample longer (dhmc.extend), or use draws='auto'", ConvergenceWarning,
                      stacklevel=4)
    return {"dhmc_convergence": json.dumps(check)}

"""The run spec: every option that determines the draws, checked once, before any work is sent."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime

import jax
import numpy as np

from dhmc.core.ensemble import KERNELS, KernelConfig
from dhmc.distributed.cache import chain_working_set, chains_in_cache
from dhmc.distributed.warmup import AUTO_ROUND, AUTO_ROUND_AFTER_COLD, DEFAULT_MAX_WARMUP, auto_rounds, fixed_rounds
from dhmc.geometry import Geometry, default_chains_per_task, default_draws_per_segment
from dhmc.storage import schema

__all__ = ["RunSpec", "DEFAULT_TARGET_ESS", "DEFAULT_MAX_DRAWS", "check_options", "check_integer", "adapted_options",
           "check_kernel_fits", "layout_for", "geometry_for", "run_attrs"]


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """Everything that determines the draws (JSON-able; saved in the store to resume)."""

    model: str
    chains: int
    draws: int
    warmup: int
    seed: int
    kernel: str
    step_size: float | None
    num_steps: int | None
    trajectory_length: float | None
    adapt: bool
    dense_mass: bool | None  # None: warmup="auto" chooses (cold_metric.wants_dense), the choice replaces it
    target_accept: float
    chains_per_task: int
    draws_per_segment: int
    x64: bool
    target_ess: float | None = None  # draws="auto": stop once the draws reach it (``draws`` is then max_draws)
    max_draws: int | None = None  # draws="auto": the most draws; ``draws`` equals it until the run stops
    log_likelihood: bool = False  # a NumPyro model's pointwise log-likelihood is stored too
    thinning: int = 1  # a kept draw every ``thinning`` transitions
    adapted_from: str | None = None  # the store whose adapted parameters the run started from
    predictive: bool = False  # a NumPyro model's posterior predictive draws are stored too
    prior: int = 0  # draws from a NumPyro model's prior (and prior predictive), made before sampling
    save_warmup: bool = False  # the warmup's draws are kept too (group ``warmup_posterior``)
    max_warmup: int | None = None  # warmup="auto": the most iterations; ``warmup`` is the iterations run once known
    cold_start: bool = False  # warmup="auto" with adaptation: an unadjusted cold phase first (dhmc.core.cold)
    noncentered: bool = False  # a NumPyro model's hierarchical loc-scale sites sampled non-centred
    laplace: tuple[str, ...] = ()  # the latent variables sampled Laplace-whitened (dhmc.models.laplace)
    by_reference: bool = False  # ``model`` names a function the workers import and call to make the target

    @property
    def geometry(self) -> Geometry:
        """How the run's chains and draws are cut into blocks."""
        return Geometry(self.chains, self.draws, self.chains_per_task, self.draws_per_segment)

    def with_draws(self, draws: int) -> RunSpec:
        """The same run with ``draws`` draws per chain (an auto run that stopped, an extended one)."""
        return replace(self, draws=int(draws))

    def kernel_config(self, phase: str = "sample"):
        """The block programs' kernel settings for ``phase``.

        An adapted fixed-step HMC warms up with ChEES's jittered, adapted trajectories: ten fixed
        steps left chains in the Gaussian mixture's degenerate region through a whole warmup, and an
        ensemble partly stuck there gives a metric that keeps it so. Its draws then take the user's
        steps with the adapted step size (jittered, see core.ensemble.step_size_for) and metric.
        """
        hmc = self.kernel == "hmc" and self.adapt
        kind = "chees" if hmc and phase == "warmup" else self.kernel
        return KernelConfig(kind=kind, num_steps=self.num_steps if kind == "hmc" else None,
                            target_accept=self.target_accept, dense_mass=self.dense_mass, thinning=self.thinning,
                            step_jitter=0.2 if hmc and phase == "sample" else 0.0,
                            record_warmup=max(self.warmup_rounds, default=0) if self.save_warmup else 0)

    @property
    def auto_warmup(self) -> bool:
        """Warmup ends when the ensemble has converged (``warmup="auto"``), at most ``max_warmup`` iterations."""
        return self.max_warmup is not None

    @property
    def warmup_rounds(self) -> list[int]:
        """Iterations per warmup round (the most rounds, for ``warmup="auto"``)."""
        if self.auto_warmup:
            return auto_rounds(self.max_warmup, AUTO_ROUND_AFTER_COLD if self.cold_start else AUTO_ROUND)
        return fixed_rounds(self.warmup) if self.adapt else [self.warmup] if self.warmup else []


DEFAULT_TARGET_ESS = 1000.0
DEFAULT_MAX_DRAWS = 10_000


def check_options(*, chains, draws, warmup, kernel, step_size, num_steps, trajectory_length, adapt,
                  target_accept, chains_per_task, target_ess=None, max_draws=None, thinning=1, prior=0,
                  max_warmup=None, seed=0) -> dict:
    """The sampler options, checked and completed (one-line ``ValueError`` naming the problem).

    ``draws="auto"`` becomes ``draws=max_draws`` with ``target_ess`` and ``max_draws`` set;
    ``warmup="auto"`` becomes ``warmup=max_warmup`` with ``max_warmup`` set.
    """
    draws, target_ess, max_draws = _check_draws(draws, target_ess, max_draws)
    warmup, max_warmup = _check_warmup(warmup, max_warmup)
    check_integer(1, chains=chains)
    check_integer(1, thinning=thinning)
    check_integer(0, seed=seed)
    if seed >= 2**32:
        raise ValueError(f"seed must be below 2**32 (it seeds 32-bit random streams), got {seed}")
    check_integer(0, prior=prior)
    if chains_per_task is not None:
        check_integer(1, chains_per_task=chains_per_task)
    if kernel not in KERNELS:
        raise ValueError(f"unknown kernel {kernel!r}; choose one of: {', '.join(KERNELS)}")
    if target_accept is None:
        target_accept = 0.9 if kernel == "mams" else 0.8  # MAMS works best at a higher acceptance (Robnik et al. 2025)
    if not 0.0 < target_accept < 1.0:
        raise ValueError(f"target_accept must be in (0, 1), got {target_accept}")
    for key, value in (("step_size", step_size), ("trajectory_length", trajectory_length)):
        if value is not None and not (isinstance(value, int | float | np.number) and 0 < value < math.inf):
            raise ValueError(f"{key} must be a positive finite number, got {value!r}")
    if num_steps is not None:
        check_integer(1, num_steps=num_steps)
    if kernel == "hmc" and num_steps is None and trajectory_length is None:
        num_steps = 10
    if warmup == 0 and adapt:
        if step_size is None:
            raise ValueError("warmup=0 leaves nothing to adapt: give warmup > 0, or adapt=False with step_size and "
                             "num_steps (or trajectory_length)")
        adapt = False
    if not adapt and (step_size is None or (num_steps is None and trajectory_length is None)):
        raise ValueError("adapt=False needs step_size and num_steps (or trajectory_length)")
    return dict(chains=int(chains), draws=int(draws), warmup=int(warmup), kernel=kernel, step_size=step_size,
                num_steps=num_steps, trajectory_length=trajectory_length, adapt=bool(adapt),
                target_accept=float(target_accept), target_ess=target_ess, max_draws=max_draws,
                thinning=int(thinning), prior=int(prior), max_warmup=max_warmup,
                cold_start=max_warmup is not None and bool(adapt))


def adapted_options(path, options: dict, dim: int, laplace=(), noncentered: bool = False) -> tuple[dict, dict]:
    """``(options, params)`` of a run that starts from the adapted parameters of the store at ``path``.

    Its warmup (if any) only moves the chains: no adaptation; the mass matrix is dense if the store's is. The store's
    run must have sampled the same coordinates: as many dimensions, the same ``laplace`` names and ``noncentered``.
    """
    from dhmc.storage import zarr_

    params, source = zarr_.adapted_params(path)
    if params["inverse_mass_matrix"].shape[0] != dim:
        raise ValueError(f"adapted_from={str(path)!r} holds a mass matrix for {params['inverse_mass_matrix'].shape[0]} "
                         f"dimensions, the model has {dim}")
    theirs = f"laplace={list(source.get('laplace') or ()) or False} and noncentered={bool(source.get('noncentered'))}"
    ours = f"laplace={list(laplace) or False} and noncentered={bool(noncentered)}"
    if theirs != ours:
        raise ValueError(f"adapted_from={str(path)!r} was adapted with {theirs}, this run has {ours}: its mass matrix "
                         "is in other coordinates; give the same options")
    step, length = float(params["step_size"]), float(params["trajectory_length"])
    options = dict(options, adapt=False, cold_start=False, step_size=step,
                   trajectory_length=length if length > 0 else None)
    if options["kernel"] == "hmc" and options["num_steps"] is None and length <= 0:
        raise ValueError(f"adapted_from={str(path)!r} holds no trajectory length: give num_steps")
    return options, params


def check_kernel_fits(kernel: str, dim: int) -> None:
    """MAMS's velocity lives on the unit sphere of the unconstrained space: it needs two dimensions."""
    if kernel == "mams" and dim < 2:
        raise ValueError(f"kernel='mams' needs at least 2 unconstrained dimensions, the model has {dim}; "
                         "use kernel='chees'")


def _check_warmup(warmup, max_warmup) -> tuple[int, int | None]:
    """``(warmup, max_warmup)``: an integer ``warmup``, or ``"auto"`` with at most ``max_warmup`` iterations."""
    if isinstance(warmup, str):
        if warmup != "auto":
            raise ValueError(f"warmup must be a non-negative integer or 'auto', got {warmup!r}")
        max_warmup = DEFAULT_MAX_WARMUP if max_warmup is None else max_warmup
        check_integer(1, max_warmup=max_warmup)
        return int(max_warmup), int(max_warmup)
    if max_warmup is not None:
        raise ValueError(f"max_warmup needs warmup='auto', got warmup={warmup!r}")
    check_integer(0, warmup=warmup)
    return int(warmup), None


def _check_draws(draws, target_ess, max_draws) -> tuple[int, float | None, int | None]:
    """``(draws, target_ess, max_draws)``: an integer ``draws``, or ``"auto"`` with its two options."""
    if isinstance(draws, str):
        if draws != "auto":
            raise ValueError(f"draws must be a positive integer or 'auto', got {draws!r}")
        max_draws = DEFAULT_MAX_DRAWS if max_draws is None else max_draws
        target_ess = DEFAULT_TARGET_ESS if target_ess is None else target_ess
        check_integer(1, max_draws=max_draws)
        if isinstance(target_ess, bool) or not isinstance(target_ess, int | float | np.number) or \
                not 0 < target_ess < math.inf:
            raise ValueError(f"target_ess must be a positive number, got {target_ess!r}")
        return int(max_draws), float(target_ess), int(max_draws)
    if target_ess is not None or max_draws is not None:
        raise ValueError(f"target_ess and max_draws need draws='auto', got draws={draws!r}")
    check_integer(1, draws=draws)
    return int(draws), None, None


def layout_for(model, warmup_draws: int = 0) -> schema.Layout:
    """The variables a run stores, from the shapes the model's functions give (traced, not run)."""
    position, key = jax.ShapeDtypeStruct((model.dim,), model.dtype), jax.ShapeDtypeStruct((2,), np.uint32)
    shapes = lambda fn, *args: {} if fn is None else {
        k: (tuple(v.shape), v.dtype) for k, v in jax.eval_shape(fn, position, *args).items()}
    layout = schema.make_layout(shapes(model.constrain_fn), model.dtype, model.dims, model.coords,
                                shapes(model.log_likelihood_fn), model.observed_data, shapes(model.predictive_fn, key),
                                model.constant_data)
    return replace(layout, warmup_draws=int(warmup_draws))


def geometry_for(model, layout: schema.Layout, chains: int, draws: int, chains_per_task: int | None, gpu: bool,
                 target_ess: float | None = None) -> Geometry:
    """The blocks of a run: chains per task (by default from the ensemble size and, on CPUs, how many of
    ``model``'s chains a core's cache holds) and draws per segment (from its bytes)."""
    if chains_per_task is None:
        chains_per_task = default_chains_per_task(chains, gpu=gpu, fits=None if gpu else _chains_in_cache(model))
    chains_per_task = min(int(chains_per_task), chains)
    every = [*layout.posterior.values(), *layout.log_likelihood.values(), *layout.posterior_predictive.values()]
    bytes_per_draw = sum(4 * max(1, math.prod(v.shape)) for v in every) + 4 * 8
    dps = default_draws_per_segment(draws, chains_per_task, bytes_per_draw, chains, target_ess)
    return Geometry(chains, draws, chains_per_task, dps)


def _chains_in_cache(model) -> int | None:
    """How many of ``model``'s chains a block may hold in a core's L2 (None: the model does not trace, which
    the initial-position check reports in the user's terms)."""
    try:
        return chains_in_cache(chain_working_set(model.logdensity_fn, model.dim, model.dtype))
    except Exception:  # noqa: BLE001 - reported by resolve.initial_positions, with what to fix
        return None


def check_integer(low: int, **values) -> None:
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
            kind = "a positive" if low == 1 else "a non-negative"
            raise ValueError(f"{key} must be {kind} integer, got {value!r}")


def run_attrs(spec: RunSpec, model, store) -> dict:
    """The result's attributes; a store's also fingerprint the model (10-100 ms), for ``resume`` to check."""
    from dhmc import __version__
    from dhmc.models.fingerprint import fingerprint, versions

    identity = {"dhmc_fingerprint": fingerprint(model), "dhmc_versions": versions()} if store is not None else {}
    return {
        "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "inference_library": "dhmc",
        "inference_library_version": __version__,
        "dhmc_run_spec": json.dumps(asdict(spec)),
        **identity,
    }

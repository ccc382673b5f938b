"""A run continued from its store: an interrupted one resumed, or a finished one extended by more draws."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, replace

import jax

from dhmc.distributed.driver import RunContext
from dhmc.distributed.spec import RunSpec, check_integer
from dhmc.distributed.startup import pickle_target
from dhmc.models.base import TRACING
from dhmc.models.fingerprint import check_same_run
from dhmc.models.reference import is_reference
from dhmc.models.resolve import resolve_target, with_laplace, with_outputs

__all__ = ["continued_run"]

ATTRS = ("created_at", "inference_library", "inference_library_version", "dhmc_run_spec", "dhmc_fingerprint",
         "dhmc_versions")


def continued_run(path, *, target=None, init=None, model_args=(), model_kwargs=None, force=False, more_draws=None,
                  observers=()) -> RunContext:
    """The :class:`RunContext` that continues the run in ``path``, checked before any cluster starts.

    The model is the store's built-in name unless ``target`` is given; a store's ``module:function`` is
    imported only when ``target`` names it again (the data and init kept in the store come with it),
    since a store from elsewhere must not run code. The model must be the store's own unless ``force``. With
    ``more_draws`` the finished store first makes room for that many more draws per chain.
    """
    from dhmc.storage import rewrite, zarr_
    from dhmc.storage.lock import check_free

    if more_draws is not None:
        check_integer(1, draws=more_draws)
    root, layout = zarr_.open_store(path)
    check_free(path)  # another run writing it: refused before any cluster starts
    rewrite.finish_resize(root, layout)  # a trim or an extend that was interrupted
    spec = _spec(root, path)
    _check_blocks(root, layout, spec, path, extending=more_draws is not None)
    if more_draws is not None and not zarr_.blocks_done(root).all():
        raise zarr_.StoreError(f"the run in {path} is not finished: dhmc resume {path} first, then extend it")
    if spec.x64 and not jax.config.jax_enable_x64:
        jax.config.update("jax_enable_x64", True)
    if target is None and is_reference(spec.model):  # a store names code to import: only the user may run it
        command = f"dhmc extend {path} --draws {more_draws}" if more_draws is not None else f"dhmc resume {path}"
        raise ValueError(f"the run in {path} sampled {spec.model!r}, which continuing it imports and runs: confirm "
                         f"it with {command} --model {spec.model} (Python: target={spec.model!r})")
    confirmed = target == spec.model and is_reference(target)
    if confirmed:  # its data and init are in the store
        kept = zarr_.load_inputs(root)
        model_kwargs, init = model_kwargs or kept["model_kwargs"], init if init is not None else kept["init"] or None
    elif target is None and spec.model.startswith("python:"):
        call = f"dhmc.extend(path, {more_draws}, " if more_draws is not None else "dhmc.resume(path, "
        raise ValueError(f"the run in {path} sampled the Python function {spec.model[7:]!r}; give it again: "
                         f"{call}target=<the same function>, init=<the same init>)")
    if confirmed and spec.by_reference:  # the workers import and call it, as the run did
        from dhmc.models.reference import by_reference

        target, model_kwargs = by_reference(spec.model, **dict(model_kwargs or {})), None
    target = spec.model if target is None else target
    with TRACING:  # NumPyro's handler stack is global (dhmc.models.base.TRACING)
        resolved, name, _ = resolve_target(target, init, spec.chains, model_args, model_kwargs)
        resolved = with_outputs(resolved, name, spec.log_likelihood, spec.predictive, noncentered=spec.noncentered)
        resolved, _ = with_laplace(resolved, name, tuple(spec.laplace))
        pickled = pickle_target(resolved)  # before anything traces it
        model = resolved.build()
    if not force:
        check_same_run(path, root.attrs, model)
    if more_draws is not None:
        spec = _extend(root, layout, spec, int(more_draws))
    attrs = {k: root.attrs[k] for k in ATTRS if k in root.attrs}
    return RunContext(spec=spec, target=resolved, pickled=pickled, model=model, layout=layout, attrs=attrs, store=path,
                      resume=True, observers=observers, params=zarr_.load_initial_params(root, model.dtype))


def _check_blocks(root, layout, spec: RunSpec, path, extending: bool) -> None:
    """The store's arrays as its spec says (else one line), and its damaged done blocks marked to run again (a
    resume, which says so) or refused (an extend: resume first)."""
    from dhmc.storage import integrity
    from dhmc.storage.zarr_ import StoreError

    integrity.check_arrays(root, layout, spec.geometry, path)
    damaged = integrity.damaged_blocks(root, layout, spec.geometry, path)
    if not damaged:
        return
    if extending:
        raise StoreError(f"{integrity.describe(damaged, path)}: dhmc resume {path} runs them again, then extend it")
    integrity.unmark(root, spec.geometry, damaged)
    logging.getLogger("dhmc").warning("%s: this resume runs them again", integrity.describe(damaged, path))


def _extend(root, layout, spec: RunSpec, draws: int) -> RunSpec:
    """Make room in a finished store for ``draws`` more draws per chain (a fixed-draws run from now on)."""
    from dhmc.storage import rewrite

    longer = replace(spec.with_draws(spec.draws + draws), target_ess=None, max_draws=None)
    rewrite.resize(root, layout, spec.geometry, longer.geometry, {"dhmc_run_spec": json.dumps(asdict(longer))})
    return longer


def _spec(root, path) -> RunSpec:
    from dhmc.storage.zarr_ import StoreError

    try:
        return RunSpec(**json.loads(root.attrs["dhmc_run_spec"]))
    except Exception as e:  # noqa: BLE001
        raise StoreError(f"store {path} is broken: unreadable run spec ({e})") from None

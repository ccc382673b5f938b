"""A user's target (a log density, a NumPyro model, a built-in name) as a flat model, and checked start points."""

from __future__ import annotations

from dataclasses import replace

import jax
import jax.numpy as jnp
import numpy as np

from dhmc.core.ensemble import initial_positions as jittered_positions
from dhmc.errors import one_line
from dhmc.models.base import TRACING, FlatModel
from dhmc.models.examples import Labelled, example
from dhmc.models.laplace import LaplaceTarget
from dhmc.models.logdensity import LogDensityTarget
from dhmc.models.numpyro_ import NumPyroTarget, is_numpyro_model
from dhmc.models.numpyro_noncentred import noncentred_sites
from dhmc.models.pymc_ import PyMCTarget, is_bambi_model, is_model_factory, is_pymc_model, pymc_target
from dhmc.models.reference import ReferenceTarget, bind, import_reference, is_reference

__all__ = ["resolve_target", "with_outputs", "with_laplace", "with_labels", "initial_positions", "evaluate"]


def resolve_target(target, init, chains, model_args, model_kwargs):
    """Return ``(target object, name for the run spec, batched flat init or None)``."""
    if is_reference(target):  # "pkg.module:function": the run spec names it, so a resume can import it again
        obj = import_reference(target)
        if is_pymc_model(obj) or is_bambi_model(obj) or is_model_factory(obj):
            return pymc_target(_built(obj, target, model_kwargs), init, model_args, name=target), target, None
        fn, kwargs = bind(obj, init, dict(model_kwargs or {}))
        resolved, _, batched = resolve_target(fn, init, chains, model_args, kwargs)
        return replace(resolved, name=target), target, batched
    if isinstance(target, str):
        return example(target), target, None
    if isinstance(target, ReferenceTarget):
        if model_args or model_kwargs:
            raise ValueError("a target by reference takes its arguments in by_reference(reference, **kwargs), not "
                             "model_args or model_kwargs")
        target.made(driver=True)  # made here once: what it returns is checked before any cluster starts
        return target, target.name, None
    if is_pymc_model(target) or is_bambi_model(target):
        resolved = pymc_target(target, init, model_args, model_kwargs)
        return resolved, resolved.name, None
    if isinstance(target, LogDensityTarget | NumPyroTarget) or hasattr(target, "build"):
        return target, getattr(target, "name", "") or f"python:{type(target).__name__}", None
    if not callable(target):
        raise TypeError(f"target must be a log-density function, a NumPyro model or a model name, got "
                        f"{type(target).__name__}")
    name = f"python:{getattr(target, '__qualname__', repr(target))}"
    if init is None and not (model_args or model_kwargs) and not is_numpyro_model(target, {}, (), None):
        raise ValueError(f"{name[7:]} takes one argument and no init= was given: a log density needs init= (one "
                         "chain's position, e.g. {'x': np.zeros(d)}); a NumPyro model needs its arguments in "
                         "model_args=")
    if is_numpyro_model(target, init, model_args, model_kwargs):
        return NumPyroTarget(target, tuple(model_args), dict(model_kwargs or {}), name=name, init=init), name, None
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


def _built(obj, reference: str, kwargs):
    """A PyMC or Bambi model named by reference: the object itself, or what the function it names returns when
    called with ``kwargs`` (the CLI's ``--data``)."""
    if is_pymc_model(obj) or is_bambi_model(obj):
        if kwargs:
            raise ValueError(f"{reference} is a PyMC model, which takes no --data (model_kwargs): name a function "
                             "that builds it from them")
        return obj
    try:
        model = obj(**dict(kwargs or {}))
    except TypeError as e:
        raise ValueError(f"{reference} could not be called to build its PyMC model: {e}") from None
    if not (is_pymc_model(model) or is_bambi_model(model)):
        raise ValueError(f"{reference} is a function in a module that imports PyMC or Bambi, so dhmc called it for "
                         f"a model, and it returned {type(model).__name__}, not a pymc.Model or bambi.Model")
    return model


def with_outputs(target, name: str, log_likelihood: bool = False, predictive: bool = False, prior: int = 0,
                 noncentered: bool = False):
    """The target whose flat model also gives pointwise log-likelihoods and/or predictive draws, and samples its
    hierarchy non-centred (``noncentered``).

    Those need a NumPyro or PyMC model: a log density does not say which of its terms is the likelihood, nor how to
    draw data, nor how it was parameterised.
    """
    if not (log_likelihood or predictive or prior or noncentered):
        return target
    if not hasattr(_innermost(target), "with_outputs"):
        if noncentered:
            raise ValueError(f"noncentered=True needs a NumPyro or PyMC model; {name!r} is a log density, whose "
                             "parameterisation dhmc cannot change: write its hierarchy non-centred")
        asked = "log_likelihood=True" if log_likelihood else "predictive=True" if predictive else f"prior={prior}"
        raise ValueError(f"{asked} needs a NumPyro or PyMC model with observed variables; {name!r} is a log "
                         "density, whose likelihood and data dhmc cannot tell from its prior")
    return target.with_outputs(log_likelihood=log_likelihood, predictive=predictive, noncentered=noncentered)


def with_laplace(target, name: str, laplace, noncentered: bool = False) -> tuple:
    """``(target, latent names)``: the target with ``laplace``'s latent variables Laplace-whitened
    (:mod:`dhmc.models.laplace`), or unchanged with ``()`` when ``laplace`` is False, None or empty.

    ``laplace=True`` picks a NumPyro or PyMC model's hierarchical variables (those ``noncentered=True`` would
    non-centre; a model sent by reference is made here to find them); else it names the variables (a log density's
    leaves, a NumPyro model's latent sites, a PyMC model's free variables).
    """
    if laplace is None or laplace is False or (not isinstance(laplace, bool | str) and not list(laplace)):
        return target, ()
    if noncentered:
        raise ValueError("laplace= and noncentered=True reparameterise the same hierarchy two ways: choose one")
    if laplace is True:
        model = _innermost(target)
        if isinstance(model, NumPyroTarget):
            latent = tuple(noncentred_sites(model.model, model.model_args, model.model_kwargs, "laplace=True"))
        elif isinstance(model, PyMCTarget):
            from dhmc.models.pymc_noncentred import noncentred_variables

            latent = tuple(noncentred_variables(model.model))
        else:
            raise ValueError(f"laplace=True picks a NumPyro or PyMC model's hierarchical variables; {name!r} is "
                             "neither: name its latent variables (laplace=['x'])")
        if not latent:
            raise ValueError(f"laplace=True found no hierarchical site in {name!r} (a normal site whose loc or scale "
                             "depends on another latent site): name its latent variables")
    else:
        latent = (laplace,) if isinstance(laplace, str) else tuple(laplace)
        if not all(isinstance(v, str) for v in latent):
            raise TypeError(f"laplace must be True or the names of latent variables, got {laplace!r}")
    return LaplaceTarget(target, latent), latent


def _innermost(target):
    """The model a wrapper stands for: a built-in example's, or the one a target by reference makes here."""
    while isinstance(target, ReferenceTarget | Labelled):
        target = target.made(driver=True) if isinstance(target, ReferenceTarget) else target.target
    return target


def with_labels(model: FlatModel, dims, coords) -> FlatModel:
    """The model with the user's ``dims`` (``{variable: [dim, ...]}``) and ``coords`` (``{dim: values}``) on top."""
    for key, value in (("dims", dims), ("coords", coords)):
        if value is not None and not isinstance(value, dict):
            raise TypeError(f"{key} must be a dict, got {type(value).__name__}")
    dims = {k: [v] if isinstance(v, str) else list(v) for k, v in (dims or {}).items()}
    return replace(model, dims={**model.dims, **dims}, coords={**model.coords, **(coords or {})})


def initial_positions(model: FlatModel, name, batched, seed, chains) -> np.ndarray:
    """Distinct starting points per chain, checked for a finite log density before any work is sent."""
    if batched is not None:  # each chain's row is ravel_pytree of its slice: the leaves in order, each raveled
        positions = np.concatenate([np.asarray(leaf, model.dtype).reshape(chains, -1)
                                    for leaf in jax.tree.leaves(batched)], axis=1)
        if model.to_flat is not None:  # the target's own flat positions, sampled in other coordinates
            positions = np.array(jax.jit(jax.vmap(model.to_flat))(jnp.asarray(positions)))
    else:
        positions = np.array(jittered_positions(seed, jnp.arange(chains, dtype=jnp.uint32),
                                               jnp.asarray(model.centre, model.dtype), model.radius))
    logdensity = evaluate(model, name, positions)
    bad = ~np.isfinite(logdensity)
    if bad.any() and batched is None:
        positions[bad] = model.centre
        logdensity = evaluate(model, name, positions)
        bad = ~np.isfinite(logdensity)
    if bad.any():
        where = "at the initial point" if batched is None else f"at {int(bad.sum())} of the initial points"
        raise ValueError(f"the log density of {name!r} is not finite {where} (got {logdensity[bad][0]}); "
                         "give an init where it is finite")
    return positions


def evaluate(model: FlatModel, name, positions) -> np.ndarray:
    try:
        with TRACING:
            evaluate = jax.jit(jax.vmap(model.logdensity_fn)).lower(jnp.asarray(positions))
        values = evaluate.compile()(jnp.asarray(positions))
    except Exception as e:  # noqa: BLE001 - the user's function failed: say which and on what
        raise ValueError(f"the log density {name!r} failed on one chain's position (flat size {model.dim}): "
                         f"{type(e).__name__}: {one_line(e)[:300]}") from None
    values = np.asarray(values)
    if values.shape != (positions.shape[0],):
        raise ValueError(f"the log density {name!r} must return a scalar per position, got shape "
                         f"{values.shape[1:]}")
    return values

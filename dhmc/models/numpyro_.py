"""A NumPyro model turned into a flat unconstrained log density, log-Jacobians included."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

import jax
import numpy as np
from jax.flatten_util import ravel_pytree

from dhmc.models.base import FlatModel, flat_variables


def is_numpyro_model(obj: Callable, init: Any, model_args: tuple, model_kwargs: dict | None) -> bool:
    """Route a callable: a log density takes exactly one position and needs ``init``.

    Anything given model arguments, marked with :func:`numpyro_model`, taking other than one
    required positional argument, or passed without ``init`` is treated as a NumPyro model.
    """
    import inspect

    if model_args or model_kwargs or getattr(obj, "_dhmc_numpyro", False):
        return True
    try:
        params = inspect.signature(obj).parameters.values()
    except (TypeError, ValueError):
        return init is None
    required = [p for p in params if p.default is inspect.Parameter.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(required) != 1 or init is None


@dataclass(frozen=True)
class NumPyroTarget:
    """A NumPyro model function with its arguments.

    The flat position is the model's unconstrained latent sites; ``potential_energy`` supplies the
    log density with every transform's log-Jacobian, ``constrain_fn`` maps back to the constrained
    sites plus deterministic sites. Chains start as ``init_to_uniform``: ``U(-2, 2)``; with ``init``
    (a NumPyro init strategy such as ``init_to_median()``, or a dict of site values for
    ``init_to_value``) at the strategy's point plus ``U(-0.5, 0.5)``, unconstrained. Plates name
    the dims of the sites inside them. With ``log_likelihood=True`` the flat model also gives each
    observed site's log-likelihood (per observation, as :func:`numpyro.infer.log_likelihood`), with
    ``predictive=True`` a draw of each observed site given the position (the posterior predictive).
    With ``noncentered=True`` every latent site with a ``loc`` and a ``scale`` of which at least one depends on
    other latent sites (a hierarchy's ``theta ~ Normal(mu, tau)``) is sampled non-centred, ``theta = mu + tau *
    theta_decentered`` (NumPyro's ``LocScaleReparam(0)``): the funnel between ``theta`` and ``tau`` is gone, and
    ``theta`` is still reported (a deterministic site) beside ``theta_decentered``.
    """

    model: Callable
    model_args: tuple = ()
    model_kwargs: dict = field(default_factory=dict)
    name: str = ""
    radius: float = 2.0
    log_likelihood: bool = False
    init: Any = None
    predictive: bool = False
    noncentered: bool = False

    def with_outputs(self, log_likelihood: bool = False, predictive: bool = False,
                     noncentered: bool = False) -> NumPyroTarget:
        """The same model, its flat model also giving pointwise log-likelihoods and/or predictive draws (and its
        hierarchy sampled non-centred)."""
        from dataclasses import replace

        return replace(self, log_likelihood=log_likelihood, predictive=predictive,
                       noncentered=noncentered or self.noncentered)

    def sample_prior(self, draws: int, seed: int) -> tuple[dict, dict]:
        """``(prior, prior_predictive)``: ``draws`` joint draws of the latent (and deterministic) and observed sites."""
        keys = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(seed), PRIOR_STREAM), draws)
        model = self.sampled_model()
        run = jax.jit(jax.vmap(lambda key: _draw_sites(model, self.model_args, self.model_kwargs, key)))
        return jax.tree.map(np.asarray, run(keys))

    def build(self) -> FlatModel:
        from numpyro.infer import init_to_uniform
        from numpyro.infer.util import constrain_fn, initialize_model, potential_energy

        strategy = self._init_strategy()
        model = self.sampled_model()
        args, kwargs = self.model_args, self.model_kwargs
        if isinstance(self.init, dict):
            _check_init_shapes(model, args, kwargs, self.init)
        seen = {}

        def start(key):
            info = initialize_model(key, model, model_args=args, model_kwargs=kwargs, dynamic_args=False,
                                    init_strategy=strategy or init_to_uniform)
            seen["trace"] = info.model_trace
            return info.param_info.z, info.param_info.potential_energy, _observations(info.model_trace)

        # Traced, not run op by op: eagerly, NumPyro's initialisation compiled ~170 one-op programs (3 s of CPU in
        # every process that builds the model). The default start needs only the sites' shapes and the data, unless
        # the model computes its observations (jnp.asarray of a list): then, as for a strategy's point, one
        # compiled program.
        key = jax.random.PRNGKey(0)
        observed = None
        if strategy is None:
            template, energy, _ = jax.eval_shape(start, key)
            with suppress(jax.errors.TracerArrayConversionError):  # computed in the model: the jit below
                observed = {name: np.asarray(v) for name, v in _observations(seen["trace"]).items()}
        if observed is None:
            try:
                template, energy, observed = jax.jit(start)(key)
            except ValueError:  # NumPyro's check of a distribution downstream of a bad init value
                if isinstance(self.init, dict):
                    _check_init_support(model, args, kwargs, self.init)
                raise
        trace = seen.pop("trace")
        if strategy is not None and not np.isfinite(energy):
            if isinstance(self.init, dict):
                _check_init_support(model, args, kwargs, self.init)
            initialize_model(jax.random.PRNGKey(0), model, model_args=args, model_kwargs=kwargs,
                             dynamic_args=False, init_strategy=strategy)  # NumPyro's own message for a bad start
            raise ValueError(f"init gives the model {self.name!r} no finite log density at its start")
        if strategy is None:
            template = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), template)
        flat, unravel = ravel_pytree(template)
        if isinstance(self.init, dict):
            unknown = sorted(set(self.init) - set(template))
            if unknown and f"{unknown[0]}_decentered" in template:
                raise ValueError(f"init names {unknown[0]!r}, which noncentered=True samples as "
                                 f"{unknown[0]}_decentered (standard normal): give that, or leave {unknown[0]!r} out")
            if unknown:
                raise ValueError(f"init names {unknown[0]!r}, which is not a latent site of the model; its latent "
                                 f"sites are {', '.join(sorted(template))}")

        def logdensity(x):
            return -potential_energy(model, args, kwargs, unravel(x))

        def constrain(x):
            return constrain_fn(model, args, kwargs, unravel(x), return_deterministic=True)

        observed = {name: np.asarray(v) for name, v in observed.items()}
        if self.log_likelihood and not observed:
            raise ValueError(f"log_likelihood=True needs observed sites (obs=...), the model {self.name!r} has none")
        pointwise = None
        if self.log_likelihood:
            from numpyro.infer.util import log_likelihood

            def pointwise(x):
                latent = constrain_fn(model, args, kwargs, unravel(x))
                return log_likelihood(model, latent, *args, batch_ndims=0, **kwargs)

        if self.predictive and not observed:
            raise ValueError(f"predictive=True needs observed sites (obs=...), the model {self.name!r} has none")

        def predictive(x, key):
            return _draw_sites(model, args, kwargs, key, constrain_fn(model, args, kwargs, unravel(x)))[1]

        dims, coords = plate_dims(trace)
        centre = np.asarray(flat) if strategy else np.zeros(flat.size, dtype=flat.dtype)
        return FlatModel(logdensity, constrain, int(flat.size), flat.dtype, centre, 0.5 if strategy else self.radius,
                         observed, dims=dims, coords=coords, log_likelihood_fn=pointwise,
                         predictive_fn=predictive if self.predictive else None,
                         variables=flat_variables(sorted(template), template))

    def sampled_model(self) -> Callable:
        """The model as sampled: the user's, or with ``noncentered`` its hierarchical loc-scale sites non-centred."""
        if not self.noncentered:
            return self.model
        from dhmc.models.numpyro_noncentred import noncentred

        return noncentred(self.model, self.model_args, self.model_kwargs)

    def _init_strategy(self):
        """NumPyro's init strategy for ``init``; None for the default uniform start."""
        if self.init is None:
            return None
        if isinstance(self.init, dict):
            from numpyro.infer import init_to_value

            return init_to_value(values=self.init)
        if callable(self.init):
            return self.init
        raise TypeError(f"init for a NumPyro model must be a dict of site values or a NumPyro init strategy "
                        f"(init_to_median(), init_to_value(values=...)), got {type(self.init).__name__}")


def _check_init_shapes(model, args, kwargs, init: dict) -> None:
    """Refuse an ``init`` value of another shape than its site's: NumPyro's ``init_to_value`` would start the site
    at that shape and the model would be sampled with it (a scalar ``theta`` shared by every school)."""
    from numpyro import handlers

    def latent(key):
        trace = handlers.trace(handlers.seed(model, key)).get_trace(*args, **kwargs)
        return {name: site["value"] for name, site in _latent(trace).items()}

    try:
        shapes = jax.eval_shape(latent, jax.random.PRNGKey(0))
    except Exception:  # noqa: BLE001 - a site NumPyro cannot draw (an improper prior): NumPyro's own start checks
        return
    for name, value in init.items():
        if name in shapes and tuple(np.shape(value)) != tuple(shapes[name].shape):
            raise ValueError(f"init for {name!r} has shape {np.shape(value)}, the site has shape "
                             f"{tuple(shapes[name].shape)}")


def _check_init_support(model, args, kwargs, init: dict) -> None:
    """Refuse an ``init`` value outside its site's support (a negative scale), naming the site: NumPyro's own
    message names a distribution downstream of it."""
    from numpyro import handlers

    supports = {}

    def inside(key, values):  # the values traced: NumPyro validates a distribution's concrete parameters
        model_ = handlers.substitute(handlers.seed(model, key), data=values)
        trace = handlers.trace(model_).get_trace(*args, **kwargs)
        sites = {name: site for name, site in _latent(trace).items() if name in init}
        supports.update({name: site["fn"].support for name, site in sites.items()})
        return {name: jax.numpy.all(site["fn"].support(site["value"])) for name, site in sites.items()}

    try:
        ok = jax.jit(inside)(jax.random.PRNGKey(0), {name: np.asarray(v) for name, v in init.items()})
    except Exception:  # noqa: BLE001 - a model this check cannot run: NumPyro's own start checks
        return
    for name, value in init.items():
        if name in ok and not bool(ok[name]):
            support = repr(supports[name])
            support = support if "Trace" not in support else type(supports[name]).__name__.lstrip("_")
            raise ValueError(f"init for {name!r} is outside its support {support}: "
                             f"{np.array2string(np.asarray(value), threshold=8)}")


PRIOR_STREAM = 2**32 - 2  # keys of prior draws: fold_in data no kernel iteration reaches


def _latent(trace) -> dict:
    """The latent sample sites of a NumPyro trace (name: site), in trace order."""
    return {name: site for name, site in trace.items() if site["type"] == "sample" and not site["is_observed"]}


def _observations(trace) -> dict:
    """The observed sample sites of a NumPyro trace and their values, in trace order."""
    return {name: site["value"] for name, site in trace.items() if site["type"] == "sample" and site.get("is_observed")}


def _draw_sites(model, args, kwargs, key, latent=None) -> tuple[dict, dict]:
    """``(latent and deterministic sites, observed sites)`` of one draw: the latent ones from the prior
    (or ``latent``), each observed site drawn from its distribution given them."""
    from numpyro import handlers

    run = handlers.seed(model, key) if latent is None else handlers.substitute(handlers.seed(model, key), latent)
    trace = handlers.trace(run).get_trace(*args, **kwargs)
    drawn = {n: trace[n]["fn"].sample(jax.random.fold_in(key, i + 1)) for i, n in enumerate(_observations(trace))}
    sites = {n: s["value"] for n, s in trace.items()
             if s["type"] in ("sample", "deterministic") and n not in drawn}
    return sites, drawn


def plate_dims(trace) -> tuple[dict[str, list[str]], dict[str, list]]:
    """``(dims, coords)`` of a model trace's sites from the plates they sit in.

    A site's axis is named after the plate at that batch dim (``numpyro.plate("school", 8)`` names
    it ``school``, coordinates ``0..7``); other axes get ArviZ's ``{site}_dim_{i}``.
    """
    dims, coords = {}, {}
    for name, site in trace.items():
        if site["type"] not in ("sample", "deterministic"):
            continue
        shape = np.shape(site["value"])
        event = getattr(site.get("fn"), "event_dim", 0) if site["type"] == "sample" else 0
        names = [f"{name}_dim_{i}" for i in range(len(shape))]
        for frame in site.get("cond_indep_stack", []):
            axis = len(shape) - event + frame.dim
            if 0 <= axis < len(shape) and shape[axis] == frame.size:
                names[axis] = frame.name
                coords.setdefault(frame.name, list(range(frame.size)))
        if names and any(n != f"{name}_dim_{i}" for i, n in enumerate(names)):
            dims[name] = names
    return dims, coords


def numpyro_model(fn: Callable) -> Callable:
    """Mark ``fn`` as a NumPyro model (needed only for a model with exactly one required argument)."""
    fn._dhmc_numpyro = True
    return fn


__all__ = ["NumPyroTarget", "is_numpyro_model", "numpyro_model", "plate_dims"]

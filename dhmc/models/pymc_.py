"""A PyMC model (or a Bambi model's PyMC model) as a flat unconstrained log density, through PyMC's JAX backend.

PyMC and PyTensor are imported only when a PyMC model is given: :func:`is_pymc_model` and :func:`is_bambi_model`
tell one by its class's module, without importing either. Its graphs become JAX functions in
:mod:`dhmc.models.pymc_jax`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import jax
import numpy as np
from jax.flatten_util import ravel_pytree

from dhmc.models.base import FlatModel, flat_variables
from dhmc.models.pymc_jax import jaxified, predictive_fn

__all__ = ["PyMCTarget", "pymc_target", "is_pymc_model", "is_bambi_model", "is_model_factory", "pymc_model_of",
           "use_model_precision"]

PRIOR_STREAM = 2**32 - 2  # as NumPyro's prior draws: a seed no kernel iteration's stream reaches


def _is_class(obj, package: str, name: str) -> bool:
    return any(c.__name__ == name and c.__module__.split(".")[0] == package for c in type(obj).__mro__)


def is_pymc_model(obj) -> bool:
    """Whether ``obj`` is a ``pymc.Model`` (told without importing PyMC)."""
    return _is_class(obj, "pymc", "Model")


def is_bambi_model(obj) -> bool:
    """Whether ``obj`` is a ``bambi.Model`` (told without importing Bambi)."""
    return _is_class(obj, "bambi", "Model")


def pymc_model_of(obj):
    """The ``pymc.Model`` of a PyMC model (itself) or of a Bambi model (built first if it was not)."""
    if is_bambi_model(obj):
        if getattr(obj, "backend", None) is None or getattr(obj.backend, "model", None) is None:
            obj.build()
        return obj.backend.model
    return obj


def is_model_factory(fn) -> bool:
    """Whether a function named by reference builds a PyMC or Bambi model: its module imported either."""
    import types

    def from_pymc(value) -> bool:
        name = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None) or ""
        return isinstance(name, str) and name.split(".")[0] in ("pymc", "bambi")

    return callable(fn) and any(from_pymc(v) for v in getattr(fn, "__globals__", {}).values())


def pymc_target(model, init=None, model_args=(), model_kwargs=None, name: str = "", precision: bool = True
                ) -> PyMCTarget:
    """The target of a PyMC or Bambi model given in Python; with ``precision`` (on the driver) the process's x64
    set as PyMC sets it."""
    if model_args or model_kwargs:
        raise ValueError("model_args and model_kwargs are for NumPyro models; a PyMC model holds its data (pm.Data "
                         "and observed=): build it with the data, or write a function that does")
    if init is not None and not isinstance(init, dict):
        raise TypeError(f"init for a PyMC model must be a dict of free variables' values, got {type(init).__name__}")
    if precision:
        use_model_precision()
    kind = "bambi.Model" if is_bambi_model(model) else "pymc.Model"
    bambi = _bambi_outputs(model) if is_bambi_model(model) else {}
    model = pymc_model_of(model)
    target = PyMCTarget(model, name=name or f"python:{kind}{f' {model.name!r}' if model.name else ''}",
                        init=dict(init) if init else None, **bambi)
    target.check()
    return target


def _bambi_outputs(model) -> dict:
    """What ``bmb.Model.fit()`` stores of its PyMC model, as :class:`PyMCTarget`'s ``var_names`` and ``intercepts``:
    not the likelihood's parameters (deterministics of one value per observation) nor the group effects' offsets,
    and each intercept of centred predictors moved back to the predictors' own scale (``Intercept - mean(X) @
    coefficients``, as Bambi's ``_clean_results``)."""
    from bambi.utils import get_aliased_name
    from pymc.util import get_default_varnames

    pymc_model = pymc_model_of(model)
    backend = model.backend
    names = [v.name for v in get_default_varnames(pymc_model.unobserved_value_vars, include_transformed=False)]
    params = set(model.family.likelihood.params)
    deterministic = {d.name for d in pymc_model.deterministics}
    names = [n for n in names if not (n in params and n in deterministic) and not n.endswith("_offset")]
    intercepts = []
    for part in backend.distributional_components.values():
        component = part.component
        if component.intercept_term and component.common_terms and model.center_predictors:
            means = np.asarray(part.design_matrix_without_intercept).mean(0)
            terms = tuple(get_aliased_name(term) for term in component.common_terms.values())
            levels = len(next(iter(model.response_component.term.coords.values()), ())) or None
            intercepts.append((get_aliased_name(component.intercept_term), terms, means, levels))
    return {"var_names": tuple(names), "intercepts": tuple(intercepts)}


def use_model_precision() -> None:
    """Set JAX's x64 from ``pytensor.config.floatX`` (float64: on), as PyMC's JAX backend does on import for
    ``pm.sample(nuts_sampler="numpyro")``: a PyMC model runs in the precision it was written for."""
    import pytensor

    jax.config.update("jax_enable_x64", pytensor.config.floatX == "float64")


@dataclass(frozen=True, eq=False)
class PyMCTarget:
    """A ``pymc.Model``, sampled on the unconstrained scale of its value variables.

    The flat position is the model's value variables (``model.value_vars``: ``mu``, ``tau_log__``, ...)
    raveled in order; the log density is ``model.logp()`` (log-Jacobians of the transforms included)
    compiled by PyTensor's JAX linker, as for ``pm.sample(nuts_sampler="numpyro")``. ``constrain_fn``
    gives the free variables on their constrained scale and the deterministics, named as PyMC names them.
    Chains start at ``model.initial_point()`` (``init``: values, constrained, for some free variables) plus
    ``U(-1, 1)`` in every unconstrained coordinate, as PyMC's jitter. Dims and coords are the model's;
    ``pm.Data`` goes to ``constant_data``, observations to ``observed_data``. With ``log_likelihood=True``
    the flat model also gives each observed variable's pointwise log-likelihood, with ``predictive=True``
    a draw of each observed variable given the position (drawn with JAX on the workers).

    The model is pickled as it is (cloudpickle; a few tens of kB) and compiled in each worker process.
    """

    model: Any
    name: str = ""
    log_likelihood: bool = False
    predictive: bool = False
    init: dict | None = None
    radius: float = 1.0
    var_names: tuple | None = None  # the posterior's variables (None: every free variable and deterministic)
    intercepts: tuple = ()  # (name, coefficient names, their columns' means, response levels): Bambi's centring

    def with_outputs(self, log_likelihood: bool = False, predictive: bool = False,
                     noncentered: bool = False) -> PyMCTarget:
        """The same model, its flat model also giving pointwise log-likelihoods and/or predictive draws, and with
        ``noncentered`` its hierarchy's normal variables sampled non-centred (:mod:`dhmc.models.pymc_noncentred`)."""
        model = self.model
        if noncentered:
            from dhmc.models.pymc_noncentred import noncentred as rewrite

            model = rewrite(model)[0]
        target = replace(self, model=model, log_likelihood=log_likelihood, predictive=predictive)
        target.check()
        return target

    def check(self) -> None:
        """Refuse, in one line naming the variable, a model dhmc cannot sample: a discrete free variable,
        no free variable, an ``init`` naming no free variable or of another shape than its variable's."""
        model = self.model
        if not model.free_RVs:
            raise ValueError(f"the PyMC model {self.name!r} has no free variables to sample")
        for rv in model.free_RVs:
            if not rv.type.dtype.startswith("float"):
                raise ValueError(f"the PyMC model's free variable {rv.name!r} is discrete ({rv.type.dtype}): HMC "
                                 "samples continuous variables only; marginalise it out (pymc_extras' "
                                 "marginalize) or make it observed")
        names = {rv.name for rv in model.free_RVs}
        for key in self.init or {}:
            if key not in names and f"{key}_decentered" in names:
                raise ValueError(f"init names {key!r}, which noncentered=True samples as {key}_decentered (standard "
                                 f"normal): give that, or leave {key!r} out")
            if key not in names:
                raise ValueError(f"init names {key!r}, which is not a free variable of the PyMC model; its free "
                                 f"variables are {', '.join(sorted(names))}")
        if self.init:
            shapes = model.eval_rv_shapes()
            for key, value in self.init.items():
                want = tuple(int(n) for n in shapes[key])
                if tuple(np.shape(value)) != want:
                    raise ValueError(f"init for {key!r} has shape {np.shape(value)}, the variable has shape {want}")

    def sample_prior(self, draws: int, seed: int) -> tuple[dict, dict]:
        """``(prior, prior_predictive)``: ``draws`` draws of the free variables and deterministics and of the
        observed variables (``pm.sample_prior_predictive``, with PyMC's own random streams)."""
        import pymc as pm

        rng = np.random.default_rng([seed, PRIOR_STREAM])
        values = pm.sample_prior_predictive(draws, model=self.model, random_seed=rng, return_inferencedata=False)
        observed = {rv.name for rv in self.model.observed_RVs}
        prior = {k: np.asarray(v) for k, v in values.items() if k not in observed}
        return prior, {k: np.asarray(v) for k, v in values.items() if k in observed}

    def build(self) -> FlatModel:
        from pymc.backends.arviz import coords_and_dims_for_inferencedata, find_constants, find_observations
        from pymc.util import get_default_varnames

        self.check()
        model = self.model
        values = list(model.value_vars)
        point = self._initial_point()
        template = [np.asarray(point[v.name]) for v in values]
        flat, unravel = ravel_pytree([jax.numpy.asarray(a) for a in template])
        outputs = list(get_default_varnames(model.unobserved_value_vars, include_transformed=False))
        if self.var_names is not None:
            outputs = [v for v in outputs if v.name in self.var_names]

        logp = jaxified(self.model, self.name, values, [model.logp()], "its log density")
        to_constrained = jaxified(self.model, self.name, values, outputs, "its free variables and deterministics")
        names = [v.name for v in outputs]

        def logdensity(x):
            return logp(*unravel(x))[0]

        def constrain(x):
            values = dict(zip(names, to_constrained(*unravel(x)), strict=True))
            for name, terms, means, levels in self.intercepts:
                rows = [jax.numpy.reshape(values[t], (-1, levels) if levels else (-1,)) for t in terms]
                values[name] = values[name] - jax.numpy.tensordot(means, jax.numpy.concatenate(rows), 1)
            return values

        observed = {k: np.asarray(v) for k, v in find_observations(model).items()}
        if (self.log_likelihood or self.predictive) and not observed:
            asked = "log_likelihood=True" if self.log_likelihood else "predictive=True"
            raise ValueError(f"{asked} needs observed variables (observed=...), the PyMC model {self.name!r} has none")
        pointwise = None
        if self.log_likelihood:
            rvs = list(model.observed_RVs)
            elementwise = jaxified(self.model, self.name, values, model.logp(rvs, sum=False),
                                   "its pointwise log-likelihood")

            def pointwise(x):
                return dict(zip([rv.name for rv in rvs], elementwise(*unravel(x)), strict=True))

        predictive = predictive_fn(self.model, self.name, values, unravel) if self.predictive else None
        constant = {k: np.asarray(v) for k, v in find_constants(model).items()}
        coords, dims = coords_and_dims_for_inferencedata(model)
        stored = {*names, *observed, *constant}
        dims = {k: v for k, v in dims.items() if k in stored}
        coords = {k: list(np.asarray(v).tolist()) for k, v in coords.items()}
        free = [model.values_to_rvs[v].name for v in values]  # each value variable by its free variable's name
        return FlatModel(logdensity, constrain, int(flat.size), flat.dtype, np.asarray(flat), self.radius,
                         observed, dims=dims, coords=coords, log_likelihood_fn=pointwise, predictive_fn=predictive,
                         constant_data=constant, variables=flat_variables(free, template))

    def _initial_point(self) -> dict:
        """The model's initial point on the unconstrained scale, ``init``'s values in place of its own."""
        if not self.init:
            return self.model.initial_point()
        from pymc.initial_point import make_initial_point_fn

        return make_initial_point_fn(model=self.model, overrides=dict(self.init), jitter_rvs=set(),
                                     return_transformed=True)(0)

"""PyTensor graphs of a PyMC model as JAX functions, through PyMC's JAX backend (imported without its side effects
on this process); an Op with no JAX implementation is one line naming the variable that uses it."""

from __future__ import annotations

import os

import jax

__all__ = ["jax_backend", "jaxified", "predictive_fn"]


def jax_backend():
    """``pymc.sampling.jax``, imported without its side effects on this process: its import sets x64 from floatX
    (a worker keeps the precision of its run) and ``XLA_FLAGS`` to 100 host devices (the driver's programs, compiled
    for that, would not run on workers of one device; embedded workers would inherit it)."""
    x64, flags = jax.config.jax_enable_x64, os.environ.get("XLA_FLAGS")
    try:
        import pymc.sampling.jax as backend
    finally:
        jax.config.update("jax_enable_x64", x64)
        if flags is None:
            os.environ.pop("XLA_FLAGS", None)
        else:
            os.environ["XLA_FLAGS"] = flags
    return backend


def jaxified(model, name: str, inputs, outputs, what: str):
    """PyTensor's JAX function of ``outputs`` of the PyMC model ``model`` (named ``name`` in errors); an Op with no
    JAX implementation is one line naming the variable."""
    try:
        return jax_backend().get_jaxified_graph(inputs=inputs, outputs=outputs)
    except NotImplementedError as e:
        raise ValueError(f"the PyMC model {name!r} cannot run in JAX: {_culprit(model)}uses an Op with "
                         f"no JAX implementation ({str(e).splitlines()[0] if str(e) else type(e).__name__}); "
                         "register one with pytensor.link.jax.dispatch.jax_funcify, or write it with PyTensor "
                         f"operations that have one (while compiling {what})") from None


def _culprit(model) -> str:
    """``"variable 'x' "``: the first variable whose own log density (or a deterministic's value) does not compile
    to JAX; empty if none alone fails."""
    get_jaxified_graph = jax_backend().get_jaxified_graph
    values = list(model.value_vars)
    parts = [(rv.name, [model.logp(vars=[rv])]) for rv in [*model.free_RVs, *model.observed_RVs]]
    parts += [(d.name, model.replace_rvs_by_values([d])) for d in model.deterministics]
    for name, graph in parts:
        try:
            get_jaxified_graph(inputs=values, outputs=graph)
        except NotImplementedError:
            return f"variable {name!r} "
        except Exception:  # noqa: BLE001,S112 - only a missing JAX implementation is looked for
            continue
    return ""


def predictive_fn(model, name: str, values, unravel):
    """``(flat position, key) -> {observed name: draw}``: each observed variable drawn with JAX given the free
    variables' values (their value variables, transformed back), one PyTensor random stream per observed variable."""
    from pymc.logprob.utils import replace_rvs_by_values
    from pytensor.graph.replace import clone_replace
    from pytensor.graph.traversal import graph_inputs
    from pytensor.tensor.random.type import RandomType

    free = set(model.free_RVs)
    observed = list(model.observed_RVs)
    graphs = replace_rvs_by_values(observed, rvs_to_values={rv: model.rvs_to_values[rv] for rv in free},
                                   rvs_to_transforms={rv: t for rv, t in model.rvs_to_transforms.items()
                                                      if rv in free})
    rngs = [v for v in graph_inputs(graphs) if isinstance(v.type, RandomType)]
    streams = [v.type() for v in rngs]
    graphs = clone_replace(graphs, replace=dict(zip(rngs, streams, strict=True)))
    draw = jaxified(model, name, [*values, *streams], graphs, "its posterior predictive")
    names = [rv.name for rv in observed]

    def predictive(x, key):
        keys = [{"jax_state": k} for k in jax.random.split(key, max(len(streams), 1))[: len(streams)]]
        return dict(zip(names, draw(*unravel(x), *keys), strict=True))

    return predictive

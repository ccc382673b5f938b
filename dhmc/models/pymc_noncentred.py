"""A PyMC model's hierarchy sampled non-centred: ``theta ~ Normal(mu, tau)`` becomes ``theta = mu + tau * z`` with
``z ~ Normal(0, 1)``, rewritten on the model's graph (``pymc.model.fgraph``) so that the user's model stays as
written.

The funnel between a group-level scale and the effects it scales is the centred eight schools' geometry: a
global step size that suits the funnel's mouth diverges in its neck, and the neck goes under-explored. Non-centred,
``z`` and ``tau`` are independent a priori and the funnel is gone (NumPyro's ``LocScaleReparam(0)``, which
``noncentered=True`` applies to a NumPyro model, is the same rewrite).
"""

from __future__ import annotations

__all__ = ["noncentred", "noncentred_variables"]


def noncentred_variables(model) -> list[str]:
    """The free variables worth non-centring: a ``pm.Normal`` on the real line (no transform) whose ``mu`` or
    ``sigma`` depends on another free variable (a hierarchy)."""
    from pytensor.graph.traversal import ancestors
    from pytensor.tensor.random.basic import NormalRV

    free = set(model.free_RVs)
    names = []
    for rv in model.free_RVs:
        if not isinstance(rv.owner.op, NormalRV):
            continue
        if model.rvs_to_transforms.get(rv) is not None:
            continue
        _, _, loc, scale = rv.owner.inputs
        if free & (set(ancestors([loc, scale])) - {rv}):
            names.append(rv.name)
    return names


def noncentred(model):
    """``(model, names)``: a new ``pm.Model`` in which each of :func:`noncentred_variables` ``theta`` is the
    deterministic ``mu + sigma * theta_decentered`` (same dims) of a standard normal ``theta_decentered``, and the
    names of the variables rewritten (none: the model itself)."""
    import pymc as pm
    from pymc.model.fgraph import fgraph_from_model, model_deterministic, model_free_rv, model_from_fgraph
    from pymc.pytensorf import toposort_replace

    names = noncentred_variables(model)
    if not names:
        return model, []
    graph, memo = fgraph_from_model(model)
    replacements = []
    for name in names:
        old = memo[model.named_vars[name]]
        rv, _, *dims = old.owner.inputs  # ModelFreeRV(rv, value, *dims)
        rng, size, loc, scale = rv.owner.inputs
        standard = pm.Normal.dist(0.0, 1.0, size=size, rng=rng)
        standard.name = f"{name}_decentered"
        value = standard.clone()
        value.name = standard.name
        z = model_free_rv(standard, value, None, *dims)
        theta = loc + scale * z
        theta.name = name
        replacements.append((old, model_deterministic(theta, *dims)))
    toposort_replace(graph, replacements, reverse=True)
    return model_from_fgraph(graph, mutate_fgraph=True), names

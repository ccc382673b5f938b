"""Three reference posteriors written in PyMC as its users write them (constrained priors, dims and coords,
``pm.Data``): the non-centred and centred eight schools and kidiq. Each is a function returning a fresh
``pm.Model`` built from the posteriordb data in ``reference_posteriors/``; the draws dhmc returns are named as
the NumPyro models' in ``posteriors.py`` (``mu``, ``tau``, ``theta``; ``beta``, ``sigma``), so their
``numpyro_to_reference`` maps them to the reference's names.
"""

from __future__ import annotations

import numpy as np

from tests.validation.posteriors import _data

__all__ = ["eight_schools_noncentered", "eight_schools_centered", "kidiq", "PYMC_MODELS"]

SCHOOLS = ["Choate", "Deerfield", "Phillips Andover", "Phillips Exeter", "Hotchkiss", "Lawrenceville",
           "St. Paul's", "Mt. Hermon"]


def eight_schools_noncentered():
    import pymc as pm

    d = _data("eight_schools-eight_schools_noncentered")
    with pm.Model(coords={"school": SCHOOLS}) as model:
        sigma = pm.Data("sigma", np.asarray(d["sigma"], float), dims="school")
        mu = pm.Normal("mu", 0.0, 5.0)
        tau = pm.HalfCauchy("tau", 5.0)
        theta_trans = pm.Normal("theta_trans", 0.0, 1.0, dims="school")
        theta = pm.Deterministic("theta", mu + tau * theta_trans, dims="school")
        pm.Normal("y", theta, sigma, observed=np.asarray(d["y"], float), dims="school")
    return model


def eight_schools_centered():
    import pymc as pm

    d = _data("eight_schools-eight_schools_centered")
    with pm.Model(coords={"school": SCHOOLS}) as model:
        sigma = pm.Data("sigma", np.asarray(d["sigma"], float), dims="school")
        mu = pm.Normal("mu", 0.0, 5.0)
        tau = pm.HalfCauchy("tau", 5.0)
        theta = pm.Normal("theta", mu, tau, dims="school")
        pm.Normal("y", theta, sigma, observed=np.asarray(d["y"], float), dims="school")
    return model


def kidiq():
    import pymc as pm

    d = _data("kidiq-kidscore_momiq")
    kid_score, mom_iq = np.asarray(d["kid_score"], float), np.asarray(d["mom_iq"], float)
    with pm.Model(coords={"coef": ["intercept", "mom_iq"], "child": np.arange(len(kid_score))}) as model:
        mom_iq = pm.Data("mom_iq", mom_iq, dims="child")
        beta = pm.Flat("beta", dims="coef")  # flat (improper) prior, as in the Stan model
        sigma = pm.HalfCauchy("sigma", 2.5)
        pm.Normal("kid_score", beta[0] + beta[1] * mom_iq, sigma, observed=kid_score, dims="child")
    return model


PYMC_MODELS = {
    "eight_schools-eight_schools_noncentered": eight_schools_noncentered,
    "eight_schools-eight_schools_centered": eight_schools_centered,
    "kidiq-kidscore_momiq": kidiq,
}

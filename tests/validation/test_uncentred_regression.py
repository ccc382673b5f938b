"""A regression on an uncentred covariate, as its users write it (posteriordb's ``kilpisjarvi_mod-kilpisjarvi``, a
NumPyro model in float32, dhmc's defaults), against posteriordb's reference draws.

Slope and intercept are correlated -0.99999, the noise scale's prior is flat, and the chains start ``U(-2, 2)``
unconstrained: up to 270 slope sds out, with the noise scale at 5e4 times its posterior's. The cold phase's 400
gradients left the ensemble there, and the adjusted phase, whose one step size must suit every chain, crawled: 111,182
sequential gradients a chain in float64, and in float32 it ran out of warmup and draws, wrong (warned).
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import dhmc
from tests.validation.compare import compare

pytestmark = pytest.mark.slow

Y = [8.3, 10.9, 9.4, 8.1, 8.1, 7.7, 8.6, 9.1, 11, 10.1, 7.6, 8.8, 8.3, 7.2, 9.3, 8.8, 7.6, 10.5, 11, 8.9, 11.3, 10,
     10.1, 6.4, 8.2, 8.4, 9.5, 9.9, 10.6, 7.6, 7.7, 8.1, 8.4, 9.7, 9.5, 7.3, 10.3, 9.6, 10.3, 9.8, 9, 9.1, 9.5, 8.7,
     9.9, 10.5, 9.4, 9, 9, 9.7, 11.4, 10.7, 10.1, 10.8, 10.4, 10.3, 8.8, 9.8, 8.8, 10.8, 8.6, 11.1]
X = np.arange(3952.0, 3952.0 + len(Y))  # posteriordb's covariate, as given
# (mean, sd, mcse) of posteriordb's reference draws (10 chains x 1000), mcse = sd / sqrt(ESS)
REFERENCE = {"alpha": (-60.71228, 29.96467, 0.30636), "beta": (0.01758363, 0.00752421, 7.6917e-05),
             "sigma": (1.131667, 0.1078191, 0.0010625)}


def kilpisjarvi(x, y):
    import numpyro
    import numpyro.distributions as dist

    alpha = numpyro.sample("alpha", dist.Normal(9.31290322580645, 100.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 0.0333333333333333))
    sigma = numpyro.sample("sigma", dist.ImproperUniform(dist.constraints.positive, (), ()))
    numpyro.sample("y", dist.Normal(alpha + beta * x, sigma), obs=y)


def test_a_regression_on_an_uncentred_covariate_matches_its_reference_from_a_far_start(client2):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", dhmc.ConvergenceWarning)
        tree = dhmc.sample(kilpisjarvi, model_kwargs={"x": X, "y": np.asarray(Y)}, chains=256, draws="auto", seed=0,
                           cluster=client2, progress=False)
    assert not [str(w.message) for w in caught if issubclass(w.category, dhmc.ConvergenceWarning)]
    posterior = tree["posterior"]
    draws = {name: posterior[name].values for name in REFERENCE}
    report = compare(draws, "kilpisjarvi_mod-kilpisjarvi", moments=REFERENCE, required=list(REFERENCE))
    assert report.passed, "\n" + str(report)
    warmup = sum(int(r["grad_evals"]) for r in json.loads(posterior.attrs["dhmc_warmup"])) / 256
    assert warmup < 10_000  # 2,700-3,900 at 1024 chains; the adjusted phase's crawl took 108,000

"""Which sites of a NumPyro model ``noncentered=True`` non-centres (``dhmc.models.numpyro_noncentred``)."""

from __future__ import annotations

import numpyro
import numpyro.distributions as dist

from dhmc.models.numpyro_noncentred import noncentred_sites
from tests.models.test_numpyro_ import SIGMA, Y, centred


def flat(sigma, y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


def test_only_sites_whose_loc_or_scale_depend_on_latent_sites_are_non_centred():
    assert noncentred_sites(centred, (SIGMA, Y)) == ["theta"]  # mu's loc and scale are constants; tau: no loc
    assert noncentred_sites(flat, (SIGMA, Y)) == []


def test_sites_loc_scale_reparam_cannot_rebuild_stay_centred():
    """StudentT needs its df (LocScaleReparam rebuilds type(fn)(loc, scale)); a masked site is not unwrapped."""

    def model():
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        numpyro.sample("a", dist.StudentT(3.0, mu, 1.0))
        numpyro.sample("b", dist.Normal(mu, 1.0).mask(False))
        numpyro.sample("c", dist.Normal(mu, 1.0).expand([3]).to_event(1))

    assert noncentred_sites(model) == ["c"]

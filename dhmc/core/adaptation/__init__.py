"""Adaptation pieces, each a factory of pure ``init / update / final`` (and ``merge``) functions."""

from dhmc.core.adaptation.chees import chees_trajectory, halton
from dhmc.core.adaptation.dual_averaging import dual_averaging
from dhmc.core.adaptation.welford import welford

__all__ = ["dual_averaging", "welford", "chees_trajectory", "halton"]

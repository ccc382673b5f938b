"""Convergence statistics of many chains (pure NumPy): split and nested R-hat and the superchains the latter
groups chains into (:mod:`~dhmc.stats.rhat`), bulk, tail and sd ESS (:mod:`~dhmc.stats.ess`: ArviZ's, without
importing it) and the ensemble's E-BFMI (:mod:`~dhmc.stats.energy`). The stopping rule, the end-of-run check and
``dhmc.diagnostics`` share them."""

from dhmc.stats.energy import EBFMI_CHAINS, EBFMI_MIN, ebfmi, ebfmi_warning
from dhmc.stats.ess import KURTOSIS_SE, ess_bulk, ess_sd, ess_tail
from dhmc.stats.rhat import MAX_SUPERCHAINS, max_nested_rhat, nested_rhat, split_rhat, superchains

__all__ = ["EBFMI_CHAINS", "EBFMI_MIN", "KURTOSIS_SE", "MAX_SUPERCHAINS", "ebfmi", "ebfmi_warning", "ess_bulk",
           "ess_sd", "ess_tail", "max_nested_rhat", "nested_rhat", "split_rhat", "superchains"]

"""Convergence diagnostics of a trace: ArviZ's where it has them, nested R-hat and checks of dhmc's own."""

from __future__ import annotations

import numpy as np
import xarray as xr

from dhmc.distributed.stopping import describe
from dhmc.distributed.warmup import adjusted_iterations
from dhmc.stats import EBFMI_MIN, ebfmi_warning, nested_rhat
from dhmc.stats import ebfmi as _ebfmi

__all__ = ["nested_rhat", "summary", "ebfmi", "divergences", "check"]


def summary(trace: xr.DataTree, var_names=None, superchains: int | None = None):
    """ArviZ's summary (means, sds, HDIs, MCSE, bulk/tail ESS, rank-normalised split R-hat) plus nested R-hat.

    ``superchains`` defaults to the run's blocks of ``chains_per_task`` chains (when there are at
    least two), else 4 groups.
    """
    import arviz as az

    posterior = _posterior(trace, var_names)
    table = az.summary(posterior, kind="all", round_to="none")
    chains = posterior.sizes["chain"]
    k = superchains or _default_superchains(trace, chains)
    if k and k >= 2 and chains % k == 0 and chains >= 2 * k:
        values = []
        for var in posterior.data_vars.values():
            flat = var.values.reshape(chains, posterior.sizes["draw"], -1)
            for i in range(flat.shape[-1]):
                values.append(nested_rhat(flat[..., i], k))
        table["nested_r_hat"] = values
    return table


def ebfmi(trace: xr.DataTree) -> float:
    """The ensemble's energy Bayesian fraction of missing information (:func:`dhmc.stats.ebfmi`, its first chains);
    NaN for MAMS, whose recorded energy is ``-log p`` alone (no momentum)."""
    if (_attr(trace, "dhmc_run_spec") or {}).get("kernel") == "mams":
        return float("nan")
    return _ebfmi(trace["sample_stats"]["energy"])


def divergences(trace: xr.DataTree) -> int:
    """Number of divergent transitions after warmup."""
    return int(np.asarray(trace["sample_stats"]["diverging"].values).sum())


def check(trace: xr.DataTree, table=None) -> list[str]:
    """Plain-language warnings: R-hat, nested R-hat, ESS, divergences, E-BFMI. Empty if all look fine."""
    table = summary(trace) if table is None else table
    warnings = []
    bad = table.index[table["r_hat"] > 1.01].tolist()
    if bad:
        warnings.append(f"R-hat above 1.01 for {', '.join(bad[:8])}: chains disagree; sample longer")
    if "nested_r_hat" in table:
        bad = table.index[table["nested_r_hat"] > 1.01].tolist()
        if bad:
            warnings.append(f"nested R-hat above 1.01 for {', '.join(bad[:8])}")
    low = table.index[table["ess_bulk"] < 400].tolist()
    if low:
        warnings.append(f"bulk ESS below 400 for {', '.join(low[:8])}")
    n = divergences(trace)
    if n:
        total = trace["sample_stats"]["diverging"].size
        warnings.append(f"{n} divergent transitions ({100 * n / total:.2g}% of draws): the posterior may be biased; "
                        "reparameterise or raise target_accept")
    history = _attr(trace, "dhmc_warmup") or []
    last = history[-1].get("check", {}) if history else {}
    if last and not last.get("converged"):
        warnings.append(f"warmup='auto' reached its cap ({adjusted_iterations(history)} iterations) before "
                        f"the ensemble converged (the last round's {describe(history[-1])})")
    fraction = ebfmi(trace)
    if fraction < EBFMI_MIN:
        warnings.append(ebfmi_warning(fraction))
    return warnings


def _attr(trace, name):
    """A JSON attribute of the run (the posterior group's), decoded; None if absent."""
    import json

    try:
        value = trace["posterior"].attrs[name]
    except (KeyError, TypeError):
        return None
    return json.loads(value) if isinstance(value, str) else value


def _posterior(trace, var_names):
    posterior = trace["posterior"].to_dataset() if isinstance(trace, xr.DataTree) else trace.posterior
    if var_names:
        posterior = posterior[list(var_names)]
    return posterior


def _default_superchains(trace, chains):
    try:
        cpt = _attr(trace, "dhmc_run_spec")["chains_per_task"]
    except (KeyError, ValueError, TypeError):
        return 4
    k = chains // cpt
    return k if k >= 2 else 4

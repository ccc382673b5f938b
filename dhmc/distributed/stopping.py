"""The stopping rule of ``draws="auto"``: bulk and tail ESS and nested R-hat of the draws so far.

After every complete wave of segments (all chunks have finished segment ``s``) the driver looks at
the first :func:`head_chains` chains of every chunk, over all draws so far, and stops when every
scalar parameter's bulk and tail ESS (ArviZ's, scaled from the chains looked at to the whole
ensemble) reach ``target_ess`` and the largest nested R-hat (superchains: the chunks) is below
:data:`RHAT_MAX`. The decision depends only on the draws, so it is as deterministic as they are.
"""

from __future__ import annotations

import math

import numpy as np

from dhmc.distributed.plan import Plan

RHAT_MAX = 1.01
MAX_CHAINS = 1024  # the rule looks at about this many chains, the first of each chunk (nested R-hat's noise
# floor is about sqrt(1 + 1 / (chains per superchain x ESS per chain)): 16 chains per chunk of a
# 1024-chain run and 10 draws sat at 1.01)
GROWTH = 1.2  # waves are measured as the draws grow by 20%: checks cost O(log draws)


def nested_rhat(draws: np.ndarray, superchains: int):
    """Nested R-hat (Margossian et al. 2024) of ``draws`` with shape ``(chains, draws, ...)``.

    Chains are grouped in order into ``superchains`` groups of equal size. It stays meaningful for
    many short chains, where split R-hat needs long ones. A float for 2-d ``draws``, else an array
    over the trailing dims.
    """
    chains, n = draws.shape[:2]
    if superchains < 2 or chains % superchains:
        raise ValueError(f"{chains} chains cannot be split into {superchains} superchains of equal size")
    x = np.asarray(draws, float).reshape(superchains, chains // superchains, n, *draws.shape[2:])
    chain_means = x.mean(axis=2)
    between = chain_means.mean(axis=1).var(axis=0, ddof=1)
    m = x.shape[1]
    zeros = np.zeros_like(chain_means[:, 0])
    between_chains = chain_means.var(axis=1, ddof=1) if m > 1 else zeros
    within_chains = x.var(axis=2, ddof=1).mean(axis=1) if n > 1 else zeros
    within = (between_chains + within_chains).mean(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        rhat = np.where(within > 0, np.sqrt(1.0 + between / within), np.nan)
    return float(rhat) if rhat.ndim == 0 else rhat


def split_rhat(draws: np.ndarray):
    """Split R-hat (Gelman et al. 2013) of ``draws`` shaped ``(chains, draws, ...)``, vectorized over trailing dims.

    Each chain's halves count as two chains, so a chain that drifts raises it as surely as chains
    that disagree. NaN with fewer than 4 draws per chain.
    """
    n = draws.shape[1] // 2
    if n < 2:
        return np.full(draws.shape[2:], np.nan) if draws.ndim > 2 else float("nan")
    x = np.concatenate([draws[:, :n], draws[:, draws.shape[1] - n:]]).astype(float)
    within = x.var(axis=1, ddof=1).mean(axis=0)
    between = n * x.mean(axis=1).var(axis=0, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        rhat = np.sqrt(((n - 1) / n * within + between / n) / within)
    return float(rhat) if rhat.ndim == 0 else rhat


def head_chains(plan: Plan) -> int:
    """Chains per chunk the rule looks at: the first ``min(smallest chunk, 1024 / chunks)``, at least 1."""
    smallest = len(plan.chunk(plan.num_chunks - 1))
    return max(1, min(smallest, MAX_CHAINS // plan.num_chunks))


def superchains(chunks: int, used: int) -> int:
    """Superchains for nested R-hat: the chunks, or for one chunk (a GPU's) up to 16 groups of >= 16 chains."""
    return chunks if chunks >= 2 else next((g for g in (16, 8, 4, 2) if used >= 16 * g), 2 if used >= 4 else 0)


def max_nested_rhat(draws: dict[str, np.ndarray], superchains: int) -> float:
    """Largest nested R-hat over every scalar of ``draws`` (``{name: (chains, draws, ...)}``), the chains cut
    to a multiple of ``superchains``; 1.0 without superchains or any finite value."""
    if not superchains:
        return 1.0
    used = next(iter(draws.values())).shape[0]
    rhats = np.concatenate([np.ravel(nested_rhat(v[:used - used % superchains], superchains))
                            for v in draws.values()])
    return float(np.nanmax(rhats)) if np.isfinite(rhats).any() else 1.0


def remaining(draws: int, min_ess: float, target_ess: float, max_draws: int) -> int:
    """Draws still to go, extrapolated linearly from the ESS so far (capped at ``max_draws``)."""
    if min_ess >= target_ess:
        return 0
    if not min_ess > 0:
        return max_draws - draws
    return int(min(math.ceil(draws * (target_ess / min_ess - 1)), max_draws - draws))


class Stopping:
    """The rule's state in one run: the chains looked at, block by block, and the waves checked.

    Parameters
    ----------
    spec
        The run's ``RunSpec`` (``target_ess`` set; ``draws`` is ``max_draws``).
    sink
        Its sink, read (``head``) for blocks finished before this run (a resume).
    checked
        Waves an earlier run already checked, none of which met the rule.
    """

    def __init__(self, spec, sink, checked: int = 0):
        self.spec, self.plan, self.sink = spec, spec.plan, sink
        self.k = head_chains(self.plan)
        self.heads: dict[tuple[int, int], dict] = {}
        self.waves, self.stopped, self.last = checked, False, None

    def add(self, chunk: int, segment: int, result: dict) -> None:
        """Keep a finished block's first chains (the worker's ``head``, or its draws)."""
        head = result.get("head") or result.get("posterior")
        if head is not None:
            self.heads[chunk, segment] = {name: np.array(v[:self.k]) for name, v in head.items()}

    def draws(self, wave: int) -> dict[str, np.ndarray]:
        """The head chains' draws of the first ``wave`` segments, chunk after chunk."""
        parts = []
        for chunk in range(self.plan.num_chunks):
            blocks = [self._head(chunk, s) for s in range(wave)]
            parts.append({name: np.concatenate([b[name] for b in blocks], axis=1) for name in blocks[0]})
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}

    def final(self) -> dict:
        """R-hat of a finished fixed-draws run over the head chains: ``{"max_rhat", "max_nested_rhat", "worst"}``.

        NumPy only (no ESS): a run's end costs no more than a read of its head chains.
        """
        draws = self.draws(self.plan.num_segments)
        used = next(iter(draws.values())).shape[0]
        worst, split = "", 1.0
        for name, v in draws.items():
            r = np.ravel(split_rhat(v))
            if np.isfinite(r).any() and np.nanmax(r) > split:
                split, worst = float(np.nanmax(r)), name
        nested = max(1.0, max_nested_rhat(draws, superchains(self.plan.num_chunks, used)))
        return {"max_rhat": split, "max_nested_rhat": nested, "worst": worst, "chains": used,
                "draws": self.plan.draws}

    def check(self, wave: int) -> dict | None:
        """Apply the rule to the first ``wave`` segments; return what observers are told (None: not measured).

        Only waves whose draws cross a power of :data:`GROWTH` are measured (and the last); the others
        count as checked and not met, so short segments do not cost a check each. Which waves are
        measured depends on the wave alone, so a resumed run measures the same ones.
        """
        plan = self.plan
        n = min(wave * plan.draws_per_segment, plan.draws)
        if not self.due(wave):
            self.waves = wave
            getattr(self.sink, "checked", lambda wave: None)(wave)
            return None
        draws = self.draws(wave)
        min_ess, max_rhat = self._measure(draws, plan.num_chunks)
        converged = min_ess >= self.spec.target_ess and max_rhat < RHAT_MAX
        self.last = {"draws": n, "min_ess": min_ess, "max_rhat": max_rhat, "target_ess": self.spec.target_ess,
                     "max_draws": plan.draws, "converged": converged,
                     "remaining": remaining(n, min_ess, self.spec.target_ess, plan.draws)}
        if converged:
            self.stopped = True
        else:
            self.waves = wave
            getattr(self.sink, "checked", lambda wave: None)(wave)
        return self.last

    def due(self, wave: int) -> bool:
        """Whether wave ``wave`` is measured: the first, the last, and those crossing a power of :data:`GROWTH`."""
        plan = self.plan
        n, before = (min(w * plan.draws_per_segment, plan.draws) for w in (wave, wave - 1))
        grid = lambda draws: math.floor(math.log(draws) / math.log(GROWTH))
        return wave <= 1 or n >= plan.draws or grid(n) > grid(before)

    def _head(self, chunk: int, segment: int) -> dict:
        if (chunk, segment) not in self.heads:
            self.heads[chunk, segment] = self.sink.head(chunk, segment, self.k)
        return self.heads[chunk, segment]

    def _measure(self, draws: dict, chunks: int) -> tuple[float, float]:
        """``(min ESS scaled to the ensemble, max nested R-hat)`` over every scalar parameter.

        A scalar whose ESS or R-hat is undefined (constant draws) is left out; no ESS at all counts as 0.
        """
        import arviz as az
        import xarray as xr

        used = next(iter(draws.values())).shape[0]
        data = xr.Dataset({name: (("chain", "draw", *[f"{name}_dim_{i}" for i in range(v.ndim - 2)]), v)
                           for name, v in draws.items()})
        ess = [np.asarray(az.ess(data, method=m)[name].values, float).ravel()
               for m in ("bulk", "tail") for name in draws]
        ess = np.concatenate(ess)
        min_ess = float(np.nanmin(ess)) * self.spec.chains / used if np.isfinite(ess).any() else 0.0
        return min_ess, max_nested_rhat(draws, superchains(chunks, used))

"""R-hat of many chains (pure NumPy): split R-hat, nested R-hat (Margossian et al. 2024) and the superchains
the latter groups chains into."""

from __future__ import annotations

import numpy as np

__all__ = ["MAX_SUPERCHAINS", "max_nested_rhat", "nested_rhat", "split_rhat", "superchains"]

MAX_SUPERCHAINS = 16  # nested R-hat's most groups: more, smaller ones raise its noise floor at few draws


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
    halves = (draws[:, :n], draws[:, draws.shape[1] - n:])  # views: no float64 copy of every draw
    within = np.concatenate([h.var(axis=1, ddof=1, dtype=float) for h in halves]).mean(axis=0)
    between = n * np.concatenate([h.mean(axis=1, dtype=float) for h in halves]).var(axis=0, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        rhat = np.sqrt(((n - 1) / n * within + between / n) / within)
    return float(rhat) if rhat.ndim == 0 else rhat


def superchains(chunks: int, used: int) -> int:
    """Superchains for nested R-hat: the chunks (more than :data:`MAX_SUPERCHAINS`: the most groups of consecutive
    chunks, an equal number each, up to it), or for one chunk (a GPU's) up to 16 groups of >= 16 chains.

    More, smaller superchains raise nested R-hat's noise floor at a few draws a chain: 4096 chains in 64 chunks,
    16 monitored chains each, needed 2-3 waves of 10 draws to read below 1.01 where 1024 chains in 16 chunks of 64
    needed one.
    """
    if chunks >= 2:  # the most groups of whole chunks, at most MAX_SUPERCHAINS; the chunks if none divides them
        return next((g for g in range(min(chunks, MAX_SUPERCHAINS), 1, -1) if chunks % g == 0), chunks)
    return next((g for g in (16, 8, 4, 2) if used >= 16 * g), 2 if used >= 4 else 0)


def max_nested_rhat(draws: dict[str, np.ndarray], superchains: int) -> float:
    """Largest nested R-hat over every scalar of ``draws`` (``{name: (chains, draws, ...)}``), the chains cut
    to a multiple of ``superchains``; 1.0 without superchains or any finite value."""
    if not superchains:
        return 1.0
    used = next(iter(draws.values())).shape[0]
    rhats = np.concatenate([np.ravel(nested_rhat(v[:used - used % superchains], superchains))
                            for v in draws.values()])
    return float(np.nanmax(rhats)) if np.isfinite(rhats).any() else 1.0

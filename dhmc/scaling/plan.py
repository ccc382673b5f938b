"""What a scaling study runs: its points (workers, chains), the blocks per point, the fixed HMC settings.

Everything here is checked before any work starts, so that bad input fails at once with one clear error.
"""

from __future__ import annotations

__all__ = ["BLOCKS_PER_WORKER", "DEFAULT_SETTINGS", "FALLBACK_SETTINGS", "KINDS", "ScalingError", "check_models",
           "hmc_settings", "study_points"]

KINDS = ("strong", "weak", "chains")

#: Fixed HMC settings per built-in model: ``(step_size, num_steps)``. The step sizes keep the
#: acceptance well above zero; the numbers of steps make 512 chains x 400 draws cost roughly
#: 5-20 s on one core, so that blocks of 64 chains x 200 draws run >= 0.5 s (a Dask task costs ~2.5 ms).
DEFAULT_SETTINGS: dict[str, tuple[float, int]] = {
    "gaussian_2d": (0.1, 1000),
    "harmonic_oscillator": (0.1, 1000),
    "coin_toss": (0.2, 200),
    "eight_schools": (0.3, 300),
    "linear_acceleration": (0.001, 50),
}
FALLBACK_SETTINGS = (0.1, 100)
BLOCKS_PER_WORKER = 4  # CPU default: blocks per worker per segment (equal work, some load balancing)


class ScalingError(RuntimeError):
    """A study that cannot be run as asked (e.g. an unscalable cluster)."""


def _positive(name, value):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def study_points(kind, workers, chains, chains_per_worker, chains_list, chains_per_task, draws, repeat, models,
                 cluster):
    """Validate the study and return ``(points [(workers, chains)], chains_per_task(chains), workers)``."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
    _positive("draws", draws)
    _positive("repeat", repeat)
    if not models or not all(isinstance(m, str) and m for m in models):
        raise ValueError(f"model must be a model name or a list of names, got {models!r}")
    if chains_per_task is not None:
        _positive("chains_per_task", chains_per_task)
    if kind == "chains":
        workers = [1] if workers is None else list(workers)
        if len(workers) != 1:
            raise ValueError(f"a chains study runs on one worker count, got workers={workers}")
        if chains_list is None and chains is not None and not isinstance(chains, int):
            chains_list = chains
        if not chains_list:
            raise ValueError("a chains study needs chains_list, e.g. [2, 8, 32, ..., 4096]")
        sizes = sorted({_positive("chains", int(c)) for c in chains_list})
        workers = [_positive("workers", workers[0])]
        return [(workers[0], c) for c in sizes], (lambda c: min(chains_per_task or c, c)), workers
    if workers is None or not list(workers):
        raise ValueError("workers must list the worker counts, e.g. [1, 2, 4]")
    workers = sorted({_positive("workers", int(w)) for w in workers})
    per_block = 1 if cluster == "cuda" else BLOCKS_PER_WORKER
    if kind == "strong":
        if chains is None:
            raise ValueError("a strong study needs chains (the fixed ensemble size)")
        _positive("chains", chains)
        cpt = chains_per_task or _divisor_at_most(chains, chains // (per_block * workers[-1]))
        return [(w, chains) for w in workers], (lambda c: min(cpt, c)), workers
    if chains_per_worker is None:
        raise ValueError("a weak study needs chains_per_worker (the ensemble grows with the workers)")
    _positive("chains_per_worker", chains_per_worker)
    cpt = chains_per_task or _divisor_at_most(chains_per_worker, chains_per_worker // per_block)
    return [(w, w * chains_per_worker) for w in workers], (lambda c: min(cpt, c)), workers


def _divisor_at_most(total: int, limit: int) -> int:
    """The largest divisor of ``total`` not above ``limit`` (so that all blocks have the same shape), or
    ``limit`` itself (a shorter last block) where no divisor comes within half of it."""
    limit = max(1, limit)
    best = max(d for d in range(1, limit + 1) if total % d == 0)
    return best if 2 * best >= limit else limit


def check_models(models) -> None:
    """Refuse a name that is not a built-in model."""
    from dhmc.models import EXAMPLES

    unknown = [m for m in models if m not in EXAMPLES]
    if unknown:
        raise ValueError(f"unknown model {unknown[0]!r}; choose one of: {', '.join(EXAMPLES)}")


def hmc_settings(model: str, step_size, num_steps) -> tuple[float, int]:
    """``(step_size, num_steps)`` for ``model``: the ones given, else its :data:`DEFAULT_SETTINGS`."""
    default_step, default_steps = DEFAULT_SETTINGS.get(model, FALLBACK_SETTINGS)
    step = float(step_size) if step_size is not None else default_step
    steps = int(num_steps) if num_steps is not None else default_steps
    if not step > 0:
        raise ValueError(f"step_size must be positive, got {step_size!r}")
    _positive("num_steps", steps)
    return step, steps


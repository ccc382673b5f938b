"""A run's geometry (pure): how its ensemble is cut into blocks of chains x draws, and how big they are.

A *chunk* is a contiguous range of chains, a *segment* a contiguous range of kept draws, and a *block*
one chunk over one segment: the unit of work one task runs and the unit of storage one Zarr chunk
holds. Nothing here may depend on the number of workers: the geometry fixes which chains and
iterations each block holds, and with it every random number. Storage, the driver, the stopping
rule and the observers all read the one :class:`Geometry` of a run (``RunSpec.geometry``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

BLOCK_CHAIN_DRAWS = 25_000  # aim for blocks of at least this many chain-draws (>= ~0.5 s of work)
BLOCK_BYTES = 256 * 2**20  # and at most this much trace per block
MIN_DRAWS_PER_SEGMENT = 100  # each block write costs ~3-4 ms per Zarr chunk: big ensembles get long segments
MIN_AUTO_DRAWS = 10  # draws="auto": the shortest segment (ESS estimates need a few draws per chain) ...
AUTO_CHECKS = 20  # ... and the longest are short enough for this many checks by max_draws


__all__ = ["Geometry", "default_chains_per_task", "default_draws_per_segment"]


@dataclass(frozen=True)
class Geometry:
    """``chains`` x ``draws`` in blocks of ``chains_per_task`` chains x ``draws_per_segment`` draws (the last
    chunk and segment may be shorter)."""

    chains: int
    draws: int
    chains_per_task: int
    draws_per_segment: int

    @property
    def num_chunks(self) -> int:
        return math.ceil(self.chains / self.chains_per_task)

    @property
    def num_segments(self) -> int:
        return math.ceil(self.draws / self.draws_per_segment)

    def chunk(self, index: int) -> range:
        """The global chain indices of chunk ``index``."""
        start = index * self.chains_per_task
        return range(start, min(start + self.chains_per_task, self.chains))

    def segment(self, index: int) -> range:
        """The draw indices (0-based, after warmup) of segment ``index``."""
        start = index * self.draws_per_segment
        return range(start, min(start + self.draws_per_segment, self.draws))

    def draws_in(self, segments: int) -> int:
        """Draws per chain in the first ``segments`` segments."""
        return min(segments * self.draws_per_segment, self.draws)


def default_chains_per_task(chains: int, gpu: bool = False, fits: int | None = None) -> int:
    """Chains per block from the ensemble size and, on CPUs, the cache (never from the worker count).

    On CPUs about 1/16 of the ensemble (16 to 1024 chains), so that several workers share the load,
    and no more than ``fits`` chains (:func:`dhmc.distributed.cache.chains_in_cache`: a block's arrays
    stay in a core's L2 cache; at least 16); on GPUs as many as fit comfortably (up to 2**16), since a
    GPU's throughput grows with the batch.
    """
    if gpu:
        return min(chains, 2**16)
    target = min(1024, max(16, chains // 16))
    if fits is not None:
        target = min(target, max(16, fits))
    return math.ceil(chains / math.ceil(chains / min(chains, target)))


def default_draws_per_segment(draws: int, chains_per_task: int, bytes_per_draw: int, chains: int | None = None,
                              target_ess: float | None = None) -> int:
    """Draws per block: enough work per task, a bounded trace, segments of equal length.

    With ``target_ess`` (``draws="auto"``, ``draws`` being ``max_draws``) segments are sized from the
    ensemble: ``4 target_ess / chains`` draws (at least :data:`MIN_AUTO_DRAWS`, at most
    ``max(100, max_draws / 20)``) would reach the target at an ESS of a quarter draw per chain and
    draw, so 1024 chains and ``target_ess=400`` check after 10 draws, not 100 (the run stops at a
    segment's end).
    """
    size = max(MIN_DRAWS_PER_SEGMENT, math.ceil(BLOCK_CHAIN_DRAWS / chains_per_task))
    if target_ess is not None:
        by_ensemble = math.ceil(4 * target_ess / (chains or chains_per_task))
        by_checks = max(MIN_DRAWS_PER_SEGMENT, math.ceil(draws / AUTO_CHECKS))
        size = min(size, max(MIN_AUTO_DRAWS, min(by_ensemble, by_checks)))
    size = min(size, max(1, BLOCK_BYTES // max(1, chains_per_task * bytes_per_draw)))
    size = min(draws, size)
    return math.ceil(draws / math.ceil(draws / size))

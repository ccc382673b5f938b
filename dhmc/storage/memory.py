"""The in-memory sink: a run's blocks copied into NumPy arrays in the driver (no store), and the check, before any
work, that a run's driver fits in the memory free.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from dhmc.geometry import Geometry
from dhmc.storage import schema
from dhmc.storage.sinks import starts_from

if TYPE_CHECKING:
    import xarray as xr

    from dhmc.types import BlockResult

__all__ = ["FIRST_SEGMENTS", "MemorySink", "check_fits"]


class MemorySink:
    """Blocks copied into NumPy arrays, which a DataTree wraps without copying.

    A fixed-draws run's arrays are made for all its draws up front. A ``draws="auto"`` run's (``grow``) hold
    :data:`FIRST_SEGMENTS` segment(s) and double when a block lands past them, up to ``geometry.draws``
    (``max_draws``): memory follows the draws taken, not the most that might be (a 501-D model at 1024 chains
    asked for 38 GiB for ``max_draws`` and stopped at 20 draws). The tree is built in a thread while the run goes
    on (its first build imports half of xarray's optional dependencies, ~0.5 s here), rebuilt at the end if the
    arrays grew, and gets its attributes at the end. Nothing is kept for a resume.
    """

    workers_write = False

    def __init__(self, layout: schema.Layout, geometry: Geometry, extra_groups: dict | None = None,
                 grow: bool = False):
        from concurrent.futures import ThreadPoolExecutor

        self.layout, self.geometry, self.extra = layout, geometry, extra_groups
        capacity = _first_capacity(geometry, grow)
        self.arrays = {group: {name: _filled(geometry.chains, capacity, s.dtype, s.shape) for name, s in specs.items()}
                       for group, specs in layout.groups().items()}
        self.warmup = {group: {name: _filled(geometry.chains, layout.warmup_draws, s.dtype, s.shape)
                             for name, s in specs.items()}
                       for group, specs in layout.warmup_groups().items()}
        self.capacity, self._stale = capacity, capacity < geometry.draws
        pool = ThreadPoolExecutor(1, thread_name_prefix="dhmc-assemble")
        self._tree = pool.submit(schema.to_datatree, layout, {**self.arrays, **self.warmup}, {}, extra_groups)
        pool.shutdown(wait=False)

    def destination(self, chunk: int, segment: int) -> None:
        return None

    def write(self, chunk: int, segment: int, result: BlockResult) -> None:
        c0, draws = self.geometry.chunk(chunk).start, self.geometry.segment(segment)
        d0 = draws.start
        if draws.stop > self.capacity:
            self._grow(max(draws.stop, min(2 * self.capacity, self.geometry.draws)))
        for group, values in self.arrays.items():
            for name, array in values.items():
                v = result.draws[group][name]
                array[c0:c0 + v.shape[0], d0:d0 + v.shape[1]] = v

    def write_warmup(self, chunk: int, first: int, draws: dict) -> None:
        c0 = self.geometry.chunk(chunk).start
        for name, v in draws.items():
            self.warmup["warmup_posterior"][name][c0:c0 + v.shape[0], first:first + v.shape[1]] = v

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass

    def head(self, chunk: int, segment: int, chains: int) -> dict:
        c0, draws = self.geometry.chunk(chunk).start, self.geometry.segment(segment)
        return {name: a[c0:c0 + chains, draws.start:draws.stop].copy() for name, a in self.arrays["posterior"].items()}

    def saved_warmup(self, dtype) -> None:
        return None

    def save_warmup(self, positions: np.ndarray, params: dict, history: list[dict]) -> None:
        pass  # nothing to resume in memory

    def starts(self, positions: np.ndarray) -> dict[int, tuple[int, np.ndarray]]:
        return starts_from(self.geometry, positions)

    def checked_waves(self) -> int:
        return 0

    def checked(self, waves: int) -> None:
        pass

    def set_attrs(self, attrs: dict) -> None:
        pass  # given to the tree at the end

    def release(self) -> None:
        pass

    def resize(self, geometry: Geometry, attrs: dict) -> None:
        """Keep the first ``geometry.draws`` draws (copied, so that the arrays for ``max_draws`` are freed)."""
        self.geometry = geometry
        self.arrays = {g: {k: a[:, :geometry.draws].copy() for k, a in v.items()} for g, v in self.arrays.items()}
        self.capacity, self._stale = geometry.draws, False
        self._reassemble()

    def _grow(self, capacity: int) -> None:
        """Hold ``capacity`` draws per chain: new arrays (filled as unwritten), the draws so far copied in."""
        try:
            grown = {g: {k: _filled(self.geometry.chains, capacity, a.dtype, a.shape[2:]) for k, a in v.items()}
                     for g, v in self.arrays.items()}
        except MemoryError:
            raise MemoryError(f"the run's draws no longer fit in memory ({_gib(self, capacity)} for {capacity} draws "
                              "a chain): give store= (a Zarr path), and they stream to disk") from None
        for g, v in grown.items():
            for k, a in v.items():
                a[:, :self.capacity] = self.arrays[g][k]
        self.arrays, self.capacity, self._stale = grown, capacity, True

    def trim_warmup(self, iterations: int) -> None:
        self.layout = replace(self.layout, warmup_draws=iterations)
        self.warmup = {g: {k: a[:, :iterations].copy() for k, a in v.items()} for g, v in self.warmup.items()}
        self._reassemble()

    def _reassemble(self) -> None:
        """Replace the thread's tree (built on the arrays before a trim) by one on the current arrays."""
        self._tree.result()
        self._tree = Future()
        self._tree.set_result(schema.to_datatree(self.layout, {**self.arrays, **self.warmup}, {}, self.extra))

    def finish(self, attrs: dict) -> xr.DataTree:
        if self._stale:  # grown: the thread's tree wraps the first arrays
            self.arrays = {g: {k: a[:, :self.geometry.draws] for k, a in v.items()} for g, v in self.arrays.items()}
            self._stale = False
            self._reassemble()
        tree = self._tree.result()
        for node in tree.subtree:
            node.attrs.update(attrs)
        return tree


FIRST_SEGMENTS = 1  # a draws="auto" run's arrays in memory at first, in segments (most runs stop at 1-2 segments)
POSITION_COPIES = 4  # the driver holds a few copies of the ensemble's positions (a round's start and end, ...)


def check_fits(layout: schema.Layout, geometry: Geometry, position_bytes: int, in_memory: bool,
               grow: bool = False) -> None:
    """Refuse, before any work, a run whose driver would not fit in the memory free now: the ensemble's positions
    (:data:`POSITION_COPIES` copies of ``position_bytes`` a chain, whatever the sink) and, ``in_memory`` (no
    store), a :class:`MemorySink`'s first arrays. One-line ``ValueError`` with the size and the fix."""
    import psutil

    free = psutil.virtual_memory().available
    positions = POSITION_COPIES * geometry.chains * position_bytes
    if positions > free:
        raise ValueError(f"{geometry.chains} chains' positions would take {positions / 2**30:.1f} GiB in the driver, "
                         f"more than the {free / 2**30:.1f} GiB free: take fewer chains")
    if not in_memory:
        return
    capacity = _first_capacity(geometry, grow)
    need = geometry.chains * (capacity * _draw_bytes(layout.groups())
                              + layout.warmup_draws * _draw_bytes(layout.warmup_groups())) + positions
    if need > free:
        raise ValueError(f"the draws would take {need / 2**30:.1f} GiB in memory ({geometry.chains} chains x "
                         f"{capacity} draws), more than the {free / 2**30:.1f} GiB free: give store= (a Zarr path) "
                         "and they stream to disk, or take fewer chains or draws")


def _first_capacity(geometry: Geometry, grow: bool) -> int:
    return min(geometry.draws, FIRST_SEGMENTS * geometry.draws_per_segment) if grow else geometry.draws


def _filled(chains: int, draws: int, dtype, shape: tuple) -> np.ndarray:
    """``(chains, draws, *shape)`` of the dtype's fill value (what an unwritten draw reads as)."""
    return np.full((chains, draws, *shape), schema.fill_value(dtype), dtype)


def _draw_bytes(groups: dict) -> int:
    """Bytes of one chain's draw of ``groups`` (``{group: {name: VariableSpec}}``)."""
    return sum(np.dtype(s.dtype).itemsize * int(np.prod(s.shape)) for specs in groups.values() for s in specs.values())


def _gib(sink: MemorySink, draws: int) -> str:
    return f"{sink.geometry.chains * draws * _draw_bytes(sink.layout.groups()) / 2**30:.1f} GiB"

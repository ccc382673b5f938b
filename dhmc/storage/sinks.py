"""Where a run's blocks go: NumPy arrays in the driver, or a Zarr store the workers write into.

Both sinks follow :class:`Sink`, the one interface the driver, the runner and the stopping rule use.
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

import numpy as np

from dhmc.geometry import Geometry
from dhmc.storage import schema

if TYPE_CHECKING:
    import xarray as xr
    import zarr

    from dhmc.types import BlockResult

__all__ = ["Sink", "MemorySink", "StoreSink", "check_fits"]


class Sink(Protocol):
    """Where a run's finished blocks go (cut as the run's :class:`~dhmc.geometry.Geometry`), and everything else
    the driver keeps of a run: its warmup, its attributes, where each chunk continues, the finished result."""

    workers_write: bool  # the workers write their blocks' draws themselves (and send back only the head chains)

    def destination(self, chunk: int, segment: int):
        """What the worker is told to do with the block's draws (None: send them back)."""

    def write(self, chunk: int, segment: int, result: BlockResult) -> None:
        """Take a finished sampling block: its draws, or the shapes the worker wrote."""

    def write_warmup(self, chunk: int, first: int, draws: dict) -> None:
        """``save_warmup``: a warmup block's draws, iterations ``first ..``."""

    def head(self, chunk: int, segment: int, chains: int) -> dict:
        """``{name: draws}`` of a finished block's first ``chains`` chains."""

    def saved_warmup(self, dtype) -> tuple[np.ndarray, dict, list[dict]] | None:
        """A finished warmup's end positions, parameters and history (a resume); None: warm up."""

    def save_warmup(self, positions: np.ndarray, params: dict, history: list[dict]) -> None:
        """Keep the finished warmup, so that a resume skips it."""

    def starts(self, positions: np.ndarray) -> dict[int, tuple[int, np.ndarray]]:
        """``{chunk: (segment, positions)}``: where each chunk's sampling continues (``positions``: warmup's end)."""

    def checked_waves(self) -> int:
        """``draws="auto"``: the waves an earlier run measured without meeting the rule."""

    def checked(self, waves: int) -> None:
        """``draws="auto"``: the first ``waves`` waves were measured and did not meet the rule (for a resume)."""

    def set_attrs(self, attrs: dict) -> None:
        """The run's attributes changed (warmup chose the metric or the iterations): keep them for a resume."""

    def resize(self, geometry: Geometry, attrs: dict) -> None:
        """Hold ``geometry.draws`` draws per chain from now on (``draws="auto"`` stopped); ``attrs``: the new spec."""

    def trim_warmup(self, iterations: int) -> None:
        """``save_warmup`` with ``warmup="auto"``: keep the ``iterations`` warmup ran."""

    def flush(self) -> None:
        """Make the blocks taken so far durable (a batch of results arrived; the runner calls it after each)."""

    def close(self) -> None:
        """Sampling ended or was interrupted (called once): flushed."""

    def finish(self, attrs: dict) -> xr.DataTree:
        """The finished run, with ``attrs`` on every group."""

    def release(self) -> None:
        """The run ended, finished or not: let others have its store."""


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
        return _from_the_start(self.geometry, positions)

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


def _from_the_start(geometry: Geometry, positions: np.ndarray) -> dict[int, tuple[int, np.ndarray]]:
    return {c: (0, positions[geometry.chunk(c).start:geometry.chunk(c).stop]) for c in range(geometry.num_chunks)}


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


class StoreSink:
    """Blocks written by the workers that ran them; the driver checks each one and marks it done.

    Each chunk's segments are marked in order, so the store always holds a done prefix of every
    chunk: what a resume continues from. The driver never holds a block's draws. The store's lock
    (for a local path) is held from before the store is created or reopened until :meth:`release`.
    """

    workers_write = True

    def __init__(self, root: zarr.Group, path: str, layout: schema.Layout, geometry: Geometry, run_id: str,
                 lock=None):
        from dhmc.storage.blocks import DoneFlags

        self.root, self.path, self.layout, self.geometry, self.run_id = root, path, layout, geometry, run_id
        self.lock, self.flags = lock, DoneFlags(root)

    @classmethod
    def create(cls, store, layout: schema.Layout, geometry: Geometry, run_id: str, *, dim: int, dtype, attrs: dict,
               extra_groups: dict, overwrite: bool, inputs: dict | None = None,
               params: dict | None = None) -> StoreSink:
        """A new store at ``store`` for this run (``overwrite``: replacing a finished one), locked."""
        from dhmc.storage import zarr_

        def make():
            root = zarr_.create_store(store, layout, geometry, dim, dtype, {**attrs, zarr_.OWNER: run_id},
                                      extra_groups, overwrite)
            if inputs:
                zarr_.save_inputs(root, inputs)
            if params is not None:
                zarr_.save_initial_params(root, params)
            return root

        return cls._locked(store, layout, geometry, run_id, make)

    @classmethod
    def reopen(cls, store, layout: schema.Layout, geometry: Geometry, run_id: str) -> StoreSink:
        """The store of a stopped run, to resume or extend, locked and owned by this run from now on."""
        from dhmc.storage import zarr_

        def reopen():
            root, _ = zarr_.open_store(store)
            root.attrs[zarr_.OWNER] = run_id  # a stopped run's blocks still out there no longer write here
            return root

        return cls._locked(store, layout, geometry, run_id, reopen)

    @classmethod
    def _locked(cls, store, layout, geometry, run_id, open_root) -> StoreSink:
        lock = None
        if "://" not in str(store):  # a local path (URLs have no lock)
            from dhmc.storage.lock import StoreLock

            lock = StoreLock(store, run_id).acquire()
        try:
            root = open_root()
        except BaseException:
            if lock is not None:
                lock.release()
            raise
        path = str(store) if "://" in str(store) else os.path.abspath(store)  # as workers will see it
        return cls(root, path, layout, geometry, run_id, lock)

    def destination(self, chunk: int, segment: int):
        from dhmc.storage.blocks import BlockDestination

        return BlockDestination(self.path, self.layout, self.geometry, chunk, segment, self.run_id)

    def write(self, chunk: int, segment: int, result: BlockResult) -> None:
        """Check the shapes the worker wrote; mark the block done (on disk at the next :meth:`flush`)."""
        from dhmc.storage.blocks import check_block

        check_block(self.layout, self.geometry, chunk, segment, result.written, self.path)
        self.flags.mark(chunk, segment, result.where)

    def write_warmup(self, chunk: int, first: int, draws: dict) -> None:
        """The driver writes a warmup block's draws (warmup blocks report to it anyway)."""
        c0 = self.geometry.chunk(chunk).start
        for name, v in draws.items():
            self.root[f"warmup_posterior/{name}"][c0:c0 + v.shape[0], first:first + v.shape[1]] = v

    def flush(self) -> None:
        self.flags.flush()

    def close(self) -> None:
        self.flags.flush()

    def head(self, chunk: int, segment: int, chains: int) -> dict:
        from dhmc.storage.blocks import read_head

        return read_head(self.root, self.layout, self.geometry, chunk, segment, chains)

    def saved_warmup(self, dtype) -> tuple[np.ndarray, dict, list[dict]] | None:
        from dhmc.storage import zarr_

        return zarr_.load_warmup(self.root, dtype)

    def save_warmup(self, positions: np.ndarray, params: dict, history: list[dict]) -> None:
        from dhmc.storage import zarr_

        zarr_.save_warmup(self.root, positions, params, history)

    def starts(self, positions: np.ndarray) -> dict[int, tuple[int, np.ndarray]]:
        """After the done prefix of each chunk: from the end positions of its last done segment."""
        from dhmc.storage import zarr_

        done, geometry, starts = zarr_.blocks_done(self.root), self.geometry, {}
        for c, (_, mine) in _from_the_start(geometry, positions).items():
            segment = geometry.num_segments if done[c].all() else int(np.argmin(done[c]))
            chains = slice(geometry.chunk(c).start, geometry.chunk(c).stop)
            starts[c] = (segment, mine if segment == 0 else zarr_.segment_start_positions(self.root, segment, chains))
        return starts

    def checked_waves(self) -> int:
        return int(self.root.attrs.get("dhmc_auto_checked", 0))

    def checked(self, waves: int) -> None:
        self.root.attrs.update({"dhmc_auto_checked": int(waves)})

    def set_attrs(self, attrs: dict) -> None:
        self.root.attrs.update(attrs)

    def resize(self, geometry: Geometry, attrs: dict) -> None:
        from dhmc.storage.blocks import DoneFlags
        from dhmc.storage.rewrite import resize

        self.flags.flush()
        resize(self.root, self.layout, self.geometry, geometry, attrs)
        self.geometry, self.flags = geometry, DoneFlags(self.root)  # the arrays' new shapes

    def trim_warmup(self, iterations: int) -> None:
        from dhmc.storage.rewrite import trim_warmup

        self.layout = trim_warmup(self.root, self.layout, self.geometry.chains, iterations)

    def finish(self, attrs: dict) -> xr.DataTree:
        """``attrs`` on every group, the metadata consolidated; the store opened lazily as a tree."""
        from dhmc.storage import rewrite, zarr_

        rewrite.finish(self.root, attrs)
        return zarr_.open_trace(self.path)

    def release(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

"""Where a run's blocks go (:class:`Sink`, the one interface the driver, the runner and the stopping rule use), and
the sink of a Zarr store the workers write into (:class:`StoreSink`); the in-memory one is
:class:`dhmc.storage.memory.MemorySink`.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Protocol

import numpy as np

from dhmc.geometry import Geometry
from dhmc.storage import schema

if TYPE_CHECKING:
    import xarray as xr
    import zarr

    from dhmc.types import BlockResult

__all__ = ["Sink", "StoreSink", "starts_from"]


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


def starts_from(geometry: Geometry, positions: np.ndarray) -> dict[int, tuple[int, np.ndarray]]:
    """Every chunk starting at its first draw from its chains' ``positions`` (a run that resumes nothing)."""
    return {c: (0, positions[geometry.chunk(c).start:geometry.chunk(c).stop]) for c in range(geometry.num_chunks)}


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
        for c, (_, mine) in starts_from(geometry, positions).items():
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

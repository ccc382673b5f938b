"""One sampling block's place in a store: the worker's write, the checks of its shapes, its done flag.

A block is one chunk of chains by one segment of draws (:class:`~dhmc.geometry.Geometry`): one Zarr
chunk of every array, so each block is written by one writer, exactly once, into chunks nobody else
touches. The driver
marks it done (:class:`DoneFlags`) only after the worker reported its write.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import zarr

from dhmc.geometry import Geometry
from dhmc.storage.schema import Layout
from dhmc.storage.zarr_ import INTERNAL, OWNER, WHERE, StoreError

__all__ = ["BlockDestination", "DoneFlags", "block_shapes", "check_block", "check_owner", "read_head"]


@dataclass(frozen=True)
class BlockDestination:
    """Where one block goes in a store; the worker that ran the block writes it (see :meth:`write`).

    ``path`` must be reachable from the worker: a local path for the embedded cluster, the shared
    filesystem under Slurm. The driver marks the block done only after the worker
    reported its write (:class:`DoneFlags`), so a block interrupted mid-write is written again on resume.
    """

    path: str
    layout: Layout
    geometry: Geometry
    chunk: int
    segment: int
    run_id: str

    def write(self, block: dict) -> dict:
        """Write ``posterior``/``sample_stats`` draws and end ``position``; return the shapes written.

        Only while the store is still this run's (:func:`check_owner`): a block of a run that was stopped and whose
        store another run has since overwritten or resumed is refused, not written into the other run's draws.
        """
        shapes = block_shapes(block)
        check_block(self.layout, self.geometry, self.chunk, self.segment, shapes, self.path)
        check_owner(self.path, self.run_id)
        arrays = _arrays(self.path, self.layout, self.run_id)
        c0, d0 = self.geometry.chunk(self.chunk).start, self.geometry.segment(self.segment).start
        for group in self.layout.groups():
            for name, values in block[group].items():
                arrays[f"{group}/{name}"][c0:c0 + values.shape[0], d0:d0 + values.shape[1]] = values
        position = block["position"]
        arrays[f"{INTERNAL}/position"][c0:c0 + position.shape[0], self.segment] = position
        return shapes


def check_owner(path: str, run_id: str) -> None:
    """Raise :class:`StoreError` unless the store at ``path`` belongs to run ``run_id`` (its ``dhmc_run_id``, which
    every run that creates or resumes a store sets; a store without one, of an older dhmc, belongs to anyone)."""
    owner = zarr.open_group(path, mode="r", use_consolidated=False, zarr_format=3).attrs.get(OWNER)
    if owner is not None and owner != run_id:
        raise StoreError(f"{path} now belongs to run {owner}: this block of run {run_id} (stopped, its store "
                         "overwritten or resumed since) was not written")


_OPEN: dict[tuple[str, str], dict] = {}


def _arrays(path: str, layout: Layout, run_id: str) -> dict:
    """The store's block arrays, opened once per process and run (opening reads metadata from disk).

    Never through consolidated metadata: a resumed store's may predate an extend.
    """
    key = (path, run_id)
    if key not in _OPEN:
        root = zarr.open_group(path, mode="r+", use_consolidated=False)
        names = [f"{g}/{n}" for g, specs in layout.groups().items() for n in specs]
        _OPEN.clear()  # one run at a time per worker process keeps no stale handles
        _OPEN[key] = {name: root[name] for name in [*names, f"{INTERNAL}/position"]}
    return _OPEN[key]


def block_shapes(block: dict) -> dict:
    """``{"posterior/x": (chains, draws, ...), ..., "position": (chains, dim)}`` of a block."""
    shapes = {f"{g}/{k}": tuple(np.shape(v)) for g, values in block.items() if g != "position"
              for k, v in values.items()}
    return {**shapes, "position": tuple(np.shape(block["position"]))}


def check_block(layout: Layout, geometry: Geometry, chunk: int, segment: int, shapes: dict, where) -> None:
    """Raise :class:`StoreError` unless a block's arrays have exactly the shapes its place in ``geometry`` needs."""
    chains, draws = len(geometry.chunk(chunk)), len(geometry.segment(segment))
    expected = {f"{g}/{k}": (chains, draws, *s.shape) for g, specs in layout.groups().items() for k, s in specs.items()}
    got = {k: v for k, v in shapes.items() if k != "position"}
    if got != expected or len(shapes.get("position", ())) != 2 or shapes["position"][0] != chains:
        wrong = sorted(k for k in expected.keys() | got.keys() if expected.get(k) != got.get(k)) or ["position"]
        raise StoreError(f"block (chunk {chunk}, segment {segment}) for {where} has the wrong shape for "
                         f"{wrong[0]}: got {got.get(wrong[0], shapes.get('position'))}, expected "
                         f"{expected.get(wrong[0], (chains, '...'))}; nothing of it was marked done")


class DoneFlags:
    """A store's done flags, and the host and worker that ran each block: marked here, written in batches.

    The driver marks each block as its result arrives and writes every mark since the last :meth:`flush` at
    once, one write per array (the flags are chunked by segment: one file per array holds a segment's flags for
    every chunk), so the store's small-file writes per block fall from three to a few per batch. The host and
    worker go first and the flags last: a flag on disk means its block is whole. A mark not yet flushed when the
    driver dies only makes a resume run its block again, bitwise as it was.
    """

    def __init__(self, root: zarr.Group):
        internal = root[INTERNAL]
        names = [n for n in WHERE if n in internal]  # a store of an older dhmc has no such record
        self.where = {n: internal[n] for n in names}
        self.done = internal["done"]
        self.pending: dict[tuple[int, int], dict] = {}

    def mark(self, chunk: int, segment: int, where: dict | None = None) -> None:
        """Block ``(chunk, segment)`` is whole on disk (``where``: its host and worker)."""
        self.pending[chunk, segment] = where or {}

    def flush(self) -> int:
        """Write the marks made since the last flush; return how many."""
        if not self.pending:
            return 0
        blocks, pending = list(self.pending), self.pending
        self.pending = {}
        rows, columns = (np.array(axis) for axis in zip(*blocks, strict=True))
        for name, array in self.where.items():
            values = np.array([str(pending[b].get(name, "")) for b in blocks], dtype=object)
            array.set_coordinate_selection((rows, columns), values)
        self.done.set_coordinate_selection((rows, columns), np.ones(len(blocks), np.uint8))
        return len(blocks)


def read_head(root: zarr.Group, layout: Layout, geometry: Geometry, chunk: int, segment: int, chains: int) -> dict:
    """``{name: draws}`` of a done block's first ``chains`` chains (for the convergence checks)."""
    c0, draws = geometry.chunk(chunk).start, geometry.segment(segment)
    return {name: root[f"posterior/{name}"][c0:c0 + chains, draws.start:draws.stop] for name in layout.posterior}

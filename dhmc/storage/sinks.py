"""Where a run's blocks go: NumPy arrays in the driver, or a Zarr store the workers write into.

Both sinks follow :class:`Sink`, the one interface the driver, the runner and the stopping rule use.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING, Protocol

import numpy as np

from dhmc.geometry import Geometry
from dhmc.storage import schema

if TYPE_CHECKING:
    import xarray as xr
    import zarr

__all__ = ["Sink", "MemorySink", "StoreSink"]


class Sink(Protocol):
    """Where a run's finished blocks go (cut as the run's :class:`~dhmc.geometry.Geometry`)."""

    def destination(self, chunk: int, segment: int):
        """What the worker is told to do with the block's draws (None: send them back)."""

    def write(self, chunk: int, segment: int, result: dict) -> None:
        """Take a finished sampling block: its draws, or the shapes the worker wrote."""

    def write_warmup(self, chunk: int, first: int, draws: dict) -> None:
        """``save_warmup``: a warmup block's draws, iterations ``first ..``."""

    def head(self, chunk: int, segment: int, chains: int) -> dict:
        """``{name: draws}`` of a finished block's first ``chains`` chains."""

    def checked(self, waves: int) -> None:
        """``draws="auto"``: the first ``waves`` waves were measured and did not meet the rule (for a resume)."""

    def resize(self, geometry: Geometry, attrs: dict) -> None:
        """Hold ``geometry.draws`` draws per chain from now on (``draws="auto"`` stopped); ``attrs``: the new spec."""

    def trim_warmup(self, iterations: int) -> None:
        """``save_warmup`` with ``warmup="auto"``: keep the ``iterations`` warmup ran."""

    def close(self) -> None:
        """Sampling ended or was interrupted (called once)."""


class MemorySink:
    """Blocks copied into NumPy arrays, which a DataTree wraps without copying.

    The tree is built in a thread while the run goes on (its first build imports half of xarray's
    optional dependencies, ~0.5 s here), and gets its attributes at the end.
    """

    def __init__(self, layout: schema.Layout, geometry: Geometry, extra_groups: dict | None = None):
        from concurrent.futures import ThreadPoolExecutor

        self.layout, self.geometry, self.extra = layout, geometry, extra_groups
        full = lambda draws, s: np.full((geometry.chains, draws, *s.shape), schema.fill_value(s.dtype), s.dtype)
        self.arrays = {group: {name: full(geometry.draws, s) for name, s in specs.items()}
                       for group, specs in layout.groups().items()}
        self.warmup = {group: {name: full(layout.warmup_draws, s) for name, s in specs.items()}
                       for group, specs in layout.warmup_groups().items()}
        pool = ThreadPoolExecutor(1, thread_name_prefix="dhmc-assemble")
        self._tree = pool.submit(schema.to_datatree, layout, {**self.arrays, **self.warmup}, {}, extra_groups)
        pool.shutdown(wait=False)

    def destination(self, chunk: int, segment: int) -> None:
        return None

    def write(self, chunk: int, segment: int, result: dict) -> None:
        c0, d0 = self.geometry.chunk(chunk).start, self.geometry.segment(segment).start
        for group, values in self.arrays.items():
            for name, array in values.items():
                v = result[group][name]
                array[c0:c0 + v.shape[0], d0:d0 + v.shape[1]] = v

    def write_warmup(self, chunk: int, first: int, draws: dict) -> None:
        c0 = self.geometry.chunk(chunk).start
        for name, v in draws.items():
            self.warmup["warmup_posterior"][name][c0:c0 + v.shape[0], first:first + v.shape[1]] = v

    def close(self) -> None:
        pass

    def head(self, chunk: int, segment: int, chains: int) -> dict:
        c0, draws = self.geometry.chunk(chunk).start, self.geometry.segment(segment)
        return {name: a[c0:c0 + chains, draws.start:draws.stop].copy() for name, a in self.arrays["posterior"].items()}

    def checked(self, waves: int) -> None:
        pass  # nothing to resume in memory

    def resize(self, geometry: Geometry, attrs: dict) -> None:
        """Keep the first ``geometry.draws`` draws (copied, so that the arrays for ``max_draws`` are freed)."""
        self.geometry = geometry
        self.arrays = {g: {k: a[:, :geometry.draws].copy() for k, a in v.items()} for g, v in self.arrays.items()}
        self._reassemble()

    def trim_warmup(self, iterations: int) -> None:
        self.layout = replace(self.layout, warmup_draws=iterations)
        self.warmup = {g: {k: a[:, :iterations].copy() for k, a in v.items()} for g, v in self.warmup.items()}
        self._reassemble()

    def _reassemble(self) -> None:
        """Replace the thread's tree (built on the arrays before a trim) by one on the current arrays."""
        self._tree.result()
        self._tree = Future()
        self._tree.set_result(schema.to_datatree(self.layout, {**self.arrays, **self.warmup}, {}, self.extra))

    def tree(self, attrs: dict) -> xr.DataTree:
        tree = self._tree.result()
        for node in tree.subtree:
            node.attrs.update(attrs)
        return tree


class StoreSink:
    """Blocks written by the workers that ran them; the driver checks each one and marks it done.

    Each chunk's segments are marked in order, so the store always holds a done prefix of every
    chunk: what a resume continues from. The driver never holds a block's draws.
    """

    def __init__(self, root: zarr.Group, path: str, layout: schema.Layout, geometry: Geometry, run_id: str):
        self.root, self.path, self.layout, self.geometry, self.run_id = root, path, layout, geometry, run_id

    def destination(self, chunk: int, segment: int):
        from dhmc.storage.blocks import BlockDestination

        return BlockDestination(self.path, self.layout, self.geometry, chunk, segment, self.run_id)

    def write(self, chunk: int, segment: int, result: dict) -> None:
        from dhmc.storage.blocks import check_block, mark_done

        check_block(self.layout, self.geometry, chunk, segment, result["written"], self.path)
        mark_done(self.root, chunk, segment, result.get("where"))

    def write_warmup(self, chunk: int, first: int, draws: dict) -> None:
        """The driver writes a warmup block's draws (warmup blocks report to it anyway)."""
        c0 = self.geometry.chunk(chunk).start
        for name, v in draws.items():
            self.root[f"warmup_posterior/{name}"][c0:c0 + v.shape[0], first:first + v.shape[1]] = v

    def close(self) -> None:
        pass

    def head(self, chunk: int, segment: int, chains: int) -> dict:
        from dhmc.storage.blocks import read_head

        return read_head(self.root, self.layout, self.geometry, chunk, segment, chains)

    def checked(self, waves: int) -> None:
        self.root.attrs.update({"dhmc_auto_checked": int(waves)})

    def resize(self, geometry: Geometry, attrs: dict) -> None:
        from dhmc.storage.rewrite import resize

        resize(self.root, self.layout, self.geometry, geometry, attrs)
        self.geometry = geometry

    def trim_warmup(self, iterations: int) -> None:
        from dhmc.storage.rewrite import trim_warmup

        self.layout = trim_warmup(self.root, self.layout, self.geometry.chains, iterations)

"""Where a run's blocks go: NumPy arrays in the driver, or a Zarr store the workers write into.

Both sinks have one small interface, used by the driver for every finished sampling block:

* ``destination(chunk, segment)``: what the worker is told to do with its draws (None: send them back);
* ``write(chunk, segment, result)``: take a finished block's result (draws, or the shapes the worker wrote);
* ``close()``: called once, when sampling ends or is interrupted;

and, for ``draws="auto"``, ``head(chunk, segment, chains)`` (a finished block's first chains' draws),
``checked(waves)`` (waves the stopping rule rejected, for a resume) and ``trim(segments)`` (keep
only the first segments); for ``save_warmup``, ``write_warmup(chunk, first, draws)`` and, after
``warmup="auto"``, ``trim_warmup(iterations)``.
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from dhmc.storage import schema

if TYPE_CHECKING:
    import xarray as xr
    import zarr


class MemorySink:
    """Blocks copied into NumPy arrays, which a DataTree wraps without copying.

    The tree is built in a thread while the run goes on (its first build imports half of xarray's
    optional dependencies, ~0.5 s here), and gets its attributes at the end.
    """

    def __init__(self, layout: schema.Layout, extra_groups: dict | None = None):
        from concurrent.futures import ThreadPoolExecutor

        self.layout, self.extra = layout, extra_groups
        full = lambda draws, s: np.full((layout.chains, draws, *s.shape), schema.fill_value(s.dtype), s.dtype)
        self.arrays = {group: {name: full(layout.draws, s) for name, s in specs.items()}
                       for group, specs in layout.groups().items()}
        self.warmup = {group: {name: full(layout.warmup_draws, s) for name, s in specs.items()}
                       for group, specs in layout.warmup_groups().items()}
        pool = ThreadPoolExecutor(1, thread_name_prefix="dhmc-assemble")
        self._tree = pool.submit(schema.to_datatree, layout, {**self.arrays, **self.warmup}, {}, extra_groups)
        pool.shutdown(wait=False)

    def destination(self, chunk: int, segment: int) -> None:
        return None

    def write(self, chunk: int, segment: int, result: dict) -> None:
        c0 = chunk * self.layout.chains_per_task
        d0 = segment * self.layout.draws_per_segment
        for group, values in self.arrays.items():
            for name, array in values.items():
                v = result[group][name]
                array[c0:c0 + v.shape[0], d0:d0 + v.shape[1]] = v

    def write_warmup(self, chunk: int, first: int, draws: dict) -> None:
        """``save_warmup``: a warmup block's draws, iterations ``first ..``."""
        c0 = chunk * self.layout.chains_per_task
        for name, v in draws.items():
            self.warmup["warmup_posterior"][name][c0:c0 + v.shape[0], first:first + v.shape[1]] = v

    def close(self) -> None:
        pass

    def head(self, chunk: int, segment: int, chains: int) -> dict:
        c0, d0 = chunk * self.layout.chains_per_task, segment * self.layout.draws_per_segment
        return {name: a[c0:c0 + chains, d0:d0 + self.layout.draws_per_segment].copy()
                for name, a in self.arrays["posterior"].items()}

    def trim(self, segments: int) -> None:
        """Keep the first ``segments`` segments (copied, so that the arrays for ``max_draws`` are freed)."""
        draws = min(segments * self.layout.draws_per_segment, self.layout.draws)
        self.layout = replace(self.layout, draws=draws)
        self.arrays = {g: {k: a[:, :draws].copy() for k, a in v.items()} for g, v in self.arrays.items()}
        self._reassemble()

    def trim_warmup(self, iterations: int) -> None:
        """``save_warmup`` with ``warmup="auto"``: keep the iterations warmup ran (room was made for ``max_warmup``)."""
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

    def __init__(self, root: zarr.Group, path: str, layout: schema.Layout, run_id: str):
        self.root, self.path, self.layout, self.run_id = root, path, layout, run_id

    def destination(self, chunk: int, segment: int):
        from dhmc.storage.zarr_ import BlockDestination

        return BlockDestination(self.path, self.layout, chunk, segment, self.run_id)

    def write(self, chunk: int, segment: int, result: dict) -> None:
        from dhmc.storage.zarr_ import check_block, mark_done

        check_block(self.layout, chunk, segment, result["written"], self.path)
        mark_done(self.root, chunk, segment, result.get("where"))

    def write_warmup(self, chunk: int, first: int, draws: dict) -> None:
        """``save_warmup``: the driver writes a warmup block's draws (warmup blocks report to it anyway)."""
        c0 = chunk * self.layout.chains_per_task
        for name, v in draws.items():
            self.root[f"warmup_posterior/{name}"][c0:c0 + v.shape[0], first:first + v.shape[1]] = v

    def close(self) -> None:
        pass

    def head(self, chunk: int, segment: int, chains: int) -> dict:
        from dhmc.storage.zarr_ import read_head

        return read_head(self.root, self.layout, chunk, segment, chains)

    def checked(self, waves: int) -> None:
        self.root.attrs.update({"dhmc_auto_checked": int(waves)})

    def trim(self, segments: int) -> None:
        from dhmc.storage.zarr_ import trim

        self.layout = trim(self.root, self.layout, segments)

    def trim_warmup(self, iterations: int) -> None:
        from dhmc.storage.zarr_ import trim_warmup

        self.layout = trim_warmup(self.root, self.layout, iterations)

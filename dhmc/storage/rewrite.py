"""A store rewritten as a whole while no worker writes it: trimmed, extended, finished (consolidated).

Workers only write chunks, which leave the metadata alone; these functions change shapes and
attributes, so the driver calls them between waves of blocks or at the end of a run. A finished
store's metadata is consolidated (:func:`finish`); a change of shapes first drops that, so no
consolidated metadata ever describes a store that has grown or shrunk since.
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, replace

import numpy as np
import zarr
from zarr.errors import ZarrUserWarning

from dhmc.geometry import Geometry
from dhmc.storage.schema import Layout, VariableSpec
from dhmc.storage.zarr_ import INTERNAL, WHERE, layout_to_json

__all__ = ["finish", "resize", "finish_resize", "trim_warmup"]

RESIZING = "dhmc_resizing"  # a resize under way: its geometries and attrs, so that an interrupted one is completed


def resize(root: zarr.Group, layout: Layout, old: Geometry, new: Geometry, attrs: dict) -> None:
    """Give a store ``new.draws`` draws per chain (from ``old``'s): fewer, when ``draws="auto"`` stopped early,
    or more, for ``extend`` (a resume then samples them); ``attrs`` (the new run spec) are written last.

    Segments keep their length. Zarr deletes the chunks beyond smaller shapes, so a trimmed store is
    a complete one of fewer draws. A last segment shorter than the others, when the store grows, is
    marked to be sampled again in full (its end position is that of a full segment): its draws come
    out the same, bitwise. The resize is recorded first and cleared last: a store opened after one was
    interrupted completes it (:func:`finish_resize`).
    """
    _drop_consolidated(root)
    root.attrs.update({RESIZING: {"from": asdict(old), "to": asdict(new), "attrs": attrs}})
    for group, specs in layout.groups().items():
        _resize_draws(root, group, specs, new.chains, new.draws)
        if new.draws > old.draws:
            root[f"{group}/draw"][old.draws:] = np.arange(old.draws, new.draws)
    for name in ("done", *WHERE):
        if name in root[INTERNAL]:  # a store of an older dhmc has no hosts and workers
            root[f"{INTERNAL}/{name}"].resize((new.num_chunks, new.num_segments))
    position = root[f"{INTERNAL}/position"]
    position.resize((new.chains, new.num_segments, position.shape[2]))
    if new.draws > old.draws and old.draws % old.draws_per_segment:
        root[f"{INTERNAL}/done"][:, old.num_segments - 1] = 0
    root.attrs.update({**attrs, "dhmc_layout": layout_to_json(layout)})
    del root.attrs[RESIZING]


def finish_resize(root: zarr.Group, layout: Layout) -> bool:
    """Complete a resize that was interrupted (every step of one can be done again); True if there was one."""
    pending = root.attrs.get(RESIZING)
    if pending:
        resize(root, layout, Geometry(**pending["from"]), Geometry(**pending["to"]), pending["attrs"])
    return bool(pending)


def trim_warmup(root: zarr.Group, layout: Layout, chains: int, iterations: int) -> Layout:
    """Cut the ``warmup_posterior`` group to the ``iterations`` an automatic warmup ran; return the new layout."""
    _drop_consolidated(root)
    new = replace(layout, warmup_draws=iterations)
    _resize_draws(root, "warmup_posterior", layout.posterior, chains, iterations)
    root.attrs.update({"dhmc_layout": layout_to_json(new)})
    return new


def finish(root: zarr.Group, attrs: dict) -> None:
    """End a run in its store: ``attrs`` on the root and every ArviZ group, then the metadata consolidated.

    Called once no worker writes any more. ``xarray.open_datatree(path, engine="zarr")`` then reads
    the whole hierarchy from the root's metadata, without a warning.
    """
    root.attrs.update(attrs)
    for name, group in root.groups():
        if name != INTERNAL:
            group.attrs.update(attrs)
    if root.store.supports_consolidated_metadata:
        with warnings.catch_warnings():  # zarr's remark that Zarr 3's specification lacks it: not the user's business
            warnings.filterwarnings("ignore", "Consolidated metadata is currently not part", ZarrUserWarning)
            zarr.consolidate_metadata(root.store)


def _drop_consolidated(root: zarr.Group) -> None:
    """Rewrite the root's metadata without consolidated metadata, which the coming change of shapes makes stale."""
    zarr.open_group(root.store, mode="r+", use_consolidated=False).update_attributes({})


def _resize_draws(root: zarr.Group, group: str, specs: dict[str, VariableSpec], chains: int, draws: int) -> None:
    """Give a group's arrays and its ``draw`` coordinate ``draws`` draws (chunks beyond are deleted)."""
    for name, spec in specs.items():
        root[f"{group}/{name}"].resize((chains, draws, *spec.shape))
    root[f"{group}/draw"].resize((draws,))

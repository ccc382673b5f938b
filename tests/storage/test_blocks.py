"""A block's place in a store (``dhmc.storage.blocks``): only the run that owns the store now writes into it."""

from __future__ import annotations

import json

import numpy as np
import pytest

import dhmc
from dhmc.geometry import Geometry
from dhmc.storage.blocks import BlockDestination
from dhmc.storage.zarr_ import OWNER, StoreError, open_store


def _block(layout, chains: int, draws: int, value: float) -> dict:
    """A block of the layout's shapes, every value ``value``."""
    block = {g: {k: np.full((chains, draws, *s.shape), value, s.dtype) for k, s in specs.items()}
             for g, specs in layout.groups().items()}
    return {**block, "position": np.full((chains, 1), value, np.float32)}


def test_a_stopped_runs_block_is_refused_by_the_store_another_run_took_over(dhmc_store, client2):
    """A block that finishes after its run's store was resumed (or overwritten) by another run is refused, and the
    other run's draws stay as they were; the owner's own block is written."""
    root, layout = open_store(dhmc_store)
    spec = json.loads(root.attrs["dhmc_run_spec"])
    geometry = Geometry(spec["chains"], spec["draws"], spec["chains_per_task"], spec["draws_per_segment"])
    first = root.attrs[OWNER]
    assert first.startswith("dhmc-")
    dhmc.resume(dhmc_store, cluster=client2, progress=False)  # a new run owns it now
    root, _ = open_store(dhmc_store)
    owner = root.attrs[OWNER]
    before = root["posterior/p"][:]
    stale = BlockDestination(str(dhmc_store), layout, geometry, 0, 0, first)
    with pytest.raises(StoreError, match=rf"now belongs to run {owner}: this block of run {first} \(stopped, its store "
                                         r"overwritten or resumed since\) was not written"):
        stale.write(_block(layout, 4, geometry.draws_per_segment, 0.5))
    np.testing.assert_array_equal(root["posterior/p"][:], before)
    own = BlockDestination(str(dhmc_store), layout, geometry, 0, 0, owner)
    own.write(_block(layout, 4, geometry.draws_per_segment, 0.5))
    assert (root["posterior/p"][:4, :geometry.draws_per_segment] == 0.5).all()

"""A store that checks itself before a run continues from it: its arrays are the ones its run spec describes, and
every block marked done is on disk whole, with finite end positions.

A damaged block is not an error to a resume: the draws are a deterministic function of the block's start, so
marking it not done (:func:`unmark`) makes ``dhmc resume`` run it again, bitwise as it was. What cannot be rerun (an
array of the wrong shape or dtype: the store was edited) is a one-line :class:`~dhmc.storage.zarr_.StoreError`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import zarr

from dhmc.geometry import Geometry
from dhmc.storage.schema import Layout
from dhmc.storage.zarr_ import INTERNAL, StoreError

__all__ = ["check_arrays", "damaged_blocks", "unmark", "unreadable_done"]


def check_arrays(root: zarr.Group, layout: Layout, geometry: Geometry, path) -> None:
    """Raise :class:`StoreError` naming the first array whose shape or dtype is not what the run spec says."""
    expected = {f"{g}/{k}": ((geometry.chains, geometry.draws, *s.shape), np.dtype(s.dtype))
                for g, specs in layout.groups().items() for k, s in specs.items()}
    expected[f"{INTERNAL}/done"] = ((geometry.num_chunks, geometry.num_segments), np.dtype("uint8"))
    for key, (shape, dtype) in expected.items():
        array = root[key]
        if tuple(array.shape) != shape or array.dtype != dtype:
            raise StoreError(f"store {path} is broken: {key} is {array.dtype}{list(array.shape)} where its run spec "
                             f"says {dtype}{list(shape)}; it was changed after dhmc wrote it: restore it, or start "
                             "a new run")
    position = root[f"{INTERNAL}/position"]
    if tuple(position.shape[:2]) != (geometry.chains, geometry.num_segments):
        raise StoreError(f"store {path} is broken: {INTERNAL}/position has shape {list(position.shape)} where its "
                         f"run spec says [{geometry.chains}, {geometry.num_segments}, ...]: restore it, or start a "
                         "new run")


def unreadable_done(root: zarr.Group, geometry: Geometry) -> list[tuple[int, int]]:
    """The blocks whose done flag cannot be read (one chunk each): not known to be done."""
    done = root[f"{INTERNAL}/done"]
    try:
        done[...]
        return []
    except Exception:  # noqa: BLE001 - found flag by flag below
        pass
    bad = []
    for c in range(geometry.num_chunks):
        for s in range(geometry.num_segments):
            try:
                done[c, s]
            except Exception:  # noqa: BLE001
                bad.append((c, s))
    return bad


def damaged_blocks(root: zarr.Group, layout: Layout, geometry: Geometry, path) -> dict[tuple[int, int], str]:
    """``{(chunk, segment): what is wrong}`` for the blocks marked done that are not whole on disk.

    Uncompressed arrays (the draws) are checked by their chunk files' sizes, which Zarr writes whole; compressed
    ones (the integer and boolean statistics, small) are read; the end position each chunk would continue from
    must be finite (a resume starts the next segment there, an extend the next draws).
    """
    done = root[f"{INTERNAL}/done"][...].astype(bool)
    damaged: dict[tuple[int, int], str] = {}
    local = Path(str(path)) if "://" not in str(path) else None
    for group, specs in layout.groups().items():
        for name in specs:
            array = root[f"{group}/{name}"]
            if _compressed(array):
                _read_check(array, geometry, done, damaged)
            elif local is not None:
                _size_check(array, local, geometry, done, damaged)
    position = root[f"{INTERNAL}/position"]
    for c, s in zip(*np.nonzero(done), strict=True):
        if (c, s) in damaged:
            continue
        chains = geometry.chunk(int(c))
        try:
            end = position[chains.start:chains.stop, int(s)]
        except Exception as e:  # noqa: BLE001 - a chunk zarr cannot decode is a damaged block
            damaged[int(c), int(s)] = f"{INTERNAL}/position unreadable ({type(e).__name__})"
            continue
        if not np.isfinite(end).all():
            damaged[int(c), int(s)] = f"{INTERNAL}/position holds a value that is not finite"
    return damaged


def unmark(root: zarr.Group, blocks) -> None:
    """Mark ``blocks`` not done (their flags rewritten whole): a resume runs them again."""
    done = root[f"{INTERNAL}/done"]
    for c, s in blocks:
        done[c, s] = 0


def _compressed(array) -> bool:
    return len(array.metadata.codecs) > 1  # the bytes codec alone: raw


def _size_check(array, local: Path, geometry: Geometry, done: np.ndarray, damaged: dict) -> None:
    """A raw chunk file holds exactly the chunk's bytes (edge chunks padded): absent or of another size, damaged."""
    nbytes = int(np.prod(array.chunks)) * array.dtype.itemsize
    encode = array.metadata.chunk_key_encoding.encode_chunk_key
    tail = (0,) * (array.ndim - 2)
    for c, s in zip(*np.nonzero(done), strict=True):
        file = local / array.path / encode((int(c), int(s), *tail))
        size = file.stat().st_size if file.is_file() else None
        if size != nbytes and (int(c), int(s)) not in damaged:
            damaged[int(c), int(s)] = (f"{array.path} chunk {file.relative_to(local)} is "
                                       f"{'missing' if size is None else f'{size} of {nbytes} bytes'}")


def _read_check(array, geometry: Geometry, done: np.ndarray, damaged: dict) -> None:
    """Read the whole (small) array; if that fails, each done block's part, to find the ones that do."""
    try:
        array[...]
        return
    except Exception:  # noqa: BLE001 - found block by block below
        pass
    for c, s in zip(*np.nonzero(done), strict=True):
        chains, draws = geometry.chunk(int(c)), geometry.segment(int(s))
        try:
            array[chains.start:chains.stop, draws.start:draws.stop]
        except Exception as e:  # noqa: BLE001
            damaged.setdefault((int(c), int(s)), f"{array.path} unreadable ({type(e).__name__})")

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

__all__ = ["check_arrays", "damaged_blocks", "describe", "read_done", "unmark"]


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


def read_done(root: zarr.Group, geometry: Geometry) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """Which blocks are marked done, and the blocks whose flag (one chunk each) cannot be read: not known to be
    done, so counted not done. The whole array is read, and only if that fails each flag."""
    array = root[f"{INTERNAL}/done"]
    try:
        return array[...].astype(bool), []
    except Exception:  # noqa: BLE001 - found flag by flag below
        pass
    done, unreadable = np.zeros((geometry.num_chunks, geometry.num_segments), bool), []
    for block in np.ndindex(*done.shape):
        try:
            done[block] = bool(array[block])
        except Exception:  # noqa: BLE001
            unreadable.append(block)
    return done, unreadable


def damaged_blocks(root: zarr.Group, layout: Layout, geometry: Geometry, path) -> dict[tuple[int, int], str]:
    """``{(chunk, segment): what is wrong}`` for the blocks marked done that are not whole on disk, and those whose
    done flag cannot be read.

    Uncompressed arrays (the draws) are checked by their chunk files' sizes, which Zarr writes whole; compressed
    ones (the integer and boolean statistics, small) are read; every done block's end position must be finite (the
    next segment starts there, and an extend's next draws).
    """
    done, unreadable = read_done(root, geometry)
    damaged = {b: "its done flag unreadable" for b in unreadable}
    blocks = [(int(c), int(s)) for c, s in zip(*np.nonzero(done), strict=True)]
    local = Path(str(path)) if "://" not in str(path) else None
    for group, specs in layout.groups().items():
        for name in specs:
            array = root[f"{group}/{name}"]
            if _compressed(array):
                parts = {(c, s): (slice(geometry.chunk(c).start, geometry.chunk(c).stop),
                                  slice(geometry.segment(s).start, geometry.segment(s).stop)) for c, s in blocks}
                for b, error in _unreadable(array, parts).items():
                    damaged.setdefault(b, f"{array.path} unreadable ({error})")
            elif local is not None:
                _size_check(array, local, blocks, damaged)
    position = root[f"{INTERNAL}/position"]
    for c, s in blocks:
        if (c, s) in damaged:
            continue
        chains = geometry.chunk(c)
        try:
            end = position[chains.start:chains.stop, s]
        except Exception as e:  # noqa: BLE001 - a chunk zarr cannot decode is a damaged block
            damaged[c, s] = f"{INTERNAL}/position unreadable ({type(e).__name__})"
            continue
        if not np.isfinite(end).all():
            damaged[c, s] = f"{INTERNAL}/position holds a value that is not finite"
    return damaged


def describe(damaged: dict[tuple[int, int], str], path) -> str:
    """``damaged`` (:func:`damaged_blocks`) in one line: how many, and the first with what is wrong."""
    (c, s), what = min(damaged.items())
    return f"{len(damaged)} block(s) of {path} marked done are damaged (the first, chunk {c} segment {s}: {what})"


def unmark(root: zarr.Group, geometry: Geometry, blocks) -> None:
    """Mark ``blocks`` not done: a resume runs them again. Each flag file touched is rewritten whole (one may be
    unreadable), with the flags :func:`read_done` could read."""
    array = root[f"{INTERNAL}/done"]
    done, _ = read_done(root, geometry)
    for c, s in blocks:
        done[c, s] = False
    rows, columns = array.chunks
    for c0, s0 in {(c // rows * rows, s // columns * columns) for c, s in blocks}:
        part = (slice(c0, c0 + rows), slice(s0, s0 + columns))
        array[part] = done[part].astype(np.uint8)


def _compressed(array) -> bool:
    return len(array.metadata.codecs) > 1  # the bytes codec alone: raw


def _size_check(array, local: Path, blocks: list[tuple[int, int]], damaged: dict) -> None:
    """A raw chunk file holds exactly the chunk's bytes (edge chunks padded): absent or of another size, damaged."""
    nbytes = int(np.prod(array.chunks)) * array.dtype.itemsize
    encode = array.metadata.chunk_key_encoding.encode_chunk_key
    tail = (0,) * (array.ndim - 2)
    for c, s in blocks:
        file = local / array.path / encode((c, s, *tail))
        size = file.stat().st_size if file.is_file() else None
        if size != nbytes and (c, s) not in damaged:
            damaged[c, s] = (f"{array.path} chunk {file.relative_to(local)} is "
                             f"{'missing' if size is None else f'{size} of {nbytes} bytes'}")


def _unreadable(array, parts: dict) -> dict:
    """``{key: error name}`` of the ``parts`` (``{key: index}``) of ``array`` that cannot be read: the whole (small)
    array is read first, and only if that fails each part."""
    try:
        array[...]
        return {}
    except Exception:  # noqa: BLE001 - found part by part below
        pass
    bad = {}
    for key, index in parts.items():
        try:
            array[index]
        except Exception as e:  # noqa: BLE001
            bad[key] = type(e).__name__
    return bad

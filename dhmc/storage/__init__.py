"""Traces as labelled xarray data in ArviZ's layout, in memory (``schema``) or streamed into Zarr (``zarr_``).

Submodules are imported where they are used: xarray and zarr take ~1 s to import, and a run
without a store needs zarr only to open one later.
"""

__all__: list[str] = []

"""Traces as labelled xarray data in ArviZ's layout, in memory or streamed into Zarr."""

from dhmc.storage.schema import Layout, VariableSpec, to_datatree
from dhmc.storage.zarr_ import StoreError, create_store, open_store, open_trace, write_block

__all__ = ["Layout", "VariableSpec", "to_datatree", "create_store", "open_store", "open_trace",
           "write_block", "StoreError"]

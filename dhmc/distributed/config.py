"""dhmc's defaults in dask config, loaded the way dask-jobqueue loads ``jobqueue.yaml``."""

from __future__ import annotations

from pathlib import Path

import dask.config
import yaml

__all__ = ["cluster_options", "get"]

_DEFAULTS = Path(__file__).with_name("dhmc.yaml")

with _DEFAULTS.open() as f:
    dask.config.update_defaults(yaml.safe_load(f))


def cluster_options(kind: str, overrides: dict | None = None) -> dict:
    """Options of cluster ``kind`` from dask config, with ``overrides`` (``-`` or ``_`` keys) on top."""
    options = {k.replace("-", "_"): v for k, v in dask.config.get(f"dhmc.cluster.{kind}", {}).items()}
    for key, value in (overrides or {}).items():
        options[key.replace("-", "_")] = value
    return options


def get(key: str):
    """A top-level dhmc setting, e.g. ``get("connect-timeout")``."""
    return dask.config.get(f"dhmc.{key}")

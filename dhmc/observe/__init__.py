"""Observability for dhmc runs: worker metrics, Prometheus series, scheduler dashboard.

Import the submodules directly (``dhmc.observe.metrics``,
``dhmc.observe.dashboard``); this package imports nothing heavy.
"""

from __future__ import annotations

__all__: list[str] = []

"""Block events on a worker, for observers that live in higher layers (``dhmc.observe``).

The worker announces each finished block here; an observer subscribes in the worker process (the
metrics plugin does in its ``setup``). The worker never imports an observer, and a failing
listener never fails a block.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

__all__ = ["on_block", "block_finished"]

_listeners: list[Callable[..., None]] = []


def on_block(listener: Callable[..., None]) -> None:
    """Call ``listener(**stats)`` after every block this process runs (once per listener)."""
    if listener not in _listeners:
        _listeners.append(listener)


def block_finished(**stats) -> None:
    """Tell every listener about a finished block: run id, phase, chains, draws, seconds, ..."""
    for listener in list(_listeners):
        try:
            listener(**stats)
        except Exception:  # noqa: BLE001 - observability never stops a run
            logging.getLogger(__name__).debug("block listener %r failed", listener, exc_info=True)

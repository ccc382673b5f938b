"""What a run tells its observers (the progress bar, the dashboard's publisher, a user's own), and how.

Observers live in higher layers (``dhmc.observe``) or in the user's code and are passed in
(``dhmc.sample(observers=[...])``); the driver never imports them. An observer implements any of
:class:`Observer`'s methods. One that raises is logged once, with its traceback, and not told
anything more in that run: watching a run never stops it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from dhmc.types import BlockResult

__all__ = ["Observer", "Observers"]

log = logging.getLogger("dhmc")


@runtime_checkable
class Observer(Protocol):
    """The events of one run, in order: ``start_run``, ``warmup_block``..., ``sample_block``... (with
    ``convergence_check`` after the waves a ``draws="auto"`` run measured), ``close``.

    Every method is optional; these bodies do nothing, so a class may inherit them.
    """

    def start_run(self, client, run_id: str, geometry) -> None:
        """The run ``run_id`` starts on ``client``, laid out as ``geometry`` (chains, draws, blocks)."""

    def warmup_block(self, round_index: int, rounds: int, chunk: int, result: BlockResult, chunks_done: int,
                     chunks: int) -> None:
        """Chunk ``chunk`` finished warmup round ``round_index`` of ``rounds``; ``result`` is its block's
        :class:`~dhmc.types.BlockResult` (``seconds``, ``compile_seconds``, ``grad_evals``, ...)."""

    def sample_block(self, chunk: int, segment: int, result: BlockResult, chain_draws: int) -> None:
        """Block ``(chunk, segment)`` is in the sink: ``result`` is its ``BlockResult``, ``chain_draws`` its size."""

    def convergence_check(self, check: dict) -> None:
        """The convergence monitor measured a wave (:meth:`dhmc.distributed.monitor.ConvergenceMonitor.measure`):
        ``draws``, ``chains``, ``min_ess``, ``max_split_rhat``, ``max_nested_rhat``, ``worst`` and ``params``
        (each scalar's R-hat and ESS); with ``draws="auto"`` also ``target_ess``, ``max_draws``,
        ``converged``, ``remaining`` and ``max_rhat`` (the rule's, nested)."""

    def close(self) -> None:
        """The run ended (finished, failed or interrupted); the client is still connected."""


class Observers:
    """The observers of one run, told each event in turn."""

    def __init__(self, observers=()):
        self.observers = list(observers)

    def tell(self, event: str, *args) -> None:
        """Call ``event(*args)`` on every observer that has it; one that raises is logged and dropped."""
        for observer in list(self.observers):
            method = getattr(observer, event, None)
            if method is None:
                continue
            try:
                method(*args)
            except Exception:  # noqa: BLE001 - watching a run never stops it
                log.exception("dhmc: observer %r failed in %s and is told nothing more in this run",
                              observer, event)
                self.observers = [o for o in self.observers if o is not observer]

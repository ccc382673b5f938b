"""Blocks on a cluster: send them, and yield their results as they finish, without ever hanging.

This is the one module that owns a ``Client``'s futures. Waiting checks the run's
:class:`~dhmc.distributed.health.Health` every :data:`TICK` seconds (worker processes that keep dying, no block
finished for ``dhmc.block-timeout``); the scheduler's ``KilledWorker`` and ``no-workers-timeout`` end a run
elsewhere, each with one clear error. A block lost to a dropped connection is sent again.
"""

from __future__ import annotations

import queue
import time
import uuid
from dataclasses import dataclass

from dhmc.distributed import config
from dhmc.distributed.health import Health
from dhmc.distributed.worker import BlockResult, Job, run_job

RETRYABLE = ("CommClosedError", "FutureCancelledError", "CancelledError")  # lost, not crashed: sent again
TICK = 1.0  # seconds between health checks while waiting


@dataclass
class Block:
    """One block sent to the cluster: its :class:`~dhmc.distributed.worker.Job` and, once posted, its future."""

    job: Job
    key: str
    future: object
    tag: tuple
    retries: int = 0


class Dispatcher:
    """Send blocks to ``client`` and yield their results as they finish.

    Parameters
    ----------
    client
        A connected ``distributed.Client``.
    health
        The run's :class:`~dhmc.distributed.health.Health`, checked while waiting.
    """

    def __init__(self, client, health: Health):
        self.client, self.health = client, health
        self.max_retries = int(config.get("allowed-failures"))
        direct = config.get("direct-to-workers")
        in_process = getattr(getattr(client, "cluster", None), "scheduler", None) is not None
        self.direct = bool(in_process if direct is None else direct)  # results straight from the workers
        self.compile_seconds = 0.0  # the longest compile any block reported
        self._arrived: queue.SimpleQueue = queue.SimpleQueue()  # futures as they finish (their done callbacks)
        self._live: dict[str, Block] = {}  # the blocks submitted and not yet taken, by their futures' keys
        self._outbox: list[Block] = []  # blocks to send at the next wait

    def submit(self, job: Job, key: str, tag) -> Block:
        """A block for ``job``, sent with the others submitted meanwhile when the dispatcher next waits."""
        block = Block(job, key, None, tag)
        self._outbox.append(block)
        return block

    def finished(self, blocks: dict):
        """Yield lists of ``(tag, result)`` as the blocks in ``blocks`` (keyed by tag) finish, each list the blocks
        that arrived together (their results fetched in one request); ``blocks`` may grow meanwhile.

        Each finished future reports itself once (a done callback), so waiting costs the same whatever the number
        of blocks out: no pass over them per block.
        """
        last = time.monotonic()
        while blocks:
            self._post()
            try:
                arrived = [self._arrived.get(timeout=TICK)]
            except queue.Empty:
                self.health.check((b.job for b in blocks.values()), time.monotonic() - last)
                continue
            while not self._arrived.empty():
                arrived.append(self._arrived.get())
            ready = [self._live.pop(f.key) for f in arrived if f.key in self._live and self._live[f.key].future is f]
            if not ready:  # a cancelled block of an earlier round, or a future sent again
                continue
            last = time.monotonic()
            batch = []
            for block, result in self._results(ready):
                if result is None:  # lost to a dropped connection: sent again
                    block.retries += 1
                    self._outbox.append(block)
                    continue
                del blocks[block.tag]
                self.compile_seconds = max(self.compile_seconds, result.compile_seconds)
                batch.append((block.tag, result))
            if batch:
                yield batch

    def wait(self, blocks: dict) -> None:
        """Wait for the blocks sent (at most ``dhmc.block-timeout``), whatever their outcome."""
        if not blocks:
            return
        from distributed import wait

        try:
            with self.client.as_current():
                wait([b.future for b in blocks.values() if b.future is not None],
                     timeout=self.health.block_timeout or None)
        except Exception:  # noqa: BLE001 - their results are not kept anyway
            pass

    def cancel(self, blocks: dict) -> None:
        """Cancel blocks still queued or running (a run that ended early leaves no work behind)."""
        self._outbox = [b for b in self._outbox if b.tag not in blocks]  # never sent
        sent = [b.future for b in blocks.values() if b.future is not None]
        for future in sent:
            self._live.pop(future.key, None)
        if sent:
            try:
                self.client.cancel(sent)
            except Exception:  # noqa: BLE001 - the cluster may be gone already
                pass

    def _post(self) -> None:
        """Send the blocks submitted since the last post (or sent again, after a lost connection) in one message,
        each as a new future watched until it finishes."""
        if not self._outbox:
            return
        blocks, self._outbox = self._outbox, []
        keys = [f"{b.key}-{uuid.uuid4().hex[:6]}" for b in blocks]
        futures = self.client.map(run_job, [b.job for b in blocks], key=keys, pure=False, retries=0)
        for block, future in zip(blocks, futures, strict=True):
            block.future = future
            self._live[future.key] = block
            future.add_done_callback(self._arrived.put)

    def _results(self, ready: list[Block]) -> list[tuple[Block, BlockResult | None]]:
        """The blocks' results: those that finished, in one request; the others one by one (see :meth:`_result`)."""
        finished = [b for b in ready if b.future.status == "finished"]
        try:
            values = self.client.gather([b.future for b in finished], direct=self.direct)
            values = dict(zip(map(id, finished), values, strict=True))
        except Exception:  # noqa: BLE001 - one was lost meanwhile: each on its own, as the others are
            values = {}
        return [(b, values[id(b)] if id(b) in values else self._result(b)) for b in ready]

    def _result(self, block: Block) -> BlockResult | None:
        """The block's result, None for one to send again, or the error that ends the run."""
        future = block.future
        if future.status == "finished":
            return future.result()
        error = future.exception()
        name = type(error).__name__
        if name == "KilledWorker":
            last = getattr(error.last_worker, "name", None) or getattr(error.last_worker, "address", "?")
            count = error.allowed_failures + 1
            raise self.health.crash_error(f"a {block.job.describe()} of model {self.health.model!r} killed {count} "
                                          f"worker(s)", str(last)) from None
        if name == "NoWorkerError":
            raise self.health.no_workers_error(getattr(error, "timeout", None)) from None
        if name in RETRYABLE and block.retries < self.max_retries:
            return None
        future.result()  # raises the user's own exception, with its traceback


__all__ = ["Block", "Dispatcher", "RETRYABLE", "TICK"]

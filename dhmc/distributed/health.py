"""A run's health while it waits for blocks: workers that keep dying, blocks that never finish, and the
one error (with how the last worker ended) that ends such a run instead of a hang."""

from __future__ import annotations

import re
import time

from dask.utils import parse_timedelta

from dhmc.distributed import config

__all__ = ["Health"]


class Health:
    """The fault rules of one run (``dhmc.worker-crashes``, ``dhmc.block-timeout``) and their errors.

    Parameters
    ----------
    client
        The run's client; on the embedded cluster its ``cluster.worker_deaths()`` records each dead
        worker's exit status and last lines on stderr.
    model, run_id
        Named in the errors.
    store
        The store's path, named in errors (``dhmc resume STORE``), or None.
    """

    def __init__(self, client, model: str, run_id: str, store=None):
        self.model, self.run_id, self.store = model, run_id, store
        self.block_timeout = parse_timedelta(config.get("block-timeout"))
        self.crashes = int(config.get("worker-crashes"))
        self._deaths = getattr(getattr(client, "cluster", None), "worker_deaths", None)
        self._deaths_before = len(self._deaths()) if self._deaths else 0

    def check(self, running, idle: float) -> None:
        """Raise if workers died ``dhmc.worker-crashes`` times in this run, or no block of ``running`` (their
        jobs, described only in the error) finished for ``dhmc.block-timeout`` (``idle`` seconds so far)."""
        deaths = self._deaths()[self._deaths_before:] if self._deaths else []
        if len(deaths) >= self.crashes:
            ran = _block_in(deaths[-1].stderr_tail, self.run_id) or "block"
            raise self.crash_error(f"workers running model {self.model!r} were killed {len(deaths)} times "
                                   f"(dhmc.worker-crashes: {self.crashes}), the last in a {ran}", deaths[-1].worker)
        if self.block_timeout and idle > self.block_timeout:
            from dhmc.errors import BlockTimeoutError

            blocks = ", ".join(sorted(job.describe() for job in running)[:3])
            raise BlockTimeoutError(f"no block of model {self.model!r} finished for {idle:.0f} s "
                                    f"(dhmc.block-timeout; running: {blocks}){self._hint()}")

    def crash_error(self, headline: str, worker: str, wait: float = 5.0):
        """A :class:`WorkerCrashError`: ``headline`` (block, model, count) and how the last worker ended.

        On the embedded cluster the message has the dead worker's exit signal or code and the last
        lines it wrote to stderr (the driver may hear of its death a moment after the scheduler).
        """
        from dhmc.errors import WorkerCrashError

        death, deadline = None, time.monotonic() + wait
        while self._deaths is not None and death is None and time.monotonic() < deadline:
            death = next((d for d in reversed(self._deaths()) if d.worker == worker), None)
            time.sleep(0 if death else 0.05)
        how = death.describe() if death else "ended (exit status unknown: see that worker's log)"
        lines = [f"{headline}; the last, {worker}, {how}"]
        if death and death.stderr_tail:
            lines.append("its last lines on stderr:")
            lines += [f"    {line}" for line in death.stderr_tail]
        if self.store is not None:
            lines.append(f"every block finished before it is in {self.store}; once the cause is fixed: "
                         f"dhmc resume {self.store}")
        return WorkerCrashError("\n".join(lines))

    def no_workers_error(self, timeout):
        """A :class:`NoWorkersError`: blocks waited ``timeout`` seconds without a worker."""
        from dhmc.errors import NoWorkersError

        waited = f" for {timeout:g} s" if timeout else ""
        lines = [f"the cluster had no worker{waited} while blocks of model {self.model!r} "
                 f"waited to run (jobs lost beyond dhmc.cluster.slurm.job-replacements, or workers out of "
                 f"restarts){self._hint()}"]
        deaths = self._deaths() if self._deaths else []
        if deaths:
            lines.append(f"{len(deaths)} worker process(es) ended; the last, {deaths[-1].worker}, "
                         f"{deaths[-1].describe()}")
            lines += [f"    {line}" for line in deaths[-1].stderr_tail]
        return NoWorkersError("\n".join(lines))

    def _hint(self) -> str:
        return f"; every block finished before is in {self.store}: dhmc resume {self.store}" if self.store else ""


def _block_in(stderr_tail, run_id: str) -> str | None:
    """The block a worker said it was running for ``run_id`` (its last such line on stderr)."""
    pattern = re.compile(rf"^dhmc: {re.escape(run_id)} runs the (.+)$")
    for line in reversed(stderr_tail):
        if match := pattern.match(line):
            return match.group(1)
    return None

"""Errors a run can end with, beyond the bad-input ``ValueError``/``TypeError`` raised up front."""

from __future__ import annotations

__all__ = ["BlockTimeoutError", "ClusterError", "ConvergenceWarning", "ModelMismatchError", "NoWorkersError",
           "StoreLockedError", "WorkerCrashError", "one_line"]


class ConvergenceWarning(UserWarning):
    """A run's draws may not represent the posterior: warmup reached ``max_warmup`` before the ensemble
    converged, ``draws="auto"`` reached ``max_draws`` first, or the final R-hat exceeds 1.01.

    The message gives the numbers; ``dhmc summary STORE`` repeats them. Turn it into an error with
    ``warnings.simplefilter("error", dhmc.ConvergenceWarning)``.
    """


class WorkerCrashError(RuntimeError):
    """A block killed the worker processes that ran it, as many times as ``dhmc.worker-crashes`` allows.

    A crash (a segfault, an abort, a kill by the OS) is not retried forever: the run ends with this
    error, naming the block, the model, how the last worker ended and what it last wrote to stderr.
    Every block finished before it is in the store, which ``dhmc resume`` continues.
    """


class NoWorkersError(RuntimeError):
    """The cluster had no worker for ``dhmc.no-workers-timeout`` while blocks waited to run.

    Workers lost for good (a Slurm walltime, embedded workers out of restarts) end the run with this
    error instead of a wait without end; the store keeps every finished block for ``dhmc resume``.
    """


class BlockTimeoutError(RuntimeError):
    """No block finished for ``dhmc.block-timeout`` while blocks were running: a stuck worker or device.

    The run ends instead of waiting without end; the store keeps every finished block for ``dhmc resume``.
    """


class StoreLockedError(RuntimeError):
    """Another run, alive, holds the store's lock: two runs never write one store.

    The message names the store, the holder's host, pid and start time, and the lock file to
    delete if that process is gone (dhmc cannot tell for a process on another host). A lock left by
    a dead process on this host is taken over without this error.
    """


class ModelMismatchError(ValueError):
    """``resume`` was given another model or data, or runs another dhmc or JAX version, than the store's run.

    Continuing would mix draws of two different runs in one store; ``force=True`` (``--force``) does it anyway.
    """


class ClusterError(RuntimeError):
    """A cluster that cannot be started or reached, or a target its workers cannot receive."""


def one_line(error: BaseException) -> str:
    """An error's message in one line: its first; for one that carries a Python traceback (a model that raised
    inside a JAX callback: ``INTERNAL: CpuCallback error calling callback: Traceback ...``), the error the model
    raised, the traceback's last line."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    if "Traceback (most recent call last):" in lines[0] and len(lines) > 1:
        return f"the model raised inside a JAX callback: {lines[-1]}"
    return lines[0]

"""Set-up code run on every worker before its first block: modules to import, scripts to run.

A model whose classes a library creates at import time (TensorFlow Probability's Inference Gym
builds ``inference_gym.dynamic.backend_jax`` when ``inference_gym.using_jax`` is imported) can only
be unpickled on a worker that has run that import. ``dhmc.worker-setup`` (dask config; ``dhmc
sample --worker-setup``) lists module names and ``.py`` scripts; each worker runs them, in order, as
it joins the run's cluster, whatever its kind (embedded, local, CUDA, Slurm, or one given).
Scripts travel as text, so they need not be on the workers' filesystem.
"""

from __future__ import annotations

import importlib
import re
from contextlib import suppress
from pathlib import Path

from distributed.diagnostics.plugin import WorkerPlugin

from dhmc.errors import ClusterError

__all__ = ["WorkerSetup", "worker_setup", "register"]

_MODULE = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)*$")


class WorkerSetup(WorkerPlugin):
    """Import ``modules`` and run ``scripts`` (``(path, source)`` pairs) on each worker, once per process."""

    name = "dhmc-worker-setup"

    def __init__(self, steps: tuple[tuple[str, str | None], ...]):
        self.steps = steps  # (module name, None) or (script path, its source)

    def setup(self, worker=None) -> None:
        for name, source in self.steps:
            if source is None:
                importlib.import_module(name)
            else:
                exec(compile(source, name, "exec"), {"__name__": "__dhmc_worker_setup__", "__file__": name})


def worker_setup(entries) -> WorkerSetup | None:
    """The set-up from ``entries`` (module names and script paths); None when there is none.

    Raises ``ValueError`` (one line) for a script that cannot be read or a name that is neither.
    """
    if isinstance(entries, str):
        entries = [entries]
    steps = []
    for entry in entries:
        entry = str(entry)
        if entry.endswith(".py") or "/" in entry:
            try:
                steps.append((str(Path(entry).resolve()), Path(entry).read_text()))
            except OSError as e:
                raise ValueError(f"dhmc.worker-setup: cannot read the script {entry!r} ({e.strerror})") from None
        elif _MODULE.match(entry):
            steps.append((entry, None))
        else:
            raise ValueError(f"dhmc.worker-setup: {entry!r} is neither a module name nor a .py script")
    return WorkerSetup(tuple(steps)) if steps else None


def register(client, setup: WorkerSetup | None) -> None:
    """Run ``setup`` on the client's workers now and on every worker that joins later; one line if it fails."""
    if setup is None:
        return
    try:
        client.register_plugin(setup, name=WorkerSetup.name)
    except Exception as e:  # noqa: BLE001 - the user's set-up failed on a worker: say which and how
        with suppress(Exception):  # the scheduler keeps a plugin it failed to run: workers joining later would too
            client.unregister_worker_plugin(WorkerSetup.name)
        steps = ", ".join(name for name, _ in setup.steps)
        raise ClusterError(f"dhmc.worker-setup ({steps}) failed on a worker: {type(e).__name__}: {e}") from None

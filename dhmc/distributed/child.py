"""An embedded worker's process, which dies with its driver: ``python -m dhmc.distributed.child DRIVER_PID ARGS``.

It runs ``dask spec ARGS`` (a Dask worker) after asking the kernel for ``SIGTERM`` when the driver exits (Linux's
parent-death signal): a driver killed with ``kill -9``, at any point of its workers' start-up or work, takes them
with it (they used to live on for good). A killed driver cannot remove its temporary folders (its workers' logs
and certificates, its compiled programs); they carry its process id (:func:`temporary_prefix`), and the next
driver on the machine removes those of drivers that are gone (:func:`remove_orphaned_folders`).
"""

from __future__ import annotations

import ctypes
import glob
import os
import re
import shutil
import signal
import sys
import tempfile

PR_SET_PDEATHSIG = 1


def temporary_prefix(kind: str) -> str:
    """The prefix of this driver's temporary folder of ``kind`` (for ``tempfile.mkdtemp(prefix=...)``)."""
    return f"dhmc-{kind}-{os.getpid()}-"


def remove_orphaned_folders() -> list[str]:
    """Remove the temporary folders of drivers that are no longer running; return them."""
    import psutil

    removed = []
    for folder in glob.glob(os.path.join(tempfile.gettempdir(), "dhmc-*-*-*")):
        match = re.fullmatch(r"dhmc-(?:workers|programs)-(\d+)-[^.]+", os.path.basename(folder))
        if match is None or _running(int(match.group(1)), psutil):
            continue
        claimed = f"{folder}.gone-{os.getpid()}"  # one remover per folder, if two drivers start at once
        try:
            os.rename(folder, claimed)
        except OSError:
            continue
        shutil.rmtree(claimed, ignore_errors=True)
        removed.append(folder)
    return removed


def _running(pid: int, psutil) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def main(argv: list[str]) -> None:
    driver = int(argv[0])
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != driver:  # the driver died before the line above
        sys.exit(0)
    from distributed.cli.dask_spec import main as dask_spec

    dask_spec(argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])

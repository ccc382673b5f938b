"""An exclusive lock on a store while a run writes it, so that two runs never write one store.

The lock is a file beside the store, ``<store>.dhmc-lock`` (``runs/coin.zarr.dhmc-lock``), created
with ``O_CREAT | O_EXCL`` and holding JSON ``{host, pid, process_start, started_at, store, run_id,
token}``. It lies beside the store rather than in it because zarr warns ("Object at .dhmc-lock is
not recognized as a component of a Zarr hierarchy") on every ``xarray.open_datatree`` of a store
holding a file of its own, and because removing or overwriting the store then leaves the lock alone.

A lock whose holder died on this host (its pid is gone, a zombie, or now another process: the
start time differs) is stale and taken over silently; a takeover is serialised by ``flock`` on
the old lock file, so two runs racing for one stale lock do not both win. A lock held from another
host cannot be judged: :class:`~dhmc.errors.StoreLockedError` says whom to wait for, and which
file to delete if that process is gone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from dhmc.errors import StoreLockedError

__all__ = ["StoreLock", "StoreLockedError", "check_free", "lock_path"]

SUFFIX = ".dhmc-lock"
#: Tokens of the locks this process holds: its own lock is no obstacle to :func:`check_free`.
_HELD: set[str] = set()
#: A lock file being written is empty for a moment: read it again for this long (s) before it is unreadable.
_UNREADABLE_WAIT = 0.5
_GONE = object()


def lock_path(store: str | os.PathLike) -> Path:
    """The lock file of ``store``: ``<store>.dhmc-lock`` beside it (symlinks resolved)."""
    store = Path(store).resolve()
    return store.with_name(store.name + SUFFIX)


class StoreLock:
    """An exclusive lock on a store: a context manager, or :meth:`acquire` then :meth:`release`.

    Parameters
    ----------
    store
        The store's path; it need not exist yet (a new store is locked before it is created).
    run_id
        Optional, written into the lock file and named in the error others get.

    Raises
    ------
    StoreLockedError
        From :meth:`acquire`, when a live process (this one included) holds the lock.
    """

    def __init__(self, store: str | os.PathLike, run_id: str | None = None):
        self.store = Path(store)
        self.path = lock_path(store)
        self.run_id = run_id
        self.record: dict | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now."""
        return self.record is not None

    def acquire(self) -> StoreLock:
        """Take the lock, taking over a stale one; raise :class:`StoreLockedError` if a live run holds it."""
        if self.record is not None:
            raise RuntimeError(f"this StoreLock already holds {self.path}")
        record = {"host": socket.gethostname(), "pid": os.getpid(), "process_start": _process_start(os.getpid()),
                  "started_at": datetime.now(UTC).isoformat(timespec="seconds"),
                  "store": str(self.store.absolute()), "run_id": self.run_id, "token": uuid.uuid4().hex}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        for _ in range(100):
            try:
                created = _create(self.path, record)
            except PermissionError as e:
                raise PermissionError(f"cannot lock the store {self.store}: cannot create {self.path} "
                                      f"({e.strerror})") from None
            if created:
                self.record = record
                _HELD.add(record["token"])
                return self
            current = _read(self.path)
            if current is _GONE:  # released meanwhile
                continue
            if current is None or not _stale(current):
                raise StoreLockedError(_message(self.store, self.path, current))
            _break(self.path, current)
        raise StoreLockedError(f"cannot lock {self.store}: its lock file {self.path} keeps changing")

    def release(self) -> None:
        """Remove the lock file if it is still this lock's; does nothing when not held."""
        if self.record is None:
            return
        token = self.record["token"]
        self.record = None
        _HELD.discard(token)
        current = _read_once(self.path)
        if isinstance(current, dict) and current.get("token") == token:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)

    def __enter__(self) -> StoreLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def check_free(store: str | os.PathLike) -> None:
    """Raise :class:`StoreLockedError` if a live run other than this process holds the lock of ``store``."""
    path = lock_path(store)
    record = _read(path)
    if record is _GONE or (record is not None and (record.get("token") in _HELD or _stale(record))):
        return
    raise StoreLockedError(_message(Path(store), path, record))


# -- internals ------------------------------------------------------------------------------------------


def _create(path: Path, record: dict) -> bool:
    """Create the lock file holding ``record``; False if it exists."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, json.dumps(record).encode())  # one small write: readers see all of it or (briefly) nothing
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    return True


def _parse(data: bytes) -> dict | None:
    try:
        record = json.loads(data)
    except ValueError:
        return None
    if not isinstance(record, dict) or not isinstance(record.get("host"), str):
        return None
    pid = record.get("pid")
    return record if isinstance(pid, int) and not isinstance(pid, bool) and pid > 0 else None


def _read_once(path: Path):
    """The lock's record, ``None`` if unreadable, ``_GONE`` if there is no lock file."""
    try:
        return _parse(path.read_bytes())
    except FileNotFoundError:
        return _GONE
    except OSError:
        return None


def _read(path: Path):
    """Like :func:`_read_once`, reading an unreadable file again for a moment (it may be being written)."""
    deadline = time.monotonic() + _UNREADABLE_WAIT
    while True:
        record = _read_once(path)
        if record is not None or time.monotonic() >= deadline:
            return record
        time.sleep(0.02)


def _stale(record: dict) -> bool:
    """A lock of this host whose process is gone; a lock of another host is never judged stale."""
    return record["host"] == socket.gethostname() and not _alive(record["pid"], record.get("process_start"))


def _alive(pid: int, start) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        pass
    if not os.path.exists("/proc/self/stat"):  # no procfs (macOS): the pid exists, trust it
        return True
    stat = _proc_stat(pid)
    if stat is None:  # exited since the kill
        return False
    state, started = stat
    return state != "Z" and (start is None or started == start)


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """``(state, start time in clock ticks after boot)`` from ``/proc/<pid>/stat``, or None."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # the command name before ")" may hold spaces
    return fields[0], int(fields[19])


def _process_start(pid: int) -> int | None:
    stat = _proc_stat(pid)
    return stat[1] if stat else None


def _break(path: Path, record: dict) -> None:
    """Remove the stale lock ``record`` if the lock file still is that one."""
    fd = None
    for flags in (os.O_RDWR, os.O_RDONLY):
        try:
            fd = os.open(path, flags)
            break
        except PermissionError:
            continue
        except FileNotFoundError:
            return
    if fd is None:
        return
    try:
        # Serialises the runs on this host taking over this lock (only they judge it stale); where
        # flock fails (NFS emulates it with fcntl locks, which need a writable file) it is best effort.
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            if os.stat(path).st_ino != os.fstat(fd).st_ino:  # another run took it over meanwhile
                return
        except FileNotFoundError:
            return
        if _parse(os.pread(fd, 1 << 16, 0)) == record:
            with contextlib.suppress(FileNotFoundError):  # without flock, another run may have just done it
                os.unlink(path)
    finally:
        os.close(fd)


def _message(store: Path, path: Path, record: dict | None) -> str:
    if record is None:
        return (f"{store} is locked by another dhmc run, but its lock file {path} is unreadable: if no run uses "
                f"the store, delete {path}")
    run = f" (id {record['run_id']})" if record.get("run_id") else ""
    host, pid, since = record["host"], record["pid"], record.get("started_at", "an unknown time")
    if host == socket.gethostname():
        return (f"{store} is in use by a dhmc run{run} on this host ({host}, pid {pid}) since {since}: wait for it "
                f"to finish or stop it; if no such process runs here (another container?), delete {path}")
    return (f"{store} is in use by a dhmc run{run} on host {host} (pid {pid}) since {since}: wait for it to "
            f"finish; if that process is gone, delete {path}")

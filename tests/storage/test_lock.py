"""The store lock, with real processes: held, released, stale after SIGKILL, contended."""

from __future__ import annotations

import json
import os
import signal
import socket
import textwrap
import warnings

import pytest

import dhmc
from dhmc.storage.lock import StoreLock, StoreLockedError, check_free, lock_path

RACER = textwrap.dedent("""
    import os, sys, time
    from dhmc.storage.lock import StoreLock, StoreLockedError
    store, go, stop = sys.argv[1:]
    print("READY", flush=True)
    while not os.path.exists(go):
        time.sleep(0.001)
    try:
        StoreLock(store).acquire()
    except StoreLockedError:
        print("LOST", flush=True)
    else:
        print("WON", flush=True)
        while not os.path.exists(stop):  # hold it until every racer has tried
            time.sleep(0.01)
""")


def _record(store) -> dict:
    return json.loads(lock_path(store).read_text())


def _write_record(store, **record) -> None:
    lock_path(store).write_text(json.dumps({"started_at": "2020-01-01T00:00:00+00:00", **record}))


def test_error_is_exported():
    assert dhmc.StoreLockedError is StoreLockedError
    assert "StoreLockedError" in dir(dhmc)


def test_a_second_run_is_refused_naming_the_holder(tmp_path, hold_lock):
    store = tmp_path / "s.zarr"
    holder = hold_lock(store)
    record = _record(store)
    assert (record["host"], record["pid"], record["run_id"]) == (socket.gethostname(), holder.pid, "holder")
    assert isinstance(record["process_start"], int) or not os.path.exists("/proc/self/stat")
    with pytest.raises(StoreLockedError) as info:
        StoreLock(store).acquire()
    message = str(info.value)
    assert "\n" not in message
    for part in (str(store), "(id holder)", socket.gethostname(), f"pid {holder.pid}", record["started_at"], "wait",
                 str(lock_path(store))):
        assert part in message
    with pytest.raises(StoreLockedError):
        check_free(store)
    assert _record(store)["pid"] == holder.pid  # the refused run left the lock alone


def test_released_on_exit_and_on_error(tmp_path):
    store = tmp_path / "s.zarr"
    with StoreLock(store, run_id="r1") as lock:
        assert lock.held and _record(store)["run_id"] == "r1"
        assert not store.exists()  # the lock lies beside the store, which it does not create
        check_free(store)  # this process's own lock is no obstacle to it
    assert not lock.held and not lock_path(store).exists()
    with pytest.raises(KeyError), StoreLock(store):
        raise KeyError("boom")
    assert not lock_path(store).exists()
    lock = StoreLock(store).acquire()
    lock.release()
    lock.release()  # twice is fine
    assert not lock_path(store).exists()


def test_a_second_lock_in_the_same_process_is_refused(tmp_path):
    store = tmp_path / "s.zarr"
    with StoreLock(store):
        with pytest.raises(StoreLockedError, match=f"pid {os.getpid()}"):
            StoreLock(store).acquire()
        assert lock_path(store).exists()
    assert not lock_path(store).exists()


def test_sigkilled_holder_leaves_a_stale_lock_that_is_taken_over(tmp_path, hold_lock):
    store = tmp_path / "s.zarr"
    holder = hold_lock(store)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert _record(store)["pid"] == holder.pid  # left behind
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with StoreLock(store):
            assert _record(store)["pid"] == os.getpid()
    assert not lock_path(store).exists()


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs procfs")
def test_a_zombie_holder_is_dead(tmp_path, hold_lock):
    store = tmp_path / "s.zarr"
    holder = hold_lock(store)
    os.kill(holder.pid, signal.SIGKILL)
    os.waitid(os.P_PID, holder.pid, os.WEXITED | os.WNOWAIT)  # dead, not reaped: a zombie kill(pid, 0) still finds
    assert os.kill(holder.pid, 0) is None
    with StoreLock(store):
        assert _record(store)["pid"] == os.getpid()


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="needs procfs")
def test_a_reused_pid_is_stale(tmp_path):
    store = tmp_path / "s.zarr"
    parent = os.getppid()  # alive, but not the process that took the lock: its start time differs
    _write_record(store, host=socket.gethostname(), pid=parent, process_start=1)
    with StoreLock(store):
        assert _record(store)["pid"] == os.getpid()


def test_a_lock_from_another_host_is_never_taken_over(tmp_path):
    store = tmp_path / "s.zarr"
    _write_record(store, host="elsewhere.invalid", pid=4242)
    with pytest.raises(StoreLockedError) as info:
        StoreLock(store).acquire()
    message = str(info.value)
    for part in ("host elsewhere.invalid", "pid 4242", "since 2020-01-01T00:00:00+00:00", "if that process is gone",
                 f"delete {lock_path(store)}"):
        assert part in message
    assert _record(store)["host"] == "elsewhere.invalid"


def test_an_unreadable_lock_is_refused(tmp_path):
    store = tmp_path / "s.zarr"
    lock_path(store).write_text("not json")
    with pytest.raises(StoreLockedError, match=f"unreadable: if no run uses the store, delete {lock_path(store)}"):
        StoreLock(store).acquire()


def test_the_lock_file_is_beside_the_store(tmp_path):
    target = tmp_path / "real.zarr"
    target.mkdir()
    (tmp_path / "link.zarr").symlink_to(target)
    assert lock_path(tmp_path / "link.zarr") == lock_path(target) == tmp_path / "real.zarr.dhmc-lock"
    assert lock_path(f"{target}/") == lock_path(target)


def test_zarr_and_xarray_open_a_store_while_it_is_locked(dhmc_store):
    import xarray as xr
    import zarr

    with StoreLock(dhmc_store), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not any(p.name.endswith(".dhmc-lock") for p in dhmc_store.iterdir())
        assert "posterior" in zarr.open_group(str(dhmc_store), mode="r")
        tree = xr.open_datatree(str(dhmc_store), engine="zarr", consolidated=False)
        assert {"posterior", "sample_stats"} <= set(tree.children)
        assert dhmc.open_trace(dhmc_store)["posterior"]["p"].shape == (8, 10, 2)


@pytest.mark.parametrize("stale", [False, True], ids=["free", "stale"])
def test_exactly_one_of_racing_processes_wins(tmp_path, spawn, hold_lock, stale):
    store, go, stop = tmp_path / "s.zarr", tmp_path / "go", tmp_path / "stop"
    if stale:
        holder = hold_lock(store)
        holder.kill()
        holder.wait()
    racers = [spawn(RACER, store, go, stop) for _ in range(4)]
    try:
        assert [r.stdout.readline().strip() for r in racers] == ["READY"] * 4
        go.touch()
        results = [r.stdout.readline().strip() for r in racers]
        assert sorted(results) == ["LOST", "LOST", "LOST", "WON"], results
        assert _record(store)["pid"] == racers[results.index("WON")].pid
    finally:
        stop.touch()
    assert [r.wait(timeout=60) for r in racers] == [0] * 4

"""``connect``: a cluster that cannot start says why, in one line."""

from __future__ import annotations

import socket

import pytest

from dhmc.distributed import connect as connect_module
from dhmc.distributed import embedded
from dhmc.distributed.connect import connect
from dhmc.errors import ClusterError


def test_a_cluster_that_cannot_start_says_why(monkeypatch):
    """Dask says only "Cluster failed to start: Scheduler failed to start."; dhmc names the cause under it."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        monkeypatch.setattr(embedded, "_free_port", lambda host: holder.getsockname()[1])
        with pytest.raises(ClusterError, match=r"^the local cluster failed to start: .*Address already in use"):
            connect(None, {"n_workers": 1})


def test_dhmcs_own_cluster_errors_pass_unchanged(monkeypatch):
    def missing(**options):
        raise ClusterError("cluster='slurm' needs dask-jobqueue: pip install 'dhmc[slurm]'")

    monkeypatch.setattr(connect_module, "slurm_cluster", missing)
    with pytest.raises(ClusterError, match=r"^cluster='slurm' needs dask-jobqueue"):
        connect("slurm")


def test_ctrl_c_before_a_sync_call_started_logs_no_traceback(caplog):
    """Distributed's ``sync`` logs a NameError when interrupted before its future exists; dhmc drops it.

    Without the filter this test sees that NameError logged (checked when it was written).
    """
    import logging
    import os
    import signal
    import threading
    import time

    from distributed.utils import LoopRunner, sync

    logger = logging.getLogger("tornado.application")
    saved = list(logger.filters)
    connect_module._drop_interrupt_race()
    connect_module._drop_interrupt_race()  # installed once however often connect() runs
    assert sum(isinstance(f, connect_module._InterruptRace) for f in logger.filters) == 1
    sent = threading.Event()

    def interrupt():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)
        sent.set()

    handler = signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C is KeyboardInterrupt (an imported
    # dask_jobqueue.runner makes it SystemExit)
    runner = LoopRunner(asynchronous=False)
    runner.start()
    try:
        runner.loop.add_callback(sent.wait, 30)  # the loop is busy until Ctrl-C: the sync call has not started
        threading.Timer(0.2, interrupt).start()

        async def nothing():
            return None

        with caplog.at_level(logging.ERROR, logger="tornado.application"), pytest.raises(KeyboardInterrupt):
            sync(runner.loop, nothing)
        sent.wait(30)
        time.sleep(0.5)  # the loop runs the sync call's cancel() once it is free
    finally:
        runner.stop()
        signal.signal(signal.SIGINT, handler)
        logger.filters[:] = saved
    assert not [r for r in caplog.records if r.exc_info and isinstance(r.exc_info[1], NameError)]

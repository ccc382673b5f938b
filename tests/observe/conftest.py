"""Shared fixtures: one real 2-process LocalCluster per session, bound to 127.0.0.1."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest


def _make_block_loop() -> Callable[..., int]:
    # Defined in a closure so cloudpickle ships it by value (workers need not import conftest).
    def block_loop(
        run_id: str, chains: int, n_blocks: int, block_s: float, stop: str | None = None, max_s: float = 60.0
    ) -> int:
        import time

        from distributed import Event

        from dhmc.observe.metrics import record_block

        event = Event(stop) if stop else None
        deadline = time.monotonic() + max_s
        i = 0
        while i < n_blocks or (event is not None and not event.is_set() and time.monotonic() < deadline):
            time.sleep(block_s)
            record_block(
                run_id=run_id,
                phase="sampling",
                chains=chains,
                draws=50,
                grad_evals=chains * 50 * 15,
                seconds=block_s,
                compile_seconds=0.5 if i == 0 else 0.0,
                acceptance_mean=0.8,
                divergences=i % 2,
            )
            i += 1
        return i

    return block_loop


class Harness:
    """A running cluster plus small helpers for HTTP and polling."""

    def __init__(self, cluster: Any, client: Any) -> None:
        self.cluster, self.client = cluster, client
        self.scheduler = cluster.scheduler
        self.block_loop = _make_block_loop()

    @property
    def workers(self) -> list[str]:
        return sorted(self.client.scheduler_info()["workers"])

    @property
    def port(self) -> int:
        return self.client.scheduler_info()["services"]["dashboard"]

    def worker_port(self, addr: str) -> int:
        return self.client.scheduler_info()["workers"][addr]["services"]["dashboard"]

    @staticmethod
    def get(port: int, path: str, timeout: float = 10.0) -> bytes:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.read()

    def get_json(self, path: str) -> Any:
        return json.loads(self.get(self.port, path))

    @staticmethod
    def wait_for(pred: Callable[[], Any], timeout: float = 20.0, interval: float = 0.2) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = pred()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"condition not met within {timeout} s")
            time.sleep(interval)

    def run_blocks(self, run_id: str, n_blocks: int = 4, block_s: float = 0.1, stop: str | None = None):
        """One block loop per worker (worker i runs 4*(i+1) chains); returns the futures."""
        return [
            self.client.submit(self.block_loop, run_id, 4 * (i + 1), n_blocks, block_s, stop, workers=[w], pure=False)
            for i, w in enumerate(self.workers)
        ]


@pytest.fixture(scope="session")
def harness():
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            host="127.0.0.1",
            dashboard_address="127.0.0.1:0",
            worker_dashboard_address="127.0.0.1:0",
        ) as cluster,
        Client(cluster) as client,
    ):
        client.wait_for_workers(2, timeout=60)
        yield Harness(cluster, client)

"""Blocks sent and waited for (``dhmc.distributed.dispatch``), against a client whose futures end as each test says:
a block lost to a dropped connection is sent again and its result returned; one lost more often than allowed, or
one that killed its workers, ends the run with one error; a cancelled round leaves nothing queued or running."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from dhmc.distributed import config
from dhmc.distributed.dispatch import Dispatcher
from dhmc.distributed.health import Health
from dhmc.errors import WorkerCrashError


class CommClosedError(Exception):  # the dispatcher knows distributed's errors by name
    pass


class KilledWorker(Exception):
    def __init__(self):
        super().__init__("killed")
        self.last_worker, self.allowed_failures = SimpleNamespace(name="worker-7"), 2


class Future:
    def __init__(self, key, outcome):
        self.key, self.outcome = key, outcome
        self.status = "error" if isinstance(outcome, Exception) else "finished"

    def result(self):
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome

    def exception(self):
        return self.outcome if isinstance(self.outcome, Exception) else None

    def add_done_callback(self, callback):
        callback(self)  # already done


class Client:
    """Runs each job at once: ``outcomes[name]`` lists what its successive sends end in (the last repeats)."""

    def __init__(self, outcomes):
        self.outcomes, self.sent, self.cancelled = outcomes, [], []

    def map(self, fn, jobs, key, pure, retries):
        self.sent.append([job.name for job in jobs])
        futures = []
        for job, k in zip(jobs, key, strict=True):
            tries = sum(batch.count(job.name) for batch in self.sent) - 1
            outcomes = self.outcomes[job.name]
            futures.append(Future(k, outcomes[min(tries, len(outcomes) - 1)]))
        return futures

    def gather(self, futures, direct):
        return [f.result() for f in futures]

    def cancel(self, futures):
        self.cancelled += futures


def _job(name):
    return SimpleNamespace(name=name, describe=lambda: f"warmup block ({name})")


def _result(name):
    return SimpleNamespace(name=name, compile_seconds=1.5 if name == "b" else 0.5)


def _dispatch(client):
    return Dispatcher(client, Health(client, "coin", "dhmc-test"))


def _run(dispatch, names):
    blocks = {name: dispatch.submit(_job(name), f"key-{name}", name) for name in names}
    return [(tag, result.name) for batch in dispatch.finished(blocks) for tag, result in batch], blocks


def test_a_block_lost_to_a_dropped_connection_is_sent_again_and_its_result_returned():
    client = Client({"a": [_result("a")], "b": [CommClosedError("lost"), _result("b")], "c": [_result("c")]})
    dispatch = _dispatch(client)
    results, blocks = _run(dispatch, ["a", "b", "c"])
    assert sorted(results) == [("a", "a"), ("b", "b"), ("c", "c")]
    assert client.sent == [["a", "b", "c"], ["b"]]  # the three in one message, then the lost one alone
    assert dispatch.compile_seconds == 1.5


def test_a_block_lost_more_often_than_allowed_ends_the_run_with_its_error():
    client = Client({"a": [_result("a")], "b": [CommClosedError("lost for good")]})
    with pytest.raises(CommClosedError, match="lost for good"):
        _run(_dispatch(client), ["a", "b"])
    assert [batch.count("b") for batch in client.sent] == [1] * (int(config.get("allowed-failures")) + 1)


def test_a_block_that_killed_its_workers_ends_the_run_with_one_error_naming_it_the_model_and_the_worker():
    client = Client({"a": [KilledWorker()]})
    with pytest.raises(WorkerCrashError) as error:
        _run(_dispatch(client), ["a"])
    assert str(error.value).startswith("a warmup block (a) of model 'coin' killed 3 worker(s); the last, worker-7")
    assert client.sent == [["a"]]  # never sent again


def test_cancel_keeps_unsent_blocks_from_being_sent_and_cancels_the_sent():
    client = Client({name: [_result(name)] for name in "abcd"})
    dispatch = _dispatch(client)
    sent = {name: dispatch.submit(_job(name), f"key-{name}", name) for name in "ab"}
    dispatch._post()
    unsent = {name: dispatch.submit(_job(name), f"key-{name}", name) for name in "cd"}
    dispatch.cancel(sent | unsent)
    assert client.cancelled == [sent["a"].future, sent["b"].future]
    other = {"e": dispatch.submit(_job("a"), "key-e", "e")}  # a later round's block
    assert [tag for batch in dispatch.finished(other) for tag, _ in batch] == ["e"]
    assert client.sent == [["a", "b"], ["a"]]  # c and d never left

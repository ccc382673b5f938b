"""``dhmc.sample(observers=...)``: a user's observers hear every event in order; one that fails is logged once
and dropped, and the run goes on to the same draws."""

from __future__ import annotations

import logging

import jax.numpy as jnp
import numpy as np
import pytest

import dhmc

KW = dict(init={"x": jnp.zeros(2)}, chains=16, draws=40, warmup=50, chains_per_task=8, seed=3, progress=False)


def logdensity(p):
    return -0.5 * jnp.sum(p["x"] ** 2)


class Recorder(dhmc.Observer):
    def __init__(self):
        self.events = []

    def start_run(self, client, run_id, geometry):
        self.events.append(("start_run", geometry.chains, geometry.num_chunks))

    def warmup_block(self, round_index, rounds, chunk, result, chunks_done, chunks):
        self.events.append(("warmup_block", round_index, chunk, result.seconds > 0))

    def sample_block(self, chunk, segment, result, chain_draws):
        self.events.append(("sample_block", chunk, segment, chain_draws))

    def close(self):
        self.events.append(("close",))


class Failing:
    calls = 0

    def sample_block(self, chunk, segment, result, chain_draws):
        Failing.calls += 1
        raise RuntimeError("observer bug")


def test_observers_hear_every_event_and_a_failing_one_is_logged_once_and_dropped(client2, caplog):
    recorder = Recorder()
    with caplog.at_level(logging.ERROR, logger="dhmc"):
        trace = dhmc.sample(logdensity, cluster=client2, observers=[Failing(), recorder], **KW)
    plain = dhmc.sample(logdensity, cluster=client2, **KW)
    np.testing.assert_array_equal(trace["posterior"]["x"].values, plain["posterior"]["x"].values)
    names = [e[0] for e in recorder.events]
    assert names[0] == "start_run" and recorder.events[0][1:] == (16, 2) and names[-1] == "close"
    warmups = [e for e in recorder.events if e[0] == "warmup_block"]
    assert warmups and all(e[3] for e in warmups) and {e[2] for e in warmups} == {0, 1}
    assert sorted(e[1:] for e in recorder.events if e[0] == "sample_block") == [(0, 0, 320), (1, 0, 320)]
    assert names.index("sample_block") > names.index("warmup_block")
    assert Failing.calls == 1
    failures = [r for r in caplog.records if "observer" in r.getMessage()]
    assert len(failures) == 1 and "sample_block" in failures[0].getMessage() and failures[0].exc_info


def test_an_object_that_observes_nothing_is_refused_before_any_work():
    with pytest.raises(TypeError, match=r"observers: .* has none of an observer's methods \(start_run, warmup_block"):
        dhmc.sample(logdensity, observers=[object()], **KW)

"""The store's sink (``dhmc.storage.sinks.StoreSink``)."""

from __future__ import annotations


def test_the_sampling_phase_time_splits_into_sampling_and_the_sinks_writing(made_store):
    """With a store, ``sampling + writing`` is the phase's wall time (``writing``: the driver's sink); the workers'
    writes, in parallel with it, are ``worker_writing`` (subtracting them made ``sampling`` negative)."""
    import json

    import dhmc

    timing = json.loads(dhmc.open_trace(made_store).attrs["dhmc_timing"])
    assert timing["sampling"] > 0 and timing["writing"] >= 0 and timing["worker_writing"] > 0, timing
    assert timing["sampling"] + timing["writing"] <= timing["total"], timing

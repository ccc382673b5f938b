import json

import dhmc


def test_the_sampling_phase_time_splits_into_sampling_and_the_drivers_writing(client2, tmp_path):
    """``sampling + writing`` is the phase's wall time; the workers' writes, in parallel with it, are counted apart
    (subtracting them made ``sampling`` negative)."""
    trace = dhmc.sample("coin_toss", chains=8, draws=40, warmup=10, chains_per_task=4, cluster=client2,
                        store=tmp_path / "t.zarr", progress=False)
    timing = json.loads(trace["posterior"].attrs["dhmc_timing"])
    assert timing["sampling"] > 0 and timing["writing"] >= 0 and timing["worker_writing"] > 0, timing
    assert timing["sampling"] + timing["writing"] <= timing["total"], timing

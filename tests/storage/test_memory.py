"""The in-memory sink (``dhmc.storage.memory.MemorySink``): a ``draws="auto"`` run's arrays follow the draws taken,
not ``max_draws``, and what was written reads back the same whatever the growth."""

from __future__ import annotations

import numpy as np

from dhmc.geometry import Geometry
from dhmc.storage import schema
from dhmc.storage.memory import FIRST_SEGMENTS, MemorySink
from dhmc.types import BlockResult

GEOMETRY = Geometry(chains=8, draws=10_000, chains_per_task=4, draws_per_segment=10)
LAYOUT = schema.Layout(posterior={"x": schema.VariableSpec((3,), "float32", ("x_dim_0",))},
                       sample_stats={"diverging": schema.VariableSpec((), "bool", ())})


def _block(chunk: int, segment: int) -> BlockResult:
    value = np.float32(100 * chunk + segment)
    return BlockResult(position=np.zeros((4, 3), np.float32), seconds=0.0, compile_seconds=0.0, grad_evals=0, where={},
                       draws={"posterior": {"x": np.full((4, 10, 3), value, np.float32)},
                              "sample_stats": {"diverging": np.full((4, 10), segment % 2 == 1)}})


def _nbytes(sink: MemorySink) -> int:
    return sum(a.nbytes for group in sink.arrays.values() for a in group.values())


def test_an_auto_run_holds_the_segments_taken_and_keeps_every_draw_written():
    sink = MemorySink(LAYOUT, GEOMETRY, grow=True)
    assert sink.capacity == FIRST_SEGMENTS * 10 and _nbytes(sink) == 8 * sink.capacity * (12 + 1)  # not 10,000
    for segment in range(9):  # grows by doubling to 160 draws
        for chunk in (1, 0):
            sink.write(chunk, segment, _block(chunk, segment))
    assert sink.capacity == 160
    x = sink.arrays["posterior"]["x"]
    assert x[0, 85, 0] == 8 and x[5, 0, 2] == 100 and np.isnan(x[0, 90:]).all()
    sink.resize(Geometry(chains=8, draws=90, chains_per_task=4, draws_per_segment=10), {})
    tree = sink.finish({"run": "r"})
    assert tree["posterior"].sizes["draw"] == 90 and tree["posterior"].attrs["run"] == "r"
    np.testing.assert_array_equal(tree["posterior"]["x"].values[:4, ::10, 0], np.tile(np.arange(9.0), (4, 1)))
    np.testing.assert_array_equal(tree["sample_stats"]["diverging"].values[4, ::10], np.arange(9) % 2 == 1)


def test_an_auto_run_that_reaches_max_draws_returns_all_of_them():
    geometry = Geometry(chains=8, draws=50, chains_per_task=4, draws_per_segment=10)
    sink = MemorySink(LAYOUT, geometry, grow=True)
    for segment in range(5):
        for chunk in (0, 1):
            sink.write(chunk, segment, _block(chunk, segment))
    tree = sink.finish({})
    assert sink.capacity == 50 and tree["posterior"].sizes["draw"] == 50
    assert not np.isnan(tree["posterior"]["x"].values).any()


def test_a_fixed_draws_run_holds_its_draws_from_the_start():
    geometry = Geometry(chains=8, draws=30, chains_per_task=4, draws_per_segment=10)
    assert MemorySink(LAYOUT, geometry).capacity == 30


def test_a_run_whose_draws_cannot_fit_in_memory_is_refused_before_any_cluster(monkeypatch):
    """4096 chains x 10^6 draws of 1000 floats (15 TiB) without a store: one line with the size and the fix, in
    well under a cluster's start (the embedded cluster would be the first thing started)."""
    import time

    import jax.numpy as jnp
    import pytest

    import dhmc
    from dhmc.distributed import startup

    monkeypatch.setattr(startup.Startup, "__init__", lambda *a, **k: pytest.fail("a cluster was started"))
    t = time.perf_counter()
    with pytest.raises(ValueError, match=r"^the draws would take 1533\d\.\d GiB in memory \(4096 chains x 1000000 "
                                         r"draws\), more than the .* GiB free: give store="):
        dhmc.sample(lambda p: -0.5 * jnp.sum(p["x"] ** 2), init={"x": jnp.zeros(1000)}, chains=4096, draws=10**6,
                    progress=False)
    assert time.perf_counter() - t < 30

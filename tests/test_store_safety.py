"""A store is never lost or mixed: killed drivers at fixed points, a second writer, another model, bad blocks.

The driver runs as a real subprocess whose script stops it (``os._exit``, no clean-up) at a fixed
point of a block's write: after the worker wrote the block but before the driver marked it done,
right after marking it done, and after warmup was saved but before any draw. Each store then
resumes bitwise to an undisturbed run.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
import time

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr
import zarr

import dhmc

KW = dict(chains=32, draws=12500, warmup=60, seed=3, chains_per_task=8, progress=False)  # 4 x 4 blocks

DRIVER = textwrap.dedent("""
    import os, sys
    import dhmc
    from dhmc.distributed import runner
    from dhmc.storage import sinks

    store, point, after = sys.argv[1], sys.argv[2], int(sys.argv[3])
    cluster = sys.argv[4] if len(sys.argv) > 4 else None  # a scheduler's address; else the embedded cluster
    calls = [0]
    write, flush = sinks.StoreSink.write, sinks.StoreSink.flush

    def die(self):
        print(int(self.flags.done[...].sum()), flush=True)  # the flags on disk now
        os._exit(9)

    def stop_in_write(self, chunk, segment, result):
        calls[0] += 1
        if point == "before-done" and calls[0] == after:
            die(self)  # the worker wrote this block; the driver dies before marking it done
        write(self, chunk, segment, result)

    def stop_after_flush(self):
        flush(self)
        if point == "after-done" and calls[0] >= after:
            die(self)  # the driver dies right after marking a batch done

    sinks.StoreSink.write, sinks.StoreSink.flush = stop_in_write, stop_after_flush
    if point == "before-sampling":
        runner.Runner.sample = lambda *a, **k: os._exit(9)
    dhmc.sample("gaussian_2d", store=store, cluster=cluster, **{kw})
""").replace("{kw}", repr(KW))


def _done(path) -> np.ndarray:
    return zarr.open_group(str(path), mode="r")["dhmc/done"][...]


def _same(a, b) -> bool:
    a, b = (xr.open_datatree(p, engine="zarr", consolidated=False) for p in (a, b))
    return all(np.array_equal(a[g][v].values, b[g][v].values) for g in ("posterior", "sample_stats")
               for v in a[g].data_vars)


@pytest.fixture(scope="module")
def reference(client2, tmp_path_factory):
    """The undisturbed run, on the session's cluster: bitwise the embedded cluster's draws
    (``test_driver_compiled_executables_give_bitwise_the_same_draws``), without starting one more."""
    path = tmp_path_factory.mktemp("ref") / "ref.zarr"
    dhmc.sample("gaussian_2d", store=path, cluster=client2, **KW)
    return path


@pytest.mark.parametrize("point, after", [("before-done", 3), pytest.param("after-done", 5, marks=pytest.mark.slow),
                                          pytest.param("before-sampling", 0, marks=pytest.mark.slow)])
def test_a_driver_killed_at_a_fixed_point_of_a_write_resumes_bitwise(tmp_path, client2, reference, point, after):
    """The killed driver runs on the session's cluster, which outlives it as a user's cluster would (no embedded
    cluster to start): a block of its still running when it dies is never marked done, and once the resume owns the
    store it may not write there at all. test_workers_die_with_a_driver_killed_by_sigkill_and_leave_no_folders kills
    an embedded cluster's driver."""
    store = tmp_path / "killed.zarr"
    run = subprocess.run([sys.executable, "-c", DRIVER, str(store), point, str(after), client2.scheduler.address],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 9, run.stderr[-2000:]
    done = _done(store)
    on_disk = int(run.stdout.split()[-1]) if point != "before-sampling" else 0
    assert done.sum() == on_disk and (on_disk < after if point == "before-done" else on_disk >= after), done
    dhmc.resume(store, cluster=client2, progress=False)  # the dead driver's lock is stale: taken over
    assert _done(store).all()
    assert _same(reference, store)


@pytest.mark.slow
def test_a_second_run_on_a_store_being_written_is_refused(tmp_path):
    store, outcome = tmp_path / "busy.zarr", {}
    kw = dict(KW, draws=50000)
    thread = threading.Thread(target=lambda: outcome.setdefault("trace", dhmc.sample("gaussian_2d", store=store,
                                                                                     **kw)))
    thread.start()
    try:
        deadline = time.monotonic() + 300
        while not (store / "dhmc").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(dhmc.StoreLockedError, match="in use by a dhmc run"):
            dhmc.sample("gaussian_2d", store=store, overwrite=True, **KW)
        with pytest.raises(dhmc.StoreLockedError, match="in use by a dhmc run"):
            dhmc.resume(store, progress=False)
    finally:
        thread.join(600)
    assert "trace" in outcome and _done(store).all(), "the first run was disturbed"


@pytest.mark.slow
def test_resume_refuses_another_model_or_data_unless_forced(tmp_path):
    def logdensity(p, centre=1.0):
        return -0.5 * jnp.sum((p["x"] - centre) ** 2)

    store = tmp_path / "model.zarr"
    dhmc.sample(logdensity, init={"x": jnp.zeros(2)}, store=store, **KW)
    with pytest.raises(dhmc.ModelMismatchError, match="another model or other data"):
        dhmc.resume(store, target=lambda p: logdensity(p, centre=2.0), init={"x": jnp.zeros(2)}, progress=False)
    dhmc.resume(store, target=logdensity, init={"x": jnp.zeros(2)}, progress=False)  # the same one: fine
    root = zarr.open_group(str(store), mode="r+")
    root.attrs["dhmc_versions"] = {**root.attrs["dhmc_versions"], "jax": "0.0.1"}
    with pytest.raises(dhmc.ModelMismatchError, match=r"jax 0\.0\.1 -> "):
        dhmc.resume(store, target=logdensity, init={"x": jnp.zeros(2)}, progress=False)
    dhmc.resume(store, target=logdensity, init={"x": jnp.zeros(2)}, progress=False, force=True)


def test_a_block_of_the_wrong_shape_is_never_marked_done(tmp_path):
    from dhmc.distributed.spec import geometry_for, layout_for
    from dhmc.models import example
    from dhmc.storage import zarr_
    from dhmc.storage.sinks import StoreSink
    from dhmc.types import BlockResult

    model = example("gaussian_2d").build()
    layout = layout_for(model)
    geometry = geometry_for(model, layout, 16, 40, 8, gpu=False)
    root = zarr_.create_store(tmp_path / "s.zarr", layout, geometry, model.dim, model.dtype,
                              {"inference_library": "dhmc"})
    sink = StoreSink(root, str(tmp_path / "s.zarr"), layout, geometry, "run")
    block = {"posterior": {"x": np.zeros((8, geometry.draws_per_segment, 2), np.float32)},
             "sample_stats": {k: np.zeros((8, geometry.draws_per_segment, *s.shape), s.dtype)
                              for k, s in layout.sample_stats.items()},
             "position": np.zeros((8, 2), np.float32)}
    written = sink.destination(0, 0).write(block)
    result = lambda shapes: BlockResult(position=block["position"], seconds=0.0, compile_seconds=0.0, grad_evals=0,
                                        where={}, written=shapes)
    sink.write(0, 0, result(written))
    wrong = dict(written, **{"posterior/x": (8, geometry.draws_per_segment - 1, 2)})
    with pytest.raises(zarr_.StoreError, match="wrong shape for posterior/x"):
        sink.write(1, 0, result(wrong))
    with pytest.raises(zarr_.StoreError, match="wrong shape"):
        sink.destination(1, 0).write({**block, "position": np.zeros((7, 2), np.float32)})
    sink.flush()
    assert _done(tmp_path / "s.zarr").tolist()[0][0] == 1 and _done(tmp_path / "s.zarr").sum() == 1

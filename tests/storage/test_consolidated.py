"""A finished store is consolidated: ``xarray.open_datatree`` opens it without a warning, with its final sizes.

Three ways a run ends: fixed draws, ``draws="auto"`` stopped early (the store trimmed), a store
extended and resumed. An extend drops the consolidated metadata before it changes shapes, so a
store between its extend and its resume is read right, by dhmc and by xarray.
"""

from __future__ import annotations

import json
import math
import warnings

import jax.numpy as jnp
import pytest
import xarray as xr
import zarr

import dhmc
from dhmc.distributed.continuation import continued_run

logdensity = lambda p: -0.5 * jnp.sum(p["x"] ** 2)  # noqa: E731
INIT = {"x": jnp.zeros(2)}
AUTO = dict(init=INIT, chains=8, chains_per_task=4, warmup=0, seed=4, kernel="hmc", adapt=False,
            step_size=math.pi / 32, num_steps=16, draws="auto", target_ess=100, max_draws=1000, progress=False)


def _open_quietly(path) -> xr.DataTree:
    """``xarray.open_datatree`` as a user calls it (consolidated metadata if any), every warning an error."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tree = xr.open_datatree(str(path), engine="zarr")
        tree.load()
    return tree


def _consolidated(path) -> bool:
    return zarr.open_group(str(path), mode="r").metadata.consolidated_metadata is not None


def test_a_fixed_draws_store_opens_consolidated_without_warnings(dhmc_store):
    assert _consolidated(dhmc_store)
    tree = _open_quietly(dhmc_store)
    assert tree["posterior"]["p"].shape == (8, 10, 2) and tree["sample_stats"].sizes["draw"] == 10
    assert json.loads(tree["posterior"].attrs["dhmc_run_spec"])["draws"] == 10  # the final attrs, in every group


def test_a_stopped_auto_store_opens_trimmed_without_warnings(client2, tmp_path):
    path = tmp_path / "auto.zarr"
    dhmc.sample(logdensity, cluster=client2, store=path, **AUTO)
    tree = _open_quietly(path)
    draws = tree["posterior"].sizes["draw"]
    assert draws < AUTO["max_draws"] and tree["sample_stats"].sizes["draw"] == draws
    assert tree["posterior"]["x"].shape == (8, draws, 2) and not tree["posterior"]["x"].isnull().any()
    assert json.loads(tree.attrs["dhmc_run_spec"])["draws"] == draws and "draws" not in tree.attrs["dhmc_layout"]
    assert tree["dhmc"]["done"].all() and tree["dhmc"]["done"].shape[1] == tree["dhmc"]["position"].shape[1]


def test_an_extended_store_is_read_right_before_and_after_its_resume(dhmc_store, client2):
    continued_run(dhmc_store, more_draws=5)  # an extend whose run has not started (or was interrupted)
    assert not _consolidated(dhmc_store)  # no stale consolidated metadata of 10 draws
    assert dhmc.open_trace(dhmc_store)["posterior"]["p"].shape == (8, 15, 2)
    resumed = dhmc.resume(dhmc_store, cluster=client2, progress=False)
    assert resumed["posterior"]["p"].shape == (8, 15, 2)
    assert _consolidated(dhmc_store)
    tree = _open_quietly(dhmc_store)
    assert tree["posterior"]["p"].shape == (8, 15, 2) and list(tree["posterior"]["draw"].values) == list(range(15))
    assert not tree["posterior"]["p"].isnull().any()
    assert json.loads(tree["sample_stats"].attrs["dhmc_run_spec"])["draws"] == 15


def test_arviz_takes_a_finished_store_without_warnings(dhmc_store):
    import arviz as az

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        idata = az.InferenceData.from_datatree(xr.open_datatree(str(dhmc_store), engine="zarr"))
    assert idata.posterior["p"].shape == (8, 10, 2)


def test_an_extend_interrupted_mid_resize_is_completed_when_the_store_is_opened(dhmc_store, client2, monkeypatch):
    from dhmc.storage import rewrite

    calls = []

    def fail_on_the_second(root, group, *args):  # the posterior resized, then the process "dies"
        calls.append(group)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return resize_draws(root, group, *args)

    resize_draws = rewrite._resize_draws
    monkeypatch.setattr(rewrite, "_resize_draws", fail_on_the_second)
    with pytest.raises(KeyboardInterrupt):
        continued_run(dhmc_store, more_draws=5)
    monkeypatch.undo()
    root = zarr.open_group(str(dhmc_store), mode="r")
    assert json.loads(root.attrs["dhmc_run_spec"])["draws"] == 10 and rewrite.RESIZING in root.attrs
    resumed = dhmc.resume(dhmc_store, cluster=client2, progress=False)  # completes the extend, then samples it
    assert resumed["posterior"]["p"].shape == (8, 15, 2) and not resumed["posterior"]["p"].isnull().any()
    assert resumed["sample_stats"]["lp"].shape == (8, 15)
    root = zarr.open_group(str(dhmc_store), mode="r")
    assert json.loads(root.attrs["dhmc_run_spec"])["draws"] == 15 and rewrite.RESIZING not in root.attrs
    assert "draws" not in root.attrs["dhmc_layout"]

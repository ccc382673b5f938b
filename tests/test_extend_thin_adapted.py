"""Runs built on runs: thinning, extending a finished store, and starting from another run's adaptation."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from mc_checks import within_mc_error

import dhmc
from dhmc.distributed import warmup
from dhmc.storage import zarr_


def test_thinning_keeps_every_kth_transition_bitwise(client2):
    common = dict(chains=16, warmup=100, chains_per_task=8, cluster=client2, progress=False)
    full = dhmc.sample("gaussian_2d", draws=150, **common)
    thin = dhmc.sample("gaussian_2d", draws=50, thinning=3, **common)
    np.testing.assert_array_equal(thin["posterior"]["x"].values, full["posterior"]["x"].values[:, 2::3])
    stats, every = thin["sample_stats"], full["sample_stats"]
    np.testing.assert_array_equal(stats["lp"].values, every["lp"].values[:, 2::3])
    steps = every["n_steps"].values.reshape(16, 50, 3).sum(-1)
    np.testing.assert_array_equal(stats["n_steps"].values, steps)  # the cost of the three transitions
    np.testing.assert_allclose(stats["acceptance_rate"].values,
                               every["acceptance_rate"].values.reshape(16, 50, 3).mean(-1), rtol=1e-5)
    assert json.loads(thin.attrs["dhmc_run_spec"])["thinning"] == 3


def test_extend_is_bitwise_one_longer_run(client2, tmp_path):
    """256 chains in one block: 51-draw segments, the last of 50: extended, it is sampled again in full, and a
    third segment is added (of 51 draws: one program of 51 iterations serves all three, compiled once)."""
    common = dict(chains=256, warmup=100, chains_per_task=256, cluster=client2, progress=False)
    path = tmp_path / "run.zarr"
    dhmc.sample("gaussian_2d", draws=101, store=path, **common)
    assert json.loads(zarr_.open_store(path)[0].attrs["dhmc_run_spec"])["draws_per_segment"] == 51
    extended = dhmc.extend(path, 52, cluster=client2, progress=False)
    longer = dhmc.sample("gaussian_2d", draws=153, **common)  # its own segments: 77 and 76 draws
    assert json.loads(longer.attrs["dhmc_run_spec"])["draws_per_segment"] == 77
    assert extended["posterior"].sizes["draw"] == 153
    for group in ("posterior", "sample_stats"):
        for name in longer[group].data_vars:
            np.testing.assert_array_equal(extended[group][name].values, longer[group][name].values, err_msg=name)
    assert json.loads(extended.attrs["dhmc_run_spec"])["draws"] == 153
    root, _ = zarr_.open_store(path)
    assert zarr_.blocks_done(root).all() and root["posterior/x"].shape[1] == 153
    assert root["dhmc/done"].shape == (1, 3)  # one chunk of chains, three segments of 51 draws now


@pytest.fixture(scope="module")
def auto_run(client2, tmp_path_factory):
    """A finished store of the default warmup="auto" (32 chains in two chunks), and the run's trace; tests that change
    the store take a copy (:func:`_copy`)."""
    path = tmp_path_factory.mktemp("auto") / "auto.zarr"
    trace = dhmc.sample("gaussian_2d", draws=50, chains=32, chains_per_task=16, store=path, cluster=client2,
                        progress=False)
    return trace, path


def _copy(auto_run, tmp_path):
    path = tmp_path / "run.zarr"
    shutil.copytree(auto_run[1], path)
    return path


def test_a_run_with_automatic_warmup_extends(auto_run, client2, tmp_path):
    """The default warmup="auto": its finished store's warmup record (JSON text) is read back by extend."""
    extended = dhmc.extend(_copy(auto_run, tmp_path), 10, cluster=client2, progress=False)
    assert extended["posterior"]["x"].shape == (32, 60, 2) and not extended["posterior"]["x"].isnull().any()
    np.testing.assert_array_equal(extended["posterior"]["x"].values[:, :50], auto_run[0]["posterior"]["x"].values)
    history = json.loads(extended.attrs["dhmc_warmup"])
    assert warmup.adjusted_iterations(history) == json.loads(extended.attrs["dhmc_run_spec"])["warmup"] < 1000


def test_extend_refuses_an_unfinished_store_and_bad_draws(auto_run, client2, tmp_path):
    path = _copy(auto_run, tmp_path)
    with pytest.raises(ValueError, match="draws must be a positive integer"):
        dhmc.extend(path, 0, cluster=client2)
    root, _ = zarr_.open_store(path)
    root["dhmc/done"][1, 0] = 0
    with pytest.raises(zarr_.StoreError, match="not finished: dhmc resume"):
        dhmc.extend(path, 10, cluster=client2)
    root, _ = zarr_.open_store(path)
    assert json.loads(root.attrs["dhmc_run_spec"])["draws"] == 50 and root["posterior/x"].shape[1] == 50  # unchanged


@pytest.mark.slow
def test_extend_from_the_command_line(client2, tmp_path):
    path = tmp_path / "coin.zarr"
    first = dhmc.sample("coin_toss", chains=32, draws=60, warmup=60, store=path, cluster=client2, progress=False)
    before = first["posterior"]["p"].values.copy()
    out = subprocess.run([sys.executable, "-m", "dhmc", "extend", str(path), "--draws", "40", "--no-progress"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "32 chains x 100 draws" in out.stdout
    after = dhmc.open_trace(path)["posterior"]["p"].values
    np.testing.assert_array_equal(after[:, :60], before)
    assert np.isfinite(after).all()


# The dense case runs quick, the diagonal one (the same parameters carried over) in the slow suite.
@pytest.mark.parametrize("dense_mass", [pytest.param(False, marks=pytest.mark.slow), True], ids=["diag", "dense"])
def test_adapted_from_reuses_step_size_length_and_mass_matrix(client2, tmp_path, dense_mass):
    source = tmp_path / "source.zarr"
    dhmc.sample("gaussian_2d", chains=64, draws=20, warmup=300, dense_mass=dense_mass, store=source,
                cluster=client2, progress=False)
    adapted = zarr_.open_store(source)[0].attrs["dhmc_params"]
    path = tmp_path / "again.zarr"
    tree = dhmc.sample("gaussian_2d", chains=64, draws=300, warmup=100, adapted_from=source, store=path,
                       cluster=client2, progress=False)
    np.testing.assert_allclose(tree["sample_stats"]["step_size"].values, adapted["step_size"], rtol=1e-6)
    assert zarr_.open_store(path)[0].attrs["dhmc_params"] == adapted  # not adapted again
    spec = json.loads(tree.attrs["dhmc_run_spec"])
    assert spec["adapted_from"] == str(source) and spec["adapt"] is False and spec["dense_mass"] is dense_mass
    x = tree["posterior"]["x"].values
    within_mc_error(x[..., 0], 5.0, 2.0)
    within_mc_error(x[..., 1], 5.0, 2.0)


@pytest.mark.slow
def test_adapted_from_a_store_of_another_size_is_refused(client2, tmp_path):
    source = tmp_path / "coin.zarr"
    dhmc.sample("coin_toss", chains=16, draws=20, warmup=50, store=source, cluster=client2, progress=False)
    with pytest.raises(ValueError, match="mass matrix for 2 dimensions, the model has 10"):
        dhmc.sample("eight_schools", chains=16, draws=20, adapted_from=source, cluster=client2, progress=False)


@pytest.mark.slow
def test_adapted_from_a_run_in_other_coordinates_is_refused(client2, tmp_path):
    """A metric adapted as written is not one for the Laplace-whitened (or non-centred) coordinates of the same
    model, though it has as many dimensions."""
    from tests.models.test_numpyro_ import SIGMA, Y, centred

    source, common = tmp_path / "centred.zarr", dict(model_args=(SIGMA, Y), chains=16, draws=20, cluster=client2,
                                                     progress=False)
    dhmc.sample(centred, warmup=50, store=source, **common)
    for option, theirs in (({"laplace": True}, "laplace=['theta'] and noncentered=False"),
                           ({"noncentered": True}, "laplace=False and noncentered=True")):
        with pytest.raises(ValueError, match=re.escape(f"was adapted with laplace=False and noncentered=False, this "
                                                       f"run has {theirs}: its mass matrix is in other coordinates")):
            dhmc.sample(centred, adapted_from=source, **common, **option)


# Slow: the quick suite keeps the warmup draws of an automatic warmup, into a store, in the next test.
@pytest.mark.slow
@pytest.mark.parametrize("store", [False, True], ids=["memory", "store"])
def test_save_warmup_keeps_every_warmup_draw_and_changes_no_draw(client2, tmp_path, store):
    common = dict(chains=32, draws=50, warmup=200, chains_per_task=16, cluster=client2, progress=False)
    path = tmp_path / "w.zarr" if store else None
    kept = dhmc.sample("gaussian_2d", save_warmup=True, store=path, **common)
    plain = dhmc.sample("gaussian_2d", **common)
    warm = kept["warmup_posterior"]["x"]
    assert warm.dims == ("chain", "draw", "axis") and warm.shape == (32, 200, 2)
    assert np.isfinite(warm.values).all()
    np.testing.assert_array_equal(kept["posterior"]["x"].values, plain["posterior"]["x"].values)
    assert abs(warm.values[:, -50:].mean() - 5.0) < 0.5  # the last rounds are in the posterior (mean 5)
    if store:
        np.testing.assert_array_equal(zarr_.open_store(path)[0]["dhmc/warmup_position"][...], warm.values[:, -1])
        np.testing.assert_array_equal(dhmc.open_trace(path)["warmup_posterior"]["x"].values, warm.values)


@pytest.mark.parametrize("store", [pytest.param(False, marks=pytest.mark.slow), True], ids=["memory", "store"])
def test_save_warmup_with_auto_warmup_keeps_the_iterations_it_ran(auto_run, client2, tmp_path, store):
    """Room is made for max_warmup (1000) iterations; the group is cut to those the automatic warmup ran."""
    common = dict(chains=32, draws=50, chains_per_task=16, cluster=client2, progress=False)
    path = tmp_path / "a.zarr" if store else None
    kept = dhmc.sample("gaussian_2d", save_warmup=True, store=path, **common)
    plain = auto_run[0]  # the same run without save_warmup
    iterations = warmup.adjusted_iterations(json.loads(kept["posterior"].attrs["dhmc_warmup"]))
    assert 3 * warmup.AUTO_ROUND_AFTER_COLD <= iterations < 1000  # three adjusted rounds at the least (the cold
    # phase's steps are not kept: they are unadjusted)
    warm = kept["warmup_posterior"]["x"]
    assert warm.shape == (32, iterations, 2) and np.isfinite(warm.values).all()
    np.testing.assert_array_equal(kept["posterior"]["x"].values, plain["posterior"]["x"].values)
    if store:
        np.testing.assert_array_equal(dhmc.open_trace(path)["warmup_posterior"]["x"].values, warm.values)

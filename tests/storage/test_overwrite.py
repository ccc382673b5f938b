"""``overwrite=True`` replaces a dhmc store or an empty folder, and nothing else: no silent loss."""

from __future__ import annotations

import json

import numpy as np
import pytest
import zarr

import dhmc
from dhmc.storage.lock import StoreLock
from dhmc.storage.zarr_ import StoreError, check_writable, is_dhmc_store

REFUSED = "exists and is not a dhmc store; refusing to overwrite it: remove it yourself or choose another path"


def test_a_real_run_overwrites_a_dhmc_store(dhmc_store, client2):
    assert is_dhmc_store(dhmc_store)
    with pytest.raises(FileExistsError, match="already exists; pass overwrite=True"):
        check_writable(dhmc_store, overwrite=False)
    trace = dhmc.sample("coin_toss", chains=8, draws=10, warmup=10, seed=7, chains_per_task=4, cluster=client2,
                        store=dhmc_store, overwrite=True, progress=False)
    spec = json.loads(zarr.open_group(str(dhmc_store), mode="r").attrs["dhmc_run_spec"])
    assert spec["seed"] == 7
    assert np.array_equal(dhmc.open_trace(dhmc_store)["posterior"]["p"].values, trace["posterior"]["p"].values)


def test_a_folder_with_a_users_file_is_refused_and_kept(tmp_path):
    folder = tmp_path / "results"
    folder.mkdir()
    (folder / "thesis.tex").write_text("years of work")
    with pytest.raises(StoreError) as info:
        dhmc.sample("coin_toss", chains=8, draws=10, warmup=10, store=folder, overwrite=True, progress=False)
    assert str(info.value) == f"{folder} {REFUSED}"
    assert (folder / "thesis.tex").read_text() == "years of work"


def test_a_zarr_group_not_written_by_dhmc_is_refused(tmp_path):
    path = tmp_path / "other.zarr"
    zarr.open_group(str(path), mode="w-").attrs["inference_library"] = "someone else"
    with pytest.raises(StoreError, match=REFUSED):
        check_writable(path, overwrite=True)
    assert (path / "zarr.json").exists()


def test_a_file_is_refused(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(StoreError, match=REFUSED):
        check_writable(path, overwrite=True)
    assert path.read_text() == "a,b\n1,2\n"


def test_an_empty_folder_or_a_new_path_may_be_written(tmp_path):
    (tmp_path / "empty").mkdir()
    check_writable(tmp_path / "empty", overwrite=True)
    check_writable(tmp_path / "new" / "coin.zarr", overwrite=False)


def test_a_store_locked_by_a_live_run_is_refused(dhmc_store, hold_lock):
    holder = hold_lock(dhmc_store)
    with pytest.raises(dhmc.StoreLockedError, match=f"pid {holder.pid}"):
        dhmc.sample("coin_toss", chains=8, draws=10, warmup=10, store=dhmc_store, overwrite=True, progress=False)
    with pytest.raises(dhmc.StoreLockedError):  # locked beats "already exists": that is what to wait for
        check_writable(dhmc_store, overwrite=False)
    assert dhmc.open_trace(dhmc_store)["posterior"]["p"].shape == (8, 10, 2)


def test_this_process_may_overwrite_a_store_it_has_locked(dhmc_store):
    with StoreLock(dhmc_store):
        check_writable(dhmc_store, overwrite=True)


@pytest.mark.parametrize("inner", ["posterior", "posterior/p", "dhmc/done", "new/run.zarr"])
def test_a_path_inside_a_dhmc_store_is_refused_and_the_store_kept(dhmc_store, inner):
    """``--out run.zarr/posterior --overwrite`` deleted the run's posterior: its groups carry the attribute that
    marks a dhmc store, and only the root is one."""
    before = dhmc.open_trace(dhmc_store)["posterior"]["p"].values.copy()
    assert not is_dhmc_store(dhmc_store / "posterior")
    with pytest.raises(StoreError, match=rf"^{dhmc_store / inner} is inside the dhmc store {dhmc_store}; choose a "
                                         r"path outside it$"):
        dhmc.sample("coin_toss", chains=8, draws=10, warmup=10, store=dhmc_store / inner, overwrite=True,
                    progress=False)
    np.testing.assert_array_equal(dhmc.open_trace(dhmc_store)["posterior"]["p"].values, before)

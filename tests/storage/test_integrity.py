"""A store checks itself before a run continues from it (``dhmc.storage.integrity``): a damaged done block is run
again by a resume, bitwise as it was; an extend is refused until then; an edited array is one line; ``dhmc summary``
says what is unfinished or damaged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr

import dhmc
from dhmc.cli import main
from dhmc.storage.zarr_ import StoreError


def _posterior(path) -> np.ndarray:
    return dhmc.open_trace(path)["posterior"]["p"].values.copy()


def _truncate(path: Path):
    path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])


def _inf_end_position(store: Path):
    zarr.open_group(str(store), mode="r+", use_consolidated=False)["dhmc/position"][0, 0] = np.inf


DAMAGES = {
    "a truncated chunk of draws": (lambda store: _truncate(store / "posterior/p/c/0/0/0"),
                                   "posterior/p chunk posterior/p/c/0/0/0 is 160 of 320 bytes"),
    "a deleted chunk of draws": (lambda store: (store / "sample_stats/lp/c/1/0").unlink(),
                                 "sample_stats/lp chunk sample_stats/lp/c/1/0 is missing"),
    # one file holds a segment's flags of every chunk: both blocks of segment 0 are run again
    "a truncated done flag": (lambda store: _truncate(store / "dhmc/done/c/0/0"), "its done flag unreadable"),
    "an end position that is not finite": (_inf_end_position, "dhmc/position holds a value that is not finite"),
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_block_is_found_refused_by_extend_and_run_again_by_resume(damage, dhmc_store, client2, caplog,
                                                                            capsys):
    before = _posterior(dhmc_store)
    spoil, what = DAMAGES[damage]
    spoil(dhmc_store)
    assert main(["summary", str(dhmc_store)]) == 1  # no table of damaged draws, but what to do
    assert capsys.readouterr().out.startswith("damaged: ")
    with pytest.raises(StoreError, match=r"^[12] block\(s\) of .* marked done are damaged \(the first, chunk \d "
                                         rf"segment 0: {what}\): dhmc resume .* runs them again, then extend it$"):
        dhmc.extend(dhmc_store, 10, cluster=client2, progress=False)
    with caplog.at_level("WARNING", logger="dhmc"):
        dhmc.resume(dhmc_store, cluster=client2, progress=False)
    assert "this resume runs them again" in caplog.text
    np.testing.assert_array_equal(_posterior(dhmc_store), before)  # bitwise: the block ran again from its start
    capsys.readouterr()
    assert main(["summary", str(dhmc_store)]) == 0
    assert "damaged" not in capsys.readouterr().out


def test_an_array_edited_after_the_run_is_one_line(dhmc_store, client2):
    meta = dhmc_store / "sample_stats/n_steps/zarr.json"
    doc = json.loads(meta.read_text())
    doc["data_type"] = "int64"
    meta.write_text(json.dumps(doc))
    with pytest.raises(StoreError, match=r"is broken: sample_stats/n_steps is int64\[8, 10\] where its run spec says "
                                         r"int32\[8, 10\]; it was changed after dhmc wrote it"):
        dhmc.resume(dhmc_store, cluster=client2, progress=False)


def test_summary_of_an_unfinished_run_says_how_much_is_done(dhmc_store, capsys):
    zarr.open_group(str(dhmc_store), mode="r+", use_consolidated=False)["dhmc/done"][1, 0] = 0
    assert main(["summary", str(dhmc_store)]) == 0
    assert f"unfinished: 1 of 2 blocks done (the rest read as NaN); dhmc resume {dhmc_store} finishes it" in \
        capsys.readouterr().out

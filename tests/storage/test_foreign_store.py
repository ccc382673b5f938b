"""What a store from elsewhere may make dhmc do: name a model, never import it unasked."""

from __future__ import annotations

import json
import sys

from dhmc import cli
from dhmc.storage import zarr_

PAYLOAD = """
import pathlib
pathlib.Path("ran.txt").write_text("the store's module ran")

def model(p):
    return 0.0
"""


def test_resume_imports_the_module_a_store_names_only_when_the_user_names_it(dhmc_store, tmp_path, monkeypatch,
                                                                              capsys):
    root, _ = zarr_.open_store(dhmc_store)
    spec = json.loads(root.attrs["dhmc_run_spec"])
    root.attrs["dhmc_run_spec"] = json.dumps({**spec, "model": "payload:model"})
    (tmp_path / "payload.py").write_text(PAYLOAD)  # beside the store, in the working directory
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "payload", raising=False)
    for command in (["resume", str(dhmc_store)], ["extend", str(dhmc_store), "--draws", "5"]):
        assert cli.main(command) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert "'payload:model', which continuing it imports and runs" in line and "--model payload:model" in line
        assert not (tmp_path / "ran.txt").exists() and "payload" not in sys.modules
    cli.main(["resume", str(dhmc_store), "--model", "payload:model", "--no-progress"])  # confirmed: imported
    assert (tmp_path / "ran.txt").exists()
    monkeypatch.delitem(sys.modules, "payload", raising=False)

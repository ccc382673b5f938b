"""Smoke test: every example runs with ``--quick`` and writes a figure (PNG or GIF) into its ``--out``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SCRIPTS = sorted(p for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))


def test_the_examples_are_there():
    names = {p.stem for p in SCRIPTS}
    assert len(names) >= 5, names
    assert any("convergence" in n for n in names), names


@pytest.mark.slow  # the whole set takes about 10 minutes on 2 busy cores (1-4 minutes per example)
@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_example_runs_quick(script, tmp_path):
    out = tmp_path / script.stem
    env = {**os.environ, "JAX_PLATFORMS": os.environ.get("JAX_PLATFORMS", "cpu"), "MPLBACKEND": "Agg"}
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, str(script), "--quick", "--out", str(out)], cwd=EXAMPLES.parent,
                          env=env, capture_output=True, text=True, timeout=600)
    seconds = time.perf_counter() - t0
    log = f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    assert done.returncode == 0, f"{script.name} failed after {seconds:.0f} s:\n{log}"
    figures = [p for p in out.rglob("*") if p.suffix in (".png", ".gif")]
    assert figures, f"{script.name} wrote no PNG or GIF into {out}"
    if "convergence" in script.stem:
        assert any("convergence" in p.name and p.suffix == ".png" for p in figures)
    if script.stem == "hmc_animation":
        gifs = [p for p in figures if p.suffix == ".gif"]
        assert gifs and all(p.stat().st_size < 2_000_000 for p in gifs)

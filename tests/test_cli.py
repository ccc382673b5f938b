"""The command line: a real run, its summary, and one clear line for each bad input."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

DHMC = [sys.executable, "-m", "dhmc"]


def run(*args, timeout=300):
    return subprocess.run([*DHMC, *map(str, args)], capture_output=True, text=True, timeout=timeout)


def run_here(capsys, *args):
    """``dhmc args`` through ``dhmc.cli.main`` in this process, its exit status and output as :func:`run` gives
    them: ~0.1 s where a fresh process takes 2-3 s to import dhmc."""
    from dhmc import cli

    capsys.readouterr()
    try:
        code = cli.main([*map(str, args)])
    except SystemExit as e:  # argparse's own errors
        code = e.code
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["dhmc", *map(str, args)], code, out, err)


def digest(path: Path) -> str:
    h = hashlib.md5()
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(f.relative_to(path)).encode() + f.read_bytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def good_store(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "good.zarr"
    out = run("sample", "coin_toss", "--chains", 64, "--draws", 60, "--warmup", 60, "--out", path, "--no-progress")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "posterior means" in out.stdout
    noise = [line for line in out.stderr.splitlines() if not line.startswith("dhmc: dashboard")]
    assert not noise, "a clean run printed:\n" + "\n".join(noise[:40])  # no tracebacks, no CommClosedError
    return path


def test_models_lists_the_examples():
    out = run("models")
    assert out.returncode == 0
    for name in ("coin_toss", "harmonic_oscillator", "linear_acceleration", "gaussian_2d", "eight_schools"):
        assert name in out.stdout


@pytest.mark.slow
def test_summary_reports_diagnostics(good_store):
    out = run("summary", good_store)
    assert out.returncode == 0, out.stderr
    assert "r_hat" in out.stdout and "ess_bulk" in out.stdout and "nested_r_hat" in out.stdout
    assert "divergences:" in out.stdout and "E-BFMI" in out.stdout


@pytest.mark.parametrize("args, word", [
    (["sample", "no_such_model"], "no_such_model"),
    (["sample", "coin_toss", "--chains", "0"], "chains"),
    (["sample", "coin_toss", "--draws", "-5"], "draws"),
    (["sample", "coin_toss", "--warmup", "-1"], "warmup"),
    (["sample", "coin_toss", "--kernel", "bogus"], "bogus"),
    (["sample", "coin_toss", "--chains-per-task", "0"], "chains_per_task"),
    (["sample", "coin_toss", "--target-accept", "1.5"], "target_accept"),
    (["sample", "coin_toss", "--laplace", "nope"], "laplace names 'nope'"),
    (["sample", "coin_toss", "--laplace"], "laplace=True found no hierarchical site in 'coin_toss'"),
    pytest.param(["sample", "coin_toss", "--cluster", "tcp://127.0.0.1:1"], "127.0.0.1:1", marks=pytest.mark.slow),
    pytest.param(["sample", "coin_toss", "--cluster", "nonsense"], "cluster", marks=pytest.mark.slow),
])
def test_bad_input_gets_one_clear_line(tmp_path, capsys, args, word):
    # The first case and those that reach for a cluster run the real command in a process of its own; the others,
    # refused before any cluster, call its main() here.
    if args == ["sample", "no_such_model"] or "--cluster" in args:
        out = run(*args, "--out", tmp_path / "x.zarr", timeout=120)
    else:
        out = run_here(capsys, *args, "--out", tmp_path / "x.zarr")
    assert out.returncode == 2, out
    assert "Traceback" not in out.stderr
    lines = [line for line in out.stderr.splitlines() if line.startswith("dhmc: error:")]
    assert len(lines) == 1 and word.lower() in lines[0].lower(), out.stderr[-1000:]
    assert not (tmp_path / "x.zarr").exists()


@pytest.mark.slow
def test_existing_store_is_refused_and_untouched(good_store):
    before = digest(good_store)
    out = run("sample", "coin_toss", "--chains", 64, "--draws", 50, "--out", good_store)
    assert out.returncode == 2 and "exist" in out.stderr and "Traceback" not in out.stderr
    assert digest(good_store) == before


@pytest.mark.slow
def test_read_only_folder_is_refused_before_sampling(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        out = run("sample", "coin_toss", "--out", ro / "s.zarr", timeout=60)
    finally:
        ro.chmod(0o755)
    assert out.returncode == 2 and str(ro) in out.stderr and "Traceback" not in out.stderr


def test_resume_of_something_that_is_not_a_store(tmp_path, capsys):
    out = run("resume", tmp_path / "not_a_store.zarr")
    assert out.returncode == 2 and "not_a_store" in out.stderr and "Traceback" not in out.stderr
    (tmp_path / "plain").mkdir()
    out = run_here(capsys, "resume", tmp_path / "plain")
    assert out.returncode == 2 and "not a dhmc store" in out.stderr


@pytest.mark.slow
def test_resume_of_a_corrupted_store_says_what_is_broken(good_store, tmp_path):
    import shutil

    broken = tmp_path / "broken.zarr"
    shutil.copytree(good_store, broken)
    (broken / "posterior" / "p" / "zarr.json").write_text("{broken")
    out = run("resume", broken)
    assert out.returncode == 2 and "broken" in out.stderr and "posterior/p" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.slow
def test_resume_of_a_complete_store_changes_nothing(good_store):
    import xarray as xr

    before = xr.open_datatree(good_store, engine="zarr", consolidated=False)["posterior"]["p"].values
    out = run("resume", good_store, "--no-progress")
    assert out.returncode == 0, out.stderr[-1500:]
    after = xr.open_datatree(good_store, engine="zarr", consolidated=False)["posterior"]["p"].values
    assert np.array_equal(before, after)


def test_help_for_every_command(capsys):
    for cmd in ("sample", "resume", "summary", "models", "scale"):
        out = run(cmd, "--help") if cmd == "sample" else run_here(capsys, cmd, "--help")  # one in a process of its own
        assert out.returncode == 0 and "usage" in out.stdout


@pytest.mark.skipif(not hasattr(os, "geteuid"), reason="posix only")
def test_api_errors_name_the_problem():
    import jax.numpy as jnp

    import dhmc

    cases = [
        (dict(target=lambda p: jnp.nan * jnp.sum(p["x"]), init={"x": jnp.zeros(2)}), "finite"),
        (dict(target=lambda p: jnp.dot(p["x"], jnp.ones(3)), init={"x": jnp.zeros(2)}), "log density"),
        (dict(target=lambda p: p["x"], init={"x": jnp.zeros(2)}), "scalar"),
        (dict(target=lambda p: -jnp.sum(p["x"] ** 2), init={"x": jnp.zeros((5, 2))}), "init"),
        (dict(target=lambda p: -jnp.sum(p["x"] ** 2), init={"x": jnp.zeros(2)}, kernel="bogus"), "bogus"),
        (dict(target=42), "target"),
        (dict(target="coin_toss", chains=-1), "chains"),
        (dict(target="coin_toss", warmup=0), "warmup=0"),
    ]
    for kwargs, word in cases:
        # An unreachable scheduler: each error comes before dhmc connects, and no embedded cluster starts in the
        # background (one per case, each closed again in the background after the error) to be abandoned.
        kwargs = {"chains": 8, "draws": 10, "warmup": 10, "progress": False, "cluster": "tcp://127.0.0.1:1", **kwargs}
        with pytest.raises((ValueError, TypeError)) as info:
            dhmc.sample(**kwargs)
        message = str(info.value)
        assert word in message and len(message) < 600 and "\n" not in message, message

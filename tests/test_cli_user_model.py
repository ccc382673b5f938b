"""A user's own model from the command line: ``dhmc sample pkg.module:function --data --init``, and its resume."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from mc_checks import within_mc_error

MODULE = textwrap.dedent('''
    import jax.numpy as jnp
    import numpyro
    import numpyro.distributions as dist


    def shifted_gaussian(position, centre, scale):
        """Independent normals: mean ``centre``, sd ``scale``."""
        return -0.5 * jnp.sum(((position["x"] - centre) / scale) ** 2)


    def refusing(position, centre, scale):
        """Raises inside a JAX callback, as a model that checks its input on the host does."""
        import jax
        import numpy as np

        def check(x):
            if np.any(np.asarray(x) > -100.0):
                raise ValueError("my model refuses x > -100")

        jax.debug.callback(check, position["x"])
        return shifted_gaussian(position, centre, scale)


    def regression(x, y=None):
        slope = numpyro.sample("slope", dist.Normal(0.0, 10.0))
        with numpyro.plate("point", x.shape[0]):
            numpyro.sample("y", dist.Normal(slope * x, 1.0), obs=y)
''')


def dhmc_cli(cwd, *args, timeout=300):
    """The real command in another process, from ``cwd`` (where the user's module lies)."""
    return subprocess.run([sys.executable, "-m", "dhmc", *map(str, args)], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def dhmc_here(cwd, capsys, monkeypatch, *args):
    """The same command through ``dhmc.cli.main`` in this process, from ``cwd``: its exit status and output as
    :func:`dhmc_cli` gives them (a fresh process takes 1-3 s to import dhmc). The working directory, ``sys.path``
    and the user's module are put back afterwards."""
    from dhmc import cli

    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "path", list(sys.path))  # dhmc puts the working directory first to import the model
    monkeypatch.delitem(sys.modules, "mymodels", raising=False)
    capsys.readouterr()
    try:
        code = cli.main([*map(str, args)])
    except SystemExit as e:
        code = e.code
    finally:
        sys.modules.pop("mymodels", None)
    out, err = capsys.readouterr()
    return subprocess.CompletedProcess(["dhmc", *map(str, args)], code, out, err)


@pytest.fixture
def project(tmp_path):
    (tmp_path / "mymodels.py").write_text(MODULE)
    np.savez(tmp_path / "data.npz", centre=np.array([3.0, -1.0]), scale=np.array([0.5, 2.0]))
    (tmp_path / "init.json").write_text(json.dumps({"x": [0.0, 0.0]}))
    x = np.linspace(-1, 1, 20)
    (tmp_path / "points.json").write_text(json.dumps({"x": x.tolist(), "y": (2.0 * x).tolist()}))
    return tmp_path


@pytest.mark.slow
def test_a_log_density_with_data_and_init_and_its_resume(project):
    import dhmc
    from dhmc.storage import zarr_

    common = ["--data", "data.npz", "--init", "init.json", "--chains", 64, "--draws", 200, "--warmup", 200,
              "--chains-per-task", 32, "--no-progress"]
    out = dhmc_cli(project, "sample", "mymodels:shifted_gaussian", *common, "--out", "whole.zarr")
    assert out.returncode == 0, out.stderr[-2000:]
    whole = dhmc.open_trace(project / "whole.zarr")
    draws = whole["posterior"]["x"].values
    for i, (mean, sd) in enumerate([(3.0, 0.5), (-1.0, 2.0)]):
        within_mc_error(draws[..., i], mean, sd)
    assert json.loads(whole.attrs["dhmc_run_spec"])["model"] == "mymodels:shifted_gaussian"

    out = dhmc_cli(project, "sample", "mymodels:shifted_gaussian", *common, "--out", "cut.zarr")
    assert out.returncode == 0, out.stderr[-2000:]
    root, _ = zarr_.open_store(project / "cut.zarr")
    root["dhmc/done"][1, -1] = 0  # the last block of the second chunk: written again on resume
    refused = dhmc_cli(project, "resume", "cut.zarr", "--no-progress")  # a store does not import code unasked
    assert refused.returncode == 2 and "--model mymodels:shifted_gaussian" in refused.stderr, refused.stderr[-2000:]
    resumed = dhmc_cli(project, "resume", "cut.zarr", "--model", "mymodels:shifted_gaussian", "--no-progress")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    np.testing.assert_array_equal(dhmc.open_trace(project / "cut.zarr")["posterior"]["x"].values, draws)


@pytest.mark.slow
def test_a_numpyro_model_with_json_data_gets_plate_dims_and_log_likelihood(project):
    import dhmc

    out = dhmc_cli(project, "sample", "mymodels:regression", "--data", "points.json", "--log-likelihood",
                   "--chains", 32, "--draws", 100, "--warmup", 150, "--out", "reg.zarr")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "dhmc: dashboard http" in out.stderr  # the progress bar (tqdm), with tqdm's rate and its total:
    assert "dhmc warmup" in out.stderr and "dhmc sampling: 100%" in out.stderr and "chain-draws/s" in out.stderr
    tree = dhmc.open_trace(project / "reg.zarr")
    assert tree["log_likelihood"]["y"].dims == ("chain", "draw", "point")
    x = np.linspace(-1, 1, 20)
    sd = 1.0 / np.sqrt(np.sum(x**2) + 1e-2)  # conjugate: prior N(0, 10^2), unit noise
    mean = sd**2 * np.sum(x * 2.0 * x)
    within_mc_error(tree["posterior"]["slope"].values, mean, sd)


@pytest.mark.parametrize(("args", "message"), [
    (["nomodule:fn"], "cannot import the model 'nomodule:fn'"),
    (["mymodels:missing"], "has no attribute 'missing'"),
    (["coin_toss", "--data", "data.npz"], "--data and --init need a model given as pkg.module:function"),
    (["mymodels:shifted_gaussian", "--data", "nothere.npz"], "the data file nothere.npz does not exist"),
    (["mymodels:shifted_gaussian", "--data", "mymodels.py"], "must be .npz or .json"),
])
def test_bad_user_model_input_is_one_line(project, capsys, monkeypatch, args, message):
    if args == ["nomodule:fn"]:  # the real command, in a process of its own
        out = dhmc_cli(project, "sample", *args, "--out", "s.zarr", timeout=120)
    else:  # the others call its main() here
        out = dhmc_here(project, capsys, monkeypatch, "sample", *args, "--out", "s.zarr")
    assert out.returncode == 2, out.stderr[-2000:]
    assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not (project / "s.zarr").exists()


def test_a_model_that_raises_in_a_callback_gets_its_own_message(project):
    """XLA wraps it as "INTERNAL: CpuCallback error calling callback: Traceback ...": the model's words were lost."""
    # An unreachable scheduler: the driver's check of one chain's position raises before dhmc connects (with the
    # embedded cluster the process would wait at exit for one started in the background).
    out = dhmc_cli(project, "sample", "mymodels:refusing", "--data", "data.npz", "--init", "init.json", "--chains", 8,
                   "--draws", 10, "--warmup", 10, "--no-progress", "--cluster", "tcp://127.0.0.1:1", "--out", "r.zarr",
                   timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1].endswith(": the model raised inside a JAX callback: ValueError: my "
                                                        "model refuses x > -100"), out.stderr


def test_what_counts_as_a_model_reference():
    from dhmc.models.reference import is_reference

    assert is_reference("mypkg.models:logdensity") and is_reference("m:Outer.method")
    assert not is_reference("coin_toss") and not is_reference("python:schools")  # a name, a Python function
    assert not is_reference("python:test.<locals>.f") and not is_reference("a:b:c")

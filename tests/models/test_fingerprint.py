"""A model's fingerprint: the same in another process, different when data or code change."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
import pytest

import dhmc
from dhmc.models import EXAMPLES, LogDensityTarget, NumPyroTarget, example
from dhmc.models.examples import coin_toss_model
from dhmc.models.fingerprint import fingerprint, versions

REPO = Path(__file__).resolve().parents[2]

#: Models defined in a file, so that two fresh processes build the very same ones.
MODELS = '''
import jax.numpy as jnp
import numpy as np
from dhmc.models import EXAMPLES, LogDensityTarget, NumPyroTarget, example

DATA = np.linspace(-1.0, 2.0, 50)


def plain(p):
    return -0.5 * jnp.sum(p["x"] ** 2)


def with_data(p):
    return -0.5 * jnp.sum((p["x"][:, None] - DATA) ** 2)


def normal_model(y):
    import numpyro
    import numpyro.distributions as dist

    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


def targets(examples):
    found = {"plain": LogDensityTarget(plain, {"x": np.zeros(3)}),
             "with_data": LogDensityTarget(with_data, {"x": np.zeros(3)}),
             "numpyro": NumPyroTarget(normal_model, (jnp.asarray(DATA),))}
    return {**found, **{name: example(name) for name in examples}}
'''

PRINT = '''
import json, sys
sys.path.insert(0, sys.argv[1])
from models import targets
from dhmc.models.fingerprint import fingerprint
print(json.dumps({name: fingerprint(target.build()) for name, target in targets(sys.argv[2:]).items()}))
'''


def _start_a_subprocess(folder: Path, examples: list[str]) -> subprocess.Popen:
    """A fresh process printing the fingerprints of the models in ``folder/models.py``; its hash seed is not ours."""
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"
    env = {**os.environ, "PYTHONHASHSEED": seed, "JAX_PLATFORMS": "cpu",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([sys.executable, "-c", PRINT, str(folder), *examples], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _printed(proc: subprocess.Popen) -> dict:
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _here(folder: Path, examples: list[str]) -> dict:
    """The same fingerprints from this process (its own hash seed, and every model the tests built before)."""
    spec = importlib.util.spec_from_file_location(f"fingerprint_models_{folder.name}", folder / "models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return {name: fingerprint(target.build()) for name, target in module.targets(examples).items()}


# A fresh process pays 2-6 s to build each NumPyro model (initialize_model runs op by op, each op
# compiled): the quick run takes the file's own three models (one of them NumPyro's, with an observed and
# a constrained site), the slow one every example besides (eight_schools: a plate, a deterministic site).
# The second process is this one, which has traced other models and runs the subprocess's model file as
# another module (one fresh process fewer than two subprocesses).
@pytest.mark.parametrize("examples", [pytest.param([], id="own-models"),
                                      pytest.param(list(EXAMPLES), id="all-examples", marks=pytest.mark.slow)])
def test_the_same_model_has_the_same_fingerprint_in_two_processes(tmp_path, examples):
    (tmp_path / "models.py").write_text(MODELS)
    proc = _start_a_subprocess(tmp_path, examples)
    try:
        here = _here(tmp_path, examples)  # while the other process works
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    there = _printed(proc)
    assert set(there) == {"plain", "with_data", "numpyro", *examples}
    assert len(set(there.values())) == len(there)  # and no two of these models share one
    assert all(len(v) == 64 and int(v, 16) >= 0 for v in there.values())
    assert here == there


def test_changing_one_data_value_changes_it():
    data = np.linspace(0.0, 1.0, 20)
    changed = data.copy()
    changed[7] += 1e-6

    def closing_over(values):
        return LogDensityTarget(lambda p: -0.5 * jnp.sum((p["x"] - values) ** 2), {"x": np.zeros(20)}).build()

    assert fingerprint(closing_over(data)) == fingerprint(closing_over(data.copy()))
    assert fingerprint(closing_over(data)) != fingerprint(closing_over(changed))
    heads = lambda h: NumPyroTarget(coin_toss_model, model_kwargs={"heads": h}).build()
    assert fingerprint(heads((20, 30))) == fingerprint(example("coin_toss").build())
    assert fingerprint(heads((20, 30))) != fingerprint(heads((20, 31)))


def test_a_different_computation_changes_it_and_a_rewrite_does_not():
    def target(fn, template=None):
        return LogDensityTarget(fn, template if template is not None else {"x": np.zeros(2)}).build()

    base = fingerprint(target(lambda p: -0.5 * jnp.sum(p["x"] ** 2)))

    def same(position):  # another function, the same computation
        squares = position["x"] ** 2
        return -0.5 * jnp.sum(squares)

    assert fingerprint(target(same)) == base
    assert fingerprint(target(lambda p: -0.5 * jnp.sum(p["x"] ** 2) * 1.0001)) != base  # a literal
    assert fingerprint(target(lambda p: -jnp.sum(jnp.abs(p["x"])))) != base  # other operations
    assert fingerprint(target(lambda p: -0.5 * jnp.sum(p["x"] ** 2), {"x": np.zeros(3)})) != base  # dim
    assert fingerprint(target(lambda p: -0.5 * jnp.sum(p["y"] ** 2), {"y": np.zeros(2)})) != base  # names


def test_a_custom_gradient_is_part_of_it():
    def with_gradient(scale):
        @jax.custom_vjp
        def energy(x):
            return 0.5 * jnp.sum(x**2)

        energy.defvjp(lambda x: (energy(x), x), lambda x, g: (scale * g * x,))
        return LogDensityTarget(lambda p: -energy(p["x"]), {"x": np.zeros(2)}).build()

    assert fingerprint(with_gradient(1.0)) == fingerprint(with_gradient(1.0))
    assert fingerprint(with_gradient(1.0)) != fingerprint(with_gradient(2.0))


@pytest.mark.slow  # builds every example here (each NumPyro one op by op) to time its fingerprint
def test_it_is_fast_for_the_examples():
    models = [example(name).build() for name in EXAMPLES]
    fingerprint(models[0])  # the first trace in a process pays for some of JAX's own set-up
    for model in models:
        start = time.perf_counter()
        fingerprint(model)
        assert time.perf_counter() - start < 1.0


def test_versions():
    assert versions() == {"dhmc": dhmc.__version__, "jax": jax.__version__, "jaxlib": jaxlib.__version__}

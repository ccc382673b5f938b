"""Options that need a model's structure, asked of a log density behind a wrapper: one-line errors, no cluster."""

import pytest

import dhmc
from dhmc.models import by_reference

MAKE = '''
import numpy as np
from dhmc.models import LogDensityTarget

def make():
    return LogDensityTarget(lambda p: -0.5 * (p["x"] ** 2).sum(), {"x": np.zeros(2)}, name="quadratic")
'''

ASKED = [
    (dict(log_likelihood=True), r"log_likelihood=True needs a NumPyro or PyMC model with observed variables; "),
    (dict(predictive=True), r"predictive=True needs a NumPyro or PyMC model with observed variables; "),
    (dict(prior=10), r"prior=10 needs a NumPyro or PyMC model with observed variables; "),
    (dict(noncentered=True), r"noncentered=True needs a NumPyro or PyMC model; "),
    (dict(laplace=True), r"laplace=True picks a NumPyro or PyMC model's hierarchical variables; "),
]


@pytest.mark.parametrize("example", ["harmonic_oscillator", "gaussian_2d"])
@pytest.mark.parametrize(("options", "message"), ASKED)
def test_a_built_in_log_density_says_what_it_lacks(example, options, message):
    with pytest.raises(ValueError, match=message + f"'{example}' is"):
        dhmc.sample(example, chains=4, draws=5, warmup=5, cluster="tcp://127.0.0.1:1", **options)  # never reached


@pytest.mark.parametrize(("options", "message"), ASKED)
def test_a_log_density_by_reference_says_what_it_lacks(options, message, tmp_path, monkeypatch):
    (tmp_path / "quadratic_target.py").write_text(MAKE)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ValueError, match=message + "'quadratic_target:make' is"):
        dhmc.sample(by_reference("quadratic_target:make"), chains=4, draws=5, warmup=5, cluster="tcp://127.0.0.1:1",
                    **options)

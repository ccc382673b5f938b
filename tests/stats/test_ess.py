"""``dhmc.stats.ess_bulk`` / ``ess_tail`` against ArviZ 0.23's ``ess(method="bulk" / "tail")``, which they
reimplement in NumPy (no ArviZ, xarray or scipy import), vectorized over scalars; ``ess_sd`` from ArviZ's
``ess(method="mean")`` of the squared deviations, and against the spread of independent sds."""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

import arviz as az
import numpy as np
import pytest
import xarray as xr
from mc_checks import ar1

from dhmc.stats import ess_bulk, ess_sd, ess_tail

ESS = {"bulk": ess_bulk, "tail": ess_tail}


def _arviz(draws: np.ndarray, method: str) -> np.ndarray:
    dims = ("chain", "draw", *(f"dim_{i}" for i in range(draws.ndim - 2)))
    return np.asarray(az.ess(xr.Dataset({"x": (dims, draws)}), method=method)["x"].values, float)


def _datasets() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(20240601)
    with_nan = rng.normal(size=(4, 500, 3))
    with_nan[2, 17, 1] = np.nan
    with_inf = rng.normal(size=(4, 500))
    with_inf[1, 3] = np.inf
    one_constant_chain = rng.normal(size=(4, 500))
    one_constant_chain[0] = 1.5
    return {
        "iid normal": rng.normal(size=(4, 1000)),
        "AR(1) 0.9": ar1(rng, 0.9, (4, 1000)),
        "AR(1) 0.99": ar1(rng, 0.99, (4, 2000)),
        "AR(1) -0.7 (antithetic)": ar1(rng, -0.7, (4, 500)),
        "Cauchy": rng.standard_cauchy(size=(4, 1000)),
        "Poisson(2), many ties": rng.poisson(2.0, size=(4, 1000)).astype(float),
        "binary, 3% ones": (rng.random((4, 1000)) < 0.03).astype(float),
        "1 chain": rng.normal(size=(1, 1000)),
        "2 chains x 4 draws": rng.normal(size=(2, 4)),
        "odd draws": ar1(rng, 0.5, (3, 101)),
        "constant": np.full((4, 100), 2.0),
        "one constant chain": one_constant_chain,
        "a NaN draw (one of 3 scalars)": with_nan,
        "an infinite draw": with_inf,
        "chains that disagree": rng.normal(size=(4, 500)) + np.array([0.0, 0.0, 3.0, -3.0])[:, None],
        "(chains, draws, k)": ar1(rng, np.array([0.0, 0.5, 0.95]), (6, 300, 3)),
        "(chains, draws, k, m)": ar1(rng, np.array([[0.2, 0.8], [0.9, -0.5]]), (3, 200, 2, 2)),
        "float32": ar1(rng, 0.8, (4, 400)).astype(np.float32),
        "short, strongly autocorrelated": ar1(rng, rng.uniform(-0.99, 0.99, size=200), (3, 12, 200)),
    }


DATASETS = _datasets()


@pytest.mark.parametrize("method", ["bulk", "tail"])
@pytest.mark.parametrize("name", list(DATASETS))
def test_matches_arviz(name, method):
    draws = DATASETS[name]
    ours, theirs = ESS[method](draws), _arviz(draws, method)
    assert np.shape(ours) == draws.shape[2:]
    assert isinstance(ours, float) == (draws.ndim == 2)
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, equal_nan=True)


@pytest.mark.parametrize("method", ["bulk", "tail"])
def test_matches_arviz_on_many_short_chains(method):
    """Geyer's sequence cut short by the chain length, or by a non-positive pair early on: random AR(1) of
    few draws, negative autocorrelations included."""
    rng = np.random.default_rng(7)
    for chains, draws in [(1, 4), (1, 9), (2, 5), (2, 8), (3, 7), (4, 16), (5, 33)]:
        x = ar1(rng, rng.uniform(-0.99, 0.99, size=100), (chains, draws, 100))
        np.testing.assert_allclose(ESS[method](x), _arviz(x, method), rtol=1e-12, err_msg=f"{chains}x{draws}")


def test_undefined():
    """NaN for fewer than 4 draws per chain or a NaN draw; constant draws count as independent (ArviZ's)."""
    assert np.isnan(ess_bulk(np.ones((4, 3)))) and np.isnan(ess_tail(np.zeros((4, 3, 2)))).all()
    assert ess_bulk(np.ones((4, 9))) == ess_tail(np.ones((4, 9))) == 4 * 2 * 4  # the split chains' draws
    x = np.zeros((2, 10, 2))
    x[0, 0, 1] = np.nan
    assert np.array_equal(np.isnan(ess_bulk(x)), [False, True])


@pytest.mark.parametrize("name", [n for n in DATASETS if "nan" not in n and "inf" not in n and "constant" not in n])
def test_ess_sd_is_the_squared_deviations_ess_scaled_by_the_kurtosis(name):
    """... the kurtosis two standard errors up: the chains' (one chain's halves') means of the standardised
    fourth power spread as its estimate's error."""
    draws = np.asarray(DATASETS[name], float)
    squares = np.square(draws - draws.mean(axis=(0, 1)))
    fourth = np.square(squares) / squares.mean(axis=(0, 1)) ** 2
    if draws.shape[0] == 1:
        half = draws.shape[1] // 2
        fourth = np.concatenate([fourth[:, :half], fourth[:, -half:]])
    means = fourth.mean(axis=1)
    kurtosis = np.square(squares).mean(axis=(0, 1)) / squares.mean(axis=(0, 1)) ** 2 \
        + 2 * means.std(axis=0, ddof=1) / np.sqrt(len(means))
    expected = _arviz(squares, "mean") * 2 / (kurtosis - 1)
    np.testing.assert_allclose(ess_sd(DATASETS[name]), expected, rtol=1e-5 if draws.dtype == np.float32 else 1e-10)


def test_ess_sd_gives_the_error_of_a_heavy_tails_sd():
    """Independent Student-t draws (kurtosis 6): the sds of 400 ensembles spread as 1 / sqrt(2 ess_sd) says, where
    the bulk ESS (the draws' number) promises half that spread; constant draws count as independent."""
    rng = np.random.default_rng(3)
    sds, ess = [], []
    for _ in range(400):
        x = rng.standard_t(6.0, size=(32, 40))
        sds.append(x.std())
        ess.append(ess_sd(x))
    spread = np.std(sds) / np.mean(sds)
    assert 0.8 < spread * np.sqrt(2 * np.mean(ess)) < 1.4 and spread * np.sqrt(2 * 32 * 40) > 1.5
    assert ess_sd(np.ones((4, 9))) == 4 * 2 * 4 and np.isnan(ess_sd(np.ones((4, 3))))


def test_ess_sd_does_not_promise_a_sd_its_few_far_draws_cannot_give():
    """Independent draws, 1% of them 7 times wider (kurtosis 34): 64 chains x 20 draws hold some 13 far draws,
    whose number sets both the sd and the kurtosis read. The sd lies within twice the error ``1 / sqrt(2 ess_sd)``
    says in 92% of 1000 ensembles; with the kurtosis as read (no margin) in 83%."""
    rng = np.random.default_rng(5)
    true_sd = math.sqrt(0.99 + 0.01 * 49.0)
    misses = 0
    for _ in range(1000):
        x = rng.normal(size=(64, 20)) * np.where(rng.random((64, 20)) < 0.01, 7.0, 1.0)
        misses += abs(x.std() / true_sd - 1) > 2 / math.sqrt(2 * ess_sd(x))
    assert misses < 110


def test_the_monitor_reports_arviz_ess():
    """The monitor's ESS of each scalar (``draws="auto"``: of all the chains it looks at) is ArviZ's."""
    from dhmc.distributed.monitor import ConvergenceMonitor
    from dhmc.geometry import Geometry

    rng = np.random.default_rng(3)
    spec = SimpleNamespace(chains=16, target_ess=1000.0, geometry=Geometry(16, 100, 8, 50))
    monitor = ConvergenceMonitor(spec, sink=None)
    for segment in range(2):
        for chunk in range(2):
            x = ar1(rng, np.array([0.0, 0.9, -0.3]), (8, 50, 3)).astype(np.float32)
            monitor.add(chunk, segment, SimpleNamespace(head_draws={"x": x}))
    params = monitor.measure(2)["params"]
    for method in ("bulk", "tail"):
        reported = [params[f"x[{i}]"][f"ess_{method}"] for i in range(3)]
        np.testing.assert_allclose(reported, _arviz(monitor.draws(2)["x"], method), rtol=1e-12)


@pytest.mark.slow
def test_speed_against_arviz():
    """Printed, not asserted (``-s``): 128 chains x 4000 draws x 10 scalars."""
    x = ar1(np.random.default_rng(1), np.linspace(0.0, 0.95, 10), (128, 4000, 10))
    for method in ("bulk", "tail"):
        start = time.perf_counter()
        ours = ESS[method](x)
        middle = time.perf_counter()
        theirs = _arviz(x, method)
        end = time.perf_counter()
        np.testing.assert_allclose(ours, theirs, rtol=1e-12)
        print(f"\n{method} ESS of 128 x 4000 x 10: dhmc.stats {middle - start:.3f} s, ArviZ {end - middle:.3f} s")

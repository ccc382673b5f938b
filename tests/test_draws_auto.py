"""``draws="auto"``: sample until bulk/tail ESS and nested R-hat say enough, keep exactly those segments.

The target is a 2-D standard normal sampled by fixed HMC whose trajectory is a quarter period
(16 steps of pi/32): each draw is nearly independent of the last, so the ensemble's ESS is about
chains x draws. With 8 chains and target_ess=2000 the rule is met near 250 draws; segments are
100 draws (``4 target_ess / chains`` is above ``MIN_DRAWS_PER_SEGMENT``), so the run should stop
at 300 draws. ESS estimates scatter by some 10% at this size, and the min over four of them (bulk
and tail of two coordinates) sits below their mean: 400 may happen, 200 would need an estimate
25% high on all four, and 500 or more one 40% low, so the test accepts 300 or 400.
"""

from __future__ import annotations

import json
import math

import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr
import zarr

import dhmc

logdensity = lambda p: -0.5 * jnp.sum(p["x"] ** 2)  # noqa: E731
INIT = {"x": jnp.zeros(2)}
KW = dict(init=INIT, chains=8, chains_per_task=4, warmup=0, seed=4, kernel="hmc", adapt=False,
          step_size=math.pi / 32, num_steps=16, progress=False)
AUTO = dict(draws="auto", target_ess=2000, max_draws=1000)


def _groups_equal(a, b, draws=None) -> bool:
    cut = slice(None) if draws is None else slice(0, draws)
    return all(np.array_equal(a[g][v].values, b[g][v].values[:, cut]) for g in ("posterior", "sample_stats")
               for v in a[g].data_vars)


@pytest.fixture(scope="module")
def auto_memory(client2):
    return dhmc.sample(logdensity, cluster=client2, **KW, **AUTO)


def test_stops_at_the_first_segment_where_the_ensemble_ess_reaches_the_target(auto_memory):
    import arviz as az

    draws = auto_memory["posterior"].sizes["draw"]
    assert draws in (300, 400), draws
    posterior = auto_memory["posterior"].to_dataset()
    for method in ("bulk", "tail"):
        assert float(az.ess(posterior, method=method)["x"].min()) >= AUTO["target_ess"]
    check = json.loads(auto_memory["posterior"].attrs["dhmc_auto"])
    assert check["converged"] and check["draws"] == draws and check["max_rhat"] < 1.01
    assert json.loads(auto_memory["posterior"].attrs["dhmc_run_spec"])["draws"] == draws


def test_draws_are_the_prefix_of_a_fixed_run_in_memory_and_in_a_store(client2, auto_memory, tmp_path):
    fixed = dhmc.sample(logdensity, cluster=client2, draws=AUTO["max_draws"], **KW)
    draws = auto_memory["posterior"].sizes["draw"]
    assert _groups_equal(auto_memory, fixed, draws)
    stored = dhmc.sample(logdensity, cluster=client2, store=tmp_path / "auto.zarr", **KW, **AUTO)
    assert stored["posterior"].sizes["draw"] == draws
    assert _groups_equal(auto_memory, stored)


def test_a_stopped_store_is_a_complete_store_of_the_kept_draws(client2, auto_memory, tmp_path):
    store = tmp_path / "auto.zarr"
    dhmc.sample(logdensity, cluster=client2, store=store, **KW, **AUTO)
    draws = auto_memory["posterior"].sizes["draw"]
    tree = xr.open_datatree(store, engine="zarr", consolidated=False)
    assert tree["posterior"].sizes["draw"] == tree["sample_stats"].sizes["draw"] == draws
    assert not np.isnan(tree["posterior"]["x"].values).any()
    root = zarr.open_group(str(store), mode="r")
    assert root["dhmc/done"].shape == (2, draws // 100) and root["dhmc/done"][...].all()
    assert json.loads(root.attrs["dhmc_run_spec"])["draws"] == draws  # the one description of the store's sizes
    again = dhmc.resume(store, target=logdensity, init=INIT, cluster=client2, progress=False)
    assert again["posterior"].sizes["draw"] == draws and _groups_equal(auto_memory, again)
    assert json.loads(again["posterior"].attrs["dhmc_timing"])["sampling"] < 1.0  # nothing was run


def test_an_interrupted_auto_run_resumes_to_the_same_stop(client2, auto_memory, tmp_path):
    class Interrupt(BaseException):
        pass

    class Interrupter:
        def convergence_check(self, check):
            raise Interrupt  # after the first wave was checked (and rejected)

    store = tmp_path / "auto.zarr"
    with pytest.raises(Interrupt):  # a BaseException, as KeyboardInterrupt: it ends the run
        dhmc.sample(logdensity, cluster=client2, store=store, observers=[Interrupter()], **KW, **AUTO)
    assert zarr.open_group(str(store), mode="r").attrs["dhmc_auto_checked"] == 1
    resumed = dhmc.resume(store, target=logdensity, init=INIT, cluster=client2, progress=False)
    assert resumed["posterior"].sizes["draw"] == auto_memory["posterior"].sizes["draw"]
    assert _groups_equal(auto_memory, resumed)


def test_max_draws_first_warns_once_and_keeps_max_draws(client2):
    with pytest.warns(UserWarning, match=r"max_draws=200 before converging: min ESS \d+ of target_ess 1e\+06") as w:
        trace = dhmc.sample(logdensity, cluster=client2, **KW, draws="auto", target_ess=1e6, max_draws=200)
    assert len([x for x in w if "max_draws" in str(x.message)]) == 1
    assert trace["posterior"].sizes["draw"] == 200


@pytest.mark.parametrize("options, message", [
    (dict(draws="auto", max_draws=0), "max_draws must be a positive integer"),
    (dict(draws="auto", target_ess=-1), "target_ess must be a positive number"),
    (dict(draws="auto", target_ess=float("nan")), "target_ess must be a positive number"),
    (dict(draws="foo"), "draws must be a positive integer or 'auto'"),
    (dict(draws=100, target_ess=400), "target_ess and max_draws need draws='auto'"),
])
def test_bad_options_raise_one_line(options, message):
    with pytest.raises(ValueError, match=message) as e:
        dhmc.sample(logdensity, init=INIT, chains=8, warmup=0, step_size=0.1, num_steps=4, adapt=False, **options)
    assert "\n" not in str(e.value)


def test_the_cli_takes_draws_auto():
    from dhmc.cli import _parser

    args = _parser().parse_args(["sample", "gaussian_2d", "--draws", "auto", "--target-ess", "500",
                                 "--max-draws", "3000", "--out", "x.zarr"])
    assert (args.draws, args.target_ess, args.max_draws) == ("auto", 500.0, 3000)
    with pytest.raises(SystemExit):
        _parser().parse_args(["sample", "gaussian_2d", "--draws", "many", "--out", "x.zarr"])


def test_the_stopping_rule_estimates_the_draws_left():
    from dhmc.distributed.monitor import remaining

    assert remaining(300, 1500.0, 2000.0, 1000) == 100
    assert remaining(300, 2500.0, 2000.0, 1000) == 0
    assert remaining(100, 10.0, 2000.0, 1000) == 900  # capped at max_draws
    assert remaining(100, float("nan"), 2000.0, 1000) == 900

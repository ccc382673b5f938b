"""The target reaches every worker: set-up code run on workers, the target pickled as the user gave it,
TLS off loopback, and a record of where each block ran."""

from __future__ import annotations

import socket
import sys
import threading
from contextlib import suppress
from pathlib import Path
from urllib.parse import urlsplit

import dask.config
import jax.numpy as jnp
import numpy as np
import pytest
import zarr
from tls_probe import health_answers, http_status, refused, stranger_context, worker_http_ports

import dhmc
from dhmc.errors import ClusterError
from dhmc.observe.dashboard import page_url

USERLIBS = Path(__file__).parent / "userlibs"


@pytest.fixture
def dynlib(monkeypatch):
    """``dynlib.using_jax``, importable here; its dynamic modules forgotten afterwards."""
    monkeypatch.syspath_prepend(str(USERLIBS))
    import dynlib.using_jax

    yield dynlib.using_jax
    for name in [name for name in sys.modules if name == "dynlib" or name.startswith("dynlib.")]:
        del sys.modules[name]


def test_a_model_a_library_builds_at_import_runs_with_worker_setup(dynlib, client1, client2, tmp_path):
    mean, sd = np.array([1.0, -2.0]), np.array([0.5, 2.0])
    target = dynlib.Gaussian(jnp.asarray(mean), jnp.asarray(sd))
    run = dict(init=jnp.zeros(2), chains=64, draws=200, warmup=200, seed=3, progress=False)

    # Without the set-up, on the session's cluster (its workers cannot import dynlib either): no embedded cluster
    # started only to fail
    with pytest.raises(ClusterError, match=r"cannot unpickle the target: .*dynlib.*dhmc.worker-setup"):
        dhmc.sample(target, cluster=client2, **run)

    # With it, on the session's one-worker cluster (as on the embedded one: dhmc registers the set-up with the
    # run's Client), which keeps the set-up's plugin until it is taken off again here
    store = tmp_path / "dyn.zarr"
    try:
        with dask.config.set({"dhmc.worker-setup": [str(USERLIBS / "setup_dynlib.py")]}):
            trace = dhmc.sample(target, store=store, cluster=client1, **run)
    finally:
        from dhmc.distributed.setup import WorkerSetup

        with suppress(ValueError):  # none if the run failed before it registered one
            client1.unregister_worker_plugin(WorkerSetup.name)
    x = trace["posterior"]["x"].values.reshape(-1, 2)
    ess = len(x) / 10  # conservative: 12,800 draws of a Gaussian the sampler mixes well on
    assert np.all(np.abs(x.mean(0) - mean) < 5 * sd / np.sqrt(ess)), x.mean(0)
    assert np.all(np.abs(x.std(0) / sd - 1) < 0.05), x.std(0)

    # where each block ran: this host, the workers' loopback addresses
    where = zarr.open_group(str(store), mode="r")["dhmc"]
    assert set(where["host"][...].ravel()) == {socket.gethostname()}
    assert all(w.startswith("tcp://127.0.0.1:") for w in where["worker"][...].ravel())


def test_worker_setup_errors_are_one_line_and_early(tmp_path):
    with dask.config.set({"dhmc.worker-setup": [str(tmp_path / "missing.py")]}), \
            pytest.raises(ValueError, match=r"^dhmc.worker-setup: cannot read the script .*missing.py"):
        dhmc.sample("gaussian_2d", chains=4, draws=10, warmup=10, progress=False)
    with dask.config.set({"dhmc.worker-setup": ["not a module"]}), \
            pytest.raises(ValueError, match="neither a module name nor a .py script"):
        dhmc.sample("gaussian_2d", chains=4, draws=10, warmup=10, progress=False)


def test_a_failing_worker_setup_names_itself(client1):
    with dask.config.set({"dhmc.worker-setup": ["dhmc_no_such_module"]}), \
            pytest.raises(ClusterError, match=r"dhmc.worker-setup \(dhmc_no_such_module\) failed on a worker: "
                                              r"ModuleNotFoundError"):
        dhmc.sample("gaussian_2d", chains=4, draws=10, warmup=10, progress=False, cluster=client1)


def test_cli_worker_setup_sets_the_config():
    from dhmc.cli import _parser

    args = _parser().parse_args(["resume", "s.zarr", "--worker-setup", "a.b", "--worker-setup", "c.py"])
    assert args.worker_setup == ["a.b", "c.py"]


class Recording:
    """A model object that keeps its last input: once traced, it holds a traced array (which cannot be pickled)."""

    def __init__(self):
        self.last = None

    def __call__(self, x):
        self.last = x
        return -0.5 * jnp.sum(x**2)


def test_a_model_object_that_caches_a_traced_value_is_pickled_as_given(client2):
    trace = dhmc.sample(Recording(), init=jnp.zeros(3), chains=32, draws=100, warmup=100, progress=False,
                        cluster=client2)
    x = trace["posterior"]["x"].values.reshape(-1, 3)
    assert np.all(np.abs(x.mean(0)) < 5 / np.sqrt(len(x) / 10)) and np.all(np.abs(x.std(0) - 1) < 0.08)


def test_an_unpicklable_target_is_named_before_any_work():
    lock = threading.Lock()

    def logdensity(x):
        assert lock is not None
        return -0.5 * jnp.sum(x**2)

    with pytest.raises(TypeError, match=r"^the target\.logdensity_fn \(closure 'lock'\) cannot be sent to the "
                                        r"workers: cloudpickle failed on lock"):
        dhmc.sample(logdensity, init=jnp.zeros(2), chains=4, draws=10, progress=False)


# --- TLS off loopback -----------------------------------------------------------------------------


def test_an_embedded_cluster_off_loopback_uses_tls_and_refuses_strangers():
    from distributed.security import Security

    from dhmc.distributed.connect import connect
    from dhmc.distributed.network import route_to

    try:
        host = route_to("192.0.2.1")
    except OSError:
        host = "127.0.0.1"
    if host.startswith("127."):
        pytest.skip("this machine has no address off loopback")
    client, close = connect("local", {"host": host, "n-workers": 1})
    try:
        scheduler = client.scheduler.address
        (worker,) = client.scheduler_info()["workers"]
        assert scheduler.startswith(f"tls://{host}:") and worker.startswith(f"tls://{host}:")
        for address in (scheduler, worker):  # the servers refuse: no certificate, another CA's, plain TCP
            assert refused(address, stranger_context()), address
            assert refused(address, stranger_context(Security.temporary())), address
            assert refused(address.replace("tls://", "tcp://"), None), address
            assert not refused(address, stranger_context(client.security)), address  # the run's own: accepted
        for address, port in worker_http_ports(client).items():  # its HTTP endpoints follow the comms
            assert health_answers(host, port, client.security) == (None, None, 200), address
        trace = dhmc.sample("gaussian_2d", chains=8, draws=20, warmup=20, progress=False, cluster=client)
        assert trace["posterior"].sizes["draw"] == 20
        url = page_url(client)  # the dashboard stays on loopback: the printed link must point there
        assert urlsplit(url).hostname == "127.0.0.1" and http_status(url) == 200, url
    finally:
        close()


class Locked:
    def __init__(self):
        self.lock = threading.Lock()

    def logdensity(self, x):
        return -0.5 * jnp.sum(x**2)


def test_a_bound_methods_unpicklable_object_is_named():
    with pytest.raises(TypeError, match=r"^the target\.logdensity_fn\.__self__\.lock cannot be sent"):
        dhmc.sample(Locked().logdensity, init=jnp.zeros(2), chains=4, draws=10, progress=False)


def test_cli_worker_setup_adds_to_the_configured_list(tmp_path):
    from dhmc.cli import main

    with dask.config.set({"dhmc.worker-setup": ["from.yaml"]}):
        assert main(["resume", str(tmp_path / "missing.zarr"), "--worker-setup", "a.b"]) == 2  # no such store
        assert dask.config.get("dhmc.worker-setup") == ["from.yaml", "a.b"]


def test_where_blocks_ran_follows_extend_and_a_store_without_it_still_resumes(client1, tmp_path):
    store = tmp_path / "where.zarr"
    run = dict(chains=8, chains_per_task=4, warmup=20, seed=1, progress=False, cluster=client1, store=store)
    dhmc.sample("gaussian_2d", draws=30, **run)
    dhmc.extend(store, 30, cluster=client1, progress=False)
    group = zarr.open_group(str(store), mode="r")["dhmc"]
    assert group["host"].shape == group["done"].shape and all(group["host"][...].ravel())

    # a store written before dhmc kept hosts and workers: a resume writes none and still completes
    root = zarr.open_group(str(store), mode="r+")
    for name in ("host", "worker"):
        del root[f"dhmc/{name}"]
    root["dhmc/done"][:, -1] = 0
    trace = dhmc.resume(store, cluster=client1, progress=False)
    assert trace["posterior"].sizes["draw"] == 60 and "host" not in zarr.open_group(str(store), mode="r")["dhmc"]

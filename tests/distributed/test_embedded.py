"""The embedded cluster's start-up path: executables compiled by the driver, and workers the driver restarts."""

from __future__ import annotations

import json
import os
import re
import signal
import tempfile
import time

import cloudpickle
import jax.numpy as jnp
import numpy as np
import pytest

from dhmc.core.ensemble import KernelConfig
from dhmc.distributed import program
from dhmc.distributed.child import remove_orphaned_folders, temporary_prefix
from dhmc.models import LogDensityTarget


def logdensity(p):
    return -0.5 * jnp.sum((p["x"] - 1.0) ** 2 / jnp.arange(1.0, 4.0))


class Programs:
    """An observer that notes how each block had its program (loaded, compiled or cached)."""

    def __init__(self, seen: set):
        self.seen = seen

    def warmup_block(self, round_index, rounds, chunk, result, chunks_done, chunks):
        self.seen.add(result.program)

    def sample_block(self, chunk, segment, result, chain_draws):
        self.seen.add(result.program)


# The quick case has a dense metric (a Cholesky, a LAPACK call, in every block program) and x64: with
# test_options_matrix.py's client2 case of the same options it stands for the embedded case of that matrix.
@pytest.mark.parametrize("dense_mass, x64", [pytest.param(False, False, marks=pytest.mark.slow), (True, True)],
                         ids=["diag-x32", "dense-x64"])
def test_driver_compiled_executables_give_bitwise_the_same_draws(embedded, client2, dense_mass, x64):
    """The embedded cluster runs executables the driver compiled; client2's workers compile their own."""
    import jax

    import dhmc

    kw = dict(init={"x": jnp.zeros(3)}, chains=48, draws=60, warmup=100, seed=3, chains_per_task=16,
              dense_mass=dense_mass, progress=False)
    how = {"shipped": set(), "client2": set()}
    with jax.enable_x64(x64):  # client2 may have built logdensity in float32 for another test: it builds it again
        shipped = dhmc.sample(logdensity, observers=(Programs(how["shipped"]),), **kw)
        compiled = dhmc.sample(logdensity, cluster=client2, observers=(Programs(how["client2"]),), **kw)
    assert shipped["posterior"]["x"].dtype == (np.float64 if x64 else np.float32)
    for group in ("posterior", "sample_stats"):
        for name in shipped[group].data_vars:
            assert np.array_equal(shipped[group][name].values, compiled[group][name].values), (group, name)
    assert how["shipped"] and "compiled" not in how["shipped"], how  # loaded (or cached), never compiled there
    assert "compiled" in how["client2"] or how["client2"] == {"cached"}, how


def test_an_executable_for_another_backend_is_compiled_here_instead():
    target = LogDensityTarget(logdensity, {"x": jnp.zeros(3)}, name="t")
    config = KernelConfig(kind="hmc", num_steps=4, target_accept=0.8, dense_mass=False)
    blob = program.precompile(target.build(), config, "sample", 10, 16, False)
    backend, lapack, payload = cloudpickle.loads(blob)
    assert backend == "cpu" and not lapack
    assert program.load_executable(blob) is not None
    assert program.load_executable(cloudpickle.dumps(("not-" + backend, lapack, payload))) is None
    assert program.load_executable(b"garbage") is None


def test_the_scheduler_port_is_one_no_bind_to_port_zero_can_take_before_it_listens():
    """The workers start before the scheduler listens on its port: one from the ephemeral range could be handed
    to a worker's or the dashboard's ``bind(0)`` meanwhile (CI once: "Scheduler failed to start")."""
    import random
    import socket

    from dhmc.distributed.embedded import _ephemeral_ports, _free_port

    ephemeral = _ephemeral_ports()
    ports = [_free_port("127.0.0.1", random.Random(seed)) for seed in range(20)]
    assert all(port not in ephemeral and 10_000 <= port < 32_768 for port in ports), ports
    taken = _free_port("127.0.0.1", random.Random(0))
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", taken))
        other = _free_port("127.0.0.1", random.Random(0))  # the same first choice, taken: the next one
    assert other != taken and other not in ephemeral


def test_a_killed_embedded_worker_is_restarted(embedded):
    """On the session's embedded cluster (the tests after this one sample on the restarted worker)."""
    before = embedded.run(os.getpid)
    assert before
    victim = sorted(before.values())[0]
    os.kill(victim, signal.SIGKILL)
    deadline = time.time() + 60
    while time.time() < deadline:
        pids = set(embedded.run(os.getpid, on_error="ignore").values())
        if len(pids) == len(before) and victim not in pids:
            break
        time.sleep(0.2)
    assert len(pids) == len(before) and victim not in pids, pids


INTRUDER = """
import asyncio, json, os, ssl, sys
from distributed.comm import connect

def answers(address, context):
    # the identity op, as a Client's first message; a server that answers it runs Client.run's code too
    async def attempt():
        args = {"ssl_context": context, "require_encryption": True} if context else {}
        comm = await connect(address, timeout=3, **args)
        try:
            await comm.write({"op": "identity"})
            return await asyncio.wait_for(comm.read(), 3)
        finally:
            comm.abort()
    try:
        asyncio.run(attempt())
        return True
    except Exception:
        return False

anyone = ssl.create_default_context()
anyone.check_hostname, anyone.verify_mode = False, ssl.CERT_NONE
seen = {}
for name, address in zip(("scheduler", "worker"), sys.argv[1:3]):
    seen[name + " over tcp"] = answers(address.replace("tls://", "tcp://"), None)
    seen[name + " over tls without a certificate"] = answers(address, anyone)
try:
    seen["certificates readable"] = bool(os.listdir(sys.argv[3]))
except OSError:
    seen["certificates readable"] = False
print(json.dumps(seen))
"""


def test_another_user_on_this_host_cannot_reach_the_embedded_cluster(embedded):
    """Loopback is shared by every user of the machine (a login node): a process of another user could call
    Client.run on a plain-TCP embedded cluster and run code as the sampler's user. The cluster's comms need the
    run's certificate, which only this user can read, and its workers' HTTP endpoints follow its comms."""
    import shutil
    import subprocess
    import sys

    from tls_probe import health_answers, stranger_context, worker_http_ports

    client = embedded  # the session's embedded cluster, as cluster=None starts it
    worker = sorted(client.scheduler_info()["workers"])[0]
    scheduler, folder = client.scheduler.address, os.path.join(client.cluster.log_dir, "tls")
    assert scheduler.startswith("tls://127.0.0.1:") and os.listdir(folder)
    if os.geteuid() == 0 and shutil.which("setpriv"):
        run = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable,
                              "-c", INTRUDER, scheduler, worker, folder], capture_output=True, text=True,
                             timeout=60, cwd="/", env={**os.environ, "HOME": "/tmp"})
        if not run.stdout and ("No module named" in run.stderr or "Permission denied" in run.stderr):
            pytest.skip(f"this Python cannot run as another user: {run.stderr.strip().splitlines()[-1]}")
        assert json.loads(run.stdout) == dict.fromkeys(json.loads(run.stdout), False), run.stdout + run.stderr
    else:  # not root: the same attempts as this user, without the certificate
        from tls_probe import refused

        for address in (scheduler, worker):
            assert refused(address, stranger_context()) and refused(address.replace("tls://", "tcp://"), None)
    for address, port in worker_http_ports(client).items():  # no plain HTTP, nor TLS without the run's certificate
        assert health_answers("127.0.0.1", port, client.security) == (None, None, 200), address


def _gp_logdensity(p):
    x = jnp.linspace(0.0, 1.0, 4)
    cov = jnp.exp(-0.5 * (x[:, None] - x[None]) ** 2 / 0.3**2) + 1e-3 * jnp.eye(4)
    f = jnp.linalg.cholesky(cov) @ p["z"]
    return -0.5 * jnp.sum(p["z"] ** 2) - 0.5 * jnp.sum((f - 1.0) ** 2)


LOAD_IN_A_FRESH_PROCESS = """
import sys, cloudpickle, numpy as np, jax.numpy as jnp
from dhmc.distributed import worker
from dhmc.distributed.program import BlockInputs, load_executable
from dhmc.core.ensemble import Params
worker.prepare_process()
program = load_executable(open(sys.argv[1], "rb").read())
assert program is not None, "the executable did not load"
params = Params(jnp.float32(0.1), jnp.eye(4, dtype=jnp.float32), jnp.float32(0.3))
end, out = program(BlockInputs(jnp.uint32(0), jnp.arange(16, dtype=jnp.uint32), jnp.zeros((16, 4), jnp.float32),
                               params, jnp.int32(0), jnp.int32(10), *[jnp.bool_(False)] * 3))
print("lp", float(np.asarray(out["sample_stats"]["lp"]).mean()))
"""


def test_an_executable_with_lapack_calls_runs_in_a_fresh_process(tmp_path):
    """jaxlib fills in its LAPACK kernels only when lowering: a loaded executable used to segfault."""
    import subprocess
    import sys

    model = LogDensityTarget(_gp_logdensity, {"z": jnp.zeros(4)}, name="gp").build()
    config = KernelConfig(kind="hmc", num_steps=3, target_accept=0.8, dense_mass=True)
    blob = program.precompile(model, config, "sample", 10, 16, True)
    assert cloudpickle.loads(blob)[1], "the program's LAPACK calls went unnoticed"
    (tmp_path / "exe.bin").write_bytes(blob)
    (tmp_path / "load.py").write_text(LOAD_IN_A_FRESH_PROCESS)
    run = subprocess.run([sys.executable, str(tmp_path / "load.py"), str(tmp_path / "exe.bin")],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, f"exit {run.returncode}: {run.stderr[-1500:]}"
    assert "lp" in run.stdout


# Quick, a dense metric's Cholesky in the programs the driver compiles runs in the dense-x64 case of
# test_driver_compiled_executables_give_bitwise_the_same_draws, and a Cholesky model's executable in
# test_an_executable_with_lapack_calls_runs_in_a_fresh_process.
@pytest.mark.slow
def test_dense_mass_and_cholesky_models_run_on_the_embedded_cluster():
    import dhmc

    kw = dict(chains=16, draws=50, warmup=50, progress=False)
    dense = dhmc.sample(lambda p: -0.5 * jnp.sum(p["z"] ** 2), init={"z": jnp.zeros(3)}, dense_mass=True, **kw)
    assert np.isfinite(dense["posterior"]["z"].values).all()
    gp = dhmc.sample(_gp_logdensity, init={"z": jnp.zeros(4)}, **kw)
    assert np.isfinite(gp["posterior"]["z"].values).all()


A_RUN_IN_A_FRESH_PROCESS = """
import sys, urllib.request, jax.numpy as jnp, dhmc
from dhmc.distributed.connect import connect
client, close = connect(None, {"n_workers": 1})
dhmc.sample(lambda p: -0.5 * jnp.sum(p["x"] ** 2), init={"x": jnp.zeros(2)}, chains=8, draws=20, warmup=0,
            kernel="hmc", step_size=0.5, num_steps=3, adapt=False, progress=False, cluster=client)
print("imported:", sorted({m.split(".")[0] for m in sys.modules} & {"bokeh", "zarr", "arviz", "matplotlib"}))
import cloudpickle
from dhmc.distributed.startup import pickle_target
from dhmc.models.resolve import resolve_target
numpyro_target = resolve_target("coin_toss", None, 8, (), None)[0]  # a NumPyro model, as a run sends it
numpyro_target.build()
blob = pickle_target(numpyro_target)[0]
pymc = lambda: sorted({m.split(".")[0] for m in sys.modules} & {"pymc", "pytensor", "bambi"})
built = lambda: cloudpickle.loads(blob).build() and pymc()  # what a worker does with it
print("pymc imported:", pymc(), sorted({m for ms in client.run(built).values() for m in ms}))
base = client.dashboard_link.rsplit("/", 1)[0]
page = urllib.request.urlopen(base + "/status", timeout=60).read().decode()
print("status page:", len(page), "bokeh" in page.lower())
print("dhmc page:", urllib.request.urlopen(base + "/dhmc", timeout=60).status)
close()
"""


def test_the_embedded_driver_imports_no_dashboard_zarr_or_arviz_until_asked(tmp_path):
    """Dask's dashboard (bokeh) is connected at its first request; a run without a store imports no zarr, and the
    convergence monitor no ArviZ: each was ~0.5-1.2 s of CPU taken from the workers of a cold run. A log density's
    and a NumPyro model's runs import no PyMC or PyTensor, on the driver or the workers (~5 s and 0.3 GB each). The
    script has no main guard: its embedded cluster (of one worker, to start one process fewer) starts and samples
    all the same."""
    import subprocess
    import sys

    (tmp_path / "run.py").write_text(A_RUN_IN_A_FRESH_PROCESS)
    out = subprocess.run([sys.executable, str(tmp_path / "run.py")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "imported: []" in out.stdout, out.stdout
    assert "pymc imported: [] []" in out.stdout, out.stdout  # PyMC and PyTensor only for a PyMC model
    assert re.search(r"status page: \d+ True", out.stdout), out.stdout  # Dask's bokeh page, built on demand
    assert "dhmc page: 200" in out.stdout


ORPHAN_DRIVER = """
import sys, jax.numpy as jnp, dhmc
dhmc.sample(lambda p: -0.5 * jnp.sum(p["x"] ** 2), init={"x": jnp.zeros(2)}, chains=64, draws=10**6, warmup=0,
            adapt=False, kernel="hmc", step_size=0.1, num_steps=5, chains_per_task=32, progress=False)
"""


# Killed while sampling waits for both workers to be seconds of CPU into their blocks (15-50 s on two cores): in the
# slow suite (CI runs it); the quick suite kills the driver while its workers start.
@pytest.mark.parametrize("when", ["start-up", pytest.param("sampling", marks=pytest.mark.slow)])
def test_workers_die_with_a_driver_killed_by_sigkill_and_leave_no_folders(when):
    """A driver killed with kill -9 (while its workers start, or while they sample) takes its embedded workers with
    it (one outlived such a driver for good); the next driver removes its temporary folders (logs, certificates,
    programs) and nobody else's."""
    import subprocess
    import sys

    import psutil

    driver = subprocess.Popen([sys.executable, "-c", ORPHAN_DRIVER], stderr=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL)
    proc, deadline, workers = psutil.Process(driver.pid), time.monotonic() + 120, []
    while time.monotonic() < deadline:
        workers = [c for c in proc.children(recursive=True) if "dhmc.distributed.child" in " ".join(c.cmdline())]
        if workers and (when == "start-up" or _sampling(workers)):
            break
        time.sleep(0.1 if when == "start-up" else 0.5)
    assert workers, "no embedded worker started"
    assert _folders(driver.pid)
    os.kill(driver.pid, signal.SIGKILL)
    driver.wait()
    _, alive = psutil.wait_procs(workers, timeout=60)
    assert not alive, f"workers outlived their driver: {[p.pid for p in alive]}"
    left = _folders(driver.pid)
    assert left and set(left) <= set(remove_orphaned_folders())  # what the next driver's embedded cluster does first
    assert not _folders(driver.pid)
    mine = tempfile.mkdtemp(prefix=temporary_prefix("programs"))  # a live driver's folder stays
    assert mine not in remove_orphaned_folders() and os.path.isdir(mine)
    os.rmdir(mine)


def _folders(pid: int) -> list[str]:
    import glob
    import tempfile

    return glob.glob(os.path.join(tempfile.gettempdir(), f"dhmc-*-{pid}-*"))


def _sampling(workers) -> bool:
    """Every worker busy with a block: its CPU time past its start-up's."""
    try:
        return all(w.cpu_times().user > 4.0 for w in workers)
    except Exception:  # noqa: BLE001 - a worker restarting
        return False

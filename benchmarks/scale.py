"""A thousand workers, by simulation: what one block costs the driver and the scheduler as the cluster grows.

The real dhmc driver (``dhmc.sample(..., cluster=client)``: a ``distributed.Client(address)`` made as dhmc makes one
for a scheduler address, in a process of its own) and a real Dask scheduler (``distributed.Scheduler`` with its
dashboard, a process of its own) run against 1, 8, 32 and 128 real ``distributed.Worker``s on this machine. To fit
them, the workers are packed ``--per-host`` to a *worker host* process (one event loop, no nanny, ``nthreads=1`` each,
JAX imported once); the one thing tuned there is what each packed worker does on its own whatever it runs (its
statistical profiler off, its loop-tick measure and system monitor rarer, a 1 ms GIL switch interval), which would
otherwise starve their shared event loop. Blocks are tiny (a ``--dim``-D standard Gaussian, fixed-step HMC, no
warmup, ``--chains-per-task`` chains and the fewest draws dhmc's geometry gives a segment: ``max(100, 25,000 /
chains_per_task)``) and there are ``--chunks-per-worker`` chunks a worker, so the driver's and the scheduler's path
dominates. Per worker count, once with the draws sent back to the driver (``memory``) and once with a Zarr store the
workers write and the driver marks done (``store``):

* **blocks/s**: blocks over the sampling phase's wall time (the result's ``dhmc_timing``: sampling + writing).
* **driver CPU per block**: the driver process's CPU (every thread) from the block at 1/4 of the run to the block at
  3/4, less the convergence monitor's wave checks in that window (their CPU is reported apart: ``checks s``), over
  those blocks (``steady``); also over the whole sampling phase (``phase``: ``start_run`` to the last block).
* **driver wall per block**: the same window's wall time over its blocks. dhmc's driver loop handles one block after
  the other (wait, fetch the result through the scheduler, the sink, submit the next), so when finished blocks queue
  for it (``driver_bound``: their median wait for the driver is over twice a block's compute) this, not its CPU,
  sets the pace.
* **scheduler CPU per task**: the scheduler process's CPU over the same window (``psutil``), raw and less its idle
  rate (heartbeats: measured for 2 s with every worker connected and nothing to run).
* **latency**, from the scheduler's task stream and the driver's observer: ``submit->start`` (the driver submitted
  block (c, s+1) -> it computes on a worker: the scheduler's and the network's latency), ``->driver`` (a worker
  finished block (c, s) -> the driver has it in its sink, the next one submitted), ``turnaround`` (finished ->
  block (c, s+1) computes), and the gaps a worker sits idle between two of its blocks.
* **store operations per block**: the files in the store after the run, by kind (draw chunks, end positions, the
  done/host/worker records, metadata) over the blocks; and the file system calls on the store per block, by
  process (driver, workers), kind and path (``open`` to read or write, ``rename``, ``mkdir``, ``remove``), counted
  by a Python audit hook in every process (``sys.addaudithook``; nothing of dhmc is patched).
* **the warmup barrier with one slow worker** (at ``--barrier-workers``, 8 and 32: on two cores the other workers'
  blocks are slowed by W/2 themselves, and at 128 a round's blocks would take minutes): a fixed warmup
  (``--barrier-warmup`` iterations in five rounds, one block a worker each, each round a barrier across the
  ensemble) with one worker, alone in its host process, made ``--slow-factor`` times slower than the others (on two
  cores they run at 2/W of a core each, so it is let run 2 / (slow_factor x W) of real time: SIGSTOP/SIGCONT every
  40 ms), and once without: per round its wall time against the median and the slowest
  block's device seconds, ``sync`` (round - slowest block, per block), the slow worker's tasks (Dask may have moved
  them elsewhere) and the share of the workers' time the round left idle (1 - their compute spans in it / (workers
  x round)).

With 128 workers on two cores the block rate is bounded by the machine; the per-block costs are what carry over: with
W workers and blocks of T seconds the driver must handle W / T blocks a second, so it saturates at ``W_max = T / c``
for a per-block cost ``c`` (one core's CPU, or its serial loop's wall time; likewise the scheduler). The JSON's
``model`` section gives ``W_max`` for T = 0.5 s and 5 s from the largest worker count's costs. At the largest worker
count (unless ``--no-profile``) the memory and store runs are repeated (``profile_segments`` segments) under cProfile:
the driver's main thread by the wall clock (dhmc's loop, where it waits too), the Dask client's event-loop thread and
zarr's by their CPU clocks, and every thread's CPU; the top functions per block.

    python -m benchmarks.scale                       # 1, 8, 32, 128 workers -> results/scale.json (~10 min)
    python -m benchmarks.scale --quick               # 1 and 8 workers, small runs (a smoke run, ~1.5 min)
    python -m benchmarks.scale --workers 32,128 --no-profile --out /tmp/scale.json
    python -m benchmarks.scale --dhmc /path/to/other/checkout --out /tmp/scale_other.json

Every process the benchmark starts runs this file by its path (``python -P``) and imports ``dhmc`` from ``--dhmc``
(default: the ``PYTHONPATH`` given, else this repository), so another checkout's dhmc is measured by this script as it
is; the JSON names its path and commit. The scheduler, the worker hosts and the driver end with the benchmark (and on
their own if it dies); a worker count that fails or runs past ``--timeout`` is reported and the next one runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve()
REPO = SCRIPT.parents[1]
SLOW_PERIOD = 0.04  # seconds of one SIGSTOP/SIGCONT cycle of the slow worker's host
IDLE_SECONDS = 2.0  # the scheduler's and hosts' idle CPU rate is measured this long
T_MODEL = (0.5, 5.0)  # block seconds the model section extrapolates to

FULL = {"workers": [1, 8, 32, 128], "chains_per_task": 64, "dim": 4, "chunks_per_worker": 2, "blocks": 96,
        "min_segments": 4, "step_size": 0.5, "num_steps": 4, "per_host": 16, "barrier_warmup": 5000,
        "barrier_workers": [8, 32], "barrier_chunks_per_worker": 1, "slow_factor": 10.0, "fs_calls": True,
        "profile_segments": 2}
QUICK = {**FULL, "workers": [1, 8], "blocks": 48, "min_segments": 3, "barrier_warmup": 1000, "barrier_workers": [8]}


# -- the target (pickled by value: the workers need not import this file) -------------------------------------------

def log_density(p):
    """A standard Gaussian in ``p["x"]``'s dimensions."""
    import jax.numpy as jnp

    return -0.5 * jnp.sum(p["x"] ** 2)


# -- store operations: counted by an audit hook in every process -----------------------------------------------------

_IO: dict = {"prefix": None, "counts": {}, "patterns": {}}
_IO_EVENTS = frozenset({"open", "os.rename", "os.mkdir", "os.remove", "os.rmdir"})


def store_kind(rel: str) -> str:
    """What a path inside a dhmc store holds: ``draws`` (posterior/sample_stats chunks), ``coords`` (their 1-D
    coordinates), ``position``, ``done``, ``host``, ``worker`` (dhmc's per-block records), ``metadata``
    (``zarr.json``, also while written as ``zarr.*.partial``) or ``other``."""
    parts = [p for p in rel.replace(os.sep, "/").split("/") if p]
    if not parts:
        return "other"
    if parts[-1] == "zarr.json" or (parts[-1].startswith("zarr.") and parts[-1].endswith(".partial")):
        return "metadata"
    if parts[0] in ("posterior", "sample_stats") and len(parts) > 3 and parts[2] == "c":
        return "draws" if len(parts) > 4 else "coords"
    if parts[0] == "dhmc" and len(parts) > 2 and parts[1] in ("position", "done", "host", "worker"):
        return parts[1]
    return "other"


def _audit(event, args):
    if event not in _IO_EVENTS or _IO["prefix"] is None:
        return
    path = args[0]
    if isinstance(path, os.PathLike):
        path = os.fspath(path)
    if event == "os.rename":
        path = args[1] if not isinstance(args[1], os.PathLike) else os.fspath(args[1])
    if not isinstance(path, str) or not path.startswith(_IO["prefix"]):
        return
    if event == "open":
        flags = args[2] if isinstance(args[2], int) else 0
        op = "open_write" if flags & (os.O_WRONLY | os.O_RDWR) else "open_read"
    else:
        op = event.removeprefix("os.")
    rel = path[len(_IO["prefix"]):]
    key, pattern = f"{op}:{store_kind(rel)}", f"{op}:{_pattern(rel)}"
    counts, patterns = _IO["counts"], _IO["patterns"]
    counts[key] = counts.get(key, 0) + 1
    patterns[pattern] = patterns.get(pattern, 0) + 1


def _pattern(rel: str) -> str:
    """A store path with its chunk indices as ``N`` and a temporary file's random name as ``*.partial``."""
    import re

    rel = re.sub(r"\.[0-9a-f]{32}\.partial$", ".*.partial", rel)
    return re.sub(r"(?<=/)\d+(?=/|$|\.)", "N", rel)


def _watch_store_io(prefix: str) -> None:
    """Count this process's file system calls under ``prefix`` from now on (the hook stays; only the prefix moves)."""
    if _IO["prefix"] is None and not _IO.get("hooked"):
        sys.addaudithook(_audit)
        _IO["hooked"] = True
    _IO["prefix"], _IO["counts"], _IO["patterns"] = prefix.rstrip("/") + "/", {}, {}


def _io_counts(prefix=None):
    """This process's counts (run on every worker through ``client.run``); with ``prefix``: start counting there."""
    import __main__

    state = getattr(__main__, "_IO", _IO)
    counts, patterns = dict(state["counts"]), dict(state["patterns"])
    if prefix is not None:
        getattr(__main__, "_watch_store_io", _watch_store_io)(prefix)
    return {"pid": os.getpid(), "counts": counts, "patterns": patterns}


# -- the scheduler's process -----------------------------------------------------------------------------------------

async def _serve_scheduler(cfg: dict) -> None:
    from distributed import Scheduler

    async with Scheduler(host="127.0.0.1", port=0, dashboard_address="127.0.0.1:0") as scheduler:
        _write_atomic(cfg["ready"], json.dumps({"address": scheduler.address, "pid": os.getpid()}))
        await _until_orphaned(cfg["parent"], scheduler)


async def _until_orphaned(parent: int, server) -> None:
    """Return when the benchmark's process is gone, or ``server`` closed."""
    while os.getppid() == parent and server.status.name not in ("closing", "closed", "failed"):
        await asyncio.sleep(0.5)


# -- a worker host's process: several Workers in one event loop ------------------------------------------------------

HOST = None  # this process's WorkerHost, in a worker host


class WorkerHost:
    """``cfg["workers"]`` Workers of the scheduler at ``cfg["address"]`` in this process's event loop: the first one
    at start, the rest when the driver asks (:func:`_grow`), after every host has compiled its programs once."""

    def __init__(self, cfg: dict):
        self.cfg, self.workers = cfg, []

    async def start(self, n: int) -> list[str]:
        from distributed import Worker

        new = [Worker(self.cfg["address"], nthreads=1, name=f"{self.cfg['name']}-{len(self.workers) + i}",
                      memory_limit=0, local_directory=self.cfg["local"], host="127.0.0.1", death_timeout=60,
                      dashboard=False) for i in range(n)]
        self.workers += new
        await asyncio.gather(*new)
        return [w.address for w in new]

    async def grow(self) -> int:
        await self.start(self.cfg["workers"] - len(self.workers))
        return len(self.workers)

    async def close(self) -> None:
        await asyncio.gather(*(w.close(timeout=5) for w in self.workers), return_exceptions=True)


async def _serve_host(cfg: dict) -> None:
    global HOST
    import dask.config

    # What each worker does on its own whatever it runs, times the workers packed in this process, would starve their
    # shared event loop: each one's statistical profiler (every 10 ms), its loop-tick measure (every 20 ms) and
    # system monitor (every 0.5 s) are made rarer; heartbeats and everything a task needs are left as they are
    dask.config.set({"distributed.worker.profile.enabled": False, "distributed.admin.tick.interval": "1s",
                     "distributed.admin.system-monitor.interval": "2s"})
    sys.setswitchinterval(0.001)  # the loop thread waits less for the GIL behind the workers' task threads
    _watch_store_io(cfg["store_prefix"])
    from dhmc.distributed.worker import dask_setup

    dask_setup()  # what dhmc's own workers preload: malloc thresholds, the compilation cache, JAX's devices
    HOST = WorkerHost(cfg)
    await HOST.start(1)
    _write_atomic(cfg["ready"], json.dumps({"pid": os.getpid()}))
    try:
        await _until_orphaned(cfg["parent"], HOST.workers[0])
    finally:
        await HOST.close()


async def _grow(dask_worker=None):
    """Run by ``client.run`` on one worker of each host: start the host's other workers."""
    import __main__

    return await __main__.HOST.grow()


def _programs():
    """This process's compiled block programs (``client.run`` on every worker): the hosts that compiled."""
    from dhmc.distributed import worker

    return {"pid": os.getpid(), "programs": len(worker._PROGRAMS)}


# -- the driver's process --------------------------------------------------------------------------------------------

class Watch:
    """An observer (``dhmc.sample(observers=[watch])``): CPU and wall marks of the driver, the scheduler and the
    worker hosts at the run's start, at its blocks n/4, 3n/4 and last, and every block's arrival.

    The convergence monitor's wave checks run in the driver's main thread right after a block's ``sample_block``;
    their CPU is that thread's CPU from that event to ``convergence_check``.
    """

    def __init__(self, pids: dict, profiles=None):
        import psutil

        self.profiles, self.done = profiles, {}
        self.procs = {name: [psutil.Process(p) for p in ps] for name, ps in pids.items()}
        self.marks, self.blocks, self.rounds, self.checks = {}, [], [], []
        self.run_id, self.geometry, self.n, self.count, self.k, self.last_main = None, None, 0, 0, {}, 0.0
        self.t0 = time.time()

    def snap(self) -> dict:
        out = {"wall": time.perf_counter(), "driver": time.process_time(), "driver_main": time.thread_time(),
               "fs_calls": sum(_IO["counts"].values())}
        for name, procs in self.procs.items():
            out[name] = sum(_cpu(p) for p in procs)
        return out

    def start_run(self, client, run_id, geometry) -> None:
        self.run_id, self.geometry = run_id, geometry
        self.n = geometry.num_chunks * geometry.num_segments
        self.k = {max(1, self.n // 4): "q1", max(2, 3 * self.n // 4): "q3"}
        self.marks["start_run"] = self.snap()
        self.done = dict.fromkeys(range(geometry.num_chunks), 0)
        if self.profiles is not None:
            self.profiles.start()

    def warmup_block(self, round_index, rounds, chunk, result, chunks_done, chunks) -> None:
        self.rounds.append({"round": round_index, "chunk": chunk, "seconds": result.seconds,
                            "compile_seconds": result.compile_seconds, "received": time.time()})

    def sample_block(self, chunk, segment, result, chain_draws) -> None:
        self.count += 1
        self.blocks.append({"chunk": chunk, "segment": segment, "received": time.time(),
                            "seconds": result.seconds, "compile_seconds": result.compile_seconds,
                            "write_seconds": result.write_seconds})
        if self.count in self.k:
            self.marks[self.k[self.count]] = self.snap()
        if self.count == self.n:
            self.marks["last"] = self.snap()
            if self.profiles is not None:
                self.profiles.stop()
        elif self.profiles is not None:  # a wave's last block: the monitor may check it now
            wave = min(self.done.values())
            self.done[chunk] = segment + 1
            self.profiles.pause(min(self.done.values()) > wave)
        self.last_main = time.thread_time()

    def convergence_check(self, check) -> None:
        now = time.thread_time()
        self.checks.append({"after_block": self.count, "cpu_s": now - self.last_main, "draws": check.get("draws")})
        self.last_main = now
        if self.profiles is not None:
            self.profiles.pause(False)


def _cpu(proc) -> float:
    try:
        t = proc.cpu_times()
        return t.user + t.system
    except Exception:  # noqa: BLE001 - a process that ended counts nothing more
        return 0.0


def _driver(cfg: dict) -> dict:
    """One worker count: prime, grow, idle rates, the memory and store runs, the barrier runs, the profile."""
    import logging
    import warnings

    warnings.simplefilter("ignore")
    logging.getLogger("distributed").setLevel(logging.ERROR)
    from distributed import Client

    import dhmc
    from dhmc import geometry as geo

    dps = max(geo.MIN_DRAWS_PER_SEGMENT, math.ceil(geo.BLOCK_CHAIN_DRAWS / cfg["chains_per_task"]))
    cfg = {**cfg, "draws_per_segment": dps}
    record = {"workers": cfg["workers"], "hosts": len(cfg["host_pids"]),
              "dhmc": {"path": str(Path(dhmc.__file__).resolve().parents[1]), "version": dhmc.__version__}}
    pids = {"scheduler": [cfg["scheduler_pid"]], "hosts": cfg["host_pids"]}
    import dask

    dask.config.set({"dhmc.direct-to-workers": cfg.get("direct", True)})  # what a cluster object's driver does
    client = Client(cfg["address"], set_as_default=False, timeout=30)
    try:
        client.wait_for_workers(len(cfg["host_pids"]), timeout=120)
        client.get_task_stream()  # installs the scheduler's task-stream plugin
        t = time.perf_counter()
        record["prime"] = _prime(client, cfg)
        record["prime"]["seconds"] = time.perf_counter() - t
        t = time.perf_counter()
        client.run(_grow, workers=_first_worker_per_host(client))
        client.wait_for_workers(cfg["workers"], timeout=300)
        record["grow_s"] = time.perf_counter() - t
        record["idle"] = _idle_rates(pids)
        record["memory"] = _throughput(client, cfg, pids, store=None)
        record["store"] = _throughput(client, cfg, pids, store=os.path.join(cfg["tmp"], "store.zarr"))
        if cfg["barrier"] and cfg["workers"] in cfg["barrier_workers"]:
            record["barrier"] = {"slow": _barrier(client, cfg, pids, slow=True),
                                 "even": _barrier(client, cfg, pids, slow=False)}
        if cfg["profile"]:
            record["profile"] = {"memory": _profiled(client, cfg, pids, None),
                                 "store": _profiled(client, cfg, pids, os.path.join(cfg["tmp"], "profiled.zarr"))}
    finally:
        client.close()
    return record


def _sample(client, cfg, chunks, draws, observers, **kw):
    import numpy as np

    import dhmc

    options = dict(warmup=0, kernel="hmc", step_size=cfg["step_size"], num_steps=cfg["num_steps"])
    options.update(kw)
    return dhmc.sample(log_density, init={"x": np.zeros(cfg["dim"], np.float32)},
                       chains=chunks * cfg["chains_per_task"],
                       draws=draws, chains_per_task=cfg["chains_per_task"], cluster=client, progress=False,
                       observers=observers, seed=cfg.get("seed", 0), **options)


def _prime(client, cfg) -> dict:
    """Compile every program of the measured runs once in every host (one worker each so far): a host's workers
    share its programs, and 16 of them compiling at once in one process would take minutes. A first run of one block
    compiles them on one host (into the shared compilation cache), the next loads them on every host."""
    hosts, barrier = len(cfg["host_pids"]), cfg["barrier"] and cfg["workers"] in cfg["barrier_workers"]
    out = {"runs": []}
    for tries, chunks in enumerate([1, 2 * hosts, 2 * hosts, 2 * hosts], start=1):
        t = time.perf_counter()
        _sample(client, cfg, chunks, cfg["draws_per_segment"], [])
        out["runs"].append({"chunks": chunks, "sample_s": time.perf_counter() - t})
        if barrier:
            t = time.perf_counter()
            _sample(client, cfg, chunks, 1, [], warmup=cfg["barrier_warmup"], kernel="chees", step_size=None,
                    num_steps=None)
            out["runs"][-1]["barrier_s"] = time.perf_counter() - t
        programs = {r["pid"]: r["programs"] for r in client.run(_programs).values()}
        out.update(tries=tries, programs_per_host=sorted(programs.values()))
        if len(programs) == hosts and min(programs.values()) >= (3 if barrier else 1):
            break
    return out


def _first_worker_per_host(client) -> list[str]:
    firsts = {}
    for address, w in client.scheduler_info(n_workers=-1)["workers"].items():
        host = str(w.get("name", address)).rsplit("-", 1)[0]
        firsts.setdefault(host, address)
    return list(firsts.values())


def _idle_rates(pids) -> dict:
    """CPU seconds a second of the scheduler and the hosts with every worker connected and nothing to run, and
    their resident memory."""
    watch = Watch(pids)
    a = watch.snap()
    time.sleep(IDLE_SECONDS)
    b = watch.snap()
    wall = b["wall"] - a["wall"]
    out = {name: (b[name] - a[name]) / wall for name in pids}
    for name, procs in watch.procs.items():
        out[f"{name}_rss_gib"] = sum(p.memory_info().rss for p in procs) / 2**30
    return out


def _throughput(client, cfg, pids, store, profiles=None, segments=None) -> dict:
    """One run of ``chunks_per_worker x workers`` chunks: its rates, CPU per block, latencies (and store ops)."""
    chunks = cfg["chunks_per_worker"] * cfg["workers"]
    segments = segments or max(cfg["min_segments"], math.ceil(cfg["blocks"] / chunks))
    watch = Watch(pids, profiles)
    count = store is not None and cfg["fs_calls"]
    if count:
        _store_io_begin(client, store)
    tree = _sample(client, cfg, chunks, segments * cfg["draws_per_segment"], [watch], store=store)
    out = _run_summary(tree, watch)
    out.update(_rates(watch, out["blocks"], cfg, pids))
    out.update(_latency(client, watch))
    lat = out["latency"]
    if lat["to_driver"] and lat["task_compute"]:  # finished blocks queue for the driver: its loop sets the pace
        out["driver_bound"] = lat["to_driver"]["median_ms"] > 2 * lat["task_compute"]["median_ms"]
    if store is not None:
        out["store_files"] = store_files(store, out["blocks"])
        if count:
            out["store_calls"] = _store_io_end(client, out["blocks"])
        shutil.rmtree(store, ignore_errors=True)
    del tree
    return out


def _run_summary(tree, watch) -> dict:
    timing = json.loads(tree["posterior"].attrs["dhmc_timing"])
    spec = json.loads(tree["posterior"].attrs["dhmc_run_spec"])
    geometry = watch.geometry
    blocks = geometry.num_chunks * geometry.num_segments
    sampling = timing["sampling"] + timing["writing"]
    sample = watch.blocks
    return {"chains": spec["chains"], "draws": spec["draws"], "chains_per_task": spec["chains_per_task"],
            "draws_per_segment": spec["draws_per_segment"], "chunks": geometry.num_chunks,
            "segments": geometry.num_segments, "blocks": blocks, "timing": timing,
            "blocks_per_s": blocks / sampling if sampling > 0 else None,
            "block_device_ms_median": 1e3 * statistics.median(b["seconds"] for b in sample) if sample else None,
            "block_write_ms_median": 1e3 * statistics.median(b["write_seconds"] for b in sample) if sample else None,
            "blocks_compiled": sum(1 for b in sample if (b["compile_seconds"] or 0) > 0)}


def _rates(watch: Watch, blocks: int, cfg, pids) -> dict:
    """CPU per block of the driver, the scheduler and the hosts: the steady window (blocks n/4 .. 3n/4, less the
    monitor's checks in it) and the whole sampling phase (start_run .. last block)."""
    m = watch.marks
    out = {}
    if "q1" in m and "q3" in m and watch.k:
        (k1, _), (k3, _) = sorted(watch.k.items())
        n = k3 - k1
        checks = sum(c["cpu_s"] for c in watch.checks if k1 <= c["after_block"] < k3)  # after q1's mark, before q3's
        wall = m["q3"]["wall"] - m["q1"]["wall"]
        steady = {"blocks": n, "wall_s": wall, "blocks_per_s": n / wall, "wall_ms_per_block": 1e3 * wall / n,
                  "monitor_check_cpu_s": checks,
                  "driver_cpu_ms_per_block": 1e3 * (m["q3"]["driver"] - m["q1"]["driver"] - checks) / n,
                  "driver_main_thread_cpu_ms_per_block": 1e3 * (m["q3"]["driver_main"] - m["q1"]["driver_main"]
                                                                - checks) / n,
                  "driver_cpu_share_of_a_core": (m["q3"]["driver"] - m["q1"]["driver"]) / wall,
                  "driver_fs_calls_per_block": (m["q3"]["fs_calls"] - m["q1"]["fs_calls"]) / n}
        for name in pids:
            used = m["q3"][name] - m["q1"][name]
            steady[f"{name}_cpu_ms_per_block"] = 1e3 * used / n
            steady[f"{name}_cpu_share_of_a_core"] = used / wall
        out["steady"] = steady
    if "start_run" in m and "last" in m:
        a, b = m["start_run"], m["last"]
        checks = sum(c["cpu_s"] for c in watch.checks if c["after_block"] < blocks)  # the last one follows "last"
        out["phase"] = {"blocks": blocks, "wall_s": b["wall"] - a["wall"], "monitor_checks": len(watch.checks),
                        "monitor_check_cpu_s": checks,
                        "driver_cpu_ms_per_block": 1e3 * (b["driver"] - a["driver"]) / blocks,
                        "driver_cpu_ms_per_block_less_checks": 1e3 * (b["driver"] - a["driver"] - checks) / blocks,
                        **{f"{name}_cpu_ms_per_block": 1e3 * (b[name] - a[name]) / blocks for name in pids}}
    return out


def _stream(client, watch) -> dict:
    """This run's tasks in the scheduler's task stream: ``{(phase, index, chunk): (start, stop, worker)}``."""
    spans = {}
    try:
        records = client.get_task_stream(start=watch.t0)
    except Exception:  # noqa: BLE001 - no task stream: no latency figures
        return spans
    prefix = f"{watch.run_id}-"
    for r in records or []:
        key = str(r.get("key"))
        if not key.startswith(prefix):
            continue
        parts = key[len(prefix):].split("-")
        if len(parts) < 4 or not parts[1].isdigit() or not parts[2].isdigit():
            continue
        for ss in r.get("startstops", []):
            if ss.get("action") == "compute":
                spans[(parts[0], int(parts[1]), int(parts[2]))] = (ss["start"], ss["stop"], r.get("worker"))
    return spans


def _latency(client, watch) -> dict:
    """Milliseconds (median, 90th percentile) from the task stream and the observer's arrivals."""
    spans = _stream(client, watch)
    got = {(b["chunk"], b["segment"]): b["received"] for b in watch.blocks}
    turnaround, to_driver, submit_start, compute = [], [], [], []
    for (phase, chunk, segment), (start, stop, _) in spans.items():
        if phase != "sample":
            continue
        compute.append(stop - start)
        if (chunk, segment) in got:
            to_driver.append(got[chunk, segment] - stop)
        nxt = spans.get(("sample", chunk, segment + 1))
        if nxt is not None:
            turnaround.append(nxt[0] - stop)
            if (chunk, segment) in got:
                submit_start.append(nxt[0] - got[chunk, segment])
    gaps = []
    by_worker = {}
    for (phase, _, _), (start, stop, worker) in spans.items():
        if phase == "sample":
            by_worker.setdefault(worker, []).append((start, stop))
    for runs in by_worker.values():
        runs.sort()
        gaps += [b[0] - a[1] for a, b in zip(runs, runs[1:], strict=False)]
    stat = lambda xs: None if not xs else {"median_ms": 1e3 * statistics.median(xs),
                                           "p90_ms": 1e3 * sorted(xs)[int(0.9 * (len(xs) - 1))], "n": len(xs)}
    return {"latency": {"turnaround": stat(turnaround), "to_driver": stat(to_driver),
                        "submit_to_start": stat(submit_start), "worker_idle_gap": stat(gaps),
                        "task_compute": stat(compute)},
            "workers_used": len(by_worker)}


def _store_io_begin(client, store) -> None:
    """Count the store's file system calls in the driver and in every host from now on."""
    prefix = os.path.abspath(store)
    _watch_store_io(prefix)
    client.run(_io_counts, prefix)


def _store_io_end(client, blocks) -> dict:
    """The calls counted since :func:`_store_io_begin`, per block: by kind and by path, the driver's and the
    workers' (every host's, summed); counting stops."""
    driver, driver_patterns = dict(_IO["counts"]), dict(_IO["patterns"])
    hosts = {r["pid"]: r for r in client.run(_io_counts).values()}
    workers, worker_patterns = {}, {}
    for r in hosts.values():
        for total, counts in ((workers, r["counts"]), (worker_patterns, r["patterns"])):
            for k, v in counts.items():
                total[k] = total.get(k, 0) + v
    _IO["prefix"] = None
    per = lambda counts: {k: v / blocks for k, v in sorted(counts.items())}
    return {"driver_per_block": per(driver), "workers_per_block": per(workers),
            "driver_total_per_block": sum(driver.values()) / blocks,
            "workers_total_per_block": sum(workers.values()) / blocks,
            "driver_by_path_per_block": per(driver_patterns), "workers_by_path_per_block": per(worker_patterns)}


def store_files(store, blocks: int) -> dict:
    """Files in a finished store by kind (:func:`store_kind`), in all and per block."""
    counts = {}
    for folder, _, files in os.walk(store):
        rel = os.path.relpath(folder, store)
        for f in files:
            kind = store_kind(os.path.join(rel, f) if rel != "." else f)
            counts[kind] = counts.get(kind, 0) + 1
    return {"total": sum(counts.values()), "per_block": sum(counts.values()) / blocks,
            "by_kind": counts, "by_kind_per_block": {k: v / blocks for k, v in sorted(counts.items())}}


def _barrier(client, cfg, pids, slow: bool) -> dict:
    """A fixed warmup of 5 rounds (each a barrier), one worker made slow_factor times slower than the others, or none."""
    chunks = cfg["barrier_chunks_per_worker"] * cfg["workers"]
    watch = Watch(pids)
    # the others share the cores: each runs at cores / workers of one, and the slow one, resumed, takes a whole core
    # (the kernel favours a task that waited): for it to be slow_factor x slower than they are, it runs this share
    share = 1 / (cfg["slow_factor"] * max(1.0, cfg["workers"] / _cores()))
    throttle = None
    if slow:  # a process of its own: a thread here would wait for this process's GIL between signals
        throttle = subprocess.Popen([sys.executable, "-P", str(SCRIPT), "--role", "throttle", "--config",
                                     json.dumps({"pid": cfg["slow_pid"], "share": share, "parent": os.getpid()})])
    try:
        tree = _sample(client, cfg, chunks, 1, [watch], warmup=cfg["barrier_warmup"], kernel="chees", step_size=None,
                       num_steps=None)
    finally:
        if throttle is not None:
            throttle.terminate()
            throttle.wait(10)
            _resume(cfg["slow_pid"])
    timing = json.loads(tree["posterior"].attrs["dhmc_timing"])
    spans = _stream(client, watch)
    slow_worker = next((a for a, w in client.scheduler_info(n_workers=-1)["workers"].items()
                        if str(w.get("name", "")).startswith("slow-")), None)
    rounds = [_round(i, r, watch, spans, slow_worker, cfg["workers"]) for i, r in enumerate(timing["warmup_rounds"])]
    later = rounds[1:] or rounds  # round 0 also finds the first step size
    med = lambda key: _median([r[key] for r in later])
    out = {"slow": slow, "slow_factor": cfg["slow_factor"] if slow else 1.0, "run_share": share if slow else 1.0,
           "chunks": chunks, "warmup": cfg["barrier_warmup"], "warmup_s": timing.get("warmup"), "rounds": rounds}
    for key in ("round_s", "block_s_median", "block_s_max", "task_s_median", "task_s_max", "slow_task_over_median",
                "idle_share", "idle_worker_s", "round_over_block_max", "sync_s", "sync_ms_per_block"):
        out[f"median_{key}"] = med(key)
    return out


def _round(i: int, r: dict, watch: Watch, spans: dict, slow_worker, workers: int) -> dict:
    """One warmup round: its wall time, its blocks' device seconds (median, max), its tasks' compute spans, and the
    workers' time it left idle (workers x wall - the compute spans in it)."""
    device = [b["seconds"] for b in watch.rounds if b["round"] == i]
    mine = [(stop - start, w) for (phase, index, _), (start, stop, w) in spans.items()
            if phase in ("warmup", "cold") and index == i]
    others = [d for d, w in mine if w != slow_worker]
    slowest = max((d for d, w in mine if w == slow_worker), default=None)
    busy = sum(d for d, _ in mine)
    return {"round": i, "round_s": r["seconds"], "block_s_max": r["block_seconds_max"],
            "block_s_median": _median(device), "task_s_median": _median([d for d, _ in mine]),
            "task_s_max": max((d for d, _ in mine), default=None),
            "slow_worker_tasks": sum(1 for _, w in mine if w == slow_worker),
            "slow_task_over_median": slowest / _median(others) if slowest and others else None,
            "sync_s": r["seconds"] - r["block_seconds_max"],
            "sync_ms_per_block": 1e3 * (r["seconds"] - r["block_seconds_max"]) / len(device) if device else None,
            "round_over_block_max": r["seconds"] / r["block_seconds_max"] if r["block_seconds_max"] else None,
            "idle_share": 1 - busy / (workers * r["seconds"]) if mine else None,
            "idle_worker_s": workers * r["seconds"] - busy if mine else None}


def _median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _throttle(cfg: dict) -> None:
    """Let process ``cfg["pid"]`` run ``cfg["share"]`` of every :data:`SLOW_PERIOD` seconds (SIGSTOP the rest) until
    SIGTERM or the driver is gone; always leave it running."""
    pid, run, parent = cfg["pid"], SLOW_PERIOD * cfg["share"], cfg["parent"]
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.is_set() and os.getppid() == parent:
            os.kill(pid, signal.SIGSTOP)
            time.sleep(SLOW_PERIOD - run)
            os.kill(pid, signal.SIGCONT)
            time.sleep(run)
    except ProcessLookupError:
        pass
    finally:
        _resume(pid)


def _resume(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def _profiled(client, cfg, pids, store) -> dict:
    """A run again (``profile_segments`` segments), watched over its sampling phase (``start_run`` to the last block)
    by :class:`Profiles`: each driver thread's CPU per block, and the top functions per block of the three threads
    that do the work."""
    profiles = Profiles(client)
    out = _throughput(client, cfg, pids, store, profiles=profiles, segments=cfg["profile_segments"])
    phase, steady = out.get("phase", {}), out.get("steady", {})
    return {"blocks": out["blocks"], "driver_cpu_ms_per_block_steady": steady.get("driver_cpu_ms_per_block"),
            "driver_cpu_ms_per_block_phase": phase.get("driver_cpu_ms_per_block"),
            "wall_ms_per_block_steady": steady.get("wall_ms_per_block"),
            "monitor_checks_cpu_ms_per_block": 1e3 * phase.get("monitor_check_cpu_s", 0.0) / out["blocks"],
            **profiles.summary(out["blocks"])}


class Profiles:
    """cProfile in the driver's main thread (dhmc's driver loop, paused over the convergence monitor's wave checks;
    timed by the wall clock, so that its waits show), its Dask client's event-loop thread (``IO loop``: messages,
    results' deserialisation) and zarr's event-loop thread (``zarr_io``: a store's reads and writes), both timed by
    their own CPU clocks; and every thread's CPU between :meth:`start` and :meth:`stop` (``pthread_getcpuclockid``).
    Nothing of dhmc is patched."""

    def __init__(self, client):
        import cProfile

        self.client = client
        self.main = cProfile.Profile(time.perf_counter)  # wall: where dhmc's loop waits, too
        self.loop, self.zarr = cProfile.Profile(time.thread_time), cProfile.Profile(time.thread_time)
        self.clocks, self.cpu, self.paused, self.checks_s = {}, {}, False, 0.0

    def start(self) -> None:
        self.clocks = _thread_clocks()
        _in_thread(lambda fn: self.client.loop.add_callback(fn), self.loop.enable)
        _in_thread(lambda fn: _zarr_loop().call_soon_threadsafe(fn), self.zarr.enable)
        self.main.enable()

    def stop(self) -> None:
        self.main.disable()
        _in_thread(lambda fn: self.client.loop.add_callback(fn), self.loop.disable)
        _in_thread(lambda fn: _zarr_loop().call_soon_threadsafe(fn), self.zarr.disable)
        end = _thread_clocks()
        for ident, (name, cpu) in end.items():
            group = _thread_group(name)
            self.cpu[group] = self.cpu.get(group, 0.0) + cpu - self.clocks.get(ident, (name, 0.0))[1]

    def pause(self, on: bool) -> None:
        """Off while the convergence monitor may check a wave (from a wave's last block to the next event)."""
        if on and not self.paused:
            self.main.disable()
        elif not on and self.paused:
            self.main.enable()
        self.paused = on

    def summary(self, blocks: int, n: int = 30) -> dict:
        import pstats

        ms = lambda v: 1e3 * v / blocks
        out = {"threads_cpu_ms_per_block": {k: ms(v) for k, v in sorted(self.cpu.items(), key=lambda kv: -kv[1])
                                            if v > 0}}
        for name, profiler in (("main_thread_wall", self.main), ("client_loop_thread_cpu", self.loop),
                               ("zarr_loop_thread_cpu", self.zarr)):
            try:
                stats = pstats.Stats(profiler)
            except TypeError:  # nothing recorded (no store: zarr's loop never ran)
                continue
            rows = [{"function": f"{_short(file)}:{line}({fn})", "calls_per_block": nc / blocks,
                     "own_ms_per_block": ms(tt), "cumulative_ms_per_block": ms(ct)}
                    for (file, line, fn), (_, nc, tt, ct, _) in stats.stats.items() if file != str(SCRIPT)]
            out[name] = {"profiled_ms_per_block": ms(stats.total_tt),
                         "top_cumulative": sorted(rows, key=lambda r: -r["cumulative_ms_per_block"])[:n],
                         "top_own": sorted(rows, key=lambda r: -r["own_ms_per_block"])[:n]}
        return out


def _thread_clocks() -> dict:
    """``{ident: (name, CPU seconds)}`` of this process's threads."""
    out = {}
    for t in threading.enumerate():
        try:
            out[t.ident] = (t.name, time.clock_gettime(time.pthread_getcpuclockid(t.ident)))
        except (OSError, AttributeError, TypeError):
            pass
    return out


def _zarr_loop():
    from zarr.core.sync import _get_loop

    return _get_loop()


def _in_thread(schedule, fn) -> None:
    """Call ``fn`` in another thread's event loop (``schedule(callback)`` puts it there) and wait for it."""
    done = threading.Event()

    def call():
        try:
            fn()
        finally:
            done.set()

    schedule(call)
    done.wait(10)


def _thread_group(name: str) -> str:
    """A thread's kind by its name: numbered pool threads of one pool are one kind."""
    import re

    return re.sub(r"[_-]?\d+$", "", name) or name


def _short(file: str) -> str:
    for marker in ("site-packages/", "/dhmc/", "lib/python3"):
        if marker in file:
            tail = file.split(marker, 1)[1]
            return ("dhmc/" + tail) if marker == "/dhmc/" else tail
    return file


# -- the benchmark's process: start the cluster, run the driver, clean up ---------------------------------------------

class Cluster:
    """A scheduler and worker hosts in processes of their own, for one worker count; :meth:`close` ends them all."""

    def __init__(self, workers: int, per_host: int, env: dict, tmp: str, timeout: float = 180):
        self.tmp, self.env, self.procs, self.logs = tmp, env, [], []
        self.workers = workers
        try:
            self._start_all(workers, per_host, timeout)
        except BaseException:
            self.close()
            raise

    def _start_all(self, workers: int, per_host: int, timeout: float) -> None:
        info = self._start("scheduler", {}, timeout)
        self.address, self.scheduler_pid = info["address"], info["pid"]
        # the slow worker (throttled in the barrier runs only) is alone in its host; the others fill hosts of per_host
        sizes = [1] + [len(c) for c in _split(workers - 1, per_host)]
        self.slow_pid, self.host_pids = None, []
        pending = []
        for i, n in enumerate(sizes):
            name = "slow" if i == 0 else f"host{i}"
            cfg = {"address": self.address, "workers": n, "name": name, "local": os.path.join(self.tmp, name),
                   "store_prefix": os.path.join(self.tmp, "none")}
            pending.append(self._launch("host", cfg, name))
        for ready, proc in pending:
            pid = self._wait(ready, proc, timeout)["pid"]
            self.host_pids.append(pid)
        self.slow_pid = self.host_pids[0]

    def _start(self, role, cfg, timeout):
        ready, proc = self._launch(role, cfg, role)
        return self._wait(ready, proc, timeout)

    def _launch(self, role: str, cfg: dict, name: str):
        ready = os.path.join(self.tmp, f"{name}.ready")
        cfg = {**cfg, "ready": ready, "parent": os.getpid()}
        log = open(os.path.join(self.tmp, f"{name}.log"), "w")  # noqa: SIM115 - closed in close()
        proc = subprocess.Popen([sys.executable, "-P", str(SCRIPT), "--role", role, "--config", json.dumps(cfg)],
                                stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.tmp)
        self.procs.append(proc)
        self.logs.append(log)
        return ready, proc

    def _wait(self, ready: str, proc, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while not os.path.exists(ready):
            if proc.poll() is not None:
                raise RuntimeError(f"{Path(ready).stem} exited with status {proc.returncode}:\n{self.tail(ready)}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{Path(ready).stem} not ready after {timeout:.0f} s:\n{self.tail(ready)}")
            time.sleep(0.1)
        return json.loads(Path(ready).read_text())

    def tail(self, ready: str, n: int = 3000) -> str:
        try:
            return Path(ready).with_suffix(".log").read_text()[-n:]
        except OSError:
            return ""

    def close(self) -> None:
        """Resume a stopped host, then end the hosts and the scheduler (SIGTERM, SIGKILL after 10 s)."""
        for proc in self.procs:
            if proc.poll() is None:
                for sig in (signal.SIGCONT, signal.SIGTERM):
                    try:
                        proc.send_signal(sig)
                    except ProcessLookupError:
                        pass
        deadline = time.monotonic() + 10
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        for log in self.logs:
            log.close()


def _split(n: int, size: int) -> list[range]:
    return [range(i, min(i + size, n)) for i in range(0, n, size)]


def _child_env(dhmc_path: str | None, cache: str) -> dict:
    """The children's environment: ``dhmc`` from ``dhmc_path`` (or the PYTHONPATH given, else this repository),
    this repository's ``benchmarks`` after it; JAX on CPUs; a compilation cache of this benchmark's own (empty at its
    start, shared by its hosts: one compiles a block program, the others load it)."""
    paths = [p for p in (dhmc_path, *os.environ.get("PYTHONPATH", "").split(os.pathsep), str(REPO)) if p]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths)), "JAX_PLATFORMS": "cpu",
            "PYTHONUNBUFFERED": "1", "DHMC_COMPILATION_CACHE": "1", "DHMC_CACHE_DIR": cache}


def measure(workers: int, settings: dict, env: dict, profile: bool, timeout: float) -> dict:
    """One worker count, in a fresh cluster: the driver's record (or ``{"error": ...}``)."""
    tmp = tempfile.mkdtemp(prefix="dhmc-scale-")
    cluster, record = None, {"workers": workers}
    t, load = time.perf_counter(), os.getloadavg()
    try:
        cluster = Cluster(workers, settings["per_host"], env, tmp)
        started = time.perf_counter() - t
        cfg = {**settings, "workers": workers, "parent": os.getpid(), "address": cluster.address,
               "scheduler_pid": cluster.scheduler_pid, "host_pids": cluster.host_pids, "slow_pid": cluster.slow_pid,
               "tmp": tmp, "profile": profile}
        record = _run_driver(cfg, env, tmp, timeout)
        record["cluster_start_s"] = started
    except Exception as e:  # noqa: BLE001 - one worker count failing leaves the others' numbers
        record = {"workers": workers, "error": f"{type(e).__name__}: {e}"}
    finally:
        if cluster is not None:
            cluster.close()
        shutil.rmtree(tmp, ignore_errors=True)
        record.update(seconds=time.perf_counter() - t, loadavg_1min_before_after=[load[0], os.getloadavg()[0]])
        print(f"  {workers} workers: {record['seconds']:.0f} s, load average {load[0]:.1f} -> "
              f"{record['loadavg_1min_before_after'][1]:.1f}{' ERROR' if 'error' in record else ''}", flush=True)
    return record


def _run_driver(cfg: dict, env: dict, tmp: str, timeout: float) -> dict:
    argv = [sys.executable, "-P", str(SCRIPT), "--role", "driver", "--config", json.dumps(cfg)]
    with open(os.path.join(tmp, "driver.log"), "w") as err:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=tmp)
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            return {"workers": cfg["workers"], "error": f"driver timed out after {timeout:.0f} s",
                    "stderr_tail": Path(tmp, "driver.log").read_text()[-3000:]}
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"workers": cfg["workers"], "error": f"driver exit status {proc.returncode}",
                "stderr_tail": Path(tmp, "driver.log").read_text()[-3000:]}
    return json.loads(lines[-1])


def model(records: list[dict]) -> dict:
    """``W_max = T / c``: the workers one core of the driver (scheduler) keeps busy with blocks of T seconds, from the
    largest worker count's steady CPU per block (memory and store runs); and from the driver loop's wall time per
    block (``driver_loop_wall``: it handles blocks one after the other, waiting on the scheduler and zarr in between),
    which bounds W when the loop set the pace (``driver_bound``: finished blocks waited for it)."""
    ok = [r for r in records if "error" not in r]
    if not ok:
        return {}
    top = max(ok, key=lambda r: r["workers"])
    out = {"from_workers": top["workers"], "block_seconds": list(T_MODEL)}
    for mode in ("memory", "store"):
        steady = top.get(mode, {}).get("steady")
        if not steady:
            continue
        row = {}
        for who, key in (("driver", "driver_cpu_ms_per_block"), ("scheduler", "scheduler_cpu_ms_per_block"),
                         ("scheduler_less_idle", "scheduler_cpu_ms_per_block_less_idle"),
                         ("driver_loop_wall", "wall_ms_per_block")):
            c = steady.get(key)
            if c and c > 0:
                row[f"{who}_ms_per_block"] = c
                row[f"{who}_w_max"] = {str(t): t / (c / 1e3) for t in T_MODEL}
        # the loop's wall per block bounds W only when it set the pace (finished blocks queued for it)
        row["driver_bound"] = top[mode].get("driver_bound")
        out[mode] = row
    return out


def _less_idle(record: dict) -> None:
    """Add the scheduler's CPU per block less its idle (heartbeat) rate over the same wall time."""
    idle = record.get("idle", {}).get("scheduler")
    for mode in ("memory", "store"):
        steady = record.get(mode, {}).get("steady")
        if steady and idle is not None:
            steady["scheduler_cpu_ms_per_block_less_idle"] = (
                steady["scheduler_cpu_ms_per_block"] - 1e3 * idle * steady["wall_s"] / steady["blocks"])


def rows_for(records: list[dict]) -> list[dict]:
    """The table's rows: one per worker count and run (memory, store)."""
    rows = []
    for r in records:
        if "error" in r:
            rows.append({"workers": r["workers"], "mode": "error"})
            continue
        for mode in ("memory", "store"):
            run = r.get(mode)
            if not run:
                continue
            steady, lat = run.get("steady", {}), run.get("latency", {})
            median = lambda key, lat=lat: (lat.get(key) or {}).get("median_ms")
            rows.append({"workers": r["workers"], "mode": mode, "blocks": run["blocks"], "bps": run["blocks_per_s"],
                         "driver": steady.get("driver_cpu_ms_per_block"), "wall": steady.get("wall_ms_per_block"),
                         "sched": steady.get("scheduler_cpu_ms_per_block"),
                         "sched_net": steady.get("scheduler_cpu_ms_per_block_less_idle"),
                         "hosts": steady.get("hosts_cpu_ms_per_block"), "device": run.get("block_device_ms_median"),
                         "submit": median("submit_to_start"), "to_driver": median("to_driver"),
                         "turn": median("turnaround"), "files": run.get("store_files", {}).get("per_block"),
                         "checks": run.get("phase", {}).get("monitor_check_cpu_s"),
                         "calls_drv": run.get("store_calls", {}).get("driver_total_per_block"),
                         "calls_wrk": run.get("store_calls", {}).get("workers_total_per_block")})
    return rows


def barrier_rows(records: list[dict]) -> list[dict]:
    rows = []
    for r in records:
        barrier = r.get("barrier")
        if not barrier:
            continue
        row = {"workers": r["workers"], "slow_ratio": barrier["slow"]["median_slow_task_over_median"]}
        for kind in ("slow", "even"):
            for key in ("round_s", "block_s_median", "block_s_max", "idle_share", "sync_ms_per_block"):
                row[f"{key}_{kind}"] = barrier[kind][f"median_{key}"]
        rows.append(row)
    return rows


COLUMNS = [("workers", "W", "d"), ("mode", "run", ""), ("blocks", "blocks", "d"), ("bps", "blocks/s", ".1f"),
           ("driver", "driver CPU ms/blk", ".2f"), ("wall", "wall ms/blk", ".1f"),
           ("sched", "sched CPU ms/task", ".2f"), ("sched_net", "(-idle)", ".2f"), ("hosts", "hosts ms/blk", ".1f"),
           ("checks", "checks s", ".1f"), ("device", "device ms", ".1f"), ("submit", "submit->start ms", ".1f"),
           ("to_driver", "->driver ms", ".0f"),
           ("turn", "turnaround ms", ".0f"), ("files", "files/blk", ".2f"), ("calls_drv", "fs calls drv/blk", ".1f"),
           ("calls_wrk", "wrk/blk", ".1f")]
BARRIER_COLUMNS = [("workers", "W", "d"), ("slow_ratio", "slow/median task", ".1f"),
                   ("round_s_slow", "round s", ".3f"), ("block_s_median_slow", "block s median", ".4f"),
                   ("block_s_max_slow", "block s max", ".4f"), ("idle_share_slow", "idle share", ".2f"),
                   ("sync_ms_per_block_slow", "sync ms/blk", ".1f"),
                   ("round_s_even", "| none slow: round s", ".3f"), ("block_s_max_even", "block s max", ".4f"),
                   ("idle_share_even", "idle share", ".2f"), ("sync_ms_per_block_even", "sync ms/blk", ".1f")]
SETTINGS = ("workers", "chains_per_task", "dim", "chunks_per_worker", "blocks", "min_segments", "per_host",
            "barrier_warmup", "barrier_workers", "slow_factor")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--role", choices=("scheduler", "host", "driver", "throttle"), help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="1 and 8 workers, short runs (a smoke run)")
    ap.add_argument("--workers", type=lambda s: [int(x) for x in s.split(",")], default=None,
                    help="worker counts (default 1,8,32,128)")
    ap.add_argument("--chains-per-task", type=int, default=None, help="chains per block (default 64)")
    ap.add_argument("--dim", type=int, default=None, help="dimensions of the Gaussian (default 4)")
    ap.add_argument("--chunks-per-worker", type=int, default=None, help="chunks per worker (default 2)")
    ap.add_argument("--blocks", type=int, default=None, help="blocks per run, at least (default 96)")
    ap.add_argument("--min-segments", type=int, default=None, help="segments per run, at least (default 4)")
    ap.add_argument("--per-host", type=int, default=None, help="workers per worker host process (default 16)")
    ap.add_argument("--barrier-warmup", type=int, default=None, help="warmup iterations of the barrier runs (5000)")
    ap.add_argument("--barrier-workers", type=lambda s: [int(x) for x in s.split(",")], default=None,
                    help="worker counts with barrier runs (default 8,32)")
    ap.add_argument("--slow-factor", type=float, default=None, help="the slow worker gets 1/this of real time (10)")
    ap.add_argument("--no-barrier", action="store_true", help="no warmup-barrier runs")
    ap.add_argument("--no-fs-calls", action="store_true", help="no audit hook counting the store's file calls")
    ap.add_argument("--through-scheduler", action="store_true",
                    help="results through the scheduler (a Client(address)'s default), not from the workers "
                         "(dhmc.direct-to-workers: true, the default where the scheduler runs in the driver's process, "
                         "as SLURMCluster's and the embedded cluster's do)")
    ap.add_argument("--profile", dest="profile", action="store_true", default=None,
                    help="profile the driver at the largest worker count (default on, off with --quick)")
    ap.add_argument("--no-profile", dest="profile", action="store_false")
    ap.add_argument("--dhmc", default=None, help="a checkout whose dhmc to measure (default: as imported)")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per worker count's driver (900)")
    ap.add_argument("--out", default=None, help="the JSON (default benchmarks/results/scale.json)")
    args = ap.parse_args(argv)
    if args.role:
        return _role(args.role, json.loads(args.config))

    from benchmarks.harness import RESULTS, table, write_json
    from benchmarks.machine import cpu_line, machine

    settings = dict(QUICK if args.quick else FULL)
    settings.update({key: getattr(args, key) for key in SETTINGS if getattr(args, key) is not None})
    settings.update(barrier=not args.no_barrier, fs_calls=not args.no_fs_calls, direct=not args.through_scheduler)
    profile = (not args.quick) if args.profile is None else args.profile
    out = args.out or str(RESULTS / ("quick/scale.json" if args.quick else "scale.json"))
    cache = tempfile.mkdtemp(prefix="dhmc-scale-cache-")
    env = _child_env(args.dhmc and os.path.abspath(args.dhmc), cache)
    started, records, top = time.perf_counter(), [], max(settings["workers"])
    print(f"scale: workers {settings['workers']}, {settings['chains_per_task']} chains a task, dim {settings['dim']}, "
          f"{settings['chunks_per_worker']} chunks a worker, >= {settings['blocks']} blocks a run", flush=True)
    try:
        with _ending_children():
            for w in settings["workers"]:
                records.append(measure(w, settings, env, profile and w == top, args.timeout))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    for r in records:
        _less_idle(r)
    dhmc = next((r["dhmc"] for r in records if "dhmc" in r), None)
    if dhmc:
        dhmc.update(_git(dhmc["path"]))
    payload = {"benchmark": "scale", "machine": machine(), "settings": settings, "profile": profile, "dhmc": dhmc,
               "runs": records, "model": model(records)}
    write_json(out, payload)
    print(f"\n{cpu_line()}\ndhmc: {payload['dhmc']}\n")
    print(table(rows_for(records), COLUMNS))
    if barrier_rows(records):
        print(f"\nwarmup rounds (barriers), one worker made {settings['slow_factor']:g}x slower; medians over rounds 1-4; "
              "sync = round - slowest block, per block:")
        print(table(barrier_rows(records), BARRIER_COLUMNS))
    print()
    print(model_text(payload["model"]))
    failed = [r for r in records if "error" in r]
    for r in failed:
        print(f"ERROR {r['workers']} workers: {r['error']}\n{r.get('stderr_tail', '')[-1500:]}")
    print(f"\nwrote {out} ({time.perf_counter() - started:.0f} s)")
    return 1 if failed else 0


def _git(path: str) -> dict:
    """The commit of the checkout at ``path`` and whether its tracked files differ from it."""
    try:
        commit = subprocess.run(["git", "-C", path, "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "-C", path, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"commit": commit or None, "modified": bool(dirty)}


def model_text(m: dict) -> str:
    lines = []
    for mode in ("memory", "store"):
        if mode not in m:
            continue
        parts = [f"{who} {m[mode][f'{who}_ms_per_block']:.1f} ms -> W_max "
                 + "/".join(f"{v:.0f}" for v in m[mode][f"{who}_w_max"].values())
                 for who in ("driver", "driver_loop_wall", "scheduler", "scheduler_less_idle")
                 if f"{who}_w_max" in m[mode]]
        bound = " (the driver set the pace)" if m[mode].get("driver_bound") else ""
        lines.append(f"model, {mode}, from {m['from_workers']} workers, W_max for T = "
                     f"{'/'.join(f'{t:g}' for t in m['block_seconds'])} s{bound}: " + "; ".join(parts))
    return "\n".join(lines)


class _ending_children:
    """SIGTERM in the benchmark's process unwinds it (the clusters' ``finally`` ends their processes)."""

    def __enter__(self):
        self.previous = signal.signal(signal.SIGTERM, _raise_interrupt)
        return self

    def __exit__(self, *exc):
        signal.signal(signal.SIGTERM, self.previous)
        return False


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def _role(role: str, cfg: dict) -> int:
    if role == "scheduler":
        asyncio.run(_serve_scheduler(cfg))
    elif role == "host":
        asyncio.run(_serve_host(cfg))
    elif role == "throttle":
        _throttle(cfg)
    else:
        _watch_parent(cfg["parent"], cfg.get("slow_pid"))
        print(json.dumps(_driver(cfg), default=str), flush=True)
    return 0


def _watch_parent(parent: int, slow_pid: int | None = None) -> None:
    """End this process if the benchmark's process is gone (first letting the slow host run, so that it can see
    that it is orphaned too)."""

    def watch():
        while os.getppid() == parent:
            time.sleep(1)
        if slow_pid:
            try:
                os.kill(slow_pid, signal.SIGCONT)
            except OSError:
                pass
        os._exit(3)

    threading.Thread(target=watch, daemon=True, name="scale-parent").start()


def _write_atomic(path: str, text: str) -> None:
    Path(path + ".part").write_text(text)
    os.replace(path + ".part", path)


if __name__ == "__main__":
    sys.exit(main())

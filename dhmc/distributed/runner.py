"""The driver: plans blocks, submits them to a Dask cluster, merges warmup, streams draws to storage.

This is the one module that owns a ``Client``. Blocks are submitted per chunk of chains; each
chunk's next segment is submitted as soon as its previous one is written, so the store always
holds a prefix of every chunk and a resume continues exactly where the data ends.
"""

from __future__ import annotations

import hashlib
import time
import uuid

import cloudpickle
import numpy as np

from dhmc.core.adaptation.welford import WelfordState, welford
from dhmc.distributed import config
from dhmc.distributed.plan import RunSpec, warmup_rounds
from dhmc.distributed.worker import Job, run_job

RETRYABLE = ("CommClosedError", "FutureCancelledError", "CancelledError")  # lost, not crashed: sent again


class Runner:
    """Run one sampling job on a connected client.

    Parameters
    ----------
    client
        A connected ``distributed.Client``.
    spec
        The run's :class:`RunSpec`.
    target
        A picklable target (see :mod:`dhmc.models`).
    dim, dtype
        Size and dtype of the flat unconstrained position.
    sink
        Receives ``(chunk, segment, block)`` for every finished sampling block; its ``flush()``, if
        any, is called when sampling ends or is interrupted.
    executables
        ``{phase: Future of bytes}`` from :func:`precompile`, shipped with every full-sized block.
    """

    def __init__(self, client, spec: RunSpec, target, dim: int, dtype, sink, progress=None, executables=None,
                 store=None):
        from dhmc.observe.convergence import RunningConvergence

        self.client, self.spec, self.dim, self.dtype = client, spec, dim, np.dtype(dtype)
        plan = spec.plan
        self.convergence = RunningConvergence(plan.chains, plan.num_segments, plan.chains_per_task)
        self.started = time.perf_counter()
        self.blocks_done = 0
        self.sink, self.progress = sink, progress
        self.blob = _pickle(target)
        self.token = hashlib.sha1(self.blob).hexdigest()
        self.run_id = f"dhmc-{uuid.uuid4().hex[:8]}"
        self.timing = {"compile": 0.0, "warmup": 0.0, "sampling": 0.0, "writing": 0.0}
        self.max_retries = int(config.get("allowed-failures"))
        self.executables = executables or {}
        self.store = store

    # -- submission ---------------------------------------------------------------------------
    def _job(self, phase, chunk, first, n, positions, params, **kw) -> Job:
        chains = self.spec.plan.chunk(chunk)
        return Job(self.run_id, self.token, self.blob, self.spec.x64, self.spec.kernel_config, self.spec.seed,
                   phase, chains.start, chains.stop, first, n, positions, params,
                   executable=self._executable(phase, len(chains)), **kw)

    def _executable(self, phase: str, chains: int) -> bytes | None:
        future = self.executables.get(phase)
        if future is None or chains != self.spec.chains_per_task:
            return None
        try:
            return future.result()
        except Exception:  # noqa: BLE001 - workers compile for themselves
            return None

    def _submit(self, job: Job, key: str):
        return self.client.submit(run_job, job, key=f"{key}-{uuid.uuid4().hex[:6]}", pure=False, retries=0)

    def _result(self, future, job: Job, key: str):
        """The future's result, re-submitting a block lost to a dropped connection.

        A block whose workers died while running it (the scheduler's ``KilledWorker``, after
        ``dhmc.worker-crashes`` deaths on a cluster dhmc started) ends the run with
        :class:`~dhmc.errors.WorkerCrashError`.
        """
        for attempt in range(self.max_retries + 1):
            try:
                return future.result()
            except Exception as e:  # noqa: BLE001
                if type(e).__name__ == "KilledWorker":
                    raise crash_error(self.client, e, job, self.spec.model, self.store) from None
                if type(e).__name__ == "NoWorkerError":
                    raise self._no_workers_error(e) from None
                if type(e).__name__ not in RETRYABLE or attempt == self.max_retries:
                    raise
                future = self._submit(job, key)
        raise AssertionError("unreachable")

    def _no_workers_error(self, error):
        from dhmc.errors import NoWorkersError

        timeout = getattr(error, "timeout", None)
        waited = f" for {timeout:g} s" if timeout else ""
        hint = f"; every block finished before is in {self.store}: dhmc resume {self.store}" if self.store else ""
        lines = [f"the cluster had no worker{waited} while blocks of model {self.spec.model!r} "
                 f"waited to run (lost jobs, or workers out of restarts){hint}"]
        deaths = getattr(getattr(self.client, "cluster", None), "worker_deaths", lambda: [])()
        if deaths:
            last = deaths[-1]
            lines.append(f"{len(deaths)} worker process(es) ended; the last, {last.worker}, {last.describe()}")
            lines += [f"    {line}" for line in last.stderr_tail]
        return NoWorkersError("\n".join(lines))

    def _account(self, result):
        self.timing["compile"] = max(self.timing["compile"], result["compile_seconds"])

    # -- warmup -------------------------------------------------------------------------------
    def warmup(self, positions: np.ndarray, params: dict) -> tuple[np.ndarray, dict, list[dict]]:
        """Adaptive warmup in rounds; after each round the chunks' statistics are merged in chain order."""
        spec, plan = self.spec, self.spec.plan
        start = time.perf_counter()
        history: list[dict] = []
        wf = welford(spec.dense_mass, xp=np)
        rounds = warmup_rounds(spec.warmup) if spec.adapt else [spec.warmup]
        first = 0
        for r, n in enumerate(rounds):
            collect = spec.adapt and r < len(rounds) - 1
            find_step = spec.adapt and r == 0 and spec.step_size is None
            jobs = [self._job("warmup", c, first, n, positions[plan.chunk(c).start:plan.chunk(c).stop], params,
                              adapt=spec.adapt, collect_mass=collect, find_step=find_step)
                    for c in range(plan.num_chunks)]
            keys = [f"{self.run_id}-warmup-{r}-{c}" for c in range(plan.num_chunks)]
            futures = [self._submit(j, k) for j, k in zip(jobs, keys, strict=True)]
            results = []
            for c, (f, j, k) in enumerate(zip(futures, jobs, keys, strict=True)):
                results.append(self._result(f, j, k))
                self._account(results[-1])
                if self.progress:
                    self.progress.warmup(r, len(rounds), c + 1, plan.num_chunks)
            positions = np.concatenate([res["position"] for res in results])
            if spec.adapt:
                params, summary = self._merge(params, results, wf if collect else None)
            else:
                summary = {}
            history.append({"round": r, "iterations": n, **summary})
            first += n
        self.timing["warmup"] = time.perf_counter() - start
        return positions, params, history

    def _merge(self, params, results, wf):
        weights = np.array([self.spec.plan.chunk(c).stop - self.spec.plan.chunk(c).start
                            for c in range(len(results))], float)
        wmean = lambda xs: float(np.dot(weights, xs) / weights.sum())
        stats = [r["stats"] for r in results]
        step = np.exp(wmean([np.log(s["step_size"]) for s in stats]))
        lengths = [float(s["trajectory_length"]) for s in stats]
        # fixed-step HMC carries the placeholder -1 (its steps are fixed): keep it, do not average logs of it
        length = np.exp(wmean(np.log(lengths))) if min(lengths) > 0 else float(params["trajectory_length"])
        new = dict(params, step_size=np.asarray(step, self.dtype), trajectory_length=np.asarray(length, self.dtype))
        if wf is not None:
            merged = None
            for s in stats:
                w = WelfordState(**{k: np.asarray(v, np.float64) for k, v in s["mass"].items()})
                merged = w if merged is None else wf.merge(merged, w)
            new["inverse_mass_matrix"] = np.asarray(wf.final(merged), self.dtype)
        summary = {
            "step_size": float(step),
            "trajectory_length": float(length),
            "acceptance_rate": wmean([float(s["acceptance_rate"]) for s in stats]),
            "divergences": int(sum(int(s["divergences"]) for s in stats)),
            "grad_evals": int(sum(int(s["grad_evals"]) for s in stats)),
        }
        return new, summary

    def _publish(self, chunk, segment, result) -> None:
        """Progress and running convergence for the dashboard's /dhmc page; never fails the run."""
        plan = self.spec.plan
        self.blocks_done += 1
        try:
            from dhmc.observe.dashboard import publish_progress

            self.convergence.add(chunk, segment, result["posterior"])
            publish_progress(self.client, {
                "run_id": self.run_id, "phase": "sampling", "blocks_done": self.blocks_done,
                "blocks_total": plan.num_chunks * plan.num_segments, "chains": plan.chains,
                "draws_done": self.blocks_done * plan.chains_per_task * plan.draws_per_segment,
                "draws_total": plan.chains * plan.draws, "elapsed_s": time.perf_counter() - self.started,
                "convergence": self.convergence.report(),
            })
        except Exception:  # noqa: BLE001 - observability never stops a run
            pass

    # -- sampling -----------------------------------------------------------------------------
    def sample(self, start_positions: dict[int, tuple[int, np.ndarray]], params: dict) -> None:
        """Stream every remaining block to the sink.

        ``start_positions[chunk] = (segment, positions)``: where each chunk continues.
        """
        from distributed import as_completed

        spec, plan = self.spec, self.spec.plan
        start = time.perf_counter()
        pending = {}
        ac = as_completed(loop=self.client.loop)

        def submit(chunk, segment, positions):
            if segment >= plan.num_segments:
                return
            draws = plan.segment(segment)
            job = self._job("sample", chunk, spec.warmup + draws.start, plan.draws_per_segment, positions, params,
                            keep_draws=len(draws))
            key = f"{self.run_id}-sample-{chunk}-{segment}"
            future = self._submit(job, key)
            pending[future.key] = (chunk, segment, job, key, future)
            ac.add(future)

        try:
            for chunk, (segment, positions) in sorted(start_positions.items()):
                submit(chunk, segment, positions)
            for future in ac:
                chunk, segment, job, key, original = pending.pop(future.key)
                result = self._result(future, job, key)
                self._account(result)
                t = time.perf_counter()
                self.sink.write(chunk, segment, result)
                self.timing["writing"] += time.perf_counter() - t
                submit(chunk, segment + 1, result["position"])
                self._publish(chunk, segment, result)
                if self.progress:
                    self.progress.block(len(job.positions) * job.keep_draws, result)
        finally:  # what has arrived reaches the store, also when the run is interrupted
            t = time.perf_counter()
            if hasattr(self.sink, "flush"):
                self.sink.flush()
            self.timing["writing"] += time.perf_counter() - t
        self.timing["sampling"] = time.perf_counter() - start - self.timing["writing"]


def crash_error(client, killed, job: Job, model: str, store=None, wait: float = 5.0):
    """A :class:`WorkerCrashError` for the scheduler's ``KilledWorker`` on ``job``.

    On the embedded cluster the message has the last dead worker's exit signal or code and the last
    lines it wrote to stderr (its death is recorded by the driver, which may hear of it a moment
    after the scheduler).
    """
    from dhmc.errors import WorkerCrashError

    last = getattr(killed.last_worker, "name", None) or getattr(killed.last_worker, "address", "?")
    deaths = getattr(getattr(client, "cluster", None), "worker_deaths", None)
    death = None
    deadline = time.monotonic() + wait
    while deaths is not None and death is None:
        death = next((d for d in reversed(deaths()) if d.worker == str(last)), None)
        if death is None and time.monotonic() > deadline:
            break
        time.sleep(0.05)
    how = death.describe() if death else "ended (exit status unknown: see that worker's log)"
    iterations = f"{job.first_iteration}-{job.first_iteration + job.num_iterations - 1}"
    lines = [f"a {job.phase} block (chains {job.chain_start}-{job.chain_stop - 1}, iterations {iterations}) of "
             f"model {model!r} killed {killed.allowed_failures + 1} worker(s); the last, {last}, {how}"]
    if death and death.stderr_tail:
        lines.append("its last lines on stderr:")
        lines += [f"    {line}" for line in death.stderr_tail]
    if store is not None:
        lines.append(f"every block finished before it is in {store}; once the cause is fixed: dhmc resume {store}")
    return WorkerCrashError("\n".join(lines))


def _pickle(target) -> bytes:
    """Pickle a target, shipping the user's own modules by value (workers may not be able to import them)."""
    import sys
    import sysconfig

    library = (sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"], sys.prefix + "/lib")
    modules = []
    for fn in (getattr(target, "logdensity_fn", None), getattr(target, "model", None),
               getattr(getattr(target, "target", None), "logdensity_fn", None),
               getattr(getattr(target, "target", None), "model", None)):
        name = getattr(fn, "__module__", None)
        module = sys.modules.get(name) if name else None
        path = getattr(module, "__file__", None) or ""
        if module and name != "__main__" and not name.startswith("dhmc") and not path.startswith(library):
            modules.append(module)
    for module in modules:
        cloudpickle.register_pickle_by_value(module)
    try:
        return cloudpickle.dumps(target)
    finally:
        for module in modules:
            cloudpickle.unregister_pickle_by_value(module)


def precompile(spec: RunSpec, model) -> dict:
    """Compile the run's block programs in a background thread, while the cluster starts.

    Only for workers that share this machine and backend (the embedded cluster): one compile here
    replaces one per worker, and overlaps with starting them. Returns ``{phase: Future of bytes}``.
    """
    from concurrent.futures import ThreadPoolExecutor

    import jax

    from dhmc.distributed.worker import precompile as compile_block

    def compile_in_this_thread(*args):
        with jax.enable_x64(spec.x64):  # the caller's x64 may be a context of its own thread
            return compile_block(*args)

    pool = ThreadPoolExecutor(1, thread_name_prefix="dhmc-compile")
    phases = {"warmup": max(1, spec.warmup)} if spec.warmup else {}
    phases["sample"] = spec.draws_per_segment
    futures = {phase: pool.submit(compile_in_this_thread, model, spec.kernel_config, phase, n, spec.chains_per_task,
                                  spec.dense_mass) for phase, n in phases.items()}
    pool.shutdown(wait=False)
    return futures


def initial_params(spec: RunSpec, dim: int, dtype) -> dict:
    """Starting parameters: the user's, or placeholders that warmup replaces."""
    step = spec.step_size if spec.step_size is not None else -1.0
    if spec.trajectory_length is not None:
        length = spec.trajectory_length
    elif spec.num_steps is not None and spec.step_size is not None:
        length = spec.step_size * spec.num_steps
    else:
        length = -1.0
    inv_mass = np.eye(dim, dtype=dtype) if spec.dense_mass else np.ones(dim, dtype)
    return {"step_size": np.asarray(step, dtype), "inverse_mass_matrix": inv_mass,
            "trajectory_length": np.asarray(length, dtype)}


__all__ = ["Runner", "RunSpec", "initial_params", "precompile"]

"""Blocks on a cluster: submit them, wait for them without hanging, merge warmup, stream draws to a sink.

This is the one module that owns a ``Client``'s futures. Blocks are submitted per chunk of chains;
each chunk's next segment is submitted as soon as its previous one is in the sink, so a store always
holds a prefix of every chunk and a resume continues exactly where the data ends.

Waiting never hangs: every second the runner checks for worker processes that died (on the
embedded cluster, which records them) and for a run in which no block finished for
``dhmc.block-timeout``; the scheduler's ``KilledWorker`` and ``no-workers-timeout`` end it elsewhere.
"""

from __future__ import annotations

import queue
import time
import uuid
from dataclasses import dataclass, replace

import numpy as np

from dhmc.distributed import config, warmup
from dhmc.distributed.health import Health
from dhmc.distributed.observers import Observers
from dhmc.distributed.spec import RunSpec
from dhmc.distributed.worker import BlockResult, Job, run_job

RETRYABLE = ("CommClosedError", "FutureCancelledError", "CancelledError")  # lost, not crashed: sent again
TICK = 1.0  # seconds between health checks while waiting


@dataclass
class _Block:
    job: Job
    key: str
    future: object
    tag: tuple
    retries: int = 0


class Runner:
    """Run one sampling job on a connected client.

    Parameters
    ----------
    client
        A connected ``distributed.Client``.
    spec
        The run's :class:`RunSpec`.
    model_blob, model_token
        The pickled target and its hash (see :func:`dhmc.distributed.startup.pickle_target`).
    dtype
        Dtype of the flat unconstrained position.
    sink
        Where sampling blocks go (a :class:`dhmc.storage.sinks.Sink`).
    observers
        The run's :class:`~dhmc.distributed.observers.Observers`, told as blocks finish.
    executables
        ``{phase: Future of a file's path}`` from :func:`~dhmc.distributed.startup.precompile`, named
        by every full-sized block.
    store
        The store's path, named in errors (``dhmc resume STORE``).
    """

    def __init__(self, client, spec: RunSpec, model_blob: bytes, model_token: str, dtype, sink,
                 observers: Observers | None = None, executables=None, store=None, run_id: str | None = None):
        self.client, self.spec, self.dtype = client, spec, np.dtype(dtype)
        # as an array, the pickled target travels beside a job's pickle, not in it: in it, a target defined in a
        # script's __main__ made Dask pickle every job a second time, with cloudpickle (~0.4 ms a block)
        self.blob = np.frombuffer(model_blob, np.uint8)
        self.token, self.sink, self.store = model_token, sink, store
        self.observers, self.executables = observers or Observers(), executables or {}
        self.run_id = run_id or f"dhmc-{uuid.uuid4().hex[:8]}"
        # sampling + writing: the sampling phase's wall time, writing the driver's part of it (its sink);
        # worker_writing: the seconds workers spent writing their blocks to a store, in parallel with it
        self.timing = {"compile": 0.0, "warmup": 0.0, "sampling": 0.0, "writing": 0.0, "worker_writing": 0.0}
        self.max_retries = int(config.get("allowed-failures"))
        self.health = Health(client, spec.model, self.run_id, store)
        self.compiled_dense = bool(spec.dense_mass)
        direct = config.get("direct-to-workers")
        in_process = getattr(getattr(client, "cluster", None), "scheduler", None) is not None
        self.direct = bool(in_process if direct is None else direct)  # results straight from the workers
        self._arrived: queue.SimpleQueue = queue.SimpleQueue()  # futures as they finish (their done callbacks)
        self._live: dict[str, _Block] = {}  # the blocks submitted and not yet taken, by their futures' keys
        self._outbox: list[_Block] = []  # blocks to send at the next wait

    # -- submission and waiting ---------------------------------------------------------------
    def _job(self, phase, chunk, first, n, positions, params, **kw) -> Job:
        chains = self.spec.geometry.chunk(chunk)
        dense = np.ndim(params["inverse_mass_matrix"]) == 2  # a cold phase's metric may turn dense mid-phase
        return Job(run_id=self.run_id, model_token=self.token, model_blob=self.blob, x64=self.spec.x64,
                   config=self.spec.kernel_config(phase), seed=self.spec.seed, phase=phase, chain_start=chains.start,
                   chain_stop=chains.stop, first_iteration=first, num_iterations=n, positions=positions, params=params,
                   executable=self._executable(phase, len(chains), dense), **kw)

    def _executable(self, phase: str, chains: int, dense: bool) -> str | None:
        future = self.executables.get(phase)
        # compiled before warmup chose the metric (dense_mass=None compiles for the diagonal one)
        if future is None or chains != self.spec.chains_per_task or dense != self.compiled_dense:
            return None
        try:
            return future.result()
        except Exception:  # noqa: BLE001 - workers compile for themselves
            return None

    def _submit(self, job: Job, key: str, tag) -> _Block:
        """A block for ``job``, sent with the others submitted meanwhile when the runner next waits (:meth:`_post`)."""
        block = _Block(job, key, None, tag)
        self._outbox.append(block)
        return block

    def _post(self) -> None:
        """Send the blocks submitted since the last post (or sent again, after a lost connection) in one message,
        each as a new future watched until it finishes."""
        if not self._outbox:
            return
        blocks, self._outbox = self._outbox, []
        keys = [f"{b.key}-{uuid.uuid4().hex[:6]}" for b in blocks]
        futures = self.client.map(run_job, [b.job for b in blocks], key=keys, pure=False, retries=0)
        for block, future in zip(blocks, futures, strict=True):
            block.future = future
            self._live[future.key] = block
            future.add_done_callback(self._arrived.put)

    def _finished(self, blocks: dict):
        """Yield lists of ``(tag, result)`` as the blocks in ``blocks`` (keyed by tag) finish, each list the blocks
        that arrived together (their results fetched in one request); ``blocks`` may grow meanwhile.

        Each finished future reports itself once (a done callback), so waiting costs the same whatever the number
        of blocks out: no pass over them per block.
        """
        last = time.monotonic()
        while blocks:
            self._post()
            try:
                arrived = [self._arrived.get(timeout=TICK)]
            except queue.Empty:
                self.health.check((b.job for b in blocks.values()), time.monotonic() - last)
                continue
            while not self._arrived.empty():
                arrived.append(self._arrived.get())
            ready = [self._live.pop(f.key) for f in arrived if f.key in self._live and self._live[f.key].future is f]
            if not ready:  # a cancelled block of an earlier round, or a future sent again
                continue
            last = time.monotonic()
            batch = []
            for block, result in self._results(ready):
                if result is None:  # lost to a dropped connection: sent again
                    block.retries += 1
                    self._outbox.append(block)
                    continue
                del blocks[block.tag]
                self.timing["compile"] = max(self.timing["compile"], result.compile_seconds)
                batch.append((block.tag, result))
            if batch:
                yield batch

    def _results(self, ready: list[_Block]) -> list[tuple[_Block, BlockResult | None]]:
        """The blocks' results: those that finished, in one request; the others one by one (see :meth:`_result`)."""
        finished = [b for b in ready if b.future.status == "finished"]
        try:
            values = self.client.gather([b.future for b in finished], direct=self.direct)
            values = dict(zip(map(id, finished), values, strict=True))
        except Exception:  # noqa: BLE001 - one was lost meanwhile: each on its own, as the others are
            values = {}
        return [(b, values[id(b)] if id(b) in values else self._result(b)) for b in ready]

    def _result(self, block: _Block) -> BlockResult | None:
        """The block's result, None for one to send again, or the error that ends the run."""
        future = block.future
        if future.status == "finished":
            return future.result()
        error = future.exception()
        name = type(error).__name__
        if name == "KilledWorker":
            last = getattr(error.last_worker, "name", None) or getattr(error.last_worker, "address", "?")
            count = error.allowed_failures + 1
            raise self.health.crash_error(f"a {block.job.describe()} of model {self.spec.model!r} killed {count} "
                                          f"worker(s)", str(last)) from None
        if name == "NoWorkerError":
            raise self.health.no_workers_error(getattr(error, "timeout", None)) from None
        if name in RETRYABLE and block.retries < self.max_retries:
            return None
        future.result()  # raises the user's own exception, with its traceback

    # -- warmup -------------------------------------------------------------------------------
    def warmup(self, positions: np.ndarray, params: dict) -> tuple[np.ndarray, dict, list[dict]]:
        """Warmup in rounds, as :class:`dhmc.distributed.warmup.Policy` says; after each round the chunks'
        statistics are merged in chain order. Returns the end positions, the adapted parameters and one record
        per round."""
        spec, geometry = self.spec, self.spec.geometry
        start = time.perf_counter()
        history: list[dict] = []
        weights = np.array([len(geometry.chunk(c)) for c in range(geometry.num_chunks)], float)
        policy = warmup.Policy(spec.warmup_rounds, params, auto=spec.auto_warmup, adapt=spec.adapt,
                               dense=spec.dense_mass, cold=spec.cold_start, chains=spec.chains,
                               dim=positions.shape[1], dtype=self.dtype,
                               restore_length=params["trajectory_length"] if spec.kernel == "hmc" else None)
        rounds = len(spec.warmup_rounds)
        self.timing["warmup_rounds"] = rounds_timing = []
        while (step := policy.next()) is not None:
            started = time.perf_counter()
            if policy.dense is not None and policy.dense != spec.dense_mass:  # chosen by the policy
                self.spec = spec = replace(spec, dense_mass=policy.dense)
            blocks = {}
            for c in range(geometry.num_chunks):
                chains = geometry.chunk(c)
                job = self._job(step.phase, c, step.first, step.iterations, positions[chains.start:chains.stop],
                                step.params, adapt=step.adapt, collect_mass=step.collect_mass,
                                find_step=step.adapt, gradients=step.gradients)
                blocks[c] = self._submit(job, f"{self.run_id}-{step.phase}-{step.index}-{c}", c)
            results = {}
            try:
                for batch in self._finished(blocks):
                    for c, result in batch:
                        results[c] = result
                        self.observers.tell("warmup_block", step.index, max(rounds, step.index + 1), c, result,
                                            len(results), geometry.num_chunks)
            finally:
                self._cancel(blocks)
            results = [results[c] for c in range(geometry.num_chunks)]
            for c, result in enumerate(results):
                if result.warmup_draws is not None:  # save_warmup
                    self.sink.write_warmup(c, step.first, result.warmup_draws)
            end = np.concatenate([res.position for res in results])
            record, end = policy.update(step, [res.stats for res in results], weights, positions, end)
            history.append(record)
            rounds_timing.append({"phase": step.phase, "seconds": time.perf_counter() - started,
                                  "block_seconds_max": max(res.seconds for res in results)})
            positions = end
        self.timing["warmup"] = time.perf_counter() - start
        return positions, policy.final_params(), history

    # -- sampling -----------------------------------------------------------------------------
    def sample(self, start_positions: dict[int, tuple[int, np.ndarray]], params: dict, monitor) -> int:
        """Stream every remaining block to the sink; return the number of segments kept.

        ``start_positions[chunk] = (segment, positions)``: where each chunk continues. Each complete
        wave of segments goes to ``monitor`` (the run's
        :class:`~dhmc.distributed.monitor.ConvergenceMonitor`), whose measurements observers are told.
        With ``draws="auto"`` chunks run at most one segment ahead of the waves checked, and the run
        ends at the first wave that meets the rule.
        """
        spec, geometry = self.spec, self.spec.geometry
        start = time.perf_counter()
        blocks: dict = {}
        done = {chunk: segment for chunk, (segment, _) in start_positions.items()}
        held: dict = {}  # chunk -> (segment, positions): waiting for the wave check
        if not monitor.auto:  # a resumed fixed-draws run measures from its next wave on
            monitor.waves = min(done.values())

        def submit(chunk, segment, positions):
            if segment >= geometry.num_segments:
                return
            if monitor.auto and segment > monitor.waves + 1:
                held[chunk] = (segment, positions)
                return
            draws = geometry.segment(segment)
            first = spec.warmup + draws.start * spec.thinning
            job = self._job("sample", chunk, first, geometry.draws_per_segment, positions, params,
                            keep_draws=len(draws), store=self.sink.destination(chunk, segment),
                            head_chains=monitor.chains_at(segment + 1) if self.sink.workers_write else 0)
            blocks[chunk, segment] = self._submit(job, f"{self.run_id}-sample-{chunk}-{segment}", (chunk, segment))

        def check_waves() -> bool:
            """Check the waves completed since the last check; release held chunks; True to stop."""
            for wave in range(monitor.waves + 1, min(done.values()) + 1):
                check = monitor.check(wave)
                if check is not None:
                    self.observers.tell("convergence_check", check)
                if monitor.stopped:
                    return True
            for chunk, (segment, positions) in sorted(held.items()):
                if segment <= monitor.waves + 1:
                    del held[chunk]
                    submit(chunk, segment, positions)
            return False

        try:
            if monitor.auto and min(done.values()) < geometry.num_segments and check_waves():
                return monitor.waves + 1  # a resumed run whose waves already meet the rule
            for chunk, (segment, positions) in sorted(start_positions.items()):
                submit(chunk, segment, positions)
            for batch in self._finished(blocks):
                for (chunk, segment), result in batch:
                    t = time.perf_counter()
                    self.sink.write(chunk, segment, result)
                    self.timing["writing"] += time.perf_counter() - t
                    self.timing["worker_writing"] += result.write_seconds
                    done[chunk] = segment + 1
                    monitor.add(chunk, segment, result)
                    submit(chunk, segment + 1, result.position)
                    size = len(geometry.chunk(chunk)) * len(geometry.segment(segment))
                    self.observers.tell("sample_block", chunk, segment, result, size)
                t = time.perf_counter()
                self.sink.flush()  # the batch's done flags, in one write
                self.timing["writing"] += time.perf_counter() - t
                if check_waves():
                    self._drain(blocks)
                    return monitor.waves + 1
        finally:  # what has arrived reaches the sink, also when the run is interrupted
            self._cancel(blocks)
            self.sink.close()
            self.timing["sampling"] = time.perf_counter() - start - self.timing["writing"]
        return geometry.num_segments

    def _drain(self, blocks: dict) -> None:
        """Let blocks that are writing to a store finish (a stopped run trims the store next)."""
        if not self.sink.workers_write or not blocks:
            return
        from distributed import wait

        try:
            with self.client.as_current():
                wait([b.future for b in blocks.values() if b.future is not None],
                     timeout=self.health.block_timeout or None)
        except Exception:  # noqa: BLE001 - their draws are not kept anyway
            pass

    def _cancel(self, blocks: dict) -> None:
        """Cancel blocks still queued or running (a run that ended early leaves no work behind)."""
        self._outbox = [b for b in self._outbox if b.tag not in blocks]  # never sent
        sent = [b.future for b in blocks.values() if b.future is not None]
        for future in sent:
            self._live.pop(future.key, None)
        if sent:
            try:
                self.client.cancel(sent)
            except Exception:  # noqa: BLE001 - the cluster may be gone already
                pass


def initial_params(spec: RunSpec, dim: int, dtype) -> dict:
    """Starting parameters: the user's, or placeholders that warmup replaces."""
    step = spec.step_size if spec.step_size is not None else -1.0
    if spec.trajectory_length is not None:
        length = spec.trajectory_length
    elif spec.num_steps is not None and spec.step_size is not None:
        length = spec.step_size * spec.num_steps
    else:
        length = -1.0
    inv_mass = np.eye(dim, dtype=dtype) if spec.dense_mass else np.ones(dim, dtype)  # None (dhmc chooses): diagonal
    return {"step_size": np.asarray(step, dtype), "inverse_mass_matrix": inv_mass,
            "trajectory_length": np.asarray(length, dtype)}


__all__ = ["Runner", "initial_params"]

"""One sampling job on a cluster: warmup's rounds as its policy asks, then sampling's waves streamed to a sink.

Blocks are submitted per chunk of chains (through the run's :class:`~dhmc.distributed.dispatch.Dispatcher`, which
owns the futures and never hangs); each chunk's next segment is submitted as soon as its previous one is in the
sink, so a store always holds a prefix of every chunk and a resume continues exactly where the data ends.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import replace

import numpy as np

from dhmc.distributed import warmup
from dhmc.distributed.dispatch import Dispatcher
from dhmc.distributed.health import Health
from dhmc.distributed.observers import Observers
from dhmc.distributed.spec import RunSpec
from dhmc.distributed.worker import Job


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
        self.spec, self.dtype = spec, np.dtype(dtype)
        # as an array, the pickled target travels beside a job's pickle, not in it: in it, a target defined in a
        # script's __main__ made Dask pickle every job a second time, with cloudpickle (~0.4 ms a block)
        self.blob = np.frombuffer(model_blob, np.uint8)
        self.token, self.sink = model_token, sink
        self.observers, self.executables = observers or Observers(), executables or {}
        self.run_id = run_id or f"dhmc-{uuid.uuid4().hex[:8]}"
        # sampling + writing: the sampling phase's wall time, writing the driver's part of it (its sink);
        # worker_writing: the seconds workers spent writing their blocks to a store, in parallel with it
        self.timing = {"compile": 0.0, "warmup": 0.0, "sampling": 0.0, "writing": 0.0, "worker_writing": 0.0}
        self.dispatch = Dispatcher(client, Health(client, spec.model, self.run_id, store))
        self.compiled_dense = bool(spec.dense_mass)

    # -- blocks -------------------------------------------------------------------------------
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

    def _finished(self, blocks: dict):
        """The dispatcher's batches of finished blocks (:meth:`Dispatcher.finished`), the longest compile kept."""
        for batch in self.dispatch.finished(blocks):
            self.timing["compile"] = self.dispatch.compile_seconds
            yield batch

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
                blocks[c] = self.dispatch.submit(job, f"{self.run_id}-{step.phase}-{step.index}-{c}", c)
            results = {}
            try:
                for batch in self._finished(blocks):
                    for c, result in batch:
                        results[c] = result
                        self.observers.tell("warmup_block", step.index, max(rounds, step.index + 1), c, result,
                                            len(results), geometry.num_chunks)
            finally:
                self.dispatch.cancel(blocks)
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
            key = f"{self.run_id}-sample-{chunk}-{segment}"
            blocks[chunk, segment] = self.dispatch.submit(job, key, (chunk, segment))

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
                    if self.sink.workers_write:  # let blocks writing to a store finish (it is trimmed next)
                        self.dispatch.wait(blocks)
                    return monitor.waves + 1
        finally:  # what has arrived reaches the sink, also when the run is interrupted
            self.dispatch.cancel(blocks)
            self.sink.close()
            self.timing["sampling"] = time.perf_counter() - start - self.timing["writing"]
        return geometry.num_segments


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

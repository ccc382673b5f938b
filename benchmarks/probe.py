"""Where one ``dhmc.sample`` call's time went, measured from outside through dhmc's observer seam.

:class:`DhmcProbe` calls ``dhmc.sample(..., observers=[probe])`` and times the call. From the events
dhmc tells its observers it records when the run started on the cluster, each block's worker-side
numbers (``seconds`` of device work, ``compile_seconds``) and, when the run closes (the client still
connected), the scheduler's task stream: per-task compute spans by worker. The result's
``dhmc_timing`` attribute gives the cluster start, warmup and sampling; the rest is derived.
"""

from __future__ import annotations

import json
import time
from contextlib import suppress

from dhmc import Observer

__all__ = ["DhmcProbe"]


class DhmcProbe(Observer):
    """Times one ``dhmc.sample`` call (:meth:`sample`) and summarises it (:meth:`summary`).

    A block is matched to its task in the task stream by the key dhmc gives it (``{run_id}-sample-
    {chunk}-{segment}-...``, as Dask's dashboard shows); blocks without a match add no lag figures.
    """

    def __init__(self):
        self.marks: dict[str, float] = {}  # perf_counter of: call, start_run, last_block, close, returned
        self.cpu: dict[str, float] = {}  # this (the driver's) process's CPU seconds at: call, first_block, last_block
        self.blocks: list[dict] = []
        self.task_stream: dict = {}
        self.timing: dict = {}
        self.run_id, self.geometry, self.client, self.wall_start = None, None, None, 0.0

    def sample(self, *args, **kwargs):
        """``dhmc.sample(*args, **kwargs)`` with this probe among its observers; its result."""
        import dhmc

        self.wall_start = time.time()  # the scheduler's task stream uses wall-clock times
        self.marks["call"], self.cpu["call"] = time.perf_counter(), time.process_time()
        tree = dhmc.sample(*args, observers=[self], **kwargs)
        self.marks["returned"] = time.perf_counter()
        self.timing = json.loads(tree["posterior"].attrs["dhmc_timing"])
        return tree

    # -- the observer's events ------------------------------------------------------------------------

    def start_run(self, client, run_id, geometry) -> None:
        self.marks["start_run"] = time.perf_counter()
        self.run_id, self.geometry, self.client = run_id, geometry, client
        with suppress(Exception):
            client.get_task_stream()  # installs the scheduler's task-stream plugin from now on

    def warmup_block(self, round_index, rounds, chunk, result, chunks_done, chunks) -> None:
        self._block("warmup", f"warmup-{round_index}-{chunk}", chunk, None, result)

    def sample_block(self, chunk, segment, result, chain_draws) -> None:
        self._block("sample", f"sample-{chunk}-{segment}", chunk, self.geometry.draws_per_segment, result)
        now, cpu = time.perf_counter(), time.process_time()
        self.marks.setdefault("first_block", now)
        self.cpu.setdefault("first_block", cpu)
        self.marks["last_block"], self.cpu["last_block"] = now, cpu

    def close(self) -> None:
        self.marks["close"] = time.perf_counter()
        with suppress(Exception):
            records = self.client.get_task_stream()
            self.task_stream = _summarise_stream(records, since=self.wall_start)
            self._match_blocks(records)

    def _block(self, phase, name, chunk, iterations, result) -> None:
        self.blocks.append({"phase": phase, "chains": len(self.geometry.chunk(chunk)), "iterations": iterations,
                            "seconds": result.seconds, "compile_seconds": result.compile_seconds,
                            "received": time.time(), "key": f"{self.run_id}-{name}-"})

    def _match_blocks(self, records) -> None:
        """Per block: when its task started and stopped computing on the worker (wall clock)."""
        spans = {}
        for r in records or []:
            for ss in r.get("startstops", []):
                if ss.get("action") == "compute":
                    spans[str(r.get("key"))] = (ss["start"], ss["stop"], r.get("worker"))
        for b in self.blocks:
            match = [span for key, span in spans.items() if key.startswith(b["key"])]
            if match:
                b["compute_start"], b["compute_stop"], b["worker"] = match[-1]

    # -- the summary ----------------------------------------------------------------------------------

    def phases(self) -> dict:
        """Seconds of the call's phases: ``before_run`` (target, layout, initial-position check, waiting for the
        cluster), ``cluster_start`` (dhmc's own, overlapping the check), ``runner_warmup``, ``runner_sample``
        (sampling and writing), ``after_sampling`` (final check, assembling the result), ``cluster_close``."""
        m, t = self.marks, self.timing
        out = {"call": m["returned"] - m["call"], "cluster_start": t.get("cluster_start"),
               "runner_warmup": t.get("warmup"), "runner_sample": t.get("sampling", 0.0) + t.get("writing", 0.0)}
        if "start_run" in m:
            out["before_run"] = m["start_run"] - m["call"]
        if "close" in m:
            out["after_sampling"] = m["close"] - m.get("last_block", m.get("start_run", m["call"]))
            out["cluster_close"] = m["returned"] - m["close"]
        return out

    def summary(self) -> dict:
        sample = [b for b in self.blocks if b["phase"] == "sample"]
        out = {"driver_phases_s": self.phases(), "blocks": len(self.blocks)}
        if sample:
            out["block_device_seconds_sum"] = sum(b["seconds"] for b in sample)
            out["block_compile_seconds_sum"] = sum(b["compile_seconds"] for b in sample)
            out["block_compile_seconds_max"] = max(b["compile_seconds"] for b in sample)
            out["blocks_compiled"] = sum(1 for b in sample if b["compile_seconds"] > 0)
            out["chains_per_block"] = sample[0]["chains"]
            out["iterations_per_block"] = sample[0]["iterations"]
        if self.task_stream:
            out["task_stream"] = self.task_stream
        if self.marks.get("last_block", 0) > self.marks.get("first_block", 0):
            # the driver's own CPU while the workers sample: progress, dashboard, monitor, result assembly
            cpu, wall = self.cpu["last_block"] - self.cpu["first_block"], self.marks["last_block"] - self.marks["first_block"]
            out["driver_cpu_s_while_sampling"] = cpu
            out["driver_cpu_share_of_a_core_while_sampling"] = cpu / wall
        matched = [b for b in sample if "compute_stop" in b]
        if matched:
            # the worker finished a block -> the driver had its result in hand (transfer + driver queueing)
            lags = [b["received"] - b["compute_stop"] for b in matched]
            out["result_lag_s_mean"] = sum(lags) / len(lags)
            out["result_lag_s_max"] = max(lags)
            # worker time in a task beyond the block's compile + device seconds (unpickling, imports, metrics)
            extra = [b["compute_stop"] - b["compute_start"] - b["seconds"] - b["compile_seconds"] for b in matched]
            out["task_overhead_s_mean"] = sum(extra) / len(extra)
            out["task_overhead_s_first"] = max(extra)
            first = min(b["compute_start"] for b in matched)
            out["first_task_start_after_call_s"] = first - self.wall_start
            out["last_result_after_call_s"] = max(b["received"] for b in matched) - self.wall_start
        return out


def _summarise_stream(records, since: float = 0.0) -> dict:
    """Per worker: tasks, busy seconds computing, first compute start / last stop (seconds after ``since``)."""
    per = {}
    for r in records or []:
        w = r.get("worker")
        for ss in r.get("startstops", []):
            if ss["start"] < since:
                continue
            d = per.setdefault(w, {"tasks": 0, "compute_s": 0.0, "transfer_s": 0.0, "deserialize_s": 0.0,
                                   "first_start": None, "last_stop": None, "first_task_s": None})
            action = ss.get("action")
            dur = ss["stop"] - ss["start"]
            if action == "compute":
                d["tasks"] += 1
                d["compute_s"] += dur
                if d["first_start"] is None or ss["start"] < d["first_start"]:
                    d["first_start"], d["first_task_s"] = ss["start"], dur
                d["last_stop"] = max(d["last_stop"] or ss["stop"], ss["stop"])
            elif action in ("transfer", "deserialize"):
                d[f"{action}_s"] += dur
    if not per:
        return {}
    t0 = since or min(d["first_start"] for d in per.values() if d["first_start"] is not None)
    for d in per.values():
        d["first_start"] = d["first_start"] - t0 if d["first_start"] is not None else None
        d["last_stop"] = d["last_stop"] - t0 if d["last_stop"] is not None else None
    return {str(k): v for k, v in per.items()}

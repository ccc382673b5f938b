"""What runs in a worker process: one block of the ensemble, with the model and program cached per process.

A task carries the pickled target and a token; the first task of a run on a worker unpickles it
and compiles its program (or loads the executable the driver compiled, see
:func:`~dhmc.distributed.program.precompile`), later tasks reuse it (a jitted closure shipped per
task would re-trace every time). Dask preloads this module in the embedded cluster's workers
(:func:`dask_setup`).
"""

from __future__ import annotations

import ctypes
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import cloudpickle
import jax
import jax.numpy as jnp
import numpy as np
from dask.sizeof import sizeof

from dhmc.core.cold import ColdParams
from dhmc.core.ensemble import KernelConfig, Params
from dhmc.distributed import events
from dhmc.distributed.program import BlockInputs, build_program, compile_program, load_executable
from dhmc.errors import ClusterError
from dhmc.types import BlockResult

__all__ = ["Job", "BlockResult", "run_job", "prepare_process", "dask_setup", "load_model"]

_MODELS: dict[tuple[str, bool], Any] = {}
_PROGRAMS: dict[tuple, Any] = {}
_CACHE_SIZE = 16
_PREPARED = False


@dataclass(frozen=True)
class Job:
    """One block: chains ``[chain_start, chain_stop)`` for ``num_iterations`` iterations."""

    run_id: str
    model_token: str
    model_blob: bytes | np.ndarray = field(repr=False)  # the pickled target (as uint8, out of the job's pickle)
    x64: bool
    config: KernelConfig
    seed: int
    phase: str  # "cold" (unadjusted burn-in), "warmup" (adapting, or burn-in with fixed parameters) or "sample"
    chain_start: int
    chain_stop: int
    first_iteration: int
    num_iterations: int
    positions: np.ndarray = field(repr=False)
    params: dict = field(repr=False)
    keep_draws: int = 0  # sample phase: draws kept; the last segment runs a full segment and keeps fewer
    adapt: bool = True
    collect_mass: bool = False
    find_step: bool = False
    gradients: bool = False  # cold: return the chains' end gradients too (only a dense metric needs them)
    executable: str | None = None  # a file holding the driver's compiled program, if any (same machine)
    store: Any = field(default=None, repr=False)  # a storage.blocks.BlockDestination: the worker writes there
    head_chains: int = 0  # with a store: return the draws of this many first chains too (the convergence monitor)

    def describe(self) -> str:
        """``"sample block (chains 0-15, iterations 100-149)"``."""
        span = self.num_iterations * (self.config.thinning if self.phase == "sample" else 1)
        last = self.first_iteration + span - 1
        return (f"{self.phase} block (chains {self.chain_start}-{self.chain_stop - 1}, iterations "
                f"{self.first_iteration}-{last})")


def _sizeof_job(job: Job) -> int:
    """What Dask counts of a job it holds (its own walk of the dataclass took ~0.1 ms a block in the driver)."""
    params = sum(np.asarray(v).nbytes for v in job.params.values())
    return job.positions.nbytes + np.asarray(job.model_blob).nbytes + params


sizeof.register(Job)(_sizeof_job)


def _tune_malloc() -> None:
    """Undo Dask's ``MALLOC_TRIM_THRESHOLD_=65536`` for JAX work.

    A Nanny starts workers with that variable set, which also freezes glibc's mmap threshold at
    128 KiB: every XLA temporary above it is then mmap-ed and unmapped on each loop iteration, and
    a vmapped HMC block ran 1.5-1.8x slower in a worker than in a plain process (measured here).
    Raising both thresholds at run time restores plain-process speed, on any cluster.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(-3, 32 * 2**20)  # M_MMAP_THRESHOLD: the largest glibc allows
        libc.mallopt(-1, 256 * 2**20)  # M_TRIM_THRESHOLD
    except (OSError, AttributeError):  # not glibc
        pass


def _enable_compilation_cache() -> None:
    """Share compiled programs between worker processes and runs through JAX's persistent cache."""
    if jax.config.jax_compilation_cache_dir is None and os.environ.get("DHMC_COMPILATION_CACHE", "1") != "0":
        path = os.environ.get("DHMC_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "dhmc", "jax"))
        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def prepare_process() -> None:
    """Once per worker process: malloc thresholds and the compilation cache."""
    global _PREPARED
    if not _PREPARED:
        _tune_malloc()
        _enable_compilation_cache()
        _PREPARED = True


def dask_setup(worker=None) -> None:
    """Dask preload hook: ready JAX while the worker starts, not in its first task."""
    prepare_process()
    jax.devices()


def load_model(token: str, blob: bytes | np.ndarray, x64: bool):
    """The target's flat model, unpickled and built once per process and precision (x64 sets its dtype)."""
    key = (token, x64)
    if key not in _MODELS:
        try:
            target = cloudpickle.loads(memoryview(blob))
        except (ImportError, AttributeError) as e:  # a module the driver had and this worker has not
            raise ClusterError(f"worker on {socket.gethostname()} cannot unpickle the target: {type(e).__name__}: "
                               f"{e}; install it there, or import what builds it on every worker with "
                               "dhmc.worker-setup (dhmc sample --worker-setup MODULE_OR_SCRIPT)") from None
        _MODELS[key] = target.build()
    return _MODELS[key]


def _read(path: str | None) -> bytes | None:
    """The bytes of the driver's executable file; None if there is none (or it is gone)."""
    try:
        return None if path is None else open(path, "rb").read()
    except OSError:
        return None


def _program(job: Job, model, inputs: BlockInputs):
    """``(program, seconds to get it, how)``: this process's cached program, the driver's executable loaded, or
    one compiled here."""
    key = (job.model_token, job.x64, job.config, job.phase, job.num_iterations if job.phase == "sample" else None,
           tuple((a.shape, str(a.dtype)) for a in jax.tree.leaves(inputs)))
    if key in _PROGRAMS:
        return _PROGRAMS[key], 0.0, "cached"
    start = time.perf_counter()
    compiled, how = load_executable(_read(job.executable)), "loaded"
    if compiled is None:
        compiled = compile_program(build_program(model, job.config, job.phase, job.num_iterations), inputs)
        how = "compiled"
    if len(_PROGRAMS) >= _CACHE_SIZE:
        _PROGRAMS.pop(next(iter(_PROGRAMS)))
    _PROGRAMS[key] = compiled
    return compiled, time.perf_counter() - start, how


def run_job(job: Job) -> BlockResult:
    """Run one block; return its end positions and statistics, and its draws unless it wrote them to the store."""
    if os.environ.get("DHMC_BLOCK_LOG"):  # an embedded worker's log file says what it ran, for crash reports
        sys.stderr.write(f"dhmc: {job.run_id} runs the {job.describe()}\n")
    jax.config.update("jax_enable_x64", job.x64)
    prepare_process()
    model = load_model(job.model_token, job.model_blob, job.x64)
    dtype = model.dtype
    kind = ColdParams if job.phase == "cold" else Params
    params = kind(*(jnp.asarray(job.params[k], dtype) for k in kind._fields))
    chains = jnp.arange(job.chain_start, job.chain_stop, dtype=jnp.uint32)
    inputs = BlockInputs(seed=jnp.uint32(job.seed), chains=chains, positions=jnp.asarray(job.positions, dtype),
                         params=params, first=jnp.int32(job.first_iteration), iterations=jnp.int32(job.num_iterations),
                         adapt=jnp.bool_(job.adapt), collect_mass=jnp.bool_(job.collect_mass),
                         find_step=jnp.bool_(job.find_step))
    program, compile_seconds, how = _program(job, model, inputs)
    start = time.perf_counter()
    end, out = jax.tree.map(np.asarray, program(inputs))
    seconds = time.perf_counter() - start
    n = job.chain_stop - job.chain_start
    out_fields = {}
    if job.phase == "cold":
        out_fields["stats"] = out._asdict() | {"moments": out.moments._asdict()}
        if not job.gradients:
            del out_fields["stats"]["gradient"]
        # unadjusted: every step is kept (an undone, non-finite step counts as a divergence)
        grad_evals, acceptance, divergences = int(out.grad_evals), 1.0, int(out.nans)
    elif job.phase == "warmup":
        if job.config.record_warmup:
            out, recorded = out
            out_fields["warmup_draws"] = {k: v[:, :job.num_iterations] for k, v in recorded.items()}
        out_fields["stats"] = out._asdict() | {"mass": out.mass._asdict()}
        grad_evals, acceptance, divergences = int(out.grad_evals), float(out.acceptance_rate), int(out.divergences)
    else:
        kept = job.keep_draws
        block = {group: {k: v[:, :kept] for k, v in values.items()} for group, values in out.items()}
        stats = block["sample_stats"]
        grad_evals = int(stats["n_steps"][0].sum()) * n
        acceptance = float(stats["acceptance_rate"].mean())
        divergences = int(stats["diverging"].sum())
        if job.store is None:
            out_fields["draws"] = block
        else:
            start = time.perf_counter()
            out_fields["written"] = job.store.write({**block, "position": end})
            out_fields["write_seconds"] = time.perf_counter() - start
            if job.head_chains:  # for the driver's convergence monitor
                out_fields["head"] = {k: np.array(v[:job.head_chains]) for k, v in block["posterior"].items()}
    _record(job, n, grad_evals, seconds, compile_seconds, acceptance, divergences)
    return BlockResult(position=end, seconds=seconds, compile_seconds=compile_seconds, grad_evals=grad_evals,
                       where=_where(), program=how, **out_fields)


def _where() -> dict:
    """This process's host name and, inside a Dask worker, its address."""
    try:
        from distributed import get_worker

        address = get_worker().address
    except (ImportError, ValueError):
        address = ""
    return {"host": socket.gethostname(), "worker": address}


def _record(job, chains, grad_evals, seconds, compile_seconds, acceptance, divergences):
    events.block_finished(run_id=job.run_id, phase=job.phase, chains=chains, draws=job.num_iterations,
                          grad_evals=grad_evals, seconds=seconds, compile_seconds=compile_seconds,
                          acceptance_mean=acceptance, divergences=divergences)

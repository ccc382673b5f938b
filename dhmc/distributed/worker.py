"""What runs on a worker: one block of the ensemble, with the model and program cached per process.

A task carries the pickled target and a token; the first task of a run on a worker unpickles it
and compiles its program (or loads the executable the driver compiled, see :func:`precompile`),
later tasks reuse it (a jitted closure shipped per task would re-trace every time).
"""

from __future__ import annotations

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

from dhmc.core.ensemble import KernelConfig, Params, chain_keys, sample_chunk, warmup_chunk
from dhmc.distributed import events
from dhmc.models.base import TRACING

_MODELS: dict[str, Any] = {}
_PROGRAMS: dict[tuple, Any] = {}
_CACHE_SIZE = 16
_PREPARED = False


@dataclass(frozen=True)
class Job:
    """One block: chains ``[chain_start, chain_stop)`` for ``num_iterations`` iterations."""

    run_id: str
    model_token: str
    model_blob: bytes = field(repr=False)
    x64: bool
    config: KernelConfig
    seed: int
    phase: str  # "warmup" (adapting, or burn-in with fixed parameters when not adapt) or "sample"
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
    executable: str | None = None  # a file holding the driver's compiled program, if any (same machine)
    store: Any = field(default=None, repr=False)  # a storage.zarr_.BlockDestination: the worker writes there
    head_chains: int = 0  # draws="auto" with a store: return the draws of this many first chains too

    def describe(self) -> str:
        """``"sample block (chains 0-15, iterations 100-149)"``."""
        span = self.num_iterations * (self.config.thinning if self.phase == "sample" else 1)
        last = self.first_iteration + span - 1
        return (f"{self.phase} block (chains {self.chain_start}-{self.chain_stop - 1}, iterations "
                f"{self.first_iteration}-{last})")


def _tune_malloc() -> None:
    """Undo Dask's ``MALLOC_TRIM_THRESHOLD_=65536`` for JAX work.

    A Nanny starts workers with that variable set, which also freezes glibc's mmap threshold at
    128 KiB: every XLA temporary above it is then mmap-ed and unmapped on each loop iteration, and
    a vmapped HMC block ran 1.5-1.8x slower in a worker than in a plain process (measured here).
    Raising both thresholds at run time restores plain-process speed, on any cluster.
    """
    import ctypes
    import sys

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
    import os

    if jax.config.jax_compilation_cache_dir is None and os.environ.get("DHMC_COMPILATION_CACHE", "1") != "0":
        path = os.environ.get("DHMC_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "dhmc", "jax"))
        jax.config.update("jax_compilation_cache_dir", path)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)


def _initialize_cpu_kernels() -> None:
    """Fill in jaxlib's LAPACK kernel table, which executables loaded from bytes rely on.

    jaxlib sets the function pointers of its CPU LAPACK kernels (Cholesky, triangular solve, eigh,
    QR, LU, ...) only when a program calling one is *lowered*. A process that merely loads a
    serialized executable never lowers one, and its first LAPACK call jumps through a null pointer
    (SIGSEGV): that killed every embedded worker on ``dense_mass=True`` or a ``cholesky`` in the
    model. Lowering one tiny Cholesky fills in the whole table (~0.3 s, once per process, in the
    worker's preload).
    """
    jax.jit(jnp.linalg.cholesky).lower(jax.ShapeDtypeStruct((1, 1), jnp.float32))


def prepare_process() -> None:
    """Once per worker process: malloc thresholds, the compilation cache, jaxlib's CPU kernels."""
    global _PREPARED
    if not _PREPARED:
        _tune_malloc()
        _enable_compilation_cache()
        _initialize_cpu_kernels()
        _PREPARED = True


def dask_setup(worker=None) -> None:
    """Dask preload hook: ready JAX while the worker starts, not in its first task."""
    prepare_process()
    jax.devices()


def load_model(token: str, blob: bytes):
    """The target's flat model, unpickled and built once per process."""
    if token not in _MODELS:
        try:
            target = cloudpickle.loads(blob)
        except (ImportError, AttributeError) as e:  # a module the driver had and this worker has not
            from dhmc.errors import ClusterError

            raise ClusterError(f"worker on {socket.gethostname()} cannot unpickle the target: {type(e).__name__}: "
                               f"{e}; install it there, or import what builds it on every worker with "
                               "dhmc.worker-setup (dhmc sample --worker-setup MODULE_OR_SCRIPT)") from None
        _MODELS[token] = target.build()
    return _MODELS[token]


def build_program(model, config: KernelConfig, phase: str, num_iterations: int):
    """The block's whole computation as one function of arrays (``phase`` is "warmup" or "sample")."""
    if phase == "warmup":
        run = warmup_chunk(model.logdensity_fn, config)

        def program(seed, chains, positions, params, first, n, adapt, collect, find_step):
            out = run(chain_keys(seed, chains), positions, params, first, n, adapt, collect, find_step)
            if not config.record_warmup:
                return out
            end, stats, recorded = out  # save_warmup: the round's draws, constrained
            return end, (stats, jax.vmap(jax.vmap(model.constrain_fn))(recorded))

        return program
    run = sample_chunk(model.logdensity_fn, config, num_iterations)

    def program(seed, chains, positions, params, first):
        end, trace = run(chain_keys(seed, chains), positions, params, first)
        position = trace.pop("position")
        groups = {"posterior": jax.vmap(jax.vmap(model.constrain_fn))(position), "sample_stats": trace}
        if model.log_likelihood_fn is not None:
            groups["log_likelihood"] = jax.vmap(jax.vmap(model.log_likelihood_fn))(position)
        if model.predictive_fn is not None:
            keys = predictive_keys(seed, chains, first, num_iterations, config.thinning)
            groups["posterior_predictive"] = jax.vmap(jax.vmap(model.predictive_fn))(position, keys)
        return end, groups

    return program


PREDICTIVE_STREAM = 2**32 - 1  # fold_in data no kernel iteration reaches: predictive keys apart from the kernel's


def predictive_keys(seed, chains, first, draws: int, thinning: int):
    """``(chains, draws, 2)`` keys of posterior predictive draws, one per chain and global iteration.

    A draw's key depends on its chain and iteration only, so extending or re-cutting a run keeps it.
    """
    streams = jax.vmap(lambda k: jax.random.fold_in(k, PREDICTIVE_STREAM))(chain_keys(seed, chains))
    iterations = first + thinning * jnp.arange(draws, dtype=jnp.int32)
    return jax.vmap(lambda k: jax.vmap(lambda i: jax.random.fold_in(k, i))(iterations))(streams)


def program_args(phase: str, chains: int, dim: int, dtype, dense_mass: bool) -> tuple:
    """Abstract arguments of a block program, for compiling before any data exists."""
    s = jax.ShapeDtypeStruct
    mass = (dim, dim) if dense_mass else (dim,)
    params = Params(s((), dtype), s(mass, dtype), s((), dtype))
    args = (s((), jnp.uint32), s((chains,), jnp.uint32), s((chains, dim), dtype), params, s((), jnp.int32))
    if phase == "warmup":
        args += (s((), jnp.int32), s((), jnp.bool_), s((), jnp.bool_), s((), jnp.bool_))
    return args


def compile_program(program, args):
    """Compile for the default backend; on CPUs with LLVM's -O2, which halves compile time (measured
    here: 5.4 s -> 2.3 s for a 128-chain logistic-regression block) and runs as fast as -O3."""
    options = {"xla_backend_optimization_level": 2} if jax.default_backend() == "cpu" else None
    with TRACING:
        lowered = jax.jit(program).lower(*args)
    return lowered.compile(compiler_options=options)


def precompile(model, config: KernelConfig, phase: str, num_iterations: int, chains: int, dense_mass: bool) -> bytes:
    """Compile a block program here and serialize it for workers on this machine and backend."""
    from jax.experimental.serialize_executable import serialize

    args = program_args(phase, chains, model.dim, model.dtype, dense_mass)
    compiled = compile_program(build_program(model, config, phase, num_iterations), args)
    return cloudpickle.dumps((jax.default_backend(), serialize(compiled)))


def _read(path: str | None) -> bytes | None:
    """The bytes of the driver's executable file; None if there is none (or it is gone)."""
    try:
        return None if path is None else open(path, "rb").read()
    except OSError:
        return None


def _load(executable: bytes | None):
    """The driver's executable, or None when it cannot run here (another backend, another JAX)."""
    if executable is None:
        return None
    try:
        from jax.experimental.serialize_executable import deserialize_and_load

        backend, (payload, in_tree, out_tree) = cloudpickle.loads(executable)
        if backend != jax.default_backend():
            return None
        return deserialize_and_load(payload, in_tree, out_tree)
    except Exception:  # noqa: BLE001 - fall back to compiling here
        return None


def _program(job: Job, model, args):
    key = (job.model_token, job.x64, job.config, job.phase, None if job.phase == "warmup" else job.num_iterations,
           tuple((a.shape, str(a.dtype)) for a in jax.tree.leaves(args)))
    if key in _PROGRAMS:
        return _PROGRAMS[key], 0.0
    start = time.perf_counter()
    compiled = _load(_read(job.executable))
    if compiled is None:
        compiled = compile_program(build_program(model, job.config, job.phase, job.num_iterations), args)
    if len(_PROGRAMS) >= _CACHE_SIZE:
        _PROGRAMS.pop(next(iter(_PROGRAMS)))
    _PROGRAMS[key] = compiled
    return compiled, time.perf_counter() - start


def run_job(job: Job) -> dict:
    """Run one block; return its end positions and statistics, and its draws unless it wrote them to the store."""
    if os.environ.get("DHMC_BLOCK_LOG"):  # an embedded worker's log file says what it ran, for crash reports
        sys.stderr.write(f"dhmc: {job.run_id} runs the {job.describe()}\n")
    jax.config.update("jax_enable_x64", job.x64)
    prepare_process()
    model = load_model(job.model_token, job.model_blob)
    dtype = model.dtype
    params = Params(*(jnp.asarray(job.params[k], dtype) for k in Params._fields))
    chains = jnp.arange(job.chain_start, job.chain_stop, dtype=jnp.uint32)
    args = (jnp.uint32(job.seed), chains, jnp.asarray(job.positions, dtype), params, jnp.int32(job.first_iteration))
    if job.phase == "warmup":
        args += (jnp.int32(job.num_iterations), jnp.bool_(job.adapt), jnp.bool_(job.collect_mass),
                 jnp.bool_(job.find_step))
    program, compile_seconds = _program(job, model, args)
    start = time.perf_counter()
    end, out = jax.tree.map(np.asarray, program(*args))
    seconds = time.perf_counter() - start
    result = {"position": end, "seconds": seconds, "compile_seconds": compile_seconds, "where": _where()}
    n = job.chain_stop - job.chain_start
    if job.phase == "warmup":
        if job.config.record_warmup:
            out, recorded = out
            result["warmup_draws"] = {k: v[:, :job.num_iterations] for k, v in recorded.items()}
        result["stats"] = out._asdict() | {"mass": out.mass._asdict()}
        grad_evals, acceptance, divergences = int(out.grad_evals), float(out.acceptance_rate), int(out.divergences)
    else:
        kept = job.keep_draws
        block = {group: {k: v[:, :kept] for k, v in values.items()} for group, values in out.items()}
        stats = block["sample_stats"]
        grad_evals = int(stats["n_steps"][0].sum()) * n
        acceptance = float(stats["acceptance_rate"].mean())
        divergences = int(stats["diverging"].sum())
        result["moments"] = chain_moments(block["posterior"])
        if job.store is None:
            result.update(block)
        else:
            start = time.perf_counter()
            result["written"] = job.store.write({**block, "position": end})
            result["write_seconds"] = time.perf_counter() - start
            if job.head_chains:  # for the driver's stopping rule
                result["head"] = {k: np.array(v[:job.head_chains]) for k, v in block["posterior"].items()}
    _record(job, n, grad_evals, seconds, compile_seconds, acceptance, divergences)
    return result


def _where() -> dict:
    """This process's host name and, inside a Dask worker, its address."""
    try:
        from distributed import get_worker

        address = get_worker().address
    except (ImportError, ValueError):
        address = ""
    return {"host": socket.gethostname(), "worker": address}


def chain_moments(posterior: dict[str, np.ndarray], max_chains: int = 256, max_params: int = 16) -> dict:
    """Per-chain count, mean and sum of squared deviations of the first scalar parameters, for running R-hat.

    Returns ``{"names", "count", "mean", "m2"}`` for the block's first ``max_chains`` chains and
    ``max_params`` scalars: a few KiB, whatever the block's size.
    """
    flat, names = [], []
    for name, values in posterior.items():
        v = np.asarray(values, float).reshape(values.shape[0], values.shape[1], -1)[:max_chains]
        for i in range(v.shape[2]):
            names.append(name if v.shape[2] == 1 and values.ndim == 2 else f"{name}[{i}]")
            flat.append(v[..., i])
    x = np.stack(flat[:max_params], axis=-1)
    mean = x.mean(axis=1)
    return {"names": names[:max_params], "count": x.shape[1], "mean": mean,
            "m2": ((x - mean[:, None]) ** 2).sum(axis=1)}


def _record(job, chains, grad_evals, seconds, compile_seconds, acceptance, divergences):
    events.block_finished(run_id=job.run_id, phase=job.phase, chains=chains, draws=job.num_iterations,
                          grad_evals=grad_evals, seconds=seconds, compile_seconds=compile_seconds,
                          acceptance_mean=acceptance, divergences=divergences)

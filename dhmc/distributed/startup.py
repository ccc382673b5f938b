"""Start-up of one run: the target pickled for workers, the cluster connected, the block programs compiled.

The embedded cluster starts, and the driver compiles the block programs, in background threads:
both begin once the cheap checks pass and overlap with checking the log density.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor

import cloudpickle
import jax

from dhmc.distributed.child import temporary_prefix
from dhmc.distributed.spec import RunSpec

__all__ = ["Startup", "pickle_target", "precompile"]


class Startup:
    """Connect to ``cluster`` (in the background for the embedded one) and precompile for its workers.

    Other clusters are connected to when :meth:`connect` is called; their workers compile for themselves.
    """

    def __init__(self, spec: RunSpec, model, cluster, options):
        self.t0 = time.perf_counter()
        self.cluster, self.options, self.seconds = cluster, options, 0.0
        self.setup = _worker_setup()
        embedded = (cluster is None or cluster == "local") and jax.default_backend() == "cpu"
        self._folder = tempfile.mkdtemp(prefix=temporary_prefix("programs")) if embedded else None
        self.executables = precompile(spec, model, self._folder) if embedded else None
        self._pending = in_thread(_connect, cluster, options) if embedded else None

    def connect(self):
        """``(client, close)``, waiting for a cluster being started."""
        client, close = self._pending.result() if self._pending else _connect(self.cluster, self.options)
        if self.setup is not None:
            from dhmc.distributed.setup import register

            try:
                register(client, self.setup)
            except BaseException:
                close()
                raise
        self.seconds = time.perf_counter() - self.t0
        return client, close

    def close(self) -> None:
        """Remove the compiled programs' files (the run is over)."""
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)

    def abandon(self) -> None:
        """Close, in the background, a cluster started for a call that failed before using it."""
        self.close()
        if self._pending is not None:
            pending = self._pending
            in_thread(lambda: pending.result()[1]())


def _worker_setup():
    """The run's worker set-up (dask config ``dhmc.worker-setup``), checked before any cluster starts."""
    import dask.config

    entries = dask.config.get("dhmc.worker-setup", default=None)
    if not entries:
        return None
    from dhmc.distributed.setup import worker_setup

    return worker_setup(entries)


def _connect(cluster, options):
    from dhmc.distributed.connect import connect  # imports distributed

    return connect(cluster, options)


def in_thread(fn, *args) -> Future:
    """``fn(*args)`` in a thread of its own; the pool does not outlive the call."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="dhmc")
    future = pool.submit(fn, *args)
    pool.shutdown(wait=False)
    return future


def pickle_target(target) -> tuple[bytes, str]:
    """The target pickled for workers, and its hash; the user's own modules go by value.

    Workers may not be able to import a module that lives beside the user's script, so every
    module outside the installed libraries that defines the target's functions is pickled by value.
    The pickle is unpickled here once, so that a target that pickles but does not unpickle (an object whose
    ``__reduce__`` or ``__init__`` does not match) is named in one line before any cluster starts, where its
    workers would only raise the unpickling's own error.
    """
    paths = sysconfig.get_paths()
    library = (paths["purelib"], paths["platlib"], paths["stdlib"], sys.prefix + "/lib")
    modules = []
    for fn in (getattr(target, "logdensity_fn", None), getattr(target, "model", None),
               getattr(getattr(target, "target", None), "logdensity_fn", None),
               getattr(getattr(target, "target", None), "model", None)):
        fn = getattr(fn, "func", fn)  # a functools.partial binding data: its function's module
        name = getattr(fn, "__module__", None)
        module = sys.modules.get(name) if name else None
        path = getattr(module, "__file__", None) or ""
        if module and name != "__main__" and not name.startswith("dhmc") and not path.startswith(library):
            modules.append(module)
    for module in modules:
        cloudpickle.register_pickle_by_value(module)
    try:
        blob = _pickled(target)
    finally:
        for module in modules:
            cloudpickle.unregister_pickle_by_value(module)
    return blob, hashlib.sha1(blob).hexdigest()


def _pickled(target) -> bytes:
    """``cloudpickle.dumps(target)``, unpickled once to check; a failure of either names the part at fault."""
    try:
        blob = cloudpickle.dumps(target)
    except Exception as e:  # noqa: BLE001 - say what could not be pickled, and how to fix it
        where, part = _unpicklable(target, "the target", cloudpickle.dumps)
        raise TypeError(f"{where} cannot be sent to the workers: cloudpickle failed on {type(part).__name__} "
                        f"({_first_line(e)}); make it picklable, or build it inside the log density or in a module "
                        "the workers import (dhmc.worker-setup), or send the target by reference "
                        "(dhmc.models.by_reference)") from None
    try:
        cloudpickle.loads(blob)
    except Exception as e:  # noqa: BLE001 - pickled, but the workers could not unpickle it: say which part
        where, part = _unpicklable(target, "the target", lambda obj: cloudpickle.loads(cloudpickle.dumps(obj)))
        raise TypeError(f"{where} cannot be sent to the workers: {type(part).__name__} pickles but does not "
                        f"unpickle ({_first_line(e)}); send the target by reference instead "
                        "(dhmc.models.by_reference('pkg.module:make', ...): the workers import and call it), or "
                        "make the class round-trip (its __reduce__ or __getstate__/__setstate__)") from None
    return blob


def _first_line(e: BaseException) -> str:
    text = str(e).splitlines()[0] if str(e) else ""
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _unpicklable(obj, where: str, trial, depth: int = 4) -> tuple[str, object]:
    """The innermost part of ``obj`` on which ``trial`` (pickling, or a round trip) fails, and where it sits
    (``target.fn.cache``)."""
    if depth == 0:
        return where, obj
    parts = [(f"{where}.__self__", obj.__self__)] if hasattr(obj, "__func__") else []  # a bound method's object
    fn = getattr(obj, "__func__", obj)
    if hasattr(fn, "__code__"):  # a function: its closure cells and the globals it names
        cells = zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=False)
        parts += [(f"{where} (closure {name!r})", cell.cell_contents) for name, cell in cells]
        parts += [(f"{where} (global {name!r})", fn.__globals__[name]) for name in fn.__code__.co_names
                  if name in getattr(fn, "__globals__", {})]
    elif hasattr(obj, "func") and hasattr(obj, "args"):  # functools.partial
        parts += [(f"{where}.func", obj.func), *((f"{where}.args[{i}]", a) for i, a in enumerate(obj.args)),
                  *((f"{where}.keywords[{k!r}]", v) for k, v in obj.keywords.items())]
    else:
        parts += [(f"{where}.{name}", value) for name, value in getattr(obj, "__dict__", {}).items()]
    for name, part in parts:
        try:
            trial(part)
        except Exception:  # noqa: BLE001 - found a culprit: look inside it
            return _unpicklable(part, name, trial, depth - 1)
    return where, obj


def precompile(spec: RunSpec, model, folder: str) -> dict:
    """Compile the run's block programs in a background thread, while the cluster starts.

    Only for workers that share this machine and backend (the embedded cluster): one compile here
    replaces one per worker, and overlaps with starting them. Each program is written to a file in
    ``folder``, which a block names (a path, not the bytes: blocks stay small, and the driver's memory
    does not grow with every block sent). Returns ``{phase: Future of the file's path}``.
    """
    from dhmc.distributed.program import precompile as compile_block

    def compile_in_this_thread(phase, *args):
        with jax.enable_x64(spec.x64):  # the caller's x64 may be a context of its own thread
            blob = compile_block(model, spec.kernel_config(phase), phase, *args)
        path = os.path.join(folder, f"{phase}.bin")
        with open(path + ".part", "wb") as f:
            f.write(blob)
        os.replace(path + ".part", path)
        return path

    pool = ThreadPoolExecutor(1, thread_name_prefix="dhmc-compile")
    phases = {"cold": 0} if spec.cold_start else {}
    phases |= {"warmup": max(1, spec.warmup)} if spec.warmup else {}
    phases["sample"] = spec.draws_per_segment
    futures = {phase: pool.submit(compile_in_this_thread, phase, n, spec.chains_per_task, spec.dense_mass)
               for phase, n in phases.items()}
    pool.shutdown(wait=False)
    return futures

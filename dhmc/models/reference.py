"""A user's model named by reference (``"pkg.module:function"``) and its inputs read from files.

A run whose target is a reference stores the reference (in the run spec) and its keyword data and
init (in the store), so ``dhmc resume STORE`` and a batch job can rebuild it with nothing else given.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

__all__ = ["is_reference", "import_reference", "bind", "read_inputs", "to_python", "by_reference", "ReferenceTarget"]

_REFERENCE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def is_reference(text) -> bool:
    """Whether ``text`` reads ``module:attribute`` (``mypkg.models:logdensity``); ``python:...`` names a
    function given in Python, which a run spec records but cannot import."""
    return isinstance(text, str) and bool(_REFERENCE.match(text)) and not text.startswith("python:")


def import_reference(text: str):
    """The object ``module:attribute`` names, importing the module (the working directory comes first).

    Workers need not import it: a module outside the installed libraries is pickled by value.
    """
    module_name, _, attribute = text.partition(":")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"cannot import the model {text!r}: {e}") from None
    obj = module
    for part in attribute.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"the model {text!r}: module {module_name!r} has no attribute {attribute!r}")
        obj = getattr(obj, part)
    if not callable(obj) and not _is_model(obj):
        raise ValueError(f"the model {text!r} is a {type(obj).__name__}, not a function")
    return obj


def _is_model(obj) -> bool:
    from dhmc.models.pymc_ import is_bambi_model, is_pymc_model

    return is_pymc_model(obj) or is_bambi_model(obj)


def bind(fn, init, data: dict):
    """``(target, model_kwargs)``: a log density with its ``data`` bound, or a NumPyro model and its kwargs.

    A function given ``init`` whose only required positional parameter not in ``data`` is the
    position is a log density; anything else (or one marked ``dhmc.numpyro_model``) a NumPyro model.
    """
    if init is None or getattr(fn, "_dhmc_numpyro", False):
        return fn, data
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return fn, data
    free = [p for p in params if p.default is inspect.Parameter.empty and p.name not in data
            and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(free) == 1:
        return (functools.partial(fn, **data) if data else fn), {}
    return fn, data


def read_inputs(path, what: str) -> dict:
    """``{name: value}`` from a ``.npz`` or ``.json`` file (``what``: "data" or "init", for messages)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"the {what} file {path} does not exist")
    if path.suffix == ".npz":
        with np.load(path, allow_pickle=False) as f:
            return to_python({k: f[k] for k in f.files})
    if path.suffix == ".json":
        try:
            values = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"the {what} file {path} is not valid JSON: {e}") from None
        if not isinstance(values, dict):
            raise ValueError(f"the {what} file {path} must hold a JSON object of name: value")
        return to_python({k: np.asarray(v) for k, v in values.items()})
    raise ValueError(f"the {what} file {path} must be .npz or .json, got {path.suffix or 'no suffix'!r}")


def to_python(values: dict) -> dict:
    """Arrays as arrays, 0-d ones as Python scalars (a plate's size must be an ``int``)."""
    return {k: np.asarray(v).item() if np.ndim(v) == 0 else np.asarray(v) for k, v in values.items()}


@dataclass(frozen=True)
class ReferenceTarget:
    """A target sent to the workers by reference: each worker imports ``reference`` (``"pkg.module:make"``) and
    calls it with ``kwargs`` to make the target, where a target by value travels pickled.

    For a target that does not survive pickling (an object of another library whose instances do not round-trip)
    or whose pickle is large (a PyMC model with big data). ``make`` returns a target: a ``pymc.Model`` or
    ``bambi.Model``, or any object with ``build()`` (:class:`~dhmc.models.LogDensityTarget`,
    :class:`~dhmc.models.NumPyroTarget`); a module attribute that is a ``pymc.Model`` is used as it is. The module
    must import on every worker: installed there, or in the driver's working directory on a filesystem the workers
    share (a worker looks there after its own path; ``dhmc.worker-setup`` runs what it needs first). ``make`` must
    give the same target in every process: the driver checks each block's result shapes, and a resume checks the
    model's fingerprint.
    """

    reference: str
    kwargs: dict = field(default_factory=dict)
    name: str = ""
    outputs: dict = field(default_factory=dict)  # with_outputs' options, applied to the target made
    directory: str = ""  # the driver's working directory: a worker looks there too (after its own path)

    def made(self, driver: bool = False):
        """The target ``reference(**kwargs)`` makes here (on the driver, a PyMC model sets x64 as PyMC does)."""
        from dhmc.models.pymc_ import is_bambi_model, is_pymc_model, pymc_target

        if self.directory and self.directory not in sys.path:
            sys.path.append(self.directory)
        obj = import_reference(self.reference)
        is_model = is_pymc_model(obj) or is_bambi_model(obj)
        if is_model and self.kwargs:
            raise ValueError(f"{self.reference} is a model, not a function: it takes no arguments "
                             f"({', '.join(self.kwargs)})")
        made = obj if is_model else obj(**self.kwargs)
        if is_pymc_model(made) or is_bambi_model(made):
            made = pymc_target(made, name=self.name or self.reference, precision=driver)
        elif not hasattr(made, "build"):
            raise TypeError(f"{self.reference}(...) returned {type(made).__name__}: a target sent by reference must "
                            "be a pymc.Model, a bambi.Model or an object with build() (dhmc.models.LogDensityTarget, "
                            "dhmc.models.NumPyroTarget)")
        return made.with_outputs(**self.outputs) if self.outputs else made

    def with_outputs(self, **outputs) -> ReferenceTarget:
        return replace(self, outputs={k: v for k, v in outputs.items() if v})

    def sample_prior(self, draws: int, seed: int):
        return self.made().sample_prior(draws, seed)

    def build(self):
        return self.made().build()


def by_reference(reference: str, **kwargs) -> ReferenceTarget:
    """A target the workers make themselves: they import ``reference`` (``"pkg.module:make"``) and call it with
    ``kwargs``; only the reference and the arguments are pickled.

    Examples
    --------
    >>> target = by_reference("mypkg.targets:make", n=5)   # doctest: +SKIP
    >>> trace = dhmc.sample(target, chains=1024)             # doctest: +SKIP
    """
    if not is_reference(reference):
        raise ValueError(f"by_reference needs 'pkg.module:function', got {reference!r}")
    import os

    return ReferenceTarget(reference, dict(kwargs), name=reference, directory=os.getcwd())

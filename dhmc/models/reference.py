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
from pathlib import Path

import numpy as np

__all__ = ["is_reference", "import_reference", "bind", "read_inputs", "to_python"]

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
    if not callable(obj):
        raise ValueError(f"the model {text!r} is a {type(obj).__name__}, not a function")
    return obj


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

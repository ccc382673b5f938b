"""dhmc: Dask-distributed ensemble Hamiltonian Monte Carlo in JAX.

Names are imported lazily, so that Dask processes unpickling dhmc's plugins (a scheduler, say)
do not import JAX.
"""

from __future__ import annotations

import importlib

# dhmc's defaults join dask config at import: a `dask.config.set({"dhmc.…": …})` made before them would,
# on leaving its context, delete the whole `dhmc` key, defaults included (dask, not JAX: cheap in Dask processes)
from dhmc.distributed import config as _config  # noqa: F401, E402

__version__ = "0.3.0.dev0"

_LAZY = {"sample": "dhmc.api", "resume": "dhmc.api", "extend": "dhmc.api", "numpyro_model": "dhmc.models.numpyro_",
         "open_trace": "dhmc.storage.zarr_", "models": "dhmc.models",
         "diagnostics": "dhmc.diagnostics", "WorkerCrashError": "dhmc.errors",
         "NoWorkersError": "dhmc.errors", "BlockTimeoutError": "dhmc.errors", "StoreLockedError": "dhmc.errors",
         "ModelMismatchError": "dhmc.errors", "ConvergenceWarning": "dhmc.errors",
         "Observer": "dhmc.distributed.observers"}

__all__ = ["sample", "resume", "extend", "numpyro_model", "open_trace", "models", "diagnostics", "WorkerCrashError",
           "NoWorkersError", "BlockTimeoutError", "StoreLockedError", "ModelMismatchError", "ConvergenceWarning",
           "Observer", "__version__"]


def __getattr__(name: str):
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name])
        value = module if module.__name__ == f"dhmc.{name}" else getattr(module, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'dhmc' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)

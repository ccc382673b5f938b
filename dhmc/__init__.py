"""dhmc: Dask-distributed ensemble Hamiltonian Monte Carlo in JAX."""

from dhmc import models
from dhmc.api import open_trace, resume, sample

__version__ = "0.1.0"

__all__ = ["sample", "resume", "open_trace", "models", "__version__"]

"""Pure JAX core: integrators, kernels, adaptation and the vmapped chunk sampler.

Nothing here knows about Dask, files or workers: the unit of work is a pure function of
(chain indices, state, parameters, draw indices).
"""

__all__: list[str] = []

"""ArviZ's layout of a run, independent of where the arrays live (pure: numpy + xarray; the stat names from
:class:`dhmc.types.SampleStats`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from dhmc.types import SAMPLE_STAT_DTYPES, SampleStats

__all__ = ["SAMPLE_STATS", "VariableSpec", "Layout", "fill_value", "make_layout", "observed_dims", "to_datatree"]

if TYPE_CHECKING:
    import xarray as xr

SAMPLE_STATS = {name: SAMPLE_STAT_DTYPES.get(name, "float") for name in SampleStats._fields}  # "float": the run's


@dataclass(frozen=True)
class VariableSpec:
    """One stored variable: its per-draw shape, dtype and the names of its extra dims."""

    shape: tuple[int, ...]
    dtype: str
    dims: tuple[str, ...]


@dataclass(frozen=True)
class Layout:
    """The variables of a run: ``posterior``, ``sample_stats`` (``log_likelihood``, ``posterior_predictive``).

    Arrays have dims ``(chain, draw, *extra)``; how many chains and draws, and how they are cut
    into blocks, is the run's :class:`~dhmc.geometry.Geometry`, kept apart.
    """

    posterior: dict[str, VariableSpec]
    sample_stats: dict[str, VariableSpec]
    coords: dict[str, list] = field(default_factory=dict)
    log_likelihood: dict[str, VariableSpec] = field(default_factory=dict)
    posterior_predictive: dict[str, VariableSpec] = field(default_factory=dict)
    warmup_draws: int = 0  # save_warmup: group ``warmup_posterior`` holds this many draws (the posterior's variables)

    def groups(self) -> dict[str, dict[str, VariableSpec]]:
        extra = {"log_likelihood": self.log_likelihood, "posterior_predictive": self.posterior_predictive}
        return {"posterior": self.posterior, "sample_stats": self.sample_stats, **{k: v for k, v in extra.items() if v}}

    def warmup_groups(self) -> dict[str, dict[str, VariableSpec]]:
        """``{"warmup_posterior": ...}`` when warmup draws are kept: one chunk of draws per chunk of chains."""
        return {"warmup_posterior": self.posterior} if self.warmup_draws else {}

    def coords_for(self, dims, sizes: dict) -> dict[str, np.ndarray]:
        """Coordinates of ``dims`` (``sizes``: their lengths): the run's own, else ``0..n-1``."""
        return {d: np.asarray(self.coords[d]) if d in self.coords else np.arange(sizes[d]) for d in dims}


def fill_value(dtype: str):
    """What an array holds where no block has been written yet: NaN, False or 0."""
    kind = np.dtype(dtype).kind
    return np.nan if kind == "f" else (False if kind == "b" else 0)


def make_layout(variables, float_dtype, dims=None, coords=None, log_likelihood=None, observed=None,
                predictive=None, constant=None) -> Layout:
    """Build a :class:`Layout` from ``{name: (shape, dtype)}`` of the constrained variables.

    ``dims`` names a variable's axes beyond ``(chain, draw)`` (default ``{name}_dim_{i}``),
    ``coords`` gives a named dim's coordinates (default ``0..n-1``); ``log_likelihood`` holds the
    observed sites' ``{name: (shape, dtype)}``, as does ``predictive`` (their draws); ``observed`` and
    ``constant`` (``constant_data``) are arrays whose dims must fit as well. Raises
    ``ValueError`` for dims or coords that do not fit.
    """
    dims = dict(dims or {})
    coords = {d: list(np.asarray(v).tolist()) for d, v in (coords or {}).items()}
    sizes: dict[str, tuple[int, str]] = {}

    def specs(variables):
        out = {}
        for name, (shape, dtype) in variables.items():
            extra = tuple(dims.get(name, [f"{name}_dim_{i}" for i in range(len(shape))]))
            if len(extra) != len(shape):
                raise ValueError(f"dims for {name!r} name {len(extra)} axes {list(extra)}, but {name!r} has shape "
                                 f"{tuple(shape)} per draw")
            for d, n in zip(extra, shape, strict=True):
                _check_size(d, n, name, sizes, coords)
            out[name] = VariableSpec(tuple(shape), str(np.dtype(dtype)), extra)
        return out

    posterior = specs(variables)
    pointwise = specs(log_likelihood or {})
    predictions = specs(predictive or {})
    for arrays in (observed, constant):  # observed and constant data's dims must fit too
        specs({k: (np.shape(v), "float") for k, v in (arrays or {}).items()})
    unknown = sorted(set(dims) - set(variables) - set(log_likelihood or {}) - set(observed or {}) - set(constant or {}))
    if unknown:
        raise ValueError(f"dims names {unknown[0]!r}, which is not a variable of the model; its variables are "
                         f"{', '.join(sorted(variables))}")
    float_dtype = str(np.dtype(float_dtype))
    stats = {k: VariableSpec((), float_dtype if v == "float" else v, ()) for k, v in SAMPLE_STATS.items()}
    return Layout(posterior, stats, coords, pointwise, predictions)


def _check_size(dim: str, n: int, name: str, sizes: dict, coords: dict) -> None:
    """One dim has one length: across variables, and as long as its coordinates."""
    if dim in ("chain", "draw"):
        raise ValueError(f"dims for {name!r} use {dim!r}, which dhmc names itself; choose another name")
    if dim in sizes and sizes[dim][0] != n:
        raise ValueError(f"dim {dim!r} has length {sizes[dim][0]} in {sizes[dim][1]!r} but {n} in {name!r}")
    sizes[dim] = (n, name)
    if dim not in coords:
        coords[dim] = list(range(n))
    elif len(coords[dim]) != n:
        raise ValueError(f"coords for {dim!r} have {len(coords[dim])} values, but {name!r} has {n} along it")


def observed_dims(name: str, value, dims: dict) -> list[str]:
    """The dims of an observed array: the model's names for it, else ArviZ's ``{name}_dim_{i}``."""
    return list(dims.get(name, [f"{name}_dim_{i}" for i in range(np.ndim(value))]))


def to_datatree(layout: Layout, arrays: dict[str, dict[str, np.ndarray]], attrs: dict,
                extra_groups: dict[str, dict[str, tuple]] | None = None) -> xr.DataTree:
    """Assemble in-memory arrays ``{group: {name: array}}`` into an ArviZ-layout DataTree.

    ``extra_groups`` (``observed_data``) hold ``{name: (dims, array)}`` without chain and draw.
    """
    import xarray as xr

    chunked = {**layout.groups(), **layout.warmup_groups()}
    groups = {group: {name: (("chain", "draw", *spec.dims), arrays[group][name]) for name, spec in specs.items()}
              for group, specs in chunked.items()}
    tree = {}
    for group, values in {**groups, **(extra_groups or {})}.items():
        data = {k: xr.Variable(dims, np.asarray(v)) for k, (dims, v) in values.items()}
        sizes = {d: n for v in data.values() for d, n in v.sizes.items()}
        tree[group] = xr.Dataset(data, coords=layout.coords_for(sorted(sizes), sizes), attrs=attrs)
    result = xr.DataTree.from_dict(tree)
    result.attrs.update(attrs)
    return result

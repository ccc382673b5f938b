"""ArviZ's layout of a run, independent of where the arrays live (pure: numpy + xarray)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import xarray as xr

SAMPLE_STATS = {
    "lp": "float",
    "acceptance_rate": "float",
    "diverging": "bool",
    "energy": "float",
    "n_steps": "int32",
    "step_size": "float",
}


@dataclass(frozen=True)
class VariableSpec:
    """One stored variable: its per-draw shape, dtype and the names of its extra dims."""

    shape: tuple[int, ...]
    dtype: str
    dims: tuple[str, ...]


@dataclass(frozen=True)
class Layout:
    """Sizes and variables of a run: the groups ``posterior`` and ``sample_stats``.

    Arrays have dims ``(chain, draw, *extra)`` and are chunked as one block of
    ``chains_per_task`` chains by ``draws_per_segment`` draws.
    """

    chains: int
    draws: int
    chains_per_task: int
    draws_per_segment: int
    posterior: dict[str, VariableSpec]
    sample_stats: dict[str, VariableSpec]
    coords: dict[str, list] = field(default_factory=dict)

    @property
    def num_chunks(self) -> int:
        return -(-self.chains // self.chains_per_task)

    @property
    def num_segments(self) -> int:
        return -(-self.draws // self.draws_per_segment)

    def groups(self) -> dict[str, dict[str, VariableSpec]]:
        return {"posterior": self.posterior, "sample_stats": self.sample_stats}

    def coords_for(self, dims) -> dict[str, np.ndarray]:
        sizes = {"chain": self.chains, "draw": self.draws}
        out = {}
        for d in dims:
            out[d] = np.asarray(self.coords[d]) if d in self.coords else np.arange(sizes[d])
        return out


def fill_value(dtype: str):
    """What an array holds where no block has been written yet: NaN, False or 0."""
    kind = np.dtype(dtype).kind
    return np.nan if kind == "f" else (False if kind == "b" else 0)


def make_layout(chains, draws, chains_per_task, draws_per_segment, variables, float_dtype, dims=None,
                coords=None) -> Layout:
    """Build a :class:`Layout` from ``{name: (shape, dtype)}`` of the constrained variables."""
    dims = dims or {}
    coords = dict(coords or {})
    posterior = {}
    for name, (shape, dtype) in variables.items():
        extra = tuple(dims.get(name, [f"{name}_dim_{i}" for i in range(len(shape))]))
        for d, n in zip(extra, shape, strict=True):
            coords.setdefault(d, list(range(n)))
        posterior[name] = VariableSpec(tuple(shape), str(np.dtype(dtype)), extra)
    float_dtype = str(np.dtype(float_dtype))
    stats = {k: VariableSpec((), float_dtype if v == "float" else v, ()) for k, v in SAMPLE_STATS.items()}
    return Layout(chains, draws, chains_per_task, draws_per_segment, posterior, stats, coords)


def to_datatree(layout: Layout, arrays: dict[str, dict[str, np.ndarray]], attrs: dict,
                extra_groups: dict[str, dict[str, np.ndarray]] | None = None) -> xr.DataTree:
    """Assemble in-memory arrays ``{group: {name: array}}`` into an ArviZ-layout DataTree."""
    import xarray as xr

    tree = {}
    for group, specs in layout.groups().items():
        data = {}
        for name, spec in specs.items():
            dims = ("chain", "draw", *spec.dims)
            data[name] = xr.Variable(dims, arrays[group][name])
        all_dims = {d for v in data.values() for d in v.dims}
        tree[group] = xr.Dataset(data, coords=layout.coords_for(sorted(all_dims)), attrs=attrs)
    for group, values in (extra_groups or {}).items():
        data = {k: xr.Variable([f"{k}_dim_{i}" for i in range(np.ndim(v))], np.asarray(v)) for k, v in values.items()}
        tree[group] = xr.Dataset(data, attrs=attrs)
    result = xr.DataTree.from_dict(tree)
    result.attrs.update(attrs)
    return result

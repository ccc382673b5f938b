"""Type aliases shared across dhmc."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax

Array = jax.Array
ArrayTree = Any
PRNGKey = jax.Array
LogDensityFn = Callable[[Array], Array]

__all__ = ["Array", "ArrayTree", "PRNGKey", "LogDensityFn"]

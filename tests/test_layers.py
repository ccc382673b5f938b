"""Imports point one way: no module imports a layer above its own (docs/design.md, "Layers").

Every import is read from the source, those inside functions included, so a lazy upward import
fails here as surely as one at the top of a module.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dhmc

PACKAGE = Path(dhmc.__file__).parent
# lowest first; leaf modules any layer may import sit below them all
LAYERS = ["dhmc.types", "dhmc.errors", "dhmc.geometry", "dhmc.stats", "dhmc.core", "dhmc.models", "dhmc.storage",
          "dhmc.distributed", "dhmc.observe", "dhmc.diagnostics", "dhmc.api", "dhmc.scaling", "dhmc.cli"]


def _layer(module: str) -> int | None:
    matches = [i for i, layer in enumerate(LAYERS) if module == layer or module.startswith(layer + ".")]
    return matches[-1] if matches else None


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.append(node.module)
            names += [f"{node.module}.{a.name}" for a in node.names if node.module == "dhmc"]
    return [n for n in names if n == "dhmc" or n.startswith("dhmc.")]


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p.name not in ("__init__.py", "__main__.py")
                 or p.parent != PACKAGE)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_imports_a_layer_above_its_own(path):
    module = "dhmc." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts).removesuffix(".__init__")
    own = _layer(module)
    assert own is not None, f"{module} is in no layer: add it to LAYERS and to docs/design.md"
    above = [name for name in _imports(path) if (_layer(name) or 0) > own]
    assert not above, f"{module} (layer {LAYERS[own]}) imports {above}, above it"


def test_the_layers_here_are_the_documented_ones():
    design = (PACKAGE.parent / "docs" / "design.md").read_text()
    for layer in LAYERS[4:]:
        path = layer.replace("dhmc.", "dhmc/") + ("/" if (PACKAGE / layer[5:]).is_dir() else ".py")
        assert f"`{path}`" in design, f"docs/design.md's layer table has no row for {path}"


def test_a_detected_upward_import_fails():
    assert _layer("dhmc.distributed.runner") < _layer("dhmc.observe.metrics")
    assert _layer("dhmc.core.hmc") < _layer("dhmc.models.base") < _layer("dhmc.api")

"""The schema layer and the stats module stay free of trio and numpy (checked on the source)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import kestrel_trio
import kestrel_trio.openai
import kestrel_trio.stats

FORBIDDEN = {"trio", "numpy"}
PACKAGE_DIR = Path(kestrel_trio.__file__).parent
# Every module of the layer, its rooms' included.
SOURCES = sorted(Path(kestrel_trio.openai.__file__).parent.rglob("*.py")) + [Path(kestrel_trio.stats.__file__)]


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.relative_to(PACKAGE_DIR).as_posix())
def test_no_trio_or_numpy_imports(path):
    assert not imported_roots(path) & FORBIDDEN


def test_project_imports_stay_in_the_layer():
    # Reaching into engine/http/model code could drag trio or numpy in indirectly.
    for path in SOURCES:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("kestrel_trio"):
                assert node.module == "kestrel_trio.errors" or node.module.startswith("kestrel_trio.openai"), (
                    path.name, node.module)


def test_public_names_are_exported():
    for name in kestrel_trio.openai.__all__:
        assert hasattr(kestrel_trio.openai, name), name
    assert kestrel_trio.openai.__doc__.startswith("The OpenAI schema layer")

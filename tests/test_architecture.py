"""The layering rules: which package may import what, and the public API."""

from __future__ import annotations

import ast
from pathlib import Path

import kestrel_trio

SRC = Path(kestrel_trio.__file__).resolve().parent

# package (relative to kestrel_trio) -> top-level modules it must never import directly
FORBIDDEN = {
    "_model": {"trio", "h11", "kestrel_trio.text", "kestrel_trio.engine", "kestrel_trio.http",
               "kestrel_trio.openai", "jinja2", "tokenizers"},
    "text": {"trio", "h11", "kestrel_trio.engine", "kestrel_trio.http"},
    "engine": {"h11", "json", "kestrel_trio.http", "kestrel_trio.openai"},
    "openai": {"trio", "numpy", "h11", "kestrel_trio._model", "kestrel_trio.engine", "kestrel_trio.http"},
    "http": {"numpy", "kestrel_trio._model", "kestrel_trio.model", "kestrel_trio.text", "kestrel_trio.engine"},
    # Getting model files (app level, beside the CLI): paths in, paths out; it never loads or serves a model.
    "hub": {"trio", "h11", "numpy", "kestrel_trio._model", "kestrel_trio.model", "kestrel_trio.text",
            "kestrel_trio.engine", "kestrel_trio.http", "kestrel_trio.openai", "kestrel_trio.server"},
}
ALLOWED_THIRD_PARTY_IN_MODEL = {"numpy", "attrs"}


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


def _violations(package: str, forbidden: set[str]) -> list[str]:
    found = []
    for path in sorted((SRC / package).rglob("*.py")):
        for name in _imports(path):
            if any(name == f or name.startswith(f + ".") for f in forbidden):
                found.append(f"{path.relative_to(SRC)} imports {name}")
    return found


def test_layers_import_only_downwards():
    problems = [v for package, forbidden in FORBIDDEN.items() for v in _violations(package, forbidden)]
    assert problems == []


def test_model_core_uses_only_numpy_attrs_and_the_stdlib():
    import sys

    stdlib = sys.stdlib_module_names
    for path in sorted((SRC / "_model").rglob("*.py")):
        for name in _imports(path):
            top = name.split(".")[0]
            assert top in stdlib or top in ALLOWED_THIRD_PARTY_IN_MODEL or name.startswith(
                ("kestrel_trio._model", "kestrel_trio.errors")
            ), f"{path.name} imports {name}"


def test_only_the_cli_calls_trio_run_or_reads_argv():
    for path in sorted(SRC.rglob("*.py")):
        if path.name == "cli.py":
            continue
        text = path.read_text(encoding="utf-8")
        assert "trio.run(" not in text, path
        assert "sys.argv" not in text, path


def test_the_checker_sees_a_violation(tmp_path, monkeypatch):
    bad = tmp_path / "_model"
    bad.mkdir()
    (bad / "x.py").write_text("import trio\nfrom h11 import Connection\n")
    monkeypatch.setattr(__import__(__name__), "SRC", tmp_path)
    assert sorted(_violations("_model", FORBIDDEN["_model"])) == ["_model/x.py imports h11", "_model/x.py imports trio"]

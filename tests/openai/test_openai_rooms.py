"""The OpenAI layer's rooms are ranked as the layers are: a room imports its own modules and lower rooms only.

Ranks, lowest first (two rooms of one rank may not import each other):

    0  fields          the typed field getters and the key classes every API front shares
    1  request         request bodies -> validated values
    1  response        response bodies, choices, logprobs, SSE framing (knows nothing of the request side)
    2  responses_api   the Responses API, translated into the chat request and answered from a chat choice

A module in a room never imports the package's ``__init__`` (it imports every room) nor a module at the top of
the package (``embeddings``: not ranked). Imports inside functions count as well.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

import kestrel_trio.openai

OPENAI_DIR = Path(kestrel_trio.openai.__file__).resolve().parent
PACKAGE = "kestrel_trio.openai"
OPENAI_ROOMS = {"fields": 0, "request": 1, "response": 1, "responses_api": 2}


def _targets(path: Path, module: str, root: Path) -> list[str]:
    """Dotted names of the kestrel_trio.openai modules (or the package itself) that ``path`` imports."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolved against this module's package
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                origin = ".".join(base + ([node.module] if node.module else []))
            else:
                origin = node.module or ""
            for alias in node.names:  # ``from package import module`` imports that module
                candidate = f"{origin}.{alias.name}"
                relative = Path(*candidate.split(".")[2:]) if candidate.startswith(PACKAGE + ".") else None
                is_module = relative is not None and (
                    (root / relative).with_suffix(".py").is_file() or (root / relative / "__init__.py").is_file())
                found.append(candidate if is_module else origin)
    return [name for name in found if name == PACKAGE or name.startswith(PACKAGE + ".")]


def room_violations(root: Path) -> list[str]:
    """Every import that breaks the rooms' ranks in the OpenAI package at ``root``; also unranked rooms."""
    found = []
    on_disk = {p.name for p in root.iterdir() if (p / "__init__.py").is_file()}
    found += [f"{PACKAGE}.{room} is a room missing from OPENAI_ROOMS"
              for room in sorted(on_disk - OPENAI_ROOMS.keys())]
    found += [f"OPENAI_ROOMS names {room}, which is no folder of openai"
              for room in sorted(OPENAI_ROOMS.keys() - on_disk)]
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        if len(parts) < 2 or parts[0] not in OPENAI_ROOMS:
            continue  # the package's own top modules may import any room
        own = parts[0]
        module = ".".join((PACKAGE, *(parts[:-1] if parts[-1] == "__init__" else parts)))
        for target in _targets(path, module, root):
            pieces = target.split(".")
            room = pieces[2] if len(pieces) > 2 else None
            if room == own:
                continue
            if room is None or room not in OPENAI_ROOMS:
                found.append(f"{module} ({own}) imports {target}, which is in no room")
            elif OPENAI_ROOMS[room] >= OPENAI_ROOMS[own]:
                found.append(f"{module} ({own}, rank {OPENAI_ROOMS[own]}) imports {target} "
                             f"({room}, rank {OPENAI_ROOMS[room]})")
    return found


def test_the_rooms_import_only_their_own_modules_and_lower_rooms():
    assert room_violations(OPENAI_DIR) == []


@pytest.fixture
def openai_copy(tmp_path: Path) -> Path:
    copy = tmp_path / "openai"
    shutil.copytree(OPENAI_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


@pytest.mark.parametrize(("file", "line", "complaint"), [
    ("fields/access.py", "from kestrel_trio.openai.request import bodies",
     "kestrel_trio.openai.fields.access (fields, rank 0) imports kestrel_trio.openai.request.bodies (request, rank 1)"),
    ("request/messages.py", "from kestrel_trio.openai.response.bodies import to_json_bytes",
     "(request, rank 1) imports kestrel_trio.openai.response.bodies (response, rank 1)"),
    ("response/sse.py", "    from ..request.thinking import REASONING_EFFORTS",
     "(response, rank 1) imports kestrel_trio.openai.request.thinking (request, rank 1)"),
    ("request/bodies.py", "from kestrel_trio.openai import to_json_bytes",
     "kestrel_trio.openai.request.bodies (request) imports kestrel_trio.openai, which is in no room"),
    ("response/choices.py", "import kestrel_trio.openai.embeddings",
     "imports kestrel_trio.openai.embeddings, which is in no room"),
    ("request/thinking.py", "from kestrel_trio.openai.responses_api import events",
     "imports kestrel_trio.openai.responses_api.events (responses_api, rank 2)"),
])
def test_the_checker_sees_each_planted_violation(openai_copy: Path, file: str, line: str, complaint: str):
    target = openai_copy / file
    text = target.read_text(encoding="utf-8")
    if line.startswith(" "):  # an import inside a function counts too
        line = "def _planted():\n" + line
    target.write_text(text + "\n" + line + "\n", encoding="utf-8")
    assert any(complaint in problem for problem in room_violations(openai_copy)), room_violations(openai_copy)


def test_the_checker_sees_a_room_not_ranked(openai_copy: Path):
    (openai_copy / "annex").mkdir()
    (openai_copy / "annex" / "__init__.py").write_text("", encoding="utf-8")
    assert room_violations(openai_copy) == ["kestrel_trio.openai.annex is a room missing from OPENAI_ROOMS"]

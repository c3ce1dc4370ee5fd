"""The layering rules: every module has a rank, and imports only its own layer or layers ranked below.

Ranks, lowest first (a layer may import its own modules and every layer of a
lower rank; two layers of the same rank may not import each other):

    0  errors, stats, version the error family, metric primitives, the version: standard library only
    0  blas_spin              OpenBLAS's idle-thread spin time, set before numpy loads: standard library only
    0  _kernels               compiled loops over numpy arrays (numba): numpy, numba and its llvmlite only
    1  _model                 numpy model core
    2  openai, http           JSON <-> values; h11 + trio HTTP (neither knows the other)
    3  text, webui, hub       tokenizer, template, sampling, generation state machine; the chat page's files;
                              getting model files
    3  anthropic              Anthropic Messages JSON <-> the openai layer's chat request (built on openai, so above it)
    3  ollama                 Ollama's API JSON <-> the openai layer's chat request, NDJSON and listings
    4  model                  the public Model: _model joined with text (a package: its __init__ re-exports
                             its modules loaded, loading, checks, settings, checked)
    5  engine                 the bounded queue and the single inference task
    6  app                    the routes: HTTP requests in, engine generations out
    7  server                 serve(): HTTP server + engine + model as one task
    8  cli                    argv and trio.run (a package: dispatch, parser, flags, serve, text, errors, progress)
    9  kestrel_trio           the package root, which re-exports the public API

Relative imports are resolved, ``from kestrel_trio import x`` counts as an
import of ``kestrel_trio.x`` when ``x`` is a module, and of the package root
otherwise. Third-party rules per layer (and per module, where one module of a
layer is held to more) are kept beside the ranks. ``_model`` is private: from
outside it (the package and benchmarks/), only its ``__init__`` is imported; the
engine imports not even that, and steps the model through the public Model.
No modules import one another in a circle as they load (imports inside
functions aside: they run at a call, once every module has loaded).

Inside ``_model``, every module lives in a room (a subpackage named for its
concern), and the rooms are ranked the same way (MODEL_ROOMS, lowest first):

    0  forms                  how a matrix's rows are stored and expanded: ggml's blocks, packed rows
    1  checkpoints            a model folder's files: confinement, config.json, safetensors, shapes, random weights
    1  products               y = x W^T over every form, and which way it runs
    2  gguf                   a GGUF file: its reader, tensor names, and its metadata as a config
    3  weights                a checkpoint's tensors assembled in a residency (quantized, cached, mapped)
    3  cache                  the KV cache, its storage dtypes, the prefix cache
    4  decoder                the model itself: layers, rotary positions, attention, the forward passes
    5  embedding, vision      pooled hidden states; Qwen3-VL's tower and model

A room imports its own modules and rooms ranked below it, at load or inside a
function alike; no module in a room imports ``_model``'s ``__init__`` (it
imports every room).

``text`` is ranked the same way (TEXT_ROOMS, lowest first), its rooms beside the
modules directly in ``text/``, each of which counts as a room of its own:

    0  chat_formats, media    each model family's chat markers and answer parsers; images and videos
    0  repetition, speculative, stops, context_length
                              the loop guard, speculative decoding, stop strings, the context-window check
    1  sampling, tokens       the sampling params and the sampler (on the guard and the acceptance rule);
                              the tokenizer, detokenizer and chat template (on chat_formats' tool prompt)
    2  constraints, step_result  grammars and the reasoning budget (on the tokenizer); a step's result
    3  generation             the state machine, which drives them all

No module in a room imports ``text``'s ``__init__`` (it imports rooms).

``openai`` likewise (OPENAI_ROOMS): ``fields`` 0; ``request``, ``response`` and
the module ``embeddings`` 1; ``responses_api`` 2.

``engine``, ``http`` and ``app`` likewise (ENGINE_ROOMS, HTTP_ROOMS, APP_ROOMS beside the code: their
rooms and the modules directly in each, lowest first).

``_kernels`` is in rooms too (KERNEL_ROOMS, lowest first; a module's room is
its folder below ``_kernels``, the package's own modules the room ``""``, its
``__init__`` the room ``__init__``):

    0  portable.forms         one home per storage form of weights (block constants, exact row expanders,
                             one-pass loops), the dot loops they share, the template the products are made from
    1  portable               the numba reference loops every kernel is tested against (the products generated
                             over the forms' homes, the integer reference, the layers' loops); the compiled hand-off
    2  x86, x86.float32, arm  what differs per architecture: integer products and AMX tiles; the assembly
                             blocks over float32 activations; NEON and dotprod integer products
    3  "" (_kernels itself)   what chooses: a CPU's features, the kernel plan, the dispatch, readiness
    4  wrappers               the calls the model makes (layers' loops, packed products, prefill kernels, report)
    5  __init__               the package's face: it only re-exports
"""

from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path

import pytest

import kestrel_trio

SRC = Path(kestrel_trio.__file__).resolve().parent
PACKAGE = "kestrel_trio"

# layer -> rank. A module's layer is the first component of its name below kestrel_trio.
RANKS = {
    "errors": 0, "stats": 0, "version": 0, "blas_spin": 0, "_kernels": 0,
    "_model": 1,
    "openai": 2, "http": 2,
    "text": 3, "webui": 3, "hub": 3, "anthropic": 3, "ollama": 3,
    "model": 4,
    "engine": 5,
    "app": 6,
    "server": 7,
    "cli": 8,
    PACKAGE: 9,
}
# Top-level modules that belong to a layer named differently (none today: a layer of several modules is a package).
LAYER_ALIASES: dict[str, str] = {}

# layer -> third-party (or standard) modules it must never import.
FORBIDDEN_EXTERNAL = {
    "text": {"trio", "h11"},
    "engine": {"h11", "json"},
    "openai": {"trio", "numpy", "h11"},
    "anthropic": {"trio", "numpy", "h11"},
    "ollama": {"trio", "numpy", "h11"},
    "http": {"numpy"},
    "hub": {"trio", "h11", "numpy"},
}
ALLOWED_THIRD_PARTY_IN_MODEL = {"numpy", "attrs"}
# Layers that import the standard library only (blas_spin must run before anything loads numpy).
STANDARD_LIBRARY_ONLY = {"errors", "stats", "version", "blas_spin"}
ALLOWED_THIRD_PARTY_IN_KERNELS = {"numpy", "numba", "llvmlite"}  # llvmlite: numba's LLVM, for the AMX tiles' assembly
# module -> modules it must never import, beyond its layer's rules.
FORBIDDEN_EXTERNAL_IN_MODULE = {
    "kestrel_trio.engine.step.batch": {"trio"},  # the batched step runs in the worker thread: synchronous, sans-IO
    "kestrel_trio.engine.step.contained": {"trio"},  # so does its MemoryError containment around it
    # http.policy's rules are sans-IO values and checks the connections apply
    "kestrel_trio.http.policy.cors": {"trio", "h11"},
    "kestrel_trio.http.policy.hosts": {"trio", "h11"},
    "kestrel_trio.http.policy.limits": {"trio", "h11"},
}
PRIVATE_PACKAGE = "kestrel_trio._model"
# _model's room -> rank (the module docstring says what each holds).
MODEL_ROOMS = {
    "forms": 0,
    "checkpoints": 1, "products": 1,
    "gguf": 2,
    "weights": 3, "cache": 3,
    "decoder": 4,
    "embedding": 5, "vision": 5,
}
# text's room, or module directly in text/ (ranked as a room of its own) -> rank (the module docstring says why).
TEXT_ROOMS = {
    "chat_formats": 0, "media": 0, "repetition": 0, "speculative": 0, "stops": 0, "context_length": 0,
    "sampling": 1, "tokens": 1,
    "constraints": 2, "step_result": 2,
    "generation": 3,
}
# openai's room, or module directly in openai/ -> rank: the typed field getters every API front shares; request
# bodies -> values, and the response side (knowing nothing of the request side), and embeddings; the Responses API,
# translated into the chat request and answered from a chat choice.
OPENAI_ROOMS = {
    "fields": 0,
    "request": 1, "response": 1, "embeddings": 1,
    "responses_api": 2,
}
# The rooms of engine, http and app, and the modules directly in each (each ranked as a room of its own), -> rank:
# what a room imports stands lower. engine: its types and metrics, the synchronous step (step/) and an embedding
# job; the KV budget (memory/) and speculation; admission and the /health counters; the inference task.
ENGINE_ROOMS = {
    "types": 0, "metrics": 0, "step": 0, "embeddings": 0,
    "memory": 1, "speculation": 1,
    "admission": 2, "health": 2,
    "engine": 3,
}
# http: its types and metrics; responses; what the server admits (policy/) and the router; one connection's
# HTTP/1.1 (protocol/); the accept loop.
HTTP_ROOMS = {
    "types": 0, "metrics": 0,
    "responses": 1,
    "policy": 2, "router": 2,
    "protocol": 3,
    "server": 4,
}
# app: the streams, envelopes, embeddings and media (images, videos) routes' pieces; a chat's job (chat/) and the
# server's state; the Anthropic, Responses and Ollama fronts over the chat job; the routes that join them.
APP_ROOMS = {
    "streams": 0, "envelopes": 0, "embeddings": 0, "media": 0,
    "chat": 1, "state": 1,
    "messages": 2, "responses": 2, "ollama": 2,
    "routes": 3,
}
# The layers whose own modules are rooms too, each checked by layer_room_violations -> its ranks (named
# <LAYER>_ROOMS in the complaints).
LAYER_ROOMS = {"text": TEXT_ROOMS, "openai": OPENAI_ROOMS, "engine": ENGINE_ROOMS, "http": HTTP_ROOMS,
               "app": APP_ROOMS}
KERNELS_PACKAGE = "kestrel_trio._kernels"
# _kernels' room (its folder below _kernels, dotted; "" for the package's own modules) -> rank.
KERNEL_ROOMS = {
    "portable.forms": 0,
    "portable": 1,
    "x86": 2, "x86.float32": 2, "arm": 2,
    "": 3,
    "wrappers": 4,
    "__init__": 5,
}
BENCHMARKS = SRC.parent.parent / "benchmarks"
# Benchmarks that measure _model's private kernels themselves, by path under benchmarks/ (reason beside each).
KERNEL_BENCHMARKS = {
    "compute/_bench_model_kestrel.py": "times matmul's private product paths against one another",
    "compute/bench_prefill_gemm.py": "times the float32 chunk kernel against BLAS on matmul's product threads",
}


def module_name(path: Path, src: Path) -> str:
    """``kestrel_trio.a.b`` for ``src/a/b.py`` (a package's ``__init__`` is the package itself)."""
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([PACKAGE, *parts])


def layer_of(module: str) -> str | None:
    """The layer of an internal module name, or None if it has none."""
    parts = module.split(".")
    if parts == [PACKAGE]:
        return PACKAGE
    top = parts[1]
    layer = LAYER_ALIASES.get(top, top)
    return layer if layer in RANKS else None


def _is_module(name: str, src: Path) -> bool:
    relative = Path(*name.split(".")[1:])
    return (src / relative).with_suffix(".py").is_file() or (src / relative / "__init__.py").is_file()


def _bound_in_init(package: str, src: Path) -> set[str]:
    """Names a package's ``__init__`` binds itself (``from .forward import forward`` binds the function)."""
    init = src.joinpath(*package.split(".")[1:], "__init__.py")
    if not init.is_file():
        return set()
    bound = set()
    for node in ast.parse(init.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom):
            bound.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            bound.add(node.name)
    return bound


def _module_level(tree: ast.Module):
    """The statements run when a module loads: its body, into ``if``/``try`` blocks (``if TYPE_CHECKING:`` too),
    not into functions or classes."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        yield node
        if isinstance(node, ast.If):
            todo += node.body + node.orelse
        elif isinstance(node, ast.Try):
            todo += node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]


def imports_of(path: Path, src: Path, this: str | None = None, deferred: bool = True) -> set[str]:
    """Every module ``path`` (named ``this``, by default its name in ``src``) imports, relative imports resolved.

    ``deferred``: with the imports inside functions (run at a call, after every module has loaded); False: only
    those made when the module loads.
    """
    this = this or module_name(path, src)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    names: set[str] = set()
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree) if deferred else _module_level(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module == PACKAGE or module.startswith(PACKAGE + "."):
                # ``from kestrel_trio[.pkg] import x`` / ``from . import x``: x may be a module or a name.
                bound = _bound_in_init(module, src)
                for alias in node.names:
                    candidate = f"{module}.{alias.name}"
                    is_module = alias.name not in bound and _is_module(candidate, src)
                    names.add(candidate if is_module else module)
            else:
                names.add(module)
    return names


def layer_violations(src: Path) -> list[str]:
    """Internal imports that point up or sideways, and modules that belong to no layer."""
    found = []
    for path in sorted(src.rglob("*.py")):
        this = module_name(path, src)
        own = layer_of(this)
        if own is None:
            found.append(f"{this} belongs to no layer (add it to RANKS or LAYER_ALIASES)")
            continue
        for name in sorted(imports_of(path, src)):
            if name != PACKAGE and not name.startswith(PACKAGE + "."):
                continue
            target = layer_of(name)
            if target is None:
                found.append(f"{this} imports {name}, which belongs to no layer")
            elif target != own and RANKS[target] >= RANKS[own]:
                found.append(f"{this} ({own}, rank {RANKS[own]}) imports {name} ({target}, rank {RANKS[target]})")
    return found


def external_violations(src: Path) -> list[str]:
    """Third-party imports a layer must not make; in _model, anything but numpy, attrs and the stdlib."""
    found = []
    for path in sorted(src.rglob("*.py")):
        this = module_name(path, src)
        own = layer_of(this)
        for name in sorted(imports_of(path, src)):
            top = name.split(".")[0]
            if top == PACKAGE:
                continue
            if top in FORBIDDEN_EXTERNAL.get(own, ()):
                found.append(f"{this} ({own}) imports {name}")
            if own == "_model" and top not in sys.stdlib_module_names and top not in ALLOWED_THIRD_PARTY_IN_MODEL:
                found.append(f"{this} (_model) imports {name}")
            if own == "_kernels" and top not in sys.stdlib_module_names and top not in ALLOWED_THIRD_PARTY_IN_KERNELS:
                found.append(f"{this} (_kernels) imports {name}")
            if own in STANDARD_LIBRARY_ONLY and top not in sys.stdlib_module_names and top != "__future__":
                found.append(f"{this} ({own}, standard library only) imports {name}")
            if top in FORBIDDEN_EXTERNAL_IN_MODULE.get(this, ()):
                found.append(f"{this} imports {name}")
    return found


def private_violations(src: Path, benchmarks: Path | None = None) -> list[str]:
    """Imports of ``_model``'s submodules from outside ``_model`` (the package and, if given, benchmarks/)."""
    prefix = PRIVATE_PACKAGE + "."
    found = []
    files = [(path, module_name(path, src)) for path in sorted(src.rglob("*.py"))]
    if benchmarks is not None and benchmarks.is_dir():
        for path in sorted(benchmarks.rglob("*.py")):  # every room's scripts and the shared modules
            relative = path.relative_to(benchmarks)
            if relative.as_posix() not in KERNEL_BENCHMARKS and not relative.parts[0].startswith("."):
                files.append((path, ".".join(["benchmarks", *relative.with_suffix("").parts])))
    for path, this in files:
        if this == PRIVATE_PACKAGE or this.startswith(prefix):
            continue
        for name in sorted(imports_of(path, src, this)):
            if name.startswith(prefix):
                found.append(f"{this} imports {name}: enter _model through its __init__")
    return found


# Layers that drive the model through the public Model (kestrel_trio.model, the seam) and import no _model module,
# not even its __init__.
THROUGH_THE_SEAM = {"engine"}


def seam_violations(src: Path) -> list[str]:
    """Imports of ``_model`` (its ``__init__`` or a submodule) from a layer of :data:`THROUGH_THE_SEAM`."""
    found = []
    for path in sorted(src.rglob("*.py")):
        this = module_name(path, src)
        if layer_of(this) not in THROUGH_THE_SEAM:
            continue
        for name in sorted(imports_of(path, src, this)):
            if name == PRIVATE_PACKAGE or name.startswith(PRIVATE_PACKAGE + "."):
                found.append(f"{this} imports {name}: step the model through kestrel_trio.model")
    return found


def room_violations(src: Path, package: str = PRIVATE_PACKAGE, ranks: dict[str, int] | None = None,
                    ranks_name: str = "MODEL_ROOMS", own_modules: bool = False) -> list[str]:
    """Imports between a package's rooms that point up or sideways, imports of its ``__init__`` from a room,
    modules in no room, and rooms missing from (or only in) its ranks (by default ``_model``'s, MODEL_ROOMS).

    ``own_modules``: each module directly in the package is ranked as a room of its own (text's generation,
    stops ...); without it (``_model``), such a module is in no room."""
    ranks = MODEL_ROOMS if ranks is None else ranks
    short = package.split(".")[1]
    folder = src / short
    prefix = package + "."
    on_disk = {p.name for p in folder.iterdir() if (p / "__init__.py").is_file()}
    if own_modules:
        on_disk |= {p.stem for p in folder.glob("*.py") if p.name != "__init__.py"}
    kind = "a room or module" if own_modules else "a room"
    found = [f"{package}.{room} is {kind} missing from {ranks_name}" for room in sorted(on_disk - ranks.keys())]
    where = "room or module" if own_modules else "folder"
    found += [f"{ranks_name} names {room}, which is no {where} of {short}" for room in sorted(ranks.keys() - on_disk)]
    for path in sorted(folder.rglob("*.py")):
        this = module_name(path, src)
        if this == package:
            continue
        own = this[len(prefix):].split(".")[0]
        if own not in ranks:
            found.append(f"{this} is in no room of {short} (move it into one, or add its room to {ranks_name})")
            continue
        for name in sorted(imports_of(path, src)):
            if name == package:
                found.append(f"{this} ({own}) imports {package}, whose __init__ imports the rooms")
                continue
            if not name.startswith(prefix):
                continue
            found += _ranked(this, own, name, name[len(prefix):].split(".")[0], ranks)
    return found


def _ranked(this: str, own: str, name: str, target: str, ranks: dict[str, int]) -> list[str]:
    """The complaint, if any, of module ``this`` in room ``own`` importing ``name`` in room ``target``: a room
    imports its own modules and rooms ranked below it ("" names a package's own modules: shown as the package)."""
    if target == own:
        return []
    if target not in ranks:
        return [f"{this} imports {name}, which is in no room"]
    if ranks[target] < ranks[own]:
        return []
    shown = [room or name.split(".")[1] for room in (own, target)]
    return [f"{this} ({shown[0]}, rank {ranks[own]}) imports {name} ({shown[1]}, rank {ranks[target]})"]


def _kernel_room(name: str, src: Path) -> str:
    """The room of a module or package under _kernels: its folder below _kernels, dotted (a package is its own;
    the package ``_kernels`` itself, its ``__init__``, is the room "__init__")."""
    if name == KERNELS_PACKAGE:
        return "__init__"
    below = name[len(KERNELS_PACKAGE) + 1:] if name != KERNELS_PACKAGE else ""
    is_package = src.joinpath(*name.split(".")[1:], "__init__.py").is_file()
    return below if is_package else below.rpartition(".")[0]


def kernel_room_violations(src: Path) -> list[str]:
    """Imports between ``_kernels``' rooms that point up or sideways (at load or inside a function alike),
    modules in a room KERNEL_ROOMS does not rank, and ranked rooms that are no folder."""
    kernels = src.joinpath(*KERNELS_PACKAGE.split(".")[1:])
    on_disk = {".".join(p.parent.relative_to(kernels).parts) or "__init__" for p in kernels.rglob("__init__.py")}
    on_disk.add("")
    found = [f"KERNEL_ROOMS names {room!r}, which is no folder of _kernels"
             for room in sorted(KERNEL_ROOMS.keys() - on_disk)]
    for path in sorted(kernels.rglob("*.py")):
        this = module_name(path, src)
        own = _kernel_room(this, src)
        if own not in KERNEL_ROOMS:
            found.append(f"{this} is in _kernels' room {own!r}, which KERNEL_ROOMS does not rank")
            continue
        for name in sorted(imports_of(path, src)):
            if name != KERNELS_PACKAGE and not name.startswith(KERNELS_PACKAGE + "."):
                continue
            found += _ranked(this, own, name, _kernel_room(name, src), KERNEL_ROOMS)
    return found


def import_cycles(src: Path) -> list[list[str]]:
    """Every circle of modules importing one another when they load, each as its modules' names, sorted.

    A circle is a strongly connected set of two or more modules in the graph of module-level imports (those under
    ``if TYPE_CHECKING:`` included: a reader follows them as any other). Imports inside functions are left out:
    they run at a call, once every module has loaded, and are how ``_kernels`` loads a CPU's code only where it
    runs.
    """
    graph = {module_name(path, src): path for path in sorted(src.rglob("*.py"))}
    edges = {this: sorted(name for name in imports_of(path, src, this, deferred=False)
                          if name in graph and name != this)
             for this, path in graph.items()}
    # Tarjan's strongly connected components, iterative (no recursion limit on a deep import chain).
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in graph:
        if root in order:
            continue
        work = [(root, iter(edges[root]))]
        order[root] = low[root] = len(order)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in order:
                    order[target] = low[target] = len(order)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(edges[target])))
                    break
                if target in on_stack:
                    low[node] = min(low[node], order[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == order[node]:
                    members = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        members.append(member)
                        if member == node:
                            break
                    if len(members) > 1:
                        circles.append(sorted(members))
    return sorted(circles)


def test_layers_import_only_downwards():
    assert layer_violations(SRC) == []


def test_layers_keep_their_third_party_rules():
    assert external_violations(SRC) == []


def test_the_private_model_core_is_entered_through_its_init_only():
    assert private_violations(SRC, BENCHMARKS) == []
    assert [name for name in KERNEL_BENCHMARKS if not (BENCHMARKS / name).is_file()] == []  # no stale exemption


def test_the_engine_steps_the_model_through_the_public_model():
    assert seam_violations(SRC) == []


def test_model_rooms_import_only_downwards():
    assert room_violations(SRC) == []


def layer_room_violations(src: Path, layer: str) -> list[str]:
    """:func:`room_violations` for text, openai, engine, http or app, ranked by LAYER_ROOMS[layer] (its own modules
    each a room of its own)."""
    return room_violations(src, f"{PACKAGE}.{layer}", LAYER_ROOMS[layer], f"{layer.upper()}_ROOMS", own_modules=True)


@pytest.mark.parametrize("layer", sorted(LAYER_ROOMS))
def test_the_rooms_of_text_openai_engine_http_and_app_import_only_downwards(layer: str):
    assert layer_room_violations(SRC, layer) == []


def test_kernel_rooms_import_only_downwards():
    assert kernel_room_violations(SRC) == []


def test_no_modules_import_one_another_in_a_circle():
    assert import_cycles(SRC) == []


def test_only_the_cli_calls_trio_run_or_reads_argv():
    cli = [path for path in sorted(SRC.rglob("*.py")) if layer_of(module_name(path, SRC)) == "cli"]
    assert any("trio.run(" in path.read_text(encoding="utf-8") for path in cli), "the cli layer's files not found"
    for path in sorted(SRC.rglob("*.py")):
        if path in cli:
            continue
        text = path.read_text(encoding="utf-8")
        assert "trio.run(" not in text, path
        assert "sys.argv" not in text, path


# (file in the package, line planted at its end, a fragment of the expected complaint)
PLANTED = [
    ("text/sampling/sampler.py", "from kestrel_trio.app.state import ServerState", "imports kestrel_trio.app.state"),
    ("text/sampling/sampler.py", "from ...server import serve", "imports kestrel_trio.server"),
    ("text/sampling/sampler.py", "from ... import server", "imports kestrel_trio.server"),
    ("text/sampling/sampler.py", "from kestrel_trio import serve", "imports kestrel_trio (kestrel_trio, rank 9)"),
    ("engine/engine.py", "from kestrel_trio.app import chat", "imports kestrel_trio.app.chat"),
    ("engine/engine.py", "from ..server import Server", "imports kestrel_trio.server"),
    ("engine/admission.py", "from kestrel_trio.app import chat", "imports kestrel_trio.app.chat"),
    ("engine/health.py", "from ..server import Server", "imports kestrel_trio.server"),
    ("http/router.py", "from kestrel_trio.app.routes import build_router", "imports kestrel_trio.app.routes"),
    ("http/responses.py", "from ..openai.errors import error_body", "imports kestrel_trio.openai"),
    ("http/responses.py", "from kestrel_trio.model import Model", "imports kestrel_trio.model"),
    ("openai/response/sse.py", "from kestrel_trio.http import Response", "imports kestrel_trio.http"),
    ("_model/decoder/forward.py", "from kestrel_trio.text import Tokenizer", "imports kestrel_trio.text"),
    ("_model/decoder/forward.py", "from ...engine import Engine", "imports kestrel_trio.engine"),
    ("errors.py", "from kestrel_trio.stats import Counter", "imports kestrel_trio.stats"),
    ("model/__init__.py", "from kestrel_trio.engine import Engine", "imports kestrel_trio.engine"),
    ("model/loaded.py", "from kestrel_trio.engine import Engine", "imports kestrel_trio.engine"),
    ("model/loading.py", "from ..app.state import ServerState", "imports kestrel_trio.app.state"),
    ("model/settings.py", "from kestrel_trio import serve", "imports kestrel_trio (kestrel_trio, rank 9)"),
    ("model/checks.py", "from ..cli import progress", "imports kestrel_trio.cli.progress"),
    ("server.py", "from kestrel_trio.cli import main", "imports kestrel_trio.cli"),
    ("server.py", "from .cli.dispatch import main", "imports kestrel_trio.cli.dispatch"),
    ("server.py", "from kestrel_trio.cli.serve import serve_command", "imports kestrel_trio.cli.serve"),
    ("app/routes.py", "from kestrel_trio.cli.flags import COUNT", "imports kestrel_trio.cli.flags"),
]


@pytest.fixture(scope="module")
def package_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("pkg") / PACKAGE
    shutil.copytree(SRC, copy, ignore=shutil.ignore_patterns("__pycache__", "_demo"))
    return copy


def problems_with(package_copy: Path, file: str, line: str, check) -> tuple[str, list[str]]:
    """``check(package_copy)`` with ``line`` appended to ``file`` for the call; the file's module name too."""
    target = package_copy / file
    original = target.read_text(encoding="utf-8")
    try:
        target.write_text(original + "\n" + line + "\n", encoding="utf-8")
        return module_name(target, package_copy), check(package_copy)
    finally:
        target.write_text(original, encoding="utf-8")


@pytest.mark.parametrize(("file", "line", "complaint"), PLANTED, ids=[f"{f}: {line}" for f, line, _ in PLANTED])
def test_the_checker_sees_each_planted_violation(package_copy: Path, file: str, line: str, complaint: str):
    module, problems = problems_with(package_copy, file, line, layer_violations)
    assert any(complaint in p and p.startswith(module) for p in problems), problems


def test_the_checker_sees_a_module_with_no_layer(package_copy: Path):
    stray = package_copy / "stray.py"
    stray.write_text("import os\n", encoding="utf-8")
    try:
        expected = "kestrel_trio.stray belongs to no layer (add it to RANKS or LAYER_ALIASES)"
        assert layer_violations(package_copy) == [expected]
    finally:
        stray.unlink()


@pytest.mark.parametrize(("file", "line"), [("_model/decoder/forward.py", "import trio"),
                                            ("_model/decoder/forward.py", "import jinja2"),
                                            ("text/sampling/sampler.py", "import trio"),
                                            ("engine/engine.py", "import json"),
                                            ("openai/response/sse.py", "import numpy as np"),
                                            ("http/router.py", "import numpy"),
                                            ("engine/step/batch.py", "import trio"),
                                            ("engine/step/batch.py", "from trio import to_thread"),
                                            ("engine/step/contained.py", "import trio"),
                                            ("http/policy/cors.py", "import trio"),
                                            ("http/policy/hosts.py", "import h11"),
                                            ("blas_spin.py", "import numpy"), ("errors.py", "import attrs")])
def test_the_checker_sees_a_forbidden_third_party_import(package_copy: Path, file: str, line: str):
    module, problems = problems_with(package_copy, file, line, external_violations)
    assert any(p.startswith(module) and line.split()[1] in p for p in problems), problems


@pytest.mark.parametrize(("file", "line"), [
    ("model/__init__.py", "from kestrel_trio._model.weights.assemble import load_weights"),
    ("model/checks.py", "from kestrel_trio._model.gguf.reader import GgufFile"),
    ("cli/parser.py", "from .._model.cache import kv_storage"),
    ("text/sampling/sampler.py", "from ..._model.cache.kv_cache import KVCache"),
    ("engine/engine.py", "from kestrel_trio._model.cache import prefix_cache"),
    ("engine/step/batch.py", "import kestrel_trio._model.decoder.forward"),
])
def test_the_checker_sees_a_private_model_import(package_copy: Path, file: str, line: str):
    module, problems = problems_with(package_copy, file, line, private_violations)
    assert any(p.startswith(module) and "enter _model through its __init__" in p for p in problems), problems


@pytest.mark.parametrize(("file", "line"), [
    ("engine/step/batch.py", "from kestrel_trio._model import forward"),
    ("engine/memory/kv_budget.py", "from ..._model import BLOCK_TOKENS"),
    ("engine/engine.py", "import kestrel_trio._model.cache.prefix_cache"),
    ("engine/admission.py", "from kestrel_trio._model import KVCache"),
])
def test_the_checker_sees_the_engine_reach_past_the_seam(package_copy: Path, file: str, line: str):
    module, problems = problems_with(package_copy, file, line, seam_violations)
    assert any(p.startswith(module) and "through kestrel_trio.model" in p for p in problems), problems


def test_the_checker_lets_model_import_its_own_submodules(package_copy: Path):
    _, problems = problems_with(package_copy, "_model/decoder/forward.py",
                                "from kestrel_trio._model.cache.kv_cache import KVCache", private_violations)
    assert problems == []


# (file in _model, line planted at its end, a fragment of the expected complaint)
PLANTED_IN_ROOMS = [
    ("_model/checkpoints/config.py", "from kestrel_trio._model.decoder.forward import forward",
     "(checkpoints, rank 1) imports kestrel_trio._model.decoder.forward (decoder, rank 4)"),
    ("_model/gguf/reader.py", "from ..decoder import forward",
     "imports kestrel_trio._model.decoder.forward (decoder, rank 4)"),
    ("_model/checkpoints/config.py", "from kestrel_trio._model.gguf.reader import GgufFile",
     "(checkpoints, rank 1) imports kestrel_trio._model.gguf.reader (gguf, rank 2)"),
    ("_model/gguf/names.py", "from ..weights.assemble import Weights",
     "(gguf, rank 2) imports kestrel_trio._model.weights.assemble (weights, rank 3)"),
    ("_model/gguf/config.py", "def _later():\n    from kestrel_trio._model.cache.kv_cache import KVCache",
     "(gguf, rank 2) imports kestrel_trio._model.cache.kv_cache (cache, rank 3)"),
    ("_model/forms/packed.py", "from kestrel_trio._model.products.matmul import linear",
     "(forms, rank 0) imports kestrel_trio._model.products.matmul (products, rank 1)"),
    ("_model/products/matmul.py", "from kestrel_trio._model.checkpoints.config import ModelConfig",
     "(products, rank 1) imports kestrel_trio._model.checkpoints.config (checkpoints, rank 1)"),
    ("_model/weights/residency.py", "from kestrel_trio._model.cache.kv_cache import KVCache",
     "(weights, rank 3) imports kestrel_trio._model.cache.kv_cache (cache, rank 3)"),
    ("_model/cache/kv_cache.py", "from ..weights.assemble import Weights",
     "(cache, rank 3) imports kestrel_trio._model.weights.assemble (weights, rank 3)"),
    ("_model/weights/quantize.py", "def _later():\n    from kestrel_trio._model.decoder.layers import linear",
     "(weights, rank 3) imports kestrel_trio._model.decoder.layers (decoder, rank 4)"),
    ("_model/decoder/layers.py", "from kestrel_trio._model.vision.tower import vision_shapes",
     "(decoder, rank 4) imports kestrel_trio._model.vision.tower (vision, rank 5)"),
    ("_model/vision/tower.py", "from kestrel_trio._model.embedding.pooling import normalize",
     "(vision, rank 5) imports kestrel_trio._model.embedding.pooling (embedding, rank 5)"),
    ("_model/decoder/forward.py", "from kestrel_trio._model import KVCache",
     "(decoder) imports kestrel_trio._model, whose __init__ imports the rooms"),
    ("_model/gguf/reader.py", "from kestrel_trio._model import KVCache",
     "(gguf) imports kestrel_trio._model, whose __init__ imports the rooms"),
]


# (file in text, line planted at its end, a fragment of the expected complaint)
PLANTED_IN_TEXT_ROOMS = [
    ("text/media/images.py", "from kestrel_trio.text.tokens.tokenizer import Tokenizer",
     "(media, rank 0) imports kestrel_trio.text.tokens.tokenizer (tokens, rank 1)"),
    ("text/tokens/tokenizer.py", "from ..constraints.grammar import schema_error",
     "(tokens, rank 1) imports kestrel_trio.text.constraints.grammar (constraints, rank 2)"),
    ("text/sampling/sampler.py", "from kestrel_trio.text.tokens.detokenizer import IncrementalDetokenizer",
     "(sampling, rank 1) imports kestrel_trio.text.tokens.detokenizer (tokens, rank 1)"),
    ("text/constraints/constraint.py", "def _later():\n    from kestrel_trio.text.generation import Generation",
     "(constraints, rank 2) imports kestrel_trio.text.generation (generation, rank 3)"),
    ("text/repetition.py", "from kestrel_trio.text.sampling.params import SamplingParams",
     "(repetition, rank 0) imports kestrel_trio.text.sampling.params (sampling, rank 1)"),
    ("text/step_result.py", "from .constraints.constraint import Constraint",
     "(step_result, rank 2) imports kestrel_trio.text.constraints.constraint (constraints, rank 2)"),
    ("text/chat_formats/qwen3.py", "from kestrel_trio.text import Tokenizer",
     "(chat_formats) imports kestrel_trio.text, whose __init__ imports the rooms"),
]


# (file in _kernels, line planted at its end, a fragment of the expected complaint)
PLANTED_IN_KERNEL_ROOMS = [
    ("_kernels/portable/products.py", "from kestrel_trio._kernels.x86.float32 import blocks",
     "(portable, rank 1) imports kestrel_trio._kernels.x86.float32.blocks (x86.float32, rank 2)"),
    ("_kernels/portable/integer.py", "def _later():\n    from kestrel_trio._kernels.arm import integer",
     "(portable, rank 1) imports kestrel_trio._kernels.arm.integer (arm, rank 2)"),
    ("_kernels/portable/handoff.py", "from kestrel_trio._kernels import plan",
     "(portable, rank 1) imports kestrel_trio._kernels.plan (_kernels, rank 3)"),
    ("_kernels/portable/exp.py", "from kestrel_trio._kernels import ready",
     "(portable, rank 1) imports kestrel_trio._kernels (__init__, rank 5)"),
    ("_kernels/x86/integer.py", "from kestrel_trio._kernels.arm import integer",
     "(x86, rank 2) imports kestrel_trio._kernels.arm.integer (arm, rank 2)"),
    ("_kernels/arm/integer.py", "from ..x86 import integer",
     "(arm, rank 2) imports kestrel_trio._kernels.x86.integer (x86, rank 2)"),
    ("_kernels/x86/float32/blocks.py", "from kestrel_trio._kernels.x86.integer import usable_kernel",
     "(x86.float32, rank 2) imports kestrel_trio._kernels.x86.integer (x86, rank 2)"),
    ("_kernels/x86/float32/chunks.py", "def _later():\n    from kestrel_trio._kernels.loaded import FORMS",
     "(x86.float32, rank 2) imports kestrel_trio._kernels.loaded (_kernels, rank 3)"),
    ("_kernels/x86/tiles.py", "from kestrel_trio._kernels.cpu import Features",
     "(x86, rank 2) imports kestrel_trio._kernels.cpu (_kernels, rank 3)"),
    ("_kernels/arm/integer.py", "from kestrel_trio._kernels.dispatch import product_for",
     "(arm, rank 2) imports kestrel_trio._kernels.dispatch (_kernels, rank 3)"),
    ("_kernels/plan.py", "def _later():\n    from kestrel_trio._kernels.wrappers.packed import packed_product",
     "(_kernels, rank 3) imports kestrel_trio._kernels.wrappers.packed (wrappers, rank 4)"),
    ("_kernels/loaded.py", "from kestrel_trio._kernels import ready",
     "(_kernels, rank 3) imports kestrel_trio._kernels (__init__, rank 5)"),
    ("_kernels/wrappers/layers.py", "from kestrel_trio._kernels import decode_loops",
     "(wrappers, rank 4) imports kestrel_trio._kernels (__init__, rank 5)"),
    ("_kernels/portable/forms/q4.py", "from kestrel_trio._kernels.portable.products import FORMS",
     "(portable.forms, rank 0) imports kestrel_trio._kernels.portable.products (portable, rank 1)"),
    ("_kernels/portable/forms/generate.py", "def _later():\n    from kestrel_trio._kernels.portable import signatures",
     "(portable.forms, rank 0) imports kestrel_trio._kernels.portable.signatures (portable, rank 1)"),
]


# (file in engine, http or app, line planted at its end, a fragment of the expected complaint)
PLANTED_IN_LAYER_ROOMS = [
    ("engine/step/batch.py", "from kestrel_trio.engine.engine import Engine",
     "(step, rank 0) imports kestrel_trio.engine.engine (engine, rank 3)"),
    ("engine/memory/kv_budget.py", "def _later():\n    from ..admission import Job",
     "(memory, rank 1) imports kestrel_trio.engine.admission (admission, rank 2)"),
    ("engine/speculation.py", "from kestrel_trio.engine.memory import kv_budget",
     "(speculation, rank 1) imports kestrel_trio.engine.memory.kv_budget (memory, rank 1)"),
    ("http/policy/cors.py", "from kestrel_trio.http.protocol.connection import Connection",
     "(policy, rank 2) imports kestrel_trio.http.protocol.connection (protocol, rank 3)"),
    ("http/protocol/wire.py", "from ..server import serve_http",
     "(protocol, rank 3) imports kestrel_trio.http.server (server, rank 4)"),
    ("app/media/images.py", "from kestrel_trio.app.chat.job import CompletionJob",
     "(media, rank 0) imports kestrel_trio.app.chat.job (chat, rank 1)"),
    ("app/chat/job.py", "from kestrel_trio.app import routes",
     "(chat, rank 1) imports kestrel_trio.app.routes (routes, rank 3)"),
    ("app/ollama/routes.py", "from kestrel_trio.app import messages",
     "(ollama, rank 2) imports kestrel_trio.app.messages (messages, rank 2)"),
]

# (file in openai, line planted at its end, a fragment of the expected complaint)
PLANTED_IN_OPENAI_ROOMS = [
    ("openai/fields/access.py", "from kestrel_trio.openai.request import bodies",
     "(fields, rank 0) imports kestrel_trio.openai.request.bodies (request, rank 1)"),
    ("openai/request/messages.py", "from kestrel_trio.openai.response.bodies import to_json_bytes",
     "(request, rank 1) imports kestrel_trio.openai.response.bodies (response, rank 1)"),
    ("openai/response/sse.py", "def _later():\n    from ..request.thinking import REASONING_EFFORTS",
     "(response, rank 1) imports kestrel_trio.openai.request.thinking (request, rank 1)"),
    ("openai/request/bodies.py", "from kestrel_trio.openai import to_json_bytes",
     "(request) imports kestrel_trio.openai, whose __init__ imports the rooms"),
    ("openai/response/choices.py", "import kestrel_trio.openai.embeddings",
     "(response, rank 1) imports kestrel_trio.openai.embeddings (embeddings, rank 1)"),
    ("openai/request/thinking.py", "from kestrel_trio.openai.responses_api import events",
     "(request, rank 1) imports kestrel_trio.openai.responses_api.events (responses_api, rank 2)"),
]


def _room_check(file: str):
    """The rooms' check for a planted file: by its package, a layer's of LAYER_ROOMS, _kernels' or _model's."""
    top = file.split("/")[0]
    if top in LAYER_ROOMS:
        return lambda src: layer_room_violations(src, top)
    return kernel_room_violations if top == "_kernels" else room_violations


PLANTED_BETWEEN_ROOMS = (PLANTED_IN_ROOMS + PLANTED_IN_TEXT_ROOMS + PLANTED_IN_OPENAI_ROOMS
                         + PLANTED_IN_LAYER_ROOMS + PLANTED_IN_KERNEL_ROOMS)


@pytest.mark.parametrize(("file", "line", "complaint"), PLANTED_BETWEEN_ROOMS,
                         ids=[f"{f}: {line}" for f, line, _ in PLANTED_BETWEEN_ROOMS])
def test_the_checker_sees_each_planted_import_between_rooms(package_copy: Path, file: str, line: str,
                                                             complaint: str):
    module, problems = problems_with(package_copy, file, line, _room_check(file))
    assert any(complaint in p and p.startswith(module) for p in problems), problems


@pytest.mark.parametrize(("file", "line"), [
    ("_model/decoder/forward.py", "from kestrel_trio._model.decoder.layers import linear\n"
     "from ..cache.kv_cache import KVCache\nfrom kestrel_trio._model.forms.packed import PackedMatrix"),
    ("_kernels/x86/float32/blocks.py", "from kestrel_trio._kernels.portable.forms.kestrel import row_int8\n"
     "from kestrel_trio._kernels.x86.float32.assembly import _asm_codegen\nfrom ...portable import exp"),
    ("_kernels/dispatch.py", "from kestrel_trio._kernels.plan import plan\nfrom .x86 import integer\n"
     "from kestrel_trio._kernels import loaded"),
    ("_kernels/wrappers/prefill.py", "from kestrel_trio._kernels.dispatch import product_for\n"
     "from ..portable import exp\nfrom .layers import rms_norm"),
])
def test_the_checker_lets_a_room_import_its_own_modules_and_lower_rooms(package_copy: Path, file: str, line: str):
    _, problems = problems_with(package_copy, file, line, _room_check(file))
    assert problems == []


UNRANKED = {
    "_model": ["kestrel_trio._model.annex is a room missing from MODEL_ROOMS",
               "kestrel_trio._model.annex is in no room of _model (move it into one, or add its room to MODEL_ROOMS)",
               "kestrel_trio._model.stray is in no room of _model (move it into one, or add its room to MODEL_ROOMS)"],
    "text": ["kestrel_trio.text.annex is a room or module missing from TEXT_ROOMS",
             "kestrel_trio.text.stray is a room or module missing from TEXT_ROOMS",
             "kestrel_trio.text.annex is in no room of text (move it into one, or add its room to TEXT_ROOMS)",
             "kestrel_trio.text.stray is in no room of text (move it into one, or add its room to TEXT_ROOMS)"],
    "openai": ["kestrel_trio.openai.annex is a room or module missing from OPENAI_ROOMS",
               "kestrel_trio.openai.stray is a room or module missing from OPENAI_ROOMS",
               "kestrel_trio.openai.annex is in no room of openai (move it into one, or add its room to OPENAI_ROOMS)",
               "kestrel_trio.openai.stray is in no room of openai (move it into one, or add its room to OPENAI_ROOMS)"],
}


@pytest.mark.parametrize("folder", sorted(UNRANKED))
def test_the_checker_sees_a_module_in_no_room_and_a_room_not_ranked(package_copy: Path, folder: str):
    check = _room_check(folder + "/")
    stray = package_copy / folder / "stray.py"
    room = package_copy / folder / "annex"
    stray.write_text("import os\n", encoding="utf-8")
    room.mkdir()
    (room / "__init__.py").write_text("", encoding="utf-8")
    try:
        assert check(package_copy) == UNRANKED[folder]
    finally:
        stray.unlink()
        shutil.rmtree(room)


# (file in the package, line planted at its end, modules of the circle that line closes; the modules the circle
# passes through on its way are in it too)
PLANTED_CIRCLES = [
    ("_model/decoder/layers.py", "from kestrel_trio._model.decoder.forward import forward",
     ["kestrel_trio._model.decoder.forward", "kestrel_trio._model.decoder.layers"]),
    ("_model/cache/kv_cache.py", "if TYPE_CHECKING:\n    from ..decoder.forward import Decoder",
     ["kestrel_trio._model.decoder.forward", "kestrel_trio._model.cache.kv_cache"]),
    ("text/stops.py", "from kestrel_trio.text import StopStringMatcher",
     ["kestrel_trio.text", "kestrel_trio.text.stops"]),
]


@pytest.mark.parametrize(("file", "line", "circle"), PLANTED_CIRCLES, ids=[f for f, _, _ in PLANTED_CIRCLES])
def test_the_checker_sees_a_planted_import_circle(package_copy: Path, file: str, line: str,
                                                  circle: list[str]):
    _, circles = problems_with(package_copy, file, line, import_cycles)
    assert len(circles) == 1 and set(circle) <= set(circles[0]), circles


def test_the_checker_lets_a_function_import_its_caller(package_copy: Path):
    line = "def _later():\n    from kestrel_trio._model.decoder.forward import forward\n    return forward"
    _, circles = problems_with(package_copy, "_model/decoder/layers.py", line, import_cycles)
    assert circles == []


def test_the_checker_sees_a_kernel_room_not_ranked(package_copy: Path):
    room = package_copy / "_kernels" / "riscv"
    room.mkdir()
    (room / "__init__.py").write_text("", encoding="utf-8")
    (room / "vector.py").write_text("import numpy\n", encoding="utf-8")
    try:
        assert kernel_room_violations(package_copy) == [
            "kestrel_trio._kernels.riscv is in _kernels' room 'riscv', which KERNEL_ROOMS does not rank",
            "kestrel_trio._kernels.riscv.vector is in _kernels' room 'riscv', which KERNEL_ROOMS does not rank",
        ]
    finally:
        shutil.rmtree(room)

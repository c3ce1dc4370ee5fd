"""The compiled kernels hand raw addresses (``array.ctypes.data``) to inline assembly: each array must outlive them.

numba frees an array its function allocated right after the array's last use in the code, and reading
``.ctypes.data`` counts as that use. An array whose address is taken before a loop of assembly calls, and
not used after, is freed before the assembly writes into it: f32_chunks.product did this with its staging
buffer (a crash in glibc's malloc, "invalid size", under other allocations).

This reads the numba IR of every function in kestrel_trio._kernels' modules (those compiled at import and
those compiled on first use alike), with the frees numba places in it. For each array the function
allocates, it follows the array's address: from ``.ctypes`` through arithmetic into the arrays and tuples
that hold it (an operands array), and through a call whose callee takes ``.ctypes`` of that argument (the
operands it returns). Every later call given such a value may hand it to assembly; the array must not be
freed before the last of them.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil

import numpy as np
import pytest

from kestrel_trio import _kernels

pytestmark = pytest.mark.skipif(not _kernels.ready(),
                                reason=f"numba does not run here: {_kernels.unavailable_reason()}")
if _kernels.ready():
    from kestrel_trio._kernels.x86.float32.chunks import _store_blocks


def _python_function(value):
    from numba.core.registry import CPUDispatcher

    return value.py_func if isinstance(value, CPUDispatcher) else value if inspect.isfunction(value) else None


def _kernel_functions():
    """(module.name, function, its IR) for every function of the modules that numba's front end reads."""
    prefix = "kestrel_trio._kernels."
    for full in sorted(m.name for m in pkgutil.walk_packages(_kernels.__path__, prefix) if not m.ispkg):
        name = full[len(prefix):]  # "portable.exp", "x86.float32.chunks"
        module = importlib.import_module(full)
        for attribute, value in sorted(vars(module).items()):
            function = _python_function(value)
            if function is None or function.__module__ != module.__name__:
                continue
            try:
                yield f"{name}.{attribute}", function, _ir(function)
            except Exception:  # numba's front end refuses it (imports, try blocks): plain Python, not a kernel
                continue


def _ir(function):
    """The function's IR, with numba's frees (``del``) placed."""
    from numba.core import postproc
    from numba.core.compiler import run_frontend

    function_ir = run_frontend(function)
    postproc.PostProcessor(function_ir).run(emit_dels=True)
    return function_ir


def _statements(function_ir) -> list:
    return [statement for label in sorted(function_ir.blocks) for statement in function_ir.blocks[label].body]


def _callee(function_ir, variable):
    """The global or free variable ``variable`` names, else None."""
    from numba.core import ir

    try:
        definition = function_ir.get_definition(variable)
    except KeyError:
        return None
    return definition.value if isinstance(definition, (ir.Global, ir.FreeVar)) else None


@functools.cache  # asked again for every array passed to the callee, on every pass of _address_carriers
def _parameters_whose_address_is_taken(function) -> frozenset[int]:
    """Positions of ``function``'s parameters of which it reads ``.ctypes`` (empty if numba cannot read it)."""
    from numba.core import ir

    try:
        statements = _statements(_ir(function))
    except Exception:  # plain Python that numba's front end refuses: it hands no address to assembly
        return frozenset()
    positions = {s.target.name: s.value.index for s in statements
                 if isinstance(s, ir.Assign) and isinstance(s.value, ir.Arg)}
    return frozenset(positions[s.value.value.name] for s in statements
                     if isinstance(s, ir.Assign) and isinstance(s.value, ir.Expr) and s.value.op == "getattr"
                     and s.value.attr == "ctypes" and s.value.value.name in positions)


def _freed_too_early(function_ir) -> list[str]:
    from numba.core import ir

    statements = _statements(function_ir)
    allocated = {s.target.name for s in statements
                 if isinstance(s, ir.Assign) and isinstance(s.value, ir.Expr) and s.value.op == "call"}
    problems = []
    for name in sorted(allocated):
        carriers, first = _address_carriers(function_ir, statements, name)
        if first is None:
            continue
        uses = [i for i, s in enumerate(statements) if i > first and isinstance(s, ir.Assign)
                and isinstance(s.value, ir.Expr) and s.value.op == "call"
                and any(a.name in carriers for a in s.value.args)]
        freed = [i for i, s in enumerate(statements) if isinstance(s, ir.Del) and s.value == name and i > first]
        if uses and freed and freed[0] < uses[-1]:
            problems.append(f"{name} (address taken at line {statements[first].loc.line}) is freed before "
                            f"a call given its address, at line {statements[uses[-1]].loc.line}")
    return problems


def _address_carriers(function_ir, statements, name) -> tuple[set[str], int | None]:
    """The variables that hold the address of array ``name`` (or an array or tuple holding it), and the index of
    the statement that first takes it (None: never)."""
    from numba.core import ir

    carriers: set[str] = set()
    first = None
    changed = True
    while changed:  # to a fixed point: a loop's body may come before the statement that feeds it
        changed = False
        for i, s in enumerate(statements):
            found = None
            if isinstance(s, ir.Assign) and isinstance(s.value, ir.Expr):
                e = s.value
                operands = [v.name for v in e.list_vars()]
                if e.op == "getattr" and e.attr == "ctypes" and e.value.name == name:
                    found = s.target.name
                elif e.op == "call" and name in [a.name for a in e.args]:
                    callee = _python_function(_callee(function_ir, e.func))
                    if callee is not None and [a.name for a in e.args].index(name) in \
                            _parameters_whose_address_is_taken(callee):
                        found = s.target.name
                elif e.op != "call" and any(v in carriers for v in operands):
                    found = s.target.name
            elif isinstance(s, (ir.SetItem, ir.StaticSetItem)) and s.value.name in carriers:
                found = s.target.name
            if found is not None and found not in carriers:
                carriers.add(found)
                first = i if first is None else min(first, i)
                changed = True
    return carriers, first


def _freed_early(n):  # a kernel as the modules write them, with the mistake f32_chunks.product made
    scratch = np.empty(n, np.float32)
    operands = np.zeros(13, np.int64)  # f32_chunks.OPERANDS
    operands[10] = scratch.ctypes.data
    for _ in range(n):
        _store_blocks(operands.ctypes.data)


def _operands_of(scratch):
    operands = np.zeros(13, np.int64)  # f32_chunks.OPERANDS
    operands[10] = scratch.ctypes.data
    return operands


def _freed_early_through_a_call(n):  # the address taken by the callee, as f32_blocks._block_operands takes it
    scratch = np.empty(n, np.float32)
    operands = _operands_of(scratch)
    for _ in range(n):
        _store_blocks(operands.ctypes.data)


def _kept(n):  # the array used after the loop: alive through it
    scratch = np.empty(n, np.float32)
    operands = _operands_of(scratch)
    for _ in range(n):
        _store_blocks(operands.ctypes.data)
    return scratch[0]


@pytest.mark.parametrize("function, line", [(_freed_early, 3), (_freed_early_through_a_call, 2)])
def test_the_check_finds_an_array_freed_before_its_assembly(function, line):
    problems = _freed_too_early(_ir(function))
    assert len(problems) == 1
    assert problems[0].startswith(f"scratch (address taken at line {function.__code__.co_firstlineno + line})")


def test_the_check_passes_an_array_kept_alive():
    assert _freed_too_early(_ir(_kept)) == []


KERNEL_FUNCTIONS = list(_kernel_functions()) if _kernels.ready() else []


def test_the_check_reads_the_kernels_compiled_on_first_use():
    names = {name for name, _, _ in KERNEL_FUNCTIONS}
    assert {"x86.float32.chunks.product", "x86.float32.blocks.product_f32_avx512", "x86.tiles.product"} <= names


@pytest.mark.parametrize("name, function, function_ir", KERNEL_FUNCTIONS,
                         ids=lambda v: v if isinstance(v, str) else "")
def test_no_kernel_frees_an_array_whose_address_its_assembly_still_uses(name, function, function_ir):
    assert _freed_too_early(function_ir) == []

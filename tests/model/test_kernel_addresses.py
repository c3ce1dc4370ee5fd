"""The compiled kernels hand raw addresses (``array.ctypes.data``) to inline assembly: each array must outlive them.

numba frees an array its function allocated right after the array's last use in the code, and reading
``.ctypes.data`` counts as that use. An array whose address is taken before a loop of assembly calls, and
not used after, is freed before the assembly writes into it: f32_chunks.product did this with its staging
buffer (a crash in glibc's malloc, "invalid size", under other allocations). This reads each kernel's numba
IR, with the frees numba will place in it, and checks that no array the function allocated is freed while
an assembly call given an address may still come (a call of an ``@intrinsic`` with arguments, after the
address is taken).
"""

from __future__ import annotations

import importlib
import pkgutil

import numpy as np
import pytest

from kestrel_trio import _kernels

pytestmark = pytest.mark.skipif(not _kernels.ready(),
                                reason=f"numba does not run here: {_kernels.unavailable_reason()}")
if _kernels.ready():
    from kestrel_trio._kernels.f32_chunks import _store_blocks


def _kernel_functions():
    from numba.core.registry import CPUDispatcher

    for name in sorted(module.name for module in pkgutil.iter_modules(_kernels.__path__)):
        module = importlib.import_module(f"kestrel_trio._kernels.{name}")
        for attribute, value in sorted(vars(module).items()):
            if isinstance(value, CPUDispatcher) and value.py_func.__module__ == module.__name__:
                yield f"{name}.{attribute}", value.py_func


def _statements(py_func):
    """The function's IR statements in block order, with numba's frees (``del``) placed."""
    from numba.core import postproc
    from numba.core.compiler import run_frontend

    function_ir = run_frontend(py_func)
    postproc.PostProcessor(function_ir).run(emit_dels=True)
    return [statement for label in sorted(function_ir.blocks) for statement in function_ir.blocks[label].body], \
        function_ir


def _freed_too_early(py_func) -> list[str]:
    from numba.core import ir
    from numba.extending import _Intrinsic

    statements, function_ir = _statements(py_func)
    allocated = {s.target.name for s in statements
                 if isinstance(s, ir.Assign) and isinstance(s.value, ir.Expr) and s.value.op == "call"}
    intrinsic_calls = [i for i, s in enumerate(statements)
                       if isinstance(s, ir.Assign) and isinstance(s.value, ir.Expr) and s.value.op == "call"
                       and s.value.args and isinstance(_global_value(function_ir, s.value.func), _Intrinsic)]
    problems = []
    for i, s in enumerate(statements):
        if not (isinstance(s, ir.Assign) and isinstance(s.value, ir.Expr) and s.value.op == "getattr"
                and s.value.attr == "ctypes" and s.value.value.name in allocated):
            continue
        name = s.value.value.name
        freed = [j for j, t in enumerate(statements) if isinstance(t, ir.Del) and t.value == name and j > i]
        later_calls = [j for j in intrinsic_calls if j > i]
        if freed and later_calls and freed[0] < later_calls[-1]:
            problems.append(f"{name} (address taken at line {s.loc.line}) is freed before an assembly call")
    return problems


def _global_value(function_ir, variable):
    from numba.core import ir

    try:
        definition = function_ir.get_definition(variable)
    except KeyError:
        return None
    return definition.value if isinstance(definition, (ir.Global, ir.FreeVar)) else None


def _freed_early(n):  # a kernel as the modules write them, with the mistake f32_chunks.product made
    scratch = np.empty(n, np.float32)
    operands = np.zeros(12, np.int64)
    operands[10] = scratch.ctypes.data
    for _ in range(n):
        _store_blocks(operands.ctypes.data)


def test_the_check_finds_an_array_freed_before_its_assembly():
    line = _freed_early.__code__.co_firstlineno + 3
    expected = f"scratch (address taken at line {line}) is freed before an assembly call"
    assert _freed_too_early(_freed_early) == [expected]


@pytest.mark.parametrize("name, py_func", list(_kernel_functions()) if _kernels.ready() else [],
                         ids=lambda v: v if isinstance(v, str) else "")
def test_no_kernel_frees_an_array_whose_address_its_assembly_still_uses(name, py_func):
    assert _freed_too_early(py_func) == []

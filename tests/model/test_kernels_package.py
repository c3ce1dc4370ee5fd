"""kestrel_trio._kernels' package module only re-exports (issue 53: no process-global kernel state there): every
statement is its docstring, an import or ``__all__``, and each name of ``__all__`` comes from a module of its own."""

from __future__ import annotations

import ast
import inspect

from kestrel_trio import _kernels


def test_the_package_module_holds_no_code_and_no_state():
    tree = ast.parse(inspect.getsource(_kernels))
    body = tree.body[1:] if ast.get_docstring(tree) else tree.body
    kept = [node for node in body if not isinstance(node, (ast.Import, ast.ImportFrom))
            and not (isinstance(node, ast.Assign) and [t.id for t in node.targets if isinstance(t, ast.Name)]
                     == ["__all__"])]
    assert kept == [], [ast.unparse(node)[:60] for node in kept]


def test_each_exported_name_is_defined_in_a_module_of_the_package():
    for name in _kernels.__all__:
        value = getattr(_kernels, name)
        home = getattr(value, "__module__", None)
        if home is not None and (inspect.isfunction(value) or inspect.isclass(value)):
            assert home.startswith("kestrel_trio._kernels.") and home != "kestrel_trio._kernels", (name, home)

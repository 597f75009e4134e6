"""Every annotation in ptd names real types.

ptd's modules use ``from __future__ import annotations``, so an annotation is a string that
nothing evaluates until something asks: ``ptd.specs.typecheck`` asks for the config
dataclasses' (it checks TOML values against them with ``typing.get_type_hints``), and
documentation and runtime type checkers ask for the rest. A name that is not imported, or
an expression that is no type (``str + Path``), passes every other test and breaks them.
This resolves every function's, class's and property getter's annotations in the package, and those of the
functions defined inside other functions (read from the source), in their module's names.
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import typing

import pytest

import ptd


def _annotated() -> list[tuple[str, object]]:
    out = []
    for info in pkgutil.walk_packages(ptd.__path__, "ptd."):
        if info.name.endswith("__main__"):  # (runs the CLI when imported)
            continue
        mod = importlib.import_module(info.name)
        for name, obj in vars(mod).items():
            if getattr(obj, "__module__", None) != mod.__name__:
                continue  # imported from elsewhere: checked where it is defined
            if inspect.isfunction(obj):
                out.append((f"{mod.__name__}.{name}", obj))
            elif inspect.isclass(obj):
                out.append((f"{mod.__name__}.{name}", obj))
                out += [(f"{mod.__name__}.{name}.{k}", f) for k, f in vars(obj).items()
                        if inspect.isfunction(f)]
                # and the getters of properties (``Candidate.best``'s ``float % None``
                # passed before they were walked: docs/testing.md, eighth session)
                out += [(f"{mod.__name__}.{name}.{k}", f.fget) for k, f in vars(obj).items()
                        if isinstance(f, property) and f.fget is not None]
    return out


def test_every_annotation_in_ptd_resolves():
    items = _annotated()
    assert len(items) > 1000  # the whole package was walked (1,306 on 2026-11-27)
    broken = []
    for where, obj in items:
        try:
            typing.get_type_hints(obj)
        except Exception as e:  # noqa: BLE001 - each failure is reported with its place
            broken.append(f"{where}: {type(e).__name__}: {e}")
    assert not broken, "\n".join(broken)


def test_an_annotation_that_is_no_type_is_found():
    ns: dict = {}
    exec("from __future__ import annotations\nfrom pathlib import Path\n"
         "def f(ref: str + Path) -> None: ...", ns)
    with pytest.raises(TypeError):
        typing.get_type_hints(ns["f"])


def _nested_in(name: str, source: str, module_globals: dict) -> list[tuple[str, dict, dict]]:
    """(place, {parameter or "return": annotation source}, module globals) of every function
    defined inside another function in ``source`` -- which the walk above cannot reach, since
    such functions exist only while their outer function runs -- read with ``ast``."""
    import ast
    out = []

    def visit(node: ast.AST, inside_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            is_fn = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            if is_fn and inside_function:
                a = child.args
                params = [*a.posonlyargs, *a.args, *a.kwonlyargs,
                          *(p for p in (a.vararg, a.kwarg) if p is not None)]
                ann = {p.arg: ast.unparse(p.annotation) for p in params if p.annotation}
                if child.returns is not None:
                    ann["return"] = ast.unparse(child.returns)
                if ann:
                    out.append((f"{name}:{child.lineno} {child.name}", ann, module_globals))
            visit(child, inside_function or is_fn)
    visit(ast.parse(source), False)
    return out


def _unresolved(items: list[tuple[str, dict, dict]]) -> list[str]:
    """Each annotation set resolved as ``typing.get_type_hints`` resolves a function's: in
    its module's globals."""
    broken = []
    for where, ann, module_globals in items:
        def stand_in() -> None: ...
        fn = type(stand_in)(stand_in.__code__, module_globals)
        fn.__annotations__ = dict(ann)
        try:
            typing.get_type_hints(fn)
        except Exception as e:  # noqa: BLE001 - each failure is reported with its place
            broken.append(f"{where}: {type(e).__name__}: {e}")
    return broken


def test_every_annotation_of_a_nested_function_resolves():
    items = []
    for info in pkgutil.walk_packages(ptd.__path__, "ptd."):
        if info.name.endswith("__main__"):
            continue
        mod = importlib.import_module(info.name)
        items += _nested_in(info.name, inspect.getsource(mod), vars(mod))
    assert len(items) > 40  # the whole package was read (45 on 2026-11-27)
    broken = _unresolved(items)
    assert not broken, "\n".join(broken)


def test_a_nested_annotation_that_is_no_type_is_found():
    src = ("from __future__ import annotations\nfrom pathlib import Path\n"
           "def outer():\n    def inner(ref: str | Path) -> Path | None: ...\n"
           "    def bad(ref: str // Path) -> None: ...\n")
    ns: dict = {}
    exec(src, ns)
    items = _nested_in("m", src, ns)
    assert [w for w, _, _ in items] == ["m:4 inner", "m:5 bad"]
    assert [b.split(":")[1] for b in _unresolved(items)] == ["5 bad"]

"""Every annotation in ptd names real types.

ptd's modules use ``from __future__ import annotations``, so an annotation is a string that
nothing evaluates until something asks: ``ptd.specs.typecheck`` asks for the config
dataclasses' (it checks TOML values against them with ``typing.get_type_hints``), and
documentation and runtime type checkers ask for the rest. A name that is not imported, or
an expression that is no type (``str + Path``), passes every other test and breaks them.
This resolves every function's and class's annotations in the package.
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

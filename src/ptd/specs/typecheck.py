"""Field types of the config dataclasses, checked where TOML enters.

TOML has types, but nothing stops ``steps = "ten"`` or ``lr = nan`` from reaching code that
compares them. :func:`check_fields` holds every value of a table against the annotation of
its dataclass field and refuses a mismatch with one line: ``int`` (not ``bool``), ``float``
(an ``int`` is fine; NaN and infinities are not), ``bool``, ``str``, ``tuple[str, ...]`` and
``Literal[...]``. Other annotations (nested dataclasses) are left to their own checks.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from typing import Any, Literal, get_args, get_origin

from ..errors import PtdError


def _describe(tp: Any) -> str:
    if get_origin(tp) is Literal:
        return " or ".join(repr(a) for a in get_args(tp))
    if get_origin(tp) is tuple:
        return "a list of strings"
    return {int: "an integer", float: "a finite number", bool: "true or false", str: "a string"}.get(
        tp, str(tp))


def _ok(tp: Any, v: Any) -> bool | None:
    """Whether ``v`` fits ``tp``; ``None`` when ``tp`` is not one this module checks."""
    if tp is bool:
        return isinstance(v, bool)
    if tp is int:
        return isinstance(v, int) and not isinstance(v, bool)
    if tp is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if tp is str:
        return isinstance(v, str)
    if get_origin(tp) is Literal:
        return any(type(v) is type(a) and v == a for a in get_args(tp))
    if get_origin(tp) is tuple:
        return isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v)
    return None


def check_fields(cls: type, values: dict[str, Any], where: str) -> None:
    """Refuse the first value of ``values`` whose type does not fit ``cls``'s field."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    for name, v in values.items():
        if name not in names:
            continue  # unknown fields are refused by the callers, with their own message
        ok = _ok(hints[name], v)
        if ok is False:
            raise PtdError(f"{where}{name} must be {_describe(hints[name])}, got {v!r}")

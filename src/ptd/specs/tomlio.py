"""Write TOML (the standard library only reads it). Enough for ptd's own configs: nested
tables of strings, numbers, booleans and lists of scalars or of tables."""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

from ..errors import PtdError


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_scalar(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def dumps(data: dict[str, Any], _prefix: str = "") -> str:
    lines: list[str] = []
    tables: list[tuple[str, dict]] = []
    arrays: list[tuple[str, list]] = []
    for k, v in data.items():
        if v is None:
            continue  # TOML has no null: absent means default
        if isinstance(v, dict):
            tables.append((k, v))
        elif isinstance(v, (list, tuple)) and v and all(isinstance(x, dict) for x in v):
            arrays.append((k, list(v)))
        else:
            lines.append(f"{k} = {_scalar(v)}")
    out = "\n".join(lines)
    for k, v in tables:
        name = f"{_prefix}{k}"
        body = dumps(v, name + ".").rstrip("\n")
        out += f"\n\n[{name}]\n{body}" if out else f"[{name}]\n{body}"
    for k, items in arrays:
        for item in items:
            out += f"\n\n[[{_prefix}{k}]]\n{dumps(item, _prefix + k + '.').rstrip()}"
    return out.strip("\n") + "\n"


def load(path: str | Path) -> dict[str, Any]:
    from .typecheck import read_text_file
    p = Path(path)
    text = read_text_file(p, "config")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise PtdError(f"cannot parse {p}: {e}") from None

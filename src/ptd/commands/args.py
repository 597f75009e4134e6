"""What the command modules share for their flags: argparse value types (one-line errors
for bad numbers) and strict JSON output. Imported by ``commands/*`` and by ``cli``, never
the other way round."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

MAX_INT = 2**40
"""Largest integer a flag takes: beyond any real device count, batch or step count, and
small enough that every product the cost model forms stays exact in a float."""


def positive_ints(s: str, limit: int | None = None) -> list[int]:
    """``"4,1,2"`` -> ``[1, 2, 4]``: distinct positive integers (at most ``limit``)."""
    try:
        v = sorted({int(x) for x in s.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,2,4, got {s!r}") from None
    limit = MAX_INT if limit is None else limit
    if not v or v[0] < 1 or v[-1] > limit:
        bound = f"1..{limit}"
        raise argparse.ArgumentTypeError(f"expected {bound} numbers like 1,2,4, got {s!r}")
    return v


def _number(s: str, kind: type, what: str, positive: bool) -> Any:
    """``s`` as ``kind`` (int or float): finite, above 0 (``positive``) or at least 0, and
    for integers at most ``MAX_INT``."""
    try:
        v = kind(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}") from None
    ok = (v > 0 if positive else v >= 0) and v != float("inf")  # (NaN fails both)
    if kind is int and not (ok and v <= MAX_INT):
        raise argparse.ArgumentTypeError(f"expected {what} (at most 2**40), got {s!r}")
    if not ok:
        raise argparse.ArgumentTypeError(f"expected {what}, got {s!r}")
    return v


def path_arg(s: str) -> str:
    """A file or folder flag's value, refused when empty, blank or holding a NUL byte: an unset
    shell variable (``--cases "$CASES"``) must not quietly mean the flag's default."""
    if not s.strip() or "\0" in s:
        raise argparse.ArgumentTypeError(f"expected a path, got {s!r}")
    return s


def positive_int(s: str) -> int:
    return _number(s, int, "a positive integer", positive=True)


def nonneg_int(s: str) -> int:
    return _number(s, int, "a non-negative integer", positive=False)


def positive_float(s: str) -> float:
    return _number(s, float, "a positive number", positive=True)


def nonneg_float(s: str) -> float:
    return _number(s, float, "a non-negative number", positive=False)


def fraction(s: str) -> float:
    v = nonneg_float(s)
    if v > 1:
        raise argparse.ArgumentTypeError(f"expected a fraction in [0, 1], got {s!r}")
    return v


def emit_json(obj: Any) -> None:
    """Strict JSON on stdout: a NaN or infinity becomes null with a ``<key>_null_reason``
    beside it (:func:`ptd.safeio.json_safe`), never the non-standard ``NaN`` token."""
    from ..safeio import json_safe
    json.dump(json_safe(obj), sys.stdout, indent=2, sort_keys=False, default=str, allow_nan=False)
    sys.stdout.write("\n")

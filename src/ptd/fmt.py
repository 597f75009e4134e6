"""Numbers and tables for people: SI units, bytes, durations, aligned text tables."""

from __future__ import annotations

import math
from typing import Any, Sequence


def si(x: float, unit: str = "", digits: int = 3) -> str:
    """``si(3.2e12, "FLOP/s") == "3.20 TFLOP/s"``."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if x == 0:
        return f"0 {unit}".strip()
    prefixes = [(1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")]
    for scale, p in prefixes:
        if abs(x) >= scale:
            return f"{x / scale:.{digits}g} {p}{unit}".strip()
    return f"{x:.{digits}g} {unit}".strip()


def gib(n: float, digits: int = 3) -> str:
    """Bytes in binary units: ``gib(3 * 2**30) == "3 GiB"``."""
    if n is None:
        return "-"
    for scale, p in [(2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")]:
        if abs(n) >= scale:
            return f"{n / scale:.{digits}g} {p}"
    return f"{n:.0f} B"


def duration(s: float) -> str:
    """Seconds as the largest sensible unit: ``duration(90061) == "1.04 d"``."""
    if s is None or not math.isfinite(s):
        return "-"
    for scale, unit in [(86400 * 365, "y"), (86400, "d"), (3600, "h"), (60, "min"), (1, "s"),
                        (1e-3, "ms"), (1e-6, "us")]:
        if abs(s) >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s:.3g} s"


def pct(x: float, digits: int = 1) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


def table(rows: Sequence[Sequence[Any]], header: Sequence[str] | None = None,
          align: str | None = None) -> str:
    """Aligned plain-text table. ``align`` is one char per column: ``l`` or ``r``
    (default: text left, the rest right)."""
    cells = [[("" if c is None else str(c)) for c in r] for r in rows]
    if header:
        cells.insert(0, [str(h) for h in header])
    if not cells:
        return ""
    n = max(len(r) for r in cells)
    cells = [r + [""] * (n - len(r)) for r in cells]
    widths = [max(len(r[i]) for r in cells) for i in range(n)]
    if align is None:
        body = cells[1:] if header else cells
        align = "".join("l" if body and not _numeric(body[0][i]) else "r" for i in range(n))
    out = []
    for j, r in enumerate(cells):
        line = "  ".join(c.ljust(w) if a == "l" else c.rjust(w) for c, w, a in zip(r, widths, align))
        out.append(line.rstrip())
        if header and j == 0:
            out.append("  ".join("-" * w for w in widths))
    return "\n".join(out)


def _numeric(s: str) -> bool:
    head = s.split(" ")[0].rstrip("%x")
    try:
        float(head)
        return True
    except ValueError:
        return False


def step_ranges(steps: Sequence[int]) -> str:
    """Step numbers as ranges for people: ``[1, 2, 3, 5, 7, 8]`` -> ``"1-3, 5, 7-8"``.

    Sorted and deduplicated first, so the text says which steps, not in which order."""
    nums = sorted(set(int(s) for s in steps))
    parts: list[str] = []
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        parts.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ", ".join(parts)

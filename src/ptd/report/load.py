"""Read a run folder (what ``ptd train --out DIR`` wrote) without trusting it to be whole.

A run that crashed may have ``metrics.jsonl`` and no ``summary.json``, or a last line cut in
half; a run stopped early has a summary without its measured section. :func:`load_run`
takes whatever is there and only refuses a folder with neither file.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import PtdError


@dataclass
class Run:
    path: Path
    summary: dict[str, Any]
    metrics: list[dict[str, Any]]
    config_text: str | None
    notes: list[str] = field(default_factory=list)

    @property
    def has_summary(self) -> bool:
        return bool(self.summary)


def load_run(run_dir: str | Path) -> Run:
    path = Path(run_dir)
    if not path.exists():
        raise PtdError(f"no such run folder: {path}")
    if not path.is_dir():
        raise PtdError(f"not a ptd run folder: {path} is not a directory")
    summ_p, met_p, cfg_p = path / "summary.json", path / "metrics.jsonl", path / "config.toml"
    if not summ_p.is_file() and not met_p.is_file():
        raise PtdError(f"not a ptd run folder: {path} has neither summary.json nor metrics.jsonl")
    notes: list[str] = []
    summary: dict[str, Any] = {}
    if summ_p.is_file():
        try:
            summary = json.loads(summ_p.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise PtdError(f"not a ptd run folder: {summ_p} is not JSON ({e})") from None
        if not isinstance(summary, dict):
            raise PtdError(f"not a ptd run folder: {summ_p} is not a JSON object")
        from ..summary.schema import problems
        bad = problems(summary)
        if bad:
            notes.append(f"summary.json does not follow the schema: {'; '.join(bad)}")
    else:
        notes.append("no summary.json: the run did not finish; only its metrics are shown")
    metrics = _read_metrics(met_p, notes) if met_p.is_file() else []
    if not met_p.is_file():
        notes.append("no metrics.jsonl: curves come from the summary's loss_curve")
    config_text = None
    if cfg_p.is_file():
        config_text = cfg_p.read_text(errors="replace")
    return Run(path=path, summary=summary, metrics=metrics, config_text=config_text,
               notes=notes)


def _read_metrics(path: Path, notes: list[str]) -> list[dict[str, Any]]:
    out, bad = [], 0
    for line in path.read_text(errors="replace").splitlines():
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            bad += 1
            continue
        if isinstance(rec, dict) and isinstance(rec.get("step"), (int, float)):
            out.append(rec)
        else:
            bad += 1
    if bad:
        notes.append(f"metrics.jsonl: {bad} unreadable line(s) skipped")
    return out


def num(x: Any) -> float | None:
    """A finite float, or None (missing, null, NaN, inf, not a number)."""
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return None
    x = float(x)
    return x if math.isfinite(x) else None


def series(records: list[dict[str, Any]], key: str) -> list[tuple[float, float]]:
    """(step, value) for every record whose ``key`` is a finite number."""
    pts = []
    for r in records:
        s, v = num(r.get("step")), num(r.get(key))
        if s is not None and v is not None:
            pts.append((s, v))
    return pts

"""``ptd report``: one self-contained HTML page for a run folder.

* :mod:`.load` -- reads ``summary.json``, ``metrics.jsonl`` and ``config.toml``, tolerating
  runs that stopped early or crashed;
* :mod:`.svg` -- line and stacked-bar charts as inline SVG (no matplotlib, no script);
* :mod:`.tables` -- predicted vs measured, memory and time per rank, communication;
* :mod:`.page` -- the page itself.

Pure Python: no torch, no network, nothing outside the standard library and ``ptd``.
"""

from __future__ import annotations

from pathlib import Path

from .load import Run, load_run

__all__ = ["Run", "load_run", "render_html", "write_report"]


def render_html(run_dir: str | Path) -> str:
    from .page import render
    return render(load_run(run_dir))


def write_report(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write the page (default ``RUN_DIR/report.html``) and return its path."""
    html = render_html(run_dir)
    path = Path(out) if out is not None else Path(run_dir) / "report.html"
    path.parent.mkdir(parents=True, exist_ok=True)
    from ..safeio import atomic_write_text
    atomic_write_text(path, html)  # never half a page over a good one
    return path

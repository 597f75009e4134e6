"""ptd report: one self-contained HTML page for a finished (or stopped) run.

Reads what `ptd train --out RUN_DIR` wrote -- summary.json, metrics.jsonl, config.toml --
and writes RUN_DIR/report.html (or --out): the run's facts, the loss curve (train and
validation), throughput per step, the step-time breakdown measured vs predicted, the
predicted-vs-measured table with ratios (coloured when off by more than 25%), memory and
time per rank, communication per kind, and the resolved config. Charts are inline SVG;
the page loads nothing from anywhere (no script, no fonts, no network).

  ptd train --model tiny --nproc 2 --steps 8 --global-batch 8 --seq-len 64 --out runs/r1
  ptd report runs/r1                       # writes runs/r1/report.html
  ptd report runs/r1 --out /tmp/r1.html --json
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .args import emit_json, path_arg
from ..errors import PtdError

HELP = "write a self-contained HTML report (charts, predicted vs measured) for a run folder"


def add(p: argparse.ArgumentParser) -> None:
    p.add_argument("run_dir", type=path_arg, metavar="RUN_DIR", help="a ptd train --out folder")
    p.add_argument("--out", type=path_arg, metavar="FILE.html", help="where to write (default RUN_DIR/report.html)")
    p.add_argument("--json", action="store_true", help='print {"html": path}')
    p.add_argument("--force", action="store_true", help="replace an existing --out file")


def run(a: argparse.Namespace) -> int:
    from ..report import load_run, write_report
    load_run(a.run_dir)                      # validate before anything is written
    out = Path(a.out) if a.out else Path(a.run_dir) / "report.html"
    if out.is_dir():
        raise PtdError(f"--out {out} is a directory")
    from ..safeio import check_writable, refuse_overwrite
    check_writable(out, "--out", kind="file")
    if not (a.force or (a.out is None and out.name == "report.html")):
        refuse_overwrite(out, "--out", a.force)  # never a run's own files (summary.json)
    path = write_report(a.run_dir, out)
    if a.json:
        emit_json({"html": str(path)})
    else:
        print(f"ptd: wrote {path}")
    return 0

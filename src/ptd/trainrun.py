"""``ptd train`` as a child process: what the planner's trials and the scaling benchmark run.

One run is one ``python -m ptd train ARGS --out OUT`` in its own process (its own world,
its own torchrun); the caller gets the run's ``summary.json`` with the wall time, or a row
with ``error`` (the run's last stderr line, or the timeout) -- a failed run is a failed row,
never a crash of the caller. The output goes to ``OUT/bench.log``. A run stopped early
(its timeout, Ctrl-C, SIGTERM to the caller) is asked to stop and given time to
(:func:`ptd.children.run_child`), so that its agent stops its workers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from .children import run_child


def train_subprocess(out: Path, args: list[str], timeout: float) -> dict[str, Any]:
    """Run ``ptd train *args --out out``; its summary (with ``wall_s``), or ``error``."""
    out.mkdir(parents=True, exist_ok=True)
    # the caller owns ``out`` (inside its own --out, checked there): a repeat replaces it
    cmd = [sys.executable, "-m", "ptd", "train", *args, "--out", str(out), "--force"]
    t0 = time.perf_counter()
    try:
        r = run_child(cmd, timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:g} s (--run-timeout)",
                "wall_s": time.perf_counter() - t0}
    wall = time.perf_counter() - t0
    (out / "bench.log").write_text(r.stdout + "\n" + r.stderr)
    if r.returncode != 0 or not (out / "summary.json").is_file():
        tail = (r.stderr.strip().splitlines() or ["?"])[-1]
        return {"error": tail, "wall_s": wall}
    s = json.loads((out / "summary.json").read_text())
    s["wall_s"] = wall
    return s

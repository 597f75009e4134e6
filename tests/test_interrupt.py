"""Faults: Ctrl-C during ``ptd train --checkpoint-every`` with two workers stops
within 10 s with exit code 130, after the current step, with that step's checkpoint written
and the summary saying "interrupted at step N"; ``--resume`` then continues with exactly the
losses of an uninterrupted run. One reference run, one interrupted run, one resume."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STEPS = 60
ARGS = ["--model", "tiny", "--nproc", "2", "--steps", str(STEPS), "--global-batch", "4",
        "--micro-batch", "2", "--seq-len", "32", "--warmup", "3", "--timeout", "60",
        "--checkpoint-every", "1000", "--profile-steps", "0", "--memory-step", "0",
        "--hardware", "cpu"]


def ptd(*argv, **kw):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "ptd", "train", *map(str, argv)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **kw)


def losses(out):
    recs = [json.loads(x) for x in (Path(out) / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["loss"] for r in recs}


@pytest.mark.dist
@pytest.mark.timeout(240)
def test_ctrl_c_stops_saves_and_resumes_exactly(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text((ROOT / "README.md").read_text())
    data = ["--data", corpus]
    ref, run = tmp_path / "ref", tmp_path / "run"
    p = ptd(*ARGS, *data, "--out", ref)
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, err[-2000:]

    p = ptd(*ARGS, *data, "--out", run)
    metrics = run / "metrics.jsonl"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and p.poll() is None:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= 3:
            break
        time.sleep(0.02)
    assert p.poll() is None, "the run ended before it could be interrupted"
    t0 = time.monotonic()
    p.send_signal(signal.SIGINT)  # as Ctrl-C does to ptd train (the launcher)
    out, err = p.communicate(timeout=30)
    took = time.monotonic() - t0
    assert p.returncode == 130, err[-3000:]
    assert took < 10, f"took {took:.1f} s to stop"
    summary = json.loads((run / "summary.json").read_text())
    n = int(summary["status"].removeprefix("interrupted at step "))
    assert 3 <= n < STEPS, summary["status"]
    assert (run / "checkpoints" / f"step_{n:08d}").is_dir()
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"ptd train: interrupted at step {n}"), err[-2000:]

    p = ptd("--resume", run, "--out", run)
    out, err = p.communicate(timeout=180)
    assert p.returncode == 0, err[-3000:]
    want, got = losses(ref), losses(run)
    assert sorted(got) == list(range(1, STEPS + 1))
    assert [got[s] for s in range(1, STEPS + 1)] == [want[s] for s in range(1, STEPS + 1)]
